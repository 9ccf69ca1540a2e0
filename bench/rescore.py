"""An independent re-scorer: recount a simulator run's warm capacity, breach minutes and worst
rolling 7 days from first principles, and say where the simulator's timeline disagrees.

Why: the error budget is a hard property (a budgeted run must never spend more than its budget
in any rolling 7 days), and the only witness of it so far is the simulator counting its own
minutes. This module shares none of that code: not ``engine.breached``, not
``engine.most_spent``, not the fake pool's clocks. From the run it takes only what the pool
was told to do, the lent count per minute, and rebuilds the rest from docs/evaluation.md:

- a node lent at minute ``t`` is away from ``t`` (lending is instant);
- a node reclaimed at minute ``t`` serves again at ``t + drain + warmup`` (2 + 5 = 7 minutes by
  default): it is returning at ``t`` to ``t + 6`` and warm at ``t + 7``;
- the lends and reclaims of minute ``t`` are the rise and the fall of the lent count from
  ``t - 1`` (the planner never lends and reclaims in one tick, and a lend takes a warm node
  while one is left, else the node on its way back that was reclaimed first: the planner lends
  a warming node only as a last resort);
- a minute breaches when ``c * serving < r``, compared exactly (rationals, no tolerance); a
  minute without a sample (``None``) never does;
- the worst rolling 7 days: the most breach minutes in any window of exactly 10,080 minutes
  ending at a minute of the run, minutes ``t - 10079`` to ``t``. That is also what
  ``engine.most_spent`` counts (it drops minute ``s`` once ``s <= t - 10080``) and what the
  planner's budget sees before deciding minute ``t`` (minutes ``t - 10079`` to ``t - 1``).

Besides the first-principles count it reports two readings a different counter might make,
so that a disagreement can be told from a convention: a window of 10,081 minutes (both ends
inclusive: "from ``t`` minus 7 days to ``t``"), and gap minutes holding the last sample (the
file's rows as step values) rather than being unknown.

    .venv/bin/python bench/rescore.py --strategy adaptive --slo 10 [--scenarios m-large,...]
        [--trace examples/traces/servegen_m-mid.csv ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine, traces
from sandbox.sim.traces import MINUTE

WEEK_MINUTES = 7 * 24 * 60  # 10,080
SHANGHAI = "Asia/Shanghai"


# ---------------------------------------------------------------------------------------------
# The count, from first principles


def steps(lent: Sequence[int]) -> tuple[list[int], list[int]]:
    """(lends, reclaims) per minute: the rise and the fall of the lent count."""
    before = [0, *lent[:-1]]
    lends = [max(0, now - then) for now, then in zip(lent, before, strict=True)]
    reclaims = [max(0, then - now) for now, then in zip(lent, before, strict=True)]
    return lends, reclaims


def serving(size: int, lent: Sequence[int], return_minutes: int = 7) -> list[int]:
    """Warm nodes per minute, given the lent count per minute: a reclaimed node is back after
    ``return_minutes``; a lend takes a warm node while one is left, else the earliest reclaimed
    node still on its way back."""
    lends, reclaims = steps(lent)
    back: list[int] = []  # the minute each returning node is warm again, earliest first
    out = []
    for t, (lend, reclaim) in enumerate(zip(lends, reclaims, strict=True)):
        back = [b for b in back if b > t]
        warm_before = size - (lent[t - 1] if t else 0) - len(back)
        cold = max(0, lend - warm_before)  # lends that had to take a returning node
        back = back[cold:]
        back += [t + return_minutes] * reclaim
        out.append(size - lent[t] - len(back))
    return out


def breached(demand: float | None, rps_per_node: float, warm: int) -> bool:
    """``c * serving < r``, exactly: the floats as the rationals they are, no tolerance."""
    return demand is not None and Fraction(rps_per_node) * warm < Fraction(demand)


def worst_window(breach: Sequence[bool], span: int = WEEK_MINUTES) -> tuple[int, int]:
    """(most breach minutes in any ``span`` minutes ending at a minute, the first minute that
    ends such a window); (0, -1) when nothing breached."""
    total = [0]
    for b in breach:
        total.append(total[-1] + b)
    most, end = 0, -1
    for t in range(len(breach)):
        held = total[t + 1] - total[max(0, t + 1 - span)]
        if held > most:
            most, end = held, t
    return most, end


def held_gaps(demand: Sequence[float | None]) -> list[float | None]:
    """Each gap minute holding the last sample before it (leading gaps stay unknown)."""
    out: list[float | None] = []
    last = None
    for value in demand:
        last = value if value is not None else last
        out.append(last)
    return out


# ---------------------------------------------------------------------------------------------
# The comparison


@dataclass(frozen=True)
class Difference:
    index: int
    time: datetime
    demand: float | None
    sim_serving: int
    own_serving: int
    sim_breach: bool
    own_breach: bool


@dataclass(frozen=True)
class Rescore:
    name: str
    minutes: int
    differences: list[Difference]
    sim_breach: int
    own_breach: int
    sim_week: int  # engine.most_spent over 7 days
    own_week: int  # 10,080 minutes ending at each minute
    own_week_end: int
    inclusive_week: int  # 10,081 minutes: another counter's reading of "7 days"
    inclusive_week_end: int
    held_breach: int  # gap minutes holding the last sample
    held_week: int
    held_week_end: int
    gap_minutes: int

    @property
    def agrees(self) -> bool:
        return not self.differences and self.sim_week == self.own_week


def rescore(
    name: str,
    demand: Sequence[float | None],
    rps_per_node: float,
    timeline: Sequence[engine.Minute],
    return_minutes: int = 7,
    sim_week: int | None = None,
) -> Rescore:
    """Recount ``timeline`` (a simulator run of ``demand``) and compare. ``sim_week`` is the
    simulator's own worst week, computed here with ``engine.most_spent`` unless given."""
    size = timeline[0].serving + timeline[0].lent + timeline[0].returning
    lent = [m.lent for m in timeline]
    warm = serving(size, lent, return_minutes)
    own = [breached(r, rps_per_node, w) for r, w in zip(demand, warm, strict=True)]
    sim = [engine.breached(m, rps_per_node) for m in timeline]
    differences = [
        Difference(t, m.time, demand[t], m.serving, warm[t], sim[t], own[t])
        for t, m in enumerate(timeline)
        if m.serving != warm[t] or sim[t] != own[t]
    ]
    if sim_week is None:
        sim_week = engine.most_spent(timeline, rps_per_node, timedelta(days=7))
    week, end = worst_window(own)
    inclusive, inclusive_end = worst_window(own, WEEK_MINUTES + 1)
    held = [breached(r, rps_per_node, w) for r, w in zip(held_gaps(demand), warm, strict=True)]
    held_week, held_end = worst_window(held)
    return Rescore(
        name=name,
        minutes=len(timeline),
        differences=differences,
        sim_breach=sum(sim),
        own_breach=sum(own),
        sim_week=sim_week,
        own_week=week,
        own_week_end=end,
        inclusive_week=inclusive,
        inclusive_week_end=inclusive_end,
        held_breach=sum(held),
        held_week=held_week,
        held_week_end=held_end,
        gap_minutes=sum(1 for r in demand if r is None),
    )


def rescore_run(
    name: str, trace: traces.Trace, pool: engine.PoolModel, done: engine.Run
) -> Rescore:
    return rescore(
        name, trace.rps, pool.calibrate(trace), done.timeline, return_minutes=pool.return_minutes
    )


# ---------------------------------------------------------------------------------------------
# The command


@dataclass(frozen=True)
class Case:
    name: str
    trace: traces.Trace
    zone: str
    strategy: str
    params: dict[str, Any]
    budget: int | None


def check(case: Case) -> Rescore:
    pool = engine.PoolModel(zone=case.zone)
    slo = None if case.budget is None else model.Slo(case.budget)
    strategy = registry.build(case.strategy, case.params)
    done = engine.run(case.trace, strategy, pool, slo=slo)
    return rescore_run(case.name, case.trace, pool, done)


def _at(trace_start: datetime, index: int) -> str:
    return (trace_start + MINUTE * index).strftime("%Y-%m-%d %H:%M UTC")


def describe(found: Rescore, start: datetime, budget: int | None) -> list[str]:
    verdict = "agree" if found.agrees else "DISAGREE"
    over = budget is not None and max(found.own_week, found.sim_week) > budget
    lines = [
        f"{found.name:16} {verdict:8} breach sim {found.sim_breach:4d} own {found.own_breach:4d}"
        f"  week sim {found.sim_week:3d} own {found.own_week:3d}"
        + ("" if found.own_week_end < 0 else f" (ending {_at(start, found.own_week_end)})")
        + ("  OVER BUDGET" if over else "")
    ]
    if found.inclusive_week != found.own_week:
        lines.append(
            f"{'':16} a 10,081-minute window (both ends in) holds {found.inclusive_week}, ending "
            f"{_at(start, found.inclusive_week_end)} (index {found.inclusive_week_end})"
        )
    if found.held_week != found.own_week or found.held_breach != found.own_breach:
        lines.append(
            f"{'':16} with its {found.gap_minutes} gap minutes holding the last sample: "
            f"{found.held_breach} breach minutes, worst week {found.held_week}"
            + ("" if found.held_week_end < 0 else f" ending {_at(start, found.held_week_end)}")
        )
    for d in found.differences[:20]:
        lines.append(
            f"{'':16} minute {d.index} ({_at(start, d.index)}): demand {d.demand}, serving sim "
            f"{d.sim_serving} own {d.own_serving}, breach sim {d.sim_breach} own {d.own_breach}"
        )
    if len(found.differences) > 20:
        lines.append(f"{'':16} ... {len(found.differences) - 20} more minutes differ")
    return lines


def main() -> int:
    import robustness  # a sibling script, as ``request_floor`` imports ``scale``

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        help="also a trace file (time,rps), in the Asia/Shanghai zone; repeatable",
    )
    parser.add_argument("--strategy", default=registry.DEFAULT, choices=registry.names())
    parser.add_argument("--params", default="{}", help="the strategy's parameters, as JSON")
    parser.add_argument("--slo", type=int, help="the run's error budget (minutes per 7 days)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    wanted = set(filter(None, args.scenarios.split(",")))
    params = json.loads(args.params)
    cases = [
        Case(s.name, s.trace, s.zone, args.strategy, params, args.slo)
        for s in robustness.scenarios()
        if (not wanted and not args.trace) or s.name in wanted
    ]
    for path in args.trace:
        trace = traces.load(path)
        cases.append(Case(path.stem, trace, SHANGHAI, args.strategy, params, args.slo))
    with ProcessPoolExecutor(max_workers=args.jobs) as workers:
        found = list(workers.map(check, cases))
    print(
        f"{args.strategy} {args.params}, budget {args.slo}: each run recounted; windows of "
        "10,080 minutes ending at each minute (as engine.most_spent)"
    )
    for case, result in zip(cases, found, strict=True):
        print("\n".join(describe(result, case.trace.start, args.slo)))
    disagree = [r.name for r in found if not r.agrees]
    print(f"\n{len(found)} runs; the counts disagree on {len(disagree)}: {', '.join(disagree)}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
