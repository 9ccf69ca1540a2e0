"""The store's indexes make a request cheaper, never change its answer; the other actors look
only at what changed, and still see everything that did."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.emulator import cluster, selector
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import DeleteOptions, ListRequest, Store
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
