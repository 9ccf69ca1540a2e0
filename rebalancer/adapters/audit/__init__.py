"""The audit log's storage: SQLite or PostgreSQL through SQLAlchemy 2 async, and stdout.

Where it sits: the runtime writes every record through ``AuditLog`` before it acts on what the
record describes; ``rebalancer audit``, ``explain`` and the HTTP API read the store back. The
modules, in the order a record meets them: ``ids`` (its id), ``log`` (``AuditLog``, its spool and
the JSON line), ``groupcommit`` and ``sql`` (the transaction that makes it durable), ``schema``
(the tables and their migrations), ``rows`` (a record as a row or a JSON line and back),
``queries`` (what a store is asked and answers), ``reading`` (reading it back, ``Tail`` to
follow), ``stores`` (the seam and the stores that keep nothing on disk) and ``errors``. The names
below are the package's surface; import them from here.

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
- The default URL lives in ``adapters.auditurl``, outside this package: the settings name it,
  and loading the settings must not load SQLAlchemy.
"""

from rebalancer.adapters.audit.errors import (
    NewerSchema,
    SpoolFull,
    UnopenedStore,
    UnreadableRecord,
)
from rebalancer.adapters.audit.groupcommit import GroupCommit
from rebalancer.adapters.audit.ids import UlidFactory
from rebalancer.adapters.audit.log import SPOOL_LIMIT, AuditLog, Sink, stdout_sink
from rebalancer.adapters.audit.queries import AuditPage, AuditQuery, Cursor
from rebalancer.adapters.audit.reading import LATE, Tail, every_record
from rebalancer.adapters.audit.rows import from_json, json_line
from rebalancer.adapters.audit.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    JSONDoc,
    Migration,
    UTCDateTime,
    by_cluster,
    metadata,
    migrate,
    records,
    schema_version,
)
from rebalancer.adapters.audit.sql import SqlAuditStore, sqlite_file
from rebalancer.adapters.audit.stores import AuditStore, MemoryAuditStore, UnreachableStore
from rebalancer.adapters.auditurl import DEFAULT_URL

__all__ = [
    "DEFAULT_URL",
    "LATE",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SPOOL_LIMIT",
    "AuditLog",
    "AuditPage",
    "AuditQuery",
    "AuditStore",
    "Cursor",
    "GroupCommit",
    "JSONDoc",
    "MemoryAuditStore",
    "Migration",
    "NewerSchema",
    "Sink",
    "SpoolFull",
    "SqlAuditStore",
    "Tail",
    "UTCDateTime",
    "UlidFactory",
    "UnopenedStore",
    "UnreachableStore",
    "UnreadableRecord",
    "by_cluster",
    "every_record",
    "from_json",
    "json_line",
    "metadata",
    "migrate",
    "records",
    "schema_version",
    "sqlite_file",
    "stdout_sink",
]
