"""The demo's day as a picture: an SVG written by hand (``sandbox.sim.charts``, as the
simulator's report), so the demo needs no plotting library.

One panel per pool, the day along x (hours of UTC), nodes along y: the demand in nodes' worth
(the demand over the pool's calibrated ``rps_per_node``), the warm serving nodes, the nodes
lent, and a mark at the bottom for each minute the controller took nodes back, taller for more.
Each line is an SVG ``polyline`` with ``data-pool`` and ``data-series``, a point per replayed
minute, and each mark a ``line`` with ``data-minute`` and ``data-nodes``, so a reader (or a
test) can take the figures back from it; the same series are ``series`` in demo.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from xml.sax.saxutils import quoteattr
from zoneinfo import ZoneInfo

from sandbox.sim import charts

WIDTH = 960.0
LEFT, RIGHT = 48.0, 16.0  # room for the node counts, and a margin
PANEL = 180.0  # height of a panel's plot area
ABOVE, BELOW = 24.0, 28.0  # a panel's title above it, the hours below
COLOURS = {"demand": "#888888", "serving": "#1f77b4", "lent": "#2ca02c", "reclaims": "#d62728"}
LABELS = {
    "demand": "demand, in nodes' worth",
    "serving": "serving (warm)",
    "lent": "lent",
    "reclaims": "reclaims",
}
UTC = ZoneInfo("UTC")


@dataclass(frozen=True)
class Panel:
    """One pool's day, a value per replayed minute from ``start``."""

    pool: str
    title: str
    size: int  # the pool's nodes: the top of the y axis
    start: datetime
    demand: Sequence[float | None]  # in nodes' worth; None where the trace has a gap
    serving: Sequence[int]
    lent: Sequence[int]
    reclaims: Sequence[int]  # nodes the controller took back in that minute


def _panel(p: Panel, top: float) -> list[str]:
    minutes = len(p.serving)
    chart = charts.Chart.of(
        (LEFT, top, WIDTH - LEFT - RIGHT, PANEL), (0, max(1, minutes - 1)), (0, max(1, p.size))
    )
    chart.title(p.title)
    chart.frame()
    chart.y_ticks(sorted({0, p.size // 2, p.size}))
    chart.x_ticks(charts.time_ticks(p.start, minutes, UTC))
    pool = f"data-pool={quoteattr(p.pool)}"
    for series, values in (("demand", p.demand), ("serving", p.serving), ("lent", p.lent)):
        chart.line(series, COLOURS[series], list(enumerate(values)), width=1.5, data=pool)
    base = chart.y(0)
    chart.parts += [
        f'<line {pool} data-series="reclaims" data-minute="{i}" data-nodes="{n}" '
        f'x1="{chart.x(i):.1f}" x2="{chart.x(i):.1f}" y1="{base:.1f}" '
        f'y2="{base - 8 - 4 * n:.1f}" stroke="{COLOURS["reclaims"]}" stroke-width="1.5"/>'
        for i, n in enumerate(p.reclaims)
        if n > 0
    ]
    chart.legend([(COLOURS[series], label) for series, label in LABELS.items()])
    return chart.parts


def svg(panels: Sequence[Panel], title: str) -> str:
    """The SVG document: ``title``, then the panels one under another."""
    height = 32 + len(panels) * (ABOVE + PANEL + BELOW)
    body = [charts.text(LEFT, 20, title, size=15, bold=True)]
    for i, p in enumerate(panels):
        body += _panel(p, 32 + ABOVE + i * (ABOVE + PANEL + BELOW))
    return charts.page(WIDTH, height, body)
