"""Events: one collection served as core/v1 and events.k8s.io/v1, with each API's rules."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from tests.support.emulated import Sandbox
from tests.support.objects import NS
from tests.support.reads import raw, status_body

DEFAULT = "default"  # events about cluster-scoped objects (Nodes) must live here


def _v1_event(name: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": DEFAULT},
        "eventTime": "2026-03-02T12:00:00.000000Z",
        "reportingController": "rebalancer.io/controller",
        "reportingInstance": "rebalancer-0",
        "action": "Lend",
        "reason": "Lent",
        "type": "Normal",
        "note": "inference-3 lent to training",
        "regarding": {"kind": "Node", "name": "inference-3", "apiVersion": "v1"},
    }
    body.update(changes)
    return body


def _core_event(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": DEFAULT},
        "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": DEFAULT},
        "reason": "Evicted",
        "message": "drained for reclaim",
        "type": "Normal",
        "count": 1,
        "firstTimestamp": "2026-03-02T12:00:00Z",
        "lastTimestamp": "2026-03-02T12:00:00Z",
        "source": {"component": "rebalancer"},
    }


async def test_an_event_written_through_events_v1_is_read_through_core_v1(
    sandbox: Sandbox,
) -> None:
    await sandbox.events.create_namespaced_event(DEFAULT, _v1_event("lend.1"))
    core = await raw(
        await sandbox.core.read_namespaced_event("lend.1", DEFAULT, _preload_content=False)
    )
    assert core["apiVersion"] == "v1"
    assert core["message"] == "inference-3 lent to training"
    assert core["involvedObject"]["name"] == "inference-3"
    assert core["reportingComponent"] == "rebalancer.io/controller"
    assert "note" not in core
    assert "regarding" not in core
    back = await sandbox.events.read_namespaced_event("lend.1", DEFAULT)
    assert back.note == "inference-3 lent to training"


async def test_an_event_about_a_node_outside_the_default_namespace_gets_422(
    sandbox: Sandbox,
) -> None:
    body = _v1_event("lend.1")
    body["metadata"]["namespace"] = NS
    with pytest.raises(ApiException) as caught:
        await sandbox.events.create_namespaced_event(NS, body)
    cause = status_body(caught.value)["details"]["causes"][0]
    assert caught.value.status == 422
    assert cause["field"] == "involvedObject.namespace"


async def test_a_core_event_is_listed_through_events_v1_with_deprecated_fields(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_event(DEFAULT, _core_event("evict.1"))
    listed = await raw(await sandbox.events.list_namespaced_event(DEFAULT, _preload_content=False))
    (event,) = listed["items"]
    assert event["deprecatedCount"] == 1
    assert event["deprecatedSource"] == {"component": "rebalancer"}
    assert event["regarding"]["name"] == "web-0"
    # A legacy event has no eventTime, which the Python client's EventsV1Event refuses to
    # deserialize: a known client limitation that holds against a real server too.
    assert "eventTime" not in event


async def test_events_v1_refuses_an_event_without_its_required_fields(sandbox: Sandbox) -> None:
    body = _v1_event("bad.1", reportingController=None, action="")
    body["deprecatedCount"] = 3
    with pytest.raises(ApiException) as caught:
        await sandbox.events.create_namespaced_event(DEFAULT, body)
    fields = {c["field"] for c in status_body(caught.value)["details"]["causes"]}
    assert caught.value.status == 422
    assert {"reportingController", "action", "count"} <= fields


async def test_a_core_event_count_can_be_bumped_with_a_patch(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_event(DEFAULT, _core_event("evict.1"))
    bumped = await sandbox.core.patch_namespaced_event(
        "evict.1", DEFAULT, {"count": 2, "lastTimestamp": "2026-03-02T12:05:00Z"}
    )
    assert bumped.count == 2
    patched_v1 = await raw(
        await sandbox.events.patch_namespaced_event(
            "evict.1", DEFAULT, {"deprecatedCount": 3}, _preload_content=False
        )
    )
    assert patched_v1["deprecatedCount"] == 3


async def test_events_can_be_selected_by_the_object_they_regard(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_event(DEFAULT, _core_event("evict.1"))
    await sandbox.events.create_namespaced_event(DEFAULT, _v1_event("lend.1"))
    core = await sandbox.core.list_namespaced_event(
        DEFAULT, field_selector="involvedObject.kind=Node"
    )
    v1 = await raw(
        await sandbox.events.list_namespaced_event(
            DEFAULT, field_selector="regarding.name=web-0", _preload_content=False
        )
    )
    assert [e.metadata.name for e in core.items] == ["lend.1"]
    assert [e["metadata"]["name"] for e in v1["items"]] == ["evict.1"]
