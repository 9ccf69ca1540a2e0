"""The node-pool planner on values: which pool selects a node, and the labels and taints it
writes; a property holds that a node once planned and written needs nothing more.

Nodes in a phase other than serving are made with the codec (``tests.support.factories``).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rebalancer.core import model, nodepools, nodestate
from rebalancer.core.model import NodeName, Taint
from rebalancer.core.nodepools import Expression, Layout, NodePool, Operator, Selector, Verdict
from tests.support import factories

KEYS = nodestate.Keys()
PRODUCT = "nvidia.com/gpu.product"
INFERENCE_TAINT = Taint("workload", "NoSchedule", "inference")
TRAINING_TAINT = Taint("workload", "NoSchedule", "training")
UNREACHABLE = Taint(
    "node.kubernetes.io/unreachable", "NoExecute", time_added="2026-03-01T08:00:00Z"
)
LENT_TAINT = Taint(KEYS.lent_taint, "NoSchedule", "training")

INFERENCE = NodePool(
    "inference-l20",
    Selector({PRODUCT: "NVIDIA-L20"}),
    {"gpu-pool": "inference-l20", "workload-type": "inference"},
    (INFERENCE_TAINT,),
)
TRAINING = NodePool(
    "training-a100",
    Selector(match_expressions=(Expression(PRODUCT, Operator.IN, frozenset({"NVIDIA-A100"})),)),
    {"gpu-pool": "training-a100", "workload-type": "training", "batch-scheduling": "enabled"},
    (TRAINING_TAINT,),
)
LAYOUT = Layout((INFERENCE, TRAINING))


def node(
    labels: Mapping[str, str], taints: tuple[Taint, ...] = (), name: str = "gpu-3"
) -> model.NodeView:
    return model.NodeView(NodeName(name), dict(labels), taints)


def l20(**labels: str) -> dict[str, str]:
    return {PRODUCT: "NVIDIA-L20", **labels}


# ---------------------------------------------------------------------------------------------
# Selectors


@pytest.mark.parametrize(
    ("expression", "labels", "holds"),
    [
        (Expression("a", Operator.IN, frozenset({"x", "y"})), {"a": "y"}, True),
        (Expression("a", Operator.IN, frozenset({"x"})), {"a": "z"}, False),
        (Expression("a", Operator.IN, frozenset({"x"})), {}, False),
        (Expression("a", Operator.NOT_IN, frozenset({"x"})), {"a": "z"}, True),
        (Expression("a", Operator.NOT_IN, frozenset({"x"})), {}, True),  # absent: not in the set
        (Expression("a", Operator.NOT_IN, frozenset({"x"})), {"a": "x"}, False),
        (Expression("a", Operator.EXISTS), {"a": ""}, True),
        (Expression("a", Operator.EXISTS), {"b": "x"}, False),
        (Expression("a", Operator.DOES_NOT_EXIST), {"b": "x"}, True),
        (Expression("a", Operator.DOES_NOT_EXIST), {"a": "x"}, False),
    ],
)
def test_each_operator_means_what_a_kubernetes_label_selector_means(
    expression: Expression, labels: dict[str, str], holds: bool
) -> None:
    assert expression.holds(labels) is holds


def test_a_selector_needs_every_match_label_and_every_expression() -> None:
    selector = Selector({"a": "1"}, (Expression("b", Operator.EXISTS),))
    assert selector.selects({"a": "1", "b": "x"})
    assert not selector.selects({"a": "1"})
    assert not selector.selects({"a": "2", "b": "x"})


# ---------------------------------------------------------------------------------------------
# Plans


def test_a_node_moved_from_training_to_inference_swaps_its_taint_and_loses_stale_labels() -> None:
    was_training = node(
        l20(**{"gpu-pool": "training-a100", "workload-type": "training", "batch-scheduling": "on"}),
        (UNREACHABLE, TRAINING_TAINT, LENT_TAINT),
    )
    plan = nodepools.plan_node(was_training, LAYOUT, KEYS)
    assert plan.verdict is Verdict.CHANGE
    assert plan.pools == ("inference-l20",)
    assert plan.edits == [
        "+label gpu-pool=inference-l20 (was training-a100)",
        "+label workload-type=inference (was training)",
        "-label batch-scheduling",
        "+taint workload=inference:NoSchedule",
        "-taint workload=training:NoSchedule",
    ]
    assert plan.change is not None
    # Taints the file does not own stay where they were, timeAdded and all; the pool's go last.
    assert plan.change.taints == (UNREACHABLE, LENT_TAINT, INFERENCE_TAINT)
    assert plan.change.labels == {
        "gpu-pool": "inference-l20",
        "workload-type": "inference",
        "batch-scheduling": None,
    }
    assert plan.change.annotations == {}


def test_labels_and_taints_the_file_does_not_name_are_never_touched() -> None:
    labels = l20(**{"gpu-pool": "inference-l20", "workload-type": "inference", "team": "search"})
    plan = nodepools.plan_node(node(labels, (UNREACHABLE, INFERENCE_TAINT)), LAYOUT, KEYS)
    assert plan.verdict is Verdict.UNCHANGED
    assert plan.change is None


def test_only_labels_change_leaves_the_taint_list_out_of_the_write() -> None:
    plan = nodepools.plan_node(node(l20(), (INFERENCE_TAINT,)), LAYOUT, KEYS)
    assert plan.change is not None
    assert plan.change.taints is None
    assert plan.edits == ["+label gpu-pool=inference-l20", "+label workload-type=inference"]


@pytest.mark.parametrize(
    "present",
    [
        Taint("workload", "NoSchedule", "inference", time_added="2026-03-01T08:00:00Z"),
        Taint("workload", "NoSchedule", "inference"),
    ],
)
def test_a_taint_already_there_is_kept_as_written_and_not_rewritten(present: Taint) -> None:
    labels = l20(**{"gpu-pool": "inference-l20", "workload-type": "inference"})
    plan = nodepools.plan_node(node(labels, (present,)), LAYOUT, KEYS)
    assert plan.verdict is Verdict.UNCHANGED


def test_an_absent_taint_value_is_the_empty_one() -> None:
    pool = NodePool("p", Selector({"a": "1"}), taints=(Taint("dedicated", "NoSchedule"),))
    on_node = Taint("dedicated", "NoSchedule", "")
    plan = nodepools.plan_node(node({"a": "1"}, (on_node,)), Layout((pool,)), KEYS)
    assert plan.verdict is Verdict.UNCHANGED


def test_a_node_no_pool_selects_is_unmatched_and_untouched() -> None:
    plan = nodepools.plan_node(node({"kubernetes.io/os": "linux"}, (TRAINING_TAINT,)), LAYOUT, KEYS)
    assert (plan.verdict, plan.pools, plan.change) == (Verdict.UNMATCHED, (), None)


def test_a_node_two_pools_select_is_ambiguous_and_names_both() -> None:
    everything = NodePool(
        "all-gpus", Selector(match_expressions=(Expression(PRODUCT, Operator.EXISTS),))
    )
    plan = nodepools.plan_node(node(l20()), Layout((INFERENCE, everything)), KEYS)
    assert (plan.verdict, plan.pools, plan.change) == (
        Verdict.AMBIGUOUS,
        ("inference-l20", "all-gpus"),
        None,
    )


def test_a_lent_node_is_refused_whatever_it_would_need() -> None:
    lent = factories.lend(node(l20(), (INFERENCE_TAINT,)))
    plan = nodepools.plan_node(lent, LAYOUT, KEYS)
    assert (plan.verdict, plan.refusal, plan.change) == (Verdict.REFUSED, "lent", None)
    assert plan.detail == "rebalancer.io/state=lent: the controller has lent it or is moving it"


@pytest.mark.parametrize("phase", ["lending", "reclaiming"])
def test_a_node_in_flight_is_refused(phase: str) -> None:
    serving = node(l20(), (INFERENCE_TAINT,))
    moving = (
        factories.lending(serving)
        if phase == "lending"
        else factories.begin_reclaim(factories.lend(serving))
    )
    plan = nodepools.plan_node(moving, LAYOUT, KEYS)
    assert (plan.verdict, plan.refusal) == (Verdict.REFUSED, phase)


def test_a_node_whose_state_cannot_be_read_is_refused() -> None:
    plan = nodepools.plan_node(node(l20(**{KEYS.state: "borrowed"})), LAYOUT, KEYS)
    assert (plan.verdict, plan.refusal) == (Verdict.REFUSED, nodepools.UNREADABLE)
    assert "not one of lending, lent, reclaiming" in plan.detail


def test_the_state_is_read_under_the_prefix_given() -> None:
    keys = nodestate.Keys("gpu.example.com/")
    plan = nodepools.plan_node(node(l20(**{"gpu.example.com/state": "x"})), LAYOUT, keys)
    assert plan.verdict is Verdict.REFUSED
    other = nodepools.plan_node(node(l20(**{"gpu.example.com/state": "x"})), LAYOUT, KEYS)
    assert other.verdict is Verdict.CHANGE


def test_plans_come_by_node_name_with_every_verdict_counted() -> None:
    nodes = [
        node({"os": "linux"}, name="cpu-0"),
        node(l20(), name="gpu-1"),
        node(
            l20(**{"gpu-pool": "inference-l20", "workload-type": "inference"}),
            (INFERENCE_TAINT,),
            "gpu-0",
        ),
    ]
    plans = nodepools.plan(nodes, LAYOUT, KEYS)
    assert [p.node for p in plans] == ["cpu-0", "gpu-0", "gpu-1"]
    assert nodepools.summary(plans) == {
        Verdict.CHANGE: 1,
        Verdict.UNCHANGED: 1,
        Verdict.REFUSED: 0,
        Verdict.UNMATCHED: 1,
        Verdict.AMBIGUOUS: 0,
    }


# ---------------------------------------------------------------------------------------------
# A layout as a whole


def test_a_selector_on_a_label_the_file_sets_is_a_problem() -> None:
    by_pool = NodePool("again", Selector({"gpu-pool": "inference-l20"}), {"x": "y"})
    found = nodepools.problems(Layout((INFERENCE, by_pool)), KEYS)
    assert [str(p) for p in found] == [
        "pools[1].selector.matchLabels['gpu-pool']: selects by label 'gpu-pool', which this file "
        "sets (pools[0].labels); select by labels the file does not write, e.g. "
        "nvidia.com/gpu.product"
    ]


def test_duplicate_names_and_the_controllers_keys_are_problems() -> None:
    twin = NodePool("inference-l20", Selector({"a": "1"}), taints=(LENT_TAINT,))
    found = [str(p) for p in nodepools.problems(Layout((INFERENCE, twin)), KEYS)]
    assert found == [
        "pools[1].name='inference-l20': duplicate pool name; pools[0] has it already",
        "pools[1].taints[0].key: key 'rebalancer.io/lent': keys under 'rebalancer.io/' belong "
        "to the controller",
    ]
    assert nodepools.problems(LAYOUT, KEYS) == []


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("gpu-pool", True),
        ("nvidia.com/gpu.product", True),
        ("example.com/Under_score.x", True),
        ("", False),
        ("gpu pool", False),
        ("-pool", False),
        ("Example.com/x", False),
        ("/x", False),
        ("a" * 64, False),
    ],
)
def test_label_keys_follow_the_api_syntax(key: str, ok: bool) -> None:
    assert (nodepools.key_problem(key) is None) is ok


@pytest.mark.parametrize(
    ("value", "ok"), [("", True), ("NVIDIA-L20", True), ("a b", False), ("x-", False)]
)
def test_label_values_follow_the_api_syntax(value: str, ok: bool) -> None:
    assert (nodepools.value_problem(value) is None) is ok


# ---------------------------------------------------------------------------------------------
# The property: a node planned and written needs nothing more


SELECTED_BY = ("product", "zone")  # what selectors read; never what pools write
WRITTEN = ("gpu-pool", "workload-type", "batch-scheduling")
VALUES = ("a", "b", "c")
TAINT_KEYS = ("workload", "dedicated", "other.example.com/x")
EFFECTS = nodepools.EFFECTS

taints = st.builds(
    Taint,
    key=st.sampled_from(TAINT_KEYS),
    effect=st.sampled_from(EFFECTS),
    value=st.sampled_from([None, "", *VALUES]),
    time_added=st.sampled_from([None, "2026-03-01T08:00:00Z"]),
)


def _unique(found: list[Taint]) -> tuple[Taint, ...]:
    """As the API holds them: at most one taint per key and effect."""
    return tuple({(t.key, t.effect): t for t in found}.values())


expressions = st.builds(
    Expression,
    key=st.sampled_from(SELECTED_BY),
    operator=st.sampled_from(list(Operator)),
    values=st.frozensets(st.sampled_from(VALUES), min_size=1, max_size=2),
)
selectors = st.builds(
    Selector,
    match_labels=st.dictionaries(st.sampled_from(SELECTED_BY), st.sampled_from(VALUES), max_size=1),
    match_expressions=st.lists(expressions, max_size=2).map(tuple),
)


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    count = draw(st.integers(1, 3))
    pools = tuple(
        NodePool(
            f"pool-{i}",
            draw(selectors),
            draw(st.dictionaries(st.sampled_from(WRITTEN), st.sampled_from(VALUES), max_size=3)),
            draw(st.lists(taints, max_size=2).map(_unique)),
        )
        for i in range(count)
    )
    return Layout(pools)


labels = st.dictionaries(st.sampled_from((*SELECTED_BY, *WRITTEN, "team")), st.sampled_from(VALUES))
nodes = st.builds(lambda ls, ts: node(ls, _unique(ts)), labels, st.lists(taints, max_size=4))


@given(layout=layouts(), before=nodes)
def test_a_node_planned_and_written_needs_nothing_more(
    layout: Layout, before: model.NodeView
) -> None:
    assert nodepools.problems(layout, KEYS) == []
    first = nodepools.plan_node(before, layout, KEYS)
    if first.change is None:
        return
    after = nodestate.apply(before, first.change)
    again = nodepools.plan_node(after, layout, KEYS)
    assert (again.verdict, again.pools, again.change) == (Verdict.UNCHANGED, first.pools, None)
    # Only what the file owns moved.
    owned = layout.label_keys
    assert {k: v for k, v in after.labels.items() if k not in owned} == {
        k: v for k, v in before.labels.items() if k not in owned
    }
    assert [t for t in after.taints if t.key not in layout.taint_keys] == [
        t for t in before.taints if t.key not in layout.taint_keys
    ]
