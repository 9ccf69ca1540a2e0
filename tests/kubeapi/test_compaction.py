"""A resourceVersion compacted away: 410 Expired on a real kube-apiserver, and the informer lists
again.

etcd keeps old revisions until it is compacted (kube-apiserver compacts it every five minutes);
a watch that resumes from a version older than that is answered with an ``ERROR`` event carrying
a 410 ``Expired`` Status, and the client must list again. The session's server serves watches
from its watch cache, which answers an old version from what it holds, so the 410 cannot be
forced there in a test's time: these tests start a second server with ``--watch-cache=false``,
whose watches are served by etcd itself, and compact etcd on the spot (``KubeServer.compact``).
The emulator's 410 comes from its bounded history (``Store(history=N)``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rebalancer.adapters import kubeclient
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from sandbox.emulator.store import Store
from tests.support import kube
from tests.support.backends import log_requests
from tests.support.emulated import Requests
from tests.support.pools import MARKS
from tests.support.waits import Pulse, stop

MERGE = "application/merge-patch+json"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    with kube.running(tmp_path_factory.mktemp("uncached"), flags=["--watch-cache=false"]) as s:
        yield s


def node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def relabel(name: str, value: str) -> tuple[str, str, Any, str]:
    return ("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"i": value}}}, MERGE)


def events(raw: bytes) -> list[Obj]:
    return [json.loads(line) for line in raw.decode().splitlines() if line]


async def test_a_watch_from_a_compacted_version_is_410_expired_on_both_servers(
    uncached: kube.KubeServer,
) -> None:
    code, made = uncached.request("POST", "/api/v1/nodes", node("compacted"))
    assert code == 201, made
    since = made["metadata"]["resourceVersion"]
    for i in range(5):
        method, path, body, content_type = relabel("compacted", str(i))
        assert uncached.request(method, path, body, content_type=content_type)[0] == 200
    uncached.compact()
    watch = f"/api/v1/nodes?watch=true&resourceVersion={since}&timeoutSeconds=2"
    code, raw = uncached.raw("GET", watch)
    (real_event,) = events(raw)

    store = Store(history=3)  # five changes later, the first version is out of its history
    calls = [("POST", "/api/v1/nodes", node("compacted"), "application/json")]
    calls += [relabel("compacted", str(i)) for i in range(5)]
    answers = await kube.ask_emulator(store, calls)
    first = answers[0][1]["metadata"]["resourceVersion"]
    watch = f"/api/v1/nodes?watch=true&resourceVersion={first}&timeoutSeconds=2"
    ((emulated_code, emulated_event),) = await kube.ask_emulator(
        store, [("GET", watch, None, "application/json")]
    )

    assert (code, emulated_code) == (200, 200)  # the 410 is an event of an open stream
    assert real_event["type"] == emulated_event["type"] == "ERROR"
    for key in ("kind", "status", "reason", "code"):
        assert real_event["object"][key] == emulated_event["object"][key], key
    assert real_event["object"]["reason"] == "Expired"
    # The message names the layer that answered: etcd's here, the watch cache's on the
    # emulator (a known difference: sandbox/emulator/README.md).
    assert (
        real_event["object"]["message"] == "The resourceVersion for the provided watch is too old."
    )
    assert emulated_event["object"]["message"].startswith("too old resource version: ")


async def test_the_informer_lists_again_when_its_version_was_compacted_away(
    uncached: kube.KubeServer, tmp_path: Path
) -> None:
    for name in ("kept", "dropped"):
        assert uncached.request("POST", "/api/v1/nodes", node(name))[0] == 201
    pulse, held, parked = Pulse(), asyncio.Event(), []
    held.set()

    async def sleep(_: float) -> None:
        """The informer's pause between streams: held shut while the cluster moves on."""
        parked.append(1)
        pulse()
        try:
            await held.wait()
        finally:
            parked.pop()

    async with kubeclient.api_client(uncached.kubeconfig(tmp_path / "kubeconfig")) as api:
        asked = Requests()
        log_requests(api, asked)
        # Streams that end after a second, on the wall clock: the informer then waits at ``held``.
        informer = Informer(api, settings=WatchSettings(timeout_seconds=1), sleep=sleep)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            held.clear()
            await pulse.until(lambda: len(parked) == 2, within=30)
            # While it is away: changes, then a compaction past the version it holds.
            method, path, body, content_type = relabel("kept", "after")
            assert uncached.request(method, path, body, content_type=content_type)[0] == 200
            assert uncached.request("DELETE", "/api/v1/nodes/dropped")[0] == 200
            assert uncached.request("POST", "/api/v1/nodes", node("appeared"))[0] == 201
            uncached.compact()
            held.set()

            def relisted() -> bool:
                names = {str(v.name) for v in informer.node_views(MARKS)}
                return asked.lists_of("nodes") == 2 and "appeared" in names

            await pulse.until(relisted, within=30)
            views = {str(v.name): v for v in informer.node_views(MARKS)}
        finally:
            await stop(task)

    assert {"kept", "appeared"} <= set(views)
    assert "dropped" not in views
    assert views["kept"].labels.get("i") == "after"
    expired = [r for r in asked.watches_of("nodes") if r.status == 200]
    assert len(expired) >= 2, "a watch resumed from the compacted version, then one after the list"
