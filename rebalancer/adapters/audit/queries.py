"""What a store is asked and what it answers: filters, and pages with a keyset.

Where it sits: every store answers an ``AuditQuery`` with an ``AuditPage`` (``stores``, ``sql``);
``reading`` reads through them for ``rebalancer audit``, the HTTP API and the runtime's error
budget. Readers page with a keyset on ``(time, id)``: ids increase within a process (``ids``), so
records of one tick (which share its time) come back in the order they were written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rebalancer.core.audit import AuditRecord, Kind


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
