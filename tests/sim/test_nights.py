"""The pool's clock in the simulator: its window's open stretches, the minutes it may lend in,
its nights, and the report's timelines drawn in its zone with the window shaded.

In Europe/Berlin, across the nights the clocks change (2025-03-30 and 2025-10-26), so that a
night of 23 or 25 hours and a window that opens or closes across a change are always exercised.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from rebalancer.adapters import registry
from rebalancer.core import windows
from rebalancer.core.policy import PoolPolicy
from sandbox.sim import charts, engine, nights, report
from sandbox.sim.traces import Trace

BERLIN = ZoneInfo("Europe/Berlin")
MINUTE = timedelta(minutes=1)
SVG = "{http://www.w3.org/2000/svg}"
SPRING = datetime(2025, 3, 28, 12, tzinfo=UTC)  # a Friday; the clocks go forward on Sunday


def window(text: str) -> windows.Window:
    parsed = windows.parse(text, "Europe/Berlin")
    assert isinstance(parsed, windows.Window)
    return parsed


def test_open_spans_follow_the_wall_clock_across_a_change() -> None:
    spans = nights.open_spans(window("daily 22:00-06:00"), SPRING, SPRING + timedelta(days=3))
    assert spans == [
        (datetime(2025, 3, 28, 21, tzinfo=UTC), datetime(2025, 3, 29, 5, tzinfo=UTC)),
        # Sat 22:00 CET to Sun 06:00 CEST: seven hours.
        (datetime(2025, 3, 29, 21, tzinfo=UTC), datetime(2025, 3, 30, 4, tzinfo=UTC)),
        (datetime(2025, 3, 30, 20, tzinfo=UTC), datetime(2025, 3, 31, 4, tzinfo=UTC)),
    ]


def test_a_stretch_open_at_either_end_is_cut_at_it() -> None:
    start = datetime(2025, 3, 28, 23, tzinfo=UTC)  # open since 21:00
    spans = nights.open_spans(window("daily 22:00-06:00"), start, start + timedelta(hours=2))
    assert spans == [(start, start + timedelta(hours=2))]
    assert nights.open_spans(windows.NEVER, start, start + timedelta(days=2)) == []
    assert nights.open_spans(windows.ALWAYS, start, start + MINUTE) == [(start, start + MINUTE)]


@pytest.mark.parametrize(
    "text", ["daily 22:00-06:00", "Mon-Fri 22:00-06:30; Sat,Sun 00:00-24:00", "Sun 02:30-03:30"]
)
def test_lendable_minutes_are_those_the_window_is_open_at(text: str) -> None:
    """Against the window's own rule, minute by minute, over the spring change."""
    open_ = window(text)
    start = SPRING + timedelta(seconds=30)  # minutes that do not begin on the hour
    mask = nights.lendable(open_, start, 4 * 24 * 60)
    assert mask is not None
    assert mask == [open_.is_open(start + MINUTE * t) for t in range(4 * 24 * 60)]
    assert any(mask)
    assert not all(mask)


def test_a_window_always_open_needs_no_mask() -> None:
    assert nights.lendable(windows.ALWAYS, SPRING, 60) is None


@pytest.mark.parametrize(
    ("evening", "hours"),
    [(date(2025, 3, 29), 23), (date(2025, 10, 25), 25), (date(2025, 6, 1), 24)],
)
def test_a_night_is_noon_to_noon_on_the_wall_clock(evening: date, hours: int) -> None:
    start = datetime.combine(evening, time(), BERLIN)
    found = nights.nights("Europe/Berlin", start, start + timedelta(days=1))
    night = next(n for n in found if n.evening == evening)
    assert night.minutes == hours * 60
    assert night.start.astimezone(BERLIN).hour == night.end.astimezone(BERLIN).hour == 12


def test_nights_cover_the_trace_and_say_how_much_of_each_it_holds() -> None:
    start = datetime(2025, 3, 28, 22, tzinfo=UTC)  # Fri 23:00 in Berlin
    found = nights.nights("Europe/Berlin", start, start + timedelta(days=2))
    assert [n.evening.isoformat() for n in found] == ["2025-03-28", "2025-03-29", "2025-03-30"]
    # Fri 23:00 to Sat 12:00; Sat 12:00 to Sun 12:00, an hour short; Sun 12:00 to midnight.
    assert [n.covered_minutes for n in found] == [13 * 60, 23 * 60, 12 * 60]
    assert [n.partial for n in found] == [True, False, True]


def test_lent_per_night_adds_up_to_the_run() -> None:
    start = datetime(2025, 3, 28, 22, tzinfo=UTC)
    found = nights.nights("Europe/Berlin", start, start + timedelta(days=2))
    times = [start + MINUTE * t for t in range(2 * 24 * 60)]
    lent = [t % 3 for t in range(len(times))]
    hours = nights.lent_per_night(times, lent, found)
    assert sum(hours) == pytest.approx(sum(lent) / 60)
    assert hours[0] == pytest.approx(sum(lent[: 13 * 60]) / 60)


def test_the_oracle_plans_no_loan_where_the_window_is_closed() -> None:
    pool = engine.PoolModel(size=4, min_serving=1)
    need = [1] * 6
    assert engine.oracle_plan(need, pool) == [3] * 6
    mask = [False, True, True, False, True, False]
    assert engine.oracle_plan(need, pool, mask) == [0, 3, 3, 0, 3, 0]


# -- the report's timelines ---------------------------------------------------------------------


def pool_in_berlin() -> tuple[Trace, engine.PoolModel]:
    start = SPRING
    rps: list[float | None] = [20.0 + 10 * ((t // 60) % 24 in range(8, 20)) for t in range(4320)]
    trace = Trace("berlin", "generated", start, rps, MINUTE)
    rules = PoolPolicy(rps_per_node=5.0, window=window("daily 22:00-06:00"))
    return trace, engine.PoolModel(zone="Europe/Berlin", rps_per_node=5.0, rules=rules)


def drawn(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_the_timelines_are_drawn_in_the_pools_zone_with_its_window_shaded() -> None:
    trace, pool = pool_in_berlin()
    runs = [engine.run(trace, registry.build("reactive"), pool, baseline=True)]
    page = drawn(report.svg(trace, pool, 5.0, runs))
    ticks = [t for t in page.iter(f"{SVG}text") if t.get("class") == "tick"]
    assert len(ticks) >= 4
    at = [datetime.fromisoformat(t.get("data-at", "")) for t in ticks]
    for tick, instant in zip(ticks, at, strict=True):
        assert tick.text == instant.astimezone(BERLIN).strftime("%m-%d %H")
        assert instant.astimezone(BERLIN).hour % 6 == 0
    # x is linear in time: the ticks fix the scale, and the shaded spans sit on it.
    x0, x1 = float(ticks[0].get("x", "")), float(ticks[-1].get("x", ""))
    per_hour = (x1 - x0) / ((at[-1] - at[0]) / timedelta(hours=1))

    def x_of(instant: datetime) -> float:
        return x0 + (instant - at[0]) / timedelta(hours=1) * per_hour

    shaded = [r for r in page.iter(f"{SVG}rect") if r.get("class") == report.WINDOW_GID]
    spans = nights.open_spans(pool.window, trace.start, trace.end)
    assert len(shaded) == len(spans) == 3
    for rect, (opened, closed) in zip(shaded, spans, strict=True):
        assert datetime.fromisoformat(rect.get("data-from", "")) == opened
        assert datetime.fromisoformat(rect.get("data-to", "")) == closed
        left, width = float(rect.get("x", "")), float(rect.get("width", ""))
        assert left == pytest.approx(x_of(opened), abs=0.2)
        assert left + width == pytest.approx(x_of(closed), abs=0.2)
    title = next(page.iter(f"{SVG}text")).text or ""
    assert "Europe/Berlin time; lending window daily 22:00-06:00 shaded" in title


def test_a_pool_that_lends_at_any_hour_has_nothing_shaded() -> None:
    trace, _ = pool_in_berlin()
    anytime = engine.PoolModel(zone="Europe/Berlin")
    runs = [engine.run(trace, registry.build("static"), anytime, baseline=True)]
    page = drawn(report.svg(trace, anytime, anytime.capacity(trace), runs))
    assert not [r for r in page.iter(f"{SVG}rect") if r.get("class") == report.WINDOW_GID]
    assert "lends at any hour" in (next(page.iter(f"{SVG}text")).text or "")


@pytest.mark.parametrize(
    ("zone", "days", "step", "label"),
    [
        ("Asia/Kolkata", 3, 6, "%m-%d %H"),  # hours on UTC's half hours
        ("America/Los_Angeles", 7, 24, "%a %m-%d"),
        ("Europe/Berlin", 21, 48, "%a %m-%d"),  # across the spring change
    ],
)
def test_a_time_axis_ticks_on_its_zones_hours(zone: str, days: int, step: int, label: str) -> None:
    start = SPRING + timedelta(minutes=7)
    ticks = charts.time_ticks(start, days * 24 * 60, ZoneInfo(zone))
    assert 4 <= len(ticks) <= 12
    for minute, text, at in ticks:
        instant = datetime.fromisoformat(at)
        local = instant.astimezone(ZoneInfo(zone))
        assert (instant - start) / MINUTE == minute
        assert text == local.strftime(label)
        assert (local.minute, local.hour % min(step, 24)) == (0, 0)
    hours = [
        (datetime.fromisoformat(b) - datetime.fromisoformat(a)) / timedelta(hours=1)
        for (_, _, a), (_, _, b) in itertools.pairwise(ticks)
    ]
    assert set(hours) <= {step - 1, step, step + 1}  # a change of the clocks: an hour less
