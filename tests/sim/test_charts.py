"""The report's charts, written by hand: what is drawn can be read back as the values given."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.sim import charts

SVG = "{http://www.w3.org/2000/svg}"


def chart() -> charts.Chart:
    return charts.Chart.of((50, 20, 500, 100), (0, 10), (0, 8))


def corners(path: str) -> list[tuple[float, float]]:
    """The "x,y" corners of a path's ``d``, its commands dropped."""
    return [
        (float(x), float(y))
        for x, y in (c.strip("MLZ ").split(",") for c in path.split(" ") if "," in c)
    ]


@given(st.lists(st.integers(0, 8), min_size=1, max_size=10))
def test_a_band_of_counts_holds_each_count_for_its_minute(values: list[int]) -> None:
    c = chart()
    c.steps("lent", "green", [0.0] * len(values), [float(v) for v in values])
    [part] = c.parts
    d = ET.fromstring(part).get("d", "")
    top = corners(d)[: 2 * sum(a != b for a, b in itertools.pairwise(values)) + 2]
    # Read the top edge back: at the middle of each minute, the height it passes at.
    for minute, value in enumerate(values):
        middle = c.x(minute + 0.5)
        [at] = [
            y0 + (y1 - y0) * (middle - x0) / (x1 - x0)
            for (x0, y0), (x1, y1) in itertools.pairwise(top)
            if x0 < middle <= x1
        ]
        assert c.y(value) == pytest.approx(at, abs=0.06), (minute, values)


def test_a_line_breaks_where_a_value_is_missing() -> None:
    c = chart()
    c.line("demand", "blue", [(0, 1.0), (1, 2.0), (2, None), (3, float("nan")), (4, 3.0)])
    lines = [ET.fromstring(p) for p in c.parts]
    assert [len(e.get("points", "").split()) for e in lines] == [2, 1]


def test_a_symmetric_log_scale_is_linear_to_its_threshold_then_logarithmic() -> None:
    scale = charts.Scale(0, 1000, 0, 400, linthresh=10)
    assert scale(0) == 0
    assert scale(1000) == pytest.approx(400)
    assert scale(5) == pytest.approx(scale(10) / 2)  # linear below the threshold
    assert scale(100) - scale(10) == pytest.approx(scale(1000) - scale(100))  # a decade each


@pytest.mark.parametrize(
    ("high", "most", "ticks"),
    [(16, 4, [0, 5, 10, 15]), (1000, 4, [0, 500, 1000]), (0.95, 5, [0, 0.2, 0.4, 0.6, 0.8])],
)
def test_the_ticks_are_round(high: float, most: int, ticks: list[float]) -> None:
    assert charts.nice_ticks(0, high, most) == ticks


def test_text_is_escaped() -> None:
    page = charts.page(10, 10, [charts.text(0, 0, "a <b> & c")])
    assert ET.fromstring(page).find(f"{SVG}text") is not None
