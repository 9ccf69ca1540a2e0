"""Dedupe: which refusals, findings and summaries a steady state would only repeat, so that it
writes nothing new (``Deduper``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta

from rebalancer.core.audit.documents import jsonable
from rebalancer.core.audit.record import DEDUPED, AuditRecord, Kind

DedupeKey = tuple[str, str, str, str, str]  # kind, pool, node, action, reason


def dedupe_key(record: AuditRecord) -> DedupeKey:
    return (record.kind.value, record.pool, record.node or "", record.action or "", record.reason)


def fingerprint(record: AuditRecord) -> str:
    """What must change for a deduplicated record to be written again. Not the message (it
    carries live numbers such as a sample's age) and not the inputs (metric values move every
    tick): who asked, how many nodes, and the details (the refused intent without its message,
    the bad annotation value, a summary's target and refusals)."""
    detail = dict(jsonable(record.detail))
    if isinstance(detail.get("intent"), dict):  # its message is the strategy's, with numbers
        detail["intent"] = {k: v for k, v in detail["intent"].items() if k != "message"}
    doc = {"origin": record.origin, "count": record.count, "detail": detail}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class Deduper:
    """Which refusals, findings and summaries of a tick to write.

    A record of a deduplicated kind is dropped when a record with the same key (kind, pool, node,
    action, reason code) and the same ``fingerprint`` was written and is still remembered. The
    memory of a key is forgotten, so the next such record is written again, when:
    - a tick of its pool comes without that key (the refusal went away, then came back);
    - a tick writes an intent for the pool (something was done: the situation changed);
    - ``repeat_after`` has passed since it was written (a steady state leaves one record per key
      per ``repeat_after``; ``None`` never repeats).
    Memory is per process: a restarted controller writes the current refusals once again.
    """

    def __init__(self, repeat_after: timedelta | None = timedelta(hours=1)) -> None:
        self.repeat_after = repeat_after
        self._seen: dict[DedupeKey, dict[str, datetime]] = {}

    def select(self, records: Iterable[AuditRecord]) -> list[AuditRecord]:
        """The records of one tick that should be written (nothing is remembered yet)."""
        batch = list(records)
        acted = {r.pool for r in batch if r.kind is Kind.INTENT}
        return [r for r in batch if r.kind not in DEDUPED or r.pool in acted or not self._known(r)]

    def _known(self, record: AuditRecord) -> bool:
        written = self._seen.get(dedupe_key(record), {}).get(fingerprint(record))
        if written is None:
            return False
        return self.repeat_after is None or record.time - written < self.repeat_after

    def commit(self, tick: Iterable[AuditRecord], written: Iterable[AuditRecord]) -> None:
        """Remember a tick once the selected records (``written``) are stored."""
        batch = list(tick)
        stored = {r.id for r in written}
        pools = {r.pool for r in batch}
        acted = {r.pool for r in batch if r.kind is Kind.INTENT}
        fresh: dict[DedupeKey, dict[str, datetime]] = {}
        for record in batch:
            if record.kind not in DEDUPED or record.pool in acted:
                continue
            key, fp = dedupe_key(record), fingerprint(record)
            old = self._seen.get(key, {}).get(fp)
            when = record.time if record.id in stored or old is None else old
            fresh.setdefault(key, {})[fp] = when
        for key in [k for k in self._seen if k[1] in pools]:
            del self._seen[key]
        self._seen.update(fresh)
