"""The planner: the safety rules no strategy can bypass.

Where it sits: ``observe -> strategy.decide -> planning.make_plan -> actuator.apply -> audit``.
It takes the Snapshot, one Proposal per pool and the pools' policies, and answers with a Plan:
the intents it considered, the steps to carry out and, for every intent or part of one it
refused, a Rejection with a reason code and a sentence. Nothing is ever refused silently:
for each intent, the nodes in its steps plus the counts in its rejections equal its count.

The rules (DESIGN section 4, decisions in ``docs/design/safety-rules.md``):

- pause: a global or pool pause, or a node's ``paused`` override, freezes the node(s) as they are;
- metrics: a missing or stale demand sample stops all lending; past the grace period every lent
  node is reclaimed. A missing sample is never read as zero load. Requests queueing beyond
  ``queue_limit`` stop lending too: serving is already short;
- capacity: never lend below ``min_serving``, below what demand needs with ``headroom``, or above
  ``max_lent_fraction`` of the pool; when demand rises above what serves, reclaim at once;
- only idle, ready nodes are lent: no inference pods, nothing but DaemonSets and borrowed pods;
- windows: outside its window (the pool's, or the node's override) a node is not lent, and a lent
  node is taken back;
- churn: a node is not lent again within ``cooldown`` of coming back; a strategy may not take a
  node back within ``min_loan``; strategy lends and reclaims are limited per tick.

Reclaims that protect inference (demand above serving, metrics lost, operator ``reclaim=now``,
window closed) ignore ``min_loan`` and the per-tick limit: inference comes first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from rebalancer.core import model, nodestate, overrides, windows
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.policy import PoolPolicy


def make_plan(
    snapshot: model.Snapshot,
    proposals: Mapping[model.PoolName, model.Proposal],
    policies: Mapping[model.PoolName, PoolPolicy],
    keys: nodestate.Keys,
    paused_pools: Iterable[model.PoolName] = (),
) -> model.Plan:
    paused = set(paused_pools)
    plans = {}
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
        )
    return model.Plan(now=snapshot.now, pools=plans)


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
    phase: nodestate.Phase
    overrides: overrides.Overrides
    window: windows.Window | None  # the node's own window override; None: the pool's


@dataclass(frozen=True, slots=True)
class _Decoded:
    node: _Node | None  # None when the node's state cannot be read
    findings: tuple[model.Finding, ...]


@dataclass
class _Pool:
    """Working state of one pool while its intents are decided."""

    name: model.PoolName
    now: datetime
    policy: PoolPolicy
    nodes: list[_Node]
    by_phase: dict[nodestate.Phase, list[_Node]]
    unreadable: int  # nodes whose state could not be read: neither serving nor lendable
    not_ready: int  # serving nodes that are NotReady: no capacity, not lendable
    findings: list[model.Finding]
    health: Health
    health_note: str
    need: int | None  # nodes demand needs now; None when demand is unknown
    queue: float | None  # requests waiting, from a fresh sample; None when unknown
    intents: list[Intent] = field(default_factory=list)
    steps: list[model.Step] = field(default_factory=list)
    rejections: list[model.Rejection] = field(default_factory=list)
    changed: set[model.NodeName] = field(default_factory=set)
    budget: int = 0
    paused: bool = False  # a global or pool pause: every intent is refused
    lends: int = 0
    reclaims: int = 0
    _open: dict[int, bool] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.nodes) + self.unreadable

    def in_phase(self, *phases: nodestate.Phase) -> list[_Node]:
        """Nodes in ``phases`` that no step of this tick has touched yet."""
        return [n for phase in phases for n in self.by_phase[phase] if n.name not in self.changed]

    def count(self, *phases: nodestate.Phase) -> int:
        return sum(len(self.by_phase[phase]) for phase in phases)

    @property
    def lent_count(self) -> int:
        """Nodes lent or being lent after the steps decided so far."""
        return (
            self.count(nodestate.Phase.LENT, nodestate.Phase.LENDING) + self.lends - self.reclaims
        )

    @property
    def serving_count(self) -> int:
        """Ready serving nodes after the steps decided so far: a NotReady node serves nothing."""
        return self.count(nodestate.Phase.SERVING) - self.not_ready - self.lends

    def window_of(self, node: _Node) -> windows.Window:
        return node.window or self.policy.window

    def is_open(self, window: windows.Window) -> bool:
        """Whether ``window`` is open now; each window is evaluated once per tick."""
        known = self._open.get(id(window))
        if known is None:
            known = self._open[id(window)] = window.is_open(self.now)
        return known

    def intend(self, intent: Intent) -> Intent:
        self.intents.append(intent)
        return intent

    def step(self, intent: Intent, node: _Node, urgent: bool = False) -> None:
        self.steps.append(
            model.Step(
                pool=self.name,
                node=node.name,
                action=intent.action,
                reason=intent.reason,
                message=intent.message,
                intent=intent,
                urgent=urgent,
            )
        )
        self.changed.add(node.name)
        if intent.action is Action.LEND:
            self.lends += 1
        else:
            self.reclaims += 1

    def refuse_if_paused(self, intent: Intent) -> bool:
        if self.paused:
            self.reject(intent, Reason.PAUSED, "the pool is paused", intent.count, intent.node)
        return self.paused

    def reject(
        self,
        intent: Intent,
        reason: Reason,
        message: str,
        count: int,
        node: model.NodeName | None = None,
    ) -> None:
        if count > 0:
            self.rejections.append(model.Rejection(intent, reason, message, count, node))


def plan_pool(
    now: datetime,
    name: model.PoolName,
    pool: model.PoolSnapshot,
    proposal: model.Proposal | None,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool = False,
) -> model.PoolPlan:
    work = _observe(now, name, pool, policy, keys)
    work.paused = paused  # every intent is still formed, and refused: nothing is silent
    _operator_intents(work)
    _safety_intents(work)
    _strategy_intent(work, proposal)
    return model.PoolPlan(
        pool=name,
        intents=tuple(work.intents),
        steps=tuple(work.steps),
        rejections=tuple(work.rejections),
        findings=tuple(work.findings),
        summary=_summary(work, proposal),
    )


# ---------------------------------------------------------------------------------------------
# Observe: decode every node once, judge the metrics.


def _observe(
    now: datetime,
    name: model.PoolName,
    pool: model.PoolSnapshot,
    policy: PoolPolicy,
    keys: nodestate.Keys,
) -> _Pool:
    nodes: list[_Node] = []
    by_phase: dict[nodestate.Phase, list[_Node]] = {phase: [] for phase in nodestate.Phase}
    findings: list[model.Finding] = []
    unreadable = 0
    memo_key = ("planning", keys.prefix, policy.zone)
    for view in pool.nodes:
        decoded = view.memo.get(memo_key)
        if not isinstance(decoded, _Decoded):
            decoded = view.memo[memo_key] = _decode(view, keys, policy.zone)
        if decoded.findings:
            findings.extend(decoded.findings)
        node = decoded.node
        if node is None:
            unreadable += 1
            continue
        if node.overrides.until is not None and now >= node.overrides.until:
            node = _Node(node.view, node.name, node.state, node.phase, overrides.NONE, None)
        nodes.append(node)
        by_phase[node.phase].append(node)
    # A rate that is not a finite number >= 0 is no sample: never read as a load, and never
    # handed to ``need``, which cannot round NaN or infinity.
    demand = pool.demand
    if demand is not None and not (math.isfinite(demand.value) and demand.value >= 0):
        demand = None
    health, note = _health(now, demand, policy)
    if demand is None and pool.demand is not None:
        note = f"demand sample {pool.demand.value} is not a rate"
    need = policy.need(demand.value) if demand is not None else None
    queue = pool.queue.value if pool.queue and pool.queue.age(now) <= policy.staleness else None
    not_ready = sum(1 for n in by_phase[nodestate.Phase.SERVING] if not n.view.ready)
    work = _Pool(
        name,
        now,
        policy,
        nodes,
        by_phase,
        unreadable,
        not_ready,
        findings,
        health,
        note,
        need,
        queue,
    )
    work.budget = policy.step_budget(work.size)
    return work


def _decode(view: model.NodeView, keys: nodestate.Keys, zone: str) -> _Decoded:
    """Everything about a node that depends only on its metadata: computed once per version."""
    state = nodestate.read(view, keys)
    parsed = overrides.parse(view.annotations, keys, zone)
    findings = [
        model.Finding(view.name, p.key, p.value, Reason.BAD_OVERRIDE, str(p))
        for p in parsed.problems
    ]
    if isinstance(state, nodestate.StateError):
        findings.append(
            model.Finding(
                view.name,
                state.key,
                state.value,
                Reason.BAD_STATE,
                f"{state}; the node is left as it is until someone fixes it",
            )
        )
        return _Decoded(None, tuple(findings))
    ov = parsed.overrides
    node = _Node(view, view.name, state, state.phase, ov, ov.window)
    return _Decoded(node, tuple(findings))


def _health(now: datetime, demand: model.Sample | None, policy: PoolPolicy) -> tuple[Health, str]:
    if not policy.guarded:
        return Health.FRESH, "metrics not checked"
    if demand is None:
        return Health.LOST, "no demand sample"
    age = demand.age(now)
    if age <= policy.staleness:
        return Health.FRESH, f"demand sample {age.total_seconds():.0f}s old"
    seconds = age.total_seconds()
    if age <= policy.staleness + policy.stale_grace:
        return Health.STALE, f"demand sample {seconds:.0f}s old (limit {policy.staleness})"
    return Health.LOST, f"demand sample {seconds:.0f}s old, past the grace period"


# ---------------------------------------------------------------------------------------------
# Intents, in order of precedence: operators, safety, then the strategy.


def _operator_intents(work: _Pool) -> None:
    """Per-node overrides and window edges: each is an intent of its own, about one node."""
    pool_open = work.is_open(work.policy.window)
    for node in work.in_phase(nodestate.Phase.LENT):
        ov = node.overrides
        if ov is overrides.NONE and pool_open:
            continue  # the common case, decided without looking further
        window = work.window_of(node)
        if ov.reclaim_now or ov.lend is overrides.LendMode.NEVER:
            reason = Reason.OPERATOR_RECLAIM_NOW if ov.reclaim_now else Reason.OPERATOR_NEVER
            _reclaim_node(work, node, Origin.OPERATOR, reason, "an operator asked for it")
        elif ov.lend is not overrides.LendMode.NOW and not work.is_open(window):
            _reclaim_node(work, node, Origin.SCHEDULE, Reason.WINDOW_CLOSED, f"window {window}")
    for node in work.in_phase(nodestate.Phase.SERVING):
        if node.overrides.lend is overrides.LendMode.NOW:
            intent = work.intend(
                Intent(
                    work.name,
                    Action.LEND,
                    1,
                    Origin.OPERATOR,
                    Reason.OPERATOR_LEND_NOW,
                    "an operator asked to lend this node now",
                    node=node.name,
                )
            )
            _grant_lends(work, intent, [node], limited=False)


def _reclaim_node(work: _Pool, node: _Node, origin: Origin, reason: Reason, why: str) -> None:
    intent = work.intend(Intent(work.name, Action.RECLAIM, 1, origin, reason, why, node=node.name))
    if work.refuse_if_paused(intent):
        return
    if node.overrides.paused:
        work.reject(intent, Reason.NODE_PAUSED, "the node is paused by an operator", 1, node.name)
    else:
        work.step(intent, node, urgent=True)


def _safety_intents(work: _Pool) -> None:
    if not work.policy.guarded:
        return  # a baseline shows its own rule: nothing protects it from itself
    if work.health is Health.LOST:
        count = work.count(nodestate.Phase.LENT) - work.reclaims
        if count:
            intent = work.intend(
                Intent(
                    work.name,
                    Action.RECLAIM,
                    count,
                    Origin.SAFETY,
                    Reason.METRICS_LOST,
                    f"demand is unknown ({work.health_note}): inference comes first",
                )
            )
            _grant_reclaims(work, intent, limited=False)
        return
    if work.need is None:
        return
    # Nodes already on their way back count: they will serve again.
    returning = work.count(nodestate.Phase.RECLAIMING) + work.reclaims
    shortfall = work.need - (work.serving_count + returning)
    if shortfall > 0 and work.lent_count > 0:
        intent = work.intend(
            Intent(
                work.name,
                Action.RECLAIM,
                min(shortfall, work.lent_count),
                Origin.SAFETY,
                Reason.DEMAND_ABOVE_SERVING,
                f"demand needs {work.need} serving nodes, {work.serving_count + returning} "
                "serve or are returning",
            )
        )
        _grant_reclaims(work, intent, limited=False)


def _strategy_intent(work: _Pool, proposal: model.Proposal | None) -> None:
    if proposal is None:
        return
    delta = proposal.lend_target - work.lent_count
    if delta > 0:
        intent = work.intend(
            Intent(work.name, Action.LEND, delta, Origin.STRATEGY, Reason.STRATEGY, proposal.reason)
        )
        _lend_for_strategy(work, intent)
    elif delta < 0:
        intent = work.intend(
            Intent(
                work.name, Action.RECLAIM, -delta, Origin.STRATEGY, Reason.STRATEGY, proposal.reason
            )
        )
        _grant_reclaims(work, intent, limited=True)


# ---------------------------------------------------------------------------------------------
# Granting: which nodes, within which limits.


def _lend_for_strategy(work: _Pool, intent: Intent) -> None:
    wanted = intent.count
    # lend=now nodes had their own intent; lend=never ones are candidates only to be refused
    # with their own reason (not "no serving node is left").
    candidates = [
        n
        for n in work.in_phase(nodestate.Phase.SERVING)
        if n.overrides.lend is not overrides.LendMode.NOW
    ]
    _grant_lends(work, intent, candidates, limited=True, wanted=wanted)


def _grant_lends(
    work: _Pool,
    intent: Intent,
    candidates: list[_Node],
    limited: bool,
    wanted: int | None = None,
) -> None:
    wanted = intent.count if wanted is None else wanted
    if work.refuse_if_paused(intent):
        return
    blocked = _lend_blocked(work)
    if blocked is not None:
        work.reject(intent, blocked[0], blocked[1], wanted, intent.node)
        return
    room, limit_reason, limit_note = _lend_room(work)
    granted = min(wanted, room)
    work.reject(intent, limit_reason, limit_note, wanted - granted, intent.node)
    if limited:
        granted = _within_budget(work, intent, granted)
    eligible, excluded = _eligible(work, candidates, operator=not limited)
    chosen = sorted(eligible, key=lambda n: (len(n.view.pods), n.name))[:granted]
    for node in chosen:
        work.step(intent, node)
    if limited:
        work.budget -= len(chosen)
    missing = granted - len(chosen)
    if missing > 0:
        reason, note = _why_no_candidate(excluded)
        work.reject(intent, reason, note, missing, intent.node)


def _within_budget(work: _Pool, intent: Intent, wanted: int) -> int:
    """What this tick's per-tick limit still allows of ``wanted``; the rest is refused."""
    allowed = min(wanted, work.budget)
    work.reject(
        intent,
        Reason.RATE_LIMIT,
        f"at most {work.policy.step_budget(work.size)} strategy changes per tick",
        wanted - allowed,
    )
    return allowed


def _lend_blocked(work: _Pool) -> tuple[Reason, str] | None:
    if work.health is not Health.FRESH:
        reason = Reason.METRICS_STALE if work.health is Health.STALE else Reason.METRICS_MISSING
        return reason, f"no lending while demand is unknown ({work.health_note})"
    if work.policy.guarded and work.queue is not None and work.queue > work.policy.queue_limit:
        return (
            Reason.QUEUE_BUILDING,
            f"{work.queue:.0f} requests wait (limit {work.policy.queue_limit:.0f}): "
            "serving is short already",
        )
    return None


def _lend_room(work: _Pool) -> tuple[int, Reason, str]:
    """How many more nodes may be lent, and the rule that sets that number."""
    size, policy = work.size, work.policy
    # Nodes whose state cannot be read, and NotReady serving nodes, carry no load.
    usable = len(work.nodes) - work.not_ready
    lent = work.lent_count
    limits = [(usable - policy.min_serving, Reason.MIN_SERVING, f"{policy.min_serving} must serve")]
    if policy.guarded:
        limits.append(
            (
                math.floor(policy.max_lent_fraction * size + 1e-9),
                Reason.MAX_FRACTION,
                f"at most {policy.max_lent_fraction:.0%} of {size} nodes may be lent",
            )
        )
        if work.need is not None:
            # Reclaiming nodes will serve again soon: they count as serving capacity.
            limits.append(
                (
                    usable - work.need,
                    Reason.HEADROOM,
                    f"demand needs {work.need} of {size} nodes with {policy.headroom:.0%} headroom",
                )
            )
    cap, reason, note = min(limits, key=lambda item: item[0])
    if work.not_ready and reason in (Reason.MIN_SERVING, Reason.HEADROOM):
        reason = Reason.NOT_READY
        note = f"{work.not_ready} serving nodes are not ready and carry no load; {note}"
    return max(0, cap - lent), reason, note


def _eligible(
    work: _Pool, candidates: list[_Node], operator: bool
) -> tuple[list[_Node], Counter[Reason]]:
    """Nodes that may be lent now. An operator's ``lend=now`` skips the window and cooldown."""
    eligible, excluded = [], Counter[Reason]()
    cooldown = work.policy.cooldown
    for node in candidates:
        if node.overrides.paused:
            excluded[Reason.NODE_PAUSED] += 1
        elif node.overrides.lend is overrides.LendMode.NEVER:
            excluded[Reason.LEND_NEVER] += 1
        elif not node.view.ready:
            excluded[Reason.NOT_READY] += 1
        elif not node.view.idle:
            excluded[Reason.NOT_IDLE] += 1
        elif not operator and not work.is_open(work.window_of(node)):
            excluded[Reason.OUTSIDE_WINDOW] += 1
        elif not operator and node.state.since and work.now - node.state.since < cooldown:
            excluded[Reason.COOLDOWN] += 1
        else:
            eligible.append(node)
    return eligible, excluded


_EXCLUSION_WORDS = {
    Reason.NODE_PAUSED: "paused",
    Reason.LEND_NEVER: "marked lend=never",
    Reason.NOT_READY: "not ready",
    Reason.NOT_IDLE: "running inference or other pods",
    Reason.OUTSIDE_WINDOW: "outside their window",
    Reason.COOLDOWN: "in cooldown after a reclaim",
}


def _why_no_candidate(excluded: Counter[Reason]) -> tuple[Reason, str]:
    if not excluded:
        return Reason.NO_CANDIDATE, "no serving node is left to lend"
    reason = excluded.most_common(1)[0][0]
    parts = ", ".join(f"{count} {_EXCLUSION_WORDS[r]}" for r, count in excluded.most_common())
    return reason, f"not enough idle serving nodes: {parts}"


def _grant_reclaims(work: _Pool, intent: Intent, limited: bool) -> None:
    if work.refuse_if_paused(intent):
        return
    lent = work.in_phase(nodestate.Phase.LENT)
    in_flight = work.count(nodestate.Phase.LENDING)
    eligible, paused, pinned, young = [], 0, 0, 0
    for node in lent:
        if node.overrides.paused:
            paused += 1
        elif limited and node.overrides.lend is overrides.LendMode.NOW:
            # The operator outranks the strategy: taking the node back would only have it lent
            # again (lend=now skips the cooldown) as soon as it returns, a loop that preempts
            # the training on it every few minutes.
            pinned += 1
        elif limited and _loan_too_young(work, node):
            young += 1
        else:
            eligible.append(node)
    wanted = intent.count
    if limited:
        wanted = _within_budget(work, intent, wanted)
    chosen = sorted(eligible, key=_reclaim_cost)[:wanted]
    for node in chosen:
        work.step(intent, node, urgent=not limited)
    if limited:
        work.budget -= len(chosen)
    missing = wanted - len(chosen)
    for reason, count, note in (
        (Reason.MIN_LOAN_TIME, young, f"lent less than {work.policy.min_loan} ago"),
        (Reason.NODE_PAUSED, paused, "paused by an operator"),
        (Reason.OPERATOR_LEND_NOW, pinned, "kept lent by an operator (lend=now)"),
        (Reason.IN_FLIGHT, in_flight, "still being lent; finished or rolled back first"),
    ):
        refused = min(missing, count)
        work.reject(intent, reason, note, refused)
        missing -= refused
    work.reject(intent, Reason.NO_CANDIDATE, "no lent node is left to reclaim", missing)


def _loan_too_young(work: _Pool, node: _Node) -> bool:
    since = node.state.since
    return since is not None and work.now - since < work.policy.min_loan


def _reclaim_cost(node: _Node) -> tuple[int, int, str]:
    """Cheapest first: fewest training jobs preempted, then fewest pods."""
    borrowed = node.view.borrowed_pods
    jobs = {p.job or f"{p.namespace}/{p.name}" for p in borrowed}
    return len(jobs), len(borrowed), node.name


def _summary(work: _Pool, proposal: model.Proposal | None) -> str:
    need = "unknown" if work.need is None else str(work.need)
    target = "-" if proposal is None else str(proposal.lend_target)
    counts = ", ".join(
        f"{len(nodes)} {phase.value}" for phase, nodes in work.by_phase.items() if nodes
    )
    return (
        f"pool {work.name}: {counts}; need {need}; target {target}; "
        f"{len(work.steps)} steps, {len(work.rejections)} refusals"
    )
