"""Two replicas on the PostgreSQL audit store, run as the chart deploys them.

The chart's "PostgreSQL + 2 replicas" values are rendered, and two pods of the rendered
Deployment run as local processes (``tests.support.processes.as_pod``: the container's args and
environment, the audit URL read from the Secret through ``secretKeyRef``, the ConfigMap as the
settings file) against the emulator enforcing the chart's RBAC and a real PostgreSQL. Both
become ready, exactly one holds the Lease and says so on ``/metrics`` (at once: the gauge moves
when the Lease is won, not at the next tick), both use the one database; when the leader is
stopped (SIGTERM), once it has written, it releases the Lease and the other takes over at once,
without waiting out the lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from rebalancer.adapters import leadership
from sandbox.emulator import cluster
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.postgres import PostgresServer
from tests.support.processes import Pod, as_pod, free_port, probe, start_pod
from tests.support.rbac import CONTROLLER_TOKEN, admin_headers, apply_to, chart_access
from tests.support.waits import until

SECRET = "rebalancer-db"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"


def values(port: int) -> dict[str, Any]:
    return {
        "replicaCount": 2,
        "audit": {"store": "postgresql", "postgresql": {"existingSecret": SECRET}},
        "service": {"port": port},
        "http": {"healthPort": free_port()},
        "config": {
            "tick_interval": "1s",
            # No Prometheus answers here: the planner refuses to lend, which is all this needs.
            "prometheus": {"url": f"http://127.0.0.1:{free_port()}", "attempts": 1},
            "pools": [
                {
                    "name": "inference",
                    "node_selector": {"gpu-pool": "inference"},
                    "rps_per_node": 10,
                }
            ],
        },
    }


async def leader_metric(session: aiohttp.ClientSession, url: str) -> tuple[str, str]:
    """The pod the ``rebalancer_leader`` gauge's identity names, and the gauge's value;
    ``session`` carries a token the cluster accepts (the API's certificate is self-signed: not
    verified here)."""
    async with session.get(url, ssl=False) as response:
        lines = (await response.text()).splitlines()
    line = next(line for line in lines if line.startswith("rebalancer_leader{"))
    found = re.fullmatch(r'rebalancer_leader\{identity="([^"]+)"\} (\S+)', line)
    assert found is not None, line
    return leadership.pod_of(found[1]), found[2]


@contextlib.asynccontextmanager
async def running(pod: Pod, kubeconfig: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await start_pod(pod, kubeconfig)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_two_replicas_share_the_database_and_hand_over_the_lease(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    database = await postgres_server.create_database("replicas")
    store = Store(seed=1)
    cluster.seed(store)
    ports = (free_port(), free_port())
    # The two pods differ only in their name (and, here on one machine, their port).
    pods = [
        as_pod(
            render(values(port)),
            tmp_path / name,
            name=name,
            namespace=NAMESPACE,
            secrets={(SECRET, "url"): database},
        )
        for name, port in zip(
            ("rebalancer-7c4b9-aaaaa", "rebalancer-7c4b9-bbbbb"), ports, strict=True
        )
    ]
    docs = render(values(ports[0]))
    async with (
        serve(store, access=chart_access(docs)) as url,
        aiohttp.ClientSession(headers=admin_headers()) as admin,
        aiohttp.ClientSession() as http,
    ):
        apply_to(store, docs)
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig", token=CONTROLLER_TOKEN)
        base = {pod.env["POD_NAME"]: f"https://127.0.0.1:{pod.port}" for pod in pods}
        health = {pod.env["POD_NAME"]: f"http://127.0.0.1:{pod.health_port}" for pod in pods}

        async def holder() -> str:
            async with admin.get(url + LEASE) as response:
                if response.status != 200:
                    return ""
                held = str((await response.json())["spec"].get("holderIdentity") or "")
                return leadership.pod_of(held)  # the pod; the identity adds the process

        async with running(pods[0], kubeconfig) as a, running(pods[1], kubeconfig) as b:
            procs = {pods[0].env["POD_NAME"]: a, pods[1].env["POD_NAME"]: b}

            async def both_ready() -> bool:
                ready = [await probe(http, u + pods[0].readiness) for u in health.values()]
                return all(ready) and await holder() in procs

            await until("both replicas ready, one leading", both_ready, None, within=30)
            first = await holder()
            (second,) = set(procs) - {first}
            assert await leader_metric(admin, base[first] + "/metrics") == (first, "1.0")
            assert await leader_metric(admin, base[second] + "/metrics") == (second, "0.0")

            # The gauge says 1 from the moment the Lease is won, which can be before the leader's
            # first tick: let that tick write before stopping it.
            async def first_wrote() -> bool:
                return first in await _writers(database)

            await until("the leader writing to the database", first_wrote, procs[first], within=10)
            procs[first].send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                await procs[first].wait()
            assert procs[first].returncode == 0

            async def taken_over() -> bool:
                return await holder() == second

            # Within 10 s, under the 15 s lease duration: the lease was released, not waited out.
            took = await until("the follower taking over", taken_over, procs[second], within=10)
            await until(
                "the new leader saying so",
                lambda: _says_leader(admin, base[second], second),
                procs[second],
                within=10,
            )
            print(f"\nreplicas: {second} took over {took:.1f}s after {first} stopped")

    # One database, migrated once, written by both leaders in turn.
    writers = await _writers(database)
    assert writers <= {first, second}
    assert first in writers


async def _writers(database: str) -> set[str]:
    """The pods whose controllers have written audit records."""
    engine = create_async_engine(database)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT DISTINCT controller FROM audit_records"))
            identities = {r[0] for r in rows}
            assert all(leadership.pod_of(i) != i for i in identities), identities
            return {leadership.pod_of(i) for i in identities}
    finally:
        await engine.dispose()


async def _says_leader(http: aiohttp.ClientSession, base: str, pod: str) -> bool:
    return await leader_metric(http, base + "/metrics") == (pod, "1.0")
