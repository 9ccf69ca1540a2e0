"""``rebalancer simulate``: run the chosen strategies and every baseline on one trace."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import configured, engine, frontier, jobs, report
from sandbox.sim.traces import Trace

BASELINES = ("static", "cron", "reactive")
CURVE = (0, 5, 10, 30, 60)  # the trade curve's budgets, breach minutes per rolling window


def simulate(
    trace: Trace,
    strategies: Sequence[str],
    pool: engine.PoolModel,
    out: Path,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    slo: model.Slo | None = None,
    trade: bool = True,
    training: jobs.TrainingModel | None = None,
    provenance: configured.Provenance | None = None,
    compare_notice: bool = False,
) -> dict[str, Any]:
    """Run ``strategies`` (with every guard), the baselines and the oracle (without the guards
    in ``engine.BASELINE_DROPS``); write the report to ``out``. With ``slo``, the strategies
    (not the baselines) are shown that error budget and may spend it. With ``trade``, the peak
    rule's coarse grid (``frontier.REPORT_MARGINS``) runs too, guarded, and the report shows
    each strategy against its frontier. With ``training``, every run (the grid's too, so the
    trade compares like with like) lends only to its own copy of that training queue, and the
    report shows what training made of the loans. With ``slo`` and ``trade`` both, the first
    chosen strategy (the default's place) runs once more per budget of ``CURVE`` (the ``slo``
    run serves its own budget) for the report's trade curve: its harvest against the budget,
    beside the best grid point within each. ``provenance`` says which configured pool ``pool``
    models and where its values came from, for the report. With ``compare_notice``, the
    strategies, the baselines and the oracle run once more without ``pool``'s reclaim notice,
    and the report sets what each lost and kept of training, harvested and breached with it
    beside the same without it.

    Strategy parameters are validated before anything runs, so a typo costs no time.
    """
    params = params or {}
    chosen = [name for name in dict.fromkeys(strategies) if name not in BASELINES]
    built = [(registry.build(name, params.get(name)), False) for name in chosen]
    built += [(registry.build(name), True) for name in BASELINES]
    rps_per_node = pool.capacity(trace)
    need = engine.needs(trace, pool, rps_per_node)
    oracle = _oracle(trace, pool, need, training)
    # What the metric pipeline shows depends on the trace and the pool alone: judged once.
    shown = engine.Shown.of(trace, pool, pool.policy(rps_per_node))
    without = replace(pool, notice=timedelta(0))
    again_without: list[tuple[Any, bool]] = []
    if compare_notice:
        # Built anew: a strategy keeps state between minutes.
        again_without = [(registry.build(name, params.get(name)), False) for name in chosen]
        again_without += [(registry.build(name), True) for name in BASELINES]
        again_without.append((_oracle(trace, without, need, training), True))
    rule = frontier.grid(margins=frontier.REPORT_MARGINS) if trade else []
    curve: list[model.Slo] = []
    if trade and slo is not None and chosen:
        budgets = sorted({*CURVE, slo.max_breach_minutes})
        curve = [model.Slo(b, slo.window) for b in budgets]
    again = [b for b in curve if b != slo]  # the ``slo`` run below serves its own budget
    runs, rule_runs, curve_runs, unnoticed = [], [], [], []
    with tqdm(
        total=trace.minutes * (len(built) + 1 + len(rule) + len(again) + len(again_without)),
        unit="min",
        unit_scale=True,
        delay=1.0,
        mininterval=0.5,
        disable=None if progress else True,  # None: only on a terminal
        desc="simulating",
    ) as bar:
        tick = bar.update if progress else None
        for strategy, baseline in [*built, (oracle, True)]:
            bar.set_postfix_str(strategy.name)
            budget = None if baseline else slo
            runs.append(
                engine.run(
                    trace,
                    strategy,
                    pool,
                    baseline=baseline,
                    on_minute=tick,
                    slo=budget,
                    training=training,
                    shown=shown,
                )
            )
        for strategy, baseline in again_without:
            bar.set_postfix_str(f"{strategy.name} without notice")
            budget = None if baseline else slo
            unnoticed.append(
                engine.run(
                    trace,
                    strategy,
                    without,
                    baseline=baseline,
                    on_minute=tick,
                    slo=budget,
                    training=training,
                    shown=shown,
                )
            )
        for label, values in rule:
            bar.set_postfix_str(label)
            peak = registry.build("peak", values)
            run = engine.run(trace, peak, pool, on_minute=tick, training=training, shown=shown)
            rule_runs.append((label, run))
        for budget in curve:
            if budget == slo:
                curve_runs.append((budget.max_breach_minutes, runs[0]))
                continue
            bar.set_postfix_str(f"{chosen[0]} slo={budget.max_breach_minutes}")
            strategy = registry.build(chosen[0], params.get(chosen[0]))
            run = engine.run(
                trace, strategy, pool, on_minute=tick, slo=budget, training=training, shown=shown
            )
            curve_runs.append((budget.max_breach_minutes, run))
    return report.write_all(
        out,
        trace,
        pool,
        rps_per_node,
        runs,
        slo,
        rule_runs,
        training,
        curve_runs,
        provenance or configured.Provenance(),
        params,
        unnoticed,
    )


def _oracle(
    trace: Trace,
    pool: engine.PoolModel,
    need: Sequence[int | None],
    training: jobs.TrainingModel | None,
) -> engine.Oracle:
    """The oracle, looking as far ahead as its reclaims take: with a training queue its
    reclaims are noticed, so the notice too (without one no pod is told, and a reclaim begins
    at once)."""
    horizon = pool.return_minutes if training is None else pool.lead_minutes
    plan = engine.oracle_plan(need, pool, pool.lendable(trace), horizon)
    return engine.Oracle(plan, trace.start)
