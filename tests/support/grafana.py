"""The chart's Grafana dashboard as Grafana would run it: its panels' targets, and their
expressions with Grafana's variables and macros filled in.

``dashboard`` renders the chart and reads the dashboard back from its ConfigMap (with the
PostgreSQL panel when the values ask for that store); ``promql`` and ``sql`` substitute what
Grafana would, and fail on anything left, so a new variable cannot go untested.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from tests.support.chart import Doc, of_kind, render


def dashboard(values: Mapping[str, Any]) -> dict[str, Any]:
    cm = next(
        d
        for d in of_kind(render(values), "ConfigMap")
        if d["metadata"]["name"].endswith("-dashboard")
    )
    data: dict[str, Any] = json.loads(cm["data"]["rebalancer.json"])
    return data


def targets(dash: Mapping[str, Any]) -> Iterator[tuple[Doc, Doc]]:
    for panel in dash["panels"]:
        for target in panel["targets"]:
            yield panel, target


# A target that yields nothing while what it summarises did not happen (a quantile of no
# reclaims is no number, NaN): ``QUANTILE and on (cluster, pool) (COUNT > 0)``.
_GUARD = re.compile(r" and on \([^)]*\) \((.+) > 0\)")


def guard(expr: str) -> str | None:
    """The count in the window that ``expr`` yields nothing without, or None: ``expr`` may be
    empty only where that count is 0."""
    m = _GUARD.search(expr)
    return m[1] if m and m.end() == len(expr) else None


def unguarded(expr: str) -> str:
    """``expr`` without its guard: what the target was before it had one."""
    m = _GUARD.search(expr)
    return expr[: m.start()] if m and m.end() == len(expr) else expr


def no_value(panel: Mapping[str, Any]) -> str | None:
    """What the panel says in place of "No data" when none of its targets yields anything."""
    said: str | None = panel.get("fieldConfig", {}).get("defaults", {}).get("noValue")
    return said


def promql(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with each of ``values`` (``{"$pool": "(l20)", "$__range": "3h"}``) put in,
    the longest names first (``$__rate_interval`` before ``$__range``)."""
    for var in sorted(values, key=len, reverse=True):
        expr = expr.replace(var, values[var])
    assert "$" not in expr, f"a Grafana variable this test does not substitute: {expr}"
    return expr


def sql(text: str, start: datetime, end: datetime, pools: list[str], clusters: str = ".*") -> str:
    """Grafana's PostgreSQL macros and variables, as Grafana expands them: a multi-value
    ``$pool`` quoted and joined, ``${cluster:regex}`` a regex (``.*``, the custom All value, is
    sent as it is)."""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    frm, to = start.strftime(fmt), end.strftime(fmt)
    text = re.sub(r"\$__timeFilter\(([^)]+)\)", rf"\1 BETWEEN '{frm}' AND '{to}'", text)
    text = text.replace("$__timeFrom()", f"'{frm}'").replace("$__timeTo()", f"'{to}'")
    text = text.replace("$pool", ",".join(f"'{p}'" for p in pools))
    text = text.replace("${cluster:regex}", clusters)
    left = re.findall(r"\$\{?\w+", text)  # a '$' that ends a regex is no macro
    assert not left, f"a Grafana macro this test does not expand: {left} in {text}"
    return text
