"""Write what a simulation found: ``summary.json``, one timeline CSV per run, ``report.md`` and
``report.png``, and with an error budget and the trade ``trade_curve.png``. The formats are
documented in docs/simulator.md; dashboards and tests read them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from rebalancer.core.model import Slo
from sandbox.sim import frontier
from sandbox.sim.engine import Minute, PoolModel, Run, most_spent
from sandbox.sim.frontier import Point
from sandbox.sim.jobs import CHECKPOINT, TrainingModel
from sandbox.sim.traces import Trace

TIMELINE_FIELDS = ("time", "demand_rps", "need", "serving", "lent", "returning", "queue")


def write_all(
    out: Path,
    trace: Trace,
    pool: PoolModel,
    rps_per_node: float,
    runs: Sequence[Run],
    slo: Slo | None = None,
    rule: Sequence[tuple[str, Run]] = (),
    training: TrainingModel | None = None,
    curve: Sequence[tuple[int, Run]] = (),
) -> dict[str, Any]:
    """Write everything; ``rule`` is the peak rule's grid, (label, run), for the trade;
    ``training`` the queue the runs lent to, if any; ``curve`` the default strategy run once
    per budget, (budget, run), for the trade curve."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(trace, pool, rps_per_node, runs, slo, rule, training, curve)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for run in runs:
        write_timeline(out / f"timeline-{run.strategy}.csv", run.timeline)
    (out / "report.md").write_text(markdown(summary))
    plot(out / "report.png", trace, rps_per_node, runs, summary)
    if (summary["trade"] or {}).get("curve"):
        plot_curve(out / "trade_curve.png", summary)
    return summary


def summarise(
    trace: Trace,
    pool: PoolModel,
    rps_per_node: float,
    runs: Sequence[Run],
    slo: Slo | None = None,
    rule: Sequence[tuple[str, Run]] = (),
    training: TrainingModel | None = None,
    curve: Sequence[tuple[int, Run]] = (),
) -> dict[str, Any]:
    strategies: dict[str, Any] = {}
    for run in runs:
        # "guarded" is the report's documented field (docs/simulator.md): not a baseline.
        strategies[run.strategy] = {**asdict(run.figures), "guarded": not run.baseline}
        if slo is not None:
            spent = most_spent(run.timeline, rps_per_node, slo.window)
            strategies[run.strategy]["budget_spent_minutes"] = spent
        if run.training is not None:
            strategies[run.strategy]["training"] = asdict(run.training)
    budget = None
    if slo is not None:
        budget = {
            "max_breach_minutes": slo.max_breach_minutes,
            "window_days": slo.window / timedelta(days=1),
        }
    return {
        "strategies": strategies,
        "slo": budget,
        "trade": trade(strategies, rule, rps_per_node, slo, curve),
        "training": None if training is None else _training(training),
        "pool": {
            "size": pool.size,
            "min_serving": pool.min_serving,
            "headroom": pool.headroom,
            "rps_per_node": round(rps_per_node, 6),
            "peak_share": pool.peak_share,
            "drain_seconds": pool.drain.total_seconds(),
            "warmup_seconds": pool.warmup.total_seconds(),
            "sample_age_seconds": pool.sample_age.total_seconds(),
            "zone": pool.zone,
        },
        "trace": {
            "file": trace.source,
            "name": trace.name,
            "start": trace.start.isoformat().replace("+00:00", "Z"),
            "end": trace.end.isoformat().replace("+00:00", "Z"),
            "minutes": trace.minutes,
            "gap_minutes": trace.gap_minutes,
            "peak_rps": round(trace.peak, 6),
            "native_step_seconds": trace.native_step.total_seconds(),
        },
    }


def _training(spec: TrainingModel) -> dict[str, Any]:
    return {
        "backlog": spec.backlog,
        "seed": spec.seed,
        "gpus_per_node": spec.gpus_per_node,
        "sizes": list(spec.sizes),
        "hours": list(spec.hours),
        "checkpoint_minutes": CHECKPOINT / timedelta(minutes=1),
    }


def trade(
    strategies: dict[str, Any],
    rule: Sequence[tuple[str, Run]],
    rps_per_node: float,
    slo: Slo | None,
    curve: Sequence[tuple[int, Run]] = (),
) -> dict[str, Any] | None:
    """The peak rule's grid and its frontier, and which grid points dominate each strategy.
    Breach minutes are the run's, or with an ``slo`` the most any rolling window spent: the
    figure the budget bounds. With an ``slo`` and a ``curve`` (a strategy run once per
    budget), the trade curve too."""
    if not rule:
        return None
    measure = "budget_spent_minutes" if slo is not None else "breach_minutes"

    def spent(run: Run) -> int:
        if slo is None:
            return run.figures.breach_minutes
        return most_spent(run.timeline, rps_per_node, slo.window)

    grid = [Point(label, run.figures.harvest_ratio, spent(run)) for label, run in rule]
    edge = {p.label for p in frontier.frontier(grid)}
    budget = rows = None
    if slo is not None:
        budget = _within(grid, slo.max_breach_minutes, strategies)
        if curve:
            rows = _curve(grid, curve, rps_per_node, slo.window)
    return {
        "rule": "peak",
        "measure": measure,
        "grid": [
            {
                "label": p.label,
                "harvest_ratio": p.harvest,
                measure: p.breach,
                "frontier": p.label in edge,
            }
            for p in grid
        ],
        "dominated_by": {
            name: [p.label for p in frontier.dominating(_point(name, f, measure), grid)]
            for name, f in strategies.items()
            if f["guarded"]
        },
        "budget": budget,
        "curve_strategy": curve[0][1].strategy if rows else None,
        "curve": rows,
    }


def _within(grid: Sequence[Point], most: int, strategies: dict[str, Any]) -> dict[str, Any]:
    """The grid point with the most harvest whose worst window held at most ``most`` breach
    minutes, chosen in hindsight (the grid runs without a budget), and each guarded strategy's
    harvest as a ratio of it (None when no grid point kept the budget, or it harvested
    nothing)."""
    best = _best(grid, most)
    ratios = {
        name: _ratio(f["harvest_ratio"], best) for name, f in strategies.items() if f["guarded"]
    }
    return {
        "best": None
        if best is None
        else {
            "label": best.label,
            "harvest_ratio": best.harvest,
            "budget_spent_minutes": best.breach,
        },
        "ratio_to_best": ratios,
    }


def _best(grid: Sequence[Point], most: int) -> Point | None:
    """The grid point with the most harvest whose worst window held at most ``most``; ties go
    to the fewer breach minutes, then the label. None when every one overspent."""
    fit = [p for p in grid if p.breach <= most]
    return min(fit, key=lambda p: (-p.harvest, p.breach, p.label)) if fit else None


def _ratio(harvest: float, best: Point | None) -> float | None:
    """``harvest`` as a share of ``best``'s (None without a best point, or if it harvested
    nothing)."""
    return round(harvest / best.harvest, 4) if best is not None and best.harvest > 0 else None


def _curve(
    grid: Sequence[Point], curve: Sequence[tuple[int, Run]], rps_per_node: float, window: timedelta
) -> list[dict[str, Any]]:
    """The trade curve: per budget, the strategy run with it (its harvest and the most breach
    minutes any rolling ``window`` held) against the best grid point within that budget, chosen
    in hindsight from the grid's runs (which had none)."""
    rows = []
    for budget, run in sorted(curve, key=lambda c: c[0]):
        best = _best(grid, budget)
        worst = most_spent(run.timeline, rps_per_node, window)
        rows.append(
            {
                "budget": budget,
                "default_harvest": run.figures.harvest_ratio,
                "default_worst_week": worst,
                "best_label": None if best is None else best.label,
                "best_harvest": None if best is None else best.harvest,
                "ratio": _ratio(run.figures.harvest_ratio, best),
                "within": worst <= budget,
            }
        )
    return rows


def _unit(measure: str) -> str:
    return "breach minutes" if measure == "breach_minutes" else "most breach minutes in a window"


def _point(name: str, figures: dict[str, Any], measure: str) -> Point:
    return Point(name, figures["harvest_ratio"], figures[measure])


def write_timeline(path: Path, timeline: Sequence[Minute]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(TIMELINE_FIELDS)
        for m in timeline:
            writer.writerow(
                [
                    m.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "" if m.demand_rps is None else f"{m.demand_rps:.4f}",
                    "" if m.need is None else m.need,
                    m.serving,
                    m.lent,
                    m.returning,
                    f"{m.queue:.1f}",
                ]
            )


def rank(strategies: dict[str, Any]) -> list[str]:
    """Best first: zero breaches, then harvest, then fewer headroom minutes, then fewer reclaims."""
    return sorted(
        strategies,
        key=lambda name: (
            strategies[name]["breach_minutes"] > 0,
            -strategies[name]["harvest_ratio"],
            strategies[name]["headroom_minutes"],
            strategies[name]["reclaims"],
        ),
    )


def markdown(summary: dict[str, Any]) -> str:
    trace, pool, strategies = summary["trace"], summary["pool"], summary["strategies"]
    lines = [
        f"# Simulation of `{trace['name']}`",
        "",
        f"Trace `{trace['file']}`: {trace['start']} to {trace['end']} ({trace['minutes']} "
        f"minutes, {trace['gap_minutes']} without a sample), peak {trace['peak_rps']:.2f} rps.",
        "",
        f"Pool: {pool['size']} nodes of {pool['rps_per_node']:.3f} rps each (the peak minute "
        f"needs {pool['peak_share']:.0%} of the pool), at least {pool['min_serving']} serving, "
        f"{pool['headroom']:.0%} headroom, drain {pool['drain_seconds']:.0f} s + warm-up "
        f"{pool['warmup_seconds']:.0f} s, metrics {pool['sample_age_seconds']:.0f} s old, "
        f"time zone {pool['zone']}.",
        "",
        "| strategy | harvest | lent node-h | oracle node-h | breach min | headroom min "
        "| reclaims | loans | short loans |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in [*rank({k: v for k, v in strategies.items() if k != "oracle"}), "oracle"]:
        if name not in strategies:
            continue
        f = strategies[name]
        label = {"oracle": "oracle (upper bound)"}.get(name, name)
        label = label if f["guarded"] or name == "oracle" else f"{label} (baseline)"
        lines.append(
            f"| {label} | {f['harvest_ratio']:.3f} | {f['lent_node_hours']:.1f} "
            f"| {f['oracle_node_hours']:.1f} | {f['breach_minutes']} | {f['headroom_minutes']} "
            f"| {f['reclaims']} | {f['loans']} | {f['short_loans']} |"
        )
    budget = summary.get("slo")
    if budget is not None:
        spent = ", ".join(
            f"{name} {strategies[name]['budget_spent_minutes']}"
            for name in strategies
            if strategies[name]["guarded"]
        )
        lines += [
            "",
            f"Error budget: {budget['max_breach_minutes']} breach minutes per rolling "
            f"{budget['window_days']:g} days, shown to the strategies (not the baselines). "
            f"The most any window spent: {spent}.",
        ]
    lines += _trade_lines(summary)
    lines += _training_lines(summary)
    lines += [
        "",
        "Ranked as docs/evaluation.md says: zero breach minutes first, then the highest harvest "
        "ratio, then the fewest headroom minutes, then the fewest reclaims. The oracle knows the "
        "future and is the physical limit, not a contender. Baselines run "
        "through the same planner with its guards off (no headroom rule, no metrics rule, no "
        "reclaim when demand outgrows serving, no cooldown, no per-tick limit), so their "
        "figures show the rule on its own.",
        "",
        "![demand, serving and lent nodes over time](report.png)",
        "",
    ]
    return "\n".join(lines)


def _trade_lines(summary: dict[str, Any]) -> list[str]:
    """The trade: each strategy against the peak rule's frontier, and the budget it had."""
    trade = summary.get("trade")
    if trade is None:
        return []
    measure = trade["measure"]
    unit = _unit(measure)
    edge = [p for p in trade["grid"] if p["frontier"]]
    edge.sort(key=lambda p: (p[measure], -p["harvest_ratio"]))
    shown = ", ".join(f"{p['label']} ({p['harvest_ratio']:.3f}, {p[measure]})" for p in edge)
    lines = [
        "",
        "## The trade",
        "",
        f"The peak rule's frontier (harvest, {unit}): {shown}.",
        "",
        "| strategy | harvest | " + unit + " | grid points that dominate it |",
        "|---|---:|---:|---|",
    ]
    for name, beaten in trade["dominated_by"].items():
        f = summary["strategies"][name]
        more = " ..." if len(beaten) > 3 else ""
        by = ", ".join(beaten[:3]) + more if beaten else "none: on the frontier"
        lines.append(f"| {name} | {f['harvest_ratio']:.3f} | {f[measure]} | {by} |")
    budget = summary.get("slo")
    if budget is not None:
        lines += [
            "",
            f"The dashed line in the plot is the budget: {budget['max_breach_minutes']} minutes "
            f"per {budget['window_days']:g} days. A strategy right of it overspent.",
        ]
    within = trade.get("budget")
    if within is not None:
        best = within["best"]
        if best is None:
            lines += ["", "No grid point kept the budget in every window."]
        else:
            ratios = ", ".join(
                f"{name} {'-' if r is None else format(r, '.3f')}"
                for name, r in within["ratio_to_best"].items()
            )
            lines += [
                "",
                f"The best grid point within the budget, in hindsight: {best['label']} "
                f"(harvest {best['harvest_ratio']:.3f}, at most {best['budget_spent_minutes']} "
                f"in a window). Each strategy's harvest as a share of it: {ratios}.",
            ]
    return lines + _curve_lines(summary)


def _curve_lines(summary: dict[str, Any]) -> list[str]:
    """The trade curve: the default strategy run with each budget, against the best grid point
    within it."""
    trade, budget = summary["trade"], summary.get("slo")
    rows = trade.get("curve")
    if not rows or budget is None:
        return []
    name, days = trade["curve_strategy"], f"{budget['window_days']:g}"
    lines = [
        "",
        "### The trade curve",
        "",
        f"{name} run once per budget (breach minutes per rolling {days} days), against the grid "
        "point with the most harvest within that budget, chosen in hindsight (the grid runs "
        f"without one). Kept: {name}'s worst {days} days held at most the budget.",
        "",
        f"| budget | {name} harvest | worst {days} days | kept | best grid point within it "
        "| its harvest | ratio |",
        "|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        best = "none" if r["best_label"] is None else r["best_label"]
        harvest = "-" if r["best_harvest"] is None else f"{r['best_harvest']:.3f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(
            f"| {r['budget']} | {r['default_harvest']:.3f} | {r['default_worst_week']} "
            f"| {'yes' if r['within'] else 'NO'} | {best} | {harvest} | {ratio} |"
        )
    lines += ["", "![harvest against the error budget](trade_curve.png)"]
    return lines


def _training_lines(summary: dict[str, Any]) -> list[str]:
    """What training made of the loans, per run, when the runs lent to a training queue."""
    spec = summary.get("training")
    if spec is None:
        return []
    sizes = ", ".join(str(n) for n in sorted(set(spec["sizes"])))
    lines = [
        "",
        "## Training on lent nodes",
        "",
        f"Every run lent only to takers: a queue (seed {spec['seed']}) keeping "
        f"{spec['backlog']} preemptible jobs waiting, of {sizes} nodes with "
        f"{spec['gpus_per_node']} GPUs each, {spec['hours'][0]:g} to {spec['hours'][1]:g} h "
        f"of work, a checkpoint every {spec['checkpoint_minutes']:g} min of running. A "
        "reclaim preempts the whole gang, which restarts from its last checkpoint.",
        "",
        "| strategy | GPU-h lent | GPU-h used | used | refused, no taker | jobs preempted "
        "| preemptions | GPU-h lost | jobs done | gangs half-running |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in summary["strategies"].items():
        t = f.get("training")
        if t is None:
            continue
        label = name if f["guarded"] or name == "oracle" else f"{name} (baseline)"
        lines.append(
            f"| {label} | {t['lent_gpu_hours']:.1f} | {t['used_gpu_hours']:.1f} "
            f"| {t['used_share']:.1%} | {t['no_taker_refusals']} | {t['jobs_preempted']} "
            f"| {t['preemptions']} | {t['lost_gpu_hours']:.1f} | {t['jobs_completed']} "
            f"| {t['gangs_half_running']} |"
        )
    return lines


def plot(
    path: Path,
    trace: Trace,
    rps_per_node: float,
    runs: Sequence[Run],
    summary: dict[str, Any] | None = None,
) -> None:
    """The trade (when the summary has one) above a timeline per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trade = (summary or {}).get("trade")
    rows = len(runs) + (trade is not None)
    heights = [3.5] * (trade is not None) + [2.1] * len(runs)
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(14, sum(heights) + 0.6),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    timelines = axes[int(trade is not None) :, 0]
    if trade is not None:
        assert summary is not None
        _draw_trade(axes[0, 0], summary)
    for ax in timelines[1:]:
        ax.sharex(timelines[0])
    for ax, run in zip(timelines, runs, strict=True):
        times = [m.time for m in run.timeline]
        demand = [
            float("nan") if m.demand_rps is None else m.demand_rps / rps_per_node
            for m in run.timeline
        ]
        serving = [m.serving for m in run.timeline]
        lent = [m.lent for m in run.timeline]
        returning = [m.returning for m in run.timeline]
        ax.stackplot(
            times,
            serving,
            returning,
            lent,
            colors=("#9ecae1", "#fdd49e", "#a1d99b"),
            labels=("serving", "returning", "lent"),
            step="post",
        )
        ax.plot(times, demand, color="#08306b", linewidth=0.6, label="demand (nodes)")
        breaches = [
            m.time
            for m in run.timeline
            if m.demand_rps is not None and m.demand_rps > rps_per_node * m.serving + 1e-9
        ]
        if breaches:
            ax.plot(breaches, [0.3] * len(breaches), "|", color="#cb181d", label="breach")
        figures = run.figures
        title = f"{run.strategy} (baseline)" if run.baseline else run.strategy
        if run.strategy == "oracle":
            title = "oracle (upper bound)"
        title += (
            f": harvest {figures.harvest_ratio:.3f}, {figures.breach_minutes} breach min, "
            f"{figures.reclaims} reclaims"
        )
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylabel("nodes", fontsize=8)
        ax.margins(x=0)
    timelines[0].legend(loc="upper right", fontsize=7, ncol=5)
    fig.suptitle(f"{trace.name}: demand, serving and lent nodes (UTC)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw_trade(ax: Any, summary: dict[str, Any]) -> None:
    trade, budget = summary["trade"], summary.get("slo")
    measure = trade["measure"]
    grid = [Point(p["label"], p["harvest_ratio"], p[measure]) for p in trade["grid"]]
    strategies = [
        _point(name, summary["strategies"][name], measure) for name in trade["dominated_by"]
    ]
    frontier.draw(ax, strategies, grid, None if budget is None else budget["max_breach_minutes"])
    ax.set_xlabel(_unit(measure), fontsize=8)
    ax.set_title(
        "harvest against breach minutes: each strategy, and the peak rule's frontier",
        fontsize=9,
        loc="left",
    )


def plot_curve(path: Path, summary: dict[str, Any]) -> None:
    """The trade curve: harvest against the budget, the default strategy run with each budget
    one line, the best grid point within it (in hindsight) another; "over" marks a budget the
    strategy overspent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trade, budget = summary["trade"], summary["slo"]
    rows, name = trade["curve"], trade["curve_strategy"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = [
        frontier.CurvePoint(r["budget"], r["default_harvest"], r["within"], r["best_harvest"])
        for r in rows
    ]
    frontier.draw_curve(ax, name, points, budget["window_days"])
    ax.set_title(f"{summary['trace']['name']}: harvest against the budget", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
