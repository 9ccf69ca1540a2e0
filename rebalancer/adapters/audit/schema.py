"""The audit store's tables, on SQLite and PostgreSQL alike, and the migrations that make them.

Where it sits: ``sql.SqlAuditStore.open`` runs ``migrate`` in the transaction that opens a store;
``rows`` turns records into rows of ``records`` and back. One schema on both databases, created
and migrated by the program (``MIGRATIONS``, recorded in ``audit_schema_version``); structured
fields are JSON columns (JSONB on PostgreSQL). Schema version 2 names the ``cluster`` of every
record, so that one PostgreSQL store may serve a fleet (docs/design/fleet.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Dialect

from rebalancer.adapters.audit import errors
from rebalancer.core import audit


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
        raise errors.NewerSchema(current, newest)
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
