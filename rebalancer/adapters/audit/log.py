"""One cluster's audit log, the way the runtime writes it: the store first, then a JSON line.

Where it sits: each tick the runtime builds the tick's records with ``core.audit.build_tick`` and
hands them to ``AuditLog.tick`` *before* it calls the actuator; the id of each intent record goes
into the node's ``decision`` annotation. When a step returns, ``AuditLog.outcome`` appends what
came of it. Refusals, findings and summaries pass through the ``Deduper`` so that a steady state
writes nothing per tick (docs/audit.md). When the store fails, what must not be lost waits in a
bounded spool (docs/design/audit-failure.md).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from rebalancer.adapters.audit import errors, ids, queries, reading, rows, stores
from rebalancer.core import audit
from rebalancer.core.audit import AuditRecord, Context, Deduper, Kind, NewId
from rebalancer.core.outcomes import ERRORS, ActionResult, Outcome, WriteKind, WriteOutcome
from rebalancer.errors import StoreFailed

T = TypeVar("T")
Sink = Callable[[str], None]
Listener = Callable[[AuditRecord], None]  # told of every record written, as it is written


def stdout_sink(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


_POD_GONE = frozenset({WriteOutcome.EVICTED, WriteOutcome.GONE, WriteOutcome.APPLIED})


SPOOL_LIMIT = 10_000  # records; about 3 KB each: 30 MB at most, hours of a failing store


class AuditLog:
    """One cluster's audit log: store first, then the JSON line, so a record on stdout is
    always a stored one.

    The store may be shared by the controllers of a fleet (docs/design/fleet.md): every record
    this log writes names ``cluster``, and every record it reads back for the runtime (the
    intents a restart judges, the one a node's decision names, the error budget's minutes) is
    one of that cluster's, never another controller's.

    When the store cannot take a write (docs/design/audit-failure.md), records that must not be
    lost wait in a bounded, ordered spool: an outcome (what it describes is done) goes there by
    itself, an intent only when the runtime ``hold``s it, having recorded it on its Node first.
    Every later write first writes the spool, oldest first, ids kept, so the store ends up with
    every record in the order it was made. A spooled record's JSON line is printed when it is
    spooled (and not again when the store takes it): the log pipeline hears of it at once.

    What fails is told apart: a store's own failure (``errors.own_failure``: a disk, a server,
    a connection) is raised as ``rebalancer.errors.StoreFailed`` from it, and only it sets
    ``failing`` or sends a record to the spool; anything else raised on the way (a bug of
    ours) goes up as it is, and says nothing about the store."""

    def __init__(
        self,
        store: stores.AuditStore,
        sink: Sink | None = stdout_sink,
        deduper: Deduper | None = None,
        new_id: NewId | None = None,
        cluster: str = audit.DEFAULT_CLUSTER,
        spool_limit: int = SPOOL_LIMIT,
        listener: Listener | None = None,
    ) -> None:
        self.store, self.sink, self.cluster = store, sink, cluster
        self.listener = listener  # the controller's metrics: its decision log
        self.deduper = deduper if deduper is not None else Deduper()
        self.new_id: NewId = new_id if new_id is not None else ids.UlidFactory()
        self.spool_limit = spool_limit
        self.spool: list[AuditRecord] = []  # taken by no store yet, oldest first
        self.failing: str | None = None  # why the store's last write failed; None: it works
        self.overflowed = 0  # records refused because the spool was full
        self._flushed: list[AuditRecord] = []  # spooled records the store has taken since asked
        self._flushing = asyncio.Lock()

    async def tick(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        """Write a tick's records (``core.audit.build_tick``), steady-state repeats left out.

        Returns what was written. Raises ``StoreFailed`` if the store fails: the runtime must
        then not act.
        """
        everything = list(batch)
        chosen = await self._write(self.deduper.select(everything))
        self.deduper.commit(everything, chosen)
        return chosen

    async def outcome(
        self,
        intent: AuditRecord,
        result: ActionResult,
        now: datetime,
        ctx: Context | None = None,
    ) -> AuditRecord:
        """Append what the actuator did for ``intent`` (a step, or a later ``progress`` pass)."""
        before = intent.before or {"taints": [], "labels": {}}
        after: Mapping[str, Any] = before
        pods = []
        for write in result.writes:
            if write.kind in (WriteKind.EVICT, WriteKind.DELETE):
                if write.outcome in _POD_GONE or write.outcome is WriteOutcome.PLANNED:
                    pods.append(write.target.removeprefix("pod/"))
            elif write.target.startswith("node/") and write.outcome in (
                WriteOutcome.APPLIED,
                WriteOutcome.PLANNED,
            ):
                after = _patched(after, write.body)
        detail: dict[str, Any] = {
            "call": result.action,
            "writes": [
                {
                    "kind": w.kind.value,
                    "target": w.target,
                    "outcome": w.outcome.value,
                    "body": w.body,
                }
                for w in result.writes
            ],
        }
        if result.kept:  # other writers' taints a restore left on the node
            detail["kept_taints"] = list(result.kept)
        if result.held:  # the pods a finalizer holds past the deadline
            detail["held_by_finalizers"] = list(result.held)
        if result.notice is not None:  # what the pods were told, and what they lost
            detail["notice"] = result.notice.to_doc()
        record = audit.outcome_record(
            intent,
            self.new_id,
            now,
            result.outcome,
            result.message,
            after=after,
            pods=pods,
            error=result.message if result.outcome in ERRORS else None,
            detail=detail,
            ctx=ctx,
        )
        record = replace(record, dry_run=result.dry_run or intent.dry_run)
        (written,) = await self._write([record], keep=True)
        return written

    async def supersede(
        self, intent: AuditRecord, now: datetime, why: str, ctx: Context | None = None
    ) -> AuditRecord:
        record = audit.outcome_record(intent, self.new_id, now, Outcome.SUPERSEDED, why, ctx=ctx)
        (written,) = await self._write([record], keep=True)
        return written

    # The spool: what the store has not taken yet

    def room(self, count: int = 1) -> bool:
        """Whether ``count`` more records fit in the spool."""
        return len(self.spool) + count <= self.spool_limit

    def hold(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        """Keep ``batch`` in the spool, after what is there, and print its JSON lines; the store
        gets it with the next write that succeeds. ``SpoolFull`` when it does not fit: then
        nothing of it is kept, and what it describes must not be done."""
        stamped = self._stamped(batch)
        if not self.room(len(stamped)):
            self.overflowed += len(stamped)
            raise errors.SpoolFull(
                f"the audit spool is full ({len(self.spool)} records of {self.spool_limit} "
                f"waiting for the store, which fails: {self.failing}); {len(stamped)} more "
                "refused, and what they describe is not done"
            )
        self.spool.extend(stamped)
        self._print(stamped)
        return stamped

    async def flush(self) -> tuple[AuditRecord, ...]:
        """Write the spool to the store (oldest first, one transaction); raises if the store
        still fails. Returns the spooled records the store has taken since last asked (by this
        call or by a write before it)."""
        try:
            await self._flush()
        except Exception as exc:
            raise self._failed(exc) from exc
        self.failing = None
        return self.take_flushed()

    def take_flushed(self) -> tuple[AuditRecord, ...]:
        taken, self._flushed = tuple(self._flushed), []
        return taken

    async def _flush(self) -> None:
        async with self._flushing:  # concurrent writers (a wave's outcomes) flush it once
            if not self.spool:
                return
            batch = list(self.spool)
            await self.store.append(batch)
            del self.spool[: len(batch)]
            self._flushed.extend(batch)

    # What the runtime reads back, of this cluster only: the intents a restart must judge, the
    # one a node names, and the minutes its pools' error budgets have spent. Another cluster's
    # pool or node may have the same name; its records are not this controller's to judge.

    # A read the store fails raises ``StoreFailed`` too; it leaves ``failing`` to the writes.

    async def get(self, record_id: str) -> AuditRecord | None:
        found = await self._read(self.store.get(record_id))
        return found if found is not None and found.cluster == self.cluster else None

    async def pending_intents(self) -> tuple[AuditRecord, ...]:
        return await self._read(self.store.pending_intents(self.cluster))

    async def unfinished_intents(self) -> tuple[AuditRecord, ...]:
        return await self._read(self.store.unfinished_intents(self.cluster))

    async def cost_minutes(self, pool: str, since: datetime) -> tuple[datetime, ...]:
        query = queries.AuditQuery(
            since=since, cluster=self.cluster, pool=pool, kinds=(Kind.COST,), limit=1000
        )
        spent = await self._read(reading.every_record(self.store, query))
        return tuple(r.time for r in spent if r.time > since)

    async def _read(self, answer: Awaitable[T]) -> T:
        try:
            return await answer
        except Exception as exc:
            if not errors.own_failure(exc):
                raise
            raise StoreFailed(_why(exc)) from exc

    async def _write(
        self, batch: Sequence[AuditRecord], keep: bool = False
    ) -> tuple[AuditRecord, ...]:
        """Store ``batch`` as this cluster's records (after the spool, which goes first), then
        sink them; returns them as stored. If the store fails: with ``keep`` (a record of what
        is done already) the batch joins the spool, else the error is raised."""
        stamped = self._stamped(batch)
        if not stamped:
            return stamped
        try:
            await self._flush()
            await self.store.append(stamped)
        except Exception as exc:
            failed = self._failed(exc)
            if not keep:
                raise failed from exc
            return self.hold(stamped)
        self.failing = None
        self._print(stamped)
        return stamped

    def _failed(self, exc: Exception) -> StoreFailed:
        """The store's own failure as ``StoreFailed``, noted in ``failing``; anything else is
        re-raised here as it is: a bug on the way to the store is not the store failing."""
        if not errors.own_failure(exc):
            raise exc
        self.failing = _why(exc)
        return StoreFailed(self.failing)

    def _stamped(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        return tuple(
            r if r.cluster == self.cluster else replace(r, cluster=self.cluster) for r in batch
        )

    def _print(self, records: Iterable[AuditRecord]) -> None:
        """The JSON line of each record written (stored, or spooled), and the listener told."""
        for record in records:
            if self.sink is not None:
                self.sink(rows.json_line(record))
            if self.listener is not None:
                self.listener(record)


def _why(exc: BaseException) -> str:
    """An error in one line, short (a database error may carry a whole statement)."""
    text = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


def _patched(before: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``before`` (a ``core.audit.node_doc``) after the JSON merge patch the writer sent: labels
    merge, taints swap."""
    labels = dict(before.get("labels") or {})
    for key, value in ((patch.get("metadata") or {}).get("labels") or {}).items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    taints = list(before.get("taints") or [])
    spec = patch.get("spec") or {}
    if "taints" in spec:
        taints = list(spec["taints"] or [])
    return {"taints": taints, "labels": dict(sorted(labels.items()))}
