"""Failure episodes: a pool's strategy or planner that fails, audited once when it starts and
once when it ends, however many ticks it lasts.

Where it sits: ``runtime.step`` updates them after each plan (``after``) and puts the records
due into the tick's batch (``due``, ``record``); once the store has the batch they are marked
(``announced``). A follower keeps them in its memory until it leads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import PoolName
from rebalancer.core.tick import Decision, Stage
from rebalancer.runtime.effects import Noted, Rules, Say
from rebalancer.runtime.memory import Announcement, Episode, Memory


def after(
    memory: Memory, decision: Decision, rules: Rules, now: datetime
) -> tuple[Memory, Noted, list[Say]]:
    """Each pool's strategy and planner episodes after this tick's plan. An episode is one
    failure that persists: it starts when a call fails after working (or at the first call),
    and a different kind or exception type starts a new one. A follower remembers them until
    it leads, so none goes unrecorded and none is recorded per tick."""
    episodes = dict(memory.episodes)
    ended = list(memory.ended)
    says: list[Say] = []
    strategy_failures: list[tuple[str, str, str]] = []
    planner_failures: list[str] = []

    def fine(key: tuple[PoolName, Stage]) -> None:
        episode = episodes.pop(key, None)
        if episode is not None and episode.announced:
            ended.append((*key, episode))

    for pool in rules.pools:
        for stage in Stage:
            key = (pool.name, stage)
            failure = decision.failures.get(key)
            if failure is None:
                fine(key)
                continue
            current = episodes.get(key)
            new = current is None or (current.failure.kind, current.failure.error) != (
                failure.kind,
                failure.error,
            )
            if new:
                fine(key)
                episodes[key] = Episode(failure, now)
            if stage is Stage.STRATEGY:
                strategy_failures.append((pool.name, pool.strategy_name, failure.kind))
                if new:
                    said = f"pool {pool.name}: strategy {pool.strategy_name} failed: {failure}"
                    says.append(Say(logging.ERROR, said))
                else:
                    said = f"pool {pool.name}: strategy still failing: {failure.message}"
                    says.append(Say(logging.WARNING, said))
            else:
                planner_failures.append(pool.name)
                if new:
                    says.append(
                        Say(logging.ERROR, f"pool {pool.name}: the planner failed: {failure}")
                    )
    memory = replace(memory, episodes=episodes, ended=tuple(ended))
    noted = Noted(
        strategy_failures=tuple(strategy_failures), planner_failures=tuple(planner_failures)
    )
    return memory, noted, says


def due(memory: Memory) -> list[Announcement]:
    """The episodes whose record is due: those ended, then those started and not audited."""
    started = [(p, s, e, False) for (p, s), e in memory.episodes.items() if not e.announced]
    return [*((p, s, e, True) for p, s, e in memory.ended), *started]


def announced(memory: Memory, done: Sequence[Announcement]) -> Memory:
    """The episodes of ``done`` are on record: the started ones say so, the ended ones go."""
    started = {(p, s) for p, s, _, ended in done if not ended}
    episodes = {
        key: replace(e, announced=True) if key in started else e
        for key, e in memory.episodes.items()
    }
    gone = {id(e) for _, _, e, ended in done if ended}
    ended = tuple(item for item in memory.ended if id(item[2]) not in gone)
    return replace(memory, episodes=episodes, ended=ended)


def record(
    ctx: Context,
    new_id: audit.NewId,
    now: datetime,
    pool: PoolName,
    stage: Stage,
    episode: Episode,
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
