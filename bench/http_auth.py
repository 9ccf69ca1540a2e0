"""What the HTTP API's gate costs a request: p50 and p99 latency of an authorized request whose
review is cached, and of one whose review is not, against a real kube-apiserver.

The server is ``tests.support.kube.running``'s (etcd, kube-apiserver with RBAC and service-account
tokens), the chart's RBAC applied as the tests apply it. The controller's ``HttpServer`` runs in
this process with the real gate (``kubeauth.CachedGate`` over ``kubeauth.KubeReviews``, as the
chart's service account); the client is a service account bound to the chart's
``<release>-metrics-reader``, with a token minted by the TokenRequest API, asking
``GET /metrics`` over TLS on one kept-alive connection:

- cached: the gate's answers kept (one TokenReview and one SubjectAccessReview before the
  first timed request, none during);
- uncached: a gate whose times are zero, so every request makes both reviews.

A plain request with authentication off (``OpenGate``) is the floor the other two stand on.

    TESTS_KUBE_DIR=... .venv/bin/python bench/http_auth.py [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, as the tests

from rebalancer.adapters import kubeauth, kubeclient
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.runtime import http
from rebalancer.runtime.telemetry import Telemetry
from sandbox.emulator.clock import ManualClock
from tests.support import backends, kube, tokens
from tests.support.chart import render
from tests.support.gates import Counted
from tests.support.rbac import api_access_of, apply_to, rbac_of, service_account_of


@asynccontextmanager
async def serving(gate: kubeauth.Gate) -> AsyncIterator[http.HttpServer]:
    server = http.HttpServer(
        telemetry=Telemetry(),
        store=MemoryAuditStore(),
        ready=lambda: http.Readiness(True, "caches synced"),
        gate=gate,
        host="127.0.0.1",
        port=0,
        health_port=0,
    )
    async with server:
        yield server


async def latencies(server: http.HttpServer, token: str, requests: int) -> list[float]:
    """Milliseconds per ``GET /metrics``, one at a time, after a few to warm the connection."""
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(ssl=False, limit=1)
    out: list[float] = []
    async with aiohttp.ClientSession(server.url, headers=headers, connector=connector) as s:
        for i in range(requests + 10):
            began = time.perf_counter()
            async with s.get("/metrics") as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            if i >= 10:
                out.append(1000 * (time.perf_counter() - began))
    return out


def line(name: str, ms: list[float], reviews: str) -> str:
    cuts = statistics.quantiles(ms, n=100)
    return f"{name:<10} p50 {cuts[49]:7.2f} ms   p99 {cuts[98]:7.2f} ms   {reviews}"


async def bench(requests: int) -> None:
    with tempfile.TemporaryDirectory() as name, kube.running(Path(name)) as server:
        home = Path(name)
        cluster = backends.RealCluster(server, ManualClock(datetime.now(UTC)))
        docs = render({})
        apply_to(cluster, rbac_of(docs))
        apply_to(cluster, api_access_of(docs), user=service_account_of(docs))
        admin_config = server.kubeconfig(home / "admin.kubeconfig")
        controller_config = server.kubeconfig(home / "controller.kubeconfig", kube.CONTROLLER_TOKEN)
        async with (
            kubeclient.api_client(admin_config) as admin,
            kubeclient.api_client(controller_config) as api,
        ):
            made = await tokens.account(admin, "monitoring", "prometheus")
            rbac: Any = client.RbacAuthorizationV1Api(admin)  # dict bodies
            await rbac.create_cluster_role_binding(
                {
                    "metadata": {"name": "bench-prometheus", "labels": tokens.MADE_HERE},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "rebalancer-metrics-reader",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
                    ],
                }
            )
            await tokens.until_allowed(admin, made.user, "monitoring", "get", "/metrics")
            token = await made.token()

            async with serving(kubeauth.OpenGate()) as open_server:
                floor = await latencies(open_server, token, requests)

            cached_reviews = Counted(kubeauth.KubeReviews(api))
            gate = kubeauth.CachedGate(cached_reviews, time.monotonic)
            async with serving(gate) as cached_server:
                cached = await latencies(cached_server, token, requests)

            uncached_reviews = Counted(kubeauth.KubeReviews(api))
            never = kubeauth.CachedGate(
                uncached_reviews, time.monotonic, token_ttl=0, allow_ttl=0, deny_ttl=0
            )
            async with serving(never) as uncached_server:
                uncached = await latencies(uncached_server, token, requests)

    print(f"kube-apiserver {server.version}, {requests} authorized GET /metrics each, over TLS")
    print(line("no gate", floor, "(http.authentication: none)"))
    print(
        line(
            "cached",
            cached,
            f"({cached_reviews.tokens} TokenReview, {cached_reviews.accesses} "
            f"SubjectAccessReview for {requests + 10} requests)",
        )
    )
    print(
        line(
            "uncached",
            uncached,
            f"({uncached_reviews.tokens} TokenReviews, {uncached_reviews.accesses} "
            f"SubjectAccessReviews for {requests + 10} requests)",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(bench(args.requests))


if __name__ == "__main__":
    main()
