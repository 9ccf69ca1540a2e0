"""What the memory makes of an observation: the tick's snapshot, each pool's demand through its
belief (unknown since the last good sample, an implausible fall held), its error budget as the
memory counts it, and each thing worth a line said once (a node two pools select, an orphan
taken back, a clock that cannot be trusted, an object that cannot be read).

Where it sits: ``runtime.reconcile.Reconciler.tick`` observes through the seams' readers
(``runtime.observing``, which remember nothing but caches of what they read), then calls
``perceive``; the snapshot goes to the strategies and then to ``runtime.step``. Pure, like the
step: the memory and the observation in, the next memory, the snapshot and the lines out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rebalancer.core import demand, model
from rebalancer.core.model import PoolName
from rebalancer.runtime import budgets
from rebalancer.runtime.effects import Rules, Say
from rebalancer.runtime.memory import Memory
from rebalancer.runtime.seams import Observation, PoolConfig


@dataclass(frozen=True)
class Perceived:
    snapshot: model.Snapshot
    says: tuple[Say, ...]
    unreadable: dict[str, int]  # objects left out of every view, by kind


def perceive(memory: Memory, seen: Observation, rules: Rules) -> tuple[Memory, Perceived]:
    """The snapshot the tick plans with, and the memory after it."""
    now, says = seen.snapshot.now, []
    beliefs = dict(memory.beliefs)
    pools: dict[PoolName, model.PoolSnapshot] = {}
    for pool in rules.pools:
        raw = seen.snapshot.pools[pool.name]
        metrics = seen.metrics.get(pool.name)
        before = beliefs.get(pool.name) or demand.start(now)
        sample = metrics.demand if metrics is not None else None
        beliefs[pool.name], reading = demand.judge(before, sample, now, pool.policy.drop_rule)
        says += _held(pool, before, reading)
        pools[pool.name] = replace(
            raw,
            demand=reading.demand,
            demand_known=reading.known,
            unknown_since=reading.unknown_since,
            held=reading.held,
            budget=budgets.budget(memory, pool, now),
        )
    memory, said = _said_once(replace(memory, beliefs=beliefs), seen, rules)
    snapshot = replace(seen.snapshot, pools=pools)
    return memory, Perceived(snapshot, (*said, *says), _counts(seen.unreadable))


def _held(pool: PoolConfig, before: demand.Belief, reading: demand.Reading) -> list[Say]:
    """A fall held (or no longer held) is said when it begins (or ends)."""
    if reading.held is not None and before.held is None:
        held, unit = reading.held, pool.policy.unit.symbol
        return [
            Say(
                logging.WARNING,
                f"pool {pool.name}: demand fell from {held.level.value:.4g} to "
                f"{held.seen.value:.4g} {unit} faster than traffic falls; held at "
                f"{held.level.value:.4g} for up to {pool.policy.drop_hold}",
            )
        ]
    if before.held is not None and reading.held is None:
        return [Say(logging.INFO, f"pool {pool.name}: demand fall no longer held")]
    return []


def _said_once(memory: Memory, seen: Observation, rules: Rules) -> tuple[Memory, list[Say]]:
    """The lines each said once: per pair of pools selecting a node, per orphan, per change of
    a pool's clock problems, per object that cannot be read (and once when it can again)."""
    says: list[Say] = []
    overlaps, orphans = set(memory.said_overlaps), set(memory.said_orphans)
    problems = dict(memory.clock_problems)
    for pool in rules.pools:
        raw = seen.snapshot.pools[pool.name]
        for node, others in raw.overlaps.items():
            for other in others:
                if (node, other) not in overlaps:
                    overlaps.add((node, other))
                    said = f"node {node} is selected by pools {pool.name} and {other}; only "
                    says.append(Say(logging.WARNING, f"{said}{pool.name} drives it"))
        for node in sorted(raw.orphans - orphans):
            orphans.add(node)
            says.append(
                Say(
                    logging.WARNING,
                    f"node {node} carries the controller's keys but no pool selects it: pool "
                    f"{pool.name} takes it back",
                )
            )
        measured = seen.clocks.get(pool.name)
        now_problems = measured.problems() if measured is not None else ()
        if now_problems != problems.get(pool.name, ()):
            if now_problems:
                said = f"pool {pool.name}: no lending: {'; '.join(now_problems)}"
                says.append(Say(logging.WARNING, said))
            else:
                said = f"pool {pool.name}: the clocks can be trusted again"
                says.append(Say(logging.INFO, said))
        problems[pool.name] = now_problems
    for key, why in seen.unreadable.items():
        if memory.said_unreadable.get(key) != why:
            says.append(Say(logging.ERROR, f"{key} cannot be read and is left alone: {why}"))
    for key in sorted(memory.said_unreadable.keys() - seen.unreadable.keys()):
        says.append(Say(logging.INFO, f"{key} can be read again"))
    memory = replace(
        memory,
        said_overlaps=frozenset(overlaps),
        said_orphans=frozenset(orphans),
        clock_problems=problems,
        said_unreadable=dict(seen.unreadable),
    )
    return memory, says


def _counts(unreadable: Mapping[str, str]) -> dict[str, int]:
    counts = {"node": 0, "pod": 0}
    for key in unreadable:
        kind = key.split("/", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    return counts
