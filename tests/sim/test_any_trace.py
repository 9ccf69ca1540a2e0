"""The simulator runs to the end of any trace, with every built-in strategy and the oracle.

Where: ``engine.run`` on generated per-minute traces (stretches of exactly zero, gaps of any
length, one-minute spikes, trickles of 1e-9 rps and floods of 1e9) and generated pools. Why:
``rebalancer simulate`` is how a strategy is judged before it runs a real pool, on traces we
have not seen; a run that stops halfway, or figures that are nan, judge nothing. The one trace
the simulator may refuse is one with no demand above zero anywhere: nothing calibrates a node's
capacity from it, and ``PoolModel.calibrate`` says so before anything runs.

Run with ``--hypothesis-show-statistics`` to see how many series each strategy was given.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rebalancer.adapters import registry
from rebalancer.core.strategy import Strategy
from rebalancer.errors import TraceError
from sandbox.sim import engine, simulate
from sandbox.sim.traces import MINUTE, Trace
from tests.support.series import NAMES, ZONES, demand_series, stretch

START = datetime(2024, 5, 10, tzinfo=UTC)
# A few hundred minutes: past every default window but the seasonal day, at ~0.1 s a series.
MINUTES = 400


def trace_of(rps: list[float | None]) -> Trace:
    return Trace(name="generated", source="hypothesis", start=START, rps=rps, native_step=MINUTE)


@st.composite
def pools(draw: st.DrawFn) -> engine.PoolModel:
    """Pools the command line accepts: at least one node, ``min_serving`` within the pool."""
    size = draw(st.integers(1, 32))
    return engine.PoolModel(
        size=size,
        min_serving=draw(st.integers(0, size)),
        headroom=draw(st.floats(0, 3)),
        drain=timedelta(seconds=draw(st.integers(0, 900))),
        warmup=timedelta(seconds=draw(st.integers(0, 1800))),
        zone=draw(st.sampled_from(ZONES)),
    )


def with_demand(rps: list[float | None]) -> bool:
    return any(v for v in rps)


def built(name: str, trace: Trace, pool: engine.PoolModel) -> tuple[Strategy, bool]:
    """The strategy as ``rebalancer simulate`` runs it, and whether it runs as a baseline (the
    baselines and the oracle do)."""
    if name == "oracle":
        need = engine.needs(trace, pool, pool.calibrate(trace))
        return engine.Oracle(engine.oracle_plan(need, pool), trace.start), True
    return registry.build(name), name in simulate.BASELINES


def describe(rps: list[float | None]) -> None:
    """Events for ``--hypothesis-show-statistics``: what kinds of series were tried."""
    event("has a stretch of zero" if any(v == 0.0 for v in rps) else "no zero")
    event("has gaps" if any(v is None for v in rps) else "no gap")
    known = [v for v in rps if v]
    event(f"peak over least non-zero: 1e{round(math.log10(max(known) / min(known)))}")
    event(f"minutes: {'under 100' if len(rps) < 100 else 'under 400' if len(rps) < 400 else 400}")


@pytest.mark.parametrize("name", [*NAMES, "oracle"])
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    rps=st.one_of(
        demand_series(limit=MINUTES), demand_series(limit=MINUTES, at_least=MINUTES // 2)
    ).filter(with_demand),
    pool=pools(),
)
def test_every_strategy_runs_to_the_end_of_any_trace_with_figures_in_range(
    name: str, rps: list[float | None], pool: engine.PoolModel
) -> None:
    describe(rps)
    trace = trace_of(rps)
    strategy, baseline = built(name, trace, pool)
    run = engine.run(trace, strategy, pool, baseline=baseline)

    assert len(run.timeline) == trace.minutes
    for minute in run.timeline:
        assert min(minute.serving, minute.lent, minute.returning) >= 0
        assert minute.serving + minute.lent + minute.returning == pool.size
        assert math.isfinite(minute.queue)
        assert minute.queue >= 0
    f = run.figures
    pool_hours = pool.size * trace.minutes / 60 + 5e-4  # the figures are rounded to 3 places
    for hours in (f.lent_node_hours, f.oracle_node_hours, f.harvest_ratio):
        assert math.isfinite(hours)
        assert hours >= 0
    assert f.lent_node_hours <= pool_hours
    assert f.oracle_node_hours <= pool_hours
    assert 0 <= f.breach_minutes <= trace.minutes
    assert 0 <= f.headroom_minutes <= trace.minutes
    assert 0 <= f.reclaims <= f.loans <= f.reclaims + pool.size
    assert 0 <= f.short_loans <= f.reclaims


@settings(max_examples=20, deadline=None)
@given(
    rps=st.lists(st.sampled_from([0.0, None]), max_size=MINUTES),
    pool=pools(),
    name=st.sampled_from(NAMES),
)
def test_a_trace_without_demand_above_zero_is_refused_before_anything_runs(
    rps: list[float | None], pool: engine.PoolModel, name: str
) -> None:
    with pytest.raises(TraceError, match="has no demand above zero"):
        engine.run(trace_of(rps), registry.build(name), pool)


@settings(max_examples=5, deadline=None)
@given(level=st.floats(1e-6, 1e9))
def test_one_spike_in_hours_of_zero_demand_breaches_only_its_own_minute(level: float) -> None:
    # The spike is the peak: 14.4 nodes' worth, when zero demand has let all but two be lent.
    # (From 1e-6 rps: the score forgives a shortfall of 1e-9 rps, all of a 1e-9 spike.)
    rps = [*stretch(0.0, 200), level, *stretch(0.0, 199)]
    run = engine.run(trace_of(rps), registry.build("forecast"), engine.PoolModel())
    assert len(run.timeline) == 400
    assert run.figures.breach_minutes == 1
