"""The seam every audit store fits (``AuditStore``), and the two that keep nothing on disk.

Where it sits: ``log.AuditLog`` writes through an ``AuditStore`` and the commands read through
one. ``sql.SqlAuditStore`` is the real one; ``MemoryAuditStore`` keeps a list for the tests that
run the controller, and ``UnreachableStore`` stands in for a store that cannot be opened, so that
an operator's ``rebalancer reclaim`` still runs, each record kept on its node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rebalancer.adapters.audit import errors, queries
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import Outcome


class AuditStore(Protocol):
    async def append(self, batch: Sequence[AuditRecord]) -> None:
        """Store ``batch`` in one transaction; return only once it is durable."""

    async def get(self, record_id: str) -> AuditRecord | None: ...

    async def query(self, query: queries.AuditQuery) -> queries.AuditPage: ...

    async def pending_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        """Intents (of ``cluster``; None: of every cluster) no outcome names yet, oldest first."""

    async def unfinished_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        """Intents (of ``cluster``; None: of every cluster) with no final outcome (none but
        ``in_progress``), oldest first."""

    async def close(self) -> None: ...


class UnreachableStore:
    """The store an operator's ``rebalancer reclaim`` works with when the real one cannot be
    opened (its disk is full, its server is down): every call raises the error that kept it
    shut, so the reclaim goes the way of any store that refuses writes, each record kept on its
    node before the node's first write (docs/design/audit-failure.md). Nothing is stored and
    nothing is lost: the controller writes what the nodes keep once its store takes writes."""

    def __init__(self, error: errors.UnopenedStore) -> None:
        self.error = error

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        raise self.error

    async def get(self, record_id: str) -> AuditRecord | None:
        raise self.error

    async def query(self, query: queries.AuditQuery) -> queries.AuditPage:
        raise self.error

    async def pending_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        raise self.error

    async def unfinished_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        raise self.error

    async def close(self) -> None:
        pass


class MemoryAuditStore:
    """An ``AuditStore`` in a list, for the runtime's unit tests."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self.fail_next: Exception | None = None  # raised (once) by the next append
        self.failing: Exception | None = None  # raised by every append until cleared

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        if self.failing is not None:
            raise self.failing
        ids = {r.id for r in self.records}
        for record in batch:
            if record.id in ids:
                raise ValueError(f"duplicate audit record id {record.id}")
            ids.add(record.id)
        self.records.extend(batch)

    async def get(self, record_id: str) -> AuditRecord | None:
        return next((r for r in self.records if r.id == record_id), None)

    async def query(self, query: queries.AuditQuery) -> queries.AuditPage:
        found = sorted(
            (r for r in self.records if query.matches(r)),
            key=lambda r: (r.time, r.id),
            reverse=query.newest_first,
        )
        return queries.page_of(found, query.limit)

    async def pending_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        closed = {r.intent_id for r in self.records if r.kind is Kind.OUTCOME}
        return self._without(closed, cluster)

    async def unfinished_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        closed = {
            r.intent_id
            for r in self.records
            if r.kind is Kind.OUTCOME and r.outcome is not Outcome.IN_PROGRESS
        }
        return self._without(closed, cluster)

    def _without(self, closed: set[str | None], cluster: str | None) -> tuple[AuditRecord, ...]:
        found = [
            r
            for r in self.records
            if r.kind is Kind.INTENT
            and r.id not in closed
            and (cluster is None or r.cluster == cluster)
        ]
        return tuple(sorted(found, key=lambda r: (r.time, r.id)))

    async def close(self) -> None:
        return None
