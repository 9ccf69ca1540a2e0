"""A cluster, a real Prometheus and the controller process, for the process-level tests.

``harness`` serves the API emulator (8 ``gpu-pool=inference`` nodes at 10 rps each, two running
an inference replica, 4 training nodes, 10 preemptible training pods waiting for GPUs), a fake
vLLM exporter and a real ``prometheus`` scraping it every second; ``on_plane`` builds the same
pool on a real control plane, training as real Jobs, for the suites that need nothing only the
emulator can do (an injected fault, a request observer, objects added behind the API).
``Harness.controller`` runs ``python -m tests.support.failing_strategy run`` (the ``rebalancer``
command with one more strategy, ``always-raises``) against them with a settings file from
``Harness.config``: durations scaled to seconds, and the default demand query with a 4-second
rate window, so a load set by a test shows within seconds and zero load reads exactly zero.
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
from tests.support import failing_strategy, kube, pools
from tests.support.control_plane import ControlPlane
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import (
    ROOT,
    Cluster,
    child_env,
    free_port,
    node_state_keys,
    probe,
    read_audit,
)
from tests.support.prometheus import Scraping
from tests.support.training_cluster import (
    JOB_NAME,
    Api,
    gpu_node,
    namespace,
    running_ready,
    schedulable,
    training_job,
    unschedulable,
)
from tests.support.waits import until

POOL, INFERENCE, IDLE, STATE = pools.POOL, pools.INFERENCE, pools.IDLE, pools.STATE
RPS_PER_NODE = 10
# Levels well inside a band of whole nodes: the 4-second rate reads a busy machine's late scrapes
# a fifth or more off, and on the real control plane a reclaim for nothing costs a training pod
# (its Job makes a new one about 10 s later, which only then is a taker again).
LOW = 10.0  # needs 2 serving nodes with 20 % headroom: all 6 idle ones may be lent
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
    base: str  # the HTTP API: https, a self-signed certificate
    log: Path
    health: str  # the probes' plain port
    session: aiohttp.ClientSession  # a client of the API, with the harness's token if any


@dataclass(kw_only=True)
class Harness(Cluster):
    exporter: Exporter
    prometheus: Scraping
    tmp: Path
    kubeconfig: Path
    audit_url: str
    pool_settings: Mapping[str, Any]  # what this cluster asks of the pool's settings
    # The controller's HTTP settings, and the token a test sends it: on the emulator, which
    # reviews no token, the API is open (``authentication: none``); on a real control plane
    # the cluster admits each request, and the test asks as the admin.
    http_settings: Mapping[str, Any]
    token: str | None

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
            **self.pool_settings,
            **settings.pop("pool", {}),
        }
        doc = {
            "tick_interval": "1s",
            "node_state_keys": str(node_state_keys(self.tmp)),
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
            "http": {
                "host": "127.0.0.1",
                "port": free_port(),
                "health_port": free_port(),
                **self.http_settings,
            },
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
        return await self.let_go(await self._start(config, wrapper, held=False))

    async def held(self, config: Path) -> Controller:
        """The controller started but held (``failing_strategy.HELD``): it imports what it
        runs with, then waits for ``let_go``. Not ready, and nothing done yet."""
        return await self._start(config, (), held=True)

    async def let_go(self, c: Controller) -> Controller:
        """A held controller let go (for one from ``spawn``, nothing to do) and ready."""
        if c.proc.stdin is not None:
            c.proc.stdin.write(b"go\n")
            c.proc.stdin.close()
        try:
            await until(
                "the controller is ready",
                lambda: probe(self.session, c.health + "/readyz"),
                c.proc,
                20,
            )
        except BaseException:
            await self.kill(c)
            raise
        return c

    async def _start(self, config: Path, wrapper: Sequence[str], held: bool) -> Controller:
        web = json.loads(config.read_text())["http"]
        log = self.tmp / f"controller-{time.monotonic_ns()}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *wrapper,
                sys.executable,
                "-m",
                "tests.support.failing_strategy",
                *([failing_strategy.HELD] if held else []),
                "run",
                "--config",
                str(config),
                "--kubeconfig",
                str(self.kubeconfig),
                cwd=ROOT,
                env=child_env(),
                stdin=asyncio.subprocess.PIPE if held else None,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=out,
            )
        headers = {} if self.token is None else {"Authorization": f"Bearer {self.token}"}
        session = aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=False))
        return Controller(
            proc,
            f"https://127.0.0.1:{web['port']}",
            log,
            f"http://127.0.0.1:{web['health_port']}",
            session,
        )

    @staticmethod
    async def kill(c: Controller) -> None:
        """SIGKILL, as the kernel's OOM killer or a node failure ends a process."""
        if c.proc.returncode is None:
            c.proc.kill()
            await c.proc.wait()
        if c.proc.stdin is not None:  # held, perhaps never let go
            c.proc.stdin.close()
        await c.session.close()

    async def metric(self, c: Controller, name: str, **labels: str) -> float | None:
        """One sample of the controller's ``/metrics``, by name and labels."""
        async with c.session.get(c.base + "/metrics") as r:
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


@dataclass(kw_only=True)
class EmulatorHarness(Harness):
    store: Store  # the emulator's objects, for a test that adds its own


@contextlib.asynccontextmanager
async def harness(
    tmp_path: Path,
    rps: float = LOW,
    faults: Faults | None = None,
    waiting: int = 10,
    on_request: RequestObserver | None = None,
) -> AsyncIterator[EmulatorHarness]:
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
            yield EmulatorHarness(
                url=url,
                session=session,
                store=store,
                exporter=exporter,
                prometheus=prom,
                tmp=tmp_path,
                kubeconfig=write_kubeconfig(url, tmp_path / "kubeconfig"),
                audit_url=f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}",
                # Nothing on the emulator re-creates an evicted training pod, so after a reclaim
                # no pod would wait for a lent node: these suites lend without takers. On the
                # real control plane (``on_plane``) the Job controller does, and the pool lends
                # only to takers, as users get it.
                pool_settings={"lend_only_to_takers": False},
                http_settings={"authentication": "none"},
                token=None,
            )
        finally:
            await prom.stop()


@contextlib.asynccontextmanager
async def on_plane(plane: ControlPlane, tmp_path: Path, rps: float = LOW) -> AsyncIterator[Harness]:
    """The same pool on a real control plane (``plane``): its 8 nodes played by KWOK, the two
    replicas bound to theirs, and training real Jobs of one 8-GPU pod each, one per idle node
    (independent, as the emulator's training pods are: a Job of several pods is a gang, lent
    all or nothing), pending until nodes are lent, an evicted pod re-created by the Job
    controller; the pool lends only to takers, as users get it. The controller runs as the
    admin. Everything made is deleted at the end: the plane is the session's."""
    server = plane.server
    async with Api.session_for(server) as session:
        api = Api(server.url, session)
        try:
            await _plane_cluster(api)
            exporter = Exporter(pods=pools.REPLICAS, rps=rps)
            async with serve_exporter(exporter) as target:
                prom = Scraping(tmp_path / "prometheus", target)
                await prom.start()
                try:
                    yield Harness(
                        url=server.url,
                        session=session,
                        exporter=exporter,
                        prometheus=prom,
                        tmp=tmp_path,
                        kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"),
                        audit_url=f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}",
                        pool_settings={},
                        http_settings={},
                        token=kube.ADMIN_TOKEN,
                    )
                finally:
                    await prom.stop()
        finally:
            await _plane_cleared(api)


_JOBS = f"/apis/batch/v1/namespaces/{cluster.TRAINING_NAMESPACE}/jobs"
_JOB_PODS = f"/api/v1/namespaces/{cluster.TRAINING_NAMESPACE}/pods?labelSelector={JOB_NAME}"


async def _plane_cluster(api: Api) -> None:
    for name in (cluster.INFERENCE_NAMESPACE, cluster.TRAINING_NAMESPACE):
        code, doc = await api.ask("POST", "/api/v1/namespaces", namespace(name))
        assert code in (201, 409), doc
    for name in INFERENCE:
        await api.create("/api/v1/nodes", gpu_node(name, "inference"))

    async def nodes_ready() -> bool:
        nodes = await api.nodes()
        return all(schedulable(nodes[n]) for n in INFERENCE)

    await until("the KWOK nodes Ready", nodes_ready, None, 30)
    for i, node in enumerate(pools.BUSY):
        replica = cluster.inference_pod(i, node_name=node)
        # Its ReplicaSet is not there: the garbage collector would delete a pod it owned.
        del replica["metadata"]["ownerReferences"]
        await api.create(f"/api/v1/namespaces/{cluster.INFERENCE_NAMESPACE}/pods", replica)

    async def replicas_running() -> bool:
        return (
            len([p for p in await api.pods(cluster.INFERENCE_NAMESPACE) if running_ready(p)]) == 2
        )

    await until("the replicas running", replicas_running, None, 30)
    for i in range(len(IDLE)):
        job = training_job(f"train-{i}", cluster.TRAINING_NAMESPACE, "inference", 1, "1s", 1)
        await api.create(_JOBS, job)

    async def job_pending() -> bool:
        pods = (await api.get(_JOB_PODS))["items"]
        return len([p for p in pods if unschedulable(p)]) == len(IDLE)

    await until("the Jobs' pods unschedulable", job_pending, None, 30)


async def _plane_cleared(api: Api) -> None:
    """The Jobs and their pods, the replicas and the nodes gone, as before ``_plane_cluster``."""
    await api.ask("DELETE", f"{_JOBS}?propagationPolicy=Background")
    for pod in await api.pods(cluster.INFERENCE_NAMESPACE):
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{cluster.INFERENCE_NAMESPACE}/pods/{name}?gracePeriodSeconds=0"
        await api.ask("DELETE", path)

    async def gone() -> bool:
        pods = [*(await api.get(_JOB_PODS))["items"], *await api.pods(cluster.INFERENCE_NAMESPACE)]
        return not pods

    await until("the Jobs' pods and the replicas gone", gone, None, 30)
    for name in INFERENCE:
        await api.ask("DELETE", f"/api/v1/nodes/{name}")
