"""The trade between harvest and breach minutes, and the frontier a simple rule reaches.

The yardstick is the ``peak`` rule (``strategies/peak.py``): keep what the largest demand of the
last ``w`` minutes needs, with a margin ``k``. Run over a grid of ``w`` and ``k``, its points that
no other dominates are the frontier: what a few lines of rule reach on this load. A strategy
below it gives up harvest or breaches for nothing. ``rebalancer simulate`` draws it in its report
and ``bench/robustness.py`` holds the default strategy to it on every scenario.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.sim import charts

WINDOWS = (10, 30, 60, 120)  # minutes
MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # the robustness grid
REPORT_MARGINS = (0.0, 0.1, 0.2, 0.5, 1.0)  # a coarser one for ``rebalancer simulate``
HARVEST_STEP = 0.01  # harvests closer than this are the same harvest


@dataclass(frozen=True)
class Point:
    """One run: its harvest (of the oracle's) and breach minutes (or, against an error budget,
    the most any rolling window of it spent)."""

    label: str
    harvest: float
    breach: int
    reclaims: int = 0

    def dominates(self, other: Point) -> bool:
        """At least ``HARVEST_STEP`` more harvest and no more breach minutes, or the same
        harvest (within the step either way) and fewer breach minutes. A harvest lead under
        the step is noise (the figures are rounded to 4 places, and runs of near-equal rules
        differ by less): it neither dominates at equal breach minutes nor protects a point
        that breaches more. The lead is rounded to 9 places first, so that a lead of exactly
        the step (0.95 over 0.94) is not lost to binary floating point."""
        lead = round(self.harvest - other.harvest, 9)
        return (lead >= HARVEST_STEP and self.breach <= other.breach) or (
            lead > -HARVEST_STEP and self.breach < other.breach
        )


def label(window: int, margin: float) -> str:
    return f"peak w={window} k={margin:g}"


def grid(
    windows: Sequence[int] = WINDOWS, margins: Sequence[float] = MARGINS
) -> list[tuple[str, dict[str, Any]]]:
    """The peak rule's grid: (label, parameters) for every window and margin."""
    return [(label(w, k), {"window_minutes": w, "margin": k}) for w in windows for k in margins]


def frontier(points: Sequence[Point]) -> list[Point]:
    """The points no other dominates, by breach minutes then harvest."""
    kept = [p for p in points if not any(q.dominates(p) for q in points)]
    return sorted(kept, key=lambda p: (p.breach, -p.harvest))


def dominating(target: Point, points: Sequence[Point]) -> list[Point]:
    """The points that dominate ``target``, most harvest first."""
    return sorted((p for p in points if p.dominates(target)), key=lambda p: -p.harvest)


STRATEGY_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
Box = tuple[float, float, float, float]  # left, top, width, height on the page


def draw(
    box: Box,
    strategies: Sequence[Point],
    rule: Sequence[Point],
    budget: int | None = None,
    highlight: str | None = None,
    xlabel: str = "breach minutes",
) -> charts.Chart:
    """Harvest against breach minutes: the rule's grid as dots, its frontier as a line, each
    strategy as a square (``highlight`` as a star), and the error budget as a dashed line."""
    every = [*rule, *strategies]
    most = max([p.breach for p in every] + [budget or 0, 10])
    top = max([p.harvest for p in every] + [0.1])
    chart = charts.Chart.of(box, (0, most * 1.05), (0, top * 1.08), xlog=10)
    chart.y_ticks(charts.nice_ticks(0, top * 1.08, 5), "harvest (of the oracle's)")
    ticks = charts.symlog_ticks(most, 10)
    chart.x_ticks([(t, f"{t:g}", f"{t:g}") for t in ticks], xlabel)
    chart.marks("peak grid", "#999999", [(p.breach, p.harvest) for p in rule], "circle", 2)
    edge = frontier(rule)
    chart.line("frontier", "#4d4d4d", [(p.breach, p.harvest) for p in edge])
    legend = [("#999999", "peak grid"), ("#4d4d4d", "frontier")]
    others = itertools.cycle(STRATEGY_COLOURS)
    for p in strategies:
        star = p.label == highlight
        colour = "crimson" if star else next(others)
        shape = "star" if star else "square"
        chart.marks(p.label, colour, [(p.breach, p.harvest)], shape, 4)
        legend.append((colour, p.label))
    if budget is not None:
        chart.vline(budget, "budget", "#d62728")
        legend.append(("#d62728", f"budget ({budget} min)"))
    chart.frame()
    chart.legend(legend)
    return chart


@dataclass(frozen=True)
class CurvePoint:
    """A strategy's harvest with an error budget, whether it kept that budget, and the best
    grid point's harvest within it (None: no grid point kept it)."""

    budget: int
    harvest: float
    kept: bool
    best: float | None


def draw_curve(
    box: Box, strategy: str, points: Sequence[CurvePoint], window_days: float
) -> charts.Chart:
    """Harvest against the error budget: the strategy as one line, the best grid point within
    each budget (in hindsight) as another; "over" marks a budget the strategy overspent."""
    points = sorted(points, key=lambda p: p.budget)
    budgets = [p.budget for p in points]
    top = max([p.harvest for p in points] + [p.best or 0 for p in points] + [0.1])
    chart = charts.Chart.of(box, (0, max([*budgets, 5]) * 1.05), (0, top * 1.08), xlog=5)
    chart.y_ticks(charts.nice_ticks(0, top * 1.08, 5), "harvest (of the oracle's)")
    label = f"error budget (breach minutes per rolling {window_days:g} days)"
    chart.x_ticks([(b, str(b), str(b)) for b in budgets], label)
    chart.line(strategy, "crimson", [(p.budget, p.harvest) for p in points], marker="circle")
    best = [(p.budget, p.best) for p in points if p.best is not None]
    chart.line("best within", "#4d4d4d", best, dash="5,3", marker="square")
    for p in points:
        if not p.kept:
            chart.note(p.budget, p.harvest, "over", "crimson")
    chart.frame()
    chart.legend(
        [("crimson", strategy), ("#4d4d4d", "best peak grid point within the budget (hindsight)")]
    )
    return chart
