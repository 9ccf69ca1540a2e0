"""Deletion: pod grace periods on the emulator clock, finalizers, what DELETE answers."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiException

from tests.support.emulated import Sandbox
from tests.support.objects import NS, node, pod
from tests.support.waits import next_event

HOUR = 3600


async def _running_pod(sandbox: Sandbox, name: str = "web-0", grace: int = 30) -> None:
    await sandbox.core.create_node(node("gpu-a"))
    await sandbox.core.create_namespaced_pod(
        NS, pod(name, nodeName="gpu-a", terminationGracePeriodSeconds=grace)
    )


async def _gone(sandbox: Sandbox, name: str) -> bool:
    try:
        await sandbox.core.read_namespaced_pod(name, NS)
    except ApiException as error:
        return bool(error.status == 404)
    return False


async def test_a_deleted_pod_stays_terminating_until_its_grace_period_passes(
    sandbox: Sandbox,
) -> None:
    await _running_pod(sandbox, grace=30)
    deleted = await sandbox.core.delete_namespaced_pod("web-0", NS)
    assert deleted.metadata.deletion_timestamp.isoformat() == "2026-03-02T12:00:30+00:00"
    assert deleted.metadata.deletion_grace_period_seconds == 30
    sandbox.clock.advance(29)
    terminating = await sandbox.core.read_namespaced_pod("web-0", NS)
    assert terminating.metadata.deletion_timestamp is not None
    sandbox.clock.advance(1)
    assert await _gone(sandbox, "web-0")


async def test_the_delete_options_grace_period_overrides_the_pods_own(sandbox: Sandbox) -> None:
    await _running_pod(sandbox, grace=30)
    deleted = await sandbox.core.delete_namespaced_pod("web-0", NS, grace_period_seconds=5)
    assert deleted.metadata.deletion_grace_period_seconds == 5
    sandbox.clock.advance(5)
    assert await _gone(sandbox, "web-0")


async def test_a_watcher_sees_terminating_then_the_kubelets_zero_grace_then_deleted(
    sandbox: Sandbox,
) -> None:
    await _running_pod(sandbox, grace=10)
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=HOUR)
        await next_event(stream)
        await sandbox.core.delete_namespaced_pod("web-0", NS)
        terminating = await next_event(stream)
        sandbox.clock.advance(10)
        confirmed, deleted = await next_event(stream), await next_event(stream)
    assert terminating["type"] == "MODIFIED"
    assert terminating["raw_object"]["metadata"]["deletionGracePeriodSeconds"] == 10
    assert confirmed["type"] == "MODIFIED"
    assert confirmed["raw_object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    assert deleted["type"] == "DELETED"
    assert int(deleted["raw_object"]["metadata"]["resourceVersion"]) == (
        int(confirmed["raw_object"]["metadata"]["resourceVersion"]) + 1
    )


async def test_grace_period_zero_deletes_at_once(sandbox: Sandbox) -> None:
    await _running_pod(sandbox)
    await sandbox.core.delete_namespaced_pod("web-0", NS, grace_period_seconds=0)
    assert await _gone(sandbox, "web-0")


async def test_an_unscheduled_pod_is_deleted_at_once_whatever_its_grace_period(
    sandbox: Sandbox,
) -> None:
    await sandbox.core.create_namespaced_pod(NS, pod("pending", terminationGracePeriodSeconds=60))
    await sandbox.core.delete_namespaced_pod("pending", NS)
    assert await _gone(sandbox, "pending")


async def test_a_second_delete_may_shorten_the_grace_period_but_not_extend_it(
    sandbox: Sandbox,
) -> None:
    await _running_pod(sandbox, grace=60)
    await sandbox.core.delete_namespaced_pod("web-0", NS)
    longer = await sandbox.core.delete_namespaced_pod("web-0", NS, grace_period_seconds=600)
    assert longer.metadata.deletion_grace_period_seconds == 60
    shorter = await sandbox.core.delete_namespaced_pod("web-0", NS, grace_period_seconds=10)
    assert shorter.metadata.deletion_grace_period_seconds == 10
    assert shorter.metadata.deletion_timestamp.isoformat() == "2026-03-02T12:00:10+00:00"
    sandbox.clock.advance(10)
    assert await _gone(sandbox, "web-0")


async def test_finalizers_hold_a_deleted_object_until_the_last_one_is_removed(
    sandbox: Sandbox,
) -> None:
    body = node("gpu-a")
    body["metadata"]["finalizers"] = ["rebalancer.io/restore"]
    await sandbox.core.create_node(body)
    pending = await sandbox.core.delete_node("gpu-a")
    assert pending.kind == "Node"  # a pending deletion answers the object, not a Status
    held = await sandbox.core.read_node("gpu-a")
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as caught:
        await sandbox.core.patch_node("gpu-a", {"metadata": {"finalizers": ["another/one"]}})
    assert caught.value.status == 422
    await sandbox.core.patch_node("gpu-a", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiException) as missing:
        await sandbox.core.read_node("gpu-a")
    assert missing.value.status == 404


async def test_deleting_a_node_answers_a_success_status_naming_it(sandbox: Sandbox) -> None:
    created = await sandbox.core.create_node(node("gpu-a"))
    answer = await sandbox.core.delete_node("gpu-a")
    assert answer.status == "Success"
    assert answer.details.name == "gpu-a"
    assert answer.details.kind == "nodes"
    assert answer.details.uid == created.metadata.uid


async def test_deleting_a_missing_pod_gets_404(sandbox: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await sandbox.core.delete_namespaced_pod("ghost", NS)
    assert caught.value.status == 404
