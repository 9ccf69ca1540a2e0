"""Dominance against the yardstick grid, as docs/design/robustness.md states it."""

from __future__ import annotations

import pytest

from sandbox.sim.frontier import Point


@pytest.mark.parametrize(
    ("grid", "strategy", "dominated"),
    [
        pytest.param((0.95, 0), (0.94, 0), True, id="0.01 more harvest, as many breaches"),
        pytest.param((0.945, 0), (0.94, 0), False, id="less than 0.01 more: noise"),
        pytest.param((0.908, 41), (0.911, 49), True, id="the same harvest within 0.01, fewer"),
        pytest.param((0.90, 41), (0.911, 49), False, id="0.011 less harvest, fewer breaches"),
        pytest.param((0.99, 10), (0.80, 9), False, id="more harvest, more breaches"),
        pytest.param((0.94, 0), (0.94, 0), False, id="the same point"),
    ],
)
def test_a_grid_point_dominates_with_a_clear_lead_or_the_same_harvest_and_fewer_breaches(
    grid: tuple[float, int], strategy: tuple[float, int], dominated: bool
) -> None:
    assert Point("grid", *grid).dominates(Point("strategy", *strategy)) is dominated
