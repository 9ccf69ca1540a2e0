"""Watches: initial state, resuming, 410 Expired, bookmarks, timeouts, selector transitions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiException

from tests.support.emulated import Sandbox, running
from tests.support.objects import NS, pod
from tests.support.waits import next_event, no_more_events

HOUR = 3600


async def _first_line(sandbox: Sandbox, query: list[tuple[str, str]]) -> dict[str, Any]:
    response = await sandbox.api.call_api(
        f"/api/v1/namespaces/{NS}/pods", "GET", query_params=query, _preload_content=False
    )
    try:
        line: dict[str, Any] = json.loads(await response.content.readline())
        return line
    finally:
        response.release()


async def test_a_watch_without_a_resource_version_starts_with_added_events_for_what_exists(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=HOUR)
        initial = [await next_event(stream), await next_event(stream)]
        await sandbox.core.create_namespaced_pod(NS, pod("web-2"))
        live = await next_event(stream)
    assert [(e["type"], e["object"].metadata.name) for e in initial] == [
        ("ADDED", "web-0"),
        ("ADDED", "web-1"),
    ]
    assert (live["type"], live["raw_object"]["metadata"]["name"]) == ("ADDED", "web-2")
    assert live["raw_object"]["kind"] == "Pod"
    assert live["raw_object"]["apiVersion"] == "v1"


async def test_a_watch_from_a_resource_version_replays_only_what_came_after(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    listed = await sandbox.core.list_namespaced_pod(NS)
    await sandbox.core.patch_namespaced_pod("web-0", NS, {"metadata": {"labels": {"v": "2"}}})
    await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
    async with watch.Watch() as w:
        stream = w.stream(
            sandbox.core.list_namespaced_pod,
            NS,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=HOUR,
        )
        events = [await next_event(stream), await next_event(stream)]
    assert [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "web-0"),
        ("ADDED", "web-1"),
    ]


async def test_resuming_from_a_revision_older_than_the_history_gets_an_error_event_with_410() -> (
    None
):
    async with running(history=2) as sandbox:
        first = await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
        for index in range(4):
            await sandbox.core.patch_namespaced_pod(
                "web-0", NS, {"metadata": {"labels": {"v": str(index)}}}
            )
        old = first.metadata.resource_version
        line = await _first_line(
            sandbox, [("watch", "true"), ("resourceVersion", old), ("timeoutSeconds", "60")]
        )
        async with watch.Watch() as w:
            stream = w.stream(
                sandbox.core.list_namespaced_pod, NS, resource_version=old, timeout_seconds=60
            )
            with pytest.raises(ApiException) as caught:
                await next_event(stream)
    assert line["type"] == "ERROR"
    assert line["object"]["code"] == 410
    assert line["object"]["reason"] == "Expired"
    assert line["object"]["message"].startswith(f"too old resource version: {old} (")
    assert caught.value.status == 410


async def test_the_too_old_error_comes_inside_an_http_200_stream(sandbox: Sandbox) -> None:
    response = await sandbox.api.call_api(
        f"/api/v1/namespaces/{NS}/pods",
        "GET",
        query_params=[("watch", "1"), ("resourceVersion", "999999")],
        _preload_content=False,
    )
    try:
        assert response.status == 200
        event = json.loads(await response.content.readline())
    finally:
        response.release()
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 504


async def test_bookmarks_come_when_the_emulator_clock_passes_the_interval(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    async with watch.Watch() as w:
        stream = w.stream(
            sandbox.core.list_namespaced_pod, NS, allow_watch_bookmarks=True, timeout_seconds=HOUR
        )
        assert (await next_event(stream))["type"] == "ADDED"  # the watch is open
        await sandbox.core.create_node({"metadata": {"name": "elsewhere"}})
        sandbox.clock.advance(59)
        await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
        assert (await next_event(stream))["type"] == "ADDED"  # no bookmark before 60 s
        sandbox.clock.advance(2)
        bookmark = await next_event(stream)
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["raw_object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(sandbox.store.resource_version)},
    }
    assert w.resource_version == str(sandbox.store.resource_version)


async def test_a_watch_resumed_from_a_bookmark_misses_nothing(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    async with watch.Watch() as w:
        stream = w.stream(
            sandbox.core.list_namespaced_pod, NS, allow_watch_bookmarks=True, timeout_seconds=HOUR
        )
        await next_event(stream)
        sandbox.clock.advance(61)
        bookmark = await next_event(stream)
    await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
    async with watch.Watch() as w:
        resumed = w.stream(
            sandbox.core.list_namespaced_pod,
            NS,
            resource_version=bookmark["raw_object"]["metadata"]["resourceVersion"],
            timeout_seconds=HOUR,
        )
        event = await next_event(resumed)
    assert (event["type"], event["raw_object"]["metadata"]["name"]) == ("ADDED", "web-1")


async def test_no_bookmarks_unless_asked(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=HOUR)
        await next_event(stream)
        sandbox.clock.advance(600)
        await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
        event = await next_event(stream)
    assert (event["type"], event["raw_object"]["metadata"]["name"]) == ("ADDED", "web-1")


async def test_timeout_seconds_ends_the_stream_on_the_emulator_clock(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=30)
        await next_event(stream)
        sandbox.clock.advance(29)
        await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
        assert (await next_event(stream))["type"] == "ADDED"
        sandbox.clock.advance(2)
        assert await no_more_events(stream)


async def test_without_timeout_seconds_the_server_ends_a_watch_within_its_own_limit(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    response = await sandbox.api.call_api(
        f"/api/v1/namespaces/{NS}/pods",
        "GET",
        query_params=[("watch", "true")],
        _preload_content=False,
    )
    try:
        await response.content.readline()
        sandbox.clock.advance(3600)  # kube-apiserver: a random limit in [30 min, 60 min)
        rest = await response.content.read()
    finally:
        response.release()
    assert rest == b""


async def test_an_object_leaving_a_label_selector_is_deleted_and_one_entering_is_added(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    async with watch.Watch() as w:
        stream = w.stream(
            sandbox.core.list_namespaced_pod, NS, label_selector="app=web", timeout_seconds=HOUR
        )
        assert (await next_event(stream))["type"] == "ADDED"
        left = await sandbox.core.patch_namespaced_pod(
            "web-0", NS, {"metadata": {"labels": {"app": "batch"}}}
        )
        gone = await next_event(stream)
        await sandbox.core.patch_namespaced_pod(
            "web-0", NS, {"metadata": {"labels": {"app": "web"}}}
        )
        back = await next_event(stream)
    assert gone["type"] == "DELETED"
    # The DELETED carries the object as it last matched, stamped with the change's revision.
    assert gone["raw_object"]["metadata"]["labels"] == {"app": "web"}
    assert gone["raw_object"]["metadata"]["resourceVersion"] == left.metadata.resource_version
    assert back["type"] == "ADDED"


async def test_a_field_selector_watch_follows_a_pod_onto_its_node(sandbox: Sandbox) -> None:
    async with watch.Watch() as w:
        stream = w.stream(
            sandbox.core.list_pod_for_all_namespaces,
            field_selector="spec.nodeName=gpu-a",
            timeout_seconds=HOUR,
        )
        await sandbox.core.create_namespaced_pod(NS, pod("elsewhere", nodeName="gpu-b"))
        await sandbox.core.create_namespaced_pod(NS, pod("here", nodeName="gpu-a"))
        event = await next_event(stream)
    assert (event["type"], event["raw_object"]["metadata"]["name"]) == ("ADDED", "here")


@pytest.mark.parametrize(
    ("value", "watches"),
    [
        ("true", True),
        ("True", True),
        ("1", True),
        ("t", True),
        ("yes", True),  # apimachinery: anything but 0 and false is true
        ("", True),
        ("false", False),
        ("FALSE", False),
        ("0", False),
    ],
)
async def test_the_watch_flag_is_read_as_apimachinery_reads_booleans(
    sandbox: Sandbox, value: str, watches: bool
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    first = await _first_line(sandbox, [("watch", value), ("timeoutSeconds", "60")])
    assert (first.get("type") == "ADDED") is watches
    assert (first.get("kind") == "PodList") is not watches


async def test_a_watch_of_one_object_by_name(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    await sandbox.core.create_namespaced_pod(NS, pod("web-1"))
    response = await sandbox.api.call_api(
        f"/api/v1/namespaces/{NS}/pods/web-1",
        "GET",
        query_params=[("watch", "true")],
        _preload_content=False,
    )
    try:
        event = json.loads(await response.content.readline())
    finally:
        response.release()
    assert event["object"]["metadata"]["name"] == "web-1"
