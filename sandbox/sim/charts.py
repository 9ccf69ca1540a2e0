"""Charts as SVG written by hand: the simulator's report needs no plotting library.

Importing and running a plotting library cost ``rebalancer simulate`` about a sixth of its CPU
(docs/design/simulator-speed.md); a report's charts are a few kinds of mark on a few kinds of
axis, and text is what a test (or a reader's script) can take the figures back from.

A ``Chart`` is one plot area: its box on the page, a scale for x and one for y, and the marks
drawn into it (``parts``). The marks of a series carry ``data-`` attributes naming it (and a
point's values); a time tick, the instant it stands for.
``page`` puts charts and text into one document.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from xml.sax.saxutils import escape, quoteattr
from zoneinfo import ZoneInfo

GRID, FRAME, TEXT = "#e5e5e5", "#bbbbbb", "#333333"


class Scale:
    """Values from ``low`` to ``high`` onto pixels from ``start`` to ``end``; with ``linthresh``
    logarithmic beyond it (symmetric log, as the breach minutes need: 0 to a few thousand)."""

    __slots__ = ("_origin", "_per", "linthresh")

    def __init__(
        self, low: float, high: float, start: float, end: float, linthresh: float | None = None
    ) -> None:
        self.linthresh = linthresh
        low_unit, high_unit = self._unit(low), self._unit(high)
        self._per = (end - start) / ((high_unit - low_unit) or 1.0)
        self._origin = start - low_unit * self._per  # the pixel of 0: one multiply a value

    def _unit(self, v: float) -> float:
        if self.linthresh is None:
            return v
        if abs(v) <= self.linthresh:
            return v / self.linthresh
        return math.copysign(1 + math.log10(abs(v) / self.linthresh), v)

    def __call__(self, v: float) -> float:
        return self._origin + (v if self.linthresh is None else self._unit(v)) * self._per


@dataclass
class Chart:
    """One plot area: ``left``/``top`` its corner on the page, ``x`` and ``y`` its scales."""

    left: float
    top: float
    width: float
    height: float
    x: Scale
    y: Scale
    parts: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        box: tuple[float, float, float, float],
        xs: tuple[float, float],
        ys: tuple[float, float],
        xlog: float | None = None,
    ) -> Chart:
        """A chart in ``box`` (left, top, width, height) showing ``xs`` by ``ys``."""
        left, top, width, height = box
        x = Scale(xs[0], xs[1], left, left + width, xlog)
        return cls(left, top, width, height, x, Scale(ys[0], ys[1], top + height, top))

    def frame(self) -> None:
        self.parts.append(
            f'<rect x="{self.left:.1f}" y="{self.top:.1f}" width="{self.width:.1f}" '
            f'height="{self.height:.1f}" fill="none" stroke="{FRAME}"/>'
        )

    def title(self, text: str, size: int = 12) -> None:
        self.parts.append(
            f'<text x="{self.left:.1f}" y="{self.top - 6:.1f}" font-size="{size}" '
            f'font-weight="bold">{escape(text)}</text>'
        )

    def y_ticks(self, ticks: Iterable[float], label: str = "") -> None:
        """A grid line and a label per tick of y, and the axis' ``label`` beside them."""
        for v in ticks:
            at = self.y(v)
            self.parts.append(
                f'<line x1="{self.left:.1f}" x2="{self.left + self.width:.1f}" y1="{at:.1f}" '
                f'y2="{at:.1f}" stroke="{GRID}"/><text x="{self.left - 4:.1f}" y="{at + 4:.1f}" '
                f'text-anchor="end">{v:g}</text>'
            )
        if label:
            mid = self.top + self.height / 2
            self.parts.append(
                f'<text transform="translate({self.left - 34:.1f},{mid:.1f}) rotate(-90)" '
                f'text-anchor="middle">{escape(label)}</text>'
            )

    def x_ticks(self, ticks: Iterable[tuple[float, str, str]], label: str = "") -> None:
        """A grid line and a label per tick of x, each (value, label, what it stands for: the
        ``data-at`` a reader takes the value back from), and the axis' ``label`` below."""
        bottom = self.top + self.height
        for v, text, at in ticks:
            x = self.x(v)
            self.parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.top:.1f}" y2="{bottom:.1f}" '
                f'stroke="{GRID}"/><text class="tick" data-at={quoteattr(at)} x="{x:.1f}" '
                f'y="{bottom + 13:.1f}" text-anchor="middle">{escape(text)}</text>'
            )
        if label:
            self.parts.append(
                f'<text x="{self.left + self.width / 2:.1f}" y="{bottom + 28:.1f}" '
                f'text-anchor="middle">{escape(label)}</text>'
            )

    def span(self, low: float, high: float, colour: str, data: str) -> None:
        """A band over the whole height from x ``low`` to ``high``."""
        x0, x1 = self.x(low), self.x(high)
        self.parts.append(
            f'<rect {data} x="{x0:.2f}" y="{self.top:.1f}" width="{x1 - x0:.2f}" '
            f'height="{self.height:.1f}" fill="{colour}" fill-opacity="0.2"/>'
        )

    def steps(self, series: str, colour: str, low: Sequence[float], high: Sequence[float]) -> None:
        """The band between ``low`` and ``high``, one value a unit of x from 0, each held until
        the next (a count that changes a few times a week is a few corners, not 10,080)."""
        if not high:
            return
        top = _step_path(self.x, self.y, high)
        bottom = _step_path(self.x, self.y, low)
        back = " ".join(reversed(bottom.split(" ")))
        self.parts.append(
            f'<path data-series="{series}" fill="{colour}" stroke="none" d="M{top} L{back} Z"/>'
        )

    def line(
        self,
        series: str,
        colour: str,
        points: Sequence[tuple[float, float | None]],
        width: float = 1.0,
        dash: str = "",
        marker: str = "",
        data: str = "",
    ) -> None:
        """A line through ``points`` (x, y), broken where y is None; with ``marker``
        ("circle" or "square") a mark on each point too. ``data``: more attributes for the
        line (a panel's ``data-pool``). y is written to a hundredth of a pixel, so that a
        reader can take one scale back from any two points."""
        runs: list[list[str]] = []
        current: list[str] = []
        for x, y in points:
            if y is None or math.isnan(y):  # a gap
                if current:
                    runs.append(current)
                current = []
            else:
                current.append(f"{self.x(x):.1f},{self.y(y):.2f}")
        if current:
            runs.append(current)
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        more = f"{data} " if data else ""
        for run in runs:
            self.parts.append(
                f'<polyline {more}data-series={quoteattr(series)} fill="none" stroke="{colour}" '
                f'stroke-width="{width}"{dashed} points="{" ".join(run)}"/>'
            )
        if marker:
            self.marks(series, colour, [(x, y) for x, y in points if y is not None], marker, 3)

    def marks(
        self,
        series: str,
        colour: str,
        points: Sequence[tuple[float, float]],
        shape: str = "circle",
        size: float = 2.5,
    ) -> None:
        """A mark at each point: a circle, a square or a star of ``size`` (its half-width)."""
        for x, y in points:
            px, py = self.x(x), self.y(y)
            data = f'data-series={quoteattr(series)} data-x="{x:g}" data-y="{y:g}"'
            if shape == "circle":
                self.parts.append(
                    f'<circle {data} cx="{px:.1f}" cy="{py:.1f}" r="{size}" fill="{colour}"/>'
                )
            elif shape == "square":
                self.parts.append(
                    f'<rect {data} x="{px - size:.1f}" y="{py - size:.1f}" width="{2 * size}" '
                    f'height="{2 * size}" fill="{colour}"/>'
                )
            else:
                self.parts.append(f'<path {data} fill="{colour}" d="{_star(px, py, size)}"/>')

    def ticks_at_bottom(self, series: str, colour: str, xs: Sequence[float]) -> None:
        """A short upright mark at the foot of the chart for each of ``xs`` (one path)."""
        if not xs:
            return
        foot = self.top + self.height
        d = "".join(f"M{self.x(x):.1f} {foot:.1f}v-7" for x in xs)
        self.parts.append(
            f'<path data-series={quoteattr(series)} stroke="{colour}" fill="none" d="{d}"/>'
        )

    def vline(self, x: float, series: str, colour: str, dash: str = "5,3") -> None:
        at = self.x(x)
        self.parts.append(
            f'<line data-series={quoteattr(series)} x1="{at:.1f}" x2="{at:.1f}" '
            f'y1="{self.top:.1f}" y2="{self.top + self.height:.1f}" stroke="{colour}" '
            f'stroke-dasharray="{dash}"/>'
        )

    def note(self, x: float, y: float, text: str, colour: str) -> None:
        self.parts.append(
            f'<text x="{self.x(x) + 4:.1f}" y="{self.y(y) - 4:.1f}" fill="{colour}" '
            f'font-size="9">{escape(text)}</text>'
        )

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """A row of (colour, label) in the chart's top right corner."""
        widths = [26 + 6 * len(label) for _, label in items]
        x = self.left + self.width - sum(widths) - 4
        self.parts.append(
            f'<rect x="{x - 4:.1f}" y="{self.top + 2:.1f}" width="{sum(widths) + 4}" '
            'height="16" fill="white" fill-opacity="0.8"/>'
        )
        for (colour, label), w in zip(items, widths, strict=True):
            self.parts.append(
                f'<rect x="{x:.1f}" y="{self.top + 6:.1f}" width="14" height="8" '
                f'fill="{colour}"/><text x="{x + 18:.1f}" y="{self.top + 14:.1f}" '
                f'font-size="9">{escape(label)}</text>'
            )
            x += w


def _step_path(
    x: Callable[[float], float], y: Callable[[float], float], values: Sequence[float]
) -> str:
    """Corners of a step line through ``values`` (each held for one unit of x), left to right,
    as "x,y" pairs separated by spaces."""
    corners = [f"{x(0):.1f},{y(values[0]):.1f}"]
    was = values[0]
    for i, v in enumerate(values):
        if v != was:
            at = f"{x(i):.1f}"
            corners.append(f"{at},{y(was):.1f}")
            corners.append(f"{at},{y(v):.1f}")
            was = v
    corners.append(f"{x(len(values)):.1f},{y(was):.1f}")
    return " ".join(corners)


def _star(x: float, y: float, r: float) -> str:
    corners = []
    for i in range(10):
        radius = r * 1.6 if i % 2 == 0 else r * 0.7
        angle = math.pi / 2 + i * math.pi / 5
        corners.append(f"{x + radius * math.cos(angle):.1f},{y - radius * math.sin(angle):.1f}")
    return "M" + " L".join(corners) + " Z"


def nice_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round values from ``low`` to ``high``, a step of 1, 2 or 5 times a power of ten, at most
    ``most`` of them."""
    span = high - low
    if span <= 0:
        return [low]
    step = 10 ** math.floor(math.log10(span / most))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= most:
            step *= factor
            break
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 10) for i in range(first, int(high / step + 1e-9) + 1)]


def symlog_ticks(high: float, linthresh: float) -> list[float]:
    """0, ``linthresh``'s fractions and its decades, up to ``high``."""
    ticks = [0.0]
    v = linthresh / 2
    while v < linthresh and v <= high:
        ticks.append(v)
        v += linthresh / 2
    v = linthresh
    while v <= high * 1.0001:
        ticks += [t for t in (v, 3 * v) if t <= high * 1.0001]
        v *= 10
    return sorted(set(ticks))


TIME_STEPS = (1, 3, 6, 12, 24, 48, 168)  # hours between the ticks of a time axis
QUARTER, MINUTE = timedelta(minutes=15), timedelta(minutes=1)


def time_ticks(start: datetime, minutes: int, zone: ZoneInfo) -> list[tuple[float, str, str]]:
    """Ticks of a time axis of ``minutes`` from ``start``, on the hours of the pool's zone
    whose local hour is a multiple of the step (daily steps: local midnights), at most 12:
    (minute, its label in that zone, the instant). A change of the clocks moves no tick off
    its local hour."""
    step = next((h for h in TIME_STEPS if minutes / 60 / h <= 12), TIME_STEPS[-1])
    fmt = "%a %m-%d" if step >= 24 else "%m-%d %H"
    # Every quarter hour is looked at: a zone's offset is a whole number of them (India's
    # hours fall on the half hour of UTC's).
    first = start.replace(minute=start.minute - start.minute % 15, second=0, microsecond=0)
    first += QUARTER * (first < start)
    ticks, days = [], 0
    for quarter in range(math.ceil((start + MINUTE * minutes - first) / QUARTER)):
        at = first + quarter * QUARTER
        local = at.astimezone(zone)
        if local.minute or local.hour % min(step, 24):
            continue
        if step >= 24:
            days += 1
            if (days - 1) % (step // 24):
                continue
        ticks.append(((at - start) / MINUTE, local.strftime(fmt), at.isoformat()))
    return ticks


def page(width: float, height: float, parts: Iterable[str]) -> str:
    """The SVG document."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="sans-serif" font-size="10" '
        f'fill="{TEXT}">\n<rect width="100%" height="100%" fill="white"/>\n'
        + "\n".join(parts)
        + "\n</svg>\n"
    )


def text(x: float, y: float, words: str, size: int = 12, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{weight}>{escape(words)}</text>'
