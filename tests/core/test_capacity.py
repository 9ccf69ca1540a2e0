"""A node's capacity from readings: only the steps it was full count, and the figure says its
limits. (Against a real Prometheus, with the servers' own metrics: tests/adapters/test_presets.py.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebalancer.core import capacity
from rebalancer.core.model import NodeName, Unit

A, B = NodeName("gpu-a"), NodeName("gpu-b")
STEP = timedelta(minutes=1)
RPS = Unit.REQUESTS_PER_SECOND


def test_the_figure_is_the_quantile_of_what_full_nodes_served_and_nothing_else() -> None:
    # Eleven full steps serving 10..20, and busier-looking steps that were not full (a burst
    # of short requests reads high without a queue): those are no evidence of capacity.
    served = {A: [*range(10, 21), 30.0, 40.0, None]}
    full = {A: [1.0] * 11 + [0.0, None, 5.0]}

    found = capacity.measure(served, full, RPS, STEP)

    assert found.per_node == pytest.approx(19)  # 10 + 0.9 * (20 - 10), linear between ranks
    assert (found.full, found.steps) == (11, 13)
    assert capacity.measure(served, full, RPS, STEP, quantile=1.0).per_node == 20
    assert found.lower_bound is None
    (node,) = found.nodes
    assert node.per_node == pytest.approx(19)
    assert node.most == 40.0


def test_without_a_full_step_the_most_served_is_a_lower_bound() -> None:
    found = capacity.measure({A: [3.0, 7.0], B: [5.0]}, {A: [0.0, 0.0]}, RPS, STEP)

    assert found.per_node is None
    assert found.lower_bound == 7.0
    assert found.limits()[0].startswith("no node was full in any step")
    assert "a node served at most 7 rps, and can serve at least that" in found.limits()[0]


def test_few_full_steps_make_a_rough_figure() -> None:
    found = capacity.measure({A: [12.0] * 5}, {A: [1.0] * 5}, Unit.TOKENS_PER_SECOND, STEP)

    assert found.limits()[0] == (
        "only 5 full node-steps: a rough figure; measure over a longer span"
    )
    assert any("prompts take the same GPU as generation" in line for line in found.limits())


def test_nodes_that_differ_by_more_than_a_quarter_are_pointed_out() -> None:
    steps = capacity.NODE_FIGURE_STEPS
    alike = capacity.measure(
        {A: [10.0] * steps, B: [12.0] * steps}, {A: [1.0] * steps, B: [1.0] * steps}, RPS, STEP
    )
    apart = capacity.measure(
        {A: [10.0] * steps, B: [13.0] * steps}, {A: [1.0] * steps, B: [1.0] * steps}, RPS, STEP
    )

    assert alike.spread is None  # 20 % apart: the same GPU on a busier or quieter day
    assert apart.spread is not None
    assert [n.node for n in apart.spread] == [A, B]


def test_a_quantile_outside_0_to_1_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        capacity.measure({A: [1.0]}, {A: [1.0]}, RPS, STEP, quantile=90)
