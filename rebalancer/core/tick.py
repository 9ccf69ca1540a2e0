"""One tick's decision, from the strategies' answers to the plan: the same function for the
controller, the simulator and the demo, and the only way to plan (``core.planning`` plans one
pool at a time, for this module).

Where it sits: ``observe -> (each strategy answers) -> plan_tick -> audit -> apply``. Calling a
strategy is the caller's business (the controller runs each in a thread with a time limit; the
simulator calls it in line), and so is what a failure means over time (the controller audits an
episode once when it starts and once when it ends). What is decided here, and only here:

- a strategy's answer is checked, never trusted: one that raised, overran or is not a valid
  ``Proposal`` is replaced, for that pool and tick only, by the safety-only proposal (hold what
  is lent: no new loans, and every safety rule still reclaims);
- each pool is planned on its own (``planning.plan_pool``): a planner failure in one pool is
  that pool's only. It is planned again with the safety-only proposal; if that fails too, nothing
  of the pool moves this tick;
- a pending job is lent for by one pool only: the jobs a pool planned before has room for, on
  nodes it lends now or lent already (``PoolPlan.served``), are handed to the pools planned after
  it, which lend nothing more for them (``core.takers``). Pools are planned in their configured
  order, so the first pool that can take a job is the one that lends for it.

Pure: time, state and answers are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from rebalancer.core import model, nodestate, planning
from rebalancer.core.model import NodeName, PoolName
from rebalancer.core.nodestate import Phase
from rebalancer.core.policy import PoolPolicy


class Stage(StrEnum):
    """Which part of a tick failed for a pool."""

    STRATEGY = "strategy"
    PLANNER = "planner"


class FailureKind(StrEnum):
    RAISED = "raised"
    INVALID = "invalid"  # answered something that is not a usable Proposal
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    message: str
    error: str = ""  # the exception's type, when it raised

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

    @staticmethod
    def raised(exc: BaseException) -> Failure:
        return Failure(FailureKind.RAISED, f"{type(exc).__name__}: {exc}", type(exc).__name__)


# What a strategy gave back, not yet checked: a Proposal, a Failure of the call, or anything a
# buggy strategy may return. ``plan_tick`` checks it (``_checked``) before the planner sees it;
# the name says what the type cannot: nothing here is trusted.
Unchecked = object


@dataclass(frozen=True)
class PoolControls:
    """What the planner needs to know of a pool besides its snapshot."""

    policy: PoolPolicy
    paused: bool = False
    frozen: bool = False


@dataclass(frozen=True)
class Decision:
    plan: model.Plan
    proposals: Mapping[PoolName, model.Proposal]  # what each pool was planned with
    failures: Mapping[tuple[PoolName, Stage], Failure] = field(default_factory=dict)


def plan_tick(
    snapshot: model.Snapshot,
    answers: Mapping[PoolName, Unchecked],
    pools: Mapping[PoolName, PoolControls],
    keys: nodestate.Keys,
) -> Decision:
    """Plan every pool of ``pools`` from its snapshot and its strategy's answer.

    A pool with no entry in ``answers`` asked no strategy this tick: it is planned on the
    operators' and the safety rules alone (the tests of those rules plan so), and has no entry
    in ``Decision.proposals``. An answer of ``None`` is an answer, and an invalid one."""
    plans: dict[PoolName, model.PoolPlan] = {}
    proposals: dict[PoolName, model.Proposal] = {}
    failures: dict[tuple[PoolName, Stage], Failure] = {}
    served: set[str] = set()  # jobs a pool planned before has room for: not lent for twice
    for name, controls in pools.items():
        seen = snapshot.pools[name]
        answer = _checked(answers[name], len(seen.nodes)) if name in answers else None
        if isinstance(answer, Failure):
            failures[(name, Stage.STRATEGY)] = answer
        try:
            proposal = answer
            if isinstance(proposal, Failure):
                proposal = _holding(seen, keys, controls, f"the strategy failed ({proposal})")
            if proposal is not None:
                proposals[name] = proposal
            plans[name] = _plan(snapshot, name, controls, proposal, keys, frozenset(served))
            served.update(plans[name].served)
            continue
        except Exception as exc:
            failure = Failure.raised(exc)
            failures[(name, Stage.PLANNER)] = failure
        try:
            fallback = _holding(seen, keys, controls, f"the planner failed ({failure})")
            plans[name] = _plan(snapshot, name, controls, fallback, keys, frozenset(served))
            served.update(plans[name].served)
        except Exception:
            summary = f"pool {name}: the planner failed ({failure}); nothing moves"
            plans[name] = model.PoolPlan(name, (), (), (), (), summary)
    return Decision(model.Plan(now=snapshot.now, pools=plans), proposals, failures)


def away(pool: model.PoolSnapshot, policy: PoolPolicy, keys: nodestate.Keys, now: datetime) -> int:
    """Nodes that lending keeps from serving now: lent or being lent, being taken back, back
    from a loan within the warm-up (their inference replica may still be starting), or whose
    state cannot be read (until they are back, they are not the capacity the pool counts on)."""
    lent = policy.lend_spec.add_taints
    states = (nodestate.read_in_pool(view, keys, lent) for view in pool.nodes)
    return sum(
        1
        for s in states
        if isinstance(s, nodestate.StateError)
        or s.phase in (Phase.LENDING, Phase.LENT, Phase.RECLAIMING)
        or (s.since is not None and now - s.since < policy.warmup)
    )


def nodes_lending_costs(
    pool: model.PoolSnapshot, policy: PoolPolicy, keys: nodestate.Keys, now: datetime
) -> int:
    """How many nodes lending costs the pool now, 0 when it costs nothing: requests wait beyond
    its ``queue_limit`` while nodes are away on loan (``away``). A minute of that is a minute of
    the pool's error budget spent: the minutes while a reclaimed node drains and warms up are
    the ones a loan costs most."""
    queue = pool.queue
    if queue is None or queue.value <= policy.queue_limit:
        return 0
    return away(pool, policy, keys, now)


def lent_count(
    pool: model.PoolSnapshot, keys: nodestate.Keys, lent: tuple[model.Taint, ...]
) -> int:
    """Nodes lent or being lent, and those whose state cannot be read (the planner counts them
    as lent, for every cap, until they are taken back): what the safety-only proposal holds,
    and the ``rebalancer_lent_nodes`` gauge shows. ``lent``: the pool's lent taints
    (``nodestate.read_in_pool``), required: a serving node that carries one has lost its
    original and counts as lent, for the strategy's view, the fallback and the gauge alike."""
    return sum(1 for v in pool.nodes if phase(v, keys, lent) in (Phase.LENDING, Phase.LENT, None))


def kept_count(
    pool: model.PoolSnapshot, keys: nodestate.Keys, lent: tuple[model.Taint, ...]
) -> int:
    """``lent_count`` less the nodes under a reclaim notice (on their way back): the loans the
    pool means to keep, what a strategy's target is measured against and the safety-only
    proposal holds (``planning.Draft.kept_count``)."""
    return lent_count(pool, keys, lent) - sum(1 for v in pool.nodes if noticed(v, keys, lent))


def noticed(view: model.NodeView, keys: nodestate.Keys, lent: tuple[model.Taint, ...]) -> bool:
    """Whether the node is a verified loan under a reclaim notice."""
    state = nodestate.read_in_pool(view, keys, lent)
    return isinstance(state, nodestate.NodeState) and state.verified and state.noticed


def _holding(
    pool: model.PoolSnapshot, keys: nodestate.Keys, controls: PoolControls, why: str
) -> model.Proposal:
    """The safety-only proposal: hold what is lent, read with the pool's own lent taints."""
    lent = kept_count(pool, keys, controls.policy.lend_spec.add_taints)
    return planning.safety_only(lent, why)


def phase(
    view: model.NodeView, keys: nodestate.Keys, lent: tuple[model.Taint, ...]
) -> Phase | None:
    """The node's phase, None when its state cannot be read, or is not the controller's own
    (unverified: counted and taken back as an unreadable one is); ``lent``: the pool's lent
    taints, ``nodestate.read_in_pool``."""
    state = nodestate.read_in_pool(view, keys, lent)
    if isinstance(state, nodestate.StateError) or not state.verified:
        return None
    return state.phase


def _checked(answer: Unchecked, size: int) -> model.Proposal | Failure:
    if isinstance(answer, Failure):
        return answer
    why = planning.invalid_proposal(answer, size)
    if why is not None:
        return Failure(FailureKind.INVALID, why)
    assert isinstance(answer, model.Proposal)
    return answer


def _plan(
    snapshot: model.Snapshot,
    name: PoolName,
    controls: PoolControls,
    proposal: model.Proposal | None,
    keys: nodestate.Keys,
    served: frozenset[str],
) -> model.PoolPlan:
    return planning.plan_pool(
        now=snapshot.now,
        name=name,
        pool=snapshot.pools[name],
        proposal=proposal,
        policy=controls.policy,
        keys=keys,
        paused=snapshot.paused or controls.paused,
        frozen=snapshot.frozen or controls.frozen,
        served=served,
    )


def operator_reclaims(
    now: datetime, members: Mapping[PoolName, Sequence[NodeName]], message: str
) -> model.Plan:
    """An operator's reclaim of named nodes (``rebalancer reclaim``), as a plan: one urgent step
    per node, origin operator. No rule refuses it: taking a node back never endangers
    inference, and a node that needs no reclaim is found so by the actuator."""
    pools: dict[PoolName, model.PoolPlan] = {}
    reason, origin = model.Reason.OPERATOR_RECLAIM_NOW, model.Origin.OPERATOR
    for pool, nodes in members.items():
        intents = tuple(
            model.Intent(pool, model.Action.RECLAIM, 1, origin, reason, message, node)
            for node in nodes
        )
        steps = tuple(
            model.Step(pool, n, model.Action.RECLAIM, reason, message, i, urgent=True)
            for n, i in zip(nodes, intents, strict=True)
        )
        summary = f"pool {pool}: the operator takes back {len(steps)} node(s)"
        pools[pool] = model.PoolPlan(pool, intents, steps, (), (), summary)
    return model.Plan(now=now, pools=pools)
