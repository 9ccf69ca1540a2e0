"""Reading the audit log back through a store: every record, and a follower.

Where it sits: ``rebalancer audit``, the HTTP API and the runtime's error budget read a store
(``stores.AuditStore``) with the queries of ``queries``, page after page.

A follower (``Tail``, ``rebalancer audit --follow``) cannot rely on the keyset alone: a record is
committed after its ``time`` (an intent carries its tick's snapshot time), and two writers (the
controller and ``rebalancer reclaim``, a fleet's controllers) commit in any order, so a record
may land behind one already shown. It re-reads a window of ``LATE`` behind the newest record it
has shown and skips the ids it has shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from rebalancer.adapters.audit import stores
from rebalancer.adapters.audit.queries import AuditQuery
from rebalancer.core.audit import AuditRecord


async def every_record(
    store: stores.AuditStore, query: AuditQuery | None = None
) -> list[AuditRecord]:
    """Every record ``query`` selects (default: all of them, oldest first), page after page."""
    query = query or AuditQuery(limit=500)
    out: list[AuditRecord] = []
    while True:
        page = await store.query(query)
        out.extend(page.records)
        if page.next is None:
            return out
        query = replace(query, after=page.next)


# How long after its ``time`` a record may still be committed: an intent carries its tick's
# snapshot time and is committed once the tick is planned (within ``strategy_timeout``, 10 s by
# default), an outcome is stamped as its call returns. Minutes of margin over both.
LATE = timedelta(minutes=5)


@dataclass
class Tail:
    """The records ``query`` selects as they are committed, each once (``rebalancer audit
    --follow``).

    ``first`` reads the newest ``query.limit`` records; each ``more`` then reads what has been
    committed since, in ``(time, id)`` order. A keyset cursor alone would miss a record
    committed after one with a later key, so each ``more`` re-reads from ``LATE`` before the
    newest record shown and leaves out the ids shown already (remembered for that long). Only
    records after the oldest one ``first`` showed count: those before it were left out by the
    limit, not missed.
    """

    query: AuditQuery
    late: timedelta = LATE
    _shown: dict[str, datetime] = field(default_factory=dict)  # id -> time, within ``late``
    _floor: tuple[datetime, str] | None = None  # the oldest record ``first`` showed
    _newest: datetime | None = None

    async def first(self, store: stores.AuditStore) -> list[AuditRecord]:
        """The newest ``query.limit`` records, oldest first."""
        page = await store.query(replace(self.query, after=None, newest_first=True))
        found = list(reversed(page.records))
        if found:  # else nothing matches yet: every record to come is new
            self._floor = (found[0].time, found[0].id)
        return self._show(found)

    async def more(self, store: stores.AuditStore) -> list[AuditRecord]:
        """The records committed since the last call that have not been shown, in key order."""
        query = replace(self.query, after=None, newest_first=False, limit=500)
        if self._newest is not None:
            horizon = self._newest - self.late
            query = replace(query, since=max(horizon, query.since or horizon))
        found = [r for r in await every_record(store, query) if self._new(r)]
        return self._show(found)

    def _new(self, r: AuditRecord) -> bool:
        return r.id not in self._shown and (self._floor is None or (r.time, r.id) > self._floor)

    def _show(self, found: list[AuditRecord]) -> list[AuditRecord]:
        for r in found:
            self._shown[r.id] = r.time
            if self._newest is None or r.time > self._newest:
                self._newest = r.time
        if self._newest is not None:
            horizon = self._newest - self.late
            self._shown = {i: t for i, t in self._shown.items() if t >= horizon}
        return found
