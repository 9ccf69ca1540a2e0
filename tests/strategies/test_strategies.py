"""Strategies: parameters validated at start-up, and each strategy's behaviour on a pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine
from sandbox.sim.traces import MINUTE, Trace
from strategies import peak

NOW = datetime(2026, 1, 5, 5, 51, tzinfo=UTC)


def view(
    now: datetime = NOW,
    demand: float | None = 10.0,
    lent: int = 0,
    history: Sequence[float | None] | None = None,
    queue: float = 0.0,
) -> model.PoolView:
    values = list(history or [])
    start = now - MINUTE * len(values)
    return model.PoolView(
        name=model.PoolName("p"),
        now=now,
        size=16,
        lent=lent,
        demand=None if demand is None else model.Sample(demand, now - timedelta(seconds=30)),
        queue=model.Sample(queue, now - timedelta(seconds=30)),
        history=model.DemandHistory(start, MINUTE, values, len(values)),
        rps_per_node=10.0,
        min_serving=2,
        headroom=0.2,
        return_time=timedelta(minutes=7),
        zone="UTC",
    )


def test_the_default_strategy_is_adaptive_and_forecast_stays_a_named_one() -> None:
    assert registry.DEFAULT == "adaptive"
    assert registry.build(registry.DEFAULT).name == "adaptive"
    assert "forecast" in registry.names()


def test_every_registered_strategy_builds_with_its_defaults() -> None:
    for name in registry.names():
        assert registry.build(name).name == name


@pytest.mark.parametrize(
    ("name", "params", "problem"),
    [
        pytest.param("nope", {}, "unknown strategy; choose one of", id="unknown"),
        pytest.param("forecast", {"safety": "lots"}, "safety='lots'", id="type"),
        pytest.param("forecast", {"days": 99}, "days=99", id="range"),
        pytest.param("watermark", {"low": 0.9}, "need low < target < high", id="order"),
        pytest.param("window", {"window": "Mon-Fri 25:00-06:00"}, "window=", id="window"),
        pytest.param("cron", {"hours": "22-06"}, "hours='22-06'", id="cron-hours"),
        pytest.param("window", {"lead": 5}, "lead=5: Extra inputs", id="typo"),
    ],
)
def test_bad_parameters_name_the_field_and_the_value(
    name: str, params: dict[str, object], problem: str
) -> None:
    with pytest.raises(registry.ParameterError) as caught:
        registry.build(name, params)
    assert problem in str(caught.value)


def test_the_window_strategy_gives_nodes_back_before_the_window_closes() -> None:
    strategy = registry.build("window", {"window": "daily 00:00-06:00", "lead_minutes": 10})
    assert strategy.decide(view(now=NOW - timedelta(minutes=2))).lend_target == 16
    assert strategy.decide(view(now=NOW)).lend_target == 0  # 05:51: closes within 10 minutes
    assert strategy.decide(view(now=NOW.replace(hour=7))).lend_target == 0


def test_the_watermark_strategy_lends_only_after_load_stays_low() -> None:
    strategy = registry.build("watermark", {"hold_minutes": 20})
    quiet = [10.0] * 20  # 10 rps on 16 nodes of 10 rps: utilisation 0.06
    assert strategy.decide(view(history=[10.0] * 5)).lend_target == 0, "not held long enough"
    proposal = strategy.decide(view(history=quiet))
    assert proposal.lend_target == 16 - 2  # 10 rps at the 0.6 target needs 2 nodes
    spike = [*quiet[:-1], 120.0]
    assert strategy.decide(view(history=spike, lent=14)).lend_target == 14, "hold in the band"


def test_the_watermark_strategy_reclaims_at_once_when_requests_queue() -> None:
    strategy = registry.build("watermark")
    proposal = strategy.decide(view(demand=10.0, lent=14, queue=50.0, history=[10.0] * 30))
    assert proposal.lend_target < 14
    assert "queue" in proposal.reason


def test_the_reactive_baseline_lends_what_current_load_leaves() -> None:
    assert registry.build("reactive").decide(view(demand=50.0)).lend_target == 16 - 6


def test_the_peak_rule_keeps_what_the_window_s_peak_needs_until_the_window_has_passed() -> None:
    strategy = registry.build("peak", {"window_minutes": 60, "margin": 0.15})
    spiked = [10.0] * 30 + [100.0] + [10.0] * 29
    # 100 rps x 1.15 x 1.2 headroom / 10 rps per node: 14 nodes kept of 16.
    assert strategy.decide(view(history=spiked)).lend_target == 16 - 14
    aged = spiked + [10.0] * 31  # the spike is 61 minutes old
    assert strategy.decide(view(history=aged)).lend_target == 16 - 2


@pytest.mark.parametrize(
    ("budget", "margin"),
    [
        pytest.param(None, 0.1, id="no budget"),
        pytest.param(model.ErrorBudget(10, timedelta(days=7), 0), 0.1, id="unspent"),
        pytest.param(model.ErrorBudget(10, timedelta(days=7), 5), 0.3, id="half spent"),
        pytest.param(model.ErrorBudget(10, timedelta(days=7), 25), 0.5, id="overspent"),
        pytest.param(model.ErrorBudget(0, timedelta(days=7), 0), 0.5, id="none allowed"),
    ],
)
def test_the_peak_rule_widens_its_margin_as_the_error_budget_burns(
    budget: model.ErrorBudget | None, margin: float
) -> None:
    strategy = registry.build("peak", {"margin": 0.1, "spent_margin": 0.5})
    assert isinstance(strategy, peak.Peak)
    assert strategy.margin(budget) == pytest.approx(margin)
    proposal = strategy.decide(replace(view(history=[50.0] * 60), budget=budget))
    assert proposal.evidence["margin"] == pytest.approx(margin)


def test_strategies_hold_when_demand_is_unknown() -> None:
    for name in ("forecast", "watermark", "peak"):
        proposal = registry.build(name).decide(view(demand=None, lent=3))
        assert proposal.lend_target == 3, name


def daily_ramp(days: int) -> Trace:
    """20 rps, except 12:00-14:00 each day at 130 rps; the first minute is the 144 rps peak."""
    rps: list[float | None] = []
    for minute in range(days * 24 * 60):
        hour = minute // 60 % 24
        rps.append(130.0 if 12 <= hour < 14 else 20.0)
    rps[0] = 144.0
    start = datetime(2025, 3, 3, tzinfo=UTC)
    return Trace(name="ramp", source="ramp", start=start, rps=rps, native_step=MINUTE)


def breaches_on_day(run: engine.Run, day: int) -> int:
    minutes = run.timeline[day * 1440 : (day + 1) * 1440]
    return sum(1 for m in minutes if m.demand_rps and m.demand_rps > 10.0 * m.serving + 1e-9)


def test_the_forecast_strategy_reclaims_ahead_of_a_ramp_it_saw_yesterday() -> None:
    trace = daily_ramp(days=3)
    pool = engine.PoolModel()
    forecast = engine.run(trace, registry.build("forecast"), pool)
    reactive = engine.run(trace, registry.build("reactive"), pool, baseline=True)
    assert breaches_on_day(reactive, 1) > 0, "a ramp nobody foresees breaches"
    assert breaches_on_day(forecast, 1) == 0
    assert breaches_on_day(forecast, 2) == 0
    assert forecast.figures.harvest_ratio > 0.5
