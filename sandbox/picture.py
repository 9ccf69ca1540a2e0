"""The demo's day as a picture: an SVG written by hand, so the demo needs no plotting library.

One panel per pool, the day along x, nodes along y: the demand in nodes' worth (the demand over
the pool's calibrated ``rps_per_node``), the warm serving nodes, the nodes lent, and a mark at
the bottom for each minute the controller took nodes back. Each line is an SVG ``polyline``
with ``data-pool`` and ``data-series``, a point per replayed minute, so a reader (or a test)
can take the figures back from it; the same series are ``series`` in demo.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from xml.sax.saxutils import escape, quoteattr

WIDTH = 960.0
LEFT, RIGHT = 48.0, 16.0  # room for the node counts, and a margin
PANEL = 180.0  # height of a panel's plot area
ABOVE, BELOW = 40.0, 28.0  # a panel's title and legend above it, the hours below
COLOURS = {"demand": "#888888", "serving": "#1f77b4", "lent": "#2ca02c", "reclaims": "#d62728"}
LABELS = {
    "demand": "demand, in nodes' worth",
    "serving": "serving (warm)",
    "lent": "lent",
    "reclaims": "reclaims",
}


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


@dataclass(frozen=True)
class Frame:
    """Where a panel's values go: x by minute, y by nodes."""

    top: float
    minutes: int
    size: int

    def x(self, minute: int) -> float:
        return LEFT + minute * (WIDTH - LEFT - RIGHT) / max(1, self.minutes - 1)

    def y(self, nodes: float) -> float:
        return self.top + PANEL - nodes * PANEL / max(1, self.size)


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """The values as runs of (minute, value) with no gap in them."""
    runs: list[list[tuple[int, float]]] = []
    current: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, float(v)))
    if current:
        runs.append(current)
    return runs


def _polylines(f: Frame, pool: str, series: str, values: Sequence[float | None]) -> list[str]:
    out = []
    for run in _runs(values):
        points = " ".join(f"{f.x(i):.1f},{f.y(v):.2f}" for i, v in run)
        out.append(
            f'<polyline data-pool={quoteattr(pool)} data-series="{series}" fill="none" '
            f'stroke="{COLOURS[series]}" stroke-width="1.5" points="{points}"/>'
        )
    return out


def _reclaim_marks(f: Frame, pool: str, reclaims: Sequence[int]) -> list[str]:
    base = f.y(0)
    return [
        f'<line data-pool={quoteattr(pool)} data-series="reclaims" data-minute="{i}" '
        f'data-nodes="{n}" x1="{f.x(i):.1f}" x2="{f.x(i):.1f}" y1="{base:.1f}" '
        f'y2="{base - 8 - 4 * n:.1f}" stroke="{COLOURS["reclaims"]}" stroke-width="1.5"/>'
        for i, n in enumerate(reclaims)
        if n > 0
    ]


def _axes(f: Frame, start: datetime) -> list[str]:
    """Node counts on the left, an hour mark every three hours below (UTC)."""
    out = [
        f'<rect x="{LEFT}" y="{f.top}" width="{WIDTH - LEFT - RIGHT}" height="{PANEL}" '
        'fill="none" stroke="#cccccc"/>'
    ]
    for nodes in sorted({0, f.size // 2, f.size}):
        y = f.y(nodes)
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eeeeee"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{nodes}</text>'
        )
    first = (60 - start.minute) % 60
    for minute in range(first, f.minutes, 60):
        when = start + timedelta(minutes=minute)
        if when.hour % 3 == 0:
            x = f.x(minute)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" y2="{f.top + PANEL}" '
                'stroke="#eeeeee"/>'
                f'<text x="{x:.1f}" y="{f.top + PANEL + 16}" text-anchor="middle">'
                f"{when:%H:%M}</text>"
            )
    return out


def _legend(top: float) -> str:
    items, x = [], LEFT
    for series, label in LABELS.items():
        items.append(
            f'<rect x="{x}" y="{top - 10}" width="12" height="4" fill="{COLOURS[series]}"/>'
            f'<text x="{x + 16}" y="{top - 4}">{escape(label)}</text>'
        )
        x += 24 + 7 * len(label)
    return "".join(items)


def _panel(p: Panel, top: float) -> list[str]:
    f = Frame(top, len(p.serving), p.size)
    return [
        f'<text x="{LEFT}" y="{top - 22}" font-weight="bold">{escape(p.title)}</text>',
        _legend(top),
        *_axes(f, p.start),
        *_polylines(f, p.pool, "demand", p.demand),
        *_polylines(f, p.pool, "serving", [float(v) for v in p.serving]),
        *_polylines(f, p.pool, "lent", [float(v) for v in p.lent]),
        *_reclaim_marks(f, p.pool, p.reclaims),
    ]


def svg(panels: Sequence[Panel], title: str) -> str:
    """The SVG document: ``title``, then the panels one under another."""
    height = 32 + len(panels) * (ABOVE + PANEL + BELOW)
    body = [f'<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{escape(title)}</text>']
    for i, p in enumerate(panels):
        body += _panel(p, 32 + ABOVE + i * (ABOVE + PANEL + BELOW))
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:g}" height="{height:g}" '
        f'viewBox="0 0 {WIDTH:g} {height:g}" font-family="sans-serif" font-size="11">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )
