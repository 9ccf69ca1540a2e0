"""The end-to-end scenario's cluster and chart values, shared by the tests that run the
controller as the chart deploys it (tests/test_end_to_end.py; tests/test_uninstall.py takes
the chart values).

The cluster: 8 ``gpu-pool=inference`` nodes, two of them running an inference replica, 4
training nodes and ``TRAINING_PODS`` preemptible training pods, 6 of which cannot fit until
inference nodes are lent; on the emulator, served with tokens and RBAC, the chart's RBAC objects
applied (``on_emulator``). On a real server the same path runs on the real control plane
(tests/kubeapi/test_end_to_end_real.py, tests/support/harness.py's ``on_plane``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from sandbox.emulator import cluster
from sandbox.emulator.auth import Decision
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support.chart import NAMESPACE, RELEASE
from tests.support.pools import POOL, add_replicas, add_waiting_training
from tests.support.processes import Cluster, free_port
from tests.support.rbac import (
    CONTROLLER_TOKEN,
    admin_headers,
    apply_to,
    chart_access,
    service_account_of,
)

RPS_PER_NODE = 10
# The default demand query reads a series younger than its 5-minute window by the slope of its own
# samples (docs/design/metrics.md), so this test's young series read about their true rate. The
# slope lags a step change while older samples are in the fit: the high load is far above the
# pool (20000 rps) so that demand needs all 8 nodes within a scrape or two of the rise.
LOW_RPS, HIGH_RPS, HIGH_QUEUE = 5.0, 20000.0, 50
TRAINING_PODS = 10  # 4 fit on the training nodes (8 GPUs each, 8 per pod); 6 wait for loans
LEASE = (NAMESPACE, RELEASE)  # the chart's lease: namespace and name (its Role names it)
POD_NAME = "rebalancer-6f7c9d8b4-x2k9q"  # what the downward API gives the container


def fast_prometheus(prom: str) -> dict[str, Any]:
    """The chart's ``config.prometheus`` for a test's own Prometheus: one try, answers within
    seconds, samples a second apart."""
    return {
        "url": prom,
        "timeout": "2s",
        "attempts": 1,
        "retry_budget": "2s",
        "lookback": "1m",
        "resolution": "1s",
    }


def chart_values(prom: str, http_port: int) -> dict[str, Any]:
    """The chart's values for this cluster: what a user would put in their values file."""
    return {
        "service": {"port": http_port},
        "http": {"healthPort": free_port()},
        "config": {
            "tick_interval": "1s",
            "prometheus": fast_prometheus(prom),
            "pools": [
                {
                    "name": POOL,
                    "node_selector": {"gpu-pool": "inference"},
                    "inference_selector": {"app": "llm-serving"},
                    "rps_per_node": RPS_PER_NODE,
                    "strategy": {
                        "name": "window",
                        "params": {"window": "always", "lead_minutes": 0},
                    },
                    "limits": {
                        "min_serving": 2,
                        "headroom": 0.2,
                        "cooldown": "10m",
                        "max_step_fraction": 0.5,
                        "staleness": "30s",
                        "stale_grace": "1m",
                        "queue_limit": 10,
                        "reclaim_deadline": "5s",
                        "warmup": "0s",
                    },
                }
            ],
        },
    }


@dataclass
class Box(Cluster):
    """The cluster, read as the admin; the controller's kubeconfig, and who may do what."""

    kubeconfig: Path = field(kw_only=True)
    decisions: Callable[[], list[Decision]] = field(kw_only=True)  # the controller's, so far
    objects: Any = field(kw_only=True)  # the cluster as the admin's Store


@contextlib.asynccontextmanager
async def on_emulator(docs: list[Any], tmp_path: Path) -> AsyncIterator[Box]:
    """The cluster on the emulator, served with tokens and RBAC, the chart's RBAC objects
    ``docs`` applied; its scheduler runs every 0.5 s."""
    store = Store(seed=1)
    cluster.seed(store)
    add_replicas(store)
    add_waiting_training(store, TRAINING_PODS)
    store.schedule()
    access = chart_access(docs)
    async with (
        serve(store, schedule_every=0.5, access=access) as url,
        aiohttp.ClientSession(headers=admin_headers()) as session,
    ):
        apply_to(store, docs)
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig", token=CONTROLLER_TOKEN)
        user = service_account_of(docs).name
        yield Box(
            url,
            session,
            kubeconfig=kubeconfig,
            decisions=lambda: access.of(user),
            objects=store,
        )
