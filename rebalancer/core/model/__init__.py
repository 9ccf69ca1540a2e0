"""The vocabulary of a decision: what the controller sees, proposes, does and refuses.

Everything here is a frozen value. A tick builds a ``Snapshot`` (what the cluster and the
metrics looked like at ``now``), a strategy turns each pool's ``PoolView`` into a ``Proposal``,
and ``tick.plan_tick`` turns proposals and operator overrides into ``Intent``s, each of which
ends as ``Step``s (what the actuator will do) or a ``Rejection`` (why not). Nothing in this package
knows about Kubernetes objects or Prometheus responses: adapters translate into these values.

One noun a module, from the bottom up:

- ``names``: ``NodeName``, ``PoolName`` and the ``Clock`` type;
- ``cluster``: nodes, taints, tolerations, resources and pods (``NodeView``, ``PendingPod``);
- ``demand``: its ``Unit``, a ``Sample``, its ``DemandHistory``;
- ``budget``: the ``Slo``, the ``ErrorBudget`` and the ``Cover`` of a pool's history;
- ``view``: what a strategy sees (``PoolView``, ``Limits``) and ``nodes_needed``;
- ``snapshot``: what a tick decides from (``Snapshot``, ``PoolSnapshot``);
- ``plan``: what it decides (``Proposal``, ``Intent``, ``Step``, ``Rejection``, ``Plan``) and
  why (``Reason``);
- ``readings``: what the metrics and leadership seams answer (``PoolMetrics``, ``Term``).

Callers import this package (``from rebalancer.core import model``); every name they use is here.
"""

from rebalancer.core.model.budget import Cover, ErrorBudget, Jump, Slo
from rebalancer.core.model.cluster import (
    NOTHING,
    NodeView,
    PendingPod,
    PodMarks,
    PodRole,
    PodView,
    Requirement,
    Resources,
    Taint,
    Toleration,
    Unbelieved,
    tolerates,
)
from rebalancer.core.model.demand import DemandHistory, Sample, Unit
from rebalancer.core.model.names import Clock, NodeName, PoolName
from rebalancer.core.model.plan import (
    Action,
    Finding,
    Intent,
    Origin,
    Plan,
    PoolPlan,
    Proposal,
    Reason,
    Rejection,
    Step,
)
from rebalancer.core.model.readings import HistoryResult, MetricError, PoolMetrics, Term
from rebalancer.core.model.snapshot import DropHeld, FiringAlert, PoolSnapshot, Snapshot
from rebalancer.core.model.view import MAX_NODES, Limits, PoolView, nodes_needed

__all__ = [
    "MAX_NODES",
    "NOTHING",
    "Action",
    "Clock",
    "Cover",
    "DemandHistory",
    "DropHeld",
    "ErrorBudget",
    "Finding",
    "FiringAlert",
    "HistoryResult",
    "Intent",
    "Jump",
    "Limits",
    "MetricError",
    "NodeName",
    "NodeView",
    "Origin",
    "PendingPod",
    "Plan",
    "PodMarks",
    "PodRole",
    "PodView",
    "PoolMetrics",
    "PoolName",
    "PoolPlan",
    "PoolSnapshot",
    "PoolView",
    "Proposal",
    "Reason",
    "Rejection",
    "Requirement",
    "Resources",
    "Sample",
    "Slo",
    "Snapshot",
    "Step",
    "Taint",
    "Term",
    "Toleration",
    "Unbelieved",
    "Unit",
    "nodes_needed",
    "tolerates",
]
