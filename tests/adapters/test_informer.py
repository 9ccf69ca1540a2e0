"""The informer over HTTP: one list per resource, then watches only; on the emulator and on a real
kube-apiserver. What needs the emulator (a dropped stream, a watch timeout or bookmark on the
test's clock, a history short enough to expire) runs on it alone."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import informer as informer_module
from rebalancer.adapters import kubeclient
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import Backoff, WatchSettings
from rebalancer.core import model
from rebalancer.core.model import NodeView, PodRole, Taint
from rebalancer.errors import ConfigError
from sandbox.emulator import cluster
from sandbox.emulator.faults import Faults
from sandbox.emulator.resources import NODES
from sandbox.emulator.server import write_kubeconfig
from sandbox.emulator.store import DeleteOptions
from tests.support import emulated, objects
from tests.support.backends import Objects, Opened
from tests.support.emulated import Sandbox
from tests.support.objects import bound
from tests.support.waits import Pulse, stop

MARKS = model.PodMarks(
    lend_taints=(Taint("rebalancer.io/lent", "NoSchedule", "training"),),
    serving_taints=(Taint("workload", "NoSchedule", "inference"),),
)
TIMEOUT = 300  # the informer's watch timeoutSeconds, on the emulator's clock


class Gate:
    """An injectable sleep that returns at once while open and holds the caller while shut."""

    def __init__(self, pulse: Pulse) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.delays: list[float] = []
        self.waiting = 0
        self._pulse = pulse

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.waiting += 1
        self._pulse()
        try:
            await self.open.wait()
        finally:
            self.waiting -= 1


class Running:
    def __init__(self, informer: Informer, gate: Gate, pulse: Pulse) -> None:
        self.informer, self.gate, self.pulse = informer, gate, pulse
        self.changes: list[tuple[str, str]] = []  # what on_change reported: (node, why)

    def has(self, name: str) -> bool:
        return any(v.name == name for v in self.informer.node_views(MARKS))

    def view(self, name: str) -> NodeView:
        found = [v for v in self.informer.node_views(MARKS) if v.name == name]
        assert found, f"no node {name} in the cache"
        return found[0]

    async def until(self, check: Callable[[], object]) -> None:
        await self.pulse.until(lambda: bool(check()))


def as_opened(box: Sandbox) -> Opened:
    return Opened("emulator", box.store, box.clock, box.api, box.requests, box)


@asynccontextmanager
async def informing(
    box: Opened, watch_pending: bool = False, freeze: bool = False
) -> AsyncIterator[Running]:
    pulse = box.requests.pulse
    gate = Gate(pulse)

    def record(node: str, why: str) -> None:
        running.changes.append((node, why))
        pulse()

    informer = Informer(
        box.api,
        settings=WatchSettings(timeout_seconds=TIMEOUT),
        sleep=gate.sleep,
        on_change=record,
        freeze_after_sync=freeze,
        watch_pending=watch_pending,
    )
    running = Running(informer, gate, pulse)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        yield running
    finally:
        await stop(task)


def _bind(target: Objects, pod: dict[str, Any], node: str) -> None:
    objects.add(target, bound(pod, node))


async def test_the_first_sync_holds_every_node_with_its_running_pods(
    seeded: Opened,
) -> None:
    _bind(seeded.objects, cluster.inference_pod(0), "inference-0")
    _bind(seeded.objects, cluster.training_pod("bert", 0), "inference-1")
    objects.add(seeded.objects, cluster.training_pod("pending", 0))  # never scheduled
    _bind(seeded.objects, cluster.training_pod("done", 0), "inference-2")
    objects.finish_pod(seeded.objects, "training", "done-0")

    async with informing(seeded) as run:
        views = run.informer.node_views(MARKS)

    assert [v.name for v in views] == sorted(
        [f"inference-{i}" for i in range(8)] + [f"training-{i}" for i in range(4)]
    )
    by_name = {str(v.name): v for v in views}
    assert [(p.name, p.role) for p in by_name["inference-0"].pods] == [
        ("llm-serving-7d9f8c6b5-00000", PodRole.INFERENCE)
    ]
    assert [(p.name, p.role) for p in by_name["inference-1"].pods] == [("bert-0", PodRole.BORROWED)]
    assert by_name["inference-2"].pods == ()  # finished: dropped
    assert sum(len(v.pods) for v in views) == 2  # the pending pod is on no node
    assert seeded.requests.lists_of("nodes") == 1
    assert seeded.requests.lists_of("pods") == 1


async def test_pods_waiting_for_a_node_are_the_takers_of_lent_nodes(seeded: Opened) -> None:
    """Only with ``watch_pending``: a pending pod that tolerates the lent taint is a taker; one
    that does not is not; one bound to a node never was; a deleted one leaves."""
    objects.add(seeded.objects, cluster.training_pod("early", 0))
    foreign = cluster.training_pod("foreign", 0)
    foreign["spec"]["tolerations"] = []
    objects.add(seeded.objects, foreign)
    _bind(seeded.objects, cluster.training_pod("placed", 0), "inference-1")

    async with informing(seeded, watch_pending=True) as run:
        assert [p.name for p in run.informer.pending(MARKS)] == ["early-0"]
        early = run.informer.pending(MARKS)[0]
        assert early.job == "training/early"
        assert early.requests == model.Resources(gpu=8)
        assert early.affinity[0][0] == model.Requirement(
            "gpu-pool", "In", ("training", "inference")
        )
        objects.add(seeded.objects, cluster.training_pod("late", 0))
        await run.until(lambda: len(run.informer.pending(MARKS)) == 2)
        assert ("", "pod training/late-0 waits for a node") in run.changes
        core = client.CoreV1Api(seeded.api)
        await core.delete_namespaced_pod("early-0", "training", grace_period_seconds=0)
        await run.until(lambda: [p.name for p in run.informer.pending(MARKS)] == ["late-0"])
        assert seeded.requests.lists_of("pods") == 2  # running pods, pending pods: once each


async def test_a_sync_logs_a_line_per_list_not_per_object(
    emulator: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rebalancer.adapters.informer")
    box = as_opened(emulator)
    for i in range(40):
        _bind(box.objects, cluster.training_pod(f"job-{i}", 0), f"inference-{i % 8}")

    async with informing(box) as run:
        assert sum(len(v.pods) for v in run.informer.node_views(MARKS)) == 40

    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.INFO and r.name.startswith("rebalancer.adapters.informer")
    ]
    assert len(lines) == 3, lines  # nodes listed, pods listed, synced
    assert lines[-1] == "informer synced: 12 nodes, 40 pods"


async def test_annotation_and_label_changes_and_a_landing_pod_show_up_with_no_new_list(
    seeded: Opened,
) -> None:
    async with informing(seeded) as run:
        objects.annotate(seeded.objects, "inference-3", {"rebalancer.io/lend": "never"})
        await run.until(lambda: run.view("inference-3").annotations.get("rebalancer.io/lend"))
        objects.label(seeded.objects, "inference-4", {"rebalancer.io/state": "lent"})
        await run.until(lambda: "rebalancer.io/state" in run.view("inference-4").labels)
        _bind(seeded.objects, cluster.training_pod("gpt", 1), "inference-5")
        await run.until(lambda: len(run.view("inference-5").pods) == 1)

        assert ("inference-3", "node annotations changed") in run.changes
        assert ("inference-4", "node labels changed") in run.changes
        assert ("inference-5", "pod training/gpt-1 landed") in run.changes
        assert run.informer.changed.is_set()
        assert seeded.requests.lists_of("nodes") == 1
        assert seeded.requests.lists_of("pods") == 1
        watches = seeded.requests.watches
        assert all(w.flag("allowWatchBookmarks") for w in watches)
        assert all(w.query.get("timeoutSeconds") == str(TIMEOUT) for w in watches)


async def test_a_watch_that_times_out_is_resumed_not_listed_again(emulator: Sandbox) -> None:
    # Emulator only: the watch times out on the test's clock here, on the wall clock there.
    requests = emulator.requests
    async with informing(as_opened(emulator)) as run:
        await run.until(lambda: requests.watches_of("nodes") and requests.watches_of("pods"))
        emulator.clock.advance(TIMEOUT)
        await run.until(lambda: len(emulator.requests.watches_of("nodes")) >= 2)
        await run.until(lambda: len(emulator.requests.watches_of("pods")) >= 2)
        assert emulator.requests.lists_of("nodes") == 1
        assert emulator.requests.lists_of("pods") == 1


async def test_a_pod_that_finishes_or_is_deleted_leaves_its_node(seeded: Opened) -> None:
    _bind(seeded.objects, cluster.training_pod("a", 0), "inference-6")
    _bind(seeded.objects, cluster.training_pod("b", 0), "inference-7")
    async with informing(seeded) as run:
        objects.finish_pod(seeded.objects, "training", "a-0")
        core = client.CoreV1Api(seeded.api)
        await core.delete_namespaced_pod("b-0", "training", grace_period_seconds=0)
        await run.until(
            lambda: not run.view("inference-6").pods and not run.view("inference-7").pods
        )
        assert ("inference-6", "pod training/a-0 left") in run.changes
        assert ("inference-7", "pod training/b-0 left") in run.changes


async def test_unchanged_nodes_give_back_the_identical_view(seeded: Opened) -> None:
    async with informing(seeded) as run:
        before = {str(v.name): v for v in run.informer.node_views(MARKS)}
        assert run.informer.node_views(MARKS) == tuple(before[n] for n in sorted(before))
        objects.annotate(seeded.objects, "training-0", {"rebalancer.io/paused": "true"})
        await run.until(lambda: run.view("training-0") is not before["training-0"])
        after = {str(v.name): v for v in run.informer.node_views(MARKS)}

    assert after["training-0"].annotations == {"rebalancer.io/paused": "true"}
    assert all(after[n] is before[n] for n in before if n != "training-0")


async def test_a_node_changed_alone_keeps_its_pod_views_and_a_pod_change_rebuilds_them(
    emulator: Sandbox,
) -> None:
    # A heartbeat or a label is a new view of the node, not of its pods: their views are kept
    # (building them again was most of the cost of a changed node), and only while no pod of
    # the node changed.
    box = as_opened(emulator)
    _bind(box.objects, cluster.training_pod("gpt", 1), "inference-5")
    async with informing(box) as run:
        before = run.view("inference-5")
        objects.annotate(box.objects, "inference-5", {"rebalancer.io/lend": "never"})
        await run.until(lambda: run.view("inference-5") is not before)
        annotated = run.view("inference-5")
        _bind(box.objects, cluster.training_pod("gpt", 2), "inference-5")
        await run.until(lambda: len(run.view("inference-5").pods) == 2)
        objects.finish_pod(box.objects, "training", "gpt-1")
        objects.annotate(box.objects, "inference-5", {"rebalancer.io/lend": "always"})

        def both() -> bool:
            view = run.view("inference-5")
            lend = view.annotations["rebalancer.io/lend"]
            return lend == "always" and [p.name for p in view.pods] == ["gpt-2"]

        await run.until(both)  # the pod's change is not lost to the node's, nor the other way

    assert annotated.annotations["rebalancer.io/lend"] == "never"
    assert annotated.pods is before.pods


async def test_a_node_that_goes_or_comes_leaves_or_takes_its_place_among_the_views(
    emulator: Sandbox,
) -> None:
    box = as_opened(emulator)
    async with informing(box) as run:
        before = [str(v.name) for v in run.informer.node_views(MARKS)]
        emulator.store.delete(NODES, None, before[1], DeleteOptions())
        await run.until(lambda: not run.has(before[1]))
        gone = [str(v.name) for v in run.informer.node_views(MARKS)]
        emulator.store.create(NODES, None, cluster.node("a-new", cluster.INFERENCE))
        await run.until(lambda: run.has("a-new"))
        objects.annotate(box.objects, before[2], {"rebalancer.io/lend": "never"})
        await run.until(lambda: run.view(before[2]).annotations)
        came = [str(v.name) for v in run.informer.node_views(MARKS)]

    assert gone == [before[0], *before[2:]]
    assert came == sorted(["a-new", *gone])


async def test_pools_with_different_pod_marks_each_keep_their_views_between_calls(
    seeded: Opened,
) -> None:
    # Two pools telling inference pods apart differently: asking for one set of views must not
    # make the other build every view again (it once did, on every tick).
    other = replace(MARKS, serving_taints=())  # inference pods count as other pods here
    _bind(seeded.objects, cluster.inference_pod(0), "inference-0")
    async with informing(seeded) as run:
        mine = {str(v.name): v for v in run.informer.node_views(MARKS)}
        theirs = {str(v.name): v for v in run.informer.node_views(other)}
        assert any(mine[n] != theirs[n] for n in mine), "the two sets of marks must see nodes apart"
        for _ in range(2):
            assert all(
                a is b for a, b in zip(run.informer.node_views(MARKS), mine.values(), strict=True)
            )
            assert all(
                a is b for a, b in zip(run.informer.node_views(other), theirs.values(), strict=True)
            )
        objects.annotate(seeded.objects, "training-0", {"rebalancer.io/paused": "true"})
        await run.until(lambda: run.view("training-0") is not mine["training-0"])
        again = {str(v.name): v for v in run.informer.node_views(other)}

    assert again["training-0"].annotations == {"rebalancer.io/paused": "true"}
    assert all(again[n] is theirs[n] for n in theirs if n != "training-0")


async def test_the_first_views_are_frozen_and_a_view_let_go_is_freed_without_a_collection(
    emulator: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controller's process freezes the views of a first build (150,000 pod views, walked
    # by every full collection, cost a lend wave 150 ms). A frozen object is never collected,
    # and what the core memoises on a view points back at it: the informer must empty the memo
    # of a view it lets go, or every node's heartbeat would leak its last view.
    monkeypatch.setattr(informer_module, "BULK_FROM", 1)
    box = as_opened(emulator)
    try:
        async with informing(box, freeze=True) as run:
            view = run.view("training-0")
            assert not any(o is view for o in gc.get_objects()), "a first view is frozen"
            view.memo["decoded"] = (view,)  # as a decoded node holds its view
            let_go = weakref.ref(view)
            del view
            gc.disable()
            objects.annotate(box.objects, "training-0", {"rebalancer.io/paused": "true"})
            await run.until(lambda: "rebalancer.io/paused" in run.view("training-0").annotations)
            assert let_go() is None
            changed = run.view("training-0")
            assert any(o is changed for o in gc.get_objects()), "a rebuilt view is not frozen"
    finally:
        gc.enable()
        gc.unfreeze()


async def test_a_pod_seen_alike_under_two_sets_of_marks_is_held_once(seeded: Opened) -> None:
    other = replace(MARKS, serving_taints=())  # the inference pod is another pod here
    _bind(seeded.objects, cluster.inference_pod(0), "inference-0")
    objects.training(seeded.objects, "job-a", 2, "inference-1")  # borrowed under both
    async with informing(seeded) as run:
        mine = {str(v.name): v for v in run.informer.node_views(MARKS)}
        theirs = {str(v.name): v for v in run.informer.node_views(other)}

    pairs = [(a, b) for n in mine for a, b in zip(mine[n].pods, theirs[n].pods, strict=True)]
    alike = [(a, b) for a, b in pairs if a.role is b.role]
    assert alike
    assert all(a is b for a, b in alike)
    apart = [(a, b) for a, b in pairs if a.role is not b.role]
    assert [(a.name, a.role, b.role) for a, b in apart] == [
        (
            "llm-serving-7d9f8c6b5-00000",
            model.PodRole.INFERENCE,
            model.PodRole.OTHER,
        )
    ]


async def test_a_dropped_watch_resumes_from_the_last_version_without_listing(
    emulator: Sandbox,
) -> None:
    async with informing(as_opened(emulator)) as run:
        emulator.faults.configure(Faults(drop_watch_after=1))  # every stream ends after 1 event
        first = objects.annotate(emulator.store, "inference-0", {"rebalancer.io/lend": "never"})
        await run.until(lambda: len(emulator.requests.watches_of("nodes")) >= 2)
        second = objects.annotate(emulator.store, "inference-0", {"rebalancer.io/lend": "now"})
        await run.until(lambda: run.view("inference-0").annotations["rebalancer.io/lend"] == "now")

        versions = [w.query.get("resourceVersion") for w in emulator.requests.watches_of("nodes")]
        assert versions[1] == first
        assert run.informer.nodes.resource_version == second
        assert emulator.requests.lists_of("nodes") == 1
        assert emulator.requests.lists_of("pods") == 1


async def test_a_bookmark_moves_the_version_a_watch_resumes_from(emulator: Sandbox) -> None:
    store, requests = emulator.store, emulator.requests
    async with informing(as_opened(emulator)) as run:
        await run.until(lambda: requests.watches_of("nodes") and requests.watches_of("pods"))
        _bind(emulator.store, cluster.training_pod("t", 0), "training-0")  # no node changes
        await run.until(lambda: run.view("training-0").pods)
        latest = str(store.resource_version)
        assert run.informer.nodes.resource_version != latest
        emulator.clock.advance(60)  # the emulator's bookmark interval
        await run.until(lambda: run.informer.nodes.resource_version == latest)
        emulator.clock.advance(TIMEOUT)
        await run.until(lambda: len(requests.watches_of("nodes")) >= 2)
        assert requests.watches_of("nodes")[1].query["resourceVersion"] == latest
        assert requests.lists_of("nodes") == 1


async def test_a_too_old_version_lists_again_and_the_cache_ends_right() -> None:
    async with emulated.running(seeded=True, history=3) as box:
        _bind(box.store, cluster.training_pod("kept", 0), "inference-1")
        async with informing(as_opened(box)) as run:
            await _relist_after_expiry(box, run)


async def _relist_after_expiry(box: Sandbox, run: Running) -> None:
    requests = box.requests
    await run.until(lambda: requests.watches_of("nodes") and requests.watches_of("pods"))
    # The streams that carried the lists end, and are resumed at once from their versions.
    box.clock.advance(TIMEOUT)
    await run.until(lambda: all(len(requests.watches_of(p)) == 2 for p in ("nodes", "pods")))
    run.gate.open.clear()
    box.clock.advance(TIMEOUT)  # both streams end empty; the informer waits at the gate
    await run.until(lambda: run.gate.waiting == 2)
    # While it is away, more node changes than the server keeps.
    box.store.delete(NODES, None, "training-3", DeleteOptions())
    for i in range(4):
        objects.annotate(box.store, "inference-0", {"rebalancer.io/note": str(i)})
    cluster.add(box.store, cluster.node("inference-8", cluster.INFERENCE))
    run.changes.clear()
    run.gate.open.set()
    await run.until(lambda: box.requests.lists_of("nodes") == 2 and run.has("inference-8"))

    views = {str(v.name): v for v in run.informer.node_views(MARKS)}
    assert "training-3" not in views
    assert views["inference-0"].annotations == {"rebalancer.io/note": "3"}
    assert [p.name for p in views["inference-1"].pods] == ["kept-0"]
    assert ("training-3", "node removed") in run.changes
    assert ("inference-8", "node appeared") in run.changes
    assert ("inference-0", "node annotations changed") in run.changes
    assert box.requests.lists_of("pods") == 1  # the pods' history still held its version


async def test_transport_errors_back_off_exponentially_and_never_end_the_loop() -> None:
    pulse = Pulse()
    gate = Gate(pulse)
    async with client.ApiClient(client.Configuration(host="http://127.0.0.1:1")) as api:
        settings = WatchSettings(backoff=Backoff(initial=0.5, factor=2.0, maximum=4.0))
        informer = Informer(api, settings=settings, sleep=gate.sleep)
        task = asyncio.create_task(informer.run())
        try:
            await pulse.until(lambda: len(gate.delays) >= 12)
        finally:
            await stop(task)
    assert not informer.synced.is_set()
    per_resource = sorted(gate.delays)[::2]  # both reflectors back off the same way
    assert per_resource[:6] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


async def test_an_informer_on_a_client_from_a_kubeconfig_file_syncs(
    emulator: Sandbox, tmp_path: Path
) -> None:
    path = write_kubeconfig(emulator.url, tmp_path / "kubeconfig")
    async with kubeclient.api_client(path) as api:
        informer = Informer(api)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
        finally:
            await stop(task)
        assert len(informer.node_views(MARKS)) == 12


async def test_a_missing_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot configure the Kubernetes client"):
        async with kubeclient.api_client(tmp_path / "absent"):
            pass


# ---------------------------------------------------------------------------------------------
# Objects that cannot be read. The emulator (like kube-apiserver) validates what it stores, so
# these come from a server of canned answers: what a proxy, a buggy aggregated API or a client
# version skew could hand over. The real client reads them over HTTP.


def _node(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"gpu-pool": "inference"}}
        | meta,
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@asynccontextmanager
async def canned_api(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    node_events: list[dict[str, Any]],
    pod_events: list[dict[str, Any]] | None = None,
) -> AsyncIterator[str]:
    from aiohttp import web

    def handler(items: list[dict[str, Any]], events: list[dict[str, Any]]) -> Any:
        async def answer(request: web.Request) -> web.StreamResponse:
            if request.query.get("watch") in ("true", "True", "1"):
                body = "".join(json.dumps(e) + "\n" for e in events)
                return web.Response(text=body, content_type="application/json")
            meta = {"resourceVersion": "10"}
            return web.json_response({"kind": "List", "metadata": meta, "items": items})

        return answer

    app = web.Application()
    app.router.add_get("/api/v1/nodes", handler(nodes, node_events))
    app.router.add_get("/api/v1/pods", handler(pods, pod_events or []))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_an_object_that_cannot_be_read_leaves_only_its_own_node_out() -> None:
    nodes = [_node("good-1"), _node("good-2"), _node("bad-1", labels=["not", "a", "map"])]
    bad_pod = {
        "metadata": {"namespace": "ns", "name": "odd", "resourceVersion": "2"},
        "spec": {"nodeName": "good-2", "priority": "high"},
        "status": {"phase": "Running"},
    }
    events = [
        {"type": "ADDED", "object": {"metadata": {"resourceVersion": "11"}}},  # no name
        {"type": "ADDED", "object": _node("good-3") | {"metadata": {"name": "good-3"}}},
    ]
    pulse = Pulse()
    forever = asyncio.Event()

    async def parked(_: float) -> None:
        pulse()
        await forever.wait()  # after the canned stream ends, the reflector waits here

    async with (
        canned_api(nodes, [bad_pod], events) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        informer = Informer(api, sleep=parked, on_change=lambda *_: pulse())
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await pulse.until(lambda: any(v.name == "good-3" for v in informer.node_views(MARKS)))
            views = [str(v.name) for v in informer.node_views(MARKS)]
            unreadable = informer.unreadable()
        finally:
            await stop(task)

    assert views == ["good-1", "good-3"]
    assert set(unreadable) == {"node/bad-1", "pod/good-2/ns/odd"}
    assert "ValueError" in unreadable["node/bad-1"]
    assert "its node good-2 is left alone" in unreadable["pod/good-2/ns/odd"]


async def test_a_pod_that_turns_unreadable_keeps_its_node_out_until_it_reads_again() -> None:
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "resourceVersion": "2"},
        "spec": {"nodeName": "good-1"},
        "status": {"phase": "Running"},
    }
    garbled = {"metadata": {"namespace": "ns", "name": "p", "resourceVersion": "12"}, "spec": "?"}
    events = [{"type": "MODIFIED", "object": garbled}]
    pulse = Pulse()
    forever = asyncio.Event()

    async def parked(_: float) -> None:
        pulse()
        await forever.wait()

    async with (
        canned_api([_node("good-1"), _node("good-2")], [pod], [], events) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        informer = Informer(api, sleep=parked, on_change=lambda *_: pulse())
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await pulse.until(lambda: "pod/good-1/ns/p" in informer.unreadable())
            views = [str(v.name) for v in informer.node_views(MARKS)]
        finally:
            await stop(task)

    assert views == ["good-2"]  # not good-1 judged without the pod it holds


async def test_a_checkpoint_not_believed_leaves_the_pod_read_and_its_node_in_view() -> None:
    """A pod's own word on its work is read under the informer's prefix; one it says in a way
    not believed is carried with why (for a finding), never an object that cannot be read."""
    lent = {"key": "example.com/lent", "operator": "Exists"}

    def training(name: str, annotations: dict[str, str]) -> dict[str, Any]:
        meta: dict[str, Any] = {"namespace": "ns", "name": name, "resourceVersion": "2"}
        meta |= {"creationTimestamp": "2026-03-02T12:00:00Z", "annotations": annotations}
        spec = {"nodeName": "good-1", "tolerations": [lent]}
        return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}

    pods = [
        training("garbled", {"example.com/last-checkpoint-time": "last tuesday"}),
        training("saved", {"example.com/last-checkpoint-time": "2026-03-02T12:30:00Z"}),
        training("acked", {"example.com/reclaim-ack": "r-9"}),
    ]
    marks = model.PodMarks(lend_taints=(Taint("example.com/lent", "NoSchedule", "training"),))
    pulse = Pulse()
    forever = asyncio.Event()

    async def parked(_: float) -> None:
        pulse()
        await forever.wait()

    async with (
        canned_api([_node("good-1")], pods, []) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        informer = Informer(api, prefix="example.com/", sleep=parked)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            views = informer.node_views(marks)
            unreadable = informer.unreadable()
        finally:
            await stop(task)

    assert unreadable == {}
    [node] = views
    by_name = {p.name: p for p in node.pods}
    assert {p.role for p in node.pods} == {PodRole.BORROWED}
    garbled = by_name["garbled"]
    assert garbled.checkpointed is None
    assert garbled.unbelieved is not None
    assert garbled.unbelieved.key == "example.com/last-checkpoint-time"
    assert garbled.unbelieved.value == "last tuesday"
    assert by_name["saved"].checkpointed == datetime.fromisoformat("2026-03-02T12:30:00Z")
    assert by_name["acked"].acked == "r-9"
