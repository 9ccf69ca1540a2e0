"""The decide step: each pool's strategy answers its ``PoolView`` in a thread of its own with a
time limit, then ``core.tick.plan_tick`` plans every pool from the answers; and the failure
episodes of strategies and the planner, each audited once when it starts and once when it ends.

Where it sits: ``runtime.reconcile.Reconciler.decide`` after observe, before audit. A strategy
is plain code that may raise, loop or block: one that fails, answers garbage or overruns is
replaced, for that pool and tick only, by the safety-only proposal, so one pool's strategy never
stops another pool, nor its own pool's safety rules (docs/design/fault-isolation.md). Kept apart
from the Reconciler because the thread, the time limit and the episodes are one concern.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.tick import (
    Decision,
    Failure,
    FailureKind,
    PoolControls,
    Stage,
    Unchecked,
    lent_count,
    plan_tick,
)
from rebalancer.runtime.report import Tally
from rebalancer.runtime.seams import PoolConfig

log = logging.getLogger(__name__)


class Decider:
    """Each pool's strategy call, the plan of the tick, and the failure episodes on the way."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        controls: Mapping[PoolName, PoolControls],
        keys: Keys,
        tally: Tally,
        timeout: timedelta,
    ) -> None:
        self.pools, self.controls, self.keys = tuple(pools), controls, keys
        self.tally, self.timeout = tally, timeout
        self.episodes = _Episodes()
        self.running: dict[PoolName, asyncio.Future[object]] = {}  # strategy calls in threads

    async def decide(self, snapshot: model.Snapshot) -> Decision:
        """Each pool's strategy answers, then ``core.tick.plan_tick`` plans every pool from the
        answers (a failed or invalid answer, or a failed planner, makes that pool's plan the
        safety-only one); each failure episode is logged and counted here."""
        answers: dict[PoolName, Unchecked] = {}
        for pool in self.pools:
            seen = snapshot.pools[pool.name]
            lent = lent_count(seen, self.keys, pool.lend_spec.add_taints)
            view = pool.policy.view(pool.name, snapshot.now, seen, lent)
            answers[pool.name] = await self._propose(pool, view)
        decision = plan_tick(snapshot, answers, self.controls, self.keys)
        for pool in self.pools:
            for stage in Stage:
                failure = decision.failures.get((pool.name, stage))
                if failure is None:
                    self.episodes.fine(pool.name, stage)
                else:
                    self._failed(pool, stage, failure, snapshot.now)
        return decision

    def failing(self) -> set[PoolName]:
        """The pools planned with the safety-only proposal: a failure episode is going on."""
        return self.episodes.failing()

    def episode_records(
        self, context: Callable[[PoolConfig], Context], new_id: audit.NewId, now: datetime
    ) -> tuple[list[AuditRecord], list[Announcement]]:
        """The records of the episodes that started or ended and are not audited yet, and the
        episodes themselves, to mark ``announced`` once the records are committed."""
        by_name = {p.name: p for p in self.pools}
        episodes = self.episodes.to_announce()
        records = [
            _episode_record(context(by_name[n]), new_id, now, n, stage, e, ended)
            for n, stage, e, ended in episodes
        ]
        return records, episodes

    def announced(self, episodes: Sequence[Announcement]) -> None:
        self.episodes.announced(episodes)

    def _failed(self, pool: PoolConfig, stage: Stage, failure: Failure, now: datetime) -> None:
        new = self.episodes.failed(pool.name, stage, failure, now)
        if stage is Stage.STRATEGY:
            self.tally.strategy_failures.append((pool.name, pool.strategy_name, failure.kind))
            if new:
                log.error("pool %s: strategy %s failed: %s", pool.name, pool.strategy_name, failure)
            else:
                log.warning("pool %s: strategy still failing: %s", pool.name, failure.message)
        else:
            self.tally.planner_failures.append(pool.name)
            if new:
                log.error("pool %s: the planner failed: %s", pool.name, failure)

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


# ---------------------------------------------------------------------------------------------
# Failure episodes: what failed, audited once when it starts and once when it ends


@dataclass
class _Episode:
    failure: Failure
    since: datetime
    announced: bool = False


Announcement = tuple[PoolName, Stage, _Episode, bool]  # pool, stage, episode, ended


class _Episodes:
    """Per pool and stage (strategy, planner), the failure going on, if any.

    An episode is one failure that persists: it starts when a call fails after working (or at
    the first call), and a different kind or exception type starts a new one. Its start and its
    end (``recovered``) are each audited once, by the leader; a follower remembers them until
    it leads, so no episode goes unrecorded and none is recorded per tick."""

    def __init__(self) -> None:
        self._open: dict[tuple[PoolName, Stage], _Episode] = {}
        self._ended: list[tuple[PoolName, Stage, _Episode]] = []

    def failed(self, pool: PoolName, stage: Stage, failure: Failure, now: datetime) -> bool:
        """Record a failure; True when it starts a new episode."""
        current = self._open.get((pool, stage))
        if current is not None and (current.failure.kind, current.failure.error) == (
            failure.kind,
            failure.error,
        ):
            return False
        if current is not None:
            self.fine(pool, stage)
        self._open[(pool, stage)] = _Episode(failure, now)
        return True

    def fine(self, pool: PoolName, stage: Stage) -> None:
        episode = self._open.pop((pool, stage), None)
        if episode is not None and episode.announced:
            self._ended.append((pool, stage, episode))

    def failing(self) -> set[PoolName]:
        return {pool for pool, _ in self._open}

    def to_announce(self) -> list[Announcement]:
        started = [(p, s, e, False) for (p, s), e in self._open.items() if not e.announced]
        return [*((p, s, e, True) for p, s, e in self._ended), *started]

    def announced(self, done: Sequence[Announcement]) -> None:
        for _, _, episode, _ in done:
            episode.announced = True
        ended_ids = {id(e) for _, _, e, ended in done if ended}
        self._ended = [item for item in self._ended if id(item[2]) not in ended_ids]


def _episode_record(
    ctx: Context,
    new_id: audit.NewId,
    now: datetime,
    pool: PoolName,
    stage: Stage,
    episode: _Episode,
    ended: bool,
) -> AuditRecord:
    failure = episode.failure
    detail = {
        "stage": stage,
        "kind": failure.kind,
        "error": failure.error or None,
        "failure": failure.message,
        "since": nodestate.format_time(episode.since),
    }
    if ended:
        reason = model.Reason.RECOVERED
        message = f"the {stage} works again; the pool is planned as usual"
    else:
        reason = (
            model.Reason.STRATEGY_FAILED if stage is Stage.STRATEGY else model.Reason.PLANNER_FAILED
        )
        message = (
            f"the {stage} failed ({failure}); the pool is planned with the safety-only "
            "proposal: no new loans, safety reclaims still happen"
        )
    return audit.episode_record(ctx, new_id, now, str(pool), reason, message, detail)


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
