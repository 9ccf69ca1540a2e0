"""A real SQLite audit store's disk, made to refuse writes as a full or read-only one does.

In process (``Disk``): every connection the store's engine hands out is told ``PRAGMA
query_only`` as it is checked out, so SQLite itself answers "attempt to write a readonly
database"; setting ``full`` back to False is the disk freed. For the suites of the reconcile
step with a failing store (``tests/runtime/test_audit_failure.py``,
``tests/runtime/test_audit_read_back.py``).

For a process (``small_disk``, ``fill``): a 4 MiB tmpfs, and a file of zeros that takes every
byte left on it (``tests/test_cli_reclaim_disk_full.py``, ``tests/test_kill9_audit_disk_full.py``).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
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


@contextlib.contextmanager
def small_disk(where: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at ``where`` until the block ends (the suite runs as root, as CI does)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(disk: Path) -> Path:
    """A file of zeros that takes every byte left on ``disk``, as a full volume is."""
    filler = disk / "filler"
    done = subprocess.run(
        ["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], check=False, capture_output=True
    )
    assert b"No space left on device" in done.stderr, done.stderr
    return filler
