"""API objects into core values: taints kept exactly, pods given the right role."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
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


# ---------------------------------------------------------------------------------------------
# What a pod says of its work: when it last saved, and the reclaim it has saved for

CREATED = "2026-03-02T12:00:00Z"
OURS = "rebalancer.io/last-checkpoint-time"
VOLCANO = "volcano.sh/last-checkpoint-time"


def speaking(annotations: dict[str, Any], created: str | None = CREATED) -> dict[str, Any]:
    """A borrowed pod with ``annotations``, created at ``created``."""
    raw = pod(tolerations=[{"key": "rebalancer.io/lent", "operator": "Exists"}])
    raw["metadata"]["annotations"] = annotations
    if created is not None:
        raw["metadata"]["creationTimestamp"] = created
    return raw


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_a_pod_that_says_nothing_costs_its_record_one_empty_slot() -> None:
    record = convert.pod_record(speaking({"other": "x", OURS: "  "}))
    assert record.said is None
    view = convert.pod_view(record, MARKS)
    assert (view.checkpointed, view.acked, view.unbelieved) == (None, None, None)


@pytest.mark.parametrize(
    ("annotations", "saved"),
    [
        pytest.param({OURS: "2026-03-02T12:30:00Z"}, "2026-03-02T12:30:00Z", id="ours"),
        pytest.param({VOLCANO: "2026-03-02T12:20:00Z"}, "2026-03-02T12:20:00Z", id="volcano"),
        pytest.param(
            {OURS: "2026-03-02T12:30:00Z", VOLCANO: "2026-03-02T12:20:00Z"},
            "2026-03-02T12:30:00Z",
            id="ours-wins",
        ),
        pytest.param(
            {OURS: "", VOLCANO: "2026-03-02T12:20:00Z"}, "2026-03-02T12:20:00Z", id="ours-empty"
        ),
        pytest.param({OURS: "2026-03-02T14:30:00+02:00"}, "2026-03-02T12:30:00Z", id="offset"),
        pytest.param({OURS: CREATED}, CREATED, id="at-creation"),
        # ahead of any clock: believed here; the core counts it as saved just now
        pytest.param({OURS: "2099-01-01T00:00:00Z"}, "2099-01-01T00:00:00Z", id="future"),
    ],
)
def test_a_pod_says_when_it_last_saved(annotations: dict[str, str], saved: str) -> None:
    view = convert.pod_view(speaking(annotations), MARKS)
    assert view.checkpointed == at(saved)
    assert view.unbelieved is None


@pytest.mark.parametrize(
    ("annotations", "key", "why"),
    [
        pytest.param({OURS: "yesterday"}, OURS, "not an RFC 3339 time", id="garbled"),
        pytest.param({OURS: "1772452800"}, OURS, "not an RFC 3339 time", id="epoch"),
        pytest.param({VOLCANO: "2026-03-02T12:30:00"}, VOLCANO, "no time zone", id="no-zone"),
        pytest.param(
            {OURS: "2026-03-02T11:00:00Z"},
            OURS,
            "before the pod was created (2026-03-02T12:00:00Z)",
            id="before-creation",
        ),
        # ours is read where it is given, and not passed over when it is not believed
        pytest.param(
            {OURS: "soon", VOLCANO: "2026-03-02T12:20:00Z"}, OURS, "RFC 3339", id="ours-garbled"
        ),
    ],
)
def test_a_checkpoint_not_believed_is_none_and_says_why(
    annotations: dict[str, str], key: str, why: str
) -> None:
    view = convert.pod_view(speaking(annotations), MARKS)
    assert view.checkpointed is None
    assert view.unbelieved is not None
    assert (view.unbelieved.key, view.unbelieved.value) == (key, annotations[key])
    assert why in view.unbelieved.why
    assert str(view.unbelieved).startswith(f"{key}={annotations[key]!r} is not believed: ")


def test_a_huge_checkpoint_value_is_kept_cut() -> None:
    view = convert.pod_view(speaking({OURS: "x" * 100_000}), MARKS)
    assert view.unbelieved is not None
    assert len(view.unbelieved.value) < 400
    assert "100000 bytes" in view.unbelieved.value


def test_a_pod_with_no_creation_time_has_its_checkpoint_believed() -> None:
    view = convert.pod_view(speaking({OURS: "2026-03-02T11:00:00Z"}, created=None), MARKS)
    assert view.checkpointed == at("2026-03-02T11:00:00Z")


def test_a_pod_says_which_reclaim_it_has_saved_for() -> None:
    view = convert.pod_view(speaking({"rebalancer.io/reclaim-ack": "r-42"}), MARKS)
    assert view.acked == "r-42"
    assert view.checkpointed is None


def test_a_pod_speaks_under_the_controllers_prefix() -> None:
    """Under another prefix, ours is that prefix's: the default's keys are anyone's."""
    annotations = {
        "example.com/last-checkpoint-time": "2026-03-02T12:40:00Z",
        "example.com/reclaim-ack": "r-7",
        OURS: "2026-03-02T12:10:00Z",
        "rebalancer.io/reclaim-ack": "r-1",
    }
    marks = replace(MARKS, prefix="example.com/")
    view = convert.pod_view(speaking(annotations), marks)
    assert (view.checkpointed, view.acked) == (at("2026-03-02T12:40:00Z"), "r-7")
    record = convert.pod_record(speaking(annotations), "example.com/")
    assert convert.pod_view(record, MARKS).acked == "r-7"  # a record was read under its own
