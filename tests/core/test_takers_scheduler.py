"""What holding ``core.takers`` to the real kube-scheduler found (tests/kubeapi/
test_takers_differential.py; docs/design/takers.md, "Held to kube-scheduler"): each difference,
fixed, pinned here without a server."""

from __future__ import annotations

from typing import Any

import pytest

from rebalancer.adapters import convert
from rebalancer.core import model, takers
from rebalancer.core.model import NodeName, Requirement, Resources

NODE = NodeName("gpu-0")
LABELS = {"pool": "gpu", "nvidia.com/gpu.memory": "81920"}


def pending(spec: dict[str, Any]) -> model.PendingPod:
    pod = {"metadata": {"namespace": "train", "name": "p"}, "spec": spec}
    return convert.pending_pod(pod, spec)


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {
        "containers": [{"name": "c"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
    }


def test_an_empty_node_selector_term_matches_no_node() -> None:
    alone = pending(affinity({}))
    beside = pending(affinity({}, {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}))

    assert takers.accepts(alone, LABELS, (), NODE) == "node affinity (empty)"
    assert takers.accepts(beside, LABELS, (), NODE) is None


@pytest.mark.parametrize(
    ("operator", "on_it", "elsewhere"), [("In", True, False), ("NotIn", False, True)]
)
def test_match_fields_are_matched_against_the_node_name(
    operator: str, on_it: bool, elsewhere: bool
) -> None:
    field = {"key": "metadata.name", "operator": operator, "values": [NODE]}
    pod = pending(affinity({"matchFields": [field]}))

    assert pod.affinity == ((Requirement(takers.NODE_NAME_FIELD, operator, (NODE,)),),)
    assert (takers.accepts(pod, LABELS, (), NODE) is None) is on_it
    assert (takers.accepts(pod, LABELS, (), NodeName("gpu-1")) is None) is elsewhere
    # Where the node is not named, no node is shown to meet it: nothing is lent for it.
    assert takers.accepts(pod, LABELS, ()) is not None


def test_a_label_named_metadata_name_is_a_label_not_the_node_name() -> None:
    expression = {"key": "metadata.name", "operator": "In", "values": [NODE]}
    pod = pending(affinity({"matchExpressions": [expression]}))

    assert takers.accepts(pod, {"metadata.name": "other"}, (), NODE) is not None
    assert takers.accepts(pod, {"metadata.name": NODE}, (), NodeName("gpu-1")) is None


def test_a_matched_node_is_placed_and_the_excluded_one_is_not() -> None:
    field = {"key": "metadata.name", "operator": "NotIn", "values": ["a"]}
    pod = pending(affinity({"matchFields": [field]}))
    rooms = [takers.Room(NodeName(n), LABELS, (), Resources(8, 64_000, 2**40)) for n in ("a", "b")]

    placed = takers.place(takers.gangs([pod]), (), rooms, 2)

    assert placed.lend == ((NodeName("b"), "pod:train/p"),)


@pytest.mark.parametrize(
    ("label", "bound", "greater"),
    [
        ("81920", "70000", True),
        ("0081920", "70000", True),  # leading zeros: Go reads them too
        ("9223372036854775807", "70000", True),  # the largest int64
        ("81_920", "70000", False),  # Python's int reads it; Go's ParseInt does not
        ("99999999999999999999", "70000", False),  # past int64: Go refuses it
        ("81920", "70_000", False),  # the bound alike: the term matches nothing
        ("81920", "070000", True),
        ("81920", "+70000", True),
        (" 81920", "70000", False),
        ("٨١٩٢٠", "70000", False),  # digits, but not ASCII ones
        ("80Gi", "70000", False),
    ],
)
def test_gt_reads_integers_as_go_does(label: str, bound: str, greater: bool) -> None:
    labels = {"m": label}

    assert takers.matches(Requirement("m", "Gt", (bound,)), labels) is greater
    assert takers.matches(Requirement("m", "Lt", (bound,)), labels) is False


def container(cpu: str, restart: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "c", "resources": {"requests": {"cpu": cpu}}}
    if restart is not None:
        out["restartPolicy"] = restart
    return out


def test_a_sidecar_is_counted_beside_the_containers() -> None:
    spec = {"containers": [container("7500m")], "initContainers": [container("1", "Always")]}

    assert convert.requests(spec).cpu == 8500


def test_an_init_container_after_a_sidecar_needs_both_at_once() -> None:
    spec = {
        "containers": [container("1")],
        "initContainers": [container("1", "Always"), container("7500m")],
    }

    assert convert.requests(spec).cpu == 8500  # the init step, sidecar beside it: 1 + 7.5
    before = {**spec, "initContainers": [container("7500m"), container("1", "Always")]}
    assert convert.requests(before).cpu == 7500  # it ran before the sidecar started


def test_pod_level_requests_replace_the_containers_for_what_they_name() -> None:
    spec = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        "resources": {"requests": {"cpu": "9"}},
        "overhead": {"cpu": "250m"},
    }

    assert convert.requests(spec) == Resources(gpu=0, cpu=9250, memory=2**30)
    limits = {**spec, "resources": {"limits": {"memory": "4Gi"}}}
    assert convert.requests(limits) == Resources(gpu=0, cpu=1250, memory=4 * 2**30)
