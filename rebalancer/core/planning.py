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

from rebalancer.core import demand as demand_module
from rebalancer.core import model, nodestate, overrides, warmth, windows
from rebalancer.core.model import Action, Intent, Origin, Reason
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
        )
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
    unreadable: bool = False  # an override could not be read: fail closed, never lend it


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
    warming: frozenset[model.NodeName]  # serving, Ready, not warm yet: capacity soon, not now
    findings: list[model.Finding]
    health: Health
    health_note: str
    need: int | None  # nodes demand needs now; None when demand is unknown
    queue: float | None  # requests waiting, from a fresh sample; None when unknown
    held: model.DropHeld | None = None  # an implausible fall of demand, not believed yet
    intents: list[Intent] = field(default_factory=list)
    steps: list[model.Step] = field(default_factory=list)
    rejections: list[model.Rejection] = field(default_factory=list)
    changed: set[model.NodeName] = field(default_factory=set)
    budget: int = 0
    paused: bool = False  # a global or pool pause: lending and non-safety moves are refused
    frozen: bool = False  # a global or pool freeze: every intent is refused
    lends: int = 0
    cold_lends: int = 0  # lends of warming nodes: they took no warm capacity away
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
        """Warm serving nodes after the steps decided so far: a NotReady node serves nothing,
        and a node back from a loan serves once its inference is warm (``core.warmth``)."""
        warm = self.count(nodestate.Phase.SERVING) - self.not_ready - len(self.warming)
        return warm - (self.lends - self.cold_lends)

    @property
    def returning(self) -> int:
        """Nodes on their way back to serving: reclaiming, warming up, or reclaimed this tick."""
        warming = len(self.warming) - self.cold_lends
        return self.count(nodestate.Phase.RECLAIMING) + warming + self.reclaims

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
            self.cold_lends += node.name in self.warming
        else:
            self.reclaims += 1

    def refuse_if_paused(self, intent: Intent) -> bool:
        """A freeze refuses everything. A pause refuses lending and the moves that are not
        about keeping inference served: a safety reclaim, or one an operator asked for on a
        node, still happens."""
        if self.frozen:
            why = "the pool is frozen: nothing moves, not even safety reclaims"
            self.reject(intent, Reason.FROZEN, why, intent.count, intent.node)
            return True
        protects = intent.action is Action.RECLAIM and intent.origin in (
            Origin.SAFETY,
            Origin.OPERATOR,
        )
        if self.paused and not protects:
            self.reject(intent, Reason.PAUSED, "the pool is paused", intent.count, intent.node)
            return True
        return False

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
    frozen: bool = False,
) -> model.PoolPlan:
    work = _observe(now, name, pool, policy, keys)
    # Every intent is still formed, and refused: nothing is silent.
    work.paused, work.frozen = paused, frozen
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
    demand = demand_module.usable(pool.demand)
    health, note = _health(now, pool, demand, policy)
    if demand is None and pool.demand is not None:
        note = f"demand sample {pool.demand.value} is not a rate"
    need = policy.need(demand.value) if demand is not None else None
    queue = pool.queue.value if pool.queue and pool.queue.age(now) <= policy.staleness else None
    serving = by_phase[nodestate.Phase.SERVING]
    not_ready = sum(1 for n in serving if not n.view.ready)
    warming = frozenset(
        n.name
        for n in serving
        if n.view.ready and not warmth.is_warm(n.view, n.state, now, policy.warmup)
    )
    work = _Pool(
        name,
        now,
        policy,
        nodes,
        by_phase,
        unreadable,
        not_ready,
        warming,
        findings,
        health,
        note,
        need,
        queue,
        held=pool.held if Guard.DEMAND_DROP_HOLD in policy.guards else None,
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
    # Fail closed: an override that cannot be read may have been meant to protect the node.
    node = _Node(view, view.name, state, state.phase, ov, ov.window, bool(parsed.problems))
    return _Decoded(node, tuple(findings))


def _health(
    now: datetime, pool: model.PoolSnapshot, demand: model.Sample | None, policy: PoolPolicy
) -> tuple[Health, str]:
    """Unreachable, empty, NaN and old all mean one thing: demand is unknown since the last
    good sample (or since the controller started, before any). No lending at once; past
    ``staleness + stale_grace`` since then, everything lent is reclaimed."""
    if Guard.METRICS not in policy.guards:
        return Health.FRESH, "metrics not checked"
    since = demand.at if demand is not None else pool.unknown_since
    if since is None:
        return Health.LOST, "no demand sample"
    age = now - since
    seconds = age.total_seconds()
    what = "the last good demand sample" if demand is not None else "the start, with no sample"
    if pool.demand_known and demand is not None and age <= policy.staleness:
        return Health.FRESH, f"demand sample {seconds:.0f}s old"
    if age <= policy.staleness + policy.stale_grace:
        unknown = "unknown now" if not pool.demand_known else f"older than {policy.staleness}"
        return Health.STALE, f"demand {unknown}; {seconds:.0f}s since {what}"
    return Health.LOST, f"demand unknown {seconds:.0f}s since {what}, past the grace period"


# ---------------------------------------------------------------------------------------------
# Intents, in order of precedence: operators, safety, then the strategy.


def _operator_intents(work: _Pool) -> None:
    """Per-node overrides and window edges: each is an intent of its own, about one node."""
    pool_open = work.is_open(work.policy.window)
    for node in work.in_phase(nodestate.Phase.LENT):
        ov = node.overrides
        if ov is overrides.NONE and pool_open and not node.unreadable:
            continue  # the common case, decided without looking further
        window = work.window_of(node)
        if ov.reclaim_now or ov.lend is overrides.LendMode.NEVER:
            reason = Reason.OPERATOR_RECLAIM_NOW if ov.reclaim_now else Reason.OPERATOR_NEVER
            _reclaim_node(work, node, Origin.OPERATOR, reason, "an operator asked for it")
        elif node.unreadable:
            why = "an override on the node cannot be read; it may have meant to keep it serving"
            _reclaim_node(work, node, Origin.OPERATOR, Reason.BAD_OVERRIDE_RECLAIM, why)
        elif ov.lend is not overrides.LendMode.NOW and not work.is_open(window):
            _reclaim_node(work, node, Origin.SCHEDULE, Reason.WINDOW_CLOSED, f"window {window}")
    for node in work.in_phase(nodestate.Phase.SERVING):
        if node.overrides.lend is overrides.LendMode.NOW and not node.unreadable:
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
    guards = work.policy.guards
    if work.health is Health.LOST:
        count = work.count(nodestate.Phase.LENT) - work.reclaims
        why = f"demand is unknown ({work.health_note}): inference comes first"
        _safety_reclaim(work, count, Reason.METRICS_LOST, why)
        return
    if work.need is not None and Guard.DEMAND_ABOVE_SERVING in guards:
        _reclaim_for_demand(work, work.need)
    if work.policy.queue_reclaims and Guard.QUEUE_LIMIT in guards:
        _reclaim_for_queue(work)


def _reclaim_for_demand(work: _Pool, need: int) -> None:
    # Nodes already on their way back count: they will serve again.
    covered = work.serving_count + work.returning
    why = f"demand needs {need} serving nodes, {covered} serve or are returning"
    _safety_reclaim(work, min(need - covered, work.lent_count), Reason.DEMAND_ABOVE_SERVING, why)


def _reclaim_for_queue(work: _Pool) -> None:
    """Requests waiting beyond the limit: serving is short now, whatever the rate says (a rate
    lags, and under-reads a series younger than its window; a queue does not). Take back
    enough nodes to clear the backlog within a minute, counting those already on their way
    back, warming ones included."""
    queue, limit = work.queue, work.policy.queue_limit
    if queue is None or queue <= limit or work.lent_count <= 0:
        return
    backlog = max(1, math.ceil(queue / (work.policy.rps_per_node * 60)))
    why = (
        f"{queue:.0f} requests wait (limit {limit:.0f}): {backlog} nodes clear them within "
        f"a minute, {work.returning} are on their way back"
    )
    _safety_reclaim(
        work, min(backlog - work.returning, work.lent_count), Reason.QUEUE_ABOVE_LIMIT, why
    )


def _safety_reclaim(work: _Pool, count: int, reason: Reason, why: str) -> None:
    """Take ``count`` lent nodes back to keep inference served: no churn limit applies."""
    if count > 0:
        intent = work.intend(Intent(work.name, Action.RECLAIM, count, Origin.SAFETY, reason, why))
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
    if work.held is not None:
        held = work.held
        return (
            Reason.DEMAND_DROP_HELD,
            f"demand fell from {held.level.value:.4g} to {held.seen.value:.4g} rps faster than "
            f"traffic falls; not believed until it lasts {work.policy.drop_hold} "
            f"(since {held.since.isoformat()})",
        )
    queue_limited = Guard.QUEUE_LIMIT in work.policy.guards
    if queue_limited and work.queue is not None and work.queue > work.policy.queue_limit:
        return (
            Reason.QUEUE_BUILDING,
            f"{work.queue:.0f} requests wait (limit {work.policy.queue_limit:.0f}): "
            "serving is short already",
        )
    return None


def _lend_room(work: _Pool) -> tuple[int, Reason, str]:
    """How many more nodes may be lent, and the rule that sets that number.

    Only warm serving nodes are capacity to lend from: a node still reclaiming or warming up
    will serve soon but does not now, and lending against it is how a rise breaches (the
    node lent in its place leaves serving short until the returning one is warm)."""
    size, policy = work.size, work.policy
    serving = work.serving_count
    limits = [
        (serving - policy.min_serving, Reason.MIN_SERVING, f"{policy.min_serving} must serve")
    ]
    if Guard.MAX_LENT_FRACTION in policy.guards:
        limits.append(
            (
                math.floor(policy.max_lent_fraction * size + 1e-9) - work.lent_count,
                Reason.MAX_FRACTION,
                f"at most {policy.max_lent_fraction:.0%} of {size} nodes may be lent",
            )
        )
    if Guard.HEADROOM in policy.guards and work.need is not None:
        limits.append(
            (
                serving - work.need,
                Reason.HEADROOM,
                f"demand needs {work.need} of {size} nodes with {policy.headroom:.0%} headroom",
            )
        )
    room, reason, note = min(limits, key=lambda item: item[0])
    if reason in (Reason.MIN_SERVING, Reason.HEADROOM):
        cold = []
        if work.not_ready:
            cold.append(f"{work.not_ready} serving nodes are not ready")
        returning = work.count(nodestate.Phase.RECLAIMING) + len(work.warming)
        if returning:
            cold.append(f"{returning} are on their way back and not warm yet")
        if cold:
            reason = Reason.NOT_READY if work.not_ready else Reason.WARMING
            note = f"{'; '.join(cold)}, so they carry no load; {note}"
    return max(0, room), reason, note


def _eligible(
    work: _Pool, candidates: list[_Node], operator: bool
) -> tuple[list[_Node], Counter[Reason]]:
    """Nodes that may be lent now. An operator's ``lend=now`` skips the window and cooldown."""
    eligible, excluded = [], Counter[Reason]()
    cooldown = work.policy.cooldown
    for node in candidates:
        if node.unreadable:
            excluded[Reason.BAD_OVERRIDE] += 1
        elif node.overrides.paused:
            excluded[Reason.NODE_PAUSED] += 1
        elif node.overrides.lend is overrides.LendMode.NEVER:
            excluded[Reason.LEND_NEVER] += 1
        elif node.overrides.reclaim_now:
            excluded[Reason.OPERATOR_RECLAIM_NOW] += 1
        elif not node.view.ready:
            excluded[Reason.NOT_READY] += 1
        elif not node.view.idle:
            excluded[Reason.NOT_IDLE] += 1
        elif not operator and not work.is_open(work.window_of(node)):
            excluded[Reason.OUTSIDE_WINDOW] += 1
        elif not operator and node.state.since and work.now - node.state.since < cooldown:
            excluded[Reason.COOLDOWN] += 1
        elif not operator and node.name in work.warming:
            excluded[Reason.WARMING] += 1  # on its way back: lending it again is churn
        else:
            eligible.append(node)
    return eligible, excluded


_EXCLUSION_WORDS = {
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
