"""The controller's Kubernetes client and its environment, over real HTTP to the API emulator:
the proxy the environment names is read once, when the client opens, as kubectl reads it;
``NO_PROXY`` keeps the server out of it; ``~/.netrc`` is never read (a file naming the API
server's host beside a bearer token made every request of the library's own session fail).

The proxy is a forwarding one of the test's own (plain HTTP, as the emulator is): it records
each request it carries and passes it on to the host the request names. ``emulator`` is the
adapters' seeded cluster (tests/adapters/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from sandbox.emulator.server import write_kubeconfig
from tests.support.emulated import Sandbox

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No proxy variable and no ``~/.netrc`` but what a test sets."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return monkeypatch


@asynccontextmanager
async def forwarding_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP proxy on loopback: its URL and the requests it carried ("GET /api/v1/nodes")."""
    carried: list[str] = []

    async def forward(request: web.Request) -> web.Response:
        carried.append(f"{request.method} {request.path}")
        target = f"http://{request.headers['Host']}{request.path_qs}"
        async with aiohttp.ClientSession() as onward:
            body = await request.read()
            async with onward.request(request.method, target, data=body or None) as answer:
                payload = await answer.read()
                return web.Response(
                    status=answer.status, body=payload, content_type=answer.content_type
                )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", carried
    finally:
        await runner.cleanup()


async def node_names(kubeconfig: Path) -> list[str]:
    async with kubeclient.api_client(kubeconfig) as api:
        nodes = await client.CoreV1Api(api).list_node()
    return [node.metadata.name for node in nodes.items]


async def test_a_netrc_naming_the_api_server_is_not_read(
    emulator: Sandbox, environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host = urlsplit(emulator.url).hostname
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine {host}\nlogin someone\npassword secret\n", encoding="utf-8")
    netrc.chmod(0o600)
    environment.setenv("NETRC", str(netrc))
    kubeconfig = write_kubeconfig(emulator.url, tmp_path / "kubeconfig", token="a-token")

    assert await node_names(kubeconfig)


@pytest.fixture
def kubeconfig(emulator: Sandbox, tmp_path: Path) -> Path:
    return write_kubeconfig(emulator.url, tmp_path / "kubeconfig")


async def test_the_environment_proxy_is_read_once_when_the_client_opens(
    kubeconfig: Path, environment: pytest.MonkeyPatch
) -> None:
    async with forwarding_proxy() as (proxy, carried):
        environment.setenv("HTTP_PROXY", proxy)
        async with kubeclient.api_client(kubeconfig) as api:
            environment.delenv("HTTP_PROXY")  # read at the open: what changes later is not
            nodes = await client.CoreV1Api(api).list_node()
            await client.CoreV1Api(api).list_pod_for_all_namespaces()

    assert nodes.items
    assert carried == ["GET /api/v1/nodes", "GET /api/v1/pods"]


async def test_no_proxy_naming_the_api_server_sends_it_direct(
    emulator: Sandbox, kubeconfig: Path, environment: pytest.MonkeyPatch
) -> None:
    environment.setenv("NO_PROXY", f"localhost,{urlsplit(emulator.url).hostname}")
    async with forwarding_proxy() as (proxy, carried):
        environment.setenv("HTTP_PROXY", proxy)
        names = await node_names(kubeconfig)

    assert names
    assert carried == []


def test_the_environment_proxy_is_the_one_for_the_servers_scheme(
    environment: pytest.MonkeyPatch,
) -> None:
    environment.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    environment.setenv("NO_PROXY", ".internal")

    assert kubeclient.environment_proxy("https://api.example:6443") == (
        "http://user:secret@proxy.example:3128"
    )
    assert kubeclient.environment_proxy("http://api.example:8080") is None
    assert kubeclient.environment_proxy("https://api.cluster.internal:6443") is None
