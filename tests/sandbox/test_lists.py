"""Lists: label and field selectors, all namespaces, pagination, resourceVersion bounds."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiException

from tests.support.emulated import Sandbox
from tests.support.objects import NS, pod
from tests.support.reads import status_body


async def _labelled(sandbox: Sandbox) -> None:
    for name, labels in {
        "a": {"tier": "gold", "app": "llm"},
        "b": {"tier": "silver", "app": "llm"},
        "c": {"app": "batch"},
        "d": {"tier": "", "app": "llm"},
    }.items():
        body = pod(name)
        body["metadata"]["labels"] = labels
        await sandbox.core.create_namespaced_pod(NS, body)


async def _names(sandbox: Sandbox, selector: str) -> list[str]:
    listed = await sandbox.core.list_namespaced_pod(NS, label_selector=selector)
    return [p.metadata.name for p in listed.items]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gold", ["a"]),
        ("tier==gold", ["a"]),
        ("tier!=gold", ["b", "c", "d"]),  # != also matches pods without the key
        ("tier in (gold,silver)", ["a", "b"]),
        ("tier notin (gold)", ["b", "c", "d"]),  # as does notin
        ("tier", ["a", "b", "d"]),
        ("!tier", ["c"]),
        ("tier=", ["d"]),
        ("app=llm,tier notin (silver)", ["a", "d"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
async def test_label_selectors_match_as_in_apimachinery(
    sandbox: Sandbox, selector: str, expected: list[str]
) -> None:
    await _labelled(sandbox)
    assert await _names(sandbox, selector) == expected


@pytest.mark.parametrize("selector", ["tier in ()", "tier in (gold", "=gold", "a,,b", "x>y"])
async def test_a_malformed_label_selector_gets_400(sandbox: Sandbox, selector: str) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.list_namespaced_pod(NS, label_selector=selector)
    assert caught.value.status == 400
    assert status_body(caught.value)["reason"] == "BadRequest"


async def test_field_selectors_pick_pods_by_node_and_by_name(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("placed", nodeName="gpu-a"))
    await sandbox.core.create_namespaced_pod(NS, pod("pending"))
    on_node = await sandbox.core.list_namespaced_pod(NS, field_selector="spec.nodeName=gpu-a")
    unbound = await sandbox.core.list_namespaced_pod(NS, field_selector="spec.nodeName=")
    by_name = await sandbox.core.list_namespaced_pod(NS, field_selector="metadata.name=pending")
    not_on = await sandbox.core.list_namespaced_pod(NS, field_selector="spec.nodeName!=gpu-a")
    assert [p.metadata.name for p in on_node.items] == ["placed"]
    assert [p.metadata.name for p in unbound.items] == ["pending"]
    assert [p.metadata.name for p in by_name.items] == ["pending"]
    assert [p.metadata.name for p in not_on.items] == ["pending"]


async def test_a_field_the_resource_does_not_index_gets_400(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.list_namespaced_pod(NS, field_selector="spec.priority=0")
    assert caught.value.status == 400
    assert status_body(caught.value)["message"] == "field label not supported: spec.priority"


async def test_pods_can_be_listed_across_all_namespaces(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod("inference", pod("a", namespace="inference"))
    await sandbox.core.create_namespaced_pod("training", pod("b", namespace="training"))
    everywhere = await sandbox.core.list_pod_for_all_namespaces()
    here = await sandbox.core.list_namespaced_pod("training")
    assert [(p.metadata.namespace, p.metadata.name) for p in everywhere.items] == [
        ("inference", "a"),
        ("training", "b"),
    ]
    assert [p.metadata.name for p in here.items] == ["b"]


async def test_a_paginated_list_is_one_consistent_snapshot(sandbox: Sandbox) -> None:
    for index in range(5):
        await sandbox.core.create_namespaced_pod(NS, pod(f"web-{index}"))
    first = await sandbox.core.list_namespaced_pod(NS, limit=2)
    assert [p.metadata.name for p in first.items] == ["web-0", "web-1"]
    assert first.metadata.remaining_item_count == 3
    await sandbox.core.delete_namespaced_pod("web-3", NS)
    await sandbox.core.create_namespaced_pod(NS, pod("web-9"))
    second = await sandbox.core.list_namespaced_pod(NS, limit=2, _continue=first.metadata._continue)
    third = await sandbox.core.list_namespaced_pod(NS, limit=2, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items] == ["web-2", "web-3"]
    assert [p.metadata.name for p in third.items] == ["web-4"]
    assert not third.metadata._continue
    assert second.metadata.resource_version == first.metadata.resource_version


async def test_a_list_at_a_resource_version_the_server_has_not_reached_gets_504(
    sandbox: Sandbox,
) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.list_namespaced_pod(NS, resource_version="999999")
    body = status_body(caught.value)
    assert caught.value.status == 504
    assert body["reason"] == "Timeout"
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
