"""The HTTP API's gate against a cluster's own reviews: the emulator's, then a real
kube-apiserver's (TokenReview, SubjectAccessReview through kubernetes-asyncio).

The controller runs its gate as the chart's service account under the chart's rendered RBAC;
clients are the server's known users: no token and a wrong one (401), the controller's own
account, to which RBAC grants no URL of the API (403), and a cluster admin (200). A grant by
plain RBAC (a ClusterRole's ``nonResourceURLs``) opens exactly its route; a controller the
cluster does not let review is a 503, never a pass; a second request within the cache's time
asks the cluster nothing (counted). Service accounts with minted tokens, audiences, and the
chart's own ClusterRoles for others: tests/chart/test_api_access.py (a real server only: the
emulator mints no token).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import kubeauth
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.core.model import PoolName
from rebalancer.runtime import alerts as alerting
from rebalancer.runtime import http
from rebalancer.runtime.http import HttpServer
from rebalancer.runtime.telemetry import Telemetry
from tests.support import gates, kube, tokens
from tests.support.backends import Backend, Opened
from tests.support.chart import render
from tests.support.factories import T0
from tests.support.rbac import CONTROLLER_TOKEN, apply_to, rbac_of
from tests.support.tokens import MADE_HERE

PATHS = ("/metrics", "/api/v1/decisions", "/api/v1/explain")


@dataclass
class Served:
    server: HttpServer
    reviews: gates.Counted  # the controller's reviews, counted
    opened: Opened


@contextlib.asynccontextmanager
async def serving(
    backend: Backend, tmp_path: Path, docs: list[Any] | None = None
) -> AsyncIterator[Served]:
    """The API, its gate asking ``backend`` as the chart's account under ``docs``' RBAC."""
    async with backend.open(authorized=True) as opened:
        apply_to(opened.objects, rbac_of(render({}) if docs is None else docs))
        async with opened.client_as(CONTROLLER_TOKEN) as (api, _):
            reviews = gates.Counted(kubeauth.KubeReviews(api, timeout=5))
            store = alerting.AlertStore(
                {PoolName("l20"): ()}, max_age=timedelta(hours=1), clock=lambda: T0
            )
            server = HttpServer(
                telemetry=Telemetry(),
                store=MemoryAuditStore(),
                ready=lambda: http.Readiness(True, "caches synced"),
                gate=kubeauth.CachedGate(reviews, time.monotonic),
                host="127.0.0.1",
                port=0,
                health_port=0,
                alerts=alerting.Receiver(store, token=None, leading=lambda: True),
                explain=lambda node, pool: {"node": node},
            )
            async with server:
                yield Served(server, reviews, opened)


async def status(server: HttpServer, path: str, token: str | None, method: str = "GET") -> int:
    async with (
        gates.session(server.url, token) as session,
        session.request(method, path, params={"node": "n1"}) as resp,
    ):
        return resp.status


async def test_anonymous_wrong_token_unauthorized_and_authorized_answers(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every library's debug lines: still no token among them
    async with serving(backend, tmp_path) as s:
        for path in PATHS:
            answers = [
                await status(s.server, path, token)
                for token in (None, "not-a-token-of-this-cluster", CONTROLLER_TOKEN)
            ]
            answers.append(await status(s.server, path, kube.ADMIN_TOKEN))
            assert answers == [401, 401, 403, 200], path
    for token in ("not-a-token-of-this-cluster", kube.ADMIN_TOKEN):
        assert token not in caplog.text


async def test_a_cluster_role_s_non_resource_url_opens_its_route_and_no_other(
    backend: Backend, tmp_path: Path
) -> None:
    async with serving(backend, tmp_path) as s:
        rbac: Any = client.RbacAuthorizationV1Api(s.opened.api)  # dict bodies
        meta = {"name": "tests-metrics-reader", "labels": MADE_HERE}
        await rbac.create_cluster_role(
            {"metadata": meta, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}
        )
        subject = {
            "kind": "ServiceAccount",
            "name": kube.CONTROLLER_NAME,
            "namespace": kube.CONTROLLER_NAMESPACE,
        }
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": meta["name"]}
        await rbac.create_cluster_role_binding(
            {"metadata": meta, "roleRef": ref, "subjects": [subject]}
        )
        try:
            # The server's authorizer sees a new binding a moment later; the gate's first
            # question must come after, or its answer (a denial) is kept 30 s.
            await tokens.until_allowed(
                s.opened.api, kube.CONTROLLER_USER, kube.CONTROLLER_NAMESPACE, "get", "/metrics"
            )
            assert await status(s.server, "/metrics", CONTROLLER_TOKEN) == 200
            assert await status(s.server, "/api/v1/decisions", CONTROLLER_TOKEN) == 403
            # The write takes a token of the receiver's audience only: a static token is the
            # API server's alone.
            assert await status(s.server, "/api/v1/alertmanager", CONTROLLER_TOKEN, "POST") == 401
        finally:
            await rbac.delete_cluster_role_binding(meta["name"])
            await rbac.delete_cluster_role(meta["name"])


async def test_a_second_request_within_the_ttl_asks_the_cluster_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    async with serving(backend, tmp_path) as s:
        assert await status(s.server, "/metrics", kube.ADMIN_TOKEN) == 200
        assert (s.reviews.tokens, s.reviews.accesses) == (1, 1)
        for _ in range(5):
            assert await status(s.server, "/metrics", kube.ADMIN_TOKEN) == 200
        assert (s.reviews.tokens, s.reviews.accesses) == (1, 1)
        # Another route is another question for the authorizer, not for the authenticator.
        assert await status(s.server, "/api/v1/decisions", kube.ADMIN_TOKEN) == 200
        assert (s.reviews.tokens, s.reviews.accesses) == (1, 2)


async def test_a_controller_the_cluster_does_not_let_review_answers_503(
    backend: Backend, tmp_path: Path
) -> None:
    """The chart's RBAC without the reviews' rule: every review is refused (403 to the
    controller), and the client gets a 503, the admin too: never a pass."""
    docs = rbac_of(render({}))
    for doc in docs:
        if doc["kind"] == "ClusterRole":
            doc["rules"] = [
                r for r in doc["rules"] if "authentication.k8s.io" not in r.get("apiGroups", ())
            ]
    async with serving(backend, tmp_path, docs) as s:
        for token in (kube.ADMIN_TOKEN, CONTROLLER_TOKEN, "not-a-token"):
            assert await status(s.server, "/metrics", token) == 503
        assert await status(s.server, "/metrics", None) == 401  # no token: nothing to review
