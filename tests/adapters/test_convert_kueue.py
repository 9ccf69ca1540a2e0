"""Kueue Workloads into takers: the pods a waiting Workload's job would run, as pending pods
(``convert.workload_takers``; docs/design/takers.md#kueue-workloads)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.core import model

LENT = {
    "key": "rebalancer.io/lent",
    "operator": "Equal",
    "value": "training",
    "effect": "NoSchedule",
}


def workload(**spec: Any) -> dict[str, Any]:
    """A v1beta2 Workload as Kueue makes one for a suspended Job: waiting (no admission)."""
    template = {
        "spec": {
            "tolerations": [LENT],
            "nodeSelector": {"nvidia.com/gpu.family": "hopper"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "nvidia.com/gpu.memory",
                                        "operator": "Gt",
                                        "values": ["70000"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "initContainers": [{"name": "fetch", "resources": {"requests": {"cpu": "4"}}}],
            "containers": [
                {
                    "name": "train",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "8"},
                        "requests": {"cpu": "2", "memory": "1Gi"},
                    },
                }
            ],
            "overhead": {"memory": "1Gi"},
        }
    }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-llama-5b2c1",
            "namespace": "training",
            "creationTimestamp": "2026-12-04T10:00:00Z",
            "resourceVersion": "7",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "controller": True}
            ],
        },
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {
                    "name": "launcher",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "l"}], "tolerations": [LENT]}},
                },
                {"name": "workers", "count": 3, "template": template},
            ],
            **spec,
        },
    }


def test_a_waiting_workload_is_a_gang_of_its_podsets_pods() -> None:
    pods = convert.workload_takers(workload(priority=100))
    assert [p.name for p in pods] == [
        "job-llama-5b2c1/launcher-0",
        "job-llama-5b2c1/workers-0",
        "job-llama-5b2c1/workers-1",
        "job-llama-5b2c1/workers-2",
    ]
    assert {p.job for p in pods} == {"training/job-llama-5b2c1"}
    assert {p.namespace for p in pods} == {"training"}
    assert {p.priority for p in pods} == {100}
    assert {p.created for p in pods} == {datetime(2026, 12, 4, 10, tzinfo=UTC)}
    worker = pods[1]
    assert worker.tolerations == (
        model.Toleration("rebalancer.io/lent", "Equal", "training", "NoSchedule"),
    )
    assert worker.node_selector == (("nvidia.com/gpu.family", "hopper"),)
    assert worker.affinity == ((model.Requirement("nvidia.com/gpu.memory", "Gt", ("70000",)),),)
    # the init container's 4 CPU at its peak, as the scheduler counts it; overhead added
    assert worker.requests == model.Resources(gpu=8, cpu=4000, memory=2 * 2**30)
    assert pods[0].requests == model.NOTHING
    assert pods[0].node_selector == ()


def test_priority_is_the_workloads_else_the_templates_else_none() -> None:
    wl = workload()
    assert {p.priority for p in convert.workload_takers(wl)} == {0}
    wl["spec"]["podSets"][1]["template"]["spec"]["priority"] = 7
    assert [p.priority for p in convert.workload_takers(wl)] == [0, 7, 7, 7]
    wl["spec"]["priority"] = -5
    assert {p.priority for p in convert.workload_takers(wl)} == {-5}


def _admitted(wl: dict[str, Any]) -> None:
    wl["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "workers", "count": 3}]}
    }


def _finished(wl: dict[str, Any]) -> None:
    wl["status"] = {"conditions": [{"type": "Finished", "status": "True", "reason": "Succeeded"}]}


def _inactive(wl: dict[str, Any]) -> None:
    wl["spec"]["active"] = False


def _deleting(wl: dict[str, Any]) -> None:
    wl["metadata"]["deletionTimestamp"] = "2026-12-04T11:00:00Z"


def _plain_pods(wl: dict[str, Any]) -> None:
    wl["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p-0"}]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_admitted, id="admitted"),
        pytest.param(_finished, id="finished"),
        pytest.param(_inactive, id="deactivated"),
        pytest.param(_deleting, id="being-deleted"),
        pytest.param(_plain_pods, id="plain-pods-whose-gated-pods-are-pending-pods"),
    ],
)
def test_a_workload_that_does_not_wait_for_quota_is_no_taker(change: Any) -> None:
    wl = workload()
    change(wl)
    assert not convert.workload_waits(wl)
    assert convert.workload_takers(wl) == ()


def test_a_workload_evicted_and_requeued_waits_again() -> None:
    """Kueue takes ``status.admission`` away when it evicts (preemption, a reclaim's pods
    gone, ``waitForPodsReady``): the Workload is a taker again."""
    wl = workload()
    wl["status"] = {
        "conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted"},
            {"type": "QuotaReserved", "status": "False", "reason": "Pending"},
            {"type": "Finished", "status": "False", "reason": "x"},
        ]
    }
    assert len(convert.workload_takers(wl)) == 4


def test_active_true_and_a_podset_of_none_and_no_podsets() -> None:
    wl = workload(active=True)
    wl["spec"]["podSets"][0]["count"] = 0
    assert len(convert.workload_takers(wl)) == 3
    wl["spec"]["podSets"] = []
    assert convert.workload_takers(wl) == ()


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        pytest.param(("spec", "priority"), "high", "invalid literal", id="priority-not-a-number"),
        pytest.param(("spec", "podSets", 1, "count"), -1, "count is -1", id="negative-count"),
        pytest.param(
            (
                "spec",
                "podSets",
                1,
                "template",
                "spec",
                "containers",
                0,
                "resources",
                "limits",
                "nvidia.com/gpu",
            ),
            "lots",
            "not a resource quantity",
            id="bad-quantity",
        ),
    ],
)
def test_a_workload_that_cannot_be_read_raises(path: tuple[Any, ...], value: Any, why: str) -> None:
    wl = copy.deepcopy(workload())
    at: Any = wl
    for part in path[:-1]:
        at = at[part]
    at[path[-1]] = value
    with pytest.raises(ValueError, match=why):
        convert.workload_takers(wl)


def test_the_version_read_is_the_one_kueue_stores() -> None:
    """v1beta2: what Kueue v0.17.0's Workload CRD marks ``storage: true`` (tests/kube/kueue)."""
    assert (convert.KUEUE_GROUP, convert.KUEUE_VERSION) == ("kueue.x-k8s.io", "v1beta2")
    assert convert.KUEUE_CRD == "workloads.kueue.x-k8s.io"
