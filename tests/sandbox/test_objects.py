"""Objects, resourceVersions and the Status answers of the emulator."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiException
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from tests.support.emulated import Sandbox
from tests.support.objects import NS, node, pod
from tests.support.reads import raw, status_body


async def test_every_write_takes_the_next_value_of_one_counter_across_kinds(
    sandbox: Sandbox,
) -> None:
    first = await sandbox.core.create_node(node("gpu-a"))
    second = await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    lease = await sandbox.coordination.create_namespaced_lease(
        NS, {"metadata": {"name": "lock"}, "spec": {"holderIdentity": "me"}}
    )
    versions = [int(o.metadata.resource_version) for o in (first, second, lease)]
    assert versions == sorted(versions)
    assert len(set(versions)) == 3
    assert all(isinstance(o.metadata.resource_version, str) for o in (first, second, lease))


async def test_a_list_carries_the_current_resource_version_and_items_carry_no_kind(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    created = await sandbox.core.create_node(node("gpu-a"))
    body = await raw(await sandbox.core.list_namespaced_pod(NS, _preload_content=False))
    assert body["kind"] == "PodList"
    assert body["apiVersion"] == "v1"
    assert int(body["metadata"]["resourceVersion"]) >= int(created.metadata.resource_version)
    assert "kind" not in body["items"][0]
    assert "apiVersion" not in body["items"][0]


async def test_a_missing_object_gets_404_with_a_not_found_status(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as missing_pod:
        await sandbox.core.read_namespaced_pod("ghost", NS)
    with pytest.raises(ApiException) as missing_lease:
        await sandbox.coordination.read_namespaced_lease("ghost", NS)
    assert missing_pod.value.status == 404
    assert status_body(missing_pod.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "ghost" not found',
        "reason": "NotFound",
        "details": {"name": "ghost", "kind": "pods"},
        "code": 404,
    }
    lease = status_body(missing_lease.value)
    assert lease["message"] == 'leases.coordination.k8s.io "ghost" not found'
    assert lease["details"] == {"name": "ghost", "group": "coordination.k8s.io", "kind": "leases"}


async def test_creating_an_object_that_exists_gets_409_already_exists(sandbox: Sandbox) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    with pytest.raises(ApiException) as caught:
        await sandbox.core.create_node(node("gpu-a"))
    body = status_body(caught.value)
    assert caught.value.status == 409
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'nodes "gpu-a" already exists'
    assert body["details"] == {"name": "gpu-a", "kind": "nodes"}


async def test_a_write_with_a_stale_resource_version_gets_409_with_a_status_body(
    sandbox: Sandbox,
) -> None:
    stale = await sandbox.core.create_node(node("gpu-a"))
    fresh = await sandbox.core.read_node("gpu-a")
    fresh.metadata.labels["touched"] = "yes"
    await sandbox.core.replace_node("gpu-a", fresh)
    stale.metadata.labels["touched"] = "again"
    with pytest.raises(ApiException) as caught:
        await sandbox.core.replace_node("gpu-a", stale)
    body = status_body(caught.value)
    assert caught.value.status == 409
    assert body["status"] == "Failure"
    assert body["reason"] == "Conflict"
    assert body["code"] == 409
    assert body["details"] == {"name": "gpu-a", "kind": "nodes"}
    assert body["message"] == (
        'Operation cannot be fulfilled on nodes "gpu-a": the object has been modified; please '
        "apply your changes to the latest version and try again"
    )
    assert (await sandbox.core.read_node("gpu-a")).metadata.labels["touched"] == "yes"


async def test_a_patch_carrying_a_stale_resource_version_is_an_optimistic_lock(
    sandbox: Sandbox,
) -> None:
    created = await sandbox.core.create_node(node("gpu-a"))
    version = created.metadata.resource_version
    await sandbox.core.patch_node("gpu-a", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_node(
            "gpu-a", {"metadata": {"resourceVersion": version, "labels": {"b": "2"}}}
        )
    assert caught.value.status == 409
    current = await sandbox.core.read_node("gpu-a")
    patched = await sandbox.core.patch_node(
        "gpu-a",
        {"metadata": {"resourceVersion": current.metadata.resource_version, "labels": {"b": "2"}}},
    )
    assert patched.metadata.labels == {"gpu-pool": "inference", "a": "1", "b": "2"}


async def test_a_delete_with_a_stale_precondition_gets_409_and_keeps_the_object(
    sandbox: Sandbox,
) -> None:
    created = await sandbox.core.create_node(node("gpu-a"))
    await sandbox.core.patch_node("gpu-a", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(ApiException) as caught:
        await sandbox.core.delete_node(
            "gpu-a",
            body={"preconditions": {"resourceVersion": created.metadata.resource_version}},
        )
    body = status_body(caught.value)
    assert caught.value.status == 409
    assert body["reason"] == "Conflict"
    assert "Precondition failed: ResourceVersion in precondition" in body["message"]
    await sandbox.core.read_node("gpu-a")


async def test_the_server_owns_uid_creation_time_and_generation(sandbox: Sandbox) -> None:
    body = pod("web-0")
    body["metadata"].update(
        {"uid": "mine", "creationTimestamp": "2000-01-01T00:00:00Z", "generation": 7}
    )
    created = await sandbox.core.create_namespaced_pod(NS, body)
    assert created.metadata.uid != "mine"
    assert created.metadata.creation_timestamp.isoformat() == "2026-03-02T12:00:00+00:00"
    assert created.metadata.generation == 1
    node_ = await sandbox.core.create_node(node("gpu-a"))
    assert node_.metadata.generation is None


async def test_pod_generation_moves_with_the_spec_only(sandbox: Sandbox) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    labelled = await sandbox.core.patch_namespaced_pod(
        "web-0", NS, {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled.metadata.generation == 1
    reimaged = await sandbox.core.patch_namespaced_pod(
        "web-0", NS, {"spec": {"containers": [{"name": "main", "image": "nginx:1.28"}]}}
    )
    assert reimaged.metadata.generation == 2


async def test_an_update_that_changes_nothing_keeps_the_resource_version(sandbox: Sandbox) -> None:
    created = await sandbox.core.create_node(node("gpu-a"))
    same = await sandbox.core.patch_node(
        "gpu-a", {"metadata": {"labels": {"gpu-pool": "inference"}}}
    )
    assert same.metadata.resource_version == created.metadata.resource_version


async def test_the_main_endpoint_ignores_status_and_the_status_endpoint_ignores_spec(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    through_main = await sandbox.core.patch_node(
        "gpu-a", {"status": {"allocatable": {"nvidia.com/gpu": "1"}}}
    )
    assert through_main.status.allocatable["nvidia.com/gpu"] == "8"
    through_status = await sandbox.core.patch_node_status(
        "gpu-a",
        {"spec": {"unschedulable": True}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
    )
    assert through_status.status.allocatable["nvidia.com/gpu"] == "4"
    assert not through_status.spec.unschedulable


async def test_a_lease_is_404_until_created_and_then_needs_its_resource_version(
    sandbox: Sandbox,
) -> None:
    leases = sandbox.coordination
    with pytest.raises(ApiException) as absent:
        await leases.read_namespaced_lease("rebalancer", NS)
    assert absent.value.status == 404
    body = {
        "metadata": {"name": "rebalancer"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = await leases.create_namespaced_lease(NS, body)
    created.spec.holder_identity = "b"
    renewed = await leases.replace_namespaced_lease("rebalancer", NS, created)
    assert renewed.spec.holder_identity == "b"
    with pytest.raises(ApiException) as stale:
        await leases.replace_namespaced_lease("rebalancer", NS, created)
    assert stale.value.status == 409
    unversioned = {"metadata": {"name": "rebalancer"}, "spec": {"holderIdentity": "c"}}
    with pytest.raises(ApiException) as unconditional:
        await leases.replace_namespaced_lease("rebalancer", NS, unversioned)
    assert unconditional.value.status == 422
    assert status_body(unconditional.value)["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: must be specified for an update",
            "field": "metadata.resourceVersion",
        }
    ]


async def test_the_kubernetes_asyncio_lease_lock_can_take_and_renew_a_lease(
    sandbox: Sandbox,
) -> None:
    lock = LeaseLock("rebalancer", NS, "replica-a", sandbox.api)
    found, _ = await lock.get("rebalancer", NS)
    assert not found
    record = LeaderElectionRecord("replica-a", "15", "2026-03-02T12:00:00Z", "2026-03-02T12:00:00Z")
    assert await lock.create("rebalancer", NS, record)
    found, current = await lock.get("rebalancer", NS)
    assert found
    assert isinstance(current, LeaderElectionRecord)
    assert current.holder_identity == "replica-a"
    assert await lock.update("rebalancer", NS, record)
    lease = await sandbox.coordination.read_namespaced_lease("rebalancer", NS)
    assert lease.spec.holder_identity == "replica-a"


async def test_generate_name_gives_each_object_a_fresh_name(sandbox: Sandbox) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "web-", "labels": {"app": "web"}}
    first = await sandbox.core.create_namespaced_pod(NS, body)
    second = await sandbox.core.create_namespaced_pod(NS, body)
    assert first.metadata.name.startswith("web-")
    assert len(first.metadata.name) == 9
    assert first.metadata.name != second.metadata.name


async def test_a_taint_list_with_duplicates_and_bad_effects_gets_422_with_one_cause_each(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    taints = [
        {"key": "a", "value": "1", "effect": "NoSchedule"},
        {"key": "a", "value": "2", "effect": "NoSchedule"},
        {"key": "b", "effect": "Sometimes"},
    ]
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_node("gpu-a", {"spec": {"taints": taints}})
    body = status_body(caught.value)
    assert caught.value.status == 422
    assert body["reason"] == "Invalid"
    assert body["details"]["kind"] == "Node"
    assert body["details"]["name"] == "gpu-a"
    fields = [c["field"] for c in body["details"]["causes"]]
    assert fields == ["spec.taints[1]", "spec.taints[2].effect"]
    assert body["details"]["causes"][0]["reason"] == "FieldValueDuplicate"
    assert body["message"].startswith('Node "gpu-a" is invalid: [spec.taints[1]: Duplicate value')


async def test_a_pod_spec_is_immutable_but_for_images_and_added_tolerations(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_namespaced_pod(
            "web-0", NS, {"spec": {"nodeSelector": {"gpu-pool": "training"}}}
        )
    assert caught.value.status == 422
    assert status_body(caught.value)["details"]["causes"][0]["field"] == "spec"
    toleration = {"key": "x", "operator": "Exists", "effect": "NoSchedule"}
    current = await sandbox.core.read_namespaced_pod("web-0", NS)
    tolerations = [t.to_dict() for t in current.spec.tolerations]
    patched = await sandbox.core.patch_namespaced_pod(
        "web-0",
        NS,
        [{"op": "add", "path": "/spec/tolerations/-", "value": toleration}],
    )
    assert len(patched.spec.tolerations) == len(tolerations) + 1


async def test_a_new_pod_is_defaulted_as_the_real_server_and_admission_would(
    sandbox: Sandbox,
) -> None:
    body = pod("web-0")
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    body["status"] = {"phase": "Running"}
    created = await sandbox.core.create_namespaced_pod(NS, body)
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "Burstable"
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.spec.termination_grace_period_seconds == 30
    assert created.spec.priority == 0
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
    defaults = {(t.key, t.effect, t.toleration_seconds) for t in created.spec.tolerations}
    assert ("node.kubernetes.io/not-ready", "NoExecute", 300) in defaults
    assert ("node.kubernetes.io/unreachable", "NoExecute", 300) in defaults


async def test_an_invalid_name_gets_422_naming_the_rule(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.create_node(node("GPU_A"))
    cause = status_body(caught.value)["details"]["causes"][0]
    assert caught.value.status == 422
    assert cause["field"] == "metadata.name"
    assert cause["message"].startswith('Invalid value: "GPU_A": a lowercase RFC 1123 subdomain')


async def test_a_namespace_in_the_body_must_match_the_path(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.create_namespaced_pod("training", pod("web-0", namespace=NS))
    assert caught.value.status == 400
    assert status_body(caught.value)["reason"] == "BadRequest"
