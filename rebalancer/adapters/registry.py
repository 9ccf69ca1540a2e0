"""The strategies there are, by name: the ``rebalancer.strategies`` entry points.

Where it sits: ``rebalancer.settings`` checks each pool's ``strategy`` here when the settings
load (``names()``, then ``build(name, params)``, so that parameters are validated before anything
runs); the command, the simulator and the benchmarks list and build strategies through it too.

Why entry points: the built-ins (the top-level ``strategies`` package, declared in the project's
``pyproject.toml``) and a team's own (declared in a distribution of theirs, docs/strategies.md)
are found the same way, and the controller imports no strategy module until that strategy is
built or its parameters asked for. What can go wrong with a plugin is said in one line naming
it, as a ``strategy.ParameterError`` (which the settings turn into one line of their error):
its module does not import, or its entry point names something that is not a
``strategy.Plugin``. A built-in name cannot be taken: a distribution that declares one is
ignored for that name, with a warning, and the built-in is used.

Entry points are read again whenever ``sys.path`` changes (importlib reads them from the
distributions' metadata on it); a loaded plugin is kept for the life of the process.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pydantic

from rebalancer.core import strategy
from rebalancer.core.strategy import ParameterError

__all__ = [
    "DEFAULT",
    "GROUP",
    "ParameterError",
    "build",
    "built_in",
    "names",
    "params_type",
    "register",
]

GROUP = "rebalancer.strategies"
DEFAULT = "adaptive"
_HOME = "rebalancer"  # the distribution whose entry points are the built-in strategies

log = logging.getLogger(__name__)

# Strategies made known in-process (tests, a wrapper that then calls the command's ``main``);
# the entry point is the documented way.
_registered: dict[str, strategy.Plugin] = {}


@dataclass(frozen=True)
class _Found:
    points: Mapping[str, EntryPoint]  # the one entry point used for each name
    built_in: frozenset[str]
    clashes: Mapping[str, tuple[str, ...]]  # a name two distributions of others declare


def register(
    name: str,
    params: type[strategy.Params],
    make: Callable[[Any], strategy.Strategy],
    summary: str = "",
) -> None:
    """Make a strategy known by ``name`` in this process (before the settings are loaded), e.g.
    from a wrapper that then calls the command's ``main``. Built-in names cannot be taken."""
    if name in _lookup().built_in:
        raise ValueError(f"{name!r} is a built-in strategy and cannot be replaced")
    _registered[name] = strategy.Plugin(params, make, summary)


def names() -> list[str]:
    """Every strategy there is, without importing any."""
    found = _lookup()
    return sorted({*found.points, *found.clashes, *_registered})


def built_in() -> list[str]:
    """The strategies the controller ships (the ``strategies`` package)."""
    return sorted(_lookup().built_in)


def params_type(name: str) -> type[strategy.Params]:
    """The parameters ``name`` takes (a KeyError for a name not known; a ``ParameterError``
    for a plugin that does not load)."""
    if name not in names():
        raise KeyError(name)
    return _plugin(name).params


def build(name: str, params: Mapping[str, Any] | None = None) -> strategy.Strategy:
    """A strategy ``name`` with ``params`` validated; a ``ParameterError`` says what is wrong."""
    plugin = _plugin(name)
    try:
        validated = plugin.params.model_validate(dict(params or {}))
    except pydantic.ValidationError as exc:
        raise ParameterError(name, _describe(exc)) from exc
    return plugin.make(validated)


def _plugin(name: str) -> strategy.Plugin:
    if name in _registered:
        return _registered[name]
    found = _lookup()
    if name in found.clashes:
        declared = ", ".join(found.clashes[name])
        raise ParameterError(name, [f"declared by {declared}; uninstall all but one"])
    point = found.points.get(name)
    if point is None:
        raise ParameterError(name, [f"unknown strategy; choose one of {', '.join(names())}"])
    return _loaded(point)


@functools.cache
def _loaded(point: EntryPoint) -> strategy.Plugin:
    where = f"entry point {point.name} = {point.value!r} of {_distribution(point)}"
    try:
        plugin = point.load()
    except Exception as exc:
        raise ParameterError(point.name, [f"{where} does not load: {_one_line(exc)}"]) from exc
    if not isinstance(plugin, strategy.Plugin):
        kind = type(plugin).__name__
        problem = f"{where} is a {kind}, not a rebalancer.core.strategy.Plugin"
        raise ParameterError(point.name, [problem])
    return plugin


def _lookup() -> _Found:
    return _found(tuple(sys.path))


@functools.cache
def _found(path: tuple[str, ...]) -> _Found:
    """The group's entry points as seen from ``path`` (the key of the cache, nothing more)."""
    points = entry_points(group=GROUP)
    ours = {p.name: p for p in points if _distribution(p) == _HOME}
    theirs: dict[str, list[EntryPoint]] = {}
    for point in points:
        if _distribution(point) == _HOME:
            continue
        if point.name in ours:
            log.warning(
                "strategy %r of %s is not used: built-in strategies cannot be replaced",
                point.name,
                _distribution(point),
            )
            continue
        theirs.setdefault(point.name, []).append(point)
    clashes = {
        name: tuple(sorted({_distribution(p) for p in found}))
        for name, found in theirs.items()
        if len({p.value for p in found}) > 1
    }
    others = {name: found[0] for name, found in theirs.items() if name not in clashes}
    return _Found({**others, **ours}, frozenset(ours), clashes)


def _distribution(point: EntryPoint) -> str:
    return point.dist.name if point.dist is not None else "an unknown distribution"


def _one_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _describe(exc: pydantic.ValidationError) -> list[str]:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(parameters)"
        lines.append(f"{where}={error.get('input')!r}: {error['msg']}")
    return lines
