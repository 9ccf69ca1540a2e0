"""The server itself: kubeconfig, unknown paths, the ``rebalancer sandbox`` entry point, and the
request observer (``serve(on_request=...)``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.faults import FaultInjector, Faults
from sandbox.emulator.resources import NODES
from sandbox.emulator.server import Request, serve
from sandbox.emulator.store import Store
from tests.support.emulated import Sandbox
from tests.support.reads import raw


async def test_a_written_kubeconfig_loads_with_load_kube_config(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    from sandbox.emulator.server import write_kubeconfig

    path = write_kubeconfig(sandbox.url, tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        nodes = await client.CoreV1Api(api).list_node()
    assert configuration.host == sandbox.url
    assert nodes.items == []


async def test_an_unknown_resource_gets_a_404_status(sandbox: Sandbox) -> None:
    response = await sandbox.api.call_api(
        "/apis/apps/v1/namespaces/x/deployments", "GET", _preload_content=False
    )
    assert response.status == 404
    assert (await raw(response))["reason"] == "NotFound"


async def test_a_cluster_scoped_resource_has_no_namespaced_path(sandbox: Sandbox) -> None:
    response = await sandbox.api.call_api(
        "/api/v1/namespaces/x/nodes", "GET", _preload_content=False
    )
    assert response.status == 404
    await raw(response)


async def test_the_sandbox_command_serves_a_seeded_cluster_until_stopped(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from sandbox.emulator.server import main; sys.exit(main(sys.argv[1:]))",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        serving = await asyncio.wait_for(process.stdout.readline(), 20)
        written = await asyncio.wait_for(process.stdout.readline(), 20)
        assert serving.startswith(b"rebalancer sandbox: serving http://127.0.0.1:")
        assert str(kubeconfig).encode() in written
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        async with client.ApiClient(configuration) as api:
            nodes = await client.CoreV1Api(api).list_node(label_selector="gpu-pool=inference")
        assert len(nodes.items) == 8
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0


# ---------------------------------------------------------------------------------------------
# The request observer: told of what came over HTTP, as the server answered it


@contextlib.asynccontextmanager
async def observed(
    on_request: Callable[[Request], object],
) -> AsyncIterator[tuple[Store, FaultInjector, aiohttp.ClientSession, str]]:
    store = Store(ManualClock(datetime(2026, 3, 2, 12, tzinfo=UTC)), seed=1)
    cluster.seed(store)
    faults = FaultInjector()
    async with (
        serve(store, faults=faults, on_request=on_request) as url,
        aiohttp.ClientSession() as session,
    ):
        yield store, faults, session, url


async def test_the_observer_is_told_of_each_list_get_and_write_with_what_was_answered() -> None:
    seen: list[Request] = []
    patch = {"metadata": {"labels": {"rebalancer.io/state": "lent"}}}
    async with observed(seen.append) as (store, _, session, url):
        async with session.get(f"{url}/api/v1/nodes?labelSelector=gpu-pool%3Dinference") as r:
            assert r.status == 200
        async with session.get(f"{url}/api/v1/namespaces/inference/pods/absent") as r:
            assert r.status == 404
        async with session.patch(
            f"{url}/api/v1/nodes/inference-3",
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        ) as r:
            assert r.status == 200
        stored = store.get(NODES, None, "inference-3")

    listed, missing, patched = seen
    assert (listed.method, listed.verb, listed.resource) == ("GET", "list", "nodes")
    assert listed.is_list
    assert not listed.is_watch
    assert not listed.is_write
    assert listed.query == {"labelSelector": "gpu-pool=inference"}
    assert listed.response is None  # reads are not echoed: a list can be large
    assert (missing.verb, missing.resource, missing.namespace, missing.name, missing.status) == (
        "get",
        "pods",
        "inference",
        "absent",
        404,
    )
    assert (patched.verb, patched.resource, patched.name, patched.status) == (
        "patch",
        "nodes",
        "inference-3",
        200,
    )
    assert patched.response is not None
    assert patched.response["metadata"]["labels"]["rebalancer.io/state"] == "lent"
    assert patched.response["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


async def test_a_watch_is_told_as_its_stream_opens_before_any_event_arrives() -> None:
    seen: list[Request] = []
    async with observed(seen.append) as (store, _, session, url):
        since = str(store.resource_version)
        async with session.get(
            f"{url}/api/v1/pods?watch=true&resourceVersion={since}&timeoutSeconds=300"
        ) as r:
            assert r.status == 200
            # No change has happened: the stream is open and silent, and the watch already told.
            [watch] = seen
    assert watch.is_watch
    assert watch.flag("watch")
    assert not watch.flag("allowWatchBookmarks")
    assert (watch.resource, watch.namespace, watch.status) == ("pods", "", 200)
    assert watch.query["resourceVersion"] == since
    assert watch.query["timeoutSeconds"] == "300"


async def test_an_injected_fault_is_told_with_its_status_and_nothing_stored() -> None:
    seen: list[Request] = []
    patch = json.dumps({"metadata": {"labels": {"x": "y"}}})
    async with observed(seen.append) as (store, faults, session, url):
        before = store.get(NODES, None, "inference-0")["metadata"]["resourceVersion"]
        faults.configure(Faults(conflict_rate=1.0))
        async with session.patch(
            f"{url}/api/v1/nodes/inference-0",
            data=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        ) as r:
            assert r.status == 409
        after = store.get(NODES, None, "inference-0")["metadata"]["resourceVersion"]

    [refused] = seen
    assert refused.status == 409
    assert refused.response is not None
    assert (refused.response["kind"], refused.response["reason"]) == ("Status", "Conflict")
    assert after == before


async def test_an_observer_that_raises_changes_nothing_of_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(_: Request) -> None:
        raise RuntimeError("the test's observer is broken")

    async with observed(broken) as (_, _, session, url), session.get(f"{url}/api/v1/nodes") as r:
        assert r.status == 200
        assert len((await r.json())["items"]) == 12
    assert "the request observer raised on GET /api/v1/nodes" in caplog.text
