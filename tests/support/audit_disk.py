"""A real SQLite audit store's disk, made to refuse writes as a full or read-only one does.

Every connection the store's engine hands out is told ``PRAGMA query_only`` as it is checked
out, so SQLite itself answers "attempt to write a readonly database"; setting ``full`` back to
False is the disk freed. For the suites of the reconcile step with a failing store
(``tests/runtime/test_audit_failure.py``, ``tests/runtime/test_audit_read_back.py``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from rebalancer.adapters.audit import SqlAuditStore


class Disk:
    """Whether the store's SQLite file takes writes."""

    def __init__(self, store: SqlAuditStore) -> None:
        self.full = False
        sa.event.listen(store.engine.sync_engine, "checkout", self._checkout)

    def _checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA query_only={'ON' if self.full else 'OFF'}")
        cursor.close()
