"""The simulator on hand-built traces whose right answers can be worked out on paper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import ClassVar

import pytest

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine
from sandbox.sim.traces import MINUTE, Trace

START = datetime(2024, 5, 10, tzinfo=UTC)


def trace_of(rps: Sequence[float | None]) -> Trace:
    return Trace(name="hand", source="hand", start=START, rps=list(rps), native_step=MINUTE)


# 60 quiet minutes at 20 rps, a 10-minute burst at 144 rps, 20 quiet minutes. The burst is the
# peak, so one node serves 144 / (0.9 * 16) = 10 rps; quiet minutes need ceil(20 * 1.2 / 10) = 3.
BURST = trace_of([20.0] * 60 + [144.0] * 10 + [20.0] * 20)
POOL = engine.PoolModel()


def test_calibration_makes_the_peak_minute_need_ninety_percent_of_the_pool() -> None:
    assert POOL.calibrate(BURST) == pytest.approx(10.0)


def test_the_oracle_lends_what_the_next_seven_minutes_allow() -> None:
    plan = engine.oracle_plan(engine.needs(BURST, POOL, 10.0), POOL)
    # Minute t may lend only if no burst minute lies in [t, t + 7]: t <= 52 or t >= 70.
    assert plan[:53] == [13] * 53
    assert plan[53:70] == [0] * 17
    assert plan[70:] == [13] * 20


def test_the_oracle_run_harvests_everything_without_a_breach() -> None:
    plan = engine.oracle_plan(engine.needs(BURST, POOL, 10.0), POOL)
    run = engine.run(BURST, engine.Oracle(plan, START), POOL, baseline=True)
    assert run.figures == engine.Figures(
        lent_node_hours=round(73 * 13 / 60, 3),
        oracle_node_hours=round(73 * 13 / 60, 3),
        harvest_ratio=1.0,
        breach_minutes=0,
        headroom_minutes=10,  # the burst needs 18 nodes of 16: headroom, not a breach
        reclaims=13,
        loans=26,
        short_loans=0,
    )


def test_the_reactive_baseline_breaches_until_reclaimed_nodes_are_warm() -> None:
    run = engine.run(BURST, registry.build("reactive"), POOL, baseline=True)
    # Minute 60: it still sees 20 rps and keeps 13 lent; 3 nodes serve 30 rps < 144.
    # Minute 61 it reclaims all 13; they drain 2 min and warm 5 min, serving from minute 68.
    breaches = [m.time for m in run.timeline if m.demand_rps and m.demand_rps > 10 * m.serving]
    assert breaches == [START + MINUTE * t for t in range(60, 68)]
    assert run.figures.breach_minutes == 8
    assert run.figures.reclaims == 13


def test_the_static_baseline_never_lends() -> None:
    run = engine.run(BURST, registry.build("static"), POOL, baseline=True)
    assert (run.figures.lent_node_hours, run.figures.loans, run.figures.breach_minutes) == (0, 0, 0)


def test_a_returning_node_counts_neither_as_serving_nor_as_lent() -> None:
    run = engine.run(BURST, registry.build("reactive"), POOL, baseline=True)
    minute = run.timeline[63]
    assert (minute.serving, minute.lent, minute.returning) == (3, 0, 13)


class Spy:
    """Records what a strategy is shown, to prove it never sees the future."""

    name: ClassVar[str] = "spy"

    reads_history: ClassVar[bool] = False

    def __init__(self) -> None:
        self.seen: list[model.PoolView] = []

    def decide(self, pool: model.PoolView) -> model.Proposal:
        self.seen.append(pool)
        return model.Proposal(0, "spy")


def test_a_strategy_sees_only_minutes_before_now_with_the_pipeline_age() -> None:
    spy = Spy()
    engine.run(BURST, spy, POOL)
    for t, view in enumerate(spy.seen):
        assert view.history.end == view.now == START + MINUTE * t
        assert view.history.window(view.now, view.now + timedelta(hours=1)) == []
        if t == 0:
            assert view.demand is None
            continue
        # The burst ends at minute 70 by falling to a seventh in a minute: that fall is held at
        # the level before it for the 10-minute hold, then believed.
        value = 144.0 if 71 <= t <= 80 else BURST.rps[t - 1]
        assert view.demand == model.Sample(value or 0.0, view.now - POOL.sample_age)


def test_lending_stops_when_samples_go_missing_and_loans_return_after_the_grace() -> None:
    # Low steady load with a gap of 20 minutes without samples in the middle.
    rps: list[float | None] = [144.0] + [20.0] * 59 + [None] * 20 + [20.0] * 30
    trace = trace_of(rps)
    run = engine.run(trace, registry.build("window", {"window": "always"}), POOL)
    lent = [m.lent for m in run.timeline]
    assert lent[59] > 0, "lends while the load is known and low"
    # The last sample (minute 59) is stamped 30 s before minute 60. It is older than the
    # staleness limit (2 min) from minute 62, and past the 5-minute grace from minute 67.
    assert lent[66] == lent[59], "stale but within the grace period: hold, do not lend more"
    assert lent[67] == 0, "past the grace period every loan is taken back"
    assert all(m.lent == 0 for m in run.timeline[67:81]), "nothing is lent while blind"


def test_a_gap_minute_is_never_scored_as_a_breach() -> None:
    trace = trace_of([144.0] + [None] * 5 + [20.0] * 10)
    run = engine.run(trace, registry.build("reactive"), POOL, baseline=True)
    assert run.figures.breach_minutes == 0


class BudgetSpy:
    """The reactive baseline, recording the error budget it is shown before each minute."""

    name: ClassVar[str] = "budget-spy"
    reads_history: ClassVar[bool] = False

    def __init__(self) -> None:
        self.inner = registry.build("reactive")
        self.budgets: list[model.ErrorBudget | None] = []

    def decide(self, pool: model.PoolView) -> model.Proposal:
        self.budgets.append(pool.budget)
        return self.inner.decide(pool)


def test_with_an_slo_each_minute_shows_the_breaches_of_the_window_before_it() -> None:
    spy = BudgetSpy()
    slo = model.Slo(max_breach_minutes=5, window=timedelta(minutes=10))
    run = engine.run(BURST, spy, POOL, baseline=True, slo=slo)
    assert run.figures.breach_minutes == 8  # minutes 60 to 67, as without a budget
    spent = [b.spent_minutes for b in spy.budgets if b is not None]
    assert spent == [sum(1 for b in range(60, 68) if t - 10 < b < t) for t in range(90)]
    assert {(b.allowed_minutes, b.window) for b in spy.budgets if b is not None} == {
        (5, timedelta(minutes=10))
    }
    assert spy.budgets[68] is not None
    assert spy.budgets[68].burned == 8 / 5


def test_a_guarded_run_lends_only_what_its_error_budget_can_pay_for() -> None:
    # Two bursts 30 minutes apart; a budget of 10 breach minutes per hour, and a loan may cost
    # 8 (the minute the burst is seen, then the 7-minute return). The first burst meets the
    # loans and costs 8, after which the budget cannot pay for another: nothing is lent until
    # those minutes leave the window, and the second burst costs nothing.
    quiet, burst = [20.0] * 60, [144.0] * 10
    trace = trace_of([*quiet, *burst, *[20.0] * 30, *burst, *[20.0] * 90])
    slo = model.Slo(max_breach_minutes=10, window=timedelta(hours=1))
    free = engine.run(trace, registry.build("reactive"), POOL)
    run = engine.run(trace, registry.build("reactive"), POOL, slo=slo)
    breached = [t for t, m in enumerate(run.timeline) if engine.breached(m, 10.0)]
    assert breached == list(range(60, 68))  # the first burst only, within the budget
    assert any(engine.breached(m, 10.0) for m in free.timeline[100:110])  # unlimited: both
    assert max(m.lent for m in run.timeline[75:120]) == 0  # within the hour after: no loan
    assert max(m.lent for m in run.timeline[150:]) > 0  # the minutes left the window: lends
    small = engine.run(
        trace, registry.build("reactive"), POOL, slo=replace(slo, max_breach_minutes=7)
    )
    assert max(m.lent for m in small.timeline) == 0  # no loan can be paid for: none is made


def test_without_an_slo_a_strategy_sees_no_budget() -> None:
    spy = BudgetSpy()
    engine.run(BURST, spy, POOL, baseline=True)
    assert set(spy.budgets) == {None}


def test_the_most_a_window_spent_counts_the_breaches_of_the_worst_window() -> None:
    run = engine.run(BURST, registry.build("reactive"), POOL, baseline=True)  # breaches 60..67
    assert engine.most_spent(run.timeline, 10.0, timedelta(minutes=5)) == 5
    assert engine.most_spent(run.timeline, 10.0, timedelta(days=7)) == 8


def test_what_comes_after_a_minute_changes_nothing_decided_before_it() -> None:
    # The default strategy and the budget's cover both read the demand history: two traces
    # equal until minute 2,000 and apart after it give the same minutes until then. The peak
    # is in both, at the start, so that both calibrate one node alike.
    shared = [144.0] + [40.0 + 20.0 * ((t // 60) % 2) for t in range(1, 2_000)]
    calm = trace_of(shared + [30.0] * 1_000)
    wild = trace_of(shared + [140.0 if t % 50 < 10 else 5.0 for t in range(1_000)])
    slo = model.Slo(max_breach_minutes=10)

    runs = [engine.run(t, registry.build("adaptive"), POOL, slo=slo) for t in (calm, wild)]

    assert runs[0].timeline[1_999].lent > 0  # lending when the two traces part
    assert runs[0].timeline[:2_000] == runs[1].timeline[:2_000]
    assert runs[0].timeline[2_000:] != runs[1].timeline[2_000:]


def test_what_the_metrics_show_judged_once_serves_every_run_of_the_trace_and_no_other() -> None:
    gappy = trace_of([20.0] * 30 + [None] * 5 + [5.0] * 10 + [144.0] * 5 + [20.0] * 30)
    rps = POOL.capacity(gappy)
    shown = engine.Shown.of(gappy, POOL, POOL.policy(rps))
    for name, baseline in (("adaptive", False), ("reactive", True)):
        alone = engine.run(gappy, registry.build(name), POOL, baseline=baseline)
        shared = engine.run(gappy, registry.build(name), POOL, baseline=baseline, shown=shown)
        assert shared == alone
    with pytest.raises(ValueError, match="another trace"):
        engine.run(BURST, registry.build("static"), POOL, baseline=True, shown=shown)
    older = replace(POOL, sample_age=timedelta(minutes=2))
    with pytest.raises(ValueError, match="sample age"):
        engine.run(gappy, registry.build("static"), older, baseline=True, shown=shown)
