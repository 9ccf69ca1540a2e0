"""API objects into core values: taints kept exactly, pods given the right role."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.core import model

LEND = model.Taint("rebalancer.io/lent", "NoSchedule", "training")
SERVE = model.Taint("workload", "NoSchedule", "inference")
MARKS = model.PodMarks(lend_taints=(LEND,), serving_taints=(SERVE,))


def pod(
    tolerations: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    owner: str | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "controller": True}]
    return {
        "metadata": meta,
        "spec": {"tolerations": tolerations or []},
        "status": {"phase": phase},
    }


def test_taints_keep_their_order_and_every_field_as_written() -> None:
    node = {
        "metadata": {"name": "n"},
        "spec": {
            "taints": [
                {"key": "b", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"},
                {"key": "a", "value": "1", "effect": "NoSchedule"},
            ]
        },
    }
    assert convert.taints(node) == (
        model.Taint("b", "NoExecute", None, "2026-01-01T00:00:00Z"),
        model.Taint("a", "NoSchedule", "1"),
    )


@pytest.mark.parametrize(
    ("conditions", "unschedulable", "ready"),
    [
        pytest.param([{"type": "Ready", "status": "True"}], False, True, id="ready"),
        pytest.param([{"type": "Ready", "status": "Unknown"}], False, False, id="unknown"),
        pytest.param([], False, False, id="never-reported"),
        pytest.param([{"type": "Ready", "status": "True"}], True, False, id="cordoned"),
    ],
)
def test_a_node_is_ready_only_when_it_says_so_and_is_not_cordoned(
    conditions: list[dict[str, str]], unschedulable: bool, ready: bool
) -> None:
    node = {"metadata": {"name": "n"}, "spec": {"unschedulable": unschedulable}}
    node["status"] = {"conditions": conditions}
    assert convert.node_view(node).ready is ready


@pytest.mark.parametrize(
    ("tolerations", "taint", "expected"),
    [
        pytest.param([{"key": "workload", "value": "inference"}], SERVE, True, id="equal"),
        pytest.param([{"key": "workload", "value": "other"}], SERVE, False, id="other-value"),
        pytest.param([{"key": "workload", "operator": "Exists"}], SERVE, True, id="exists"),
        pytest.param([{"operator": "Exists"}], SERVE, True, id="tolerates-everything"),
        pytest.param(
            [{"key": "workload", "operator": "Exists", "effect": "NoExecute"}],
            SERVE,
            False,
            id="other-effect",
        ),
        pytest.param([{"key": "", "operator": "Equal"}], SERVE, False, id="empty-key-equal"),
    ],
)
def test_tolerations_match_as_kubernetes_matches_them(
    tolerations: list[dict[str, Any]], taint: model.Taint, expected: bool
) -> None:
    assert convert.tolerates(tolerations, taint) is expected


def test_pods_get_their_role_from_owner_tolerations_and_labels() -> None:
    lend = [{"key": LEND.key, "operator": "Exists"}]
    serve = [{"key": "workload", "value": "inference"}]
    assert convert.role(pod(owner="DaemonSet", tolerations=lend), MARKS) is model.PodRole.DAEMON
    assert convert.role(pod(tolerations=lend), MARKS) is model.PodRole.BORROWED
    assert convert.role(pod(tolerations=serve), MARKS) is model.PodRole.INFERENCE
    selecting = model.PodMarks(lend_taints=(LEND,), inference_selector={"app": "vllm"})
    assert convert.role(pod(labels={"app": "vllm"}), selecting) is model.PodRole.INFERENCE
    assert convert.role(pod(), MARKS) is model.PodRole.OTHER


def test_a_pod_belongs_to_its_job_label_before_its_controller() -> None:
    labelled = pod(labels={"batch.kubernetes.io/job-name": "train"}, owner="Job")
    assert convert.job_of(labelled) == "ns/train"
    assert convert.job_of(pod(owner="ReplicaSet")) == "ns/ReplicaSet/o"
    assert convert.job_of(pod()) is None


def test_finished_pods_are_recognised() -> None:
    assert convert.finished(pod(phase="Succeeded"))
    assert not convert.finished(pod(phase="Running"))


# ---------------------------------------------------------------------------------------------
# What a pod requests and a node offers (the room a taker needs)


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("8", "8"), ("16Gi", str(16 * 2**30)), ("1e3", "1000"), ("1.5k", "1500")],
)
def test_quantities_read_as_the_api_writes_them(text: str, value: str) -> None:
    assert convert.quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "8 GPUs", "1..2", "Gi", None, True])
def test_a_quantity_the_api_would_refuse_is_an_error_naming_it(text: object) -> None:
    with pytest.raises(ValueError, match="is not a resource quantity"):
        convert.quantity(text)


def test_a_pod_requests_what_the_scheduler_counts() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}},  # limit stands in
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],  # the larger: 4 CPUs
        "overhead": {"memory": "1Gi"},
    }

    assert convert.requests(spec) == model.Resources(gpu=2, cpu=4000, memory=2 * 2**30)


def test_a_node_without_a_readable_allocatable_offers_nothing_known() -> None:
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "lots"}}}

    assert convert.node_view(node).allocatable is None
    assert convert.node_view({"metadata": {"name": "n"}}).allocatable is None
