"""Every built-in strategy answers every pool: property tests over arbitrary demand histories.

Where: each strategy of ``rebalancer.adapters.registry``, built with its defaults or with parameters
drawn within their pydantic bounds, is asked ``decide`` tick after tick on one instance, the
way the simulator (one history object whose end moves on) and the controller (a fresh history
each tick, sliding with the clock) ask it, with jumps forward and back in time between ticks.

Why: a strategy's exception stops a pool's decisions (a controller tick, a whole simulator
run), and a strategy sees whatever the metric pipeline had: exactly zero for hours, one-minute
spikes, gaps of any length, too little history or none, a sample older or newer than the
history, a clock that jumped. The forecast raising ZeroDivisionError on a stretch of zero
demand is what this file was written for; the answer must also stay a lend target the planner
can use (an int within the pool) with evidence an audit record can hold (finite numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalancer.adapters import registry
from rebalancer.core import model
from tests.support.series import LEVELS, NAMES, ZONES, demand_series, one_in, stretch

MINUTE = timedelta(minutes=1)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # histories start in this century, at any instant
STEPS = (MINUTE, 10 * MINUTE)


def _hours(draw: st.DrawFn) -> str:
    """HH:MM-HH:MM as the window parser takes it: any start and end but equal ones."""
    start = draw(st.integers(0, 1439))
    end = draw(st.integers(0, 1440).filter(lambda m: m != start))
    return f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"


@st.composite
def forecast_params(draw: st.DrawFn) -> dict[str, Any]:
    fit = draw(st.integers(10, 24 * 60))
    return {
        "fit_minutes": fit,
        "min_history_minutes": draw(st.integers(3, fit)),
        "safety": draw(st.floats(0, 5)),
        "memory_minutes": draw(st.sampled_from([0, 7 * 24 * 60]) | st.integers(0, 7 * 24 * 60)),
        "hold_minutes": draw(st.integers(0, 24 * 60)),
        "days": draw(st.integers(0, 28)),
        "seasonal_slack_minutes": draw(st.integers(0, 24 * 60)),
        "jumpiness_z": draw(st.floats(0, 10)),
        "jumpiness_minutes": draw(st.integers(10, 7 * 24 * 60)),
    }


@st.composite
def watermark_params(draw: st.DrawFn) -> dict[str, Any]:
    low, target, high = sorted(
        draw(st.lists(st.integers(1, 999), min_size=3, max_size=3, unique=True))
    )
    return {
        "low": low / 1000,
        "target": target / 1000,
        "high": draw(st.sampled_from([high / 1000, 1.0])),
        "hold_minutes": draw(st.integers(1, 24 * 60)),
        "queue_high": draw(st.floats(0, 1e9)),
    }


@st.composite
def window_params(draw: st.DrawFn) -> dict[str, Any]:
    days = draw(st.sampled_from(["daily", "Mon-Fri", "Sat,Sun", "Fri-Mon", "Wed"]))
    zone = draw(st.sampled_from(["", *(f" {z}" for z in ZONES)]))
    spans = f"{days} {_hours(draw)}{zone}; Sat {_hours(draw)}"
    window = draw(st.sampled_from(["always", "never", f"{days} {_hours(draw)}{zone}", spans]))
    return {"window": window, "lead_minutes": draw(st.integers(0, 24 * 60))}


@st.composite
def cron_params(draw: st.DrawFn) -> dict[str, Any]:
    return {"hours": _hours(draw)}


@st.composite
def peak_params(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "window_minutes": draw(st.integers(1, 7 * 24 * 60)),
        "margin": draw(st.floats(0, 100)),
    }


@st.composite
def adaptive_params(draw: st.DrawFn) -> dict[str, Any]:
    margins = draw(st.lists(st.floats(0, 10), min_size=1, max_size=4))
    return {
        "windows": draw(st.lists(st.integers(1, 7 * 24 * 60), min_size=1, max_size=3)),
        "margins": margins,
        "least_margin": draw(st.floats(0, min(5.0, max(margins)))),
        "price_pool_hours": draw(st.floats(0, 1000)),
        "memory_minutes": draw(st.integers(60, 28 * 24 * 60)),
        "traffic_windows": draw(st.booleans()),
        "budget_gain": draw(st.floats(0, 100)),
    }


# Every registered strategy, with the parameters it may be built with (beside its defaults).
PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "adaptive": adaptive_params(),
    "forecast": forecast_params(),
    "watermark": watermark_params(),
    "window": window_params(),
    "peak": peak_params(),
    "cron": cron_params(),
    "static": st.just({}),
    "reactive": st.just({}),
}


@dataclass(frozen=True)
class Tick:
    """One ``decide`` call: where the history ends, and what else the pool shows then."""

    end: int  # history.end_index, in the series' steps
    lent: int
    clock: timedelta  # pool.now minus the history's end: a jump when not zero
    demand: float | None  # None: no sample; nan: the last known value of the history
    age: timedelta  # pool.now minus the demand sample's time; negative: a sample from ahead
    queue: float | None


@dataclass(frozen=True)
class Scenario:
    params: dict[str, Any]
    values: list[float | None]
    start: datetime
    step: timedelta
    mode: str  # "shared": the simulator's one series; "fresh", "sliding": the controller's
    window: int  # steps a sliding history holds
    size: int
    min_serving: int
    headroom: float
    rps_per_node: float
    return_time: timedelta
    zone: str
    ticks: list[Tick]

    def view(self, tick: Tick) -> model.PoolView:
        history = self.history(tick.end)
        now = history.end + tick.clock
        demand = None
        if tick.demand is not None:
            known = [v for v in self.values[: tick.end] if v is not None]
            value = tick.demand if not math.isnan(tick.demand) else (known or [0.0])[-1]
            demand = model.Sample(value, now - tick.age)
        queue = None if tick.queue is None else model.Sample(tick.queue, now - tick.age)
        return model.PoolView(
            name=model.PoolName("p"),
            now=now,
            size=self.size,
            lent=min(tick.lent, self.size),
            demand=demand,
            queue=queue,
            history=history,
            rps_per_node=self.rps_per_node,
            min_serving=self.min_serving,
            headroom=self.headroom,
            return_time=self.return_time,
            zone=self.zone,
        )

    def history(self, end: int) -> model.DemandHistory:
        if self.mode == "shared":  # one object; what lies past ``end`` is there, unseen
            return model.DemandHistory(self.start, self.step, self.values, end)
        if self.mode == "fresh":
            return model.DemandHistory(self.start, self.step, self.values[:end], end)
        lo = max(0, end - self.window)
        return model.DemandHistory(
            self.start + self.step * lo, self.step, self.values[lo:end], end - lo
        )


@st.composite
def scenarios(draw: st.DrawFn, name: str) -> Scenario:
    step = draw(st.sampled_from(STEPS))
    values = draw(demand_series(limit=2000 if step == MINUTE else 500))
    n = len(values)
    last = draw(st.one_of(st.just(n), st.integers(0, n)))
    growing = range(max(0, last - draw(st.integers(0, 40))), last + 1)
    jumps = draw(st.lists(st.integers(0, n), max_size=6))  # forward and back
    size = draw(st.integers(0, 64))
    ticks = [
        Tick(
            end=end,
            lent=draw(st.integers(0, size)),
            clock=draw(
                st.one_of(
                    st.just(timedelta(0)),
                    st.timedeltas(-timedelta(days=3), timedelta(days=3)),
                    st.timedeltas(timedelta(0), timedelta(days=3650)),
                )
            ),
            demand=draw(one_in(6, st.one_of(st.just(math.nan), st.just(math.nan), LEVELS))),
            age=draw(st.timedeltas(-timedelta(days=1), timedelta(days=30))),
            queue=draw(st.one_of(st.none(), st.just(0.0), st.floats(0, 1e12))),
        )
        for end in [*growing, *jumps]
    ]
    return Scenario(
        params=draw(PARAMS[name]) if draw(st.booleans()) else {},
        values=values,
        start=EPOCH + draw(st.timedeltas(timedelta(0), timedelta(days=100 * 365))),
        step=step,
        mode=draw(st.sampled_from(["shared", "fresh", "sliding"])),
        window=draw(st.integers(1, 2000)),
        size=size,
        min_serving=draw(st.integers(0, 70)),
        headroom=draw(st.floats(0, 3)),
        rps_per_node=draw(st.floats(1e-3, 1e6)),
        return_time=draw(st.timedeltas(MINUTE, timedelta(hours=6))),
        zone=draw(st.sampled_from(ZONES)),
        ticks=ticks,
    )


def assert_usable(proposal: model.Proposal, pool: model.PoolView) -> None:
    """What the planner and the audit record need of any answer."""
    assert isinstance(proposal, model.Proposal)
    assert type(proposal.lend_target) is int, repr(proposal.lend_target)
    assert 0 <= proposal.lend_target <= pool.size, (proposal, pool.size)
    assert isinstance(proposal.reason, str)
    for key, value in proposal.evidence.items():
        assert isinstance(key, str)
        if not isinstance(value, str):
            # An int is a float as the evidence type reads it; a bool is neither.
            assert type(value) in (int, float), (key, value)
            assert math.isfinite(value), (key, value)


def test_every_registered_strategy_has_its_parameters_drawn_here() -> None:
    assert sorted(PARAMS) == NAMES, "a new strategy needs its parameter space here"


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_strategy_answers_every_pool_tick_after_tick(name: str, data: st.DataObject) -> None:
    scenario = data.draw(scenarios(name), label="scenario")
    strategy = registry.build(name, scenario.params)
    for tick in scenario.ticks:
        pool = scenario.view(tick)
        assert_usable(strategy.decide(pool), pool)


def pool_at(values: list[float | None], end: int, lent: int = 0) -> model.PoolView:
    """A 16-node pool of 10 rps nodes (two always serve) whose history ends at ``end``."""
    history = model.DemandHistory(datetime(2024, 5, 10, tzinfo=UTC), MINUTE, values, end)
    known = [v for v in values[:end] if v is not None]
    now = history.end
    demand = model.Sample(known[-1], now - timedelta(seconds=30)) if known else None
    return model.PoolView(
        name=model.PoolName("p"),
        now=now,
        size=16,
        lent=lent,
        demand=demand,
        queue=None,
        history=history,
        rps_per_node=10.0,
        min_serving=2,
        headroom=0.2,
        return_time=7 * MINUTE,
        zone="UTC",
    )


def test_the_forecast_lends_all_but_the_minimum_through_hours_of_zero_demand() -> None:
    values = stretch(0.0, 360)
    forecast = registry.build("forecast")
    answers = [forecast.decide(pool_at(values, end)) for end in range(len(values) + 1)]
    assert answers[-1].lend_target == 16 - 2
    assert answers[-1].evidence["jumpiness_margin"] == 0.0, "zero after zero is no change"


def test_the_forecast_keeps_every_node_after_a_rise_out_of_zero_until_it_leaves_the_span() -> None:
    # 5 rps needs one node of the two that always serve: only the jump itself can hold nodes.
    values = stretch(0.0, 360) + stretch(5.0, 300)
    forecast = registry.build("forecast")
    answers = [forecast.decide(pool_at(values, end, lent=14)) for end in range(len(values) + 1)]
    assert answers[360].lend_target == 14
    risen = answers[361]  # the first tick that sees 5 rps
    assert (risen.lend_target, risen.evidence["jumpiness_margin"]) == (0, "unbounded")
    # The last horizon change out of zero (8 minutes on) leaves the 240-minute span at 608.
    assert all(a.evidence["jumpiness_margin"] == "unbounded" for a in answers[361:608])
    assert answers[608].evidence["jumpiness_margin"] == pytest.approx(0.457, abs=1e-3)
    assert answers[608].lend_target == 14


def test_the_forecast_ignores_what_the_series_holds_past_the_history_end() -> None:
    # For its first horizon of history the forecast once sliced ``values`` with a negative
    # end, which read the far end of the series: the future, in the simulator.
    past, future = stretch(10.0, 60), stretch(1000.0, 100)
    seen = registry.build("forecast").decide(pool_at([*past, *future], 60))
    blind = registry.build("forecast").decide(pool_at(past, 60))
    assert seen == blind


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_strategy_reads_the_history_past_its_end(name: str, data: st.DataObject) -> None:
    scenario = data.draw(scenarios(name), label="scenario")
    future = data.draw(st.lists(one_in(4, LEVELS), min_size=1, max_size=50), label="future")
    seen, blind = registry.build(name, scenario.params), registry.build(name, scenario.params)
    for tick in scenario.ticks:
        pool = scenario.view(tick)
        start, step, values, end = (
            pool.history.start,
            pool.history.step,
            pool.history.values,
            pool.history.end_index,
        )
        visible = model.DemandHistory(start, step, list(values[:end]), end)
        more = model.DemandHistory(start, step, [*values[:end], *future], end)
        assert seen.decide(replace(pool, history=more)) == blind.decide(
            replace(pool, history=visible)
        )


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_strategy_answers_alike_on_one_growing_series_and_on_a_copy_each_tick(
    name: str, data: st.DataObject
) -> None:
    # The forecast's memo follows one series; a copy each tick rebuilds it from the history.
    scenario = data.draw(scenarios(name), label="scenario")
    shared, fresh = replace(scenario, mode="shared"), replace(scenario, mode="fresh")
    memo, rebuilt = registry.build(name, scenario.params), registry.build(name, scenario.params)
    for tick in scenario.ticks:
        assert memo.decide(shared.view(tick)) == rebuilt.decide(fresh.view(tick))
