"""The audit log in SQLite (one file, the default) or PostgreSQL, by SQLAlchemy URL.

Where it sits: ``runtime.wiring`` opens the store ``audit.url`` names and hands it to
``log.AuditLog``; the commands open it to read. Appends are durable when they return (SQLite in
WAL mode with ``synchronous=FULL``; PostgreSQL's commit), and go through ``groupcommit`` so that
a wave's records share transactions. Opening brings the schema up to date (``schema.migrate``)
and refuses, in one line, a store this process cannot use: a SQLite file it cannot write, a
server that refuses, a schema a newer release migrated.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from rebalancer.adapters import auditurl
from rebalancer.adapters.audit import errors, groupcommit, queries, rows, schema
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Clock
from rebalancer.core.outcomes import Outcome


class SqlAuditStore:
    """The audit log in SQLite (one file, the default) or PostgreSQL, by SQLAlchemy URL."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._group = groupcommit.GroupCommit(self._insert)

    @classmethod
    async def open(
        cls, url: str = auditurl.DEFAULT_URL, *, now: Clock = lambda: datetime.now(UTC)
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
                await conn.run_sync(schema.migrate, now())
        except errors.NewerSchema as exc:
            await engine.dispose()
            shown = made.render_as_string(hide_password=True)
            raise errors.NewerSchema(exc.found, exc.reads, shown) from None
        except (OSError, sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            await engine.dispose()
            raise _unopened(made, exc) from None
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine)

    async def schema_versions(self) -> list[int]:
        async with self.engine.connect() as conn:
            version = schema.schema_version.c.version
            found = await conn.execute(sa.select(version).order_by(version))
            return [int(v) for v in found.scalars()]

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        if batch:
            await self._group.append(batch)

    async def _insert(self, batch: Sequence[AuditRecord]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(schema.records.insert(), [rows.to_row(r) for r in batch])

    async def get(self, record_id: str) -> AuditRecord | None:
        async with self.engine.connect() as conn:
            stmt = schema.records.select().where(schema.records.c.id == record_id)
            row = (await conn.execute(stmt)).first()
        return None if row is None else rows.from_row(row._mapping)

    async def query(self, query: queries.AuditQuery) -> queries.AuditPage:
        c = schema.records.c
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
        stmt = schema.records.select().where(*where).order_by(*order).limit(query.limit + 1)
        async with self.engine.connect() as conn:
            found = (await conn.execute(stmt)).all()
        return queries.page_of([rows.from_row(r._mapping) for r in found], query.limit)

    async def pending_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        return await self._open(final_only=False, cluster=cluster)

    async def unfinished_intents(self, cluster: str | None = None) -> tuple[AuditRecord, ...]:
        return await self._open(final_only=True, cluster=cluster)

    async def _open(self, final_only: bool, cluster: str | None) -> tuple[AuditRecord, ...]:
        """Intents no outcome closes (``final_only``: no outcome but ``in_progress``)."""
        table = schema.records
        outcome = table.alias("outcome")
        closes = outcome.c.intent_id == table.c.id
        if final_only:
            closes = sa.and_(closes, outcome.c.outcome != Outcome.IN_PROGRESS.value)
        closed = sa.select(outcome.c.id).where(closes).exists()
        where = [table.c.kind == Kind.INTENT.value, ~closed]
        if cluster is not None:
            where.append(table.c.cluster == cluster)
        stmt = table.select().where(*where).order_by(table.c.time, table.c.id)
        async with self.engine.connect() as conn:
            found = (await conn.execute(stmt)).all()
        return tuple(rows.from_row(r._mapping) for r in found)

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


def _unopened(url: sa.URL, exc: BaseException) -> errors.UnopenedStore:
    why = " ".join(str(getattr(exc, "orig", None) or exc).split())
    shown = url.render_as_string(hide_password=True)
    return errors.UnopenedStore(f"audit.url={shown!r}: cannot open the audit store: {why[:200]}")


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
            raise errors.UnopenedStore(
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
