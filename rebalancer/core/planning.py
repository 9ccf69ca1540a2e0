"""The planner: the safety rules no strategy can bypass.

Where it sits: ``observe -> strategy.decide -> planning.make_plan -> actuator.apply -> audit``.
It takes the Snapshot, one Proposal per pool and the pools' policies, and answers with a Plan:
the intents it considered, the steps to carry out and, for every intent or part of one it
refused, a Rejection with a reason code and a sentence. Nothing is ever refused silently:
for each intent, the nodes in its steps plus the counts in its rejections equal its count.

How one pool is planned:

1. observe: every node is decoded once and demand is judged, into a ``_Pool`` that does not
   change while the tick is decided;
2. intents, in order of precedence: operators, safety, then the strategy. Each goes through the
   same three stages (``_grant``), and what it decides lands in the ``_Draft``, the plan being
   built, so that later intents see the steps of earlier ones:
   - candidates: which nodes could take its steps, and the Reason each other one is excluded;
   - budget: how many steps the rules allow (pause, metrics, capacity, the per-tick limit),
     each rule refusing what it cuts;
   - steps: the cheapest candidates, up to the budget; what is allowed but finds no candidate
     is refused with the reasons the other nodes were excluded.

The rules (DESIGN section 4, decisions in ``docs/design/safety-rules.md``):

- pause: a global or pool pause, or a node's ``paused`` override, freezes the node(s) as they are;
- metrics: a missing or stale demand sample stops all lending; past the grace period every lent
  node is reclaimed. A missing sample is never read as zero load. Requests queueing beyond
  ``queue_limit`` stop lending too: serving is already short. A fall of demand faster than
  traffic falls (``core.demand``) is held, and nothing is lent while it is;
- capacity: never lend below ``min_serving``, below what demand needs with ``headroom``, or above
  ``max_lent_fraction`` of the pool; when demand rises above what serves, reclaim at once;
- only idle, ready nodes are lent: no inference pods, nothing but DaemonSets and borrowed pods;
- windows: outside its window (the pool's, or the node's override) a node is not lent, and a lent
  node is taken back;
- churn: a node is not lent again within ``cooldown`` of coming back; a strategy may not take a
  node back within ``min_loan``; strategy lends and reclaims are limited per tick.

Reclaims that protect inference (demand above serving, metrics lost, operator ``reclaim=now``,
window closed) ignore ``min_loan`` and the per-tick limit: inference comes first.

The metrics, demand-drop, headroom, lent-fraction, demand-above-serving and queue rules are
guards (``policy.Guard``): the controller always holds them all; only the simulator's
baselines run without, so that their own rule shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum, StrEnum
from functools import partial

from rebalancer.core import (
    clocks,
    model,
    nodestate,
    overrides,
    takers,
    victims,
    warmth,
    windows,
)
from rebalancer.core import demand as demand_module
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.policy import Guard, PoolPolicy


def make_plan(
    snapshot: model.Snapshot,
    proposals: Mapping[model.PoolName, model.Proposal],
    policies: Mapping[model.PoolName, PoolPolicy],
    keys: nodestate.Keys,
    paused_pools: Iterable[model.PoolName] = (),
    frozen_pools: Iterable[model.PoolName] = (),
) -> model.Plan:
    paused, frozen = set(paused_pools), set(frozen_pools)
    plans = {}
    served: set[str] = set()  # jobs a pool planned before has room for: not lent for twice
    for name, pool in snapshot.pools.items():
        proposal = proposals.get(name)
        plans[name] = plan_pool(
            now=snapshot.now,
            name=name,
            pool=pool,
            proposal=proposal,
            policy=policies[name],
            keys=keys,
            paused=snapshot.paused or name in paused,
            frozen=snapshot.frozen or name in frozen,
            served=frozenset(served),
        )
        served.update(plans[name].served)
    return model.Plan(now=snapshot.now, pools=plans)


def safety_only(lent: int, why: str) -> model.Proposal:
    """What a pool is planned with when its strategy failed: hold what is lent. No new loan;
    every safety rule (demand above serving, queue, metrics lost, windows, operators) still
    reclaims."""
    return model.Proposal(lend_target=lent, reason=f"safety only: {why}")


def invalid_proposal(proposal: object, size: int) -> str | None:
    """Why ``proposal`` cannot be planned with (a strategy's answer is checked, never trusted),
    or None when it can."""
    if not isinstance(proposal, model.Proposal):
        return f"answered {type(proposal).__name__}, not a Proposal"
    target = proposal.lend_target
    if isinstance(target, bool) or not isinstance(target, int):
        return f"lend_target {target!r} is not a whole number"
    if not 0 <= target <= size:
        return f"lend_target {target} is outside 0..{size}, the pool's size"
    if not isinstance(proposal.reason, str):
        return f"reason {proposal.reason!r} is not text"
    return None


def plan_pool(
    now: datetime,
    name: model.PoolName,
    pool: model.PoolSnapshot,
    proposal: model.Proposal | None,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool = False,
    frozen: bool = False,
    served: frozenset[str] = frozenset(),
) -> model.PoolPlan:
    """One pool's plan; ``served``: jobs other pools have room for (``core.takers``)."""
    draft = _Draft(_observe(now, name, pool, policy, keys, paused, frozen, served))
    # Every intent is still formed under a pause or a freeze, and refused: nothing is silent.
    _operator_intents(draft)
    _state_intents(draft)
    _safety_intents(draft)
    _strategy_intent(draft, proposal)
    _unused_loans(draft)
    _gang_intent(draft)
    _room_lent_already(draft)
    return draft.finish(proposal)


# ---------------------------------------------------------------------------------------------
# The values passed between the stages.


class Health(Enum):
    FRESH = "fresh"
    STALE = "stale"  # no new lending
    LOST = "lost"  # stale past the grace period: reclaim everything


@dataclass(frozen=True, slots=True)
class _Node:
    """One node as the planner sees it: decoded once per node version, reused across ticks."""

    view: model.NodeView
    name: model.NodeName
    state: nodestate.NodeState
    phase: Phase
    overrides: overrides.Overrides
    window: windows.Window | None  # the node's own window override; None: the pool's
    unreadable: bool = False  # an override could not be read: fail closed, never lend it
    # Why the node is taken back whatever the strategy says (another writer changed it: its
    # state is unreadable, its label or lent taint lost, a foreign pod on it; or no pool
    # selects it now), None for a node as the controller left it. Lent nodes only.
    problem: Reason | None = None
    # The node's state could not be read: it is planned as lent (away from serving, for every
    # cap) and taken back from the pool's specification.
    error: nodestate.StateError | None = None

    def as_of(self, now: datetime) -> _Node:
        """The node at ``now``: past ``override-until`` every override lapses, an unreadable
        one too."""
        if self.overrides.active(now) is self.overrides:
            return self
        return dataclasses.replace(self, overrides=overrides.NONE, window=None, unreadable=False)


@dataclass(frozen=True, slots=True)
class _Decoded:
    node: _Node  # one whose state cannot be read too, planned as lent (``_Node.error``)
    findings: tuple[model.Finding, ...]


@dataclass(frozen=True, slots=True)
class _Demand:
    """What the tick knows of a pool's demand."""

    health: Health
    note: str  # how old the sample is, or why there is none: for the sentences
    need: int | None  # nodes demand needs now; None when demand is unknown
    value: float | None  # the demand sample planned with, in the pool's unit; None: unknown
    queue: float | None  # requests waiting, from a fresh sample; None when unknown
    held: model.DropHeld | None  # an implausible fall of demand, not believed yet


@dataclass(frozen=True, slots=True)
class _Pool:
    """One pool as the tick found it. It does not change while intents are decided: what they
    decide is in the ``_Draft``."""

    name: model.PoolName
    now: datetime
    policy: PoolPolicy
    by_phase: Mapping[Phase, tuple[_Node, ...]]  # every phase, in the order of ``Phase``
    unreadable: int  # nodes whose state could not be read: planned as lent, taken back
    not_ready: int  # serving nodes that are NotReady: no capacity, not lendable
    warming: frozenset[model.NodeName]  # serving, Ready, not warm yet: capacity soon, not now
    demand: _Demand
    budget: model.ErrorBudget | None  # the pool's error budget, where it has an slo
    cover: model.Cover | None  # what the pool's history covers, where it has an slo
    findings: tuple[model.Finding, ...]
    window_open: bool  # the pool's window, evaluated once per tick
    paused: bool  # a global or pool pause: lending and non-safety moves are refused
    frozen: bool  # a global or pool freeze: every intent is refused
    takers: tuple[takers.Gang, ...]  # pending jobs no other pool has room for, in place order
    alerts: tuple[model.FiringAlert, ...] = ()  # matched Alertmanager alerts firing now
    clocks: clocks.Clocks = clocks.NONE  # as the tick measured them: no lending past the bound
    # Nodes whose ``since`` is ahead of the API server's clock: not trusted to hold a reclaim
    # (the minimum loan); the cooldown and the warm-up count it as now, or later.
    future: frozenset[model.NodeName] = frozenset()

    @property
    def size(self) -> int:
        return self.count(*Phase)  # an unreadable node is among the lent ones

    def count(self, *phases: Phase) -> int:
        return sum(len(self.by_phase[phase]) for phase in phases)

    def is_open(self, node: _Node) -> bool:
        """Whether the node's window (its own, or the pool's) is open now."""
        return self.window_open if node.window is None else node.window.is_open(self.now)

    @property
    def budget_short(self) -> bool:
        """Whether the pool's error budget cannot pay for another loan's worst case: from
        then on only covered loans stay (docs/design/budget.md)."""
        budget, policy = self.budget, self.policy
        if Guard.ERROR_BUDGET not in policy.guards or budget is None:
            return False
        return not budget.covers(policy.loan_risk_minutes)


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The nodes that could take an intent's steps, and every other node it is about with
    the reason it is excluded (in the nodes' order, which breaks ties between reasons)."""

    eligible: tuple[_Node, ...]
    excluded: Mapping[model.NodeName, Reason]


@dataclass(frozen=True, slots=True)
class _Limit:
    """What one rule allows an intent: at most ``cap`` steps, and the words for the rest."""

    cap: int
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class _Budget:
    """How many steps an intent may take, and the refusals of the rest."""

    allowed: int
    refused: tuple[model.Rejection, ...]


@dataclass
class _Draft:
    """The plan of one pool while it is built: what the intents so far asked for, took and
    were refused. Counts read through it include the steps already decided, so a node moves
    at most once a tick and capacity is never lent twice."""

    pool: _Pool
    intents: list[Intent] = field(default_factory=list)
    steps: list[model.Step] = field(default_factory=list)
    rejections: list[model.Rejection] = field(default_factory=list)
    changed: set[model.NodeName] = field(default_factory=set)
    per_tick_left: int = field(init=False)  # strategy steps this tick still allows
    lends: int = 0
    cold_lends: int = 0  # lends of warming nodes: they took no warm capacity away
    reclaims: int = 0
    served: set[str] = field(default_factory=set)  # jobs this pool's room or lends are for

    def __post_init__(self) -> None:
        self.per_tick_left = self.pool.policy.step_budget(self.pool.size)

    def untouched(self, *phases: Phase) -> list[_Node]:
        """Nodes in ``phases`` that no step of this tick has touched yet."""
        by_phase = self.pool.by_phase
        return [n for phase in phases for n in by_phase[phase] if n.name not in self.changed]

    @property
    def lent_count(self) -> int:
        """Nodes lent or being lent after the steps decided so far."""
        return self.pool.count(Phase.LENT, Phase.LENDING) + self.lends - self.reclaims

    @property
    def serving_count(self) -> int:
        """Warm serving nodes after the steps decided so far: a NotReady node serves nothing,
        and a node back from a loan serves once its inference is warm (``core.warmth``)."""
        pool = self.pool
        warm = pool.count(Phase.SERVING) - pool.not_ready - len(pool.warming)
        return warm - (self.lends - self.cold_lends)

    @property
    def returning(self) -> int:
        """Nodes on their way back to serving: reclaiming, warming up, or reclaimed this tick."""
        warming = len(self.pool.warming) - self.cold_lends
        return self.pool.count(Phase.RECLAIMING) + warming + self.reclaims

    def step(self, intent: Intent, node: _Node, taker: str | None = None) -> None:
        # A reclaim for anything but the strategy protects inference: its deadline is short.
        urgent = intent.action is Action.RECLAIM and intent.origin is not Origin.STRATEGY
        message = intent.message if taker is None else f"{intent.message}; for job {taker}"
        self.steps.append(
            model.Step(
                pool=self.pool.name,
                node=node.name,
                action=intent.action,
                reason=intent.reason,
                message=message,
                intent=intent,
                urgent=urgent,
                taker=taker,
            )
        )
        self.changed.add(node.name)
        if intent.origin is Origin.STRATEGY:
            self.per_tick_left -= 1
        if intent.action is Action.LEND:
            self.lends += 1
            self.cold_lends += node.name in self.pool.warming
        else:
            self.reclaims += 1

    def finish(self, proposal: model.Proposal | None) -> model.PoolPlan:
        pool = self.pool
        need = "unknown" if pool.demand.need is None else str(pool.demand.need)
        target = "-" if proposal is None else str(proposal.lend_target)
        counts = ", ".join(
            f"{len(nodes)} {phase.value}" for phase, nodes in pool.by_phase.items() if nodes
        )
        if pool.unreadable:
            counts += f" ({pool.unreadable} of them unreadable)"
        return model.PoolPlan(
            pool=pool.name,
            intents=tuple(self.intents),
            steps=tuple(self.steps),
            rejections=tuple(self.rejections),
            findings=pool.findings,
            summary=(
                f"pool {pool.name}: {counts}; need {need}; target {target}; "
                f"{len(self.steps)} steps, {len(self.rejections)} refusals"
            ),
            served=frozenset(self.served),
        )


# ---------------------------------------------------------------------------------------------
# Observe: decode every node once, judge the demand.


def _observe(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool,
    frozen: bool,
    served: frozenset[str] = frozenset(),
) -> _Pool:
    by_phase, findings, unreadable = _read_nodes(now, name, snapshot, keys, policy)
    future = _in_future(now, by_phase, snapshot.clocks, keys)
    serving = by_phase[Phase.SERVING]
    return _Pool(
        name=name,
        now=now,
        policy=policy,
        by_phase=by_phase,
        unreadable=unreadable,
        not_ready=sum(1 for n in serving if not n.view.ready),
        warming=frozenset(
            n.name
            for n in serving
            if n.view.ready and not warmth.is_warm(n.view, n.state, now, policy.warmup)
        ),
        demand=_judge_demand(now, snapshot, policy),
        budget=snapshot.budget,
        cover=snapshot.cover,
        findings=findings + tuple(future.values()),
        window_open=policy.window.is_open(now),
        paused=paused,
        frozen=frozen,
        takers=tuple(g for g in takers.gangs(snapshot.takers) if g.key not in served),
        alerts=tuple(a for a in snapshot.alerts if a.until > now),
        clocks=snapshot.clocks,
        future=frozenset(future),
    )


def _in_future(
    now: datetime,
    by_phase: Mapping[Phase, Sequence[_Node]],
    measured: clocks.Clocks,
    keys: nodestate.Keys,
) -> dict[model.NodeName, model.Finding]:
    """The nodes whose ``since`` is ahead of the API server's clock (a clock ahead wrote it),
    each with its finding. Judged every tick, not once per node value: the clock moves."""
    found = {}
    for node in (n for nodes in by_phase.values() for n in nodes):
        since = node.state.since
        ahead = clocks.in_future(measured, since, now) if since is not None else None
        if ahead is None or since is None:
            continue
        found[node.name] = model.Finding(
            node.name,
            keys.since,
            since.isoformat().replace("+00:00", "Z"),
            Reason.SINCE_IN_FUTURE,
            f"since is {ahead.total_seconds():.0f}s ahead of the API server's clock (a clock "
            "ahead wrote it): not trusted; the cooldown and the warm-up count it as now, "
            "the minimum loan does not hold a reclaim",
        )
    return found


def _read_nodes(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    keys: nodestate.Keys,
    policy: PoolPolicy,
) -> tuple[dict[Phase, tuple[_Node, ...]], tuple[model.Finding, ...], int]:
    """The nodes by phase (every phase, in the order of ``Phase``; a node whose state cannot
    be read among the lent), what could not be read or was changed by another writer on any
    node, and how many nodes' state could not be read at all."""
    by_phase: dict[Phase, list[_Node]] = {phase: [] for phase in Phase}
    findings: list[model.Finding] = []
    unreadable = 0
    spec = policy.lend_spec
    # This runs for every node every tick: the common case costs no call.
    memo_key = ("planning", keys.prefix, policy.zone, spec.add_taints)
    for view in snapshot.nodes:
        decoded = view.memo.get(memo_key)
        if not isinstance(decoded, _Decoded):
            decoded = view.memo[memo_key] = _decode(view, keys, policy.zone, spec)
        if decoded.findings:
            findings.extend(decoded.findings)
        node = decoded.node
        unreadable += node.error is not None
        if node.overrides.until is not None:
            node = node.as_of(now)
        if snapshot.orphans or snapshot.overlaps:
            node = _membership(name, snapshot, node, findings)
        by_phase[node.phase].append(node)
    return {phase: tuple(nodes) for phase, nodes in by_phase.items()}, tuple(findings), unreadable


def _membership(
    name: model.PoolName, snapshot: model.PoolSnapshot, node: _Node, findings: list[model.Finding]
) -> _Node:
    """An orphan (no pool selects it, yet it carries our keys) is this pool's to take back;
    a node other pools select too is this pool's to drive. Both are reported."""
    others = snapshot.overlaps.get(node.name)
    if others:
        pools = ", ".join(others)
        why = f"selected by pools {name} and {pools}: only {name} drives it; fix the selectors"
        findings.append(model.Finding(node.name, "pools", f"{name},{','.join(others)}", _MANY, why))
    if node.name not in snapshot.orphans:
        return node
    why = (
        f"no configured pool selects it, yet it carries the controller's keys: pool {name} "
        "takes it back from its own original"
    )
    findings.append(model.Finding(node.name, "pools", "", Reason.ORPHANED, why))
    if node.phase is Phase.LENT and node.problem is None:
        return dataclasses.replace(node, problem=Reason.ORPHANED)
    return node


_MANY = Reason.SELECTED_BY_MANY_POOLS


def _decode(
    view: model.NodeView, keys: nodestate.Keys, zone: str, spec: nodestate.LendSpec
) -> _Decoded:
    """Everything about a node that depends only on its metadata: computed once per version."""
    state = nodestate.read_in_pool(view, keys, spec.add_taints)
    parsed = overrides.parse(view.annotations, keys, zone)
    findings = [
        model.Finding(view.name, p.key, p.value, Reason.BAD_OVERRIDE, str(p))
        for p in parsed.problems
    ]
    ov = parsed.overrides
    bad_override = bool(parsed.problems)
    if isinstance(state, nodestate.StateError):
        why = f"{state}; planned as lent and taken back from the pool's specification"
        findings.append(
            model.Finding(view.name, state.key, state.value, Reason.STATE_UNREADABLE, why)
        )
        # Away from serving for every cap, as a lent node is: whatever it runs, it is not the
        # capacity the pool counts on until it is back.
        stand_in = nodestate.NodeState(phase=Phase.LENT)
        node = _Node(view, view.name, stand_in, Phase.LENT, ov, ov.window, bad_override)
        node = dataclasses.replace(node, problem=Reason.STATE_UNREADABLE, error=state)
        return _Decoded(node, tuple(findings))
    drift = list(state.drift)
    if state.phase is Phase.LENT:
        drift += _lent_drift(view, spec)
    after = "the node is taken back" if state.phase is Phase.LENT else "it is not lent until fixed"
    findings += [model.Finding(view.name, d.key, d.value, d.reason, f"{d}; {after}") for d in drift]
    problem = drift[0].reason if drift and state.phase is Phase.LENT else None
    node = _Node(view, view.name, state, state.phase, ov, ov.window, bad_override, problem)
    return _Decoded(node, tuple(findings))


def _lent_drift(view: model.NodeView, spec: nodestate.LendSpec) -> list[nodestate.Drift]:
    """What another writer did to a lent node that lets inference down: a lent taint removed
    (pods with no toleration may land), or a pod landed that is neither inference, a
    DaemonSet's, nor tolerant of the lent taints."""
    drift = [
        nodestate.Drift(
            Reason.LENT_TAINT_LOST, t.key, str(t), "the lent taint is gone: any pod may land"
        )
        for t in nodestate.missing_lent_taints(view, spec)
    ]
    drift += [
        nodestate.Drift(
            Reason.FOREIGN_POD,
            "pod",
            f"{p.namespace}/{p.name}",
            "landed on the lent node: neither inference, a DaemonSet's, nor tolerant of the "
            "lent taint",
        )
        for p in view.pods
        if p.role is model.PodRole.OTHER
    ]
    return drift


def _judge_demand(now: datetime, pool: model.PoolSnapshot, policy: PoolPolicy) -> _Demand:
    # A rate that is not a finite number >= 0 is no sample: never read as a load, and never
    # handed to ``need``, which cannot round NaN or infinity.
    demand = demand_module.usable(pool.demand)
    health, note = _health(now, pool, demand, policy)
    if demand is None and pool.demand is not None:
        note = f"demand sample {pool.demand.value} is not a rate"
    queue = pool.queue
    sampled_now = clocks.prometheus_now(pool.clocks, now)
    fresh_queue = queue is not None and queue.age(sampled_now) <= policy.staleness
    return _Demand(
        health=health,
        note=note,
        need=policy.need(demand.value) if demand is not None else None,
        value=demand.value if demand is not None else None,
        queue=queue.value if queue is not None and fresh_queue else None,
        held=pool.held if Guard.DEMAND_DROP_HOLD in policy.guards else None,
    )


def _health(
    now: datetime, pool: model.PoolSnapshot, demand: model.Sample | None, policy: PoolPolicy
) -> tuple[Health, str]:
    """Unreachable, empty, NaN and old all mean one thing: demand is unknown since the last
    good sample (or since the controller started, before any). No lending at once; past
    ``staleness + stale_grace`` since then, everything lent is reclaimed.

    A sample's age is Prometheus' now minus its sample time (``clocks.prometheus_now``): a
    controller behind Prometheus does not read old samples as fresh, nor one ahead fresh ones
    as lost. The start, with no sample yet, is a time of the controller's: aged on ``now``."""
    if Guard.METRICS not in policy.guards:
        return Health.FRESH, "metrics not checked"
    since = demand.at if demand is not None else pool.unknown_since
    if since is None:
        return Health.LOST, "no demand sample"
    age = (clocks.prometheus_now(pool.clocks, now) if demand is not None else now) - since
    seconds = age.total_seconds()
    what = "the last good demand sample" if demand is not None else "the start, with no sample"
    if pool.demand_known and demand is not None and age <= policy.staleness:
        return Health.FRESH, f"demand sample {seconds:.0f}s old"
    # Past the fresh mark: say on which clock, so that a clock's fault is not Prometheus'.
    judged = _judged_on(pool.clocks) if demand is not None else ""
    if age <= policy.staleness + policy.stale_grace:
        unknown = "unknown now" if not pool.demand_known else f"older than {policy.staleness}"
        return Health.STALE, f"demand {unknown}; {seconds:.0f}s since {what}{judged}"
    return (
        Health.LOST,
        f"demand unknown {seconds:.0f}s since {what}{judged}, past the grace period",
    )


def _judged_on(measured: clocks.Clocks) -> str:
    """Which clock a sample's age was told on, and what is wrong with the clocks, if anything."""
    skew = measured.skew(clocks.Against.PROMETHEUS)
    if skew is not None:
        on = f" (aged on Prometheus' clock, {skew.offset.total_seconds():+.1f}s from this one's)"
    elif clocks.Against.PROMETHEUS in measured.unmeasured:
        on = " (aged on the API server's clock: Prometheus' could not be read)"
    else:
        on = ""
    problems = measured.problems()
    return on + (f"; clocks: {'; '.join(problems)}" if problems else "")


# ---------------------------------------------------------------------------------------------
# Intents, in order of precedence: operators, safety, then the strategy.


def _operator_intents(draft: _Draft) -> None:
    """Per-node overrides and window edges: each is an intent of its own, about one node."""
    pool = draft.pool
    for node in draft.untouched(Phase.LENT):
        if node.overrides is overrides.NONE and pool.window_open and not node.unreadable:
            continue  # the common case, decided without looking further
        intent = _operator_reclaim(pool, node)
        if intent is not None:
            _grant(draft, intent, [node])
    for node in draft.untouched(Phase.SERVING):
        if node.overrides.lend is overrides.LendMode.NOW and not node.unreadable:
            reason, why = Reason.OPERATOR_LEND_NOW, "an operator asked to lend this node now"
            intent = Intent(pool.name, Action.LEND, 1, Origin.OPERATOR, reason, why, node=node.name)
            _grant(draft, intent, [node])


def _operator_reclaim(pool: _Pool, node: _Node) -> Intent | None:
    """The intent to take back a lent node its overrides or its window no longer allow lent."""
    ov = node.overrides
    if ov.reclaim_now or ov.lend is overrides.LendMode.NEVER:
        reason = Reason.OPERATOR_RECLAIM_NOW if ov.reclaim_now else Reason.OPERATOR_NEVER
        origin, why = Origin.OPERATOR, "an operator asked for it"
    elif node.unreadable:
        origin, reason = Origin.OPERATOR, Reason.BAD_OVERRIDE_RECLAIM
        why = "an override on the node cannot be read; it may have meant to keep it serving"
    elif ov.lend is not overrides.LendMode.NOW and not pool.is_open(node):
        origin, reason = Origin.SCHEDULE, Reason.WINDOW_CLOSED
        why = f"window {node.window or pool.policy.window}"
    else:
        return None
    return Intent(pool.name, Action.RECLAIM, 1, origin, reason, why, node=node.name)


_PROBLEMS = {
    Reason.STATE_UNREADABLE: "its state cannot be read: it is taken back from the pool's "
    "specification, so that it serves again",
    Reason.STATE_LABEL_LOST: "another writer removed its state label: it is taken back from "
    "its original before it can be mistaken for a serving node",
    Reason.LENT_TAINT_LOST: "another writer removed its lent taint: pods that do not tolerate "
    "it may land, so it is taken back",
    Reason.FOREIGN_POD: "a pod that is neither inference, a DaemonSet's, nor borrowed landed "
    "on it: it is taken back",
    Reason.ORPHANED: "no configured pool selects it, yet it is lent: it is taken back from its "
    "original",
}


def _state_intents(draft: _Draft) -> None:
    """Lent nodes another writer changed, or that no pool selects now: each is taken back at
    once, as a safety reclaim of its own. The controller does not keep a node lent whose state
    it cannot vouch for (docs/design/other-writers.md); an operator's pause still holds it."""
    pool = draft.pool
    for node in draft.untouched(Phase.LENT):
        if node.problem is None:
            continue
        why = _PROBLEMS[node.problem]
        intent = Intent(
            pool.name, Action.RECLAIM, 1, Origin.SAFETY, node.problem, why, node=node.name
        )
        _grant(draft, intent, [node])


def _safety_intents(draft: _Draft) -> None:
    """Reclaims that keep inference served: everything lent once demand is lost, else what
    demand above serving and a queue beyond its limit call for."""
    demand, policy = draft.pool.demand, draft.pool.policy
    if demand.health is Health.LOST:
        count = draft.pool.count(Phase.LENT) - draft.reclaims
        why = f"demand is unknown ({demand.note}): inference comes first"
        _safety_reclaim(draft, count, Reason.METRICS_LOST, why)
        return
    if demand.need is not None and Guard.DEMAND_ABOVE_SERVING in policy.guards:
        _reclaim_for_demand(draft, demand.need)
    if policy.queue_reclaims and Guard.QUEUE_LIMIT in policy.guards:
        _reclaim_for_queue(draft)
    _reclaim_for_alerts(draft)
    if draft.pool.budget_short:
        _reclaim_for_budget(draft)


def _reclaim_for_demand(draft: _Draft, need: int) -> None:
    # Nodes already on their way back count: they will serve again.
    covered = draft.serving_count + draft.returning
    why = f"demand needs {need} serving nodes, {covered} serve or are returning"
    _safety_reclaim(draft, min(need - covered, draft.lent_count), Reason.DEMAND_ABOVE_SERVING, why)


def _reclaim_for_budget(draft: _Draft) -> None:
    """The error budget cannot pay for another loan's worst case. Demand above what serves
    now is an episode under way: every loan comes back, so that it ends within one return time
    (no more than the budget had left when it could last pay for a whole one). Otherwise the
    loans the pool's history does not cover come back (docs/design/budget.md)."""
    pool = draft.pool
    budget, cover, rps = pool.budget, pool.cover, pool.demand.value
    assert budget is not None, "only a pool with a budget is short of it"
    unit = pool.policy.unit
    carried = pool.policy.rps_per_node * draft.serving_count
    if rps is not None and rps > carried + 1e-9:
        why = (
            f"demand {rps:.4g} {unit.symbol} is above what {draft.serving_count} warm nodes "
            f"carry and the error budget cannot pay for a longer episode ({budget.spent_text}): "
            "every loan comes back"
        )
        _safety_reclaim(draft, draft.lent_count, Reason.BUDGET_EXPOSED, why)
        return
    keep = _covered_keep(pool)
    if cover is None or keep is None:
        return
    kept = draft.serving_count + draft.returning
    why = (
        f"the error budget cannot pay for another loan ({budget.spent_text}): {keep} serving "
        f"nodes carry {cover.text(rps, unit)}, {kept} serve or are returning"
    )
    _safety_reclaim(draft, min(keep - kept, draft.lent_count), Reason.BUDGET_EXPOSED, why)


def _reclaim_for_queue(draft: _Draft) -> None:
    """Requests waiting beyond the limit: serving is short now, whatever the rate says (a rate
    lags, and under-reads a series younger than its window; a queue does not). Take back
    enough nodes to clear the backlog within a minute, counting those already on their way
    back, warming ones included. In tokens per second a waiting request has no size, so the
    queue cannot be counted in nodes: a wave of the pool's per-tick step is kept on its way
    back while requests wait, as for a firing alert."""
    pool, queue, policy = draft.pool, draft.pool.demand.queue, draft.pool.policy
    limit = policy.queue_limit
    if queue is None or queue <= limit or draft.lent_count <= 0:
        return
    backlog = policy.unit.backlog_nodes(queue, policy.rps_per_node)
    if backlog is None:
        backlog = policy.step_budget(pool.size)
        clears = f"a request has no size in {policy.unit.symbol}, so {backlog} nodes come back"
    else:
        clears = f"{backlog} nodes clear them within a minute"
    why = (
        f"{queue:.0f} requests wait (limit {limit:.0f}): {clears}, "
        f"{draft.returning} are on their way back"
    )
    _keep_returning(draft, backlog, Reason.QUEUE_ABOVE_LIMIT, why)


def _reclaim_for_alerts(draft: _Draft) -> None:
    """A matched Alertmanager alert fires: inference is short as its rule sees it, whatever
    the samples here say. Stepped as the queue rule is: a wave of the pool's per-tick step
    is kept on its way back while an alert fires, so each wave is warm before the next is
    taken (docs/design/alertmanager.md)."""
    pool = draft.pool
    if not pool.alerts or draft.lent_count <= 0:
        return
    wave = pool.policy.step_budget(pool.size)
    why = (
        f"{_alert_names(pool.alerts)} fires: {wave} nodes come back at a time, "
        f"{draft.returning} are on their way back"
    )
    _keep_returning(draft, wave, Reason.ALERT_FIRING, why)


def _alert_names(alerts: Sequence[model.FiringAlert]) -> str:
    shown = ", ".join(f"alert {a.name} ({a.matcher})" for a in alerts[:3])
    return shown + (f" and {len(alerts) - 3} more" if len(alerts) > 3 else "")


def _keep_returning(draft: _Draft, wanted: int, reason: Reason, why: str) -> None:
    """Reclaim until ``wanted`` nodes are on their way back, those returning included."""
    _safety_reclaim(draft, min(wanted - draft.returning, draft.lent_count), reason, why)


def _safety_reclaim(draft: _Draft, count: int, reason: Reason, why: str) -> None:
    """Take ``count`` lent nodes back to keep inference served: no churn limit applies."""
    if count > 0:
        intent = Intent(draft.pool.name, Action.RECLAIM, count, Origin.SAFETY, reason, why)
        _grant(draft, intent, _reclaimable(draft))


def _reclaimable(draft: _Draft) -> list[_Node]:
    """What a reclaim of the pool is about: the lent nodes no step has touched, and those still
    being lent, there only to be refused as in flight (``_why_not_reclaim``)."""
    return draft.untouched(Phase.LENT, Phase.LENDING)


def _strategy_intent(draft: _Draft, proposal: model.Proposal | None) -> None:
    if proposal is None:
        return
    delta = proposal.lend_target - draft.lent_count
    if delta == 0:
        return
    name, why = draft.pool.name, proposal.reason
    if delta > 0:
        intent = Intent(name, Action.LEND, delta, Origin.STRATEGY, Reason.STRATEGY, why)
        # lend=now nodes had their own intent; lend=never ones are candidates only to be
        # refused with their own reason (not "no serving node is left").
        nodes = [
            n
            for n in draft.untouched(Phase.SERVING)
            if n.overrides.lend is not overrides.LendMode.NOW
        ]
    else:
        intent = Intent(name, Action.RECLAIM, -delta, Origin.STRATEGY, Reason.STRATEGY, why)
        nodes = _reclaimable(draft)
    _grant(draft, intent, nodes)


# ---------------------------------------------------------------------------------------------
# Granting an intent: candidates, budget, steps. The same for every intent, lend or reclaim.


def _grant(draft: _Draft, intent: Intent, nodes: Sequence[_Node]) -> None:
    """Decide ``intent`` over the ``nodes`` it is about: the candidates among them, the budget
    the rules leave, and the steps: the cheapest candidates, up to the budget. What the
    budget allows but no candidate can take is refused with the reasons nodes were excluded."""
    draft.intents.append(intent)
    candidates = _candidates(draft.pool, intent, nodes)
    budget = _budget(intent, _limits(draft, intent))
    draft.rejections.extend(budget.refused)
    if intent.action is Action.LEND:
        ordered = sorted(candidates.eligible, key=_lend_cost)
    else:
        ordered = _reclaim_order(candidates.eligible, _preempted(draft), budget.allowed)
    if _to_takers(draft.pool, intent):
        _lend_to_takers(draft, intent, ordered, budget.allowed, candidates.excluded)
        return
    chosen = ordered[: budget.allowed]
    for node in chosen:
        draft.step(intent, node)
    missing = budget.allowed - len(chosen)
    draft.rejections.extend(_shortfall(draft.pool, intent, missing, candidates.excluded))


# -- takers ------------------------------------------------------------------------------------


def _to_takers(pool: _Pool, intent: Intent) -> bool:
    """Whether ``intent`` lends only to pending jobs: the strategy's lends in a pool that says
    so. An operator's ``lend=now`` is the operator's call, as it is for the window."""
    return (
        pool.policy.lend_only_to_takers
        and intent.action is Action.LEND
        and intent.origin is Origin.STRATEGY
    )


def _lend_to_takers(
    draft: _Draft,
    intent: Intent,
    ordered: Sequence[_Node],
    allowed: int,
    excluded: Mapping[model.NodeName, Reason],
) -> None:
    """Lend, of the ``ordered`` candidates, only nodes a pending job would run on, up to
    ``allowed``; jobs that fit on room already lent need none (``core.takers``)."""
    pool = draft.pool
    offered = [_room(pool, node, lent=False) for node in ordered]
    placed = takers.place(pool.takers, _lent_rooms(draft), offered, allowed)
    by_name = {node.name: node for node in ordered}
    for name, job in placed.lend:
        draft.step(intent, by_name[name], taker=job)
        draft.served.add(job)
    draft.served.update(placed.served)
    missing = allowed - len(placed.lend)
    without_candidate = max(0, missing - max(0, len(ordered) - len(placed.lend)))
    draft.rejections.extend(_shortfall(pool, intent, without_candidate, excluded))
    no_taker = missing - without_candidate
    if no_taker > 0:
        note = _why_no_taker(pool, placed)
        draft.rejections.append(
            model.Rejection(intent, Reason.NO_TAKER, note, no_taker, intent.node)
        )


def _unused_loans(draft: _Draft) -> None:
    """In a pool that lends only to takers, a loan is for a job: one that no borrowed pod runs
    on and no pending job would take, ``unused_loan`` after it began (the job finished, was
    deleted, or went elsewhere), harvests nothing and is given back. A strategy's move: held
    to ``min_loan``, an operator's ``lend=now`` and the pause, as any."""
    pool = draft.pool
    grace = pool.policy.unused_loan
    if not pool.policy.lend_only_to_takers:
        return
    used = takers.place(pool.takers, _lent_rooms(draft), (), 0).used
    idle = [
        n
        for n in draft.untouched(Phase.LENT)
        if not n.view.borrowed_pods
        and n.name not in used
        and n.state.since is not None
        and pool.now - n.state.since >= grace
    ]
    if idle:
        why = f"lent over {grace} ago, and no job runs on it or waits for it"
        intent = Intent(
            pool.name, Action.RECLAIM, len(idle), Origin.STRATEGY, Reason.UNUSED_LOAN, why
        )
        _grant(draft, intent, idle)


def _room_lent_already(draft: _Draft) -> None:
    """Jobs that fit on what the pool holds lent once this tick's steps are taken are the
    pool's (``PoolPlan.served``), whether or not it lends more now: a pool that holds, is
    paused or plans safety only still has the room it lent for a job the scheduler has not
    placed yet, and no pool planned after it lends that job a second node. Counting a job
    served that will not land here costs at most a loan not made: the side of inference."""
    placed = takers.place(draft.pool.takers, _lent_rooms(draft), (), 0)
    draft.served.update(placed.served)


def _why_no_taker(pool: _Pool, placed: takers.Placement) -> str:
    if not pool.takers:
        return "no pending pod tolerates the lend taint: a lent node would run nothing"
    waiting = list(placed.waiting.items())
    if not waiting:
        return f"every pending job ({len(pool.takers)}) fits on nodes lent already"
    shown = "; ".join(f"job {job}: {why}" for job, why in waiting[:3])
    more = f"; and {len(waiting) - 3} more" if len(waiting) > 3 else ""
    return f"no pending job would run on another node: {shown}{more}"


def _lent_rooms(draft: _Draft) -> list[takers.Room]:
    """The room pending pods may find without a new loan: nodes lent or being lent (not
    taken back this tick), then those lent this tick, as they will be once lent."""
    pool = draft.pool
    stepped = {s.node: s.action for s in draft.steps}
    rooms = [
        _room(pool, node, lent=node.phase is Phase.LENT)
        for node in (*pool.by_phase[Phase.LENT], *pool.by_phase[Phase.LENDING])
        if stepped.get(node.name) is not Action.RECLAIM
    ]
    by_name = {n.name: n for n in pool.by_phase[Phase.SERVING]}
    rooms += [
        _room(pool, by_name[s.node], lent=False)
        for s in draft.steps
        if s.action is Action.LEND and s.node in by_name
    ]
    return rooms


def _room(pool: _Pool, node: _Node, lent: bool) -> takers.Room:
    """``node`` as a pending pod would find it: as it is when ``lent``, else once lent."""
    view, spec = node.view, pool.policy.lend_spec
    labels, taints = view.labels, view.taints
    if not lent:
        change = nodestate.NodeChange(nodestate.lent_taints(taints, spec), spec.labels, {})
        after = nodestate.apply(view, change)
        labels, taints = after.labels, after.taints
    free = None
    if view.allocatable is not None:
        free = view.allocatable - sum((p.requests for p in view.pods), model.NOTHING)
    return takers.Room(view.name, labels, taints, free)


# -- candidates --------------------------------------------------------------------------------


def _candidates(pool: _Pool, intent: Intent, nodes: Sequence[_Node]) -> _Candidates:
    """Sort ``nodes`` into those that may take ``intent``'s steps and those excluded, and why."""
    why_not = _why_not_lend if intent.action is Action.LEND else _why_not_reclaim
    strategy = intent.origin is Origin.STRATEGY
    eligible, excluded = [], {}
    for node in nodes:
        reason = why_not(pool, node, strategy)
        if reason is None:
            eligible.append(node)
        else:
            excluded[node.name] = reason
    return _Candidates(tuple(eligible), excluded)


# The rules a node is held to, in the order they are judged: (reason, refuses, the strategy's
# only). The first that refuses is the reason a node is excluded; ``rules_for`` shows them all.
_NodeRule = tuple[Reason, Callable[["_Pool", "_Node"], bool], bool]

_LEND_RULES: tuple[_NodeRule, ...] = (
    # A serving node with a state key another writer garbled: fail closed, as for an override.
    (Reason.BAD_STATE, lambda pool, node: bool(node.state.drift), False),
    (Reason.BAD_OVERRIDE, lambda pool, node: node.unreadable, False),
    (Reason.NODE_PAUSED, lambda pool, node: node.overrides.paused, False),
    (Reason.LEND_NEVER, lambda pool, node: node.overrides.lend is overrides.LendMode.NEVER, False),
    (Reason.OPERATOR_RECLAIM_NOW, lambda pool, node: node.overrides.reclaim_now, False),
    (Reason.NOT_READY, lambda pool, node: not node.view.ready, False),
    (Reason.NOT_IDLE, lambda pool, node: not node.view.idle, False),
    # An operator's lend=now skips the window, the cooldown and the warm-up; nothing else.
    (Reason.OUTSIDE_WINDOW, lambda pool, node: not pool.is_open(node), True),
    (Reason.COOLDOWN, lambda pool, node: _within(pool, node, pool.policy.cooldown), True),
    # On its way back: lending it again is churn.
    (Reason.WARMING, lambda pool, node: node.name in pool.warming, True),
)

_RECLAIM_RULES: tuple[_NodeRule, ...] = (
    # The actuator finishes or rolls back a lend in flight first.
    (Reason.IN_FLIGHT, lambda pool, node: node.phase is Phase.LENDING, False),
    (Reason.NODE_PAUSED, lambda pool, node: node.overrides.paused, False),
    # The operator outranks the strategy: taking the node back would only have it lent again
    # (lend=now skips the cooldown) as soon as it returns, a loop that preempts the training
    # on it every few minutes.
    (
        Reason.OPERATOR_LEND_NOW,
        lambda pool, node: node.overrides.lend is overrides.LendMode.NOW,
        True,
    ),
    # A since ahead of the API server's clock holds no reclaim: inference comes first.
    (
        Reason.MIN_LOAN_TIME,
        lambda pool, node: (
            node.name not in pool.future and _within(pool, node, pool.policy.min_loan)
        ),
        True,
    ),
)


def _within(pool: _Pool, node: _Node, span: timedelta) -> bool:
    """Whether the node's phase began less than ``span`` ago."""
    since = node.state.since
    return since is not None and pool.now - since < span


# The rules about one node, as against those about the pool (its limits): ``core.explain``.
NODE_RULES = frozenset(reason for reason, _, _ in _LEND_RULES + _RECLAIM_RULES)


def _first_refusal(
    rules: Sequence[_NodeRule], pool: _Pool, node: _Node, strategy: bool
) -> Reason | None:
    for reason, refuses, strategy_only in rules:
        if strategy_only and not strategy:
            return None  # the strategy's rules come last
        if refuses(pool, node):
            return reason
    return None


def _why_not_lend(pool: _Pool, node: _Node, strategy: bool) -> Reason | None:
    """Why ``node`` may not be lent now, or None when it may (``_LEND_RULES``)."""
    return _first_refusal(_LEND_RULES, pool, node, strategy)


def _why_not_reclaim(pool: _Pool, node: _Node, strategy: bool) -> Reason | None:
    """Why ``node`` may not be reclaimed now, or None when it may (``_RECLAIM_RULES``). Only
    the strategy is held to ``min_loan`` and to an operator's ``lend=now``."""
    return _first_refusal(_RECLAIM_RULES, pool, node, strategy)


# -- budget ------------------------------------------------------------------------------------


def _budget(intent: Intent, limits: Iterable[_Limit]) -> _Budget:
    """What every limit, in turn, leaves of ``intent``; each refuses the part it cuts."""
    allowed, refused = intent.count, []
    for limit in limits:
        granted = max(0, min(allowed, limit.cap))
        if granted < allowed:
            cut = allowed - granted
            refused.append(model.Rejection(intent, limit.reason, limit.message, cut, intent.node))
            allowed = granted
        if allowed == 0:
            break  # the rules after this one have nothing left to cut
    return _Budget(allowed, tuple(refused))


def _limits(draft: _Draft, intent: Intent) -> Iterator[_Limit]:
    """The rules that bound ``intent``, in the order their refusals are reported."""
    pool = draft.pool
    paused = _pause_limit(pool, intent)
    if paused is not None:
        yield paused
    if intent.action is Action.LEND:
        blocked = _lend_blocked(pool)
        if blocked is not None:
            yield blocked
        yield _lend_room(draft)
    if intent.origin is Origin.STRATEGY:
        per_tick = pool.policy.step_budget(pool.size)
        why = f"at most {per_tick} strategy changes per tick"
        yield _Limit(_per_tick_cap(draft, intent), Reason.RATE_LIMIT, why)


def _per_tick_cap(draft: _Draft, intent: Intent) -> int:
    """The strategy's moves left this tick. A gang is lent whole in one tick or not at all, so
    where lends go to takers, the first move of a tick may be as large as the largest waiting
    gang a node of the pool would accept (its pods: at least the nodes it needs): a job of four
    is never kept waiting for ever by a limit of two a tick. The capacity rules still bound
    it."""
    left = draft.per_tick_left
    pool = draft.pool
    if not _to_takers(pool, intent) or left < pool.policy.step_budget(pool.size):
        return left
    rooms = [_room(pool, node, lent=False) for node in draft.untouched(Phase.SERVING)]

    def welcome(pod: model.PendingPod) -> bool:
        return any(takers.accepts(pod, r.labels, r.taints) is None for r in rooms)

    gangs = [len(g.pods) for g in pool.takers if all(welcome(p) for p in g.pods)]
    return max(left, max(gangs, default=0))


def _pause_limit(pool: _Pool, intent: Intent) -> _Limit | None:
    """A freeze refuses everything. A pause refuses lending and the moves that are not about
    keeping inference served: a safety reclaim, or one an operator asked for on a node,
    still happens."""
    if pool.frozen:
        why = "the pool is frozen: nothing moves, not even safety reclaims"
        return _Limit(0, Reason.FROZEN, why)
    protects = intent.action is Action.RECLAIM and intent.origin in (
        Origin.SAFETY,
        Origin.OPERATOR,
    )
    if pool.paused and not protects:
        return _Limit(0, Reason.PAUSED, "the pool is paused")
    return None


def _lend_blocked(pool: _Pool) -> _Limit | None:
    """The rules under which nothing is lent at all: a node of the pool not as the controller
    left it, demand unknown, a fall not believed yet, requests queueing."""
    demand, policy = pool.demand, pool.policy
    changed = [n for n in pool.by_phase[Phase.LENT] if n.problem is not None]
    if changed:
        # Until it is back, the node is away, and what else another writer did to the pool is
        # not known: lending waits for every node to read as the controller wrote it.
        first = changed[0]
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return _Limit(
            0,
            first.problem or Reason.STATE_UNREADABLE,
            f"no lending while node {first.name}{more} is taken back ({first.problem})",
        )
    if demand.health is not Health.FRESH:
        stale = demand.health is Health.STALE
        reason = Reason.METRICS_STALE if stale else Reason.METRICS_MISSING
        return _Limit(0, reason, f"no lending while demand is unknown ({demand.note})")
    problems = pool.clocks.problems()
    if problems:
        # The ages of samples and the times written on nodes rest on the clocks: a clock that
        # cannot be trusted fails toward inference, as unknown demand does. Reclaims go on.
        # After the metrics rule: a Prometheus that is down is not a clock's fault (its
        # ``time()`` fails with the rest, and the refusal above names the clocks too).
        return _Limit(0, Reason.CLOCK_SKEW, f"no lending: {'; '.join(problems)}")
    if demand.held is not None:
        held = demand.held
        return _Limit(
            0,
            Reason.DEMAND_DROP_HELD,
            f"demand fell from {held.level.value:.4g} to {held.seen.value:.4g} "
            f"{policy.unit.symbol} faster than "
            f"traffic falls; not believed until it lasts {policy.drop_hold} "
            f"(since {held.since.isoformat()})",
        )
    if pool.alerts:
        return _Limit(0, Reason.ALERT_FIRING, f"no lending while {_alert_names(pool.alerts)} fires")
    queue = demand.queue
    if Guard.QUEUE_LIMIT in policy.guards and queue is not None and queue > policy.queue_limit:
        return _Limit(
            0,
            Reason.QUEUE_BUILDING,
            f"{queue:.0f} requests wait (limit {policy.queue_limit:.0f}): serving is short already",
        )
    return None


def _lend_room(draft: _Draft) -> _Limit:
    """How many more nodes may be lent, and the rule that sets that number.

    Only warm serving nodes are capacity to lend from: a node still reclaiming or warming up
    will serve soon but does not now, and lending against it is how a rise breaches (the
    node lent in its place leaves serving short until the returning one is warm)."""
    pool, policy = draft.pool, draft.pool.policy
    size, serving, need = pool.size, draft.serving_count, pool.demand.need
    limits = [
        _Limit(serving - policy.min_serving, Reason.MIN_SERVING, f"{policy.min_serving} must serve")
    ]
    if Guard.MAX_LENT_FRACTION in policy.guards:
        most = math.floor(policy.max_lent_fraction * size + 1e-9)
        why = f"at most {policy.max_lent_fraction:.0%} of {size} nodes may be lent"
        limits.append(_Limit(most - draft.lent_count, Reason.MAX_FRACTION, why))
    if Guard.HEADROOM in policy.guards and need is not None:
        why = f"demand needs {need} of {size} nodes with {policy.headroom:.0%} headroom"
        limits.append(_Limit(serving - need, Reason.HEADROOM, why))
    if pool.budget_short:
        limits.append(_covered_room(pool, serving))
    tightest = min(limits, key=lambda limit: limit.cap)
    if tightest.reason in (Reason.MIN_SERVING, Reason.HEADROOM):
        return _blame_cold_nodes(pool, tightest)
    return tightest


def _covered_keep(pool: _Pool) -> int | None:
    """The serving nodes what the pool's history covers needs, the demand sample raising the
    peaks; None: no cover, or none of its windows covers anything."""
    cover = pool.cover
    return None if cover is None else cover.keep(pool.policy.need, pool.demand.value)


def _covered_room(pool: _Pool, serving: int) -> _Limit:
    """With the error budget short, what may be lent leaves serving what the pool's history
    covers; with no cover, nothing."""
    budget, cover, rps = pool.budget, pool.cover, pool.demand.value
    assert budget is not None, "only a pool with a budget is short of it"
    keep = _covered_keep(pool)
    if cover is None or keep is None:
        why = (
            f"the error budget cannot cover another loan ({budget.spent_text}, a loan may cost "
            f"{pool.policy.loan_risk_minutes}) and the pool's history covers none: no lending "
            "until minutes leave the window"
        )
        return _Limit(0, Reason.BUDGET_SPENT, why)
    why = (
        f"the error budget cannot pay for another loan ({budget.spent_text}): only covered "
        f"loans, {keep} serving nodes carry {cover.text(rps, pool.policy.unit)}"
    )
    return _Limit(serving - keep, Reason.BUDGET_SPENT, why)


def _blame_cold_nodes(pool: _Pool, limit: _Limit) -> _Limit:
    """When serving capacity limits lending, name the serving nodes that carry no load: not
    ready, or on their way back and not warm yet."""
    cold = []
    if pool.not_ready:
        cold.append(f"{pool.not_ready} serving nodes are not ready")
    returning = pool.count(Phase.RECLAIMING) + len(pool.warming)
    if returning:
        cold.append(f"{returning} are on their way back and not warm yet")
    if not cold:
        return limit
    reason = Reason.NOT_READY if pool.not_ready else Reason.WARMING
    return _Limit(limit.cap, reason, f"{'; '.join(cold)}, so they carry no load; {limit.message}")


# -- steps -------------------------------------------------------------------------------------


def _lend_cost(node: _Node) -> tuple[int, str]:
    """Cheapest first: fewest pods, then by name, so that plans are deterministic."""
    return len(node.view.pods), node.name


def _reclaim_order(nodes: Sequence[_Node], preempted: set[str], count: int) -> list[_Node]:
    """The ``count`` nodes a reclaim takes first, cheapest first in what they cost training:
    a job (a gang) is preempted whole as soon as one of its pods goes, so each next node is
    the one that preempts the fewest jobs not preempted already (``preempted``: by this tick's
    earlier steps, or by nodes on their way back), then the cheapest such jobs by
    ``victims``' order (lowest priority, least work lost), then the fewest pods. The other
    nodes of a gang taken once cost nothing more, and come next."""
    remaining = list(nodes)
    lost = set(preempted)
    cost = {job.key: rank for rank, job in enumerate(victims.jobs(_borrowed(remaining)))}
    chosen: list[_Node] = []
    while remaining and len(chosen) < count:
        best = min(remaining, key=partial(_price, lost=frozenset(lost), cost=cost))
        remaining.remove(best)
        chosen.append(best)
        lost |= _jobs_on(best)
    return chosen


def _price(
    node: _Node, lost: frozenset[str], cost: Mapping[str, int]
) -> tuple[int, list[int], int, str]:
    """What taking ``node`` back costs when the jobs in ``lost`` are lost already: the jobs
    it preempts besides, the dearest of them first (by their rank in ``cost``), its pods."""
    new = _jobs_on(node) - lost
    return len(new), sorted((cost[j] for j in new), reverse=True), len(node.view.pods), node.name


def _jobs_on(node: _Node) -> set[str]:
    return {victims.job_key(p) for p in node.view.borrowed_pods}


def _borrowed(nodes: Iterable[_Node]) -> list[model.PodView]:
    return [p for node in nodes for p in node.view.borrowed_pods]


def _preempted(draft: _Draft) -> set[str]:
    """The jobs that lose pods this tick or are losing them: those on nodes a step of this
    tick takes back, and those on nodes already on their way back."""
    pool = draft.pool
    back = {s.node for s in draft.steps if s.action is Action.RECLAIM}
    nodes = [n for n in pool.by_phase[Phase.LENT] if n.name in back]
    nodes += pool.by_phase[Phase.RECLAIMING]
    return {job for node in nodes for job in _jobs_on(node)}


def _gang_intent(draft: _Draft) -> None:
    """No gang is left half-running: the lent nodes that still run pods of a job that is
    losing pods elsewhere (a step of this tick, or a node on its way back) come back too. The
    job is lost already, so taking its other nodes back costs it nothing more, and frees them
    for inference or for a job that can run whole. As urgent as any reclaim that is not the
    strategy's; a node an operator paused stays as it is."""
    preempted = _preempted(draft)
    if not preempted:
        return
    siblings = [n for n in draft.untouched(Phase.LENT) if _jobs_on(n) & preempted]
    if not siblings:
        return
    jobs = sorted({j for n in siblings for j in _jobs_on(n) & preempted})
    shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    why = f"job {shown} is losing pods on a node taken back: its other nodes come back with it"
    intent = Intent(
        draft.pool.name, Action.RECLAIM, len(siblings), Origin.SAFETY, Reason.GANG_PREEMPTED, why
    )
    _grant(draft, intent, siblings)


def _shortfall(
    pool: _Pool, intent: Intent, missing: int, excluded: Mapping[model.NodeName, Reason]
) -> list[model.Rejection]:
    """Refusals for the ``missing`` steps the budget allowed but no candidate could take."""
    if missing <= 0:
        return []
    reasons = Counter(excluded.values())
    if intent.action is Action.LEND:
        reason, note = _why_no_lend_candidate(reasons)
        nodes = tuple(excluded.items())
        return [model.Rejection(intent, reason, note, missing, intent.node, nodes)]
    refused = []
    for reason, note in _reclaim_exclusions(pool.policy, intent):
        count = min(missing, reasons[reason])
        if count > 0:
            nodes = tuple((n, r) for n, r in excluded.items() if r is reason)
            refused.append(model.Rejection(intent, reason, note, count, intent.node, nodes))
        missing -= count
    if missing > 0:
        note = "no lent node is left to reclaim"
        refused.append(model.Rejection(intent, Reason.NO_CANDIDATE, note, missing, intent.node))
    return refused


_LEND_EXCLUSIONS = {
    Reason.BAD_STATE: "with a state key that cannot be read",
    Reason.BAD_OVERRIDE: "with an override that cannot be read",
    Reason.OPERATOR_RECLAIM_NOW: "marked reclaim=now",
    Reason.NODE_PAUSED: "paused",
    Reason.LEND_NEVER: "marked lend=never",
    Reason.NOT_READY: "not ready",
    Reason.NOT_IDLE: "running inference or other pods",
    Reason.OUTSIDE_WINDOW: "outside their window",
    Reason.COOLDOWN: "in cooldown after a reclaim",
    Reason.WARMING: "warming up after a reclaim",
}


def _why_no_lend_candidate(excluded: Counter[Reason]) -> tuple[Reason, str]:
    """The commonest reason serving nodes were excluded, and a sentence counting them all."""
    if not excluded:
        return Reason.NO_CANDIDATE, "no serving node is left to lend"
    reason = excluded.most_common(1)[0][0]
    parts = ", ".join(f"{count} {_LEND_EXCLUSIONS[r]}" for r, count in excluded.most_common())
    return reason, f"not enough idle serving nodes: {parts}"


def _reclaim_exclusions(policy: PoolPolicy, intent: Intent) -> list[tuple[Reason, str]]:
    """Why lent nodes are excluded from a reclaim, in the order a shortfall is blamed on them."""
    # An intent about one node says so: "the node is paused by an operator".
    paused = "the node is paused by an operator" if intent.node else "paused by an operator"
    return [
        (Reason.MIN_LOAN_TIME, f"lent less than {policy.min_loan} ago"),
        (Reason.NODE_PAUSED, paused),
        (Reason.OPERATOR_LEND_NOW, "kept lent by an operator (lend=now)"),
        (Reason.IN_FLIGHT, "still being lent; finished or rolled back first"),
    ]


# ---------------------------------------------------------------------------------------------
# Explain: every rule that holds one node, judged as the planner judges it


class Verdict(StrEnum):
    ASKS = "asks"  # the rule calls for the move (a closed window, an operator's reclaim=now)
    ALLOWS = "allows"
    REFUSES = "refuses"
    SKIPPED = "skipped"  # the rule does not hold this move (an operator's lend=now skips it)


@dataclass(frozen=True, slots=True)
class RuleCheck:
    rule: Reason
    verdict: Verdict
    note: str


@dataclass(frozen=True, slots=True)
class NodeRules:
    """The rules on one node's next move: lending it (a serving node) or taking it back (a lent
    one), each judged on its own, as if it were the tick's first move; ``move`` None when no
    rule applies (``note`` says why)."""

    move: Action | None
    checks: tuple[RuleCheck, ...] = ()
    note: str = ""


def node_rules(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    node: model.NodeName,
    paused: bool = False,
    frozen: bool = False,
) -> NodeRules:
    """What ``rebalancer explain NODE`` lists: the same rule tables, limits and takers the
    planner uses (``_LEND_RULES``, ``_RECLAIM_RULES``, ``_limits``), every one evaluated rather
    than the first that refuses. A node of ``snapshot`` only."""
    pool = _observe(now, name, snapshot, policy, keys, paused, frozen)
    found = next((n for nodes in pool.by_phase.values() for n in nodes if n.name == node), None)
    if found is None:
        return NodeRules(None, note=f"not a node of pool {name}")
    if found.phase is Phase.SERVING:
        return NodeRules(Action.LEND, tuple(_lend_checks(pool, found)))
    if found.phase is Phase.LENT:
        return NodeRules(Action.RECLAIM, tuple(_reclaim_checks(pool, found)))
    return NodeRules(
        None,
        note=f"{found.phase.value}: in flight; the next tick carries it on (a lend in flight is "
        "rolled back) before any rule applies to it",
    )


_LEND_PASSES = {
    Reason.BAD_STATE: "its state keys can be read",
    Reason.BAD_OVERRIDE: "its overrides can be read",
    Reason.NODE_PAUSED: "not paused",
    Reason.LEND_NEVER: "not marked lend=never",
    Reason.OPERATOR_RECLAIM_NOW: "not marked reclaim=now",
    Reason.NOT_READY: "Ready",
    Reason.NOT_IDLE: "idle: no inference or other pods",
    Reason.OUTSIDE_WINDOW: "inside its window",
    Reason.COOLDOWN: "past its cooldown",
    Reason.WARMING: "not warming up",
}

_RECLAIM_NOTES = {
    Reason.IN_FLIGHT: ("not being lent", "still being lent"),
    Reason.NODE_PAUSED: ("not paused", "paused by an operator: nothing takes it back"),
    Reason.OPERATOR_LEND_NOW: ("not marked lend=now", "kept lent by lend=now"),
    Reason.MIN_LOAN_TIME: ("lent for its minimum loan", "lent for less than min_loan"),
}


def _lend_checks(pool: _Pool, node: _Node) -> Iterator[RuleCheck]:
    operator = node.overrides.lend is overrides.LendMode.NOW
    for reason, refuses, strategy_only in _LEND_RULES:
        if strategy_only and operator:
            yield RuleCheck(reason, Verdict.SKIPPED, "lend=now skips it")
        elif refuses(pool, node):
            yield RuleCheck(reason, Verdict.REFUSES, _LEND_EXCLUSIONS[reason])
        else:
            yield RuleCheck(reason, Verdict.ALLOWS, _LEND_PASSES[reason])
    if operator:
        why = "an operator asked to lend this node now"
        intent = Intent(pool.name, Action.LEND, 1, Origin.OPERATOR, Reason.OPERATOR_LEND_NOW, why)
    else:
        intent = Intent(pool.name, Action.LEND, 1, Origin.STRATEGY, Reason.STRATEGY, "")
    draft = _Draft(pool)
    yield from _limit_checks(draft, intent)
    if _to_takers(pool, intent):
        placed = takers.place(pool.takers, _lent_rooms(draft), [_room(pool, node, False)], 1)
        if placed.lend:
            yield RuleCheck(Reason.NO_TAKER, Verdict.ALLOWS, f"job {placed.lend[0][1]} would run")
        else:
            yield RuleCheck(Reason.NO_TAKER, Verdict.REFUSES, _why_no_taker(pool, placed))


def _reclaim_checks(pool: _Pool, node: _Node) -> Iterator[RuleCheck]:
    if node.problem is not None:
        yield RuleCheck(node.problem, Verdict.ASKS, _PROBLEMS[node.problem])
    asked = _operator_reclaim(pool, node)
    if asked is not None:
        yield RuleCheck(asked.reason, Verdict.ASKS, asked.message)
    elif pool.is_open(node):
        yield RuleCheck(
            Reason.WINDOW_CLOSED, Verdict.ALLOWS, "its window is open: it may stay lent"
        )
    for reason, refuses, strategy_only in _RECLAIM_RULES:
        passed, refused = _RECLAIM_NOTES[reason]
        if refuses(pool, node):
            who = " (holds against the strategy only)" if strategy_only else ""
            yield RuleCheck(reason, Verdict.REFUSES, refused + who)
        else:
            yield RuleCheck(reason, Verdict.ALLOWS, passed)
    intent = Intent(pool.name, Action.RECLAIM, 1, Origin.STRATEGY, Reason.STRATEGY, "")
    yield from _limit_checks(_Draft(pool), intent)


def _limit_checks(draft: _Draft, intent: Intent) -> Iterator[RuleCheck]:
    """Each pool rule that bounds ``intent``, and what it leaves (one more step, or none)."""
    for limit in _limits(draft, intent):
        if limit.cap >= 1:
            yield RuleCheck(limit.reason, Verdict.ALLOWS, f"{limit.message}: room for {limit.cap}")
        else:
            yield RuleCheck(limit.reason, Verdict.REFUSES, limit.message)
