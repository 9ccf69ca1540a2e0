"""The default cluster's inference pool as the tests drive it (``sandbox.emulator.cluster``).

Eight ``gpu-pool=inference`` nodes, of which the tests run an inference replica on ``BUSY`` (so
they are never lent) and lend the ``IDLE`` ones; the default lend spec (the serving taint
``workload=inference:NoSchedule`` swapped for ``rebalancer.io/lent=training``), the pod marks
that tell inference replicas (``app=llm-serving``) from borrowed pods, and ``POLICY``, which
allows as much churn as possible (no cooldown, no minimum loan, no warm-up, whole steps) so a
few ticks exercise every transition.

``add_replicas`` runs an inference replica on each ``BUSY`` node (``REPLICAS`` names them, for a
fake exporter that serves their metrics before the cluster exists); ``add_waiting_training``
queues preemptible training pods that wait for GPUs until nodes are lent.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rebalancer.adapters import registry
from rebalancer.core import model
from rebalancer.core.nodestate import Keys
from rebalancer.core.policy import PoolPolicy, default_lend_spec
from rebalancer.runtime.seams import PoolConfig
from sandbox.emulator import cluster
from tests.support import objects
from tests.support.backends import Objects

KEYS = Keys()
STATE = KEYS.state  # the node label that holds a node's phase
SPEC = default_lend_spec(KEYS)  # workload=inference:NoSchedule <-> rebalancer.io/lent=training
MARKS = model.PodMarks(
    lend_taints=SPEC.add_taints,
    serving_taints=SPEC.remove_taints,
    inference_selector={"app": "llm-serving"},
)
POOL = model.PoolName("inference")
INFERENCE = [f"inference-{i}" for i in range(cluster.INFERENCE.size)]
BUSY = ("inference-0", "inference-1")  # each runs an inference replica: never lent
IDLE = [n for n in INFERENCE if n not in BUSY]
# namespace/pod -> node of the replica ``add_replicas`` runs on each busy node.
REPLICAS = {
    f"{cluster.INFERENCE_NAMESPACE}/{cluster.inference_pod(i)['metadata']['name']}": node
    for i, node in enumerate(BUSY)
}
POLICY = PoolPolicy(
    rps_per_node=100.0,
    min_serving=2,
    cooldown=timedelta(0),
    min_loan=timedelta(0),
    # As much churn as the faults can hit: no cooldown, and a returned node is lendable again
    # at once (warm capacity has tests of its own).
    warmup=timedelta(0),
    max_step_fraction=1.0,
    reclaim_deadline=timedelta(seconds=60),
    lend_spec=SPEC,
)


def reactive_pool() -> PoolConfig:
    """The pool as the reconcile tests drive it: ``POLICY`` and the ``reactive`` strategy, a new
    one on each call (a strategy may keep state, and a restarted process starts afresh)."""
    return PoolConfig(
        name=POOL,
        node_selector={"gpu-pool": "inference"},
        policy=POLICY,
        marks=MARKS,
        strategy=registry.build("reactive"),
        strategy_name="reactive",
    )


# Demand in rps against POLICY's 100 rps a node: LOW needs 2 serving nodes (the 6 idle ones are
# lent), HIGH more than the pool's 8 (every lent node comes back).
LOW, HIGH = 150.0, 900.0


def add_replicas(store: Objects) -> list[dict[str, Any]]:
    """An inference replica on each ``BUSY`` node; the pods as stored."""
    return [objects.add(store, cluster.inference_pod(i, node_name=n)) for i, n in enumerate(BUSY)]


def add_waiting_training(store: Objects, count: int) -> None:
    """``count`` preemptible training pods (one GPU job each), unscheduled; an evicted one is
    gone a second later, so a wall-clock test does not wait out the default 30 s grace."""
    for i in range(count):
        pod = cluster.training_pod(f"train-{i:02d}", 0, priority_class=None)
        pod["spec"]["terminationGracePeriodSeconds"] = 1
        objects.add(store, pod)
