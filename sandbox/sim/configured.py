"""The pool a simulation models: a configured pool's settings, with the command's flags over them.

Where it sits: ``rebalancer simulate --pool NAME`` loads the controller's settings as
``rebalancer run`` does (``rebalancer.settings``) and hands the pool's here with the flags it
was given; ``model`` returns what the engine runs (the ``PoolModel``: size, capacity per node,
limits, lending window, zone), the strategies with their parameters, the error budget, and where
each value came from, so that the report can say it. Without ``--pool`` the same function
models the simulator's generic pool from the flags and its defaults.

Why the error budget defaults to the controller's: every pool the controller runs has one unless
its settings say ``slo: none`` (``PoolSettings.slo``'s default), so a simulation without
``--slo`` models that budget, with ``--pool`` or without; ``--slo none`` turns it off, as
``slo: none`` does. The default is read from the settings' field, never restated here.

Why flags win over the settings: a what-if changes one thing and keeps the rest of the pool.
Why the size is a flag: the settings select a pool's nodes by label and never count them, so
the size is ``--pool-size`` or the simulator's default, and the report says which.
Why capacity is the pool's own with settings and calibrated without: ``rps_per_node`` is what
the controller plans with, so a what-if of the pool plans with it too; a bare trace has no
such figure, and the simulator makes one so that its peak needs ``peak_share`` of the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rebalancer.adapters import registry
from rebalancer.core import model, nodestate, windows
from rebalancer.core.policy import PoolPolicy
from sandbox.sim import engine

if TYPE_CHECKING:
    from rebalancer.settings import PoolSettings, SloSettings

DEFAULTS = engine.PoolModel()


class Origin(StrEnum):
    """Where a modelled value came from."""

    SETTINGS = "settings"  # the configured pool's
    FLAG = "flag"  # the command's flag
    DEFAULT = "default"  # the simulator's own default
    CALIBRATED = "calibrated"  # capacity only: from the trace's peak


@dataclass(frozen=True)
class Given:
    """The command's flags; None (or empty) where not given."""

    size: int | None = None
    min_serving: int | None = None
    headroom: float | None = None
    drain: timedelta | None = None
    warmup: timedelta | None = None
    zone: str | None = None
    gpus_per_node: int | None = None
    strategies: Sequence[str] = ()
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    slo: model.Slo | None = None
    slo_off: bool = False  # ``--slo none``: no budget, whatever the settings say
    notice: timedelta | None = None  # ``--notice``; zero: ``off``


@dataclass(frozen=True)
class Provenance:
    """Which pool of which settings a run models, and where each of its values came from."""

    pool: str | None = None  # the configured pool's name; None: the simulator's generic pool
    settings: str | None = None  # the settings file; None: defaults and REBALANCER_* only
    origins: Mapping[str, Origin] = field(default_factory=dict)
    lends_only_to_takers: bool = False  # what the pool's settings say


@dataclass(frozen=True)
class Modelled:
    pool: engine.PoolModel
    strategies: list[str]
    params: dict[str, dict[str, Any]]
    slo: model.Slo | None
    provenance: Provenance


def model_of(
    given: Given, pool: PoolSettings | None = None, settings_file: str | None = None
) -> Modelled:
    """The pool to simulate: ``pool``'s settings (if any) with ``given`` over them, and the
    simulator's defaults for the rest."""
    origins: dict[str, Origin] = {}

    def pick(name: str, flag: Any, configured: Any, default: Any) -> Any:
        if flag is not None:
            origins[name] = Origin.FLAG
            return flag
        if configured is not None:
            origins[name] = Origin.SETTINGS
            return configured
        origins[name] = Origin.DEFAULT
        return default

    limits = None if pool is None else pool.limits
    zone = pick("zone", given.zone, None if pool is None else pool.zone, DEFAULTS.zone)
    modelled = engine.PoolModel(
        size=pick("size", given.size, None, DEFAULTS.size),
        min_serving=pick(
            "min_serving",
            given.min_serving,
            None if limits is None else limits.min_serving,
            DEFAULTS.min_serving,
        ),
        headroom=pick(
            "headroom",
            given.headroom,
            None if limits is None else limits.headroom,
            DEFAULTS.headroom,
        ),
        drain=pick(
            "drain",
            given.drain,
            None if limits is None else limits.reclaim_deadline,
            DEFAULTS.drain,
        ),
        warmup=pick(
            "warmup", given.warmup, None if limits is None else limits.warmup, DEFAULTS.warmup
        ),
        zone=zone,
        gpus_per_node=pick("gpus_per_node", given.gpus_per_node, None, DEFAULTS.gpus_per_node),
        rps_per_node=None if pool is None else pool.rps_per_node,
        rules=None if pool is None else _rules(pool, zone),
        notice=pick(
            "notice",
            given.notice,
            None if limits is None else limits.reclaim_notice,
            controller_notice(),
        ),
    )
    origins["rps_per_node"] = Origin.CALIBRATED if pool is None else Origin.SETTINGS
    for name in ("limits", "window"):
        origins[name] = Origin.DEFAULT if pool is None else Origin.SETTINGS
    if given.strategies:
        strategies, origins["strategy"] = list(given.strategies), Origin.FLAG
    elif pool is not None:
        strategies, origins["strategy"] = [pool.strategy.name], Origin.SETTINGS
    else:
        strategies, origins["strategy"] = [registry.DEFAULT], Origin.DEFAULT
    params: dict[str, dict[str, Any]] = {}
    if pool is not None and pool.strategy.params and pool.strategy.name in strategies:
        params[pool.strategy.name] = dict(pool.strategy.params)
    params.update({name: dict(p) for name, p in given.params.items()})
    slo, origins["slo"] = _budget(given, pool)
    provenance = Provenance(
        pool=None if pool is None else pool.name,
        settings=settings_file,
        origins=origins,
        lends_only_to_takers=pool is not None and pool.lend_only_to_takers,
    )
    return Modelled(modelled, strategies, params, slo, provenance)


def _budget(given: Given, pool: PoolSettings | None) -> tuple[model.Slo | None, Origin]:
    """The error budget to simulate and where it came from: ``--slo`` (``none``: no budget),
    else the pool's ``slo`` as its settings give it (``slo: none``: no budget), else the budget
    every pool has when its settings leave ``slo`` out (``DEFAULT``)."""
    if given.slo_off:
        return None, Origin.FLAG
    if given.slo is not None:
        return given.slo, Origin.FLAG
    default = _default_slo()
    # ``slo: null`` is the settings' way of leaving it out: the default itself, not a copy.
    if pool is not None and "slo" in pool.model_fields_set and pool.slo is not default:
        return (None if pool.slo is None else pool.slo.slo()), Origin.SETTINGS
    return default.slo(), Origin.DEFAULT


def _default_slo() -> SloSettings:
    from rebalancer.settings import PoolSettings, SloSettings

    default = PoolSettings.model_fields["slo"].default
    assert isinstance(default, SloSettings)
    return default


def controller_notice() -> timedelta:
    """The reclaim notice a pool gets from the controller's settings when they name none: what
    the command simulates without ``--pool`` or ``--notice``, so that a bare trace is replayed
    as the controller would run it. (The engine's own ``PoolModel`` gives none: its baselines
    and benchmarks are the figures they always were.)"""
    from rebalancer.settings.limits import LimitSettings

    default = LimitSettings.model_fields["reclaim_notice"].default
    assert isinstance(default, timedelta)
    return default


def _rules(pool: PoolSettings, zone: str) -> PoolPolicy:
    """The pool's policy as the controller builds it, its window read in ``zone`` (the pool's
    own, or ``--tz``'s), with the simulator's keys."""
    window = windows.parse(pool.window, zone)
    assert isinstance(window, windows.Window), "validated when the settings were loaded"
    return replace(pool.policy(nodestate.Keys()), window=window)
