"""The audit log's storage: SQLite or PostgreSQL through SQLAlchemy 2 async, and stdout.

Where it sits: each tick the runtime builds the tick's records with ``core.audit.build_tick`` and
hands them to ``AuditLog.tick`` *before* it calls the actuator; the id of each intent record goes
into the node's ``decision`` annotation. When a step returns, ``AuditLog.outcome`` appends what
came of it. Refusals, findings and summaries pass through the ``Deduper`` so that a steady state
writes nothing per tick (docs/audit.md).

Why it is shaped like this:
- Append only. An outcome is a new row naming its intent (``intent_id``); no row is ever updated,
  so a crash at any point leaves every committed record readable, and an intent without an
  outcome says exactly "decided, then nothing known" (``pending_intents``; at start-up the
  runtime closes each with what its node shows it came to, ``core.recovery``, and audits the
  writes that end what a crash left in flight like any other step).
- The store commits before ``tick``/``outcome`` return: the intent is durable before the
  actuator writes (SQLite in WAL mode with ``synchronous=FULL``; PostgreSQL's commit).
- One schema on both databases, created and migrated by the program (``MIGRATIONS``, recorded in
  ``audit_schema_version``); structured fields are JSON columns (JSONB on PostgreSQL).
- Readers page with a keyset on ``(time, id)``: ids are ULID-like and increase within a process,
  so records of one tick (which share its time) come back in the order they were written.
- A follower (``Tail``, ``rebalancer audit --follow``) cannot rely on the keyset alone: a record
  is committed after its ``time`` (an intent carries its tick's snapshot time), and two writers
  (the controller and ``rebalancer reclaim``, a fleet's controllers) commit in any order, so a
  record may land behind one already shown. It re-reads a window of ``LATE`` behind the newest
  record it has shown and skips the ids it has shown.
- Each stored record is also written as one JSON line to a sink (stdout by default), after the
  commit.
- One PostgreSQL store may serve a fleet of clusters, one controller each (schema version 2):
  every record names its ``cluster``, and an ``AuditLog`` reads back only its own cluster's
  (docs/design/fleet.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Context, Deduper, Kind, NewId
from rebalancer.core.model import Clock
from rebalancer.core.outcomes import ERRORS, ActionResult, Outcome, WriteKind, WriteOutcome
from rebalancer.errors import RebalancerError

Sink = Callable[[str], None]

DEFAULT_URL = "sqlite+aiosqlite:///rebalancer-audit.sqlite3"


# ---------------------------------------------------------------------------------------------
# Ids: ULID-like, 26 Crockford base32 characters, time first, increasing within a process

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        out.append(_CROCKFORD[digit])
    return "".join(reversed(out))


class UlidFactory:
    """48 bits of milliseconds then 80 random bits; within one millisecond (or if the clock
    steps back) the previous id plus one, so ids sort in the order they were made."""

    def __init__(
        self,
        clock: Clock = lambda: datetime.now(UTC),
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._clock, self._random = clock, random
        self._last = (0, 0)
        self._lock = threading.Lock()

    def __call__(self) -> str:
        ms = int(self._clock().timestamp() * 1000)
        with self._lock:
            last_ms, last_rand = self._last
            if ms <= last_ms:
                ms, rand = last_ms, last_rand + 1
                if rand >= 1 << 80:
                    ms, rand = ms + 1, 0
            else:
                rand = int.from_bytes(self._random(10), "big")
            self._last = (ms, rand)
        return _encode(ms, 10) + _encode(rand, 16)


# ---------------------------------------------------------------------------------------------
# Schema and migrations


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Aware UTC datetimes on both databases (SQLite keeps naive UTC text that sorts by time)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: audit times must be aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONDoc = sa.JSON().with_variant(JSONB(), "postgresql")

metadata = sa.MetaData()

schema_version = sa.Table(
    "audit_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", UTCDateTime, nullable=False),
)


def _audit_records(meta: sa.MetaData) -> sa.Table:
    """``audit_records`` and its indexes as schema version 1 made them (``_v1`` creates exactly
    this; later versions change it with their own DDL)."""
    table = sa.Table(
        "audit_records",
        meta,
        sa.Column("id", sa.String(26), primary_key=True),
        sa.Column("time", UTCDateTime, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("controller", sa.String(253), nullable=False),
        sa.Column("term", sa.Integer, nullable=True),
        sa.Column("pool", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=True),
        sa.Column("action", sa.String(16), nullable=True),
        sa.Column("origin", sa.String(16), nullable=True),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("strategy", sa.String(64), nullable=True),
        sa.Column("params", JSONDoc, nullable=False),
        sa.Column("inputs", JSONDoc, nullable=False),
        sa.Column("before", JSONDoc, nullable=True),
        sa.Column("after", JSONDoc, nullable=True),
        sa.Column("pods", JSONDoc, nullable=False),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("intent_id", sa.String(26), nullable=True),
        sa.Column("detail", JSONDoc, nullable=False),
    )
    sa.Index("audit_records_time", table.c.time, table.c.id)
    sa.Index("audit_records_pool", table.c.pool, table.c.time, table.c.id)
    sa.Index("audit_records_node", table.c.node, table.c.time, table.c.id)
    sa.Index("audit_records_intent", table.c.intent_id)
    return table


# The table as this program reads and writes it: version 1's, and the cluster of version 2.
records = _audit_records(metadata)
records.append_column(
    sa.Column(
        "cluster",
        sa.String(63),
        nullable=False,
        server_default=audit.DEFAULT_CLUSTER,
    )
)
by_cluster = sa.Index("audit_records_cluster", records.c.cluster, records.c.time, records.c.id)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _v1(conn: Connection) -> None:
    # The tables as of version 1, on a metadata of their own: ``records`` is the newest shape.
    _audit_records(sa.MetaData()).create(conn)  # with its indexes, which are attached to it


def _v2(conn: Connection) -> None:
    # Every row written before names no cluster: it is given the default, which is also the
    # setting's, so a controller upgraded in place without a cluster_name reads its history
    # back. The server default stays, so a row written without the column still gets one.
    conn.execute(
        sa.text(
            "ALTER TABLE audit_records ADD COLUMN cluster VARCHAR(63) NOT NULL "
            f"DEFAULT '{audit.DEFAULT_CLUSTER}'"
        )
    )
    by_cluster.create(conn)  # a controller's own reads and a fleet's per-cluster queries


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "audit_records and its indexes", _v1),
    Migration(2, "audit_records.cluster, indexed with time", _v2),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def migrate(
    conn: Connection, now: datetime, migrations: Sequence[Migration] = MIGRATIONS
) -> list[int]:
    """Apply, in order, every migration newer than the database; returns those applied.

    ``migrations`` is this program's (a test passes the first ones to make an older database).
    Runs in the caller's transaction. On PostgreSQL a transaction-scoped advisory lock makes
    replicas starting together migrate one after the other; DDL is transactional on both
    databases, so a failed migration leaves the previous version intact.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(7267117164031)"))
    schema_version.create(conn, checkfirst=True)
    current = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0
    newest = migrations[-1].version
    if current > newest:
        # Nothing is written: the transaction only read the version (the table existed, or
        # ``current`` would be 0), and the caller's rollback leaves the database as it was.
        raise NewerSchema(current, newest)
    applied = []
    for migration in migrations:
        if migration.version <= current:
            continue
        migration.apply(conn)
        conn.execute(
            schema_version.insert().values(
                version=migration.version, description=migration.description, applied_at=now
            )
        )
        applied.append(migration.version)
    return applied


# ---------------------------------------------------------------------------------------------
# Queries


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


def _page(found: Sequence[AuditRecord], limit: int) -> AuditPage:
    rows = tuple(found[:limit])
    more = len(found) > limit
    return AuditPage(rows, Cursor(rows[-1].time, rows[-1].id) if more and rows else None)


async def every_record(store: AuditStore, query: AuditQuery | None = None) -> list[AuditRecord]:
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

    async def first(self, store: AuditStore) -> list[AuditRecord]:
        """The newest ``query.limit`` records, oldest first."""
        page = await store.query(replace(self.query, after=None, newest_first=True))
        found = list(reversed(page.records))
        if found:  # else nothing matches yet: every record to come is new
            self._floor = (found[0].time, found[0].id)
        return self._show(found)

    async def more(self, store: AuditStore) -> list[AuditRecord]:
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


# ---------------------------------------------------------------------------------------------
# Stores


class AuditStore(Protocol):
    async def append(self, batch: Sequence[AuditRecord]) -> None:
        """Store ``batch`` in one transaction; return only once it is durable."""

    async def get(self, record_id: str) -> AuditRecord | None: ...

    async def query(self, query: AuditQuery) -> AuditPage: ...

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

    def __init__(self, error: UnopenedStore) -> None:
        self.error = error

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        raise self.error

    async def get(self, record_id: str) -> AuditRecord | None:
        raise self.error

    async def query(self, query: AuditQuery) -> AuditPage:
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

    async def query(self, query: AuditQuery) -> AuditPage:
        found = sorted(
            (r for r in self.records if query.matches(r)),
            key=lambda r: (r.time, r.id),
            reverse=query.newest_first,
        )
        return _page(found, query.limit)

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


@dataclass(eq=False)
class _Waiting:
    batch: Sequence[AuditRecord]
    settled: bool = False
    error: BaseException | None = None


# Errors one caller's records can cause (a duplicate id, a value the column refuses): the others
# of the transaction are committed without them. Any other error (the store is down, locked,
# out of space) is every caller's, at once: trying each again alone would only keep a wave of
# reclaims waiting behind the retries.
_ONE_CALLERS = (sa.exc.IntegrityError, sa.exc.DataError, ValueError, TypeError)


class GroupCommit:
    """Appends that arrive while one is being committed go together in the next transaction.

    A wave of 100 reclaims writes 100 outcome records, each as its step ends, several steps at
    once: a transaction each cost 75 ms of CPU and, with SQLite's sync on every commit, 170 ms
    of wall for 100 (four at a time: 21 ms and 24 ms). Every caller still returns only once its
    own records are committed, and raises the error of the transaction that carried them, so
    an intent is on disk before its action exactly as before.

    A transaction runs as a task of its own, which a cancelled caller never cuts short: every
    caller it carries is settled (committed, or given its error) whatever happens to the one
    that started it. A caller cancelled before a transaction took its records leaves, and its
    records are never written."""

    def __init__(self, commit: Callable[[Sequence[AuditRecord]], Awaitable[None]]) -> None:
        self._commit = commit
        self._waiting: list[_Waiting] = []
        self._running: asyncio.Task[None] | None = None

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        mine = _Waiting(batch)
        self._waiting.append(mine)
        try:
            while not mine.settled:
                if self._running is None or self._running.done():
                    taken, self._waiting = self._waiting, []
                    self._running = asyncio.get_running_loop().create_task(self._settle(taken))
                await asyncio.shield(self._running)
        except asyncio.CancelledError:
            if mine in self._waiting:
                self._waiting.remove(mine)
            raise
        if mine.error is not None:
            raise mine.error

    async def _settle(self, taken: list[_Waiting]) -> None:
        try:
            await self._commit([r for w in taken for r in w.batch])
        except _ONE_CALLERS as exc:
            if len(taken) == 1:
                taken[0].error = exc
            else:
                for waiting in taken:
                    await self._settle([waiting])
        except BaseException as exc:  # every caller's: each raises it
            for waiting in taken:
                waiting.error = exc
        finally:
            for waiting in taken:
                waiting.settled = True


class SqlAuditStore:
    """The audit log in SQLite (one file, the default) or PostgreSQL, by SQLAlchemy URL."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._group = GroupCommit(self._insert)

    @classmethod
    async def open(
        cls, url: str = DEFAULT_URL, *, now: Clock = lambda: datetime.now(UTC)
    ) -> SqlAuditStore:
        """Connect and bring the schema up to date (idempotent: opening twice changes nothing)."""
        made = sa.make_url(url)
        kwargs: dict[str, Any] = {}
        try:
            if made.get_backend_name() == "sqlite":
                if made.database and made.database != ":memory:":
                    Path(made.database).parent.mkdir(parents=True, exist_ok=True)
                    _refuse_unwritable(made, Path(made.database))
                kwargs["connect_args"] = {"timeout": 30}
            engine = create_async_engine(made, **kwargs)
        except (OSError, ImportError, sa.exc.ArgumentError) as exc:
            raise _unopened(made, exc) from None
        if made.get_backend_name() == "sqlite":
            sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(migrate, now())
        except NewerSchema as exc:
            await engine.dispose()
            shown = made.render_as_string(hide_password=True)
            raise NewerSchema(exc.found, exc.reads, shown) from None
        except (OSError, sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            await engine.dispose()
            raise _unopened(made, exc) from None
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine)

    async def schema_versions(self) -> list[int]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                sa.select(schema_version.c.version).order_by(schema_version.c.version)
            )
            return [int(v) for v in rows.scalars()]

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        if batch:
            await self._group.append(batch)

    async def _insert(self, batch: Sequence[AuditRecord]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(records.insert(), [_row(r) for r in batch])

    async def get(self, record_id: str) -> AuditRecord | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(records.select().where(records.c.id == record_id))).first()
        return None if row is None else _record(row._mapping)

    async def query(self, query: AuditQuery) -> AuditPage:
        c = records.c
        where: list[sa.ColumnElement[bool]] = []
        if query.since is not None:
            where.append(c.time >= query.since)
        if query.until is not None:
            where.append(c.time < query.until)
        for column, value in (
            (c.cluster, query.cluster),
            (c.pool, query.pool),
            (c.node, query.node),
            (c.action, query.action),
        ):
            if value is not None:
                where.append(column == value)
        if query.kinds:
            where.append(c.kind.in_([k.value for k in query.kinds]))
        if query.after is not None:
            t, i = query.after.time, query.after.id
            if query.newest_first:
                where.append(sa.or_(c.time < t, sa.and_(c.time == t, c.id < i)))
            else:
                where.append(sa.or_(c.time > t, sa.and_(c.time == t, c.id > i)))
        order = (c.time.desc(), c.id.desc()) if query.newest_first else (c.time, c.id)
        stmt = records.select().where(*where).order_by(*order).limit(query.limit + 1)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return _page([_record(r._mapping) for r in rows], query.limit)

    async def pending_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        return await self._open(final_only=False, cluster=cluster)

    async def unfinished_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        return await self._open(final_only=True, cluster=cluster)

    async def _open(self, final_only: bool, cluster: str | None) -> tuple[AuditRecord, ...]:
        """Intents no outcome closes (``final_only``: no outcome but ``in_progress``)."""
        outcome = records.alias("outcome")
        closes = outcome.c.intent_id == records.c.id
        if final_only:
            closes = sa.and_(closes, outcome.c.outcome != Outcome.IN_PROGRESS.value)
        closed = sa.select(outcome.c.id).where(closes).exists()
        where = [records.c.kind == Kind.INTENT.value, ~closed]
        if cluster is not None:
            where.append(records.c.cluster == cluster)
        stmt = records.select().where(*where).order_by(records.c.time, records.c.id)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return tuple(_record(r._mapping) for r in rows)

    async def close(self) -> None:
        await self.engine.dispose()


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite store's URL names; None for PostgreSQL, an in-memory SQLite or a URL
    that does not parse (``SqlAuditStore.open`` says why)."""
    try:
        made = sa.make_url(url)
    except sa.exc.ArgumentError:
        return None
    if made.get_backend_name() != "sqlite" or made.database in (None, "", ":memory:"):
        return None
    return Path(made.database)


class UnopenedStore(RebalancerError):
    """The audit store cannot be opened (a path that cannot be made, a server that refuses)."""


class NewerSchema(UnopenedStore):
    """The store was migrated by a newer release (a downgrade): this one refuses it, in one
    line, and leaves it as it is; its rows may mean what this release does not know."""

    def __init__(self, found: int, reads: int, url: str = "") -> None:
        where = f"audit.url={url!r}: " if url else ""
        super().__init__(
            f"{where}the audit store is at schema version {found}, newer than version {reads} "
            "that this release reads: run the release that migrated it (or a newer one); "
            "nothing in the store was changed"
        )
        self.found, self.reads, self.url = found, reads, url


def _unopened(url: sa.URL, exc: BaseException) -> UnopenedStore:
    why = " ".join(str(getattr(exc, "orig", None) or exc).split())
    shown = url.render_as_string(hide_password=True)
    return UnopenedStore(f"audit.url={shown!r}: cannot open the audit store: {why[:200]}")


def _refuse_unwritable(url: sa.URL, database: Path) -> None:
    """A SQLite store whose files this process cannot write is refused at open, naming the
    file. In WAL mode every connection, a reader's too, maps the ``-shm`` file into memory: one
    it cannot write (immutable, on a read-only mount, another user's) turns SQLite to a
    read-only fallback at best and, where the mapping outruns the file, ends the process with
    SIGBUS, a signal no Python code can catch. ``os.access`` asks the kernel, which says no for
    an immutable file or a read-only mount even to root."""
    for path in (database.parent, database, *(Path(f"{database}{s}") for s in ("-wal", "-shm"))):
        if path.exists() and not os.access(path, os.W_OK):
            shown = url.render_as_string(hide_password=True)
            raise UnopenedStore(
                f"audit.url={shown!r}: cannot write {path} (immutable, on a read-only mount, "
                "or another user's): SQLite needs to write it; fix the file, or point audit.url "
                "at a directory this process can write"
            )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _row(r: AuditRecord) -> dict[str, Any]:
    doc = audit.to_json(r)
    doc["time"] = r.time
    return doc


E = TypeVar("E", bound=StrEnum)


class UnreadableRecord(RebalancerError):
    """A stored record that does not read back as one (see ``_optional``)."""


def _optional(kind: type[E], row: sa.RowMapping | Mapping[str, Any], column: str) -> E | None:
    """A column read back into its vocabulary; a value outside it (a row written by a newer
    version, or by hand) is an error naming the record, the column and the value."""
    value = row[column]
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(m.value for m in kind)
        raise UnreadableRecord(
            f"audit record {row['id']}: {column}={value!r} is not one of {known}"
        ) from None


def _record(row: sa.RowMapping | Mapping[str, Any]) -> AuditRecord:
    """A record from a row of the table (a ``RowMapping``) or a dict of the same columns."""
    return AuditRecord(
        id=row["id"],
        time=row["time"],
        kind=Kind(row["kind"]),
        controller=row["controller"],
        term=row["term"],
        pool=row["pool"],
        node=row["node"],
        action=_optional(model.Action, row, "action"),
        origin=_optional(model.Origin, row, "origin"),
        reason=row["reason"],
        message=row["message"],
        count=row["count"],
        strategy=row["strategy"],
        params=row["params"],
        inputs=row["inputs"],
        before=row["before"],
        after=row["after"],
        pods=tuple(row["pods"]),
        dry_run=bool(row["dry_run"]),
        error=row["error"],
        outcome=_optional(Outcome, row, "outcome"),
        intent_id=row["intent_id"],
        detail=row["detail"],
        cluster=row["cluster"],
    )


# ---------------------------------------------------------------------------------------------
# The log the runtime writes through


def stdout_sink(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def json_line(record: AuditRecord) -> str:
    return json.dumps(audit.to_json(record), sort_keys=True, separators=(",", ":"))


def from_json(doc: Mapping[str, Any]) -> AuditRecord:
    """A record back from its JSON form (``core.audit.to_json``, a ``json_line``): how a record
    kept on a Node while the store failed is read back (``adapters.ledger``). Raises
    ``UnreadableRecord`` naming what is wrong."""
    try:
        when = datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))
        row = {**{c.name: None for c in records.columns}, **doc, "time": when}
        row["pods"] = row["pods"] or ()
        for column in ("params", "inputs", "detail"):
            row[column] = row[column] or {}
        return _record(row)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableRecord(f"audit record {doc.get('id')!r}: {exc}") from None


_POD_GONE = frozenset({WriteOutcome.EVICTED, WriteOutcome.GONE, WriteOutcome.APPLIED})


class SpoolFull(RebalancerError):
    """The spool of records the store has not taken is full: nothing more may be done until
    the store takes them (an action with no record anywhere must not happen)."""


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
    spooled (and not again when the store takes it): the log pipeline hears of it at once."""

    def __init__(
        self,
        store: AuditStore,
        sink: Sink | None = stdout_sink,
        deduper: Deduper | None = None,
        new_id: NewId | None = None,
        cluster: str = audit.DEFAULT_CLUSTER,
        spool_limit: int = SPOOL_LIMIT,
    ) -> None:
        self.store, self.sink, self.cluster = store, sink, cluster
        self.deduper = deduper if deduper is not None else Deduper()
        self.new_id: NewId = new_id if new_id is not None else UlidFactory()
        self.spool_limit = spool_limit
        self.spool: list[AuditRecord] = []  # taken by no store yet, oldest first
        self.failing: str | None = None  # why the store's last write failed; None: it works
        self.overflowed = 0  # records refused because the spool was full
        self._flushed: list[AuditRecord] = []  # spooled records the store has taken since asked
        self._flushing = asyncio.Lock()

    async def tick(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        """Write a tick's records (``core.audit.build_tick``), steady-state repeats left out.

        Returns what was written. Raises if the store fails: the runtime must then not act.
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
            elif write.outcome in (WriteOutcome.APPLIED, WriteOutcome.PLANNED):
                after = _patched(after, write.body)
        detail = {
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
            raise SpoolFull(
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
            self.failing = _why(exc)
            raise
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

    async def get(self, record_id: str) -> AuditRecord | None:
        found = await self.store.get(record_id)
        return found if found is not None and found.cluster == self.cluster else None

    async def pending_intents(self) -> tuple[AuditRecord, ...]:
        return await self.store.pending_intents(self.cluster)

    async def unfinished_intents(self) -> tuple[AuditRecord, ...]:
        return await self.store.unfinished_intents(self.cluster)

    async def costs(self, pool: str, since: datetime) -> tuple[datetime, ...]:
        query = AuditQuery(
            since=since, cluster=self.cluster, pool=pool, kinds=(Kind.COST,), limit=1000
        )
        return tuple(r.time for r in await every_record(self.store, query) if r.time > since)

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
            self.failing = _why(exc)
            if not keep:
                raise
            return self.hold(stamped)
        self.failing = None
        self._print(stamped)
        return stamped

    def _stamped(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        return tuple(
            r if r.cluster == self.cluster else replace(r, cluster=self.cluster) for r in batch
        )

    def _print(self, records: Iterable[AuditRecord]) -> None:
        if self.sink is not None:
            for record in records:
                self.sink(json_line(record))


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
