"""The robustness suite: every built-in strategy, and a grid of the peak rule, on every bundled
trace and on twists of them; is the default strategy on the frontier of what the rule reaches?

Scenarios: each bundled trace (the Azure 2024 week's `code` and `conv`, ServeGen's m-large,
m-mid and m-small), and twists of two of them (`code`, smooth and diurnal; `m-large`, jumpy):

- ``flash``: on the last night, at 03:00 in the pool's zone, demand climbs to 80 % of the peak in
  three minutes, holds 45 minutes and falls back;
- ``holiday``: the fourth day runs at 30 % all day, and the fifth is an ordinary day again;
- ``early``: the last day's ramp comes three hours earlier than on the days before;
- ``shifted``: the whole trace five hours later (the pool's clock stays);
- ``zeros``: two two-hour stretches of exactly zero load at 11:00 on the second and fifth days;
- ``half``, ``double``: the fourth day plays at half speed (its first twelve hours over the
  whole day), or at double speed (two days' curves in one);
- and ``bursts``: sparse bursty traffic, 3 % of the peak with bursts to 50-100 % for 5-30 minutes
  about every four hours (seeded), on the `code` week's clock.

Strategies: ``forecast`` (the default), ``watermark``, ``peak`` with its defaults, and the peak
rule's grid, ``w`` in 10, 30, 60, 120 minutes by ``k`` in 0 to 2. Each run is the simulator's
(``sandbox.sim.engine``: 16 nodes, the peak minute at 90 % of the pool, 2 + 5 minute return).

For each scenario it prints the default's harvest and breach minutes, the grid points that
dominate it (more harvest and no more breach minutes, or as much harvest and fewer), the
nearest grid point, and the rule's frontier, then a summary line; with ``--plots DIR`` a
harvest-against-breach plot per scenario, each strategy a point and the grid's frontier a line.

    .venv/bin/python bench/robustness.py [--scenarios code,flash-code] [--plots out/robustness]
        [--strategy forecast] [--params '{"safety": 0.3}'] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from rebalancer.core import model
from sandbox.sim import engine, frontier, traces
from sandbox.sim.frontier import Point
from sandbox.sim.traces import MINUTE, Trace
from strategies import registry

EXAMPLES = Path(__file__).parents[1] / "examples" / "traces"
AZURE = "azure_llm_2024_week_per_minute.csv"
LA, SHANGHAI = "America/Los_Angeles", "Asia/Shanghai"
DAY = 24 * 60
Values = list[float | None]


@dataclass(frozen=True)
class Scenario:
    name: str
    trace: Trace
    zone: str


# ---------------------------------------------------------------------------------------------
# Scenarios


def _local_minute(trace: Trace, zone: str, t: int) -> tuple[int, int]:
    """(day index since the trace's first local midnight, minute of the local day) of ``t``."""
    local = (trace.start + MINUTE * t).astimezone(ZoneInfo(zone))
    first = trace.start.astimezone(ZoneInfo(zone)).replace(hour=0, minute=0, second=0)
    return (local.replace(hour=0, minute=0, second=0) - first).days, local.hour * 60 + local.minute


def _day_starts(trace: Trace, zone: str) -> list[int]:
    """The index of every local midnight inside the trace."""
    return [
        t
        for t in range(trace.minutes)
        if _local_minute(trace, zone, t)[1] == 0 and t + DAY <= trace.minutes
    ]


def _with(trace: Trace, name: str, values: Values) -> Trace:
    return replace(trace, name=name, rps=values)


def flash(trace: Trace, zone: str) -> Values:
    values = list(trace.rps)
    start = _day_starts(trace, zone)[-1] + 3 * 60
    top = 0.8 * trace.peak
    shape = (
        [top * (i + 1) / 3 for i in range(3)] + [top] * 45 + [top * (4 - i) / 5 for i in range(5)]
    )
    for i, level in enumerate(shape):
        if values[start + i] is not None:
            values[start + i] = max(values[start + i] or 0.0, level)
    return values


def holiday(trace: Trace, zone: str) -> Values:
    values = list(trace.rps)
    start = _day_starts(trace, zone)[3]
    for t in range(start, start + DAY):
        if values[t] is not None:
            values[t] = (values[t] or 0.0) * 0.3
    return values


def early(trace: Trace, zone: str) -> Values:
    values = list(trace.rps)
    start = _day_starts(trace, zone)[-1]
    lead = 3 * 60
    for t in range(start, start + DAY - lead):
        values[t] = trace.rps[t + lead]
    return values


def shifted(trace: Trace, zone: str) -> Values:
    by = 5 * 60
    return [trace.rps[(t - by) % trace.minutes] for t in range(trace.minutes)]


def zeros(trace: Trace, zone: str) -> Values:
    values = list(trace.rps)
    starts = _day_starts(trace, zone)
    for day in (1, 4):
        begin = starts[day] + 11 * 60
        values[begin : begin + 120] = [0.0] * 120
    return values


def _day_speed(trace: Trace, zone: str, speed: float) -> Values:
    values = list(trace.rps)
    start = _day_starts(trace, zone)[3]
    for i in range(DAY):
        values[start + i] = trace.rps[start + int(i * speed)]
    return values


def half(trace: Trace, zone: str) -> Values:
    return _day_speed(trace, zone, 0.5)


def double(trace: Trace, zone: str) -> Values:
    return _day_speed(trace, zone, 2.0)


def bursts(trace: Trace, zone: str) -> Values:
    rng = random.Random(7)
    base = 0.03 * trace.peak
    values: Values = [base] * trace.minutes
    t = int(rng.expovariate(1 / 240))
    while t < trace.minutes:
        top, length = rng.uniform(0.5, 1.0) * trace.peak, rng.randint(5, 30)
        ramp = rng.randint(1, 2)
        for i in range(length):
            if t + i < trace.minutes:
                values[t + i] = base + (top - base) * min(1.0, (i + 1) / ramp)
        t += length + int(rng.expovariate(1 / 240))
    return values


TWISTS: dict[str, Callable[[Trace, str], Values]] = {
    "flash": flash,
    "holiday": holiday,
    "early": early,
    "shifted": shifted,
    "zeros": zeros,
    "half": half,
    "double": double,
}


def scenarios() -> list[Scenario]:
    code = traces.load(EXAMPLES / AZURE, "code")
    conv = traces.load(EXAMPLES / AZURE, "conv")
    servegen = {
        m: traces.load(EXAMPLES / f"servegen_{m}.csv") for m in ("m-large", "m-mid", "m-small")
    }
    out = [Scenario("code", code, LA), Scenario("conv", conv, LA)]
    out += [Scenario(m, t, SHANGHAI) for m, t in servegen.items()]
    for base_name, base, zone in (("code", code, LA), ("m-large", servegen["m-large"], SHANGHAI)):
        for twist, make in TWISTS.items():
            name = f"{twist}-{base_name}"
            out.append(Scenario(name, _with(base, name, make(base, zone)), zone))
    out.append(Scenario("bursts", _with(code, "bursts", bursts(code, LA)), LA))
    return out


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    label: str
    strategy: str
    params: dict[str, Any]
    slo: model.Slo | None = None


def jobs(
    chosen: Sequence[Scenario], default: tuple[str, dict[str, Any]], slo: model.Slo | None
) -> list[Job]:
    out = []
    for s in chosen:
        out.append(Job(s, "default", *default, slo))
        out.append(Job(s, "watermark", "watermark", {}))
        out += [Job(s, name, "peak", params) for name, params in frontier.grid()]
    return out


def run(job: Job) -> tuple[str, Point, int | None]:
    """The job's point, and with an slo the most breach minutes any rolling window held."""
    pool = engine.PoolModel(zone=job.scenario.zone)
    strategy = registry.build(job.strategy, job.params)
    done = engine.run(job.scenario.trace, strategy, pool, slo=job.slo)
    figures = done.figures
    point = Point(job.label, figures.harvest_ratio, figures.breach_minutes, figures.reclaims)
    spent = None
    if job.slo is not None:
        spent = engine.most_spent(done.timeline, pool.calibrate(job.scenario.trace), job.slo.window)
    return job.scenario.name, point, spent


def nearest(target: Point, points: Sequence[Point]) -> Point:
    """The grid point closest to ``target``: harvest in tenths, breach minutes in tens."""
    return min(
        points,
        key=lambda p: math.hypot(
            (p.harvest - target.harvest) * 10, (p.breach - target.breach) / 10
        ),
    )


def plot(
    name: str, default: Point, others: Sequence[Point], grid: Sequence[Point], out: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    frontier.draw(ax, [*others, replace(default, label="default")], grid, highlight="default")
    ax.set_xlabel("breach minutes")
    ax.set_title(name)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)


def _load(path: Path | None) -> dict[tuple[str, str], Point]:
    if path is None or not path.exists():
        return {}
    rows = json.loads(path.read_text(encoding="utf-8"))
    return {
        (r["scenario"], r["label"]): Point(r["label"], r["harvest"], r["breach"], r["reclaims"])
        for r in rows
    }


def _save(path: Path, points: dict[tuple[str, str], Point]) -> None:
    rows = [
        {
            "scenario": name,
            "label": p.label,
            "harvest": p.harvest,
            "breach": p.breach,
            "reclaims": p.reclaims,
        }
        for (name, _), p in sorted(points.items())
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=0), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="", help="comma-separated names (default: all)")
    parser.add_argument("--strategy", default=registry.DEFAULT, choices=registry.names())
    parser.add_argument("--params", default="{}", help="the default's parameters, as JSON")
    parser.add_argument("--plots", type=Path, help="write a plot per scenario here")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--slo",
        type=int,
        help="give the default an error budget of this many breach minutes per rolling 7 days",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="keep the runs of everything but the default in this JSON file, and reuse them "
        "(delete it when the scenarios, the simulator or another strategy change)",
    )
    args = parser.parse_args()
    every = scenarios()
    wanted = set(filter(None, args.scenarios.split(",")))
    chosen = [s for s in every if not wanted or s.name in wanted]
    started = time.perf_counter()
    slo = None if args.slo is None else model.Slo(args.slo)
    cached = _load(args.cache)
    todo = [
        j
        for j in jobs(chosen, (args.strategy, json.loads(args.params)), slo)
        if j.label == "default" or (j.scenario.name, j.label) not in cached
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as workers:
        fresh = list(workers.map(run, todo))
    spent = {name: most for name, point, most in fresh if point.label == "default"}
    for name, point, _ in fresh:
        if point.label != "default":
            cached[name, point.label] = point
    if args.cache:
        _save(args.cache, cached)
    chosen_names = {s.name for s in chosen}
    results = [(name, point) for name, point, _ in fresh if point.label == "default"]
    results += [(name, point) for (name, _), point in cached.items() if name in chosen_names]
    by_scenario: dict[str, list[Point]] = {}
    for name, point in results:
        by_scenario.setdefault(name, []).append(point)
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
    budget = "" if slo is None else f", error budget {slo.max_breach_minutes} min per 7 days"
    print(f"default: {args.strategy} {args.params}{budget}")
    worst = "" if slo is None else f" {'7d max':>6}"
    print(
        f"{'scenario':16} {'harvest':>7} {'breach':>6}{worst}  {'nearest grid point':28} "
        "dominated by"
    )
    dominated_on = []
    for s in chosen:
        points = by_scenario[s.name]
        default = next(p for p in points if p.label == "default")
        grid = [p for p in points if p.label.startswith("peak w=")]
        others = [p for p in points if p is not default and p not in grid]
        beaten = frontier.dominating(default, grid)
        close = nearest(default, grid)
        if beaten:
            dominated_on.append(s.name)
        shown = ", ".join(f"{p.label} ({p.harvest:.3f}, {p.breach})" for p in beaten[:3])
        most = "" if slo is None else f" {spent[s.name]:6d}"
        print(
            f"{s.name:16} {default.harvest:7.3f} {default.breach:6d}{most}  "
            f"{close.label:15} ({close.harvest:.3f}, {close.breach:4d})  {shown or '-'}"
        )
        if args.plots:
            plot(s.name, default, others, grid, args.plots)
    print(
        f"\n{len(chosen)} scenarios, {len(fresh)} runs in {time.perf_counter() - started:.0f} s "
        f"({len(results) - len(fresh)} from the cache); "
        f"the default is dominated on {len(dominated_on)}: {', '.join(dominated_on) or 'none'}"
    )
    return 1 if dominated_on else 0


if __name__ == "__main__":
    sys.exit(main())
