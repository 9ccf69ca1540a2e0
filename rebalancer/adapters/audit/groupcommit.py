"""Group commit: appends that arrive while one is being committed share the next transaction.

Where it sits: inside ``sql.SqlAuditStore.append``, between the callers (the runtime's ticks and
outcomes, a wave's steps ending together) and the transaction that makes their records durable.
It exists for the cost of a commit: see ``GroupCommit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from rebalancer.core.audit import AuditRecord


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
