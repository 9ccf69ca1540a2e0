"""Strategy names to implementations, with parameters validated once, at start-up."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from strategies import adaptive, base, baselines, forecast, peak, watermark, window


@dataclass(frozen=True)
class Entry:
    params: type[base.Params]
    make: Callable[[Any], base.Strategy]
    summary: str


_ENTRIES: dict[str, Entry] = {
    "adaptive": Entry(adaptive.Params, adaptive.Adaptive, adaptive.__doc__ or ""),
    "forecast": Entry(forecast.Params, forecast.Forecast, forecast.__doc__ or ""),
    "watermark": Entry(watermark.Params, watermark.Watermark, watermark.__doc__ or ""),
    "window": Entry(window.Params, window.Window, window.__doc__ or ""),
    "peak": Entry(peak.Params, peak.Peak, peak.__doc__ or ""),
    "static": Entry(baselines.NoParams, baselines.Static, "never lend"),
    "cron": Entry(baselines.CronParams, baselines.Cron, "lend everything inside fixed hours"),
    "reactive": Entry(baselines.NoParams, baselines.Reactive, "lend what current load leaves"),
}

_BUILT_IN = frozenset(_ENTRIES)
DEFAULT = "adaptive"


class ParameterError(ValueError):
    """Strategy parameters that do not validate; one line per bad field."""

    def __init__(self, strategy: str, problems: list[str]) -> None:
        self.strategy = strategy
        self.problems = problems
        super().__init__(f"strategy {strategy!r}: " + "; ".join(problems))


def register(
    name: str,
    params: type[base.Params],
    make: Callable[[Any], base.Strategy],
    summary: str = "",
) -> None:
    """Make a strategy of one's own known by ``name`` (before the settings are loaded), e.g.
    from a wrapper that then calls ``rebalancer.cli.main``. Built-in names cannot be taken."""
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is a built-in strategy and cannot be replaced")
    _ENTRIES[name] = Entry(params, make, summary)


def names() -> list[str]:
    return sorted(_ENTRIES)


def params_type(name: str) -> type[base.Params]:
    """The parameters ``name`` takes (a KeyError for a name not known)."""
    return _ENTRIES[name].params


def build(name: str, params: Mapping[str, Any] | None = None) -> base.Strategy:
    entry = _ENTRIES.get(name)
    if entry is None:
        raise ParameterError(name, [f"unknown strategy; choose one of {', '.join(names())}"])
    try:
        validated = entry.params.model_validate(dict(params or {}))
    except pydantic.ValidationError as exc:
        raise ParameterError(name, _describe(exc)) from exc
    return entry.make(validated)


def _describe(exc: pydantic.ValidationError) -> list[str]:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(parameters)"
        lines.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return lines
