"""The independent re-scorer (``bench/rescore.py``) against simulator runs: the two counts of
warm capacity, breach minutes and the worst rolling 7 days agree, and a timeline that is off by
one node for one minute is caught."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime

import rescore  # bench/rescore.py: tests/sim/conftest.py puts bench/ on the path

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine
from sandbox.sim.traces import MINUTE, Trace

START = datetime(2025, 1, 6, tzinfo=UTC)
POOL = engine.PoolModel()


def jumpy(days: int = 2, seed: int = 5) -> Trace:
    """A quiet level with seeded jumps to 60-100 % of the peak for 3-20 minutes, and a gap."""
    rng = random.Random(seed)
    values: list[float | None] = [30.0 + rng.uniform(-5, 5) for _ in range(days * 24 * 60)]
    t = 90
    while t < len(values):
        top = rng.uniform(90.0, 144.0)
        for i in range(rng.randint(3, 20)):
            if t + i < len(values):
                values[t + i] = top
        t += rng.randint(60, 240)
    values[600:615] = [None] * 15
    values[1000] = 144.0
    return Trace("jumpy", "hand", START, values, MINUTE)


def simulated(strategy: str, params: dict[str, float], budget: int) -> tuple[Trace, engine.Run]:
    trace = jumpy()
    run = engine.run(trace, registry.build(strategy, params), POOL, slo=model.Slo(budget))
    return trace, run


def test_the_rescorer_and_the_simulator_agree_on_every_minute_of_a_budgeted_run() -> None:
    trace, run = simulated("peak", {"window_minutes": 10, "margin": 0.1}, 10)
    found = rescore.rescore_run("jumpy", trace, POOL, run)
    assert run.figures.reclaims > 0  # nodes did come back, so the return clock was exercised
    assert found.sim_breach > 0  # and minutes breached, so the verdicts were exercised
    assert found.differences == []
    assert (found.own_breach, found.own_week) == (found.sim_breach, found.sim_week)
    assert found.own_breach == run.figures.breach_minutes
    assert found.agrees


def test_a_node_counted_warm_a_minute_early_is_reported_at_that_minute() -> None:
    trace, run = simulated("peak", {"window_minutes": 10, "margin": 0.1}, 10)
    rps_per_node = POOL.calibrate(trace)
    breach = next(t for t, m in enumerate(run.timeline) if engine.breached(m, rps_per_node))
    early = list(run.timeline)
    early[breach] = replace(early[breach], serving=early[breach].serving + 1)
    found = rescore.rescore(
        "jumpy", trace.rps, rps_per_node, early, return_minutes=POOL.return_minutes
    )
    assert [d.index for d in found.differences] == [breach]
    assert not found.agrees


def test_the_worst_week_is_a_window_of_10080_minutes_ending_at_each_minute() -> None:
    breach = [False] * 20000
    breach[100] = breach[100 + 10080] = True
    assert rescore.worst_window(breach) == (1, 100)
    assert rescore.worst_window(breach, rescore.WEEK_MINUTES + 1) == (2, 100 + 10080)
    breach[100 + 10079] = True
    assert rescore.worst_window(breach) == (2, 100 + 10079)


def test_a_reclaimed_node_serves_again_seven_minutes_after_its_reclaim() -> None:
    lent = [3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert rescore.serving(16, lent) == [13, 13, 13, 13, 13, 13, 13, 13, 13, 15, 15]


def test_a_tie_between_demand_and_warm_capacity_is_not_a_breach() -> None:
    assert not rescore.breached(50.0, 5.0, 10)
    assert rescore.breached(50.0 + 1e-12, 5.0, 10)
    assert not rescore.breached(None, 5.0, 0)
