"""Reading the audit log back: filters, keyset pages, every record, and a follower.

Where it sits: every store answers an ``AuditQuery`` with an ``AuditPage``; ``rebalancer audit``,
the HTTP API and the runtime's error budget read through it. Readers page with a keyset on
``(time, id)``: ids increase within a process (``ids``), so records of one tick (which share its
time) come back in the order they were written.

A follower (``Tail``, ``rebalancer audit --follow``) cannot rely on the keyset alone: a record is
committed after its ``time`` (an intent carries its tick's snapshot time), and two writers (the
controller and ``rebalancer reclaim``, a fleet's controllers) commit in any order, so a record
may land behind one already shown. It re-reads a window of ``LATE`` behind the newest record it
has shown and skips the ids it has shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from rebalancer.core.audit import AuditRecord, Kind

if TYPE_CHECKING:  # the stores answer these queries: they import this module
    from rebalancer.adapters.audit import stores


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ended: the (time, id) of its last record. ``token`` is its text form."""

    time: datetime
    id: str

    @property
    def token(self) -> str:
        return f"{self.time.astimezone(UTC).isoformat()}|{self.id}"

    @staticmethod
    def parse(token: str) -> Cursor:
        when, _, ident = token.partition("|")
        return Cursor(datetime.fromisoformat(when), ident)


@dataclass(frozen=True)
class AuditQuery:
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    cluster: str | None = None  # None: every cluster's records (a store a fleet shares)
    pool: str | None = None
    node: str | None = None
    action: str | None = None
    kinds: tuple[Kind, ...] = ()  # empty: every kind
    after: Cursor | None = None  # the previous page's ``next``
    limit: int = 100
    newest_first: bool = False

    def matches(self, r: AuditRecord) -> bool:
        """The same filter in Python (the in-memory store; the SQL below must agree)."""
        key = (r.time, r.id)
        if self.after is not None:
            mark = (self.after.time, self.after.id)
            if (key <= mark) if not self.newest_first else (key >= mark):
                return False
        return (
            (self.since is None or r.time >= self.since)
            and (self.until is None or r.time < self.until)
            and (self.cluster is None or r.cluster == self.cluster)
            and (self.pool is None or r.pool == self.pool)
            and (self.node is None or r.node == self.node)
            and (self.action is None or r.action == self.action)
            and (not self.kinds or r.kind in self.kinds)
        )


@dataclass(frozen=True)
class AuditPage:
    records: tuple[AuditRecord, ...]
    next: Cursor | None  # None: there is nothing after this page


def page_of(found: Sequence[AuditRecord], limit: int) -> AuditPage:
    """The first ``limit`` of ``found``; a store reads one more, so that a record past them
    says there is a next page."""
    rows = tuple(found[:limit])
    more = len(found) > limit
    return AuditPage(rows, Cursor(rows[-1].time, rows[-1].id) if more and rows else None)


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
