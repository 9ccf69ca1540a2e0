"""The robustness suite's two yardsticks under an error budget (``bench/robustness.py``): the
best grid point within the budget in hindsight, and the best one run with the budget."""

from __future__ import annotations

from pathlib import Path

import robustness  # bench/robustness.py: tests/sim/conftest.py puts bench/ on the path
from robustness import Outcome

from sandbox.sim.frontier import Point


def outcome(label: str, harvest: float, week: int, budget: int | None = None) -> Outcome:
    return Outcome("s", budget, Point(label, harvest, week, 0), week)


def test_the_default_is_judged_against_the_best_grid_point_run_with_its_budget_too() -> None:
    default = outcome("default", 0.6, 8, budget=10)
    # Without a budget, the most lucrative point spent 12 in a week: not within 10.
    free = [outcome("peak w=10 k=0", 0.95, 12), outcome("peak w=30 k=0.2", 0.8, 8)]
    # Run with the budget, the planner held it to covered loans once it was spent.
    held = [outcome("peak w=10 k=0", 0.75, 8, 10), outcome("peak w=30 k=0.2", 0.7, 8, 10)]
    (v,) = robustness.verdicts(10, {"s": default}, {"s": free}, {"s": held})
    assert v.best is not None
    assert v.best.point.label == "peak w=30 k=0.2"
    assert v.ratio == 0.6 / 0.8
    assert v.guarded is not None
    assert v.guarded.point.label == "peak w=10 k=0"
    assert v.guarded_ratio == 0.6 / 0.75
    (alone,) = robustness.verdicts(10, {"s": default}, {"s": free})
    assert alone.guarded is None
    assert alone.guarded_ratio is None


def test_the_cache_keeps_the_budget_a_run_had_and_reads_a_run_without_one_as_unbudgeted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache.json"
    runs = [outcome("peak w=10 k=0", 0.95, 12), outcome("peak w=10 k=0", 0.75, 8, 10)]
    robustness._save(path, {o.key: o for o in runs})
    loaded = robustness._load(path)
    assert loaded == {o.key: o for o in runs}
    assert set(loaded) == {("s", "peak w=10 k=0", None), ("s", "peak w=10 k=0", 10)}
