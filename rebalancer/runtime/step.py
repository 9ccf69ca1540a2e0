"""One tick as a pure step: the memory and what the tick saw in, the next memory and the tick's
effects out, in the order they are carried out. No ``async``, no clock read, no I/O: the time
is the snapshot's, ids come from the function given, and leadership is a value.

Where it sits: ``runtime.reconcile.Reconciler.tick`` observes (``runtime.observing``), asks
each pool's strategy (``runtime.deciding``), then calls ``step``; ``runtime.shell`` carries
the effects out and returns what they came to, and ``runtime.flight.settle`` folds that into
the memory the next tick starts from. An import-linter contract keeps this module free of I/O.

What is decided here, once (docs/design/runtime.md): the plan (``core.tick.plan_tick``); the
failure episodes of strategies and planner, each audited when it starts and ends; the minute's
cost against each error budget; whether the tick writes (it leads, and has started up for this
term); the tick's records, intents first, committed before any write; which steps are carried
out if the store takes them (all of them) and if it fails (only the reclaims that keep
inference, each kept on its node first; none in a dry run, or with nowhere to keep them); and
which nodes in flight are driven on: a lend left half-done rolled back, a drain passed on, a
drain whose node vanished followed under its UID, a replaced lent node's loan ended, and the
borrowed pods an earlier node of a name left removed. The gauges the telemetry shows come out
of it as values (``Noted``); no phase writes a metric.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import Action, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.tick import Decision, plan_tick
from rebalancer.runtime import budgets, episodes, flight
from rebalancer.runtime.effects import Branch, Carry, Effects, Noted, Rules, Say, Seen, Wave
from rebalancer.runtime.memory import Announcement, Memory
from rebalancer.runtime.seams import PoolConfig


def step(memory: Memory, seen: Seen, rules: Rules, new_id: audit.NewId) -> tuple[Memory, Effects]:
    """The tick's plan and effects, and the memory to carry out the effects with."""
    snapshot, now = seen.snapshot, seen.snapshot.now
    decision = plan_tick(snapshot, seen.answers, rules.controls, rules.keys)
    memory, failures, says = episodes.after(memory, decision, rules, now)
    memory = replace(memory, last=snapshot, last_decided=(snapshot, decision))
    verb = "dry run, would plan" if rules.dry_run else "plan"
    says = [
        *(Say(logging.INFO, f"{verb}: {p.summary}") for p in decision.plan.pools.values()),
        *says,
    ]
    noted = _health(failures, decision.plan, memory, seen, rules)
    if not seen.leading:
        steps = len(decision.plan.steps)
        says.append(Say(logging.INFO, f"not leading: {steps} step(s) planned, none carried out"))
        return memory, Effects(decision, tuple(says), noted)
    if memory.started != seen.term_key and not memory.start_unaudited:
        says.append(
            Say(logging.INFO, "leading since this tick began: start-up runs first next tick")
        )
        return memory, Effects(decision, tuple(says), noted)
    return _leading(memory, seen, rules, new_id, decision, noted, says)


def _leading(
    memory: Memory,
    seen: Seen,
    rules: Rules,
    new_id: audit.NewId,
    decision: Decision,
    noted: Noted,
    says: list[Say],
) -> tuple[Memory, Effects]:
    """The leader's tick: the minute's cost counted, the records built, and what follows them
    whether the store takes them or not."""
    snapshot, plan = seen.snapshot, decision.plan

    def context(pool: PoolConfig | None) -> Context:
        return seen.context(pool, rules.dry_run)

    # The strategy and the planner saw the budget as of the last tick (the snapshot's): this
    # minute counts from the next.
    costs, cost_records, minutes = budgets.count(memory.costs, snapshot, rules, context, new_id)
    memory = replace(memory, costs=costs)
    noted = replace(
        noted,
        decided=(plan,),
        budgets=budgets.gauges(memory, rules.pools, snapshot.now),
        borrowing_minutes=minutes,
    )
    acting = plan
    if rules.dry_run:
        acting, kept = _new_steps(plan, memory.would)
        if kept:
            said = f"dry run: {kept} step(s) still planned as before, not audited again"
            says.append(Say(logging.INFO, said))
    announcements = episodes.due(memory)
    episode_records = [
        episodes.record(context(rules.pool(p)), new_id, plan.now, p, stage, e, ended)
        for p, stage, e, ended in announcements
    ]
    built = tick_records(snapshot, decision.proposals, acting, rules, context, new_id)
    batch = audit.Tick(records=(*episode_records, *built.records), intents=built.intents)
    taken = _taken(memory, snapshot, rules, plan, acting, batch, announcements, new_id, context)
    refused = _refused(memory, snapshot, rules, acting, batch, new_id, context)
    effects = Effects(
        decision,
        tuple(says),
        noted,
        cost_records,
        catch_up=None if rules.dry_run else _views(snapshot),
        batch=batch,
        taken=taken,
        refused=refused,
    )
    return memory, effects


def _taken(
    memory: Memory,
    snapshot: model.Snapshot,
    rules: Rules,
    plan: model.Plan,
    acting: model.Plan,
    batch: audit.Tick,
    announcements: Sequence[Announcement],
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
) -> Branch:
    """The store took the tick's records: the episodes are announced, every step is carried
    out (reclaims first), and the nodes in flight are driven on."""
    memory = episodes.announced(memory, announcements)
    if rules.dry_run:
        memory = replace(memory, would=frozenset((s.pool, s.node, s.action) for s in plan.steps))
    carries = [Carry(s, batch.intent_for(s)) for s in acting.steps]
    memory, says, drives = flight.drives(memory, snapshot, rules, carries, new_id, context)
    return Branch(memory, tuple(says), acting, (*_waves(carries, rules), *drives))


def _refused(
    memory: Memory,
    snapshot: model.Snapshot,
    rules: Rules,
    acting: model.Plan,
    batch: audit.Tick,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
) -> Branch:
    """The store failed the tick's records: nothing is lent; each reclaim that keeps inference
    is carried out once its intent is kept on its node, and the nodes in flight are driven on.
    In a dry run, or with nowhere to keep a record, nothing is done."""
    if rules.dry_run or not rules.can_keep:
        return Branch(memory, error=True)
    carries = [
        Carry(s, batch.intent_for(s), keep_first=True) for s in acting.steps if keeps_inference(s)
    ]
    memory, says, drives = flight.drives(memory, snapshot, rules, carries, new_id, context)
    return Branch(memory, tuple(says), None, (*_waves(carries, rules), *drives), error=True)


def _views(snapshot: model.Snapshot) -> tuple[NodeView, ...]:
    """Every node of the snapshot: whose records kept on it go to the store first."""
    return tuple(view for pool in snapshot.pools.values() for view in pool.nodes)


def keeps_inference(step: model.Step) -> bool:
    """Whether a step is carried out while the audit store fails: a reclaim for anything but
    the strategy's own plan (demand or queue above what serves, metrics lost, an alert, the
    window closed, a gang preempted, an operator's reclaim), the same steps the planner makes
    urgent. Never a lend; not the strategy's own give-backs (they can wait for the store)."""
    return step.action is Action.RECLAIM and step.urgent


def _waves(carries: Sequence[Carry], rules: Rules) -> tuple[Wave, ...]:
    """Reclaims first, ``reclaim_concurrency`` at a time, then lends and withdrawn notices,
    fewer at once (neither is ever urgent: a wave of them should not crowd the API server)."""
    reclaims = tuple(c for c in carries if c.step.action is Action.RECLAIM)
    lends = tuple(c for c in carries if c.step.action is not Action.RECLAIM)
    return Wave(reclaims, rules.reclaim_concurrency), Wave(lends, rules.lend_concurrency)


# ---------------------------------------------------------------------------------------------
# How the pools stand, for the gauges


def _health(noted: Noted, plan: model.Plan, memory: Memory, seen: Seen, rules: Rules) -> Noted:
    """``noted`` with how the pools stand: who leads, what is lent and overdue, and whether a
    pool is not planned as usual."""
    snapshot, now = seen.snapshot, seen.snapshot.now
    pools = snapshot.pools.items()
    return replace(
        noted,
        leader=(seen.identity, seen.leading),
        lent={
            str(p.name): _lent(snapshot.pools[p.name], rules.keys, p.lent_taints)
            for p in rules.pools
            if p.name in snapshot.pools
        },
        overdue={
            str(p.name): _overdue(snapshot.pools[p.name], rules.keys, p.lent_taints, now)
            for p in rules.pools
            if p.name in snapshot.pools
        },
        safety_only={str(p.name): p.name in memory.failing() for p in rules.pools},
        demand_held={str(n): p.held is not None for n, p in pools},
        frozen_under_pressure={str(n): _frozen_under_pressure(p) for n, p in plan.pools.items()},
    )


def _frozen_under_pressure(plan: model.PoolPlan) -> bool:
    """A freeze (or an operator's node pause) refused a reclaim that would keep inference
    served: lent nodes are held while demand needs them."""
    held = (model.Reason.FROZEN, model.Reason.NODE_PAUSED)
    return any(r.reason in held and r.intent.origin is model.Origin.SAFETY for r in plan.rejections)


def _lent(pool: model.PoolSnapshot, keys: Keys, lent: tuple[model.Taint, ...]) -> int:
    """``core.tick.lent_count``, from the pool's ``flight.tally`` (each node's facts read
    once per node value, the count once per tick)."""
    return flight.tally(pool.nodes, keys, lent).lent


def _overdue(
    pool: model.PoolSnapshot, keys: Keys, lent: tuple[model.Taint, ...], now: datetime
) -> int:
    """The reclaims still open after their deadline (the drain should have been forced by
    then)."""
    deadlines = flight.tally(pool.nodes, keys, lent).deadlines
    return sum(1 for deadline in deadlines if deadline is not None and deadline < now)


# ---------------------------------------------------------------------------------------------
# The tick's records


def tick_records(
    snapshot: model.Snapshot,
    proposals: Mapping[PoolName, model.Proposal],
    plan: model.Plan,
    rules: Rules,
    context: Callable[[PoolConfig], Context],
    new_id: audit.NewId,
) -> audit.Tick:
    """The records of ``plan``, each pool's under its own context (its strategy)."""
    records: list[AuditRecord] = []
    intents: dict[tuple[str, str, str], AuditRecord] = {}
    for pool in (p for p in rules.pools if p.name in plan.pools):
        one = model.Plan(now=plan.now, pools={pool.name: plan.pools[pool.name]})
        built = audit.build_tick(
            one,
            snapshot,
            context(pool),
            new_id,
            proposals,
            {pool.name: pool.policy},
            rules.keys,
        )
        records.extend(built.records)
        intents.update(built.intents)
    return audit.Tick(records=tuple(records), intents=intents)


def _new_steps(
    plan: model.Plan, would: frozenset[tuple[PoolName, NodeName, Action]]
) -> tuple[model.Plan, int]:
    """A dry run's plan to audit and carry out: only the steps the last tick did not plan.
    Nothing it "did" changed the cluster, so the rest would be the same records again every
    tick; a step that leaves the plan and comes back is audited again. With how many were
    left out."""
    pools = {
        name: replace(
            pool, steps=tuple(s for s in pool.steps if (s.pool, s.node, s.action) not in would)
        )
        for name, pool in plan.pools.items()
    }
    kept = len(plan.steps) - sum(len(p.steps) for p in pools.values())
    return replace(plan, pools=pools), kept
