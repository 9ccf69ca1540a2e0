"""API objects into core values: taints kept exactly, pods given the right role."""

from __future__ import annotations

from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.core import model

LEND = model.Taint("rebalancer.io/lent", "NoSchedule", "training")
SERVE = model.Taint("workload", "NoSchedule", "inference")
RULES = model.PodRules(lend_taints=(LEND,), serving_taints=(SERVE,))


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
    assert convert.role(pod(owner="DaemonSet", tolerations=lend), RULES) is model.PodRole.DAEMON
    assert convert.role(pod(tolerations=lend), RULES) is model.PodRole.BORROWED
    assert convert.role(pod(tolerations=serve), RULES) is model.PodRole.INFERENCE
    selecting = model.PodRules(lend_taints=(LEND,), inference_selector={"app": "vllm"})
    assert convert.role(pod(labels={"app": "vllm"}), selecting) is model.PodRole.INFERENCE
    assert convert.role(pod(), RULES) is model.PodRole.OTHER


def test_a_pod_belongs_to_its_job_label_before_its_controller() -> None:
    labelled = pod(labels={"batch.kubernetes.io/job-name": "train"}, owner="Job")
    assert convert.job_of(labelled) == "ns/train"
    assert convert.job_of(pod(owner="ReplicaSet")) == "ns/ReplicaSet/o"
    assert convert.job_of(pod()) is None


def test_finished_pods_are_recognised() -> None:
    assert convert.finished(pod(phase="Succeeded"))
    assert not convert.finished(pod(phase="Running"))
