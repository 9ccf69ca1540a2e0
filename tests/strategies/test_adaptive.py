"""The adaptive strategy: its replay of a rung is what the simulator measures for that rule,
and it follows the rung its replay scores best."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine, traces
from sandbox.sim.traces import MINUTE, Trace
from strategies import adaptive

EXAMPLES = Path(__file__).parents[2] / "examples" / "traces"
DAY = 24 * 60


def sliced(trace: Trace, days: int) -> Trace:
    return replace(trace, rps=trace.rps[: days * DAY])


def one_rung(window: int, margin: float) -> adaptive.Adaptive:
    params = {"windows": [window], "margins": [margin], "least_margin": 0, "traffic_windows": False}
    built = registry.build("adaptive", params)
    assert isinstance(built, adaptive.Adaptive)
    return built


@pytest.mark.parametrize(
    ("name", "service", "window", "margin"),
    [
        ("azure_llm_2024_week_per_minute.csv", "code", 10, 0.05),
        ("azure_llm_2024_week_per_minute.csv", "code", 30, 0.0),
        ("servegen_m-large.csv", None, 30, 0.05),
        ("servegen_m-large.csv", None, 60, 0.1),
        ("servegen_m-mid.csv", None, 60, 0.1),  # with its gaps: the metrics-lost reclaims
    ],
)
def test_the_replay_of_a_rung_is_what_the_simulator_measures_for_that_peak_rule(
    name: str, service: str | None, window: int, margin: float
) -> None:
    trace = sliced(traces.load(EXAMPLES / name, service), days=4)
    pool = engine.PoolModel()
    strategy = one_rung(window, margin)
    run = engine.run(trace, strategy, pool)
    peak = engine.run(
        trace, registry.build("peak", {"window_minutes": window, "margin": margin}), pool
    )
    (memo,) = strategy._memos.values()
    (rung,) = memo.rungs
    replayed_hours = rung.lent_steps.value / 60
    assert abs(rung.missed.value - peak.figures.breach_minutes) <= 3
    assert replayed_hours == pytest.approx(peak.figures.lent_node_hours, rel=0.01)
    # Following its one rung, the strategy is that rule with a loan held for the drain.
    assert run.figures.lent_node_hours == pytest.approx(peak.figures.lent_node_hours, rel=0.05)


def jumps(days: int, every: int = 180, level: float = 20.0, top: float = 120.0) -> Trace:
    """``level`` rps, with a jump to ``top`` in one minute for 20 minutes every ``every``."""
    rps: list[float | None] = [top if t % every >= every - 20 else level for t in range(days * DAY)]
    rps[0] = 144.0  # the peak the pool is calibrated on: 10 rps per node
    start = datetime(2025, 3, 3, tzinfo=UTC)
    return Trace(name="jumps", source="jumps", start=start, rps=rps, native_step=MINUTE)


def ladder(**changes: object) -> adaptive.Adaptive:
    params = {"windows": [10, 240], "margins": [0.1], "traffic_windows": False, **changes}
    built = registry.build("adaptive", params)
    assert isinstance(built, adaptive.Adaptive)
    return built


def followed(run: engine.Run, strategy: adaptive.Adaptive) -> int:
    """The window ``strategy`` follows at the end of ``run``."""
    (memo,) = strategy._memos.values()
    return memo.rungs[strategy._choose(memo, _view(memo, run))[0]].window


def _view(memo: adaptive.Memory, run: engine.Run) -> model.PoolView:
    """The pool at the end of ``run``, at 20 rps, as ``_choose`` reads it."""
    history = model.DemandHistory(memo.start, memo.step, (), 0)
    last = run.timeline[-1]
    return pool_view(history, last.time, model.Sample(20.0, last.time), last.lent)


def test_a_smooth_load_is_followed_on_the_shortest_window_and_the_least_margin() -> None:
    rps: list[float | None] = [144.0]
    rps += [20.0 + (t % 60) / 6 for t in range(2 * DAY)]
    start = datetime(2025, 3, 3, tzinfo=UTC)
    calm = Trace(name="calm", source="calm", start=start, rps=rps, native_step=MINUTE)
    strategy, pool = ladder(), engine.PoolModel()
    run = engine.run(calm, strategy, pool)
    assert run.figures.breach_minutes == 0
    assert followed(run, strategy) == 10


def test_a_load_that_jumps_again_and_again_moves_the_pool_to_the_window_that_rides_them_out() -> (
    None
):
    strategy, pool = ladder(), engine.PoolModel()
    run = engine.run(jumps(days=2), strategy, pool)
    short = engine.run(jumps(days=2), registry.build("peak", {"window_minutes": 10}), pool)
    assert followed(run, strategy) == 240
    assert run.figures.breach_minutes < short.figures.breach_minutes / 4


def spikes(days: int, every: int = 120, level: float = 20.0, top: float = 54.0) -> Trace:
    """``level`` rps, with a spike to ``top`` (2.7 times) for 2 minutes every ``every``."""
    rps: list[float | None] = [top if t % every >= every - 2 else level for t in range(days * DAY)]
    rps[0] = 144.0  # the peak the pool is calibrated on: 10 rps per node
    start = datetime(2025, 3, 3, tzinfo=UTC)
    return Trace(name="spikes", source="spikes", start=start, rps=rps, native_step=MINUTE)


def test_spikes_of_more_than_twice_the_level_are_ridden_out_on_a_margin_above_one() -> None:
    # Between spikes the 10-minute rung keeps 20 x 2.5: 6 nodes, 60 rps, above the spike;
    # margins of 1 or less keep 5 nodes (50 rps, below it), and a window long enough to
    # remember the last spike keeps 54 x 1.1: 8 nodes.
    pool = engine.PoolModel()
    default, capped = ladder(margins=adaptive.Params().margins), ladder(margins=[0.1, 0.5, 1])
    run, old = engine.run(spikes(days=2), default, pool), engine.run(spikes(days=2), capped, pool)
    (memo,) = default._memos.values()
    rung = memo.rungs[default._choose(memo, _view(memo, run))[0]]
    assert (rung.window, rung.margin) == (10, 1.5)
    # More lent with fewer breach minutes (on these 2 days: 428 node-hours and 2 against 389
    # and 4).
    assert run.figures.lent_node_hours > old.figures.lent_node_hours
    assert run.figures.breach_minutes < old.figures.breach_minutes


def test_a_burning_budget_raises_the_price_of_a_breach_minute() -> None:
    # So cheap a breach that the short window wins on its harvest, until the budget burns.
    pool = engine.PoolModel()
    # Replayed on these jumps: the 10-minute rung lends 516 node-hours with 128 breach minutes,
    # the 240-minute one nothing; the short rung wins below about 4 node-hours a minute.
    cheap, spent = ladder(price_pool_hours=0.05), ladder(price_pool_hours=0.05, budget_gain=100)
    run = engine.run(jumps(days=2), cheap, pool)
    assert followed(run, cheap) == 10
    slo = model.Slo(max_breach_minutes=1, window=timedelta(days=7))
    burnt = engine.run(jumps(days=2), spent, pool, slo=slo)
    (memo,) = spent._memos.values()
    view = replace(_view(memo, burnt), budget=model.ErrorBudget(1, timedelta(days=7), 5))
    assert memo.rungs[spent._choose(memo, view)[0]].window == 240


def pool_view(
    history: model.DemandHistory,
    now: datetime,
    demand: model.Sample | None = None,
    lent: int = 0,
) -> model.PoolView:
    """The tests' pool of 16 nodes of 10 rps; ``demand`` by default the history's last value."""
    if demand is None and history.end_index:
        last = history.values[history.end_index - 1]
        demand = None if last is None else model.Sample(last, now)
    return model.PoolView(
        name=engine.POOL,
        now=now,
        size=16,
        lent=lent,
        demand=demand,
        queue=None,
        history=history,
        rps_per_node=10.0,
        min_serving=2,
        headroom=0.2,
        return_time=timedelta(minutes=7),
        zone="UTC",
    )


def test_a_new_history_read_that_continues_the_last_goes_on_from_where_it_ended() -> None:
    # The controller reads a new history every few minutes, its start sliding forward: the
    # replay goes on from where it ended instead of rebuilding, and decides as it would have
    # on one history that grew.
    trace = jumps(days=3)
    values, start = list(trace.rps), trace.start
    grown, read = ladder(), ladder()
    span = 2 * DAY
    for end in range(DAY, len(values), 5):
        now = start + MINUTE * end
        one = model.DemandHistory(start, MINUTE, values, end)
        first = max(0, end - span)
        sliding = model.DemandHistory(
            start + MINUTE * first, MINUTE, values[first:end], end - first
        )
        assert read.decide(pool_view(sliding, now)) == grown.decide(pool_view(one, now))
    (memo,) = read._memos.values()
    assert memo.first == 0  # never rebuilt: it began at the first history's start


def test_a_step_back_in_time_replays_from_that_history_alone() -> None:
    trace = jumps(days=2)
    values, start = list(trace.rps), trace.start
    strategy = ladder()
    strategy.decide(pool_view(model.DemandHistory(start, MINUTE, values, 2 * DAY), start))
    earlier = model.DemandHistory(start, MINUTE, values, DAY)
    fresh = ladder()

    assert strategy.decide(pool_view(earlier, start)) == fresh.decide(pool_view(earlier, start))


def test_a_loan_waits_until_a_lower_keep_has_held_over_the_drain() -> None:
    # A keep that rose for a minute (a sample near a node's boundary) and fell: lent at once,
    # the fall would lend a node while the one given back for the rise still drains (a restart
    # for nothing and, while the first warms, a breach). A loan needs the most kept over the
    # last drain + 1 minutes, as a scale-down waits out its stabilization window; a reclaim
    # follows the keep of now.
    flat: list[float | None] = [20.0] * DAY
    start = datetime(2025, 3, 3, tzinfo=UTC)
    history = model.DemandHistory(start, MINUTE, flat, DAY)
    now = start + MINUTE * DAY
    strategy = ladder(windows=[10])

    def answer(at: int, rps: float, lent: int) -> int:
        when = now + MINUTE * at
        return strategy.decide(pool_view(history, when, model.Sample(rps, when), lent)).lend_target

    assert answer(0, 20.0, lent=13) == 13  # keeps 3
    assert answer(1, 35.0, lent=13) == 11  # keeps 5: two nodes back at once
    hold = pool_view(history, now).limits.drain + timedelta(minutes=1)
    minutes = int(hold / timedelta(minutes=1))
    for at in range(2, 1 + minutes):
        assert answer(at, 20.0, lent=11) == 11, at
    assert answer(1 + minutes, 20.0, lent=11) == 13
