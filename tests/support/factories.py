"""Small factories for the core's and the runtime's tests: nodes in every phase, pools, plans,
step replay.

Nodes in a phase other than serving are always built with the codec (``nodestate.begin_lend``,
``finish_lend``, ``begin_reclaim``, ``finish`` and ``apply``), never with hand-written
annotations, so the tests follow the real format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from rebalancer.core import audit, model, nodestate, tick
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import NodeName, PodRole, PoolName
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.tick import Stage

KEYS = nodestate.Keys()
POOL = PoolName("gpu")
# A Monday at noon UTC: far from any DST change in the zones the tests use.
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
INFERENCE_TAINT = model.Taint(key="workload", value="inference", effect="NoSchedule")
GPU_TAINT = model.Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
BASE_LABELS: Mapping[str, str] = {"pool": "gpu", "accelerator": "h100"}
# Lending also flips a label (and adds one the node did not have), so that the restore of labels
# is exercised too, not only the taint swap.
LEND_SPEC = nodestate.LendSpec(
    remove_taints=(INFERENCE_TAINT,),
    add_taints=(model.Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule"),),
    labels={"workload": "training", "rebalancer-test/borrowed": "yes"},
)


# ---------------------------------------------------------------------------------------------
# Pods


def pod(role: PodRole, name: str = "p", job: str | None = None) -> model.PodView:
    return model.PodView(namespace="ns", name=name, role=role, job=job)


def inference_pod(name: str = "llm-0") -> model.PodView:
    return pod(PodRole.INFERENCE, name)


def other_pod(name: str = "batch-0") -> model.PodView:
    return pod(PodRole.OTHER, name)


def daemon_pod(name: str = "dcgm-exporter") -> model.PodView:
    return pod(PodRole.DAEMON, name)


def borrowed_pod(job: str, index: int = 0) -> model.PodView:
    return pod(PodRole.BORROWED, f"{job}-worker-{index}", job=job)


def borrowed_pods(*jobs: str) -> tuple[model.PodView, ...]:
    """One borrowed pod per entry; repeat a job name for several pods of one job."""
    return tuple(borrowed_pod(job, i) for i, job in enumerate(jobs))


# ---------------------------------------------------------------------------------------------
# Nodes


def serving(
    name: str,
    *,
    pods: Sequence[model.PodView] = (),
    ready: bool = True,
    annotations: Mapping[str, str] | None = None,
) -> model.NodeView:
    """A node that serves inference and was never touched by the controller."""
    return model.NodeView(
        name=NodeName(name),
        labels={**BASE_LABELS, "workload": "inference"},
        taints=(GPU_TAINT, INFERENCE_TAINT),
        annotations=dict(annotations or {}),
        pods=tuple(pods),
        ready=ready,
    )


def rebuilt(
    node: model.NodeView,
    *,
    pods: Sequence[model.PodView] | None = None,
    ready: bool | None = None,
    annotations: Mapping[str, str] | None = None,
) -> model.NodeView:
    """The same node with other pods, readiness or annotations, and no cached parse."""
    return model.NodeView(
        name=node.name,
        labels=dict(node.labels),
        taints=node.taints,
        annotations=dict(node.annotations if annotations is None else annotations),
        pods=node.pods if pods is None else tuple(pods),
        ready=node.ready if ready is None else ready,
        resource_version=node.resource_version,
    )


def with_overrides(node: model.NodeView, **values: str | None) -> model.NodeView:
    """Set (or, with ``None``, remove) operator overrides by their short names.

    ``with_overrides(n, lend="now", override_until="2026-03-03T00:00:00Z")``.
    """
    change = {getattr(KEYS, key): value for key, value in values.items()}
    annotations = dict(node.annotations)
    for key, value in change.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    return rebuilt(node, annotations=annotations)


def state_of(node: model.NodeView) -> nodestate.NodeState:
    state = nodestate.read(node, KEYS)
    assert isinstance(state, nodestate.NodeState), f"{node.name}: {state}"
    return state


def phase_of(node: model.NodeView) -> nodestate.Phase | None:
    """The node's phase, or ``None`` when its state cannot be read."""
    state = nodestate.read(node, KEYS)
    return state.phase if isinstance(state, nodestate.NodeState) else None


def lending(
    node: model.NodeView, at: datetime = T0, spec: nodestate.LendSpec = LEND_SPEC
) -> model.NodeView:
    """serving -> lending, as a crash right after the first write leaves it."""
    return nodestate.apply(node, nodestate.begin_lend(node, spec, KEYS, at, "test-lend"))


def lend(
    node: model.NodeView,
    at: datetime = T0,
    spec: nodestate.LendSpec = LEND_SPEC,
    pods: Sequence[model.PodView] | None = None,
) -> model.NodeView:
    """serving -> lending -> lent at ``at``; ``pods`` replaces the node's pods once it is lent."""
    begun = lending(node, at, spec)
    done = nodestate.apply(begun, nodestate.finish_lend(spec, state_of(begun), KEYS, at))
    return done if pods is None else rebuilt(done, pods=pods)


def begin_reclaim(
    node: model.NodeView, at: datetime = T0, deadline: timedelta = timedelta(minutes=2)
) -> model.NodeView:
    """lent -> reclaiming at ``at``, with the deadline ``deadline`` later."""
    change = nodestate.begin_reclaim(
        state_of(node), KEYS, at, at + deadline, "test-reclaim", taints=node.taints, spec=None
    )
    return nodestate.apply(node, change)


def finish(node: model.NodeView, at: datetime = T0) -> model.NodeView:
    """reclaiming (or lending) -> serving at ``at``: ``since`` records when it came back."""
    change = nodestate.finish(state_of(node), KEYS, at, taints=node.taints, spec=None)
    return nodestate.apply(node, change)


def returned(name: str, lent_at: datetime, back_at: datetime) -> model.NodeView:
    """A node lent at ``lent_at`` and back to serving at ``back_at`` (its cooldown starts then)."""
    node = lend(serving(name), lent_at)
    node = begin_reclaim(node, lent_at + (back_at - lent_at) / 2)
    return rebuilt(finish(node, back_at), pods=())


def names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(count)]


def serving_nodes(count: int, prefix: str = "s") -> list[model.NodeView]:
    return [serving(name) for name in names(prefix, count)]


def lent_nodes(
    count: int, at: datetime = T0 - timedelta(hours=1), prefix: str = "l"
) -> list[model.NodeView]:
    return [lend(serving(name), at) for name in names(prefix, count)]


# ---------------------------------------------------------------------------------------------
# Policies, snapshots, plans


def policy(**changes: Any) -> PoolPolicy:
    """A policy with round numbers: 10 rps per node, and no churn limit unless asked for."""
    values: dict[str, Any] = {
        "rps_per_node": 10.0,
        "min_serving": 1,
        "headroom": 0.0,
        "max_lent_fraction": 1.0,
        "min_loan": timedelta(0),
        "cooldown": timedelta(0),
        "max_step_fraction": 1.0,
        "lend_spec": LEND_SPEC,
    }
    values.update(changes)
    return PoolPolicy(**values)


def demand(rps: float, age: timedelta = timedelta(seconds=30), now: datetime = T0) -> model.Sample:
    return model.Sample(value=rps, at=now - age)


def pool_snapshot(
    nodes: Iterable[model.NodeView],
    sample: model.Sample | None,
    queue: model.Sample | None = None,
) -> model.PoolSnapshot:
    return model.PoolSnapshot(nodes=tuple(nodes), demand=sample, queue=queue)


def plan(
    nodes: Iterable[model.NodeView],
    *,
    target: int | None = None,
    rps: float | None = 0.0,
    age: timedelta = timedelta(seconds=30),
    queue: float | None = None,
    queue_age: timedelta = timedelta(seconds=30),
    pool_policy: PoolPolicy | None = None,
    now: datetime = T0,
    paused: bool = False,
    paused_pools: Iterable[PoolName] = (),
    frozen: bool = False,
    budget: model.ErrorBudget | None = None,
    cover: model.Cover | None = None,
    takers: Sequence[model.PendingPod] = (),
) -> model.PoolPlan:
    """Plan one pool with demand ``rps`` sampled ``age`` ago (``rps=None``: no sample at all).

    ``queue`` requests waiting, sampled ``queue_age`` ago (``None``: no queue sample);
    ``budget`` the pool's error budget and ``cover`` what its history covers; ``takers`` the
    pending pods that would use lent nodes.
    """
    actual = None if rps is None else demand(rps, age, now)
    waiting = None if queue is None else demand(queue, queue_age, now)
    snap = pool_snapshot(nodes, actual, waiting)
    pools = {POOL: dataclasses.replace(snap, budget=budget, cover=cover, takers=tuple(takers))}
    snapshot = model.Snapshot(now=now, pools=pools, paused=paused, frozen=frozen)
    proposals = {} if target is None else {POOL: proposal(target)}
    result = planned(snapshot, proposals, {POOL: pool_policy or policy()}, paused_pools)
    return result.pools[POOL]


def planned(
    snapshot: model.Snapshot,
    proposals: Mapping[PoolName, model.Proposal],
    policies: Mapping[PoolName, PoolPolicy],
    paused_pools: Iterable[PoolName] = (),
    frozen_pools: Iterable[PoolName] = (),
) -> model.Plan:
    """Every pool of ``snapshot`` planned as the controller plans a tick (``tick.plan_tick``).

    A pool without a proposal is planned on the operators' and the safety rules alone. A planner
    that raises fails the test: ``plan_tick`` would plan that pool safety-only, hiding the bug.
    """
    paused, frozen = set(paused_pools), set(frozen_pools)
    controls = {
        name: tick.PoolControls(policies[name], paused=name in paused, frozen=name in frozen)
        for name in snapshot.pools
    }
    decision = tick.plan_tick(snapshot, proposals, controls, KEYS)
    broken = {name: f for (name, stage), f in decision.failures.items() if stage is Stage.PLANNER}
    assert not broken, f"the planner failed: {broken}"
    return decision.plan


# What a lent node of the tests' pool tolerates: its GPU taint and the lend taint.
TRAINING_TOLERATIONS = (
    model.Toleration(key="nvidia.com/gpu", operator="Exists", value="", effect=""),
    model.Toleration(key=KEYS.lent_taint, operator="Exists", value="", effect=""),
)
GPU_NODE = model.Resources(gpu=8, cpu=96_000, memory=1024 * 2**30)  # allocatable of one node


def taker(
    name: str,
    *,
    gpus: int = 8,
    job: str | None = None,
    affinity: Sequence[Sequence[model.Requirement]] = (),
    node_selector: Mapping[str, str] | None = None,
    tolerations: tuple[model.Toleration, ...] = TRAINING_TOLERATIONS,
    priority: int = 0,
) -> model.PendingPod:
    """A pending training pod that tolerates lent nodes of the tests' pool."""
    return model.PendingPod(
        namespace="train",
        name=name,
        tolerations=tolerations,
        requests=model.Resources(gpu=gpus, cpu=8_000, memory=64 * 2**30),
        node_selector=tuple(sorted((node_selector or {}).items())),
        affinity=tuple(tuple(term) for term in affinity),
        job=job,
        priority=priority,
        created=T0 - timedelta(minutes=5),
    )


def gpu_node(node: model.NodeView, **labels: str) -> model.NodeView:
    """``node`` with a GPU node's allocatable, and ``labels`` added."""
    return dataclasses.replace(node, labels={**node.labels, **labels}, allocatable=GPU_NODE)


def proposal(target: int) -> model.Proposal:
    return model.Proposal(lend_target=target, reason=f"test wants {target} lent")


# ---------------------------------------------------------------------------------------------
# Reading plans


def stepped(result: model.PoolPlan, action: model.Action | None = None) -> list[str]:
    """Names of the nodes the plan changes (optionally for one action), in step order."""
    return [s.node for s in result.steps if action is None or s.action is action]


def refusals(result: model.PoolPlan) -> dict[model.Reason, int]:
    """Refused node counts by reason, over every intent of the plan."""
    counts: dict[model.Reason, int] = {}
    for rejection in result.rejections:
        counts[rejection.reason] = counts.get(rejection.reason, 0) + rejection.count
    return counts


def unaccounted(result: model.PoolPlan) -> list[str]:
    """Intents whose steps plus refused counts do not add up to their count (should be none)."""
    wrong = []
    for intent in result.intents:
        done = sum(1 for s in result.steps if s.intent is intent)
        refused = sum(r.count for r in result.rejections if r.intent is intent)
        if done + refused != intent.count:
            wrong.append(f"{intent}: {done} steps + {refused} refused != {intent.count}")
    return wrong


# ---------------------------------------------------------------------------------------------
# Replaying a plan as the actuator would


def apply_step(
    node: model.NodeView,
    step: model.Step,
    now: datetime,
    pool_policy: PoolPolicy,
) -> model.NodeView:
    """The node once ``step`` is carried out: a lend at once to lent, a reclaim to reclaiming."""
    if step.action is model.Action.LEND:
        return lend(node, now, pool_policy.lend_spec)
    deadline = now + pool_policy.reclaim_deadline
    spec = pool_policy.lend_spec
    state = nodestate.read_in_pool(node, KEYS, spec.add_taints)
    if isinstance(state, nodestate.StateError):  # taken back from the pool's specification
        change = nodestate.begin_restore_from_spec(node, spec, KEYS, now, deadline, "test-reclaim")
    else:
        change = nodestate.begin_reclaim(
            state, KEYS, now, deadline, "test-reclaim", taints=node.taints, spec=spec
        )
    return nodestate.apply(node, change)


def apply_plan(
    nodes: Sequence[model.NodeView],
    result: model.PoolPlan,
    now: datetime,
    pool_policy: PoolPolicy,
) -> list[model.NodeView]:
    by_name = {step.node: step for step in result.steps}
    return [
        apply_step(n, by_name[n.name], now, pool_policy) if n.name in by_name else n for n in nodes
    ]


SERVES = (nodestate.Phase.SERVING, nodestate.Phase.RECLAIMING)
LENDS = (nodestate.Phase.LENDING, nodestate.Phase.LENT)


def count_in(nodes: Iterable[model.NodeView], phases: tuple[nodestate.Phase, ...]) -> int:
    return sum(1 for n in nodes if phase_of(n) in phases)


# ---------------------------------------------------------------------------------------------
# Audit records


def audit_record(
    ident: str,
    when: datetime,
    *,
    pool: str = "gpu",
    node: str | None = None,
    action: str | None = "lend",
    kind: Kind = Kind.REFUSAL,
    cluster: str = audit.DEFAULT_CLUSTER,
) -> AuditRecord:
    """A record as the audit store's tests write and read it back (a refusal by default)."""
    return AuditRecord(
        id=ident,
        time=when,
        kind=kind,
        cluster=cluster,
        pool=pool,
        controller="rebalancer-0",
        reason="cooldown",
        message=f"record {ident}",
        node=node,
        action=None if action is None else model.Action(action),
        inputs={"demand": {"value": 1.5, "at": "2026-03-02T11:59:30Z"}},
        before={"taints": [{"key": "a", "effect": "NoSchedule"}], "labels": {"x": "y"}},
    )
