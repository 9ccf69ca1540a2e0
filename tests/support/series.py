"""Demand histories for property tests: Hypothesis strategies of per-minute series.

A series is built from segments of what a metric pipeline can hand over: exactly zero for
hours, gaps (``None``) of any length, constant levels from a trickle (1e-9 rps) to a flood
(1e9), one-minute spikes, ramps and noise. ``demand_series`` strings segments together, up to a
length; ``stretch`` is one segment, for examples written by hand. The strategy property tests
and the simulator's any-trace tests draw from the same space.
"""

from __future__ import annotations

from hypothesis import strategies as st

from rebalancer.adapters import registry

ZONES = ("UTC", "America/Los_Angeles", "Asia/Shanghai", "Europe/Berlin", "Australia/Lord_Howe")
# Demand levels: exactly zero, and anything from a trickle to a flood.
LEVELS = st.one_of(st.just(0.0), st.sampled_from([1e-9, 1.0, 1e9]), st.floats(1e-9, 1e9))
# Segments of a history. Long ones reach past every window of the default parameters (a day
# and an hour of seasonal look-back is 1500 one-minute or 150 ten-minute steps).
SHORT = st.integers(1, 12)
LONG = st.integers(1, 1600)


def stretch(value: float | None, length: int) -> list[float | None]:
    return [value] * length


@st.composite
def one_in(draw: st.DrawFn, n: int, values: st.SearchStrategy[float]) -> float | None:
    """None once in ``n`` draws, else one of ``values``: a gap, or an unknown sample."""
    return None if draw(st.integers(0, n - 1)) == 0 else draw(values)


@st.composite
def segments(draw: st.DrawFn) -> list[float | None]:
    kind = draw(st.sampled_from(["zero", "gap", "constant", "spike", "ramp", "noise"]))
    length = draw(st.one_of(SHORT, LONG))
    if kind == "zero":
        return stretch(0.0, length)
    if kind == "gap":
        return stretch(None, length)
    if kind == "constant":
        return stretch(draw(LEVELS), length)
    if kind == "spike":
        base, peak = draw(LEVELS), draw(LEVELS)
        return [*stretch(base, length // 2), peak, *stretch(base, length - length // 2 - 1)]
    if kind == "ramp":
        a, b = draw(LEVELS), draw(LEVELS)
        return [a + (b - a) * i / length for i in range(length)]
    noise = draw(st.lists(one_in(8, LEVELS), min_size=1, max_size=30))
    return [noise[i % len(noise)] for i in range(length)]


@st.composite
def demand_series(draw: st.DrawFn, limit: int, at_least: int = 0) -> list[float | None]:
    values: list[float | None] = []
    for part in draw(st.lists(segments(), max_size=6)):
        values.extend(part)
    while len(values) < at_least:
        values.extend(draw(segments()))
    return values[:limit]


# The built-in strategies: the registry before anything registers a strategy of its own.
NAMES = registry.names()
