"""Write what a simulation found: ``summary.json``, one timeline CSV per run, ``report.md`` and
``report.svg``, and with an error budget and the trade ``trade_curve.svg``. The formats are
documented in docs/simulator.md; dashboards and tests read them.

The report says which pool it models and where each of its values came from (the settings, a
flag, the simulator's default, or calibrated from the trace), explains each figure in a
sentence, and tables the GPU-hours lent per night; its timelines are drawn in the pool's time
zone with the lending window shaded (``sandbox.sim.nights``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from rebalancer.core.model import Slo
from rebalancer.core.policy import PoolPolicy
from sandbox.sim import charts, frontier, nights
from sandbox.sim.configured import Origin, Provenance
from sandbox.sim.engine import SHORT_LOAN, Minute, PoolModel, Run, most_spent
from sandbox.sim.frontier import Point
from sandbox.sim.jobs import CHECKPOINT, TrainingModel
from sandbox.sim.traces import MINUTE, Trace

TIMELINE_FIELDS = ("time", "demand_rps", "need", "serving", "lent", "returning", "queue")
WINDOW_GID = "lending-window"  # the class of the timelines' shaded spans, for their readers
# report.svg's layout, in pixels, and its colours
WIDTH = 1260.0
LEFT, RIGHT = 60.0, 20.0  # room for the node counts, and a margin
PANEL, TRADE = 150.0, 260.0  # a timeline's plot area and the trade's
ABOVE, BELOW = 26.0, 24.0  # a timeline's title above it, its times below
COLOURS = {
    "serving": "#9ecae1",
    "returning": "#fdd49e",
    "lent": "#a1d99b",
    "demand": "#08306b",
    "breach": "#cb181d",
    "window": "#737373",
}


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
    provenance: Provenance | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    unnoticed: Sequence[Run] = (),
) -> dict[str, Any]:
    """Write everything; ``rule`` is the peak rule's grid, (label, run), for the trade;
    ``training`` the queue the runs lent to, if any; ``curve`` the default strategy run once
    per budget, (budget, run), for the trade curve; ``provenance`` which pool ``pool`` models;
    ``params`` the strategies' parameters; ``unnoticed`` the runs again without the pool's
    reclaim notice, for the comparison."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(
        trace, pool, rps_per_node, runs, slo, rule, training, curve, provenance, params, unnoticed
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for run in runs:
        write_timeline(out / f"timeline-{run.strategy}.csv", run.timeline)
    (out / "report.md").write_text(markdown(summary))
    (out / "report.svg").write_text(svg(trace, pool, rps_per_node, runs, summary))
    if (summary["trade"] or {}).get("curve"):
        (out / "trade_curve.svg").write_text(curve_svg(summary))
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
    provenance: Provenance | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    unnoticed: Sequence[Run] = (),
) -> dict[str, Any]:
    provenance = provenance or Provenance()
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
        "budget": said_budget(slo, provenance.origins.get("slo", Origin.DEFAULT)),
        "trade": trade(strategies, rule, rps_per_node, slo, curve),
        "training": None if training is None else _training(training),
        "notice": _notice(pool, runs, unnoticed, rps_per_node, slo),
        "params": {
            run.strategy: dict((params or {}).get(run.strategy) or {})
            for run in runs
            if not run.baseline
        },
        "pool": _pool(trace, pool, rps_per_node, provenance),
        "nights": _nights(trace, pool, runs),
        "trace": {
            "file": trace.source,
            "name": trace.name,
            "start": _utc(trace.start),
            "end": _utc(trace.end),
            "minutes": trace.minutes,
            "gap_minutes": trace.gap_minutes,
            "peak_rps": round(trace.peak, 6),
            "native_step_seconds": trace.native_step.total_seconds(),
        },
    }


# Where the budget a run had came from, as the report says it.
_BUDGET_FROM = {
    Origin.FLAG: "--slo",
    Origin.SETTINGS: "the pool's settings",
    Origin.DEFAULT: "the pool's default",
}


def said_budget(slo: Slo | None, origin: Origin) -> str:
    """Which budget ran and where it came from, in one phrase: ``10m per 7d (the pool's
    default)``, ``none (--slo none)``. A pool without ``--slo`` has the controller's default, so
    a reader must be able to tell a budget nobody asked for from one that was given."""
    whence = _BUDGET_FROM[origin]
    if slo is None:
        return f"none ({'--slo none' if origin is Origin.FLAG else whence})"
    return f"{slo.max_breach_minutes}m per {_span(slo.window)} ({whence})"


def _span(window: timedelta) -> str:
    """A budget's window as the settings write a duration: ``7d``, ``24h``, ``90m``."""
    minutes = int(window / timedelta(minutes=1))
    for unit, size in (("d", 24 * 60), ("h", 60)):
        if minutes % size == 0:
            return f"{minutes // size}{unit}"
    return f"{minutes}m"


def _pool(
    trace: Trace, pool: PoolModel, rps_per_node: float, provenance: Provenance
) -> dict[str, Any]:
    """The pool as modelled, and where each value came from (``from``)."""
    policy = pool.policy(rps_per_node)
    return {
        "name": provenance.pool,
        "settings": provenance.settings,
        "size": pool.size,
        "min_serving": pool.min_serving,
        "headroom": pool.headroom,
        "rps_per_node": round(rps_per_node, 6),
        # The share of the pool the peak minute needs, headroom left out: ``peak_share`` itself
        # when calibrated, whatever it comes to with the pool's own capacity.
        "peak_share": round(trace.peak / (rps_per_node * pool.size), 4),
        "peak_nodes": pool.need(trace.peak, rps_per_node),
        "notice_seconds": pool.notice.total_seconds(),
        "drain_seconds": pool.drain.total_seconds(),
        "warmup_seconds": pool.warmup.total_seconds(),
        "sample_age_seconds": pool.sample_age.total_seconds(),
        "zone": pool.zone,
        "window": pool.window.text,
        "gpus_per_node": pool.gpus_per_node,
        "limits": _limits(policy),
        "lends_only_to_takers": provenance.lends_only_to_takers,
        "from": {name: str(origin) for name, origin in sorted(provenance.origins.items())},
    }


def _limits(policy: PoolPolicy) -> dict[str, Any]:
    """The planner's limits the strategies ran under, beyond those ``pool`` shows itself."""
    return {
        "max_lent_fraction": policy.max_lent_fraction,
        "max_step_fraction": policy.max_step_fraction,
        "cooldown_seconds": policy.cooldown.total_seconds(),
        "min_loan_seconds": policy.min_loan.total_seconds(),
        "unused_loan_seconds": policy.unused_loan.total_seconds(),
        "staleness_seconds": policy.staleness.total_seconds(),
        "stale_grace_seconds": policy.stale_grace.total_seconds(),
        "queue_limit": policy.queue_limit,
        "queue_reclaims": policy.queue_reclaims,
        "drop_floor": round(policy.drop_floor, 6),
        "drop_hold_seconds": policy.drop_hold.total_seconds(),
    }


def _nights(trace: Trace, pool: PoolModel, runs: Sequence[Run]) -> dict[str, Any]:
    """GPU-hours each run lent per night, 12:00 to 12:00 in the pool's zone."""
    across = nights.nights(pool.zone, trace.start, trace.end)
    lent = {
        run.strategy: nights.lent_per_night(
            [m.time for m in run.timeline], [m.lent for m in run.timeline], across
        )
        for run in runs
    }
    return {
        "zone": pool.zone,
        "gpus_per_node": pool.gpus_per_node,
        "rows": [
            {
                "evening": night.evening.isoformat(),
                "start": _utc(night.start),
                "end": _utc(night.end),
                "minutes": night.minutes,
                "covered_minutes": night.covered_minutes,
                "gpu_hours": {
                    name: round(hours[i] * pool.gpus_per_node, 3) for name, hours in lent.items()
                },
            }
            for i, night in enumerate(across)
        ],
    }


def _utc(when: Any) -> str:
    return str(when.isoformat().replace("+00:00", "Z"))


def _training(spec: TrainingModel) -> dict[str, Any]:
    return {
        "backlog": spec.backlog,
        "seed": spec.seed,
        "gpus_per_node": spec.gpus_per_node,
        "sizes": list(spec.sizes),
        "hours": list(spec.hours),
        "checkpoint_minutes": CHECKPOINT / timedelta(minutes=1),
        "save_seconds": spec.save.total_seconds(),
        "silent": spec.silent,
        "grace_seconds": spec.grace.total_seconds(),
    }


# What the comparison shows of each run, with and without the notice.
NOTICE_FIGURES = ("harvest_ratio", "breach_minutes", "reclaims", "notices", "withdrawals")
NOTICE_TRAINING = (
    "lost_gpu_hours",
    "lost_answering_gpu_hours",
    "lost_silent_gpu_hours",
    "held_gpu_hours",
    "kept_gpu_hours",
    "goodput",
    "jobs_told",
    "answered_evictions",
)


def _notice(
    pool: PoolModel,
    runs: Sequence[Run],
    unnoticed: Sequence[Run],
    rps_per_node: float,
    slo: Slo | None,
) -> dict[str, Any]:
    """The reclaim notice the runs gave, and with ``unnoticed`` each run beside the same run
    without it: what training lost and kept, what inference breached, what was harvested.
    ``answering_loss_ratio``: GPU-hours the jobs that answer lost without the notice over
    with it (None when they lost nothing with it)."""
    without = {run.strategy: run for run in unnoticed}

    def row(run: Run) -> dict[str, Any]:
        figures = asdict(run.figures)
        doc = {name: figures[name] for name in NOTICE_FIGURES}
        if slo is not None:
            doc["budget_spent_minutes"] = most_spent(run.timeline, rps_per_node, slo.window)
        if run.training is not None:
            trained = asdict(run.training)
            doc.update({name: trained[name] for name in NOTICE_TRAINING})
        return doc

    compare = None
    if without:
        compare = {}
        for run in runs:
            other = without.get(run.strategy)
            if other is None:
                continue
            entry: dict[str, Any] = {"with": row(run), "without": row(other)}
            if run.training is not None and other.training is not None:
                kept = run.training.lost_answering_gpu_hours
                lost = other.training.lost_answering_gpu_hours
                entry["answering_loss_ratio"] = round(lost / kept, 2) if kept > 0 else None
            compare[run.strategy] = entry
    return {"seconds": pool.notice.total_seconds(), "compare": compare}


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
    """The run's minutes as CSV (``TIMELINE_FIELDS``). Every field is a number or a time, none
    needs quoting: each row is written as text, its minute's time formatted once per command
    (the runs share their minutes)."""
    rows = [",".join(TIMELINE_FIELDS)]
    for m in timeline:
        demand = "" if m.demand_rps is None else f"{m.demand_rps:.4f}"
        need = "" if m.need is None else m.need
        rows.append(
            f"{_stamp(m.time)},{demand},{need},{m.serving},{m.lent},{m.returning},{m.queue:.1f}"
        )
    path.write_text("\n".join(rows) + "\n")


@functools.lru_cache(maxsize=1 << 16)
def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    trace, strategies = summary["trace"], summary["strategies"]
    lines = [
        f"# Simulation of `{trace['name']}`",
        "",
        f"Trace `{trace['file']}`: {trace['start']} to {trace['end']} ({trace['minutes']} "
        f"minutes, {trace['gap_minutes']} without a sample), peak {trace['peak_rps']:.2f} rps.",
        "",
        *_pool_lines(summary),
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
    lines += _budget_lines(summary)
    lines += _meaning_lines(summary)
    lines += _night_lines(summary)
    lines += _trade_lines(summary)
    lines += _training_lines(summary)
    lines += _notice_lines(summary)
    lines += [
        "",
        "Ranked as docs/evaluation.md says: zero breach minutes first, then the highest harvest "
        "ratio, then the fewest headroom minutes, then the fewest reclaims. The oracle knows the "
        "future and is the physical limit, not a contender. Baselines run "
        "through the same planner with its guards off (no headroom rule, no metrics rule, no "
        "reclaim when demand outgrows serving, no cooldown, no per-tick limit), so their "
        "figures show the rule on its own.",
        "",
        "![demand, serving and lent nodes over time](report.svg)",
        "",
    ]
    return "\n".join(lines)


def _budget_lines(summary: dict[str, Any]) -> list[str]:
    """Which budget ran, where it came from, and the most each strategy spent of it."""
    budget, strategies = summary.get("slo"), summary["strategies"]
    said = summary.get("budget") or ("none" if budget is None else "")
    if budget is None:
        return ["", f"Error budget: {said}: the strategies keep their fixed margins."]
    spent = ", ".join(
        f"{name} {strategies[name]['budget_spent_minutes']}"
        for name in strategies
        if strategies[name]["guarded"]
    )
    return [
        "",
        f"Error budget: {said}, the breach minutes any rolling window may hold, shown to the "
        f"strategies (not the baselines). The most any window spent: {spent}.",
    ]


def _pool_lines(summary: dict[str, Any]) -> list[str]:
    """The pool as modelled, saying where its size and capacity came from, and what to doubt."""
    pool, trace = summary["pool"], summary["trace"]
    origins = pool.get("from", {})
    configured = pool.get("name") is not None
    if origins.get("size") == Origin.FLAG:
        size = f"{pool['size']} nodes (`--pool-size`)"
    elif configured:
        size = (
            f"{pool['size']} nodes (the simulator's default: the settings select a pool's "
            "nodes but never count them; `--pool-size` sets it)"
        )
    else:
        size = f"{pool['size']} nodes (the simulator's default; `--pool-size` sets it)"
    if origins.get("rps_per_node") == Origin.SETTINGS:
        capacity = (
            f"{pool['rps_per_node']:.3f} rps per node (its `rps_per_node`; the peak minute "
            f"needs {pool['peak_share']:.0%} of the pool)"
        )
    else:
        capacity = (
            f"{pool['rps_per_node']:.3f} rps per node, calibrated so that the peak minute needs "
            f"{pool['peak_share']:.0%} of the pool (no `--pool` names a configured pool whose "
            "`rps_per_node` would say it)"
        )
    window = pool.get("window", "always")
    lends = "lends at any hour" if window == "always" else f"lending window `{window}`"
    if configured:
        where = "" if pool.get("settings") is None else f" of `{pool['settings']}`"
        head = f"Pool `{pool['name']}`{where}, modelled with its own settings: "
    else:
        head = "Pool: "
    lines = [
        f"{head}{size}, {capacity}, at least {pool['min_serving']} serving, "
        f"{pool['headroom']:.0%} headroom, {_noticed(pool)}drain {pool['drain_seconds']:.0f} s "
        f"+ warm-up {pool['warmup_seconds']:.0f} s, {lends}, time zone {pool['zone']}; metrics "
        f"{pool['sample_age_seconds']:.0f} s old."
    ]
    limits = pool.get("limits")
    if configured and limits is not None:
        lines += [
            "",
            f"Its limits: at most {limits['max_lent_fraction']:.0%} lent and "
            f"{limits['max_step_fraction']:.0%} moved per tick, cooldown "
            f"{_minutes(limits['cooldown_seconds'])}, minimum loan "
            f"{_minutes(limits['min_loan_seconds'])}, metrics stale after "
            f"{_minutes(limits['staleness_seconds'])} (grace "
            f"{_minutes(limits['stale_grace_seconds'])}), queue limit {limits['queue_limit']:g}; "
            f"strategy {_strategies(summary)}.",
        ]
    flagged = sorted(
        "--" + _FLAGS.get(name, name).replace("_", "-")
        for name, origin in origins.items()
        if origin == Origin.FLAG
    )
    if configured and flagged:
        shown = ", ".join(f"`{flag}`" for flag in flagged)
        lines += ["", f"Given by flags instead of the settings: {shown}."]
    if pool.get("lends_only_to_takers") and summary.get("training") is None:
        lines += [
            "",
            "The pool lends only to takers (`lend_only_to_takers`); this run has no training "
            "jobs (`--training-backlog` adds them), so it lends as if every loan found one.",
        ]
    bare = math.ceil(trace["peak_rps"] / pool["rps_per_node"] - 1e-9)  # no headroom
    if bare > pool["size"]:
        lines += [
            "",
            f"**The trace's peak ({trace['peak_rps']:.2f} rps) needs {bare} nodes and the pool "
            f"has {pool['size']}**: every run breaches at the peak. Give `--pool-size`, or check "
            "that the trace and `rps_per_node` count alike.",
        ]
    elif pool.get("peak_nodes", 0) > pool["size"] and origins.get("rps_per_node") == "settings":
        # Not said of a calibrated pool: there the peak needs ``peak_share`` of it by design.
        lines += [
            "",
            f"The trace's peak ({trace['peak_rps']:.2f} rps) needs {pool['peak_nodes']} nodes "
            f"with its headroom and the pool has {pool['size']}: there, even with nothing lent, "
            "every run has headroom minutes (not breach minutes).",
        ]
    return lines


def _noticed(pool: dict[str, Any]) -> str:
    """The reclaim notice, where the pool gives one, as the pool line says it."""
    seconds = pool.get("notice_seconds", 0.0)
    return f"reclaim notice {seconds:.0f} s + " if seconds else ""


# A figure of ``pool.from`` by the flag that sets it, where the two are spelled apart.
_FLAGS = {"size": "pool_size", "zone": "tz"}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def _strategies(summary: dict[str, Any]) -> str:
    """The strategies run, each with its parameters, and whose choice they were."""
    params = summary.get("params", {})
    chosen = [name for name, f in summary["strategies"].items() if f["guarded"]]
    shown = ", ".join(
        f"{name} {json.dumps(params[name])}" if params.get(name) else name for name in chosen
    )
    shown = shown or "none but the baselines"
    whose = {"settings": "the pool's", "flag": "from `--strategy`"}.get(
        summary["pool"].get("from", {}).get("strategy", ""), "the default"
    )
    return f"{shown} ({whose})"


def _meaning_lines(summary: dict[str, Any]) -> list[str]:
    """One sentence per figure of the report, as docs/evaluation.md defines them."""
    short = SHORT_LOAN / timedelta(minutes=1)
    lines = [
        "",
        "What the figures say:",
        "",
        "- **harvest**: node-hours lent (lent node-h) as a share of what the oracle lent (oracle "
        "node-h), and the oracle lends all that could be lent without a breach, so 1.0 is all "
        "the pool had to give.",
        "- **breach min**: minutes in which demand was above what the warm serving nodes "
        "serve, so requests waited.",
        "- **headroom min**: minutes in which fewer nodes served than demand with its headroom "
        "needs: a thin margin, not yet a breach.",
        "- **reclaims**: loans taken back; each one stops the training on that node and leaves "
        "the pool a node short for the drain and the warm-up.",
        f"- **loans, short loans**: loans made, and those taken back within {short:g} minutes, "
        "churn that lends little.",
    ]
    trade = summary.get("trade")
    if trade is not None:
        lines.append(
            "- **dominated**: a strategy is dominated when a point of the peak rule's grid "
            "harvests at least 0.01 more with no more breach minutes, or as much with fewer: "
            "a few lines of rule would have done better on this load."
        )
        if trade.get("curve"):
            lines.append(
                "- **trade curve**: the first strategy run once per error budget, its harvest "
                "against that budget beside the best grid point that kept it in hindsight: "
                "what each breach minute allowed buys."
            )
    return lines


def _night_lines(summary: dict[str, Any]) -> list[str]:
    """GPU-hours lent per night, a row per night, a column per run."""
    table = summary.get("nights")
    if not table or not table["rows"]:
        return []
    names = list(summary["strategies"])
    lines = [
        "",
        "## GPU-hours lent per night",
        "",
        f"Each night runs from 12:00 to 12:00 in {table['zone']} and is named by its evening; "
        f"GPU-hours are node-hours lent times {table['gpus_per_node']} GPUs per node "
        "(`--gpus-per-node`). Hours: how much of the night the trace holds.",
        "",
        "| night | hours | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    totals = dict.fromkeys(names, 0.0)
    for row in table["rows"]:
        evening = date.fromisoformat(row["evening"])
        cells = []
        for name in names:
            totals[name] += row["gpu_hours"][name]
            cells.append(f"{row['gpu_hours'][name]:.1f}")
        lines.append(
            f"| {evening:%a %Y-%m-%d} | {row['covered_minutes'] / 60:.1f} | "
            + " | ".join(cells)
            + " |"
        )
    hours = sum(r["covered_minutes"] for r in table["rows"]) / 60
    lines.append(f"| total | {hours:.1f} | " + " | ".join(f"{totals[n]:.1f}" for n in names) + " |")
    return lines


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
    lines += ["", "![harvest against the error budget](trade_curve.svg)"]
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


def _notice_lines(summary: dict[str, Any]) -> list[str]:
    """The reclaim notice: each run with it, and beside it the same run without when compared."""
    found = summary.get("notice") or {}
    seconds, compare = found.get("seconds", 0.0), found.get("compare")
    strategies = summary["strategies"]
    if not seconds and not compare:
        return []
    spec = summary.get("training")
    lines = [
        "",
        "## The reclaim notice",
        "",
        f"A strategy's reclaim of a node a job runs on told the job {seconds / 60:g} min ahead "
        "(`--notice`); a reclaim for demand, a queue or a rule gave none.",
    ]
    if spec is not None:
        lines[-1] += (
            f" A job told stops, saves for {spec['save_seconds'] / 60:g} min and answers, and "
            "is evicted then, losing nothing; "
            f"{spec['silent']:.0%} of the jobs never answer and are evicted when the notice is "
            "up, losing their work since their last checkpoint. Goodput: GPU-hours of work "
            "kept (used, less lost, less held stopped for a notice) per GPU-hour lent."
        )
    if compare:
        lines[-1] += " Each run is shown with the notice and again without it."
    lines += [
        "",
        "| strategy | notice | harvest | breach min | reclaims | notices | withdrawn "
        "| GPU-h lost | lost, answering jobs | lost, silent jobs | goodput |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in strategies.items():
        label = name if f["guarded"] or name == "oracle" else f"{name} (baseline)"
        rows = [("with", f | (f.get("training") or {}))]
        if compare and name in compare:
            rows = [("with", compare[name]["with"]), ("without", compare[name]["without"])]
        for said, r in rows:
            lines.append(
                f"| {label} | {said} | {r['harvest_ratio']:.3f} | {r['breach_minutes']} "
                f"| {r['reclaims']} | {r['notices']} | {r['withdrawals']} "
                f"| {_hours(r, 'lost_gpu_hours')} | {_hours(r, 'lost_answering_gpu_hours')} "
                f"| {_hours(r, 'lost_silent_gpu_hours')} "
                f"| {'-' if r.get('goodput') is None else format(r['goodput'], '.1%')} |"
            )
    if compare:
        ratios = [
            f"{name} {_times(e['answering_loss_ratio'], e['without'])}"
            for name, e in compare.items()
            if "answering_loss_ratio" in e
        ]
        if ratios:
            lines += [
                "",
                "GPU-hours the jobs that answer lost without the notice, over with it: "
                + ", ".join(ratios)
                + ".",
            ]
    return lines


def _times(ratio: float | None, without: dict[str, Any]) -> str:
    if ratio is not None:
        return f"{ratio:g}x"
    if without.get("lost_answering_gpu_hours"):
        return "none lost with it"
    return "none lost either way"


def _hours(row: dict[str, Any], name: str) -> str:
    return "-" if row.get(name) is None else f"{row[name]:.1f}"


def svg(
    trace: Trace,
    pool: PoolModel,
    rps_per_node: float,
    runs: Sequence[Run],
    summary: dict[str, Any] | None = None,
) -> str:
    """The trade (when the summary has one) above a timeline per run, its times in the pool's
    zone and its lending window shaded: ``report.svg``."""
    trade = (summary or {}).get("trade")
    window = pool.window
    lends = "lends at any hour" if window.always else f"lending window {window.text} shaded"
    parts = [
        charts.text(
            LEFT, 20, f"{trace.name}: demand, serving and lent nodes ({pool.zone} time; {lends})"
        )
    ]
    top = 36.0
    if trade is not None:
        assert summary is not None
        parts += _trade_chart(summary, top + ABOVE).parts
        top += ABOVE + TRADE + BELOW + 16
    shaded = [] if window.always else nights.open_spans(window, trace.start, trace.end)
    spans = [
        (
            (opened - trace.start) / MINUTE,
            (closed - trace.start) / MINUTE,
            f'class="{WINDOW_GID}" data-from="{opened.isoformat()}" data-to="{closed.isoformat()}"',
        )
        for opened, closed in shaded
    ]
    ticks = charts.time_ticks(trace.start, len(trace.rps), ZoneInfo(pool.zone))
    for run in runs:
        parts += _timeline(run, rps_per_node, pool.size, top + ABOVE, spans, ticks).parts
        top += ABOVE + PANEL + BELOW
    return charts.page(WIDTH, top + 8, parts)


def _timeline(
    run: Run,
    rps_per_node: float,
    size: int,
    top: float,
    spans: Sequence[tuple[float, float, str]],
    ticks: Sequence[tuple[float, str, str]],
) -> charts.Chart:
    """Demand (in nodes) over the serving, returning and lent nodes, breach minutes marked,
    the window's open spans shaded (from, to and their ``data-`` attributes); x in minutes from
    the trace's start."""
    minutes = run.timeline
    nodes = [m.serving + m.returning + m.lent for m in minutes]
    demand = [None if m.demand_rps is None else m.demand_rps / rps_per_node for m in minutes]
    high = max([size, *nodes, *(d for d in demand if d is not None)])
    chart = charts.Chart.of((LEFT, top, WIDTH - LEFT - RIGHT, PANEL), (0, len(minutes)), (0, high))
    for opened, closed, data in spans:
        chart.span(opened, closed, COLOURS["window"], data)
    serving = [float(m.serving) for m in minutes]
    returning = [s + m.returning for s, m in zip(serving, minutes, strict=True)]
    chart.steps("serving", COLOURS["serving"], [0.0] * len(minutes), serving)
    chart.steps("returning", COLOURS["returning"], serving, returning)
    chart.steps("lent", COLOURS["lent"], returning, [float(n) for n in nodes])
    chart.line("demand", COLOURS["demand"], list(enumerate(demand)), width=0.6)
    breaches = [
        t
        for t, m in enumerate(minutes)
        if m.demand_rps is not None and m.demand_rps > rps_per_node * m.serving + 1e-9
    ]
    chart.ticks_at_bottom("breach", COLOURS["breach"], breaches)
    chart.frame()
    chart.y_ticks(charts.nice_ticks(0, high, 4), "nodes")
    chart.x_ticks(ticks)
    figures = run.figures
    name = f"{run.strategy} (baseline)" if run.baseline else run.strategy
    if run.strategy == "oracle":
        name = "oracle (upper bound)"
    chart.title(
        f"{name}: harvest {figures.harvest_ratio:.3f}, {figures.breach_minutes} breach min, "
        f"{figures.reclaims} reclaims",
        size=11,
    )
    legend = [(COLOURS[s], s) for s in ("serving", "returning", "lent")]
    legend += [(COLOURS["demand"], "demand (nodes)"), (COLOURS["breach"], "breach")]
    if spans:
        legend.append((COLOURS["window"], "lending window"))
    chart.legend(legend)
    return chart


def _trade_chart(summary: dict[str, Any], top: float) -> charts.Chart:
    trade, budget = summary["trade"], summary.get("slo")
    measure = trade["measure"]
    grid = [Point(p["label"], p["harvest_ratio"], p[measure]) for p in trade["grid"]]
    strategies = [
        _point(name, summary["strategies"][name], measure) for name in trade["dominated_by"]
    ]
    chart = frontier.draw(
        (LEFT, top, WIDTH - LEFT - RIGHT, TRADE),
        strategies,
        grid,
        None if budget is None else budget["max_breach_minutes"],
        xlabel=_unit(measure),
    )
    chart.title("harvest against breach minutes: each strategy, and the peak rule's frontier", 11)
    return chart


def curve_svg(summary: dict[str, Any]) -> str:
    """The trade curve: harvest against the budget, the default strategy run with each budget
    one line, the best grid point within it (in hindsight) another; "over" marks a budget the
    strategy overspent: ``trade_curve.svg``."""
    trade, budget = summary["trade"], summary["slo"]
    rows, name = trade["curve"], trade["curve_strategy"]
    points = [
        frontier.CurvePoint(r["budget"], r["default_harvest"], r["within"], r["best_harvest"])
        for r in rows
    ]
    chart = frontier.draw_curve((70, 40, 560, 300), name, points, budget["window_days"])
    chart.title(f"{summary['trace']['name']}: harvest against the budget", 11)
    return charts.page(660, 390, chart.parts)
