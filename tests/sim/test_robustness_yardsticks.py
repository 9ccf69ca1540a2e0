"""The robustness suite's two yardsticks under an error budget (``bench/robustness.py``): the
guarded best (the best grid point run with the budget through the same planner: the target,
0.9 of its harvest) and the hindsight best (the best grid point run without a budget whose worst
week held it: the limit, with no target)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import robustness  # bench/robustness.py: tests/sim/conftest.py puts bench/ on the path
from robustness import Outcome

from sandbox.sim.frontier import Point
from sandbox.sim.traces import MINUTE, Trace


def outcome(
    label: str, harvest: float, week: int, budget: int | None = None, scenario: str = "s"
) -> Outcome:
    return Outcome(scenario, budget, Point(label, harvest, week, 0), week)


def replace_scenario(o: Outcome, scenario: str) -> Outcome:
    return Outcome(scenario, o.budget, o.point, o.week)


# Without a budget, the most lucrative point spent 12 in a week: not within 10.
FREE = [outcome("peak w=10 k=0", 0.95, 12), outcome("peak w=30 k=0.2", 0.8, 8)]
# Run with the budget, the planner held it to covered loans once it was spent.
HELD = [outcome("peak w=10 k=0", 0.75, 8, 10), outcome("peak w=30 k=0.2", 0.7, 8, 10)]


def test_the_default_is_judged_against_the_best_grid_point_run_with_its_budget_too() -> None:
    default = outcome("default", 0.6, 8, budget=10)
    (v,) = robustness.verdicts(10, {"s": default}, {"s": FREE}, {"s": HELD})
    assert v.best is not None
    assert v.best.point.label == "peak w=30 k=0.2"
    assert v.ratio == 0.6 / 0.8
    assert v.guarded is not None
    assert v.guarded.point.label == "peak w=10 k=0"
    assert v.guarded_ratio == 0.6 / 0.75
    assert v.short  # 0.8 of the guarded best: under the target
    (alone,) = robustness.verdicts(10, {"s": default}, {"s": FREE})
    assert alone.guarded is None
    assert alone.guarded_ratio is None
    assert not alone.short  # no target without the guarded grid


def test_the_summary_names_the_scenarios_under_the_target_against_the_guarded_best_only() -> None:
    """``near`` is at 0.933 of the guarded best and 0.737 of the hindsight best: the limit has
    no target, so only ``far`` (0.8 of the guarded best) is named, beside the worst week."""
    defaults = {
        "near": outcome("default", 0.7, 3, 10, "near"),
        "far": outcome("default", 0.6, 9, 10, "far"),
    }
    free = {name: [replace_scenario(o, name) for o in FREE] for name in defaults}
    held = {name: [replace_scenario(o, name) for o in HELD] for name in defaults}
    rows = robustness.verdicts(10, defaults, free, held)
    assert [v.scenario for v in rows if v.short] == ["far"]
    line = robustness.budget_summary(10, rows)
    assert line == (
        "budget 10: against the guarded best least ratio 0.800 (far), under 0.9 on 1: far; "
        "against the hindsight best (the limit) least ratio 0.750 (far); "
        "the default's worst week 9 (far): every week kept"
    )
    over = robustness.verdicts(8, defaults, free, held)
    assert robustness.budget_summary(8, over).endswith("worst week 9 (far): FAIL, above 8 on far")
    skipped = robustness.budget_summary(10, robustness.verdicts(10, defaults, free), False)
    assert "the guarded best not run (--no-guarded)" in skipped


def test_the_report_has_both_ratios_as_columns(capsys: pytest.CaptureFixture[str]) -> None:
    default = outcome("default", 0.6, 8, budget=10)
    robustness.print_budget(10, robustness.verdicts(10, {"s": default}, {"s": FREE}, {"s": HELD}))
    header, row, summary = capsys.readouterr().out.strip().splitlines()[1:]
    assert header.split() == [
        *("scenario", "harvest", "breach", "7d", "max"),
        *("guarded", "best", "harvest", "7d", "max", "ratio"),
        *("hindsight", "best", "harvest", "7d", "max", "ratio"),
    ]
    assert row.split() == [
        *("s", "0.600", "8", "8"),
        *("w=10", "k=0", "0.750", "8", "0.800"),
        *("w=30", "k=0.2", "0.800", "8", "0.750"),
        *("under", "0.9"),
    ]
    assert summary.startswith("budget 10: against the guarded best least ratio 0.800 (s)")


def test_a_budget_runs_the_guarded_grid_unless_told_not_to() -> None:
    parser = robustness.arguments()
    assert parser.parse_args(["--slo", "10,30"]).guarded
    assert not parser.parse_args(["--slo", "10", "--no-guarded"]).guarded
    trace = Trace("flat", "synthetic", datetime(2025, 1, 1, tzinfo=UTC), [1.0] * 60, MINUTE)
    made = robustness.jobs([robustness.Scenario("s", trace, "UTC")], ("peak", {}), [None, 10], [10])
    grid = [j for j in made if j.label.startswith("peak w=")]
    assert {j.budget for j in grid} == {None, 10}
    assert len(grid) == 2 * len({j.label for j in grid})


def test_the_cache_keeps_the_budget_a_run_had_and_reads_a_run_without_one_as_unbudgeted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache.json"
    runs = [outcome("peak w=10 k=0", 0.95, 12), outcome("peak w=10 k=0", 0.75, 8, 10)]
    robustness._save(path, {o.key: o for o in runs})
    loaded = robustness._load(path)
    assert loaded == {o.key: o for o in runs}
    assert set(loaded) == {("s", "peak w=10 k=0", None), ("s", "peak w=10 k=0", 10)}


def test_the_cache_is_written_as_runs_finish_and_when_the_suite_stops(tmp_path: Path) -> None:
    """A whole suite takes about an hour: runs made before it stops are kept."""
    path = tmp_path / "cache.json"
    now = [0.0]
    first, second = outcome("peak w=10 k=0", 0.9, 0), outcome("peak w=30 k=0", 0.8, 0, 10)
    third, default = outcome("peak w=60 k=0", 0.7, 0, 10), outcome("default", 0.85, 0, 10)

    def finishing() -> Iterator[Outcome]:
        now[0] = 10.0
        yield first
        assert not path.exists()  # within the minute: not written yet
        now[0] = 70.0
        yield second
        assert set(robustness._load(path)) == {first.key, second.key}
        now[0] = 75.0
        yield third
        yield default
        raise KeyboardInterrupt  # the suite stopped before its minute was up again

    cached: dict[robustness.Key, Outcome] = {}
    with pytest.raises(KeyboardInterrupt):
        robustness.collect(finishing(), cached, path, every=60, clock=lambda: now[0])
    kept = {o.key: o for o in (first, second, third)}  # the default is never cached
    assert robustness._load(path) == cached == kept
