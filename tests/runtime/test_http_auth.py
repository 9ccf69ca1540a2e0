"""Who may use the HTTP API, over real HTTP and TLS: every route but the probes goes through the
gate, each verdict is its status, the probes' port serves only the probes, and the cache keeps
the cluster's answers for controller-runtime's times (the real TokenReview and
SubjectAccessReview: tests/kubeapi/test_http_auth_real.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rebalancer.adapters import kubeauth
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.adapters.kubeauth import Access, CachedGate, User, Verdict
from rebalancer.core.model import PoolName
from rebalancer.errors import ConfigError
from rebalancer.runtime import alerts as alerting
from rebalancer.runtime import http
from rebalancer.runtime import tls as certificates
from rebalancer.runtime.http import HttpServer
from rebalancer.runtime.telemetry import Telemetry
from tests.support import gates
from tests.support.factories import T0
from tests.support.processes import free_port

ROUTES = [
    ("GET", "/metrics"),
    ("GET", "/api/v1/decisions"),
    ("GET", "/api/v1/explain"),
    ("POST", "/api/v1/alertmanager"),
    ("GET", "/healthz"),  # not served here: still the gate's first
    ("GET", "/nothing-here"),
]


@asynccontextmanager
async def serve(
    gate: kubeauth.Gate, tls: ssl.SSLContext | None = None
) -> AsyncIterator[HttpServer]:
    store = alerting.AlertStore({PoolName("l20"): ()}, max_age=timedelta(hours=1), clock=lambda: T0)
    server = HttpServer(
        telemetry=Telemetry(),
        store=MemoryAuditStore(),
        ready=lambda: http.Readiness(True, "caches synced"),
        gate=gate,
        host="127.0.0.1",
        port=0,
        health_port=0,
        tls=tls,
        alerts=alerting.Receiver(store, token=None, leading=lambda: True),
        explain=lambda node, pool: {"node": node},
    )
    async with server:
        yield server


async def ask(
    server: HttpServer, method: str, path: str, token: str | None
) -> tuple[int, dict[str, Any]]:
    async with (
        gates.session(server.url, token) as session,
        session.request(method, path, data=b"{}") as resp,
    ):
        body = await resp.json() if resp.content_type == "application/json" else {}
        return resp.status, body


# ---------------------------------------------------------------------------------------------
# The API port


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_a_request_without_a_token_is_a_401_on_every_route(method: str, path: str) -> None:
    gate = gates.Grants.everything()
    async with serve(gate) as server:
        for token in (None, ""):
            status, body = await ask(server, method, path, token)
            assert (status, body["error"]) == (401, "unauthorized")
    assert [token for token, _ in gate.asked] == [None, None]  # '' is no token


async def test_each_verdict_is_its_status_and_none_is_a_pass() -> None:
    gate = gates.Grants({"reader": "reader"}, {"reader": {"get /metrics"}})
    async with serve(gate) as server:
        assert (await ask(server, "GET", "/metrics", "reader"))[0] == 200
        status, body = await ask(server, "GET", "/api/v1/decisions", "reader")
        assert (status, body) == (
            403,
            {"error": "forbidden", "message": "reader may not get decisions.rebalancer.io"},
        )
        status, body = await ask(server, "GET", "/metrics", "forged")
        assert (status, body["error"]) == (401, "unauthorized")
        gate.unavailable = True
        status, body = await ask(server, "GET", "/metrics", "reader")
        assert (status, body["error"]) == (503, "review_unavailable")
        assert "10 s" in body["message"]


async def test_the_401_asks_for_a_bearer_token() -> None:
    async with (
        serve(gates.Grants()) as server,
        gates.session(server.url, None) as session,
        session.get("/metrics") as resp,
    ):
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"] == 'Bearer realm="rebalancer"'


def test_each_route_is_what_plain_rbac_grants() -> None:
    def asked(method: str, path: str) -> str:
        found = http.access(method, path, "rebalancer")
        return f"{found} {list(found.audiences)}"

    assert asked("GET", "/metrics") == "get /metrics []"
    assert asked("GET", "/api/v1/decisions") == "get decisions.rebalancer.io []"
    assert asked("GET", "/api/v1/explain") == "get explanations.rebalancer.io []"
    # The write takes only a token minted for the receiver's audience.
    assert asked("POST", "/api/v1/alertmanager") == "create alerts.rebalancer.io ['rebalancer']"
    # Anything else is its URL and method, as kube-apiserver maps a non-resource request.
    assert asked("DELETE", "/api/v1/decisions") == "delete /api/v1/decisions []"
    assert asked("GET", "/nothing-here") == "get /nothing-here []"


async def test_the_gate_is_asked_the_route_s_access_and_the_request_s_token() -> None:
    gate = gates.Grants.everything()
    async with serve(gate) as server:
        assert (await ask(server, "GET", "/api/v1/explain?node=n1", gates.TOKEN))[0] == 200
        await ask(server, "POST", "/api/v1/alertmanager", gates.TOKEN)
    assert [(token, str(a), a.audiences) for token, a in gate.asked] == [
        (gates.TOKEN, "get explanations.rebalancer.io", ()),
        (gates.TOKEN, "create alerts.rebalancer.io", ("rebalancer",)),
    ]


# ---------------------------------------------------------------------------------------------
# The probes' port


async def test_the_probes_port_serves_the_probes_and_nothing_else() -> None:
    gate = gates.Grants.everything()
    async with serve(gate) as server, aiohttp.ClientSession(server.health_url) as plain:
        for path in ("/healthz", "/readyz"):
            async with plain.get(path) as resp:
                assert resp.status == 200, path
        for method, path in ROUTES[:4]:
            async with plain.request(method, path) as resp:
                assert resp.status == 404, path
        # And the API's port has no probe: a token does not find one there.
        assert (await ask(server, "GET", "/healthz", gates.TOKEN))[0] == 404
    assert [str(a) for _, a in gate.asked] == ["get /healthz"]  # the probes asked no one


async def test_the_api_port_speaks_only_tls() -> None:
    async with serve(gates.Grants.everything()) as server, aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            await plain.get(server.url.replace("https://", "http://") + "/metrics")


# ---------------------------------------------------------------------------------------------
# The certificate


async def test_a_mounted_certificate_is_the_one_served(tmp_path: Path) -> None:
    cert, key = certificates.self_signed("localhost")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    served = certificates.context(tmp_path / "tls.crt", tmp_path / "tls.key")
    trusting = ssl.create_default_context(cadata=cert.decode())
    async with serve(gates.Grants.everything(), tls=served) as server:
        url = f"https://localhost:{server.port}/metrics"
        auth = {"Authorization": f"Bearer {gates.TOKEN}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=trusting, headers=auth) as r,
        ):
            assert r.status == 200


def test_a_certificate_that_cannot_be_read_names_the_setting_and_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    with pytest.raises(ConfigError, match=rf"http.tls.cert_file='{missing}': no such file"):
        certificates.context(missing, tmp_path / "nope.key")
    (tmp_path / "bad.crt").write_text("not a certificate")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(ConfigError, match="not a PEM certificate and its key"):
        certificates.context(tmp_path / "bad.crt", tmp_path / "bad.key")


# ---------------------------------------------------------------------------------------------
# The cache


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached() -> tuple[CachedGate, gates.Counted, gates.Scripted, Ticks]:
    scripted = gates.Scripted(
        {"good": User("alice"), "other": User("bob")}, {"alice": {"get /metrics"}}
    )
    counted, ticks = gates.Counted(scripted), Ticks()
    return CachedGate(counted, ticks), counted, scripted, ticks


METRICS = Access("get", path="/metrics")
DECISIONS = Access("get", group="rebalancer.io", resource="decisions")


async def test_a_second_request_within_the_ttls_asks_no_review() -> None:
    gate, counted, _, ticks = cached()
    assert (await gate.admit("good", METRICS)).verdict is Verdict.ALLOWED
    assert (counted.tokens, counted.accesses) == (1, 1)
    ticks.now += 59
    assert (await gate.admit("good", METRICS)).verdict is Verdict.ALLOWED
    assert (counted.tokens, counted.accesses) == (1, 1)
    ticks.now += 1  # the token's minute is over; the allow's five are not
    assert (await gate.admit("good", METRICS)).verdict is Verdict.ALLOWED
    assert (counted.tokens, counted.accesses) == (2, 1)
    ticks.now += 240  # five minutes since the allow
    await gate.admit("good", METRICS)
    assert (counted.tokens, counted.accesses) == (3, 2)


async def test_a_denial_is_kept_30_seconds_and_a_rejected_token_a_minute() -> None:
    gate, counted, scripted, ticks = cached()
    assert (await gate.admit("good", DECISIONS)).verdict is Verdict.FORBIDDEN
    scripted.grants["alice"].add("get decisions.rebalancer.io")  # granted meanwhile
    ticks.now += 29
    assert (await gate.admit("good", DECISIONS)).verdict is Verdict.FORBIDDEN
    ticks.now += 1
    assert (await gate.admit("good", DECISIONS)).verdict is Verdict.ALLOWED
    assert counted.accesses == 2

    assert (await gate.admit("forged", METRICS)).verdict is Verdict.UNAUTHENTICATED
    ticks.now += 59
    assert (await gate.admit("forged", METRICS)).verdict is Verdict.UNAUTHENTICATED
    assert counted.tokens == 2  # good once, forged once
    ticks.now += 1
    await gate.admit("forged", METRICS)
    assert counted.tokens == 3


async def test_a_review_that_cannot_be_made_is_never_a_pass_and_never_kept() -> None:
    gate, counted, scripted, _ = cached()
    scripted.unavailable = True
    answer = await gate.admit("good", METRICS)
    assert answer.verdict is Verdict.UNAVAILABLE
    scripted.unavailable = False
    assert (await gate.admit("good", METRICS)).verdict is Verdict.ALLOWED
    assert counted.tokens == 2


async def test_tokens_are_kept_as_digests_and_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, _, scripted, _ = cached()
    caplog.set_level("DEBUG")
    await gate.admit("good", METRICS)
    await gate.admit("forged", METRICS)
    scripted.unavailable = True
    await gate.admit("good-too", METRICS)
    kept = repr(gate.tokens.kept) + repr(gate.decisions.kept)
    assert kubeauth.digest("good") in kept
    for token in ("good", "forged", "good-too"):
        assert f"'{token}'" not in kept
        assert token not in caplog.text.replace("goodness", "")


async def test_an_empty_token_asks_no_review() -> None:
    gate, counted, _, _ = cached()
    for token in (None, ""):
        assert (await gate.admit(token, METRICS)).verdict is Verdict.UNAUTHENTICATED
    assert counted.tokens == 0


async def test_an_api_server_that_cannot_be_reached_or_does_not_answer_is_a_503() -> None:
    """The real reviews, against a port nobody serves and one that never answers."""
    from kubernetes_asyncio import client

    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # takes the request, answers nothing, closed by the test

    hung = await asyncio.start_server(silent, "127.0.0.1", 0)
    hung_port = hung.sockets[0].getsockname()[1]
    try:
        for host, timeout in (
            (f"http://127.0.0.1:{free_port()}", 5.0),
            (f"http://127.0.0.1:{hung_port}", 0.2),
        ):
            async with client.ApiClient(client.Configuration(host=host)) as api:
                gate = CachedGate(kubeauth.KubeReviews(api, timeout=timeout), Ticks())
                async with serve(gate) as server:
                    status, body = await ask(server, "GET", "/metrics", "any-token")
            assert (status, body["error"]) == (503, "review_unavailable"), host
            assert "TokenReview" in body["message"]
            assert "any-token" not in body["message"]
    finally:
        hung.close()
        for writer in held:
            writer.close()
            await writer.wait_closed()
        await hung.wait_closed()


def test_a_bearer_header_gives_its_token_and_nothing_else_does() -> None:
    assert kubeauth.bearer("Bearer abc") == "abc"
    assert kubeauth.bearer("bearer  abc ") == "abc"
    for header in (None, "", "Bearer", "Bearer ", "Basic YWxhZGRpbjpvcGVu", "abc"):
        assert kubeauth.bearer(header) is None, header
