"""The controller PROCESS, as the chart deploys it, on a real kube-apiserver: the trial's first
case ("anyone who reaches the HTTP port takes every loan back") replayed against its port.

The rendered Deployment's container runs as a local process (``processes.as_pod``) as the
chart's service account under the chart's RBAC, with the chart's default ``http`` values (TLS,
the cluster's reviews) and a pool that Alertmanager's ``InferenceQueueHigh`` holds. Clients are
service accounts with tokens the TokenRequest API mints, Alertmanager's bound by the chart's
``alertmanager.serviceAccount``:

- the notification that held the pool for an hour, posted without a token, with a wrong one,
  and with a projected token of an account nothing grants: 401, 401, 403, and no alert held
  (``/api/v1/explain`` lists none); posted by Alertmanager's account: 200, held;
- the audit API: 401 without a token, 403 for Alertmanager's account, 200 for a reader bound to
  the chart's ``<release>-audit-reader``;
- the probes answer on their own plain port, and that port serves nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client

from tests.support import backends, gates, kube, tokens
from tests.support.alertmanager import alert, notification
from tests.support.chart import NAMESPACE, render
from tests.support.processes import Pod, as_pod, free_port, probe, start_pod
from tests.support.rbac import api_access_of, apply_to, rbac_of, service_account_of
from tests.support.waits import until

T = TypeVar("T")
MONITORING = "monitoring"
WAKE_ON = [{"matchers": ['alertname="InferenceQueueHigh"', 'service="llm"']}]


def values() -> dict[str, Any]:
    return {
        "service": {"port": free_port()},
        "http": {"healthPort": free_port()},
        "alertmanager": {"serviceAccount": {"name": "alertmanager", "namespace": MONITORING}},
        "leaderElection": {"enabled": False},
        "config": {
            "tick_interval": "1s",
            # No Prometheus answers: demand unknown, nothing lent; the alert is what is tried.
            "prometheus": {"url": f"http://127.0.0.1:{free_port()}", "attempts": 1},
            "pools": [
                {
                    "name": "inference",
                    "node_selector": {"gpu-pool": "inference"},
                    "rps_per_node": 10,
                    "wake_on": WAKE_ON,
                }
            ],
        },
    }


@contextlib.asynccontextmanager
async def running(pod: Pod, kubeconfig: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await start_pod(pod, kubeconfig)
    drains = [
        asyncio.create_task(_drain(stream)) for stream in (proc.stdout, proc.stderr) if stream
    ]
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in drains:
            task.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def ask(base: str, method: str, path: str, token: str | None, body: Any = None) -> int:
    async with (
        gates.session(base, token) as session,
        session.request(method, path, json=body) as resp,
    ):
        return resp.status


async def held_alerts(base: str, token: str) -> list[Any]:
    async with (
        gates.session(base, token) as session,
        session.get("/api/v1/explain", params={"pool": "inference"}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
    return list(doc.get("alerts") or [])


async def test_the_port_that_took_every_loan_back_now_asks_the_cluster_who_posts(
    real: kube.KubeServer, tmp_path: Path
) -> None:
    backend = backends.Real(real, tmp_path)
    docs = render(values())
    pod = as_pod(docs, tmp_path / "pod", name="rebalancer-0", namespace=NAMESPACE)
    base, health = f"https://127.0.0.1:{pod.port}", f"http://127.0.0.1:{pod.health_port}"
    async with backend.open(seeded=True) as opened:
        apply_to(opened.objects, rbac_of(docs))
        apply_to(opened.objects, api_access_of(docs), user=service_account_of(docs))
        admin = opened.api
        async with tokens.accounts(
            admin, MONITORING, {"alertmanager": (), "reader": (), "stranger": ()}
        ) as made:
            rbac: Any = client.RbacAuthorizationV1Api(admin)  # dict bodies
            subject = {"kind": "ServiceAccount", "name": "reader", "namespace": MONITORING}
            ref = {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "rebalancer-audit-reader",
            }
            meta = {"name": "tests-reader", "labels": tokens.MADE_HERE}
            await rbac.create_cluster_role_binding(
                {"metadata": meta, "roleRef": ref, "subjects": [subject]}
            )
            try:
                for name, verb, what in (
                    ("reader", "get", "decisions.rebalancer.io"),
                    ("alertmanager", "create", "alerts.rebalancer.io"),
                ):
                    await tokens.until_allowed(admin, made[name].user, MONITORING, verb, what)
                reader = await made["reader"].token()
                projected = await made["alertmanager"].token("rebalancer")
                stranger = await made["stranger"].token("rebalancer")
                kubeconfig = real.kubeconfig(tmp_path / "controller", kube.CONTROLLER_TOKEN)
                async with running(pod, kubeconfig) as proc, aiohttp.ClientSession() as plain:
                    await until("ready", lambda: probe(plain, health + pod.readiness), proc, 30)
                    async with plain.get(health + "/metrics") as resp:
                        assert resp.status == 404  # the probes' port serves the probes alone

                    # Started a minute ago: an alert holds its pool at most max_life after it.
                    started = datetime.now(UTC) - timedelta(minutes=1)
                    starts_at = started.isoformat().replace("+00:00", "Z")
                    firing = notification([alert(service="llm", starts_at=starts_at)])
                    posted = [
                        await ask(base, "POST", "/api/v1/alertmanager", token, firing)
                        for token in (None, "not-a-token", stranger)
                    ]
                    assert posted == [401, 401, 403]
                    # Two ticks after the posts (ticks are 1 s): whatever they held, a tick
                    # has seen it.
                    seen = await first(lambda: _as_of(base, reader), proc, 20)
                    for _ in range(2):
                        seen = await first(functools.partial(_as_of, base, reader, seen), proc, 10)
                    assert await held_alerts(base, reader) == []  # nothing was held

                    reads = [
                        await ask(base, "GET", "/api/v1/decisions", token)
                        for token in (None, projected, reader)
                    ]
                    assert reads == [401, 401, 200]  # the receiver's token reads nothing
                    held = await ask(base, "POST", "/api/v1/alertmanager", projected, firing)
                    assert held == 200

                    alerts = await first(lambda: held_alerts(base, reader), proc, 10)
                    assert [a["name"] for a in alerts] == ["InferenceQueueHigh"]
            finally:
                await rbac.delete_cluster_role_binding("tests-reader")


async def first(
    fetch: Callable[[], Awaitable[T]], proc: asyncio.subprocess.Process, within: float
) -> T:
    """``fetch()``'s first answer that is not empty, polled every 0.2 s."""
    found: list[T] = []

    async def answered() -> bool:
        got = await fetch()
        if got:
            found.append(got)
        return bool(got)

    await until("an answer", answered, proc, within)
    return found[-1]


async def _as_of(base: str, token: str, not_this: str = "") -> str:
    """The explained tick's time, once there is one other than ``not_this``; '' until then."""
    async with (
        gates.session(base, token) as session,
        session.get("/api/v1/explain", params={"pool": "inference"}) as resp,
    ):
        if resp.status != 200:
            return ""
        as_of = str((await resp.json())["as_of"])
    return as_of if as_of != not_this else ""
