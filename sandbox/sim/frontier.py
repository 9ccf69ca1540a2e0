"""The trade between harvest and breach minutes, and the frontier a simple rule reaches.

The yardstick is the ``peak`` rule (``strategies/peak.py``): keep what the largest demand of the
last ``w`` minutes needs, with a margin ``k``. Run over a grid of ``w`` and ``k``, its points that
no other dominates are the frontier: what a few lines of rule reach on this load. A strategy
below it gives up harvest or breaches for nothing. ``rebalancer simulate`` draws it in its report
and ``bench/robustness.py`` holds the default strategy to it on every scenario.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

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


def draw(
    ax: Axes,
    strategies: Sequence[Point],
    rule: Sequence[Point],
    budget: int | None = None,
    highlight: str | None = None,
) -> None:
    """Harvest against breach minutes: the rule's grid as dots, its frontier as a line, each
    strategy as a marker (``highlight`` as a star), and the error budget as a vertical line."""
    ax.scatter(
        [p.breach for p in rule], [p.harvest for p in rule], s=12, c="0.6", label="peak grid"
    )
    edge = frontier(rule)
    ax.plot([p.breach for p in edge], [p.harvest for p in edge], c="0.3", lw=1, label="frontier")
    for p in strategies:
        star = p.label == highlight
        ax.scatter(
            [p.breach],
            [p.harvest],
            s=90 if star else 36,
            marker="*" if star else "s",
            c="crimson" if star else None,
            label=p.label,
            zorder=3,
        )
    if budget is not None:
        ax.axvline(budget, c="tab:red", ls="--", lw=1, label=f"budget ({budget} min)")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_ylabel("harvest (of the oracle's)")
    ax.legend(fontsize=7, loc="lower right", ncol=2)


@dataclass(frozen=True)
class CurvePoint:
    """A strategy's harvest with an error budget, whether it kept that budget, and the best
    grid point's harvest within it (None: no grid point kept it)."""

    budget: int
    harvest: float
    kept: bool
    best: float | None


def draw_curve(ax: Axes, strategy: str, points: Sequence[CurvePoint], window_days: float) -> None:
    """Harvest against the error budget: the strategy as one line, the best grid point within
    each budget (in hindsight) as another; "over" marks a budget the strategy overspent."""
    points = sorted(points, key=lambda p: p.budget)
    budgets = [p.budget for p in points]
    ax.plot(budgets, [p.harvest for p in points], "o-", c="crimson", label=strategy)
    best = [(p.budget, p.best) for p in points if p.best is not None]
    ax.plot(
        [b for b, _ in best],
        [h for _, h in best],
        "s--",
        c="0.3",
        label="best peak grid point within the budget (hindsight)",
    )
    for p in points:
        if not p.kept:
            ax.annotate("over", (p.budget, p.harvest), color="crimson", fontsize=7)
    ax.set_xscale("symlog", linthresh=5)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel(f"error budget (breach minutes per rolling {window_days:g} days)")
    ax.set_ylabel("harvest (of the oracle's)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
