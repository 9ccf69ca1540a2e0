"""A cluster, a real Prometheus and the controller process, for the process-level tests.

``harness`` serves the API emulator (8 ``gpu-pool=inference`` nodes at 10 rps each, two running
an inference replica, 4 training nodes, 10 preemptible training pods waiting for GPUs), a fake
vLLM exporter and a real ``prometheus`` scraping it every second. ``Harness.controller`` runs
``python -m tests.support.failing_strategy run`` (the ``rebalancer`` command with one more strategy,
``always-raises``) against them with a settings file from ``Harness.config``: durations scaled to
seconds, and the default demand query with a 4-second rate window, so a load set by a test
shows within seconds and zero load reads exactly zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from rebalancer.core.audit import AuditRecord
from sandbox.emulator import cluster
from sandbox.emulator.faults import Faults
from sandbox.emulator.server import RequestObserver, serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support import pools
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import ROOT, Cluster, child_env, free_port, probe, read_audit
from tests.support.prometheus import Scraping
from tests.support.waits import until

POOL, INFERENCE, IDLE, STATE = pools.POOL, pools.INFERENCE, pools.IDLE, pools.STATE
RPS_PER_NODE = 10
LOW = 15.0  # needs 2 serving nodes with 20 % headroom: all 6 idle ones may be lent
PEAK = 80.0  # needs 10 nodes: more than the pool has, every lent node comes back
DEMAND = "sum(rate(vllm:request_success_total[4s]) * on (namespace, pod) group_left (node) $scope)"
DEMAND_SAMPLED = "timestamp(vllm:request_success_total) and on (namespace, pod) $scope"
LIMITS = {
    "min_serving": 2,
    "headroom": 0.2,
    "cooldown": "2s",
    "max_step_fraction": 1.0,
    "staleness": "5s",
    "stale_grace": "10s",
    "queue_limit": 10,
    "reclaim_deadline": "5s",
    "warmup": "0s",
    "drop_hold": "6s",
}


@dataclass
class Controller:
    proc: asyncio.subprocess.Process
    base: str
    log: Path


@dataclass(kw_only=True)
class Harness(Cluster):
    store: Store
    exporter: Exporter
    prometheus: Scraping
    tmp: Path
    kubeconfig: Path
    audit_url: str

    # -- the cluster --------------------------------------------------------------------------

    async def lent(self) -> set[str]:
        nodes = await self.nodes()
        return {n for n in INFERENCE if nodes[n]["metadata"]["labels"].get(STATE) == "lent"}

    async def serving(self) -> set[str]:
        nodes = await self.nodes()
        return {n for n in INFERENCE if not nodes[n]["metadata"]["labels"].get(STATE)}

    async def annotate(self, node: str, annotations: Mapping[str, str | None]) -> None:
        patch = {"metadata": {"annotations": dict(annotations)}}
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(
            f"{self.url}/api/v1/nodes/{node}", data=json.dumps(patch), headers=headers
        ) as r:
            assert r.status == 200, await r.text()

    # -- the controller -----------------------------------------------------------------------

    def config(self, strategy: str = "window", **settings: Any) -> Path:
        limits = {**LIMITS, **settings.pop("limits", {})}
        pool: dict[str, Any] = {
            "name": POOL,
            "node_selector": {"gpu-pool": "inference"},
            "inference_selector": {"app": "llm-serving"},
            "rps_per_node": RPS_PER_NODE,
            "strategy": (
                {"name": "window", "params": {"window": "always", "lead_minutes": 0}}
                if strategy == "window"
                else {"name": strategy}
            ),
            "limits": limits,
            "metrics": {"demand": {"value": DEMAND, "sampled": DEMAND_SAMPLED}},
            # These suites are about the rules around lending and taking back; nothing here
            # re-creates an evicted training pod, so after a reclaim no pod would wait for a
            # lent node. Lending to takers only is proved on its own (tests/test_takers.py).
            "lend_only_to_takers": False,
            **settings.pop("pool", {}),
        }
        doc = {
            "tick_interval": "1s",
            "leader_election": {"enabled": False},
            "prometheus": {
                "url": self.prometheus.url,
                "timeout": "1s",
                "attempts": 1,
                "retry_budget": "1s",
                "lookback": "1m",
                "resolution": "1s",
            },
            "audit": {"url": self.audit_url},
            "http": {"host": "127.0.0.1", "port": free_port()},
            "pools": [pool],
            **settings,
        }
        path = self.tmp / f"config-{time.monotonic_ns()}.yaml"
        path.write_text(json.dumps(doc), encoding="utf-8")  # YAML is a superset of JSON
        return path

    @contextlib.asynccontextmanager
    async def controller(self, config: Path) -> AsyncIterator[Controller]:
        """The controller, ready, until the block ends; then SIGTERM, and it must exit 0."""
        c = await self.spawn(config)
        try:
            yield c
            c.proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await c.proc.wait()
            log = c.log.read_text(errors="replace")
            assert c.proc.returncode == 0, log[-3000:]
            assert "Traceback" not in log
        finally:
            await self.kill(c)

    async def spawn(self, config: Path, wrapper: Sequence[str] = ()) -> Controller:
        """Start the controller (under ``wrapper``, e.g. ``faketime -f -90``, when given) and
        wait for its readiness probe. Its log goes to a file (a pipe nobody reads would fill
        and block it)."""
        port = json.loads(config.read_text())["http"]["port"]
        log = self.tmp / f"controller-{time.monotonic_ns()}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *wrapper,
                sys.executable,
                "-m",
                "tests.support.failing_strategy",
                "run",
                "--config",
                str(config),
                "--kubeconfig",
                str(self.kubeconfig),
                cwd=ROOT,
                env=child_env(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=out,
            )
        c = Controller(proc, f"http://127.0.0.1:{port}", log)
        try:
            await until(
                "the controller is ready", lambda: probe(self.session, c.base + "/readyz"), proc, 20
            )
        except BaseException:
            await self.kill(c)
            raise
        return c

    @staticmethod
    async def kill(c: Controller) -> None:
        """SIGKILL, as the kernel's OOM killer or a node failure ends a process."""
        if c.proc.returncode is None:
            c.proc.kill()
            await c.proc.wait()

    async def metric(self, c: Controller, name: str, **labels: str) -> float | None:
        """One sample of the controller's ``/metrics``, by name and labels."""
        async with self.session.get(c.base + "/metrics") as r:
            text = await r.text()
        for line in text.splitlines():
            m = re.fullmatch(r"([a-z_:]+)(?:\{(.*)\})? (\S+)", line)
            if m is None or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
        return None

    async def records(self) -> list[AuditRecord]:
        return await read_audit(self.audit_url)

    async def wait_lent(self, c: Controller, nodes: set[str], within: float = 25) -> float:
        async def done() -> bool:
            return await self.lent() == nodes

        return await until(f"lending {sorted(nodes)}", done, c.proc, within)

    async def wait_all_serving(self, c: Controller, within: float = 25) -> float:
        async def done() -> bool:
            return await self.serving() == set(INFERENCE)

        return await until("every node serving again", done, c.proc, within)


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path,
    rps: float = LOW,
    faults: Faults | None = None,
    waiting: int = 10,
    on_request: RequestObserver | None = None,
) -> AsyncIterator[Harness]:
    """The cluster of the module docstring, with ``waiting`` training pods pending; the
    emulator tells ``on_request`` of every request it answers."""
    store = Store(seed=1)
    cluster.seed(store)
    pools.add_replicas(store)
    pools.add_waiting_training(store, waiting)
    store.schedule()
    exporter = Exporter(pods=pools.REPLICAS, rps=rps)
    async with (
        serve(store, schedule_every=0.5, faults=faults, on_request=on_request) as url,
        aiohttp.ClientSession() as session,
        serve_exporter(exporter) as target,
    ):
        prom = Scraping(tmp_path / "prometheus", target)
        await prom.start()
        try:
            yield Harness(
                url=url,
                session=session,
                store=store,
                exporter=exporter,
                prometheus=prom,
                tmp=tmp_path,
                kubeconfig=write_kubeconfig(url, tmp_path / "kubeconfig"),
                audit_url=f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}",
            )
        finally:
            await prom.stop()
