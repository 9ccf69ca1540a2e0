"""The robustness suite's scenarios made from files (``bench/robustness.py``): what is read from
the bundled release is the day it names, and what the scenario does to it is what it says."""

from __future__ import annotations

import csv
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
import robustness  # bench/robustness.py: tests/sim/conftest.py puts bench/ on the path

from sandbox.sim import traces

DAY = 24 * 60


def test_reason_steps_plays_the_reasoning_day_every_day_at_a_level_of_its_own() -> None:
    with (robustness.EXAMPLES / robustness.SERVEGEN).open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["model"] == "deepseek-r1"]
    assert [int(r["window_start_s"]) for r in rows] == list(range(0, 86_400, 600))
    windows = [float(r["rate_rps_sum"]) for r in rows]

    start = traces.load(robustness.EXAMPLES / "servegen_m-large.csv").start  # the day 0
    trace = robustness.reasoning_days(start, days=3)

    assert trace.minutes == 3 * DAY
    assert trace.native_step == timedelta(minutes=10)
    assert trace.start.astimezone(ZoneInfo(robustness.SHANGHAI)).hour == 0
    levels = []
    for day in range(3):
        values = trace.rps[day * DAY : (day + 1) * DAY]
        first = values[0]
        assert first is not None  # no gap: every window of the day has traffic
        level = first / windows[0]
        assert 0.75 <= level <= 1.25
        # each window held for its ten minutes, at the day's one level
        assert values == pytest.approx([w * level for w in windows for _ in range(10)], rel=1e-12)
        levels.append(level)
    assert len(set(levels)) == 3  # the level steps from one day to the next
    assert robustness.reasoning_days(start, days=3).rps == trace.rps  # seeded
