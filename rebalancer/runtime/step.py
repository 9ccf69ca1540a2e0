"""One tick as a pure step: the memory and what the tick saw in, the next memory and the tick's
effects out, in the order they are carried out. No ``async``, no clock read, no I/O: the time
is the snapshot's, ids come from the function given, and leadership is a value.

Where it sits: ``runtime.reconcile.Reconciler.tick`` observes (``runtime.observing``), asks
each pool's strategy (``runtime.deciding``), then calls ``step``; ``runtime.effects`` carries
the effects out and returns what they came to, and ``settle`` folds that into the memory the
next tick starts from. An import-linter contract keeps this module free of I/O.

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
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from rebalancer.core import audit, model, nodestate, recovery, victims
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.concurrency import LEND_CONCURRENCY, RECLAIM_CONCURRENCY
from rebalancer.core.model import Action, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.outcomes import ActionResult, Outcome, WriteOutcome
from rebalancer.core.tick import (
    Decision,
    PoolControls,
    Stage,
    Unchecked,
    lent_count,
    nodes_lending_costs,
    phase,
    plan_tick,
)
from rebalancer.runtime.memory import (
    Announcement,
    Drain,
    Episode,
    Loan,
    Memory,
    Removal,
)
from rebalancer.runtime.seams import PoolConfig

MINUTE = timedelta(minutes=1)
IN_FLIGHT = (Phase.LENDING, Phase.RECLAIMING)


# ---------------------------------------------------------------------------------------------
# What the step is given


@dataclass(frozen=True)
class Rules:
    """What the step runs by, the same every tick: the pools, the node keys, the switches."""

    pools: tuple[PoolConfig, ...]
    keys: Keys
    dry_run: bool = False
    # Whether a record can be kept on its node while the audit store fails (a ledger): without
    # one, nothing is carried out then. A dry run keeps nothing.
    can_keep: bool = True
    reclaim_concurrency: int = RECLAIM_CONCURRENCY
    lend_concurrency: int = LEND_CONCURRENCY

    def pool(self, name: PoolName) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)

    @property
    def controls(self) -> dict[PoolName, PoolControls]:
        return {p.name: PoolControls(p.policy, p.paused, p.frozen) for p in self.pools}


@dataclass(frozen=True)
class Seen:
    """What one tick saw: the snapshot, each pool's strategy answer, and who this replica is."""

    snapshot: model.Snapshot
    answers: Mapping[PoolName, Unchecked]
    identity: str
    term: int | None  # the leadership term; None when not leading
    leading: bool  # may write now
    term_key: object  # the stretch of leadership start-up runs once for

    def context(self, pool: PoolConfig | None, dry_run: bool) -> Context:
        return Context(
            controller=self.identity,
            term=self.term,
            strategy=pool.strategy_name if pool else "",
            params=dict(pool.strategy_params) if pool else {},
            dry_run=dry_run,
        )


# ---------------------------------------------------------------------------------------------
# What the step returns


@dataclass(frozen=True)
class Say:
    """A line for the log, in the order the step decided it."""

    level: int
    message: str
    error: BaseException | None = None  # its traceback is logged with it


@dataclass(frozen=True)
class Carry:
    """One step of the plan through its pool's actuator, under its committed intent; while
    the store fails (``keep_first``) only once the intent is kept on its node."""

    step: model.Step
    intent: AuditRecord
    keep_first: bool = False


@dataclass(frozen=True)
class Progress:
    """One pass over a node in flight (or over a drain whose node vanished, under its UID)."""

    pool: PoolName
    node: NodeName
    decision: str | None
    uid: str | None
    deadline: datetime | None
    said: tuple[str, str] | None  # what the drain's last record said
    vanished: bool = False


@dataclass(frozen=True)
class RollBack:
    """A lend left half-done, rolled back under an intent of its own, committed first."""

    pool: PoolName
    node: NodeName
    intent: AuditRecord


@dataclass(frozen=True)
class EndLoan:
    """The loan of a lent node that was deleted (perhaps created again under its name) ended
    under an intent of its own, committed first: a reclaim for the lent node's UID."""

    pool: PoolName
    view: NodeView
    intent: AuditRecord
    deadline: datetime


@dataclass(frozen=True)
class RemoveLeft:
    """One pass over the borrowed pods bound to a name before its node was created; the first
    under a new intent, committed first (``new``), each later one under the same."""

    pool: PoolName
    node: NodeName
    intent: AuditRecord
    deadline: datetime
    new: bool
    said: tuple[str, str] | None


Drive = Progress | RollBack | EndLoan | RemoveLeft


@dataclass(frozen=True)
class Wave:
    """Effects carried out together, ``limit`` at a time; the next wave waits for this one."""

    items: tuple[Carry | Drive, ...]
    limit: int


@dataclass(frozen=True)
class Branch:
    """What follows the tick's records, as the store takes them or not: the memory to settle
    the results into, and the effects in order."""

    memory: Memory
    says: tuple[Say, ...] = ()
    findings: model.Plan | None = None  # the findings' Events, recorded once the store has them
    waves: tuple[Wave, ...] = ()
    error: bool = False  # the tick's records were not taken


@dataclass(frozen=True)
class Noted:
    """The gauges and counts of one tick, as the step decided them (``runtime.telemetry``)."""

    leader: tuple[str, bool] | None = None  # (this replica's identity, whether it may write)
    lent: Mapping[str, int] | None = None  # nodes on loan, per pool
    overdue: Mapping[str, int] | None = None  # nodes whose reclaim is past its deadline
    safety_only: Mapping[str, bool] | None = None  # planned on safety rules alone
    demand_held: Mapping[str, bool] | None = None  # demand held over a failed read
    frozen_under_pressure: Mapping[str, bool] | None = None
    budgets: Mapping[str, model.ErrorBudget] | None = None
    decided: model.Plan | None = None  # the plan the leader carried out
    strategy_failures: tuple[tuple[str, str, str], ...] = ()  # pool, strategy, kind
    planner_failures: tuple[str, ...] = ()  # pools
    borrowing_minutes: tuple[str, ...] = ()  # a pool per minute lending cost


@dataclass(frozen=True)
class Effects:
    """Everything one tick does, in order: say the lines; write the cost records (a failure is
    logged, the tick goes on); bring the records kept on nodes to the store (``catch_up``);
    commit ``batch``; then ``taken`` if the store took it, else ``refused``. No batch: the
    tick writes nothing (a follower, or leading since the tick began)."""

    decision: Decision
    says: tuple[Say, ...] = ()
    noted: Noted = field(default_factory=Noted)
    costs: tuple[AuditRecord, ...] = ()
    catch_up: bool = False
    batch: audit.Tick | None = None
    taken: Branch | None = None
    refused: Branch | None = None


# ---------------------------------------------------------------------------------------------
# The step


def step(memory: Memory, seen: Seen, rules: Rules, new_id: audit.NewId) -> tuple[Memory, Effects]:
    """The tick's plan and effects, and the memory to carry out the effects with."""
    snapshot, now = seen.snapshot, seen.snapshot.now
    decision = plan_tick(snapshot, seen.answers, rules.controls, rules.keys)
    memory, failures, says = _episodes(memory, decision, rules, now)
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
    costs, cost_records, minutes = count_costs(memory.costs, snapshot, rules, context, new_id)
    memory = replace(memory, costs=costs)
    noted = replace(
        noted,
        decided=plan,
        budgets=budgets(memory, rules.pools, snapshot.now),
        borrowing_minutes=minutes,
    )
    acting = plan
    if rules.dry_run:
        acting, kept = _new_steps(plan, memory.would)
        if kept:
            said = f"dry run: {kept} step(s) still planned as before, not audited again"
            says.append(Say(logging.INFO, said))
    announcements = _to_announce(memory)
    episode_records = [
        _episode_record(context(rules.pool(p)), new_id, plan.now, p, stage, e, ended)
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
        catch_up=not rules.dry_run,
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
    memory = _announced(memory, announcements)
    if rules.dry_run:
        memory = replace(memory, would=frozenset((s.pool, s.node, s.action) for s in plan.steps))
    carries = [Carry(s, batch.intent_for(s)) for s in acting.steps]
    memory, says, drives = drives_of(memory, snapshot, rules, carries, new_id, context)
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
    memory, says, drives = drives_of(memory, snapshot, rules, carries, new_id, context)
    return Branch(memory, tuple(says), None, (*_waves(carries, rules), *drives), error=True)


def keeps_inference(step: model.Step) -> bool:
    """Whether a step is carried out while the audit store fails: a reclaim for anything but
    the strategy's own plan (demand or queue above what serves, metrics lost, an alert, the
    window closed, a gang preempted, an operator's reclaim), the same steps the planner makes
    urgent. Never a lend; not the strategy's own give-backs (they can wait for the store)."""
    return step.action is Action.RECLAIM and step.urgent


def _waves(carries: Sequence[Carry], rules: Rules) -> tuple[Wave, ...]:
    """Reclaims first, ``reclaim_concurrency`` at a time, then lends, fewer at once (a lend
    is never urgent: a wave of them should not crowd the API server)."""
    reclaims = tuple(c for c in carries if c.step.action is Action.RECLAIM)
    lends = tuple(c for c in carries if c.step.action is Action.LEND)
    return Wave(reclaims, rules.reclaim_concurrency), Wave(lends, rules.lend_concurrency)


# ---------------------------------------------------------------------------------------------
# Failure episodes: what failed, audited once when it starts and once when it ends


def _episodes(
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


def _to_announce(memory: Memory) -> list[Announcement]:
    """The episodes whose record is due: those ended, then those started and not audited."""
    started = [(p, s, e, False) for (p, s), e in memory.episodes.items() if not e.announced]
    return [*((p, s, e, True) for p, s, e in memory.ended), *started]


def _announced(memory: Memory, done: Sequence[Announcement]) -> Memory:
    """The episodes of ``done`` are on record: the started ones say so, the ended ones go."""
    started = {(p, s) for p, s, _, ended in done if not ended}
    episodes = {
        key: replace(e, announced=True) if key in started else e
        for key, e in memory.episodes.items()
    }
    gone = {id(e) for _, _, e, ended in done if ended}
    ended = tuple(item for item in memory.ended if id(item[2]) not in gone)
    return replace(memory, episodes=episodes, ended=ended)


def _episode_record(
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


# ---------------------------------------------------------------------------------------------
# The error budgets' count


def budget(memory: Memory, pool: PoolConfig, now: datetime) -> model.ErrorBudget | None:
    """The pool's error budget at ``now``; None for a pool without one."""
    return pool.slo.budget(memory.costs.get(pool.name, ()), now) if pool.slo else None


def budgets(
    memory: Memory, pools: Sequence[PoolConfig], now: datetime
) -> dict[str, model.ErrorBudget]:
    """Each budget as it stands at ``now``, for the gauges."""
    return {
        str(p.name): p.slo.budget(memory.costs.get(p.name, ()), now)
        for p in pools
        if p.slo is not None
    }


def count_costs(
    costs: Mapping[PoolName, tuple[datetime, ...]],
    snapshot: model.Snapshot,
    rules: Rules,
    context: Callable[[PoolConfig], Context],
    new_id: audit.NewId,
) -> tuple[dict[PoolName, tuple[datetime, ...]], tuple[AuditRecord, ...], tuple[str, ...]]:
    """Count each minute in which a pool's requests queue beyond its limit while nodes are
    away on loan (``core.tick.nodes_lending_costs``): what lending cost, once per minute
    however many ticks see it, as a metric and a ``cost`` record. Only the leader counts, so
    replicas never count a minute twice, and a new leader takes up the count from the audit
    log. A record the store fails to take is logged and the minute still counts: the
    measurement is true. The minutes after, the records, and the pools that paid a minute."""
    minute = snapshot.now.replace(second=0, microsecond=0)
    out = dict(costs)
    records: list[AuditRecord] = []
    paid: list[str] = []
    for pool in rules.pools:
        seen = snapshot.pools.get(pool.name)
        spent = out.setdefault(pool.name, ())
        if seen is None or minute in spent:
            continue
        away = nodes_lending_costs(seen, pool.policy, rules.keys, snapshot.now)
        if not away:
            continue
        keep = pool.slo.window if pool.slo else MINUTE
        out[pool.name] = (*(m for m in spent if m > minute - keep), minute)
        paid.append(str(pool.name))
        left = pool.slo.budget(out[pool.name], minute) if pool.slo else None
        records.append(
            audit.cost_record(
                context(pool), new_id, minute, seen, str(pool.name), pool.policy, away, left
            )
        )
    return out, tuple(records), tuple(paid)


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
            str(p.name): lent_count(snapshot.pools[p.name], rules.keys, _lent(p))
            for p in rules.pools
            if p.name in snapshot.pools
        },
        overdue={
            str(name): sum(1 for v in pool.nodes if _overdue(v, rules.keys, now))
            for name, pool in pools
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


def _overdue(view: NodeView, keys: Keys, now: datetime) -> bool:
    """A reclaim still open after its deadline (the drain should have been forced by then)."""
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError) or state.phase is not Phase.RECLAIMING:
        return False
    return state.deadline is not None and state.deadline < now


def _lent(pool: PoolConfig) -> tuple[model.Taint, ...]:
    """The taints lending puts on the pool's nodes: what every reading of their phase takes."""
    return pool.lend_spec.add_taints


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


# ---------------------------------------------------------------------------------------------
# The nodes in flight


def drives_of(
    memory: Memory,
    snapshot: model.Snapshot,
    rules: Rules,
    carries: Sequence[Carry],
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
) -> tuple[Memory, list[Say], tuple[Wave, ...]]:
    """Every node in flight that gets no step this tick (``carries``) is driven on, a wave of
    drains together as the reclaims that began them; then the drains whose node vanished from
    the pools, under their UID; then the end of every loan whose node was replaced; then the
    removal of the borrowed pods an earlier node of a name left on the node there now. A dry
    run drives nothing: it says once which nodes a run that writes would drive on."""
    keys, now = rules.keys, snapshot.now
    acted = {c.step.node for c in carries}
    in_flight = [
        (pool, view)
        for pool in rules.pools
        for view in snapshot.pools[pool.name].nodes
        if view.name not in acted and phase(view, keys, _lent(pool)) in IN_FLIGHT
    ]
    if rules.dry_run:
        return _would_drive(memory, in_flight, rules)
    seen = {v.name: v for p in rules.pools for v in snapshot.pools[p.name].nodes}
    looked_at = {v.name for _, v in in_flight} | acted
    vanished = [
        (name, drain)
        for name, drain in memory.draining.items()
        if name not in looked_at and (name not in seen or seen[name].uid != drain.uid)
    ]
    # The drains to look at again next tick: those of this tick's steps (their reclaims add
    # theirs as they begin), and every node seen reclaiming, under its UID.
    draining = {
        **{name: d for name, d in memory.draining.items() if name in acted},
        **{
            view.name: Drain(
                pool.name, view.uid, view.annotations.get(keys.decision, ""), _deadline(view, keys)
            )
            for pool, view in in_flight
            if view.uid and phase(view, keys, _lent(pool)) is Phase.RECLAIMING
        },
    }
    # By UID alone, acted on or not: a new node under the name may be lent already, and the
    # pods bound to the old one are still there. A loan whose node was being reclaimed ends
    # with that drain, under its intent.
    gone = {name for name, _ in vanished}
    ended = [
        loan
        for name, loan in memory.loans.items()
        if (name not in seen or seen[name].uid != loan.view.uid) and name not in gone
    ]
    # The loans as of this tick: those the snapshot shows lent (this tick's lends are added
    # as they are made: a node may be replaced before the next tick sees it lent).
    loans = {
        view.name: Loan(pool.name, view)
        for pool in rules.pools
        for view in snapshot.pools[pool.name].nodes
        if view.uid and phase(view, keys, _lent(pool)) is Phase.LENT
    }
    memory = replace(memory, draining=draining, loans=loans)
    passes = tuple(
        _pass(memory, pool, view, rules, new_id, context, now) for pool, view in in_flight
    )
    followed = tuple(
        Progress(d.pool, name, d.decision or None, d.uid, d.deadline, memory.said.get(name), True)
        for name, d in vanished
    )
    ends = tuple(_end_loan(loan, rules, new_id, context, now) for loan in ended)
    # A node a reclaim or a drain has this tick takes the borrowed pods itself.
    reclaimed = {c.step.node for c in carries if c.step.action is not Action.LEND}
    busy = reclaimed | {v.name for _, v in in_flight} | set(draining) | gone
    busy |= {e.view.name for e in ends}
    left = _left_behind(memory, snapshot, rules, busy, new_id, context, now)
    limit = rules.reclaim_concurrency
    waves = (Wave(passes, limit), Wave(followed, limit), Wave(ends, 1), Wave(left, limit))
    return memory, [], waves


def _would_drive(
    memory: Memory, in_flight: Sequence[tuple[PoolConfig, NodeView]], rules: Rules
) -> tuple[Memory, list[Say], tuple[Wave, ...]]:
    """A node in flight was left so by a run that writes: a dry run neither drives it on nor
    closes the intent it answers to. Each is said once."""
    says = []
    for pool, view in in_flight:
        if view.name not in memory.would_drive:
            state = phase(view, rules.keys, _lent(pool))
            says.append(
                Say(
                    logging.WARNING,
                    f"dry run: node {view.name} of pool {pool.name} is "
                    f"{state.value if state else 'unreadable'}; a run that writes would drive "
                    "it on",
                )
            )
    names = frozenset(view.name for _, view in in_flight)
    return replace(memory, would_drive=names), says, ()


def _pass(
    memory: Memory,
    pool: PoolConfig,
    view: NodeView,
    rules: Rules,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> Progress | RollBack:
    """One pass over a node in flight: a lend left unfinished (its call ended in a conflict or
    a failure, and its intent is closed with that) is rolled back under an intent of its own,
    like a restart's; a reclaim is drained on."""
    decision = view.annotations.get(rules.keys.decision)
    if phase(view, rules.keys, _lent(pool)) is Phase.LENDING:
        why = f"lend {decision} left the node lending: rolling it back"
        intent = audit.recovery_intent(
            context(pool), new_id, now, str(pool.name), view, recovery.ROLLBACK, decision, why
        )
        return RollBack(pool.name, view.name, intent)
    deadline = _deadline(view, rules.keys)
    return Progress(
        pool.name, view.name, decision, view.uid or None, deadline, memory.said.get(view.name)
    )


def _end_loan(
    loan: Loan,
    rules: Rules,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> EndLoan:
    """A lent node that was deleted, and perhaps created again under its name, is not lent
    any more, and nothing in its snapshot says so: a new node is serving, and the pods the
    loan took are still bound to the name. The loan is ended under an intent of its own (a
    reclaim for the lent node's UID, which finds it gone or replaced), and the pods bound to
    the earlier node are removed as a drain removes them: evicted, deleted past the deadline.
    While any is left the drain is driven on every tick, whether the name has a node again or
    not."""
    pool, lent = rules.pool(loan.pool), loan.view
    decision = lent.annotations.get(rules.keys.decision)
    # A node lent by the last tick is seen as it was before the lend: no decision yet.
    under = f" under {decision}" if decision else ""
    why = (
        f"node {lent.name} (uid {lent.uid}) was lent{under} and has been deleted: "
        "its loan ends, and the pods bound to it are removed"
    )
    intent = audit.recovery_intent(
        context(pool), new_id, now, str(pool.name), lent, Action.RECLAIM, decision, why
    )
    return EndLoan(pool.name, lent, intent, now + pool.policy.reclaim_deadline)


def _left_behind(
    memory: Memory,
    snapshot: model.Snapshot,
    rules: Rules,
    busy: set[NodeName],
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> tuple[RemoveLeft, ...]:
    """The nodes to remove borrowed pods from that an earlier node of their name left: each
    that shows some (none in flight: its drain takes them), and each whose removal is under
    way (until a pass finds none, so that its intent is closed)."""
    out: dict[NodeName, RemoveLeft] = {}
    for pool in rules.pools:
        for view in snapshot.pools[pool.name].nodes:
            if (
                view.name in busy
                or view.name in out
                or phase(view, rules.keys, _lent(pool)) in IN_FLIGHT
                or not victims.left_by_earlier_node(view)
            ):
                continue
            under_way = memory.removing.get(view.name)
            if under_way is not None:
                out[view.name] = _removal(view.name, under_way, memory)
                continue
            intent = _left_intent(pool, view, new_id, context, now)
            deadline = now + pool.policy.reclaim_deadline
            out[view.name] = RemoveLeft(pool.name, view.name, intent, deadline, True, None)
    going = tuple(
        _removal(name, removal, memory)
        for name, removal in memory.removing.items()
        if name not in out and name not in busy
    )
    return (*out.values(), *going)


def _removal(name: NodeName, removal: Removal, memory: Memory) -> RemoveLeft:
    return RemoveLeft(
        removal.pool, name, removal.intent, removal.deadline, False, memory.said.get(name)
    )


def _left_intent(
    pool: PoolConfig,
    view: NodeView,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> AuditRecord:
    pods = [f"{p.namespace}/{p.name}" for p in victims.left_by_earlier_node(view)]
    shown = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
    created = nodestate.format_time(view.created) if view.created else "?"
    why = (
        f"node {view.name} (uid {view.uid}, created {created}) runs borrowed pod(s) bound "
        f"to its name before it was created: {shown}; an earlier node of the name was lent "
        "and deleted, and its loan ends: they are removed"
    )
    return audit.recovery_intent(
        context(pool),
        new_id,
        now,
        str(pool.name),
        view,
        Action.RECLAIM,
        None,
        why,
        detail={recovery.EARLIER_PODS: pods},
    )


def _deadline(view: NodeView, keys: Keys) -> datetime | None:
    """The reclaim deadline the node carries (None: none readable, so passed)."""
    state = nodestate.read(view, keys)
    return state.deadline if isinstance(state, nodestate.NodeState) else None


# ---------------------------------------------------------------------------------------------
# What the effects came to, folded into the memory


@dataclass(frozen=True)
class Done:
    """What carrying out one effect came to (``runtime.effects``)."""

    effect: Carry | Drive
    result: ActionResult | None  # None: not called (leadership lost, or not kept)
    intent: AuditRecord | None = None  # the intent its outcome goes on, when one is known
    recorded: bool = False  # its outcome record was written (or spooled)
    unaudited: bool = False  # its own intent could not be committed: nothing was done
    deadline: datetime | None = None  # a reclaim's: counted from when its wave began


@dataclass(frozen=True)
class StoreEvent:
    """The audit store failed a write (``error``), or took one (None), at ``now``."""

    now: datetime
    error: BaseException | None
    failing: str | None = None  # why the store fails, as the audit log says


def settle(
    memory: Memory, done: Sequence[Done], store: Sequence[StoreEvent]
) -> tuple[Memory, list[Say]]:
    """The memory after the tick's effects: the drains begun or still going, the loans made
    or not ended, the removals under way, what each drain's last record said, and the audit
    store's failure episode."""
    draining, loans = dict(memory.draining), dict(memory.loans)
    removing, said = dict(memory.removing), dict(memory.said)
    for item in done:
        effect, result = item.effect, item.result
        if isinstance(effect, EndLoan) and item.unaudited:  # ended next tick, once it can be
            loans.setdefault(effect.view.name, Loan(effect.pool, effect.view))
        if result is None:
            continue
        name, going = _node_of(effect), result.outcome is Outcome.IN_PROGRESS
        if isinstance(effect, Carry) and effect.step.action is Action.LEND:
            lent = _seen(memory, effect.step.pool, name)
            if result.outcome is Outcome.APPLIED and lent is not None and lent.uid:
                loans[name] = Loan(effect.step.pool, lent)
        elif isinstance(effect, Carry) and going and _node_uid(effect.intent):
            uid = _node_uid(effect.intent) or ""
            draining[name] = Drain(effect.step.pool, uid, effect.intent.id, item.deadline)
        elif isinstance(effect, Progress) and effect.vanished and going:
            draining[name] = Drain(
                effect.pool, effect.uid or "", effect.decision or "", effect.deadline
            )
        elif isinstance(effect, EndLoan) and going:
            draining[name] = Drain(effect.pool, effect.view.uid, effect.intent.id, effect.deadline)
        elif isinstance(effect, RemoveLeft) and going:
            removing[name] = Removal(effect.pool, effect.intent, effect.deadline)
        elif isinstance(effect, RemoveLeft):
            removing.pop(name, None)
        if isinstance(effect, RollBack):
            continue
        if not going:
            said.pop(name, None)
        elif item.recorded and item.intent is not None:
            said[name] = (item.intent.id, result.message)
    memory = replace(memory, draining=draining, loans=loans, removing=removing, said=said)
    return _store_episode(memory, store)


def _seen(memory: Memory, pool: PoolName, name: NodeName) -> NodeView | None:
    """The node as the last snapshot saw it."""
    seen = memory.last.pools.get(pool) if memory.last is not None else None
    return next((v for v in seen.nodes if v.name == name), None) if seen else None


def _store_episode(memory: Memory, events: Sequence[StoreEvent]) -> tuple[Memory, list[Say]]:
    """The store's failure episode: its traceback once when it begins, a line on each later
    failure, and how long it lasted once it takes writes again."""
    since, says = memory.store_since, []
    for event in events:
        if event.error is not None and since is None:
            since = event.now
            says.append(
                Say(
                    logging.ERROR,
                    "audit store failed; lending stops, safety reclaims go on recorded on their "
                    "nodes until it takes writes again",
                    event.error,
                )
            )
        elif event.error is not None and since is not None:
            says.append(
                Say(
                    logging.WARNING,
                    f"audit store still failing since {nodestate.format_time(since)}: "
                    f"{event.failing or event.error}",
                )
            )
        elif since is not None:
            seconds = int((event.now - since).total_seconds())
            says.append(Say(logging.INFO, f"audit store takes writes again after {seconds}s"))
            since = None
    return replace(memory, store_since=since), says


def _node_of(effect: Carry | Drive) -> NodeName:
    if isinstance(effect, Carry):
        return effect.step.node
    if isinstance(effect, EndLoan):
        return effect.view.name
    return effect.node


def _node_uid(intent: AuditRecord) -> str | None:
    """The UID of the node an intent was decided for, as its record holds it."""
    uid = intent.detail.get("node_uid")
    return uid if isinstance(uid, str) and uid else None


# What a write that changed something came to (a 429 from a budget changed nothing).
CHANGED = frozenset({WriteOutcome.APPLIED, WriteOutcome.EVICTED, WriteOutcome.GONE})


def news(said: tuple[str, str] | None, intent: AuditRecord, result: ActionResult) -> bool:
    """Whether a pass is worth a record: it ended, changed something (a pod evicted or
    deleted, a node written), or says something else than the last record of its drain."""
    if result.outcome is not Outcome.IN_PROGRESS:
        return True
    changed = any(w.outcome in CHANGED for w in result.writes)
    return changed or said != (intent.id, result.message)
