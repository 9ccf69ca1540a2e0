"""Kueue Workloads as takers, read by the informer from a real kube-apiserver serving Kueue
v0.17.0's own Workload CRD (``tests/support/kueue.py``; docs/design/takers.md#kueue-workloads).

The emulator serves no custom resources, so this runs on the real server. Kueue itself is not
running here: the tests write what it would (a Workload for a suspended Job, then its
``status.admission``), through the CRD's own schema and its ``status`` subresource.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from rebalancer.adapters import kubeclient
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import Backoff, Reflector, WatchSettings
from rebalancer.core import model
from rebalancer.core.model import Taint
from tests.support import kube, kueue
from tests.support.chart import render

MARKS = model.PodMarks(
    lend_taints=(Taint("rebalancer.io/lent", "NoSchedule", "training"),),
    serving_taints=(Taint("workload", "NoSchedule", "inference"),),
)
FAST = WatchSettings(timeout_seconds=30, backoff=Backoff(initial=0.05, maximum=0.2))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    """A server of the module's own: a CRD is cluster-wide, and one test starts without it."""
    with kube.running(tmp_path_factory.mktemp("kueue")) as started:
        yield started


def namespace(server: kube.KubeServer) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, doc = server.request("POST", "/api/v1/namespaces", body)
    assert code == 201, doc
    return name


def create(server: kube.KubeServer, body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    code, doc = server.request("POST", kueue.path(meta["namespace"]), body)
    assert code == 201, doc
    return dict(doc)


def set_admission(server: kube.KubeServer, wl: dict[str, Any], admitted: bool) -> None:
    """What Kueue writes when it reserves quota (``admitted``) or evicts and requeues."""
    meta = wl["metadata"]
    where = kueue.path(meta["namespace"], meta["name"]) + "/status"
    patch = {"status": {"admission": kueue.admission(wl) if admitted else None}}
    code, doc = server.request("PATCH", where, patch, content_type="application/merge-patch+json")
    assert code == 200, doc


@contextlib.asynccontextmanager
async def informing(
    server: kube.KubeServer, home: Path, token: str = kube.ADMIN_TOKEN
) -> AsyncIterator[Informer]:
    config = server.kubeconfig(home / f"kubeconfig-{uuid.uuid4().hex[:6]}", token)
    async with kubeclient.api_client(config) as api:
        informer = Informer(api, settings=FAST, watch_pending=True, watch_workloads=True)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            yield informer
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def until(check: Callable[[], object], within: float = 20.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), within)


def names(informer: Informer) -> list[str]:
    return [f"{p.namespace}/{p.name}" for p in informer.pending(MARKS)]


async def test_without_the_crd_the_informer_syncs_says_so_and_reads_workloads_once_served(
    server: kube.KubeServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rebalancer.adapters.informer")
    async with informing(server, tmp_path) as informer:
        assert informer.workloads is not None
        assert not informer.workloads.served
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        assert (
            "CustomResourceDefinition workloads.kueue.x-k8s.io (v1beta2) is not served"
            in (errors[0])
        )
        assert informer.pending(MARKS) == ()

        kueue.install_workloads(server)
        ns = namespace(server)
        create(server, kueue.workload("job-llama", ns, workers=3))
        await until(lambda: len(informer.pending(MARKS)) == 4)
        assert informer.workloads.served
        # Said once: the retries while it was missing were not logged again at ERROR.
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


async def test_the_informer_follows_workloads_as_kueue_moves_them(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    kueue.install_workloads(server)
    ns = namespace(server)
    waiting = create(server, kueue.workload("job-a", ns, workers=2, priority=50))
    create(server, kueue.workload("job-untolerated", ns, tolerate_lent=False))
    create(server, kueue.workload("job-inactive", ns, active=False))
    admitted = create(server, kueue.workload("job-admitted", ns))
    set_admission(server, admitted, admitted=True)

    async with informing(server, tmp_path) as informer:
        assert informer.workloads is not None
        ours = [p for p in informer.pending(MARKS) if p.namespace == ns]
        assert [p.name for p in ours] == ["job-a/launcher-0", "job-a/workers-0", "job-a/workers-1"]
        assert {p.job for p in ours} == {f"{ns}/job-a"}
        assert {p.priority for p in ours} == {50}
        assert ours[1].requests == model.Resources(gpu=1, cpu=1000, memory=0)
        assert ours[0].created is not None
        lists = informer.workloads.lists

        informer.changed.clear()
        create(server, kueue.workload("job-b", ns, workers=1))
        await until(lambda: f"{ns}/job-b/workers-0" in names(informer))
        assert informer.changed.is_set()  # a Workload that starts to wait wakes the loop

        set_admission(server, waiting, admitted=True)  # Kueue admits job-a: its pods come next
        await until(lambda: f"{ns}/job-a/workers-0" not in names(informer))

        set_admission(server, waiting, admitted=False)  # evicted and requeued: waits again
        await until(lambda: f"{ns}/job-a/workers-0" in names(informer))

        code, doc = server.request("DELETE", kueue.path(ns, "job-a"))
        assert code == 200, doc
        await until(lambda: not any(n.startswith(f"{ns}/job-a/") for n in names(informer)))
        assert informer.workloads.lists == lists  # all of it from the watch
        assert informer.unreadable() == {}


def streams(informer: Informer) -> list[Reflector]:
    return [
        r
        for r in (informer.nodes, informer.pods, informer.pending_pods, informer.workloads)
        if r is not None
    ]


def open_connections(server: kube.KubeServer) -> list[asyncio.Transport]:
    """The process's socket transports to ``server`` that are not closed nor closing."""
    port = urlsplit(server.url).port
    return [
        t
        for t in gc.get_objects()
        if isinstance(t, asyncio.Transport)
        and not t.is_closing()
        and (t.get_extra_info("peername") or ("", 0))[1] == port
    ]


async def test_an_informer_stopped_leaves_no_connection_to_the_server_open(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    """Its watches are cut, not shut down over TLS: a shutdown waits for the server's
    close_notify, so each socket outlived the informer by as long as the server took to answer
    (for good, when the event loop ended first: then it warned when collected, in whatever test
    ran next). A server that answers nothing makes the wait certain."""
    kueue.install_workloads(server)
    with contextlib.ExitStack() as stack:
        async with informing(server, tmp_path) as informer:
            await until(lambda: all(r.watches for r in streams(informer)))  # all four open
            assert open_connections(server)
            stack.enter_context(server.frozen())  # it stops while the server answers nothing
        await asyncio.sleep(0)  # an aborted socket is closed on the loop's next turn
        assert open_connections(server) == []


async def test_the_charts_role_lets_the_controller_watch_workloads_when_it_is_on(
    server: kube.KubeServer, tmp_path: Path
) -> None:
    """As the chart's service account, under the ClusterRole the chart renders with
    ``takers.kueue_workloads`` on: Workloads are listed and watched, nothing is refused."""
    kueue.install_workloads(server)
    docs = render({"config": {"takers": {"kueue_workloads": True}}})
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            plural = doc["kind"].lower() + "s"
            where = f"/apis/rbac.authorization.k8s.io/v1/{plural}"
            code, answer = server.request("POST", where, doc)
            assert code in (201, 409), answer
    ns = namespace(server)
    create(server, kueue.workload("job-rbac", ns, workers=1))
    mark = server.audit_mark()

    def asked() -> list[Any]:
        decisions = server.decisions(kube.CONTROLLER_USER, mark)
        return [d for d in decisions if d.resource == "workloads"]

    async with informing(server, tmp_path, kube.CONTROLLER_TOKEN) as informer:
        await until(lambda: f"{ns}/job-rbac/workers-0" in names(informer))
        await until(lambda: any(d.verb == "watch" for d in asked()))  # its stream has started
    assert {(d.verb, d.group) for d in asked()} == {
        ("list", "kueue.x-k8s.io"),
        ("watch", "kueue.x-k8s.io"),
    }
    assert all(d.allowed for d in asked())
