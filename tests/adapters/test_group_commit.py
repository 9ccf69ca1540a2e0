"""Audit appends that arrive while one is being committed share the next transaction; each
caller still returns only once its own records are committed, and fails only for its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rebalancer.adapters.audit import AuditQuery, GroupCommit, SqlAuditStore, every_record
from rebalancer.core.audit import AuditRecord
from tests.support.factories import audit_record

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@dataclass
class Database:
    """A commit that waits for a permit (``go``) and refuses records whose id starts "bad"."""

    transactions: list[list[str]] = field(default_factory=list)
    permits: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))

    def go(self, transactions: int = 100) -> None:
        for _ in range(transactions):
            self.permits.release()

    async def commit(self, batch: Sequence[AuditRecord]) -> None:
        await self.permits.acquire()
        ids = [r.id for r in batch]
        if any(i.startswith("bad") for i in ids):
            raise ValueError(f"refused {ids}")
        self.transactions.append(ids)


def rec(ident: str) -> AuditRecord:
    return audit_record(ident, NOW)


async def test_appends_waiting_on_a_commit_go_together_in_the_next_one() -> None:
    db = Database()
    group = GroupCommit(db.commit)
    first = asyncio.create_task(group.append([rec("a")]))
    await asyncio.sleep(0)  # "a" is being committed
    rest = [asyncio.create_task(group.append([rec(i)])) for i in ("b", "c", "d")]
    await asyncio.sleep(0)
    assert not any(t.done() for t in (first, *rest))  # nobody returns before their commit
    db.go()
    await asyncio.gather(first, *rest)
    assert db.transactions == [["a"], ["b", "c", "d"]]


async def test_a_bad_record_fails_its_own_caller_and_the_others_are_committed() -> None:
    db = Database()
    group = GroupCommit(db.commit)
    first = asyncio.create_task(group.append([rec("a")]))
    await asyncio.sleep(0)
    good = asyncio.create_task(group.append([rec("b")]))
    bad = asyncio.create_task(group.append([rec("bad-c")]))
    db.go()
    await asyncio.gather(first, good)
    with pytest.raises(ValueError, match="bad-c"):
        await bad
    assert db.transactions == [["a"], ["b"]]


async def test_a_cancelled_caller_does_not_cut_short_the_transaction_carrying_others() -> None:
    db = Database()
    group = GroupCommit(db.commit)
    first = asyncio.create_task(group.append([rec("a")]))
    await asyncio.sleep(0)
    second = asyncio.create_task(group.append([rec("b")]))
    third = asyncio.create_task(group.append([rec("c")]))
    await asyncio.sleep(0)  # both wait behind the transaction of "a"
    db.go(1)
    await first
    for _ in range(3):
        await asyncio.sleep(0)  # the second caller starts the transaction of "b" and "c"...
    second.cancel()  # ...and is cancelled while it runs
    with pytest.raises(asyncio.CancelledError):
        await second
    db.go()
    await third  # returns only once "c" is committed
    assert db.transactions == [["a"], ["b", "c"]]


async def test_a_caller_cancelled_before_its_records_were_taken_is_never_written() -> None:
    db = Database()
    group = GroupCommit(db.commit)
    first = asyncio.create_task(group.append([rec("a")]))
    await asyncio.sleep(0)
    gone = asyncio.create_task(group.append([rec("b")]))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    late = asyncio.create_task(group.append([rec("c")]))
    db.go()
    await asyncio.gather(first, late)
    assert db.transactions == [["a"], ["c"]]


async def test_a_store_that_fails_fails_every_caller_of_the_transaction_at_once() -> None:
    attempts: list[list[str]] = []

    async def down(batch: Sequence[AuditRecord]) -> None:
        attempts.append([r.id for r in batch])
        await asyncio.sleep(0)
        raise OSError("database is locked")

    group = GroupCommit(down)
    calls = [asyncio.create_task(group.append([rec(i)])) for i in ("a", "b", "c")]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(r) for r in results] == [OSError, OSError, OSError]
    assert attempts == [["a"], ["b", "c"]]  # each once: nobody waits behind retries of others


async def test_a_wave_of_appends_to_sqlite_stores_every_record(tmp_path: Path) -> None:
    store = await SqlAuditStore.open(f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}")
    try:
        ids = [f"r{i:03d}" for i in range(40)]
        await asyncio.gather(*(store.append([rec(i)]) for i in ids))
        stored = await every_record(store, AuditQuery(limit=1000))
    finally:
        await store.close()
    assert sorted(r.id for r in stored) == ids
