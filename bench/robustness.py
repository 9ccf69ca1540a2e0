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
- ``growth``: a service gaining users, 5 % more every day (compounding, the last day at the
  trace's own level), so that each day's hours run above the same hours of the days before;
- ``weekend``: a quiet weekend, from the first Saturday 00:00 to Monday 08:00 in the pool's
  zone at 5 % of the trace, so that Monday morning returns 7-20x what the weekend carried (a
  business-hours service's week);
- ``bursts``: sparse bursty traffic, 3 % of the peak with bursts to 50-100 % for 5-30 minutes
  about every four hours (seeded), on the `code` week's clock;
- ``gpu-busy``: not a request rate but the busy GPUs per minute (a whole number) of a bursty
  image-generation service over 24 days (seeded): jobs of 1, 2 or 4 GPUs held 1-10 minutes,
  arriving with the day, and a large burst of 15-40 jobs about every 8 hours. The suite's
  first demand series of another kind; the simulator calibrates a node on its peak as on any;
- ``small``: a service of a few requests a minute, Poisson counts per minute around a mean that
  follows the `code` week's day (its busiest minutes average 6; seeded);
- ``spiky-conv``: the `conv` week with short spikes, demand 2 to 4 times for 1 to 5 minutes,
  about every 2 hours (seeded);
- ``drift-code``: the `code` week with each day's level scaled by a random walk, 20 % up or
  down a day at most (seeded), moving smoothly between local midnights;
- and ``reason-steps``: a reasoning model's day (ServeGen's `deepseek-r1`, 10-minute steps)
  over 14 days, each day at its own level, 0.75 to 1.25 times the day's (seeded): a jumpy
  service whose level steps from one day to the next.

Strategies: the default (``--strategy``, the registry's default unless told: ``adaptive``),
``watermark``, and the peak rule's grid, ``w`` in 10, 30, 60, 120 minutes by ``k`` in 0 to 2.
Each run is the simulator's (``sandbox.sim.engine``: 16 nodes, the peak minute at 90 % of the
pool, 2 + 5 minute return).

Every run records its harvest, breach minutes, reclaims and its worst rolling 7 days (the most
breach minutes any 10,080 minutes ending at a minute held, ``engine.most_spent``).

Without a budget, for each scenario it prints the default's harvest, breach minutes and worst
week, the grid points that dominate it (0.01 or more harvest and no more breach minutes, or at
least as much harvest and fewer: ``Point.dominates``) and the nearest grid point, then a summary
line; with ``--plots DIR`` a harvest-against-breach plot per scenario, each strategy a point and
the grid's frontier a line.

With ``--slo B`` (or several, ``--slo 10,30``: the grid runs are shared, the default runs once
per budget) the default runs with that error budget and is judged against two yardsticks, both
chosen in hindsight over the whole trace:

- the **guarded best**, the target: the grid run again with B, the planner holding every grid
  point to it as it holds the default (once the budget cannot pay for another loan's worst
  case, only covered loans: docs/design/budget.md), and the one with the most harvest whose
  worst rolling 7 days held at most B. The default should reach 0.9 of its harvest: what is
  left of that gap is what the default loses by choosing its rule online;
- the **hindsight best**, the limit: the grid run without a budget, and the one with the most
  harvest whose worst rolling 7 days held at most B. It may have spent most of B and then gone
  on lending loans its history did not cover, luck the planner allows no rule to count on, so
  it is shown with no target.

Per scenario: the default's harvest, breach minutes and worst rolling week, each yardstick's
point, harvest and worst week, and the two ratios (the default's harvest over each); a summary
line per budget gives the least of each ratio, the scenarios under 0.9 of the guarded best,
and the default's worst week. Keeping the budget is a hard property: a default whose worst week
exceeds B is marked FAIL, and the exit status is 1. ``--no-guarded`` skips the grid's runs with
each budget (one per grid point, scenario and budget, unless cached) and the target with them,
for a quicker look.

With ``--curve`` the budgets 0, 5, 10, 30 and 60 join ``--slo``'s, and a table shows, per
scenario and budget, the default's harvest / worst week, the best grid point's within the
budget, and the ratio: the trade curve. With ``--plots DIR`` also ``DIR/<scenario>-curve.svg``,
harvest against the budget, the default one line and the hindsight-best grid another.

The cache (``--cache``) keeps every run but the default's, with its worst week and the budget it
ran with (none when absent): the guarded grid's runs under their budget, the others without; a
cache written before the worst week was kept (no ``version`` 2) is ignored and its runs are made
again. It is written as the runs finish (at most a minute apart) and when the suite stops, so
that a suite stopped part-way (a whole one takes about an hour on 2 cores) goes on from there.
The last line is the suite's whole run time.

    .venv/bin/python bench/robustness.py [--scenarios code,flash-code] [--plots out/robustness]
        [--strategy adaptive] [--params '{"least_margin": 0.2}'] [--jobs 2] [--slo 10,30]
        [--no-guarded] [--curve] [--cache out/robustness/cache.json]

``bench/rescore.py`` recounts the default's budgeted runs on these scenarios independently.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import charts, engine, frontier, traces
from sandbox.sim.frontier import Point
from sandbox.sim.traces import MINUTE, Trace

EXAMPLES = Path(__file__).parents[1] / "examples" / "traces"
AZURE = "azure_llm_2024_week_per_minute.csv"
SERVEGEN = "servegen_bailian_rate_10min.csv"  # the 14-day LLMs and the one-day models
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


GROWTH = 1.05  # per day
WEEKEND_LEVEL = 0.05  # of the trace, over a quiet weekend
SATURDAY, SUNDAY = 5, 6  # datetime.weekday()


def growth(trace: Trace, zone: str) -> Values:
    """A service gaining users: 5 % more every day, compounding smoothly, so that the last
    minute keeps its own level and the first day runs at 1 / 1.05 ** (days - 1) of it."""
    end = trace.minutes - 1
    return [None if v is None else v * GROWTH ** ((t - end) / DAY) for t, v in enumerate(trace.rps)]


def weekend(trace: Trace, zone: str) -> Values:
    """Every weekend after the trace's first weekdays at ``WEEKEND_LEVEL``: Saturday and Sunday
    and Monday until 08:00 local; a business-hours service's quiet, and its Monday return."""
    values = list(trace.rps)
    local = ZoneInfo(zone)
    started = False  # a weekend counts from the first Saturday: weekdays come before it
    for t, v in enumerate(values):
        when = (trace.start + MINUTE * t).astimezone(local)
        started = started or when.weekday() == SATURDAY
        quiet = when.weekday() in (SATURDAY, SUNDAY) or (when.weekday() == 0 and when.hour < 8)
        if started and quiet and v is not None:
            values[t] = v * WEEKEND_LEVEL
    return values


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


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson count with this mean (Knuth's product of uniforms: the means here are small)."""
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


GPU_BUSY_START = datetime(2025, 3, 3, 8, tzinfo=UTC)  # midnight in Los Angeles


def gpu_busy(days: int = 24, seed: int = 13) -> Trace:
    """Busy GPUs per minute of a bursty image-generation service: a whole number, not a rate.

    Jobs arrive as a Poisson stream whose rate follows the day (0.6 a minute at 04:00 local,
    4 at 16:00); each holds 1, 2 or 4 GPUs for 1 to 10 minutes. About every 8 hours a large
    burst lands: 15 to 40 jobs within 4 minutes. The simulator calibrates a node on the peak, as
    for any trace, so a node "serves" peak / 14.4 busy GPUs.
    """
    rng = random.Random(seed)
    minutes = days * DAY
    busy = [0] * minutes

    def hold(t: int, gpus: int, length: int) -> None:
        for i in range(t, min(t + length, minutes)):
            busy[i] += gpus

    for t in range(minutes):
        hour = (t % DAY) / 60
        day = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4) / 24)
        for _ in range(_poisson(rng, 0.6 + 3.4 * day)):
            hold(t, rng.choice((1, 1, 1, 2, 4)), rng.randint(1, 10))
    t = int(rng.expovariate(1 / 480))
    while t < minutes:
        for _ in range(rng.randint(15, 40)):
            hold(t + rng.randint(0, 3), rng.choice((1, 2, 4)), rng.randint(1, 10))
        t += 30 + int(rng.expovariate(1 / 480))
    values: Values = [float(v) for v in busy]
    return Trace("gpu-busy", "synthetic", GPU_BUSY_START, values, MINUTE)


SMALL_PEAK = 6.0  # requests a minute at the busiest hour, on average


def small(trace: Trace, zone: str, seed: int = 17) -> Values:
    """A small service: a few requests a minute, counted per minute (Poisson) around a mean
    that follows ``trace``'s day (scaled so that its busiest minute averages ``SMALL_PEAK``).
    The count of one minute says little about the next: a noise, not a level, sets the peak."""
    rng = random.Random(seed)
    scale = SMALL_PEAK / trace.peak
    return [None if v is None else float(_poisson(rng, v * scale)) for v in trace.rps]


def spiky(trace: Trace, zone: str, seed: int = 23) -> Values:
    """Short spikes on top of the trace: about every 2 hours (seeded), demand multiplied by 2
    to 4 for 1 to 5 minutes, from one minute to the next and back."""
    rng = random.Random(seed)
    values = list(trace.rps)
    t = int(rng.expovariate(1 / 120))
    while t < trace.minutes:
        factor, length = rng.uniform(2.0, 4.0), rng.randint(1, 5)
        for i in range(t, min(t + length, trace.minutes)):
            if values[i] is not None:
                values[i] = (values[i] or 0.0) * factor
        t += length + int(rng.expovariate(1 / 120))
    return values


def drift(trace: Trace, zone: str, seed: int = 29) -> Values:
    """Day-to-day variation: each local day's level scaled by a seeded random walk (each day
    0.8 to 1.2 times the last, uniformly, from 1), moving linearly from one local midnight to
    the next, so that no day looks like the one before and no step appears at midnight."""
    rng = random.Random(seed)
    starts = _day_starts(trace, zone)
    knots = [starts[0] - DAY, *starts, starts[-1] + DAY, starts[-1] + 2 * DAY]
    levels = [1.0]
    for _ in knots[1:]:
        levels.append(levels[-1] * rng.uniform(0.8, 1.2))
    values = list(trace.rps)
    for t, v in enumerate(values):
        if v is None:
            continue
        i = max(0, min(len(knots) - 2, (t - knots[0]) // DAY))
        share = (t - knots[i]) / (knots[i + 1] - knots[i])
        values[t] = v * (levels[i] + (levels[i + 1] - levels[i]) * share)
    return values


SERVEGEN_STEP = 10  # minutes a row of the release stands for


def reasoning_days(start: datetime, days: int = 14, seed: int = 31) -> Trace:
    """ServeGen's one day of a reasoning model (``deepseek-r1``, requests a second summed per
    10-minute window) from ``start`` (the release's day 0, as its LLMs' traces have it) played
    ``days`` times, each day at a level of its own, 0.75 to 1.25 times
    the day's (seeded): a service whose level steps from one day to the next, on a day with
    hour-long lulls and returns of about twice their level."""
    with (EXAMPLES / SERVEGEN).open(newline="") as handle:
        day = [
            float(r["rate_rps_sum"]) for r in csv.DictReader(handle) if r["model"] == "deepseek-r1"
        ]
    if len(day) * SERVEGEN_STEP != DAY:
        raise ValueError(f"{SERVEGEN}: deepseek-r1 has {len(day)} windows, not a day's")
    rng = random.Random(seed)
    values: Values = []
    for _ in range(days):
        level = rng.uniform(0.75, 1.25)
        values += [v * level for v in day for _ in range(SERVEGEN_STEP)]
    return Trace("reason-steps", f"{SERVEGEN} (deepseek-r1)", start, values, MINUTE * SERVEGEN_STEP)


TWISTS: dict[str, Callable[[Trace, str], Values]] = {
    "flash": flash,
    "holiday": holiday,
    "early": early,
    "shifted": shifted,
    "zeros": zeros,
    "half": half,
    "double": double,
    "growth": growth,
    "weekend": weekend,
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
    out.append(Scenario("gpu-busy", gpu_busy(), LA))
    out.append(Scenario("small", _with(code, "small", small(code, LA)), LA))
    out.append(Scenario("spiky-conv", _with(conv, "spiky-conv", spiky(conv, LA)), LA))
    out.append(Scenario("drift-code", _with(code, "drift-code", drift(code, LA)), LA))
    out.append(Scenario("reason-steps", reasoning_days(servegen["m-large"].start), SHANGHAI))
    return out


# ---------------------------------------------------------------------------------------------
# Runs

WEEK = timedelta(days=7)
CURVE = (0, 5, 10, 30, 60)  # the budgets of ``--curve``, breach minutes per rolling 7 days
CACHE_VERSION = 2  # 2: every run keeps its worst rolling 7 days ("week")
SAVE_EVERY = 60.0  # seconds between the cache's writes while runs finish


Key = tuple[str, str, int | None]  # a run: scenario, label, budget (None: without one)


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    label: str
    strategy: str
    params: dict[str, Any]
    slo: model.Slo | None = None

    @property
    def budget(self) -> int | None:
        return None if self.slo is None else self.slo.max_breach_minutes

    @property
    def key(self) -> Key:
        return self.scenario.name, self.label, self.budget


@dataclass(frozen=True)
class Outcome:
    """One run: its point (harvest, breach minutes, reclaims) and the most breach minutes any
    rolling 7 days held (``week``), whatever budget it ran with (``budget``, None for none)."""

    scenario: str
    budget: int | None
    point: Point
    week: int

    @property
    def key(self) -> Key:
        """The run it is, as its ``Job.key`` names it."""
        return self.scenario, self.point.label, self.budget


def jobs(
    chosen: Sequence[Scenario],
    default: tuple[str, dict[str, Any]],
    budgets: Sequence[int | None] = (None,),
    guarded: Sequence[int] = (),
) -> list[Job]:
    """The default once per budget (None: without one), then the watermark and the grid, and
    the grid again with each of the ``guarded`` budgets."""
    out = []
    for s in chosen:
        out += [Job(s, "default", *default, _slo(b)) for b in budgets]
        out.append(Job(s, "watermark", "watermark", {}))
        out += [
            Job(s, name, "peak", params, _slo(b))
            for b in (None, *guarded)
            for name, params in frontier.grid()
        ]
    return out


def _slo(budget: int | None) -> model.Slo | None:
    return None if budget is None else model.Slo(budget)


def run(job: Job) -> Outcome:
    """The job's point and its worst rolling 7 days."""
    pool = engine.PoolModel(zone=job.scenario.zone)
    strategy = registry.build(job.strategy, job.params)
    done = engine.run(job.scenario.trace, strategy, pool, slo=job.slo)
    figures = done.figures
    point = Point(job.label, figures.harvest_ratio, figures.breach_minutes, figures.reclaims)
    week = engine.most_spent(done.timeline, pool.calibrate(job.scenario.trace), WEEK)
    return Outcome(job.scenario.name, job.budget, point, week)


def nearest(target: Point, points: Sequence[Point]) -> Point:
    """The grid point closest to ``target``: harvest in tenths, breach minutes in tens."""
    return min(
        points,
        key=lambda p: math.hypot(
            (p.harvest - target.harvest) * 10, (p.breach - target.breach) / 10
        ),
    )


def best_within(budget: int, grid: Sequence[Outcome]) -> Outcome | None:
    """The grid run with the most harvest whose worst rolling 7 days hold at most ``budget``,
    chosen in hindsight over the whole trace (the grid itself runs without a budget); None when
    every one overspends. Ties go to the fewer breach minutes, then to the label."""
    fit = [o for o in grid if o.week <= budget]
    if not fit:
        return None
    return min(fit, key=lambda o: (-o.point.harvest, o.point.breach, o.point.label))


def ratio(default: Outcome, best: Outcome | None) -> float | None:
    """The default's harvest over the best grid point's within the budget (None: no such
    point; 1 when both harvest nothing)."""
    if best is None:
        return None
    if best.point.harvest <= 0:
        return 1.0 if default.point.harvest <= 0 else math.inf
    return default.point.harvest / best.point.harvest


TARGET = 0.9  # the default's harvest over the guarded best's, at least


@dataclass(frozen=True)
class Verdict:
    """The default under one budget on one scenario, against its two yardsticks: the guarded
    best (``guarded``: the best grid point run through the same planner with the same budget,
    the target, ``TARGET`` of its harvest) and the hindsight best (``best``: the best grid
    point run without a budget whose worst week held the budget, the limit, with no target).
    ``guarded`` is None when the grid did not run with the budget (``--no-guarded``)."""

    scenario: str
    budget: int
    default: Outcome
    best: Outcome | None
    ratio: float | None = field(default=None)
    guarded: Outcome | None = None
    guarded_ratio: float | None = None

    @property
    def overspent(self) -> bool:
        return self.default.week > self.budget

    @property
    def short(self) -> bool:
        """Under the target: less than ``TARGET`` of the guarded best's harvest."""
        return self.guarded_ratio is not None and self.guarded_ratio < TARGET


def verdicts(
    budget: int,
    defaults: dict[str, Outcome],
    grids: dict[str, list[Outcome]],
    guarded: dict[str, list[Outcome]] | None = None,
) -> list[Verdict]:
    """``grids``: per scenario the grid without a budget; ``guarded``: with this one."""
    out = []
    for name, default in defaults.items():
        best = best_within(budget, grids[name])
        same = None if guarded is None else best_within(budget, guarded[name])
        out.append(
            Verdict(name, budget, default, best, ratio(default, best), same, ratio(default, same))
        )
    return out


def plot(
    name: str, default: Point, others: Sequence[Point], grid: Sequence[Point], out: Path
) -> None:
    """Harvest against breach minutes: ``DIR/<scenario>.svg``."""
    strategies = [*others, replace(default, label="default")]
    chart = frontier.draw((70, 40, 560, 300), strategies, grid, highlight="default")
    chart.title(name, 11)
    (out / f"{name}.svg").write_text(charts.page(660, 390, chart.parts))


def plot_curve(name: str, rows: Sequence[Verdict], strategy: str, out: Path) -> None:
    """Harvest against the budget: the default run with each budget, and the best grid point
    within it in hindsight: ``DIR/<scenario>-curve.svg``."""
    points = [
        frontier.CurvePoint(
            v.budget,
            v.default.point.harvest,
            not v.overspent,
            None if v.best is None else v.best.point.harvest,
        )
        for v in rows
    ]
    chart = frontier.draw_curve((70, 40, 560, 300), strategy, points, window_days=7)
    chart.title(f"{name}: harvest against the budget", 11)
    (out / f"{name}-curve.svg").write_text(charts.page(660, 390, chart.parts))


def _load(path: Path | None) -> dict[Key, Outcome]:
    """The cached runs; a cache of another version (before ``week`` was kept) is ignored, and
    its runs are made again. A run without a ``budget`` ran without one."""
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    runs = (
        Outcome(
            r["scenario"],
            r.get("budget"),
            Point(r["label"], r["harvest"], r["breach"], r["reclaims"]),
            r["week"],
        )
        for r in data["runs"]
    )
    return {o.key: o for o in runs}


def collect(
    outcomes: Iterable[Outcome],
    cached: dict[Key, Outcome],
    path: Path | None,
    every: float = SAVE_EVERY,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """The ``outcomes`` as they finish, each but the default's kept in ``cached``, and the cache
    written to ``path`` at most ``every`` seconds apart and once more when they end or stop
    (an error, an interrupt): the runs already made are not lost."""
    fresh: list[Outcome] = []
    written = clock()
    try:
        for o in outcomes:
            fresh.append(o)
            if o.point.label != "default":
                cached[o.key] = o
            if path is not None and clock() - written >= every:
                _save(path, cached)
                written = clock()
    finally:
        if path is not None:
            _save(path, cached)
    return fresh


def _save(path: Path, cached: dict[Key, Outcome]) -> None:
    rows = [
        {
            "scenario": o.scenario,
            "label": o.point.label,
            **({} if o.budget is None else {"budget": o.budget}),
            "harvest": o.point.harvest,
            "breach": o.point.breach,
            "reclaims": o.point.reclaims,
            "week": o.week,
        }
        for _, o in sorted(cached.items(), key=lambda kv: _order(kv[0]))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"version": CACHE_VERSION, "runs": rows}, indent=0), encoding="utf-8"
    )


def _order(key: Key) -> tuple[str, str, int]:
    name, label, budget = key
    return name, label, -1 if budget is None else budget


def _budgets(text: str) -> list[int]:
    budgets = sorted({int(b) for b in text.split(",") if b.strip()})
    if any(b < 0 for b in budgets):
        raise argparse.ArgumentTypeError(f"budgets are minutes, 0 or more: {text}")
    return budgets


def _fmt(value: float | None) -> str:
    return "   -" if value is None else f"{value:5.3f}"


def print_domination(
    chosen: Sequence[Scenario],
    defaults: dict[str, Outcome],
    cached: dict[Key, Outcome],
    plots: Path | None,
) -> list[str]:
    """The unbudgeted report: the default without a budget against the grid. Returns the
    scenarios where the default is dominated."""
    print(
        f"{'scenario':16} {'harvest':>7} {'breach':>6} {'7d max':>6}  "
        f"{'nearest grid point':28} dominated by"
    )
    dominated_on = []
    for s in chosen:
        mine = defaults[s.name]
        default = mine.point
        runs = [o for (n, _, b), o in cached.items() if n == s.name and b is None]
        grid = [o.point for o in runs if o.point.label != "watermark"]
        others = [o.point for o in runs if o.point.label == "watermark"]
        beaten = frontier.dominating(default, grid)
        close = nearest(default, grid)
        if beaten:
            dominated_on.append(s.name)
        shown = ", ".join(f"{p.label} ({p.harvest:.3f}, {p.breach})" for p in beaten[:3])
        print(
            f"{s.name:16} {default.harvest:7.3f} {default.breach:6d} {mine.week:6d}  "
            f"{close.label:15} ({close.harvest:.3f}, {close.breach:4d})  {shown or '-'}"
        )
        if plots:
            plot(s.name, default, others, grid, plots)
    return dominated_on


def print_budget(budget: int, rows: Sequence[Verdict], guarded: bool = True) -> None:
    """Per scenario, the default with ``budget`` against its two yardsticks, both ratios as
    columns, then the summary line (``budget_summary``). Without ``guarded`` (the grid did not
    run with the budget) the target's columns say so."""
    print(
        f"\nerror budget {budget} breach min per rolling 7 days: the default with it against "
        f"the guarded best (the best grid point run with it through the same planner: the "
        f"target, ratio >= {TARGET:g}) and the hindsight best (the best grid point run without "
        "a budget whose worst week held it: the limit, no target)"
    )
    print(
        f"{'scenario':16} {'harvest':>7} {'breach':>6} {'7d max':>6}  "
        f"{'guarded best':18} {'harvest':>7} {'7d max':>6}  {'ratio':>5}  "
        f"{'hindsight best':18} {'harvest':>7} {'7d max':>6}  {'ratio':>5}"
    )
    for v in rows:
        d = v.default
        marks = f"  under {TARGET:g}" if v.short else ""
        marks += f"  FAIL: 7d max {d.week} > {budget}" if v.overspent else ""
        target = f"{_best(v.guarded)}  {_fmt(v.guarded_ratio)}"
        if not guarded:
            target = f"{'not run':18} {'-':>7} {'-':>6}  {_fmt(None)}"
        print(
            f"{v.scenario:16} {d.point.harvest:7.3f} {d.point.breach:6d} {d.week:6d}  "
            f"{target}  {_best(v.best)}  {_fmt(v.ratio)}{marks}"
        )
    print(budget_summary(budget, rows, guarded))


def budget_summary(budget: int, rows: Sequence[Verdict], guarded: bool = True) -> str:
    """One line: the least ratio to the guarded best and the scenarios under ``TARGET`` of it,
    the least ratio to the hindsight best (a limit: no scenario is named against it), and the
    default's worst rolling week, FAIL where it is above ``budget``."""
    if guarded:
        short = [v.scenario for v in rows if v.short]
        target = (
            f"against the guarded best {_least([(v.guarded_ratio, v.scenario) for v in rows])}, "
            f"under {TARGET:g} on {len(short)}: {', '.join(short) or 'none'}"
        )
    else:
        target = "the guarded best not run (--no-guarded)"
    limit = _least([(v.ratio, v.scenario) for v in rows])
    worst = max(rows, key=lambda v: (v.default.week, v.scenario), default=None)
    week = "-" if worst is None else f"{worst.default.week} ({worst.scenario})"
    over = [v.scenario for v in rows if v.overspent]
    kept = f"FAIL, above {budget} on {', '.join(over)}" if over else "every week kept"
    return (
        f"budget {budget}: {target}; against the hindsight best (the limit) {limit}; "
        f"the default's worst week {week}: {kept}"
    )


def _best(best: Outcome | None) -> str:
    if best is None:
        return f"{'none':18} {'-':>7} {'-':>6}"
    return f"{best.point.label[5:]:18} {best.point.harvest:7.3f} {best.week:6d}"


def _least(ratios: Sequence[tuple[float | None, str]]) -> str:
    """The least ratio, and the scenario it is on."""
    least = min(((r, name) for r, name in ratios if r is not None), default=None)
    return "least ratio " + ("-" if least is None else f"{least[0]:.3f} ({least[1]})")


def print_curve(rows: Sequence[Verdict]) -> None:
    """The trade curve: per scenario, per budget, the default against the best grid point."""
    budgets = sorted({v.budget for v in rows})
    print("\nthe trade curve: harvest / 7d max of the default with budget B, then of the best")
    print("grid point within B (hindsight), and the ratio")
    print(f"{'scenario':16} " + " ".join(f"{'B=' + str(b):>24}" for b in budgets))
    for name in dict.fromkeys(v.scenario for v in rows):
        cells = []
        for b in budgets:
            v = next(v for v in rows if v.scenario == name and v.budget == b)
            best = "-" if v.best is None else f"{v.best.point.harvest:.3f}/{v.best.week}"
            mark = "!" if v.overspent else " "
            mine = f"{v.default.point.harvest:.3f}/{v.default.week}{mark}"
            cells.append(f"{mine} {best} {_fmt(v.ratio).strip():>5}")
        print(f"{name:16} " + " ".join(f"{c:>24}" for c in cells))
    print("(! marks a week above B: FAIL)")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="", help="comma-separated names (default: all)")
    parser.add_argument("--strategy", default=registry.DEFAULT, choices=registry.names())
    parser.add_argument("--params", default="{}", help="the default's parameters, as JSON")
    parser.add_argument("--plots", type=Path, help="write a plot per scenario here")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--slo",
        type=_budgets,
        default=[],
        help="error budgets, breach minutes per rolling 7 days, comma-separated (10,30): the "
        "default runs once with each, and is judged against the guarded best (the grid run "
        "with it: the target) and the hindsight best (the grid run without: the limit)",
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help=f"the trade curve: add the budgets {', '.join(map(str, CURVE))} and print the "
        "default against the best grid point within each, per scenario (with --plots, a "
        "harvest-against-budget plot per scenario)",
    )
    parser.add_argument(
        "--guarded",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the grid with each --slo budget too (the planner holds every grid point to "
        "it, as it holds the default) for the guarded best, the target; --no-guarded skips "
        "those runs (one per grid point, scenario and budget) and the target with them",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="keep the runs of everything but the default in this JSON file, and reuse them "
        "(delete it when the scenarios, the simulator or another strategy change)",
    )
    return parser


def main() -> int:
    started = time.perf_counter()  # the whole run: the scenarios' making and the plots too
    args = arguments().parse_args()
    every = scenarios()
    wanted = set(filter(None, args.scenarios.split(",")))
    chosen = [s for s in every if not wanted or s.name in wanted]
    budgets = sorted(set(args.slo) | (set(CURVE) if args.curve else set()))
    guarded = args.slo if args.guarded else []
    cached = _load(args.cache)
    default = (args.strategy, json.loads(args.params))
    todo = [
        j
        for j in jobs(chosen, default, [None, *budgets], guarded)
        if j.label == "default" or j.key not in cached
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as workers:
        fresh = collect(workers.map(run, todo), cached, args.cache)
    chosen_names = {s.name for s in chosen}
    cached = {key: o for key, o in cached.items() if key[0] in chosen_names}
    defaults = {
        b: {o.scenario: o for o in fresh if o.point.label == "default" and o.budget == b}
        for b in [None, *budgets]
    }
    grids: dict[int | None, dict[str, list[Outcome]]] = {
        b: {s.name: [] for s in chosen} for b in [None, *guarded]
    }
    for (name, label, b), o in cached.items():
        if label.startswith("peak w=") and b in grids:
            grids[b][name].append(o)
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
    print(f"default: {args.strategy} {args.params}, without a budget")
    dominated_on = print_domination(chosen, defaults[None], cached, args.plots)
    judged = {b: verdicts(b, defaults[b], grids[None], grids.get(b)) for b in budgets}
    for b in args.slo:
        print_budget(b, judged[b], args.guarded)
    if args.curve:
        rows = [v for b in budgets for v in judged[b]]
        print_curve(rows)
        if args.plots:
            for s in chosen:
                mine = [v for v in rows if v.scenario == s.name]
                plot_curve(s.name, mine, args.strategy, args.plots)
    failed = sorted({v.scenario for b in budgets for v in judged[b] if v.overspent})
    short = sorted({v.scenario for b in args.slo for v in judged[b] if v.short})
    print(
        f"\n{len(chosen)} scenarios, {len(fresh)} runs "
        f"({len(cached) - sum(1 for o in fresh if o.point.label != 'default')} from the cache); "
        f"without a budget the default is dominated on {len(dominated_on)}: "
        f"{', '.join(dominated_on) or 'none'}"
        + (f"; under {TARGET:g} of the guarded best on {', '.join(short)}" if short else "")
        + (f"; FAIL: a week above its budget on {', '.join(failed)}" if failed else "")
    )
    print(f"the whole run: {time.perf_counter() - started:.0f} s")
    return 1 if dominated_on or failed else 0


if __name__ == "__main__":
    sys.exit(main())
