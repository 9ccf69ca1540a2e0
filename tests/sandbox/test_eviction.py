"""The Eviction subresource against PodDisruptionBudgets kept by the emulated controller."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from sandbox.emulator import cluster
from tests.support.emulated import Sandbox
from tests.support.reads import raw, status_body

NS = cluster.INFERENCE_NAMESPACE


def _eviction(name: str, **delete_options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    }
    if delete_options:
        body["deleteOptions"] = delete_options
    return body


async def _serving(sandbox: Sandbox, replicas: int, budget: dict[str, Any] | None) -> list[str]:
    names = []
    for index in range(replicas):
        created = await sandbox.core.create_namespaced_pod(NS, cluster.inference_pod(index))
        names.append(created.metadata.name)
    if budget is not None:
        await sandbox.policy.create_namespaced_pod_disruption_budget(NS, budget)
    sandbox.schedule()
    return names


async def _evict(sandbox: Sandbox, name: str, **delete_options: Any) -> Any:
    return await sandbox.core.create_namespaced_pod_eviction(
        name, NS, _eviction(name, **delete_options)
    )


async def test_evicting_a_pod_without_a_budget_gets_201_and_starts_its_termination(
    gpu_cluster: Sandbox,
) -> None:
    (name,) = await _serving(gpu_cluster, 1, None)
    response = await gpu_cluster.core.create_namespaced_pod_eviction(
        name, NS, _eviction(name), _preload_content=False
    )
    assert response.status == 201
    assert await raw(response) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    evicted = await gpu_cluster.core.read_namespaced_pod(name, NS)
    assert evicted.metadata.deletion_timestamp is not None
    target = next(c for c in evicted.status.conditions if c.type == "DisruptionTarget")
    assert (target.status, target.reason) == ("True", "EvictionByEvictionAPI")


async def test_an_eviction_beyond_a_min_available_budget_gets_429_naming_the_budget(
    gpu_cluster: Sandbox,
) -> None:
    budget = cluster.inference_budget(min_available=2)
    first, second, _ = await _serving(gpu_cluster, 3, budget)
    await _evict(gpu_cluster, first)
    with pytest.raises(ApiException) as caught:
        await _evict(gpu_cluster, second)
    body = status_body(caught.value)
    assert caught.value.status == 429
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget llm-serving needs 2 healthy pods and has 2 currently",
        }
    ]
    still = await gpu_cluster.core.read_namespaced_pod(second, NS)
    assert still.metadata.deletion_timestamp is None


async def test_a_terminating_pod_does_not_count_as_healthy_for_max_unavailable(
    gpu_cluster: Sandbox,
) -> None:
    budget = cluster.inference_budget(max_unavailable=1)
    first, second = await _serving(gpu_cluster, 2, budget)
    await _evict(gpu_cluster, first)
    status = await gpu_cluster.policy.read_namespaced_pod_disruption_budget("llm-serving", NS)
    assert (status.status.current_healthy, status.status.desired_healthy) == (1, 1)
    assert status.status.disruptions_allowed == 0
    with pytest.raises(ApiException) as caught:
        await _evict(gpu_cluster, second)
    assert caught.value.status == 429


async def test_a_declared_scale_keeps_the_budget_tight_after_a_replica_is_gone(
    gpu_cluster: Sandbox,
) -> None:
    gpu_cluster.store.set_scale(cluster.replica_set_uid(), 2)
    first, second = await _serving(gpu_cluster, 2, cluster.inference_budget(max_unavailable=1))
    await _evict(gpu_cluster, first)
    gpu_cluster.clock.advance(30)  # the first replica is gone and nothing replaced it
    read = await gpu_cluster.policy.read_namespaced_pod_disruption_budget("llm-serving", NS)
    assert (read.status.expected_pods, read.status.current_healthy) == (2, 1)
    with pytest.raises(ApiException) as caught:
        await _evict(gpu_cluster, second)
    assert caught.value.status == 429


async def test_the_budget_status_is_kept_as_the_disruption_controller_keeps_it(
    gpu_cluster: Sandbox,
) -> None:
    budget = cluster.inference_budget(min_available="50%")
    await _serving(gpu_cluster, 4, budget)
    read = await gpu_cluster.policy.read_namespaced_pod_disruption_budget("llm-serving", NS)
    assert read.status.observed_generation == read.metadata.generation == 1
    assert read.status.expected_pods == 4
    assert read.status.desired_healthy == 2
    assert read.status.current_healthy == 4
    assert read.status.disruptions_allowed == 2
    condition = read.status.conditions[0]
    assert (condition.type, condition.status, condition.reason) == (
        "DisruptionAllowed",
        "True",
        "SufficientPods",
    )


async def test_an_unready_pod_may_be_evicted_while_the_budget_is_healthy(
    gpu_cluster: Sandbox,
) -> None:
    budget = cluster.inference_budget(min_available=2)
    names = await _serving(gpu_cluster, 3, budget)
    await gpu_cluster.core.patch_namespaced_pod_status(
        names[0], NS, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    read = await gpu_cluster.policy.read_namespaced_pod_disruption_budget("llm-serving", NS)
    assert read.status.disruptions_allowed == 0
    await _evict(gpu_cluster, names[0])


async def test_a_pending_pod_is_evicted_whatever_the_budget_says(gpu_cluster: Sandbox) -> None:
    await gpu_cluster.policy.create_namespaced_pod_disruption_budget(
        NS, cluster.inference_budget(min_available=5)
    )
    pending = await gpu_cluster.core.create_namespaced_pod(NS, cluster.inference_pod(0))
    await _evict(gpu_cluster, pending.metadata.name)
    with pytest.raises(ApiException) as caught:
        await gpu_cluster.core.read_namespaced_pod(pending.metadata.name, NS)
    assert caught.value.status == 404


async def test_a_pod_under_two_budgets_cannot_be_evicted(gpu_cluster: Sandbox) -> None:
    (name,) = await _serving(gpu_cluster, 1, cluster.inference_budget(name="one"))
    await gpu_cluster.policy.create_namespaced_pod_disruption_budget(
        NS, cluster.inference_budget(name="two")
    )
    with pytest.raises(ApiException) as caught:
        await _evict(gpu_cluster, name)
    assert caught.value.status == 500
    assert "more than one PodDisruptionBudget" in status_body(caught.value)["message"]


async def test_evicting_a_missing_pod_gets_404(gpu_cluster: Sandbox) -> None:
    with pytest.raises(ApiException) as caught:
        await _evict(gpu_cluster, "ghost")
    body = status_body(caught.value)
    assert caught.value.status == 404
    assert body["details"] == {"name": "ghost", "kind": "pods"}


async def test_the_eviction_delete_options_set_the_grace_period(gpu_cluster: Sandbox) -> None:
    (name,) = await _serving(gpu_cluster, 1, None)
    await _evict(gpu_cluster, name, gracePeriodSeconds=0)
    with pytest.raises(ApiException) as caught:
        await gpu_cluster.core.read_namespaced_pod(name, NS)
    assert caught.value.status == 404


async def test_a_budget_cannot_have_both_min_available_and_max_unavailable(
    gpu_cluster: Sandbox,
) -> None:
    budget = cluster.inference_budget(min_available=1)
    budget["spec"]["maxUnavailable"] = 1
    with pytest.raises(ApiException) as caught:
        await gpu_cluster.policy.create_namespaced_pod_disruption_budget(NS, budget)
    assert caught.value.status == 422
