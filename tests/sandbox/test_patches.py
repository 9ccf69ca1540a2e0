"""JSON patch, merge patch and strategic merge patch with the Kubernetes list semantics."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from tests.support.emulated import Sandbox
from tests.support.objects import NS, node, pod
from tests.support.reads import raw, status_body

MERGE = "application/merge-patch+json"
INFERENCE = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
LENT = {"key": "rebalancer.io/lent", "value": "training", "effect": "NoSchedule"}


async def _node_json(sandbox: Sandbox, name: str) -> dict[str, Any]:
    body: dict[str, Any] = await raw(await sandbox.core.read_node(name, _preload_content=False))
    return body


async def test_a_failed_json_patch_test_gets_422_and_changes_nothing(sandbox: Sandbox) -> None:
    created = await sandbox.core.create_node(node("gpu-a", [INFERENCE]))
    operations = [
        {"op": "test", "path": "/spec/taints/0/value", "value": "training"},
        {"op": "replace", "path": "/spec/taints", "value": [LENT]},
    ]
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_node("gpu-a", operations)
    body = status_body(caught.value)
    assert caught.value.status == 422
    assert body["reason"] == "Invalid"
    assert body["message"] == "the server rejected our request due to an error in our request"
    after = await sandbox.core.read_node("gpu-a")
    assert after.metadata.resource_version == created.metadata.resource_version


async def test_a_json_patch_test_guards_the_replace_that_follows(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a", [INFERENCE]))
    operations = [
        {"op": "test", "path": "/spec/taints/0/value", "value": "inference"},
        {"op": "replace", "path": "/spec/taints", "value": [LENT]},
        {"op": "add", "path": "/metadata/labels/rebalancer.io~1state", "value": "lent"},
    ]
    patched = await sandbox.core.patch_node("gpu-a", operations)
    assert [t.key for t in patched.spec.taints] == ["rebalancer.io/lent"]
    assert patched.metadata.labels["rebalancer.io/state"] == "lent"


async def test_a_json_patch_that_is_not_a_list_of_operations_gets_400(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    response = await sandbox.api.call_api(
        "/api/v1/nodes/gpu-a",
        "PATCH",
        header_params={"Content-Type": "application/json-patch+json"},
        body={"op": "add"},
        _preload_content=False,
    )
    assert response.status == 400
    assert (await raw(response))["reason"] == "BadRequest"


async def test_a_merge_patch_null_deletes_a_label_and_replaces_lists(sandbox: Sandbox) -> None:
    body = node("gpu-a", [INFERENCE])
    body["metadata"]["labels"]["old"] = "x"
    await sandbox.core.create_node(body)
    patched = await sandbox.core.patch_node(
        "gpu-a",
        {"metadata": {"labels": {"old": None, "new": "y"}}, "spec": {"taints": [LENT]}},
        _content_type=MERGE,
    )
    assert patched.metadata.labels == {"gpu-pool": "inference", "new": "y"}
    assert [t.key for t in patched.spec.taints] == ["rebalancer.io/lent"]


async def test_a_strategic_patch_replaces_node_taints_whole(sandbox: Sandbox) -> None:
    other = {"key": "maintenance", "effect": "PreferNoSchedule"}
    await sandbox.core.create_node(node("gpu-a", [other, INFERENCE]))
    patched = await sandbox.core.patch_node("gpu-a", {"spec": {"taints": [LENT]}})
    assert [t.to_dict()["key"] for t in patched.spec.taints] == ["rebalancer.io/lent"]


async def test_a_strategic_patch_null_deletes_one_label_and_keeps_the_rest(
    sandbox: Sandbox,
) -> None:
    body = node("gpu-a")
    body["metadata"]["labels"].update({"a": "1", "b": "2"})
    body["metadata"]["annotations"] = {"note": "x"}
    await sandbox.core.create_node(body)
    patched = await sandbox.core.patch_node(
        "gpu-a", {"metadata": {"labels": {"a": None}, "annotations": {"note": None}}}
    )
    assert patched.metadata.labels == {"gpu-pool": "inference", "b": "2"}
    assert patched.metadata.annotations is None


async def test_a_strategic_patch_merges_finalizers_as_a_set_with_new_ones_first(
    sandbox: Sandbox,
) -> None:
    body = node("gpu-a")
    body["metadata"]["finalizers"] = ["a.example/x", "b.example/y"]
    await sandbox.core.create_node(body)
    patched = await sandbox.core.patch_node(
        "gpu-a", {"metadata": {"finalizers": ["rebalancer.io/restore", "a.example/x"]}}
    )
    assert patched.metadata.finalizers == ["rebalancer.io/restore", "a.example/x", "b.example/y"]
    removed = await sandbox.core.patch_node(
        "gpu-a", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example/x"]}}
    )
    assert removed.metadata.finalizers == ["rebalancer.io/restore", "b.example/y"]


async def test_a_strategic_patch_merges_pod_conditions_by_type(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    first = {"type": "example.io/Drained", "status": "False"}
    await sandbox.core.patch_namespaced_pod_status("web-0", NS, {"status": {"conditions": [first]}})
    updated = await sandbox.core.patch_namespaced_pod_status(
        "web-0",
        NS,
        {"status": {"conditions": [{"type": "example.io/Drained", "status": "True"}]}},
    )
    conditions = {c.type: c.status for c in updated.status.conditions}
    assert conditions == {"example.io/Drained": "True"}


async def test_patch_directives_delete_and_replace_items_of_merged_lists(
    sandbox: Sandbox,
) -> None:
    body = pod("web-0")
    body["spec"]["containers"] = [
        {"name": "main", "image": "nginx:1.27", "env": [{"name": "A", "value": "1"}]},
    ]
    await sandbox.core.create_namespaced_pod(NS, body)
    await sandbox.core.patch_namespaced_pod_status(
        "web-0",
        NS,
        {
            "status": {
                "conditions": [
                    {"type": "x.io/A", "status": "True"},
                    {"type": "x.io/B", "status": "True"},
                ]
            }
        },
    )
    deleted = await sandbox.core.patch_namespaced_pod_status(
        "web-0", NS, {"status": {"conditions": [{"type": "x.io/A", "$patch": "delete"}]}}
    )
    assert [c.type for c in deleted.status.conditions] == ["x.io/B"]
    replaced = await sandbox.core.patch_namespaced_pod_status(
        "web-0",
        NS,
        {"status": {"conditions": [{"$patch": "replace"}, {"type": "x.io/C", "status": "True"}]}},
    )
    assert [c.type for c in replaced.status.conditions] == ["x.io/C"]


async def test_an_unknown_patch_type_gets_415(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    response = await sandbox.api.call_api(
        "/api/v1/nodes/gpu-a",
        "PATCH",
        header_params={"Content-Type": "application/apply-patch+yaml"},
        body={"metadata": {"labels": {"a": "b"}}},
        _preload_content=False,
    )
    assert response.status == 415
    assert (await raw(response))["reason"] == "UnsupportedMediaType"


async def test_a_taint_written_with_an_empty_value_reads_back_without_one(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    await sandbox.core.patch_node(
        "gpu-a", {"spec": {"taints": [{"key": "gpu", "value": "", "effect": "NoSchedule"}]}}
    )
    stored = await _node_json(sandbox, "gpu-a")
    assert stored["spec"]["taints"] == [{"key": "gpu", "effect": "NoSchedule"}]


async def test_a_patch_to_a_missing_object_gets_404(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_node("ghost", {"metadata": {"labels": {"a": "b"}}})
    assert caught.value.status == 404
