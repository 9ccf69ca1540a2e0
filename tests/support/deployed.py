"""The controller as the chart deploys it, beside a real control plane: the values a user would
write for one pool, and the rendered Deployment's container run as a local process
(``processes.as_pod``), authenticated as the chart's service account under the rendered RBAC.

The pool's durations are seconds, so that a scenario runs on the components' own clocks:
the demand query has a 4-second rate window (a load the test sets shows within seconds) over a
fake vLLM exporter that a real Prometheus scrapes every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from tests.support import kube
from tests.support.chart import NAMESPACE
from tests.support.processes import as_pod, free_port, probe, start_pod
from tests.support.scenario import fast_prometheus
from tests.support.training_cluster import SERVING
from tests.support.waits import until

POD_NAME = "rebalancer-6f7c9d8b4-x2k9q"  # what the downward API gives the container
RPS_PER_NODE = 10
DEMAND = "sum(rate(vllm:request_success_total[4s]) * on (namespace, pod) group_left (node) $scope)"
DEMAND_SAMPLED = "timestamp(vllm:request_success_total) and on (namespace, pod) $scope"


def chart_values(
    prom: str, http_port: int, pool: str, deadline: int, limits: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a user would put in their values file for ``pool`` (``gpu-pool=<pool>``), the
    reclaim deadline ``deadline`` seconds; ``limits`` over the pool's limits."""
    return {
        "service": {"port": http_port},
        "http": {"healthPort": free_port()},
        "config": {
            "tick_interval": "1s",
            "prometheus": fast_prometheus(prom),
            "pools": [
                {
                    "name": pool,
                    "node_selector": {"gpu-pool": pool},
                    "inference_selector": SERVING,
                    "rps_per_node": RPS_PER_NODE,
                    "strategy": {
                        "name": "window",
                        "params": {"window": "always", "lead_minutes": 0},
                    },
                    "metrics": {"demand": {"value": DEMAND, "sampled": DEMAND_SAMPLED}},
                    # lend_only_to_takers: not set, as users get it (true).
                    "limits": {
                        "min_serving": 2,
                        "headroom": 0.2,
                        "cooldown": "3s",
                        "max_step_fraction": 1.0,
                        "staleness": "5s",
                        "stale_grace": "10s",
                        "queue_limit": 10,
                        "reclaim_deadline": f"{deadline}s",
                        "warmup": "0s",
                        "drop_hold": "3s",
                        **(limits or {}),
                    },
                }
            ],
        },
    }


class Controller:
    """The controller process; its output drained as it comes (a full pipe would block it)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.out = bytearray()
        self.err = bytearray()
        self._readers = [
            asyncio.create_task(self._drain(proc.stdout, self.out)),
            asyncio.create_task(self._drain(proc.stderr, self.err)),
        ]

    @staticmethod
    async def _drain(stream: asyncio.StreamReader | None, into: bytearray) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            into.extend(chunk)

    async def stop(self) -> int:
        """SIGTERM, as the kubelet ends it; its exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await asyncio.gather(*self._readers)
        assert self.proc.returncode is not None
        return self.proc.returncode


@contextlib.asynccontextmanager
async def controller(
    server: kube.KubeServer, docs: list[Any], root: Path
) -> AsyncIterator[tuple[Controller, str]]:
    """The chart's Deployment as a process, as the chart's service account; ready."""
    pod = as_pod(docs, root / "pod", name=POD_NAME, namespace=NAMESPACE)
    kubeconfig = server.kubeconfig(root / "controller.kubeconfig", kube.CONTROLLER_TOKEN)
    c = Controller(await start_pod(pod, kubeconfig))
    audit_url = f"sqlite+aiosqlite:///{pod.root}/var/lib/rebalancer/audit.sqlite3"
    try:
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{pod.health_port}"  # the probes' port
            await until(
                "the readiness probe", lambda: probe(session, base + pod.readiness), c.proc, 30
            )
            # A scrape as the admin, through the controller's own reviews of its token (so
            # its grants to review are used, as the rest are).
            admin = {"Authorization": f"Bearer {kube.ADMIN_TOKEN}"}
            metrics = f"https://127.0.0.1:{pod.port}/metrics"
            async with session.get(metrics, headers=admin, ssl=False) as resp:
                assert resp.status == 200, await resp.text()
        yield c, audit_url
    finally:
        await c.stop()
