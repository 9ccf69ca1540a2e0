"""The PromQL the metrics adapter evaluates: ``MetricQuery`` (a metric as two templates), the
built-in queries (vLLM's, dcgm-exporter's GPU busy) and ``Queries``, a pool's set of them. Data
only: ``adapters.metrics`` fills the templates in for a pool (``render``) and reads them."""

from __future__ import annotations

from dataclasses import dataclass

from rebalancer.adapters import presets
from rebalancer.core.model import Unit

DEFAULT_SCOPE = 'max by (namespace, pod, node) (kube_pod_info{node=~"$nodes"})'


@dataclass(frozen=True)
class MetricQuery:
    """A metric as two PromQL templates (``$scope``, ``$nodes`` and ``$pool`` are substituted).

    ``value`` must give at most one series (for per-node metrics: one per ``node`` label);
    ``sampled`` gives the raw sample times (``timestamp(<selector>)``) of the series that feed it,
    scoped to the pool, and is reduced with ``max``: the newest sample the pool has.
    """

    value: str
    sampled: str


# The default, vLLM's, in requests per second (``rebalancer.adapters.presets``; the other
# servers and units are there too). Its demand is the rate over the last 5 minutes, per series
# (docs/design/metrics.md, section Demand), in three branches:
# - a series that was there 5 minutes ago (``offset 5m``): ``rate()``, Prometheus' own
#   extrapolation over the window; counter resets (a container restart) are handled by it;
# - a younger series (a pod that started less than 5 minutes ago): ``deriv()``, the slope of its
#   own samples. ``rate()`` would divide its few seconds of increase by the whole 300 s (a pod a
#   minute old reads ~20 % of its load, and a rollout of every pod reads as a collapse);
# - a younger series whose counter reset (``deriv`` is for gauges: a reset bends the slope):
#   ``rate()``, low but never negative or garbage.
# ``and <counter>``: only series with a sample now. A series whose target went away is marked
# stale at once, and its ``rate()`` tail, which would otherwise be counted for 5 minutes next to
# its replacement's ``deriv()``, is dropped.
_VLLM = presets.preset(presets.Engine.VLLM)
_RPS = Unit.REQUESTS_PER_SECOND
VLLM_DEMAND = MetricQuery(
    value=presets.demand_value(_VLLM, _RPS), sampled=presets.demand_sampled(_VLLM, _RPS)
)
VLLM_QUEUE = MetricQuery(
    value=presets.pooled(presets.VLLM_WAITING),
    sampled=presets.sampled(presets.VLLM_WAITING.selector),
)
VLLM_RUNNING = MetricQuery(
    value=presets.pooled(presets.VLLM_RUNNING),
    sampled=presets.sampled(presets.VLLM_RUNNING.selector),
)
# Per-node GPU busy from NVIDIA's dcgm-exporter (``Hostname`` is the node name); not a default.
DCGM_GPU_BUSY = MetricQuery(
    value='max by (node) (label_replace(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$nodes"},'
    ' "node", "$$1", "Hostname", "(.*)"))',
    sampled='max by (node) (label_replace(timestamp(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$nodes"}),'
    ' "node", "$$1", "Hostname", "(.*)"))',
)


@dataclass(frozen=True)
class Queries:
    demand: MetricQuery = VLLM_DEMAND
    queue: MetricQuery = VLLM_QUEUE
    running: MetricQuery | None = VLLM_RUNNING
    gpu_busy: MetricQuery | None = None  # e.g. DCGM_GPU_BUSY
    # A demand expression for ``history``: ``$window`` is the grid step as a PromQL duration.
    # The demand query's three branches with ``$window`` for ``5m``: a bucket just after a
    # rollout is the rate the new pods served, not a fraction of it.
    history: str = presets.history(_VLLM, _RPS)
    scope: str = DEFAULT_SCOPE
