"""The store's indexes make a request cheaper, never change its answer; the other actors look
only at what changed, and still see everything that did."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.emulator import cluster, selector, status
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import DeleteOptions, ListRequest, Store, WatchRequest
from sandbox.emulator.watcher import Scope
from tests.support.objects import pod

START = datetime(2026, 1, 1, tzinfo=UTC)
NAMESPACES = ("a", "b")
NODE_NAMES = ("n1", "n2", "")
TIERS = ("gold", "silver", None)

_pods = st.lists(
    st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NODE_NAMES), st.sampled_from(TIERS)),
    max_size=12,
)
_label_selectors = st.sampled_from(
    ["", "tier=gold", "tier in (gold,silver)", "tier!=gold", "tier", "!tier", "app=x,tier=silver"]
)
_field_selectors = st.sampled_from(
    ["", "spec.nodeName=n1", "spec.nodeName=", "spec.nodeName!=", "metadata.name=p3"]
)


def _store(specs: list[tuple[str, str, str | None]], removed: set[int]) -> Store:
    store = Store(ManualClock(START), kubelet=False)
    for i, (namespace, node, tier) in enumerate(specs):
        body = pod(f"p{i}", namespace, **({"nodeName": node} if node else {}))
        body["metadata"]["labels"] = {"app": "x"} | ({"tier": tier} if tier else {})
        store.create(PODS, namespace, body)
    for i, (namespace, _node, tier) in enumerate(specs):
        if i in removed:
            store.delete(PODS, namespace, f"p{i}", DeleteOptions(grace_period=0))
        elif tier == "gold":  # a relabel moves the object between index entries
            current = store.get(PODS, namespace, f"p{i}")
            current["metadata"]["labels"]["tier"] = "silver"
            store.replace(PODS, namespace, f"p{i}", current)
    return store


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=_pods,
    removed=st.sets(st.integers(0, 11)),
    namespace=st.sampled_from((None, *NAMESPACES)),
    labels=_label_selectors,
    fields=_field_selectors,
)
def test_an_indexed_list_is_the_filtered_collection(
    specs: list[tuple[str, str, str | None]],
    removed: set[int],
    namespace: str | None,
    labels: str,
    fields: str,
) -> None:
    store = _store(specs, removed)
    scope = Scope(
        PODS,
        namespace,
        selector.parse_labels(labels),
        selector.parse_fields(fields, frozenset(PODS.fields)),
    )
    everything = store.list_page(ListRequest(Scope(PODS))).items
    wanted = [p for p in everything if scope.selects(p)]
    assert store.list_page(ListRequest(scope)).items == wanted


def test_a_pod_bound_to_a_node_that_appears_later_starts_then() -> None:
    store = Store(ManualClock(START))
    store.create(PODS, "a", pod("early", "a", nodeName="late-node"))
    assert store.get(PODS, "a", "early")["status"].get("phase") != "Running"
    store.create(NODES, None, cluster.node("late-node", cluster.INFERENCE))
    assert store.get(PODS, "a", "early")["status"]["phase"] == "Running"


def test_a_grace_period_ends_when_the_clock_passes_it_and_only_its_pod_goes() -> None:
    clock = ManualClock(START)
    store = Store(clock)
    store.create(NODES, None, cluster.node("n1", cluster.INFERENCE))
    for i in range(3):
        store.create(PODS, "a", pod(f"p{i}", "a", nodeName="n1"))
    store.delete(PODS, "a", "p1", DeleteOptions(grace_period=5))
    before = store.list_page(ListRequest(Scope(PODS))).items
    assert [p["metadata"]["name"] for p in before] == ["p0", "p1", "p2"]
    clock.advance(6)
    after = store.list_page(ListRequest(Scope(PODS))).items
    assert [p["metadata"]["name"] for p in after] == ["p0", "p2"]


def _without_versions(items: list[dict[str, object]]) -> list[dict[str, object]]:
    for item in items:
        meta = item["metadata"]
        assert isinstance(meta, dict)
        meta.pop("resourceVersion")
    return items


def test_a_loaded_cluster_answers_as_the_created_one_and_runs_on_from_there() -> None:
    created = Store(ManualClock(START))
    cluster.seed(created)
    for i, node in enumerate(("inference-0", "inference-1", "missing")):
        created.create(PODS, "a", pod(f"p{i}", "a", nodeName=node))
    created.create(PODS, "b", pod("unbound", "b"))
    loaded = Store(ManualClock(START))
    loaded.load(NODES, copy.deepcopy(created.peek(NODES)))
    loaded.load(PODS, copy.deepcopy(created.peek(PODS)))
    for namespace, fields in ((None, ""), ("a", ""), (None, "spec.nodeName=inference-1")):
        scope = Scope(PODS, namespace, fields=selector.parse_fields(fields, frozenset(PODS.fields)))
        want = created.list_page(ListRequest(scope)).items
        assert _without_versions(loaded.list_page(ListRequest(scope)).items) == _without_versions(
            want
        )
    nodes = ListRequest(Scope(NODES))
    assert _without_versions(loaded.list_page(nodes).items) == _without_versions(
        created.list_page(nodes).items
    )
    # What was loaded is the store's own from then on: the kubelet starts a pod whose node
    # appears, and a watch from the load's version sees the change.
    since = str(loaded.resource_version)
    loaded.create(NODES, None, cluster.node("missing", cluster.INFERENCE))
    assert loaded.get(PODS, "a", "p2")["status"]["phase"] == "Running"
    watcher = loaded.watch(WatchRequest(Scope(PODS), since))
    events = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events if e] == [
        ("MODIFIED", "p2")
    ]


def test_loading_an_object_twice_is_refused_as_a_create_would_be() -> None:
    store = Store(ManualClock(START))
    store.load(PODS, [pod("p0", "a")])
    with pytest.raises(status.ApiError) as failed:
        store.load(PODS, [pod("p0", "a")])
    assert failed.value.code == 409
