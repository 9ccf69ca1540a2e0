"""The strategies' answers: each pool's strategy answers its ``PoolView`` in a thread of its own
with a time limit; ``runtime.step`` plans every pool from the answers (``core.tick.plan_tick``).

Where it sits: ``runtime.reconcile.Reconciler.tick`` after observe, before the step. A strategy
is plain code that may raise, loop or block: one that fails, answers garbage or overruns is
replaced, for that pool and tick only, by the safety-only proposal, so one pool's strategy never
stops another pool, nor its own pool's safety rules (docs/design/fault-isolation.md). What it
keeps is not memory but the calls still running in their threads: a call that overran is not
started again while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from rebalancer.core import model
from rebalancer.core.model import PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.tick import Failure, FailureKind, Unchecked
from rebalancer.runtime import flight
from rebalancer.runtime.seams import PoolConfig

log = logging.getLogger(__name__)


class Strategies:
    """Each pool's strategy call, in a thread of its own with a time limit."""

    def __init__(self, pools: Sequence[PoolConfig], keys: Keys, timeout: timedelta) -> None:
        self.pools, self.keys, self.timeout = tuple(pools), keys, timeout
        self.running: dict[PoolName, asyncio.Future[object]] = {}  # strategy calls in threads

    async def answers(self, snapshot: model.Snapshot) -> dict[PoolName, Unchecked]:
        """Each pool's strategy's answer to the pool as ``snapshot`` shows it, unchecked
        (``core.tick`` checks it), or the failure that stands for it."""
        answers: dict[PoolName, Unchecked] = {}
        for pool in self.pools:
            seen = snapshot.pools[pool.name]
            # ``core.tick.kept_count``, from the tally the tick's step reads too
            lent = flight.tally(seen.nodes, self.keys, pool.lend_spec.add_taints).kept
            view = pool.policy.view(pool.name, snapshot.now, seen, lent)
            answers[pool.name] = await self._propose(pool, view)
        return answers

    async def _propose(self, pool: PoolConfig, view: model.PoolView) -> Unchecked:
        """The strategy's answer, run in a thread of its own (a strategy is plain code that
        may loop or block), within ``timeout``; ``core.tick`` checks it."""
        running = self.running.get(pool.name)
        limit = self.timeout
        timeout = FailureKind.TIMEOUT
        if running is not None and not running.done():
            return Failure(timeout, f"a call is still running, past {limit}")
        call = _in_thread(pool.strategy.decide, view, f"strategy-{pool.name}")
        self.running[pool.name] = call
        try:
            return await asyncio.wait_for(asyncio.shield(call), limit.total_seconds())
        except TimeoutError:
            return Failure(timeout, f"no answer within {limit}")
        except Exception as exc:
            log.debug("pool %s: the strategy raised", pool.name, exc_info=True)
            return Failure.raised(exc)


def _in_thread(fn: Callable[[Any], object], arg: object, name: str) -> asyncio.Future[object]:
    """``fn(arg)`` in a daemon thread: a call that never returns neither blocks the loop nor
    keeps the process from exiting (a pool executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            result, error = fn(arg), None
        except Exception as exc:
            result, error = None, exc
        # The loop may be gone (shutdown): then nobody waits for the answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future
