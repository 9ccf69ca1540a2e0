"""The chart's ClusterRoles for the use of the HTTP API, held to least privilege on a real
kube-apiserver: service accounts with tokens minted by the TokenRequest API (the emulator mints
none), each bound to one of the chart's roles, asking every route of a controller whose gate
runs as the chart's service account under the chart's RBAC.

- ``<release>-metrics-reader`` (Prometheus): ``/metrics`` and nothing else;
- ``<release>-audit-reader`` (people, Grafana): the audit API and explain, nothing else;
- ``<release>-alertmanager``, bound by ``alertmanager.serviceAccount``: the receiver, and only
  with a token projected for its audience; the same account's mounted-style token (the API
  server's audience) posts nothing, and the receiver's token reads nothing.

And a real Prometheus scrapes the controller as the chart's ServiceMonitor tells it to.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.adapters import kubeauth
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.core.model import PoolName
from rebalancer.runtime import alerts as alerting
from rebalancer.runtime import http
from rebalancer.runtime.http import HttpServer
from rebalancer.runtime.telemetry import Telemetry
from tests.support import backends, gates, kube, tokens
from tests.support.alertmanager import alert, notification
from tests.support.chart import of_kind, one, render
from tests.support.factories import T0
from tests.support.prometheus import Scraping
from tests.support.rbac import (
    CONTROLLER_TOKEN,
    api_access_of,
    apply_to,
    rbac_of,
    service_account_of,
)
from tests.support.waits import until

NAMESPACE = "monitoring"
VALUES = {"alertmanager": {"serviceAccount": {"name": "alertmanager", "namespace": NAMESPACE}}}
ROUTES = {
    "metrics": ("GET", "/metrics"),
    "decisions": ("GET", "/api/v1/decisions"),
    "explain": ("GET", "/api/v1/explain?node=n1"),
    "alertmanager": ("POST", "/api/v1/alertmanager"),
}


@pytest.fixture
def real_backend(real: kube.KubeServer, tmp_path: Path) -> backends.Real:
    return backends.Real(real, tmp_path)


@contextlib.asynccontextmanager
async def controller(opened: backends.Opened) -> AsyncIterator[HttpServer]:
    async with opened.client_as(CONTROLLER_TOKEN) as (api, _):
        store = alerting.AlertStore(
            {PoolName("l20"): ()}, max_age=timedelta(hours=1), clock=lambda: T0
        )
        server = HttpServer(
            telemetry=Telemetry(),
            store=MemoryAuditStore(),
            ready=lambda: http.Readiness(True, "caches synced"),
            gate=kubeauth.CachedGate(kubeauth.KubeReviews(api), time.monotonic),
            host="127.0.0.1",
            port=0,
            health_port=0,
            alerts=alerting.Receiver(store, token=None, leading=lambda: True),
            explain=lambda node, pool: {"node": node},
        )
        async with server:
            yield server


async def answers(server: HttpServer, token: str) -> dict[str, int]:
    body = notification([alert(service="llm")])
    got = {}
    async with gates.session(server.url, token) as session:
        for name, (method, path) in ROUTES.items():
            async with session.request(method, path, json=body) as resp:
                got[name] = resp.status
    return got


async def bound(api: Any, account: tokens.Account, role: str) -> None:
    """``account`` bound to the chart's ClusterRole ``role``, the authorizer told."""
    meta = {"name": f"tests-{account.name}", "labels": tokens.MADE_HERE}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    subject = {"kind": "ServiceAccount", "name": account.name, "namespace": account.namespace}
    rbac: Any = client.RbacAuthorizationV1Api(api)  # dict bodies, as the server takes them
    await rbac.create_cluster_role_binding(
        {"metadata": meta, "roleRef": ref, "subjects": [subject]}
    )


async def test_each_of_the_chart_s_roles_opens_its_routes_and_no_other(
    real_backend: backends.Real,
) -> None:
    docs = render(VALUES)
    roles = {d["metadata"]["name"] for d in of_kind(api_access_of(docs), "ClusterRole")}
    assert roles == {
        "rebalancer-metrics-reader",
        "rebalancer-audit-reader",
        "rebalancer-alertmanager",
    }
    async with real_backend.open() as opened:
        apply_to(opened.objects, rbac_of(docs))
        # Bound to others: nothing of these the controller's account must be allowed.
        apply_to(opened.objects, api_access_of(docs), user=service_account_of(docs))
        api = opened.api
        async with tokens.accounts(
            api, NAMESPACE, {"prometheus": (), "grafana": (), "alertmanager": ()}
        ) as made:
            try:
                await bound(api, made["prometheus"], "rebalancer-metrics-reader")
                await bound(api, made["grafana"], "rebalancer-audit-reader")
                for name, verb, what in (
                    ("prometheus", "get", "/metrics"),
                    ("grafana", "get", "decisions.rebalancer.io"),
                    ("alertmanager", "create", "alerts.rebalancer.io"),
                ):
                    await tokens.until_allowed(api, made[name].user, NAMESPACE, verb, what)
                async with controller(opened) as server:
                    prometheus = await answers(server, await made["prometheus"].token())
                    grafana = await answers(server, await made["grafana"].token())
                    projected = await made["alertmanager"].token("rebalancer")
                    alertmanager = await answers(server, projected)
                    mounted = await answers(server, await made["alertmanager"].token())
            finally:
                rbac: Any = client.RbacAuthorizationV1Api(api)
                for name in ("prometheus", "grafana"):
                    with contextlib.suppress(ApiException):
                        await rbac.delete_cluster_role_binding(f"tests-{name}")

    # The receiver's audience is the receiver's alone: another audience is a 401 there, and
    # the receiver's token is a 401 everywhere else.
    assert prometheus == {"metrics": 200, "decisions": 403, "explain": 403, "alertmanager": 401}
    assert grafana == {"metrics": 403, "decisions": 200, "explain": 200, "alertmanager": 401}
    assert alertmanager == {"metrics": 401, "decisions": 401, "explain": 401, "alertmanager": 200}
    assert mounted == {"metrics": 403, "decisions": 403, "explain": 403, "alertmanager": 401}


async def test_a_prometheus_scrapes_the_controller_as_the_chart_s_servicemonitor_says(
    real_backend: backends.Real, tmp_path: Path
) -> None:
    """The ServiceMonitor's endpoint (https, a bearer token, the self-signed certificate not
    verified) as a real Prometheus's scrape job, with the token of the chart's own scraper
    account (minted here: this server runs no token controller to fill its Secret): up, and
    the controller's series in Prometheus; the same job without the token is down (401)."""
    values = {"monitoring": {"serviceMonitor": {"enabled": True}, "crdCheck": False}}
    docs = render(values)
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert (endpoint["scheme"], endpoint["authorization"]["type"]) == ("https", "Bearer")
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    scraper = one(api_access_of(docs), "ServiceAccount")["metadata"]
    async with real_backend.open() as opened:
        apply_to(opened.objects, rbac_of(docs))
        apply_to(opened.objects, api_access_of(docs), user=service_account_of(docs))
        account = tokens.Account(opened.api, scraper["namespace"], scraper["name"])
        await tokens.until_allowed(
            opened.api, account.user, account.namespace, "get", endpoint["path"]
        )
        token_file = tmp_path / "token"
        token_file.write_text(await account.token())
        async with controller(opened) as server:
            target = f"127.0.0.1:{server.port}"
            how = (
                f"scheme: {endpoint['scheme']}\n"
                f"metrics_path: {endpoint['path']}\n"
                "tls_config: {insecure_skip_verify: true}\n"
            )
            with_token = how + (
                f"authorization: {{type: Bearer, credentials_file: {token_file}}}\n"
            )
            scraping = Scraping(tmp_path / "with", target, job="rebalancer", how=with_token)
            anonymous = Scraping(tmp_path / "without", target, job="rebalancer", how=how)
            for prometheus in (scraping, anonymous):
                await prometheus.start()
            try:
                await until("a scrape with the token", lambda: _up(scraping.url, 1), None, 20)
                await until("a scrape without it", lambda: _up(anonymous.url, 0), None, 20)
                info = await _query(scraping.url, "rebalancer_cluster_info")
                assert [r["metric"]["cluster_name"] for r in info] == ["default"]
            finally:
                for prometheus in (scraping, anonymous):
                    await prometheus.stop()


async def _query(url: str, expr: str) -> list[Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/api/v1/query", params={"query": expr}) as resp,
    ):
        return list((await resp.json())["data"]["result"])


async def _up(url: str, wanted: int) -> bool:
    found = await _query(url, 'up{job="rebalancer"}')
    return bool(found) and float(found[0]["value"][1]) == wanted
