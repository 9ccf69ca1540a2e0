"""The controller's settings: a YAML file (the Helm chart's ConfigMap) and ``REBALANCER_*`` env.

Where it sits: ``rebalancer run`` calls ``load(path)`` once at start-up and builds every core and
adapter value from the result (``Settings.keys()``, ``PoolSettings.policy(keys)``, ...). Nothing
else reads the environment or the config file.

Sources, later wins:

1. the defaults below;
2. the YAML file (``--config PATH`` or ``REBALANCER_CONFIG``), a mapping of the fields below;
3. environment variables ``REBALANCER_<FIELD>``, nested with ``__``
   (``REBALANCER_PROMETHEUS__URL``); a list or mapping is written as JSON
   (``REBALANCER_POOLS='[...]'`` replaces the whole list of pools).

Every invalid value becomes ONE line naming the field path, the value and why, e.g.
``pools[0].window='Mon-Fry 22:00-06:00': has days 'Mon-Fry'; write e.g. Mon-Fri, ...``. All lines
are collected into one ``InvalidSettings`` (a ``ConfigError``; ``lines`` holds them) so that an
operator sees every problem at once; nothing here lets a traceback through for bad input.
Strategies are built once at load time so that their parameters are validated before anything
runs.

Reference for every setting: docs/configuration.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from rebalancer import errors
from rebalancer.adapters import auditurl, presets, registry
from rebalancer.core import alerts, audit, clocks, model, nodepools, nodestate, windows
from rebalancer.core.policy import PoolPolicy
from rebalancer.errors import ConfigError

if TYPE_CHECKING:
    from rebalancer.adapters import leadership, metrics
    from rebalancer.adapters.metrics import Queries  # in PoolSettings, ``metrics`` is a field
    from rebalancer.core.strategy import Strategy

ENV_PREFIX = "REBALANCER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"  # the config file's path, when --config is not given

# The default server: its templates are the defaults of ``MetricsSettings`` (and the adapter's).
_VLLM = presets.preset(presets.Engine.VLLM)
_DEFAULT_SCOPE = 'max by (namespace, pod, node) (kube_pod_info{node=~"$nodes"})'

_NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS label
_NAME = re.compile(_NAME_PATTERN.strip("^$"))
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


# ---------------------------------------------------------------------------------------------
# Value types


def _to_duration(value: object) -> object:
    """``90s``, ``15m``, ``1h30m``, ``0`` or a number of seconds; anything else is refused."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        match = _DURATION.fullmatch(text)
        if text in ("0", "0.0"):
            seconds = 0.0
        elif text and match and any(match.groups()):
            hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
            seconds = hours * 3600 + minutes * 60 + secs
        else:
            try:
                seconds = float(text)  # a bare number from an environment variable
            except ValueError:
                raise PydanticCustomError(
                    "duration", "write a duration such as 90s, 15m or 2h"
                ) from None
    else:
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    if not math.isfinite(seconds):
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    if seconds < 0:
        raise PydanticCustomError("duration", "must not be negative")
    if seconds > _LONGEST:  # a time plus it must still be a time: no setting needs more
        raise PydanticCustomError("duration", "must be at most 100 years")
    return timedelta(seconds=seconds)


_LONGEST = 100 * 365 * 24 * 3600.0


# What the chart's values schema says of a duration (rebalancer/schema.py): what
# ``_to_duration`` accepts, so that Helm refuses at install what the controller would at start.
# Go's regular expressions (Helm's) have no look-ahead: each unit starts its own alternative.
_NUMBER = r"\d+(\.\d+)?"
_H, _M, _S = (f"{_NUMBER}[{u}{u.upper()}]" for u in "hms")
_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {
            "type": "string",
            "pattern": (rf"^\s*({_NUMBER}|{_H}({_M})?({_S})?|{_M}({_S})?|{_S})\s*$"),
        },
    ],
    "description": "a duration: 90s, 15m, 1h30m, or a number of seconds",
}

Duration = Annotated[
    timedelta,
    pydantic.BeforeValidator(_to_duration),
    pydantic.WithJsonSchema(_DURATION_SCHEMA),
]


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise PydanticCustomError("duration", "must be longer than 0s")
    return value


PositiveDuration = Annotated[Duration, pydantic.AfterValidator(_positive)]


def _whole_seconds(value: timedelta) -> timedelta:
    if value <= timedelta(0) or value.total_seconds() != int(value.total_seconds()):
        raise PydanticCustomError("duration", "must be a whole number of seconds > 0")
    return value


WholeSeconds = Annotated[Duration, pydantic.AfterValidator(_whole_seconds)]


def _a_second_or_more(value: timedelta) -> timedelta:
    if value < timedelta(seconds=1):
        raise PydanticCustomError(
            "duration",
            "must be at least 1s: the API server states its clock to the second",
        )
    return value


def _check_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a directory of the zone database ("America") is not a zone.
        raise PydanticCustomError(
            "zone", "unknown time zone; use an IANA name such as Asia/Shanghai or UTC"
        ) from None
    return value


Zone = Annotated[
    str,
    pydantic.AfterValidator(_check_zone),
    pydantic.WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$",
            "description": "an IANA time zone, e.g. Europe/Berlin or UTC",
        }
    ),
]


class _Model(BaseModel):
    """Every settings block: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TaintSettings(_Model):
    """A taint, as a mapping or as ``key=value:Effect`` (``key:Effect`` without a value)."""

    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return taint_text(data)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: pydantic.GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        effects = "|".join(nodepools.EFFECTS)
        text = {
            "type": "string",
            "pattern": f"^[^=:]+(=[^:]*)?:({effects})$",
            "description": "key=value:Effect or key:Effect",
        }
        return {"anyOf": [text, handler(schema)]}

    def taint(self) -> model.Taint:
        return model.Taint(key=self.key, value=self.value, effect=self.effect)


def taint_text(data: Any) -> Any:
    """A taint written ``key=value:Effect`` (or ``key:Effect``) as the mapping it stands for;
    anything else as it is. For a taint model's ``before`` validator: the settings' and the pools
    file's."""
    if not isinstance(data, str):
        return data
    head, sep, effect = data.rpartition(":")
    if not sep or effect not in nodepools.EFFECTS or not head:
        raise PydanticCustomError(
            "taint",
            "write a taint as key=value:Effect or key:Effect, Effect one of {effects}",
            {"effects": ", ".join(nodepools.EFFECTS)},
        )
    key, eq, value = head.partition("=")
    return {"key": key, "value": value if eq else None, "effect": effect}


def _default_serving_taints() -> tuple[TaintSettings, ...]:
    return (TaintSettings(key="workload", value="inference", effect="NoSchedule"),)


class MetricQuerySettings(_Model):
    """One metric as two PromQL templates; see rebalancer/adapters/metrics.py ``MetricQuery``."""

    value: str = Field(min_length=1)
    sampled: str = Field(min_length=1)

    def query(self) -> metrics.MetricQuery:
        from rebalancer.adapters import metrics

        return metrics.MetricQuery(value=self.value, sampled=self.sampled)


def _gauge_query(gauge: presets.Gauge) -> MetricQuerySettings:
    """A preset's gauge summed over the pool's pods, sampled by its scrape times."""
    return MetricQuerySettings(value=presets.pooled(gauge), sampled=presets.sampled(gauge.selector))


class CapacitySettings(_Model):
    """What one warm node of the pool serves at the latency target, and what that is counted
    in. The pool's demand is read in the same unit (``metrics``), so that the two compare;
    ``rebalancer capacity`` measures ``per_node`` from the pool's history (docs/capacity.md)."""

    unit: model.Unit
    per_node: float = Field(gt=0, allow_inf_nan=False)


class MetricsSettings(_Model):
    """A pool's PromQL: a server's preset (``rebalancer.adapters.presets``; vLLM unless told
    otherwise), any template of which may be written out instead.

    ``demand``, ``history`` and ``node_served`` depend on the pool's unit (``capacity.unit``):
    left out (None) they are the preset's for it, resolved by the methods that take the unit.
    ``queue``, ``running`` and ``node_saturated`` depend on the server only: left out, they are
    filled in from the preset as the settings are read (``running: null`` turns it off).
    """

    preset: presets.Engine = presets.Engine.VLLM
    demand: MetricQuerySettings | None = None
    queue: MetricQuerySettings = _gauge_query(_VLLM.waiting)
    running: MetricQuerySettings | None = (
        None if _VLLM.running is None else _gauge_query(_VLLM.running)
    )
    gpu_busy: MetricQuerySettings | None = None
    history: str | None = Field(default=None, min_length=1)
    # For ``rebalancer capacity``, per node (one series per ``node`` label) over ``$window``:
    # what it served in the pool's unit, and above zero when it was full all through.
    node_served: str | None = Field(default=None, min_length=1)
    node_saturated: str = Field(default=presets.node_saturated(_VLLM), min_length=1)
    scope: str = Field(default=_DEFAULT_SCOPE, min_length=1)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_the_preset(cls, data: Any) -> Any:
        """The server's own ``queue``, ``running`` and ``node_saturated`` where not given. A
        preset that is no preset is left to the field to refuse."""
        if not isinstance(data, Mapping):
            return data
        try:
            preset = presets.preset(data.get("preset", presets.Engine.VLLM))
        except (ValueError, TypeError):
            return data
        filled = dict(data)
        filled.setdefault("queue", _gauge_query(preset.waiting))
        filled.setdefault(
            "running", None if preset.running is None else _gauge_query(preset.running)
        )
        filled.setdefault("node_saturated", presets.node_saturated(preset))
        return filled

    @property
    def server(self) -> presets.Preset:
        return presets.preset(self.preset)

    def template_problems(self) -> list[tuple[str, str, str]]:
        """``(field, template, why)`` for each template ``metrics.render`` could not fill in.

        Checked when the settings are read, so that a typo in a placeholder stops the start
        instead of failing the pool's query on every tick."""
        templates: list[tuple[str, str | None, tuple[str, ...]]] = [
            ("history", self.history, _HISTORY_PLACEHOLDERS),
            ("node_served", self.node_served, _HISTORY_PLACEHOLDERS),
            ("node_saturated", self.node_saturated, _HISTORY_PLACEHOLDERS),
            ("scope", self.scope, _SCOPE_PLACEHOLDERS),
        ]
        for name in ("demand", "queue", "running", "gpu_busy"):
            query: MetricQuerySettings | None = getattr(self, name)
            if query is not None:
                templates.append((f"{name}.value", query.value, _QUERY_PLACEHOLDERS))
                templates.append((f"{name}.sampled", query.sampled, _QUERY_PLACEHOLDERS))
        found = (
            (f, t, _template_problem(t, allowed)) for f, t, allowed in templates if t is not None
        )
        return [(f, t, why) for f, t, why in found if why is not None]

    def unit_problem(self, unit: model.Unit) -> str | None:
        """Why the pool's demand cannot be read in ``unit``: the preset has no reading in it
        and ``demand`` or ``history`` is not written out; None when it can."""
        left_out = [name for name in ("demand", "history") if getattr(self, name) is None]
        if not left_out or unit in self.server.readings:
            return None
        why = self.server.missing.get(unit)
        units = ", ".join(u.value for u in self.server.readings)
        return (
            f"has no {unit.value} query ({why or 'none known'}); write "
            f"metrics.{' and metrics.'.join(left_out)} yourself, or choose a capacity.unit it "
            f"has: {units}"
        )

    def queries(self, unit: model.Unit = model.Unit.REQUESTS_PER_SECOND) -> metrics.Queries:
        """The adapter's queries, demand and history in ``unit``."""
        from rebalancer.adapters import metrics

        server = self.server
        demand = self.demand
        if demand is None:
            demand = MetricQuerySettings(
                value=presets.demand_value(server, unit),
                sampled=presets.demand_sampled(server, unit),
            )
        return metrics.Queries(
            demand=demand.query(),
            queue=self.queue.query(),
            running=None if self.running is None else self.running.query(),
            gpu_busy=None if self.gpu_busy is None else self.gpu_busy.query(),
            history=self.history or presets.history(server, unit),
            scope=self.scope,
        )

    def node_queries(self, unit: model.Unit) -> tuple[str, str] | str:
        """``(node_served, node_saturated)`` in ``unit``, for measuring a node's capacity; or
        why there is none (the preset has no reading in the unit, and ``node_served`` is not
        written out)."""
        if self.node_served is not None:
            return self.node_served, self.node_saturated
        if unit not in self.server.readings:
            why = self.server.missing.get(unit, "none known")
            return (
                f"metrics.node_served: preset {self.preset.value} has no {unit.value} "
                f"query ({why}); write metrics.node_served yourself"
            )
        return presets.node_served(self.server, unit), self.node_saturated


# What ``rebalancer.adapters.metrics.render`` fills in (a test holds them equal): ``$scope``,
# ``$nodes`` and ``$pool`` in a query, ``$window`` too in ``history``, ``node_served`` and
# ``node_saturated``; ``scope`` itself is filled in with ``$nodes`` and ``$pool``.
_QUERY_PLACEHOLDERS = ("scope", "nodes", "pool")
_HISTORY_PLACEHOLDERS = (*_QUERY_PLACEHOLDERS, "window")
_SCOPE_PLACEHOLDERS = ("nodes", "pool")


def _template_problem(template: str, allowed: Sequence[str]) -> str | None:
    """Why ``string.Template(template).substitute(<allowed>)`` would raise, or None."""
    may = ", ".join(f"${name}" for name in allowed)
    for found in Template.pattern.finditer(template):
        name = found["named"] or found["braced"]
        if found["invalid"] is not None:
            return (
                f"a '$' at character {found.start() + 1} starts no placeholder; "
                f"write $$ for a literal $ (this template may use {may})"
            )
        if name is not None and name not in allowed:
            return f"unknown placeholder ${name}; this template may use {may} ($$ for a literal $)"
    return None


class LimitSettings(_Model):
    """The safety limits of ``core.policy.PoolPolicy``; defaults as docs/design/safety-rules.md."""

    min_serving: int = Field(default=2, ge=0)
    headroom: float = Field(default=0.2, ge=0, allow_inf_nan=False)
    max_lent_fraction: float = Field(default=1.0, ge=0, le=1)
    min_loan: Duration = timedelta(0)
    unused_loan: Duration = timedelta(minutes=5)
    cooldown: Duration = timedelta(minutes=15)
    max_step_fraction: float = Field(default=0.25, gt=0, le=1)
    staleness: PositiveDuration = timedelta(minutes=2)
    stale_grace: Duration = timedelta(minutes=5)
    queue_limit: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    queue_reclaims: bool = True
    drop_floor: float = Field(default=1 / 3, ge=0, le=1)
    drop_hold: Duration = timedelta(minutes=10)
    reclaim_deadline: Duration = timedelta(minutes=2)
    warmup: Duration = timedelta(minutes=5)


class StrategySettings(_Model):
    name: str = registry.DEFAULT
    params: dict[str, Any] = Field(default_factory=dict)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data  # ``strategy: forecast``

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: pydantic.GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # Each built-in strategy's parameters, checked when the name is that strategy's; a name
        # of a strategy registered elsewhere is left to the loader.
        mapping = handler.resolve_ref_schema(handler(schema))
        mapping["allOf"] = [
            {
                "if": {"properties": {"name": {"const": name}}},
                "then": {"properties": {"params": registry.params_type(name).model_json_schema()}},
            }
            for name in registry.built_in()
        ]
        return {"anyOf": [{"type": "string", "minLength": 1}, mapping]}

    @pydantic.field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in registry.names():
            raise PydanticCustomError(
                "strategy",
                "unknown strategy; choose one of {names}",
                {"names": ", ".join(registry.names())},
            )
        try:
            registry.params_type(value)  # a plugin that does not load is said here, by name
        except registry.ParameterError as exc:
            why = "; ".join(exc.problems)
            raise PydanticCustomError("strategy", "{why}", {"why": why}) from None
        return value

    @pydantic.model_validator(mode="after")
    def _params_validate(self) -> StrategySettings:
        try:
            registry.build(self.name, self.params)
        except registry.ParameterError as exc:
            # One line per bad parameter; ``_lines`` expands them under ``.params``.
            raise PydanticCustomError(
                "strategy_params",
                "{problems}",
                {"problems": "; ".join(exc.problems), "lines": tuple(exc.problems)},
            ) from None
        return self

    def build(self) -> Strategy:
        return registry.build(self.name, self.params)


class SloSettings(_Model):
    """A pool's error budget: the minutes per rolling ``window`` in which lending may cost it
    (requests queued beyond ``limits.queue_limit`` while nodes are lent). Say it as minutes
    (``max_breach_minutes``) or as the share of the window's minutes free of that cost
    (``availability``, e.g. 0.999 over 7 days: 10 minutes); not both."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": ["max_breach_minutes"]}, {"required": ["availability"]}]
        }
    )

    max_breach_minutes: int | None = Field(default=None, ge=0)
    availability: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    window: PositiveDuration = timedelta(days=7)

    @pydantic.model_validator(mode="after")
    def _one_figure(self) -> SloSettings:
        if (self.max_breach_minutes is None) == (self.availability is None):
            raise PydanticCustomError(
                "slo", "give max_breach_minutes or availability, exactly one of them"
            )
        return self

    def slo(self) -> model.Slo:
        minutes = self.max_breach_minutes
        if minutes is None:
            assert self.availability is not None, "validated at load"
            # Rounded down: 0.999 of 10,080 minutes is 10.08, so 10 may be spent, not 11.
            share = (1.0 - self.availability) * (self.window / timedelta(minutes=1))
            minutes = math.floor(share + 1e-9)
        return model.Slo(minutes, self.window)


# Every pool's error budget unless its settings say otherwise: 0.999 of a rolling 7 days, 10
# minutes (10.08, rounded down). ``slo: none`` (that word, lower-case, as the chart's schema
# has it) turns it off. ``slo: null``, or ``slo:`` with nothing after it, is the same as leaving
# it out, this default: YAML and Helm write null for "not set", and a slip of that kind keeps
# the budget rather than dropping it (turning a safety rule off takes the word).
DEFAULT_SLO = SloSettings(availability=0.999)
SLO_OFF = "none"


def _slo_word(value: Any) -> Any:
    """``slo``'s value before it is validated: null the default, the word ``none`` no budget,
    a mapping an ``SloSettings``; anything else refused, saying what to write."""
    if value is None:
        return DEFAULT_SLO
    if value == SLO_OFF:
        return None
    if isinstance(value, Mapping | SloSettings):
        return value
    raise PydanticCustomError(
        "slo",
        "write none (no error budget) or a mapping such as {availability: 0.999} or "
        "{max_breach_minutes: 10}; left out, a pool has {availability: 0.999}",
    )


class WakeOnSettings(_Model):
    """One selector of Alertmanager alerts that speak for a pool: a route's ``matchers`` list
    (every matcher must hold; docs/design/alertmanager.md)."""

    matchers: tuple[str, ...]

    @pydantic.field_validator("matchers")
    @classmethod
    def _parses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise PydanticCustomError(
                "matcher", "no matcher: a selector needs one, or it would match every alert"
            )
        for text in value:
            parsed = alerts.parse_selector(text)
            if isinstance(parsed, alerts.MatcherError):
                raise PydanticCustomError("matcher", "{why}", {"why": parsed.why})
        return value

    def selector(self) -> alerts.Selector:
        parsed = alerts.parse_selector(self.matchers)
        assert isinstance(parsed, alerts.Selector), "validated at load"
        return parsed


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


def _window_pattern() -> str:
    """What ``windows.parse`` reads, as a regular expression for the chart's schema: ``always``,
    ``never`` or spans ``DAYS HH:MM-HH:MM [ZONE]`` separated by ``;``. The checks a pattern
    cannot make (a span that starts and ends at once) are left to the loader."""
    day = f"({'|'.join(_any_case(d) for d in windows.DAYS)})[^-,;\\s]*"
    days = rf"(\*|{_any_case('daily')}|{day}(-{day})?(,{day}(-{day})?)*)"
    time = r"([01]?\d|2[0-4]):[0-5]\d"
    span = rf"{days}\s+{time}-{time}(\s+[^;\s]+)?"
    words = f"{_any_case('always')}|{_any_case('never')}"
    return rf"^\s*({words}|{span}(\s*;\s*{span})*)\s*$"


def _no_budget_word(schema: dict[str, Any]) -> None:
    schema["anyOf"].append({"const": SLO_OFF, "description": "no error budget"})


class PoolSettings(_Model):
    # The chart's schema says what ``_one_capacity`` says: one of the two, not both. (Merged
    # with ``_Model``'s: unknown keys are still errors, values still immutable.)
    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["capacity"]}, {"required": ["rps_per_node"]}]}
    )

    name: str = Field(min_length=1, max_length=63, json_schema_extra={"pattern": _NAME_PATTERN})
    node_selector: dict[str, str] = Field(json_schema_extra={"minProperties": 1})
    serving_taints: tuple[TaintSettings, ...] = Field(default_factory=_default_serving_taints)
    serving_labels: dict[str, str] = Field(default_factory=dict)
    lent_taints: tuple[TaintSettings, ...] | None = None  # None: <prefix>lent=training:NoSchedule
    lent_labels: dict[str, str] = Field(default_factory=dict)
    inference_selector: dict[str, str] = Field(default_factory=dict)
    # Lend a node only when a pending training job would run on it (core.takers).
    lend_only_to_takers: bool = True
    zone: Zone = "UTC"
    window: str = Field(
        default="always",
        json_schema_extra={"pattern": _window_pattern(), "description": "e.g. Mon-Fri 22:00-06:00"},
    )
    strategy: StrategySettings = Field(default_factory=StrategySettings)
    paused: bool = False  # no lending; the reclaims that keep inference served still happen
    frozen: bool = False  # nothing moves at all, not even safety reclaims (alerted under pressure)
    # ``rps_per_node: X`` is ``capacity: {unit: requests_per_second, per_node: X}`` said the
    # way settings said it before there were units; it loads as that and is never written
    # back (a dump has ``capacity``). Read ``per_node`` (or ``rps_per_node``, below).
    given_rps_per_node: float | None = Field(
        default=None, alias="rps_per_node", gt=0, allow_inf_nan=False, exclude=True
    )
    # Required, or ``rps_per_node`` in its place: validated when left out too, so that the
    # field says which one to give (``_one_capacity``).
    capacity: CapacitySettings | None = Field(default=None, validate_default=True)
    limits: LimitSettings = LimitSettings()
    metrics: MetricsSettings = MetricsSettings()
    # The error budget (DEFAULT_SLO unless given); None, written ``slo: none``: no budget, the
    # strategy keeps fixed margins
    slo: Annotated[SloSettings | None, pydantic.BeforeValidator(_slo_word)] = Field(
        default=DEFAULT_SLO, json_schema_extra=_no_budget_word
    )
    # Alertmanager alerts that hold the pool's loans and take nodes back while they fire; any
    # one selector admits an alert (docs/design/alertmanager.md)
    wake_on: tuple[WakeOnSettings, ...] = ()

    @pydantic.field_serializer("slo", mode="wrap")
    def _slo_out(self, value: SloSettings | None, handler: Any) -> Any:
        # Dumped as written: None as the word, which loads back as no budget (null would load
        # back as the default).
        return SLO_OFF if value is None else handler(value)

    @pydantic.field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise PydanticCustomError(
                "pool_name", "a pool name is lower-case letters, digits and '-', e.g. l20-serving"
            )
        return value

    @pydantic.field_validator("node_selector")
    @classmethod
    def _selects(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise PydanticCustomError(
                "selector", "a pool needs at least one label to select its nodes"
            )
        return value

    @pydantic.model_validator(mode="before")
    @classmethod
    def _rps_per_node_as_capacity(cls, data: Any) -> Any:
        """``rps_per_node: X`` alone, a number > 0, becomes the ``capacity`` it stands for, so
        that a pool reads the same whichever way it was written (and its dump, which has
        ``capacity``, loads back equal). Anything else is left to the fields: a bad value is
        refused under its own name, both together by ``_one_capacity``."""
        if not isinstance(data, Mapping) or "capacity" in data:
            return data
        rps = data.get("rps_per_node")
        if isinstance(rps, bool) or not isinstance(rps, int | float):
            return data
        if not (math.isfinite(rps) and rps > 0):
            return data
        rest = {k: v for k, v in data.items() if k != "rps_per_node"}
        return {**rest, "capacity": {"unit": model.Unit.REQUESTS_PER_SECOND, "per_node": rps}}

    @pydantic.field_validator("capacity")
    @classmethod
    def _one_capacity(
        cls, value: CapacitySettings | None, info: pydantic.ValidationInfo
    ) -> CapacitySettings:
        rps = info.data.get("given_rps_per_node")  # absent when refused: its own line says why
        if value is not None and rps is not None:
            raise PydanticCustomError(
                "capacity",
                "give capacity or rps_per_node, not both; rps_per_node: {rps} is capacity: "
                "{unit: requests_per_second, per_node: {rps}}",
                {"rps": f"{rps:g}"},
            )
        if value is not None:
            return value
        if rps is not None:
            return CapacitySettings(unit=model.Unit.REQUESTS_PER_SECOND, per_node=rps)
        raise PydanticCustomError(
            "capacity_missing",
            "is required: what one warm node serves and in what unit, e.g. {unit: "
            "tokens_per_second, per_node: 2500} (units: {units}); rps_per_node: X is short "
            "for {unit: requests_per_second, per_node: X}",
            {"units": ", ".join(model.Unit)},
        )

    @pydantic.field_validator("metrics")
    @classmethod
    def _templates_fill_in(
        cls, value: MetricsSettings, info: pydantic.ValidationInfo
    ) -> MetricsSettings:
        name = info.data.get("name")  # absent when the name itself was refused
        pool = f"pool {name!r}: " if name else ""
        lines = [f"{f}={errors.shown(t)}: {pool}{why}" for f, t, why in value.template_problems()]
        capacity = info.data.get("capacity")  # absent when refused: its own line says why
        unit_problem = None if capacity is None else value.unit_problem(capacity.unit)
        if unit_problem is not None:
            lines.append(f"preset={value.preset.value!r}: {pool}{unit_problem}")
        if lines:
            # One line per template; ``_lines`` puts each under ``.metrics``.
            raise PydanticCustomError(
                "templates", "{problems}", {"problems": "; ".join(lines), "lines": tuple(lines)}
            )
        return value

    @pydantic.field_validator("window")
    @classmethod
    def _window_parses(cls, value: str, info: pydantic.ValidationInfo) -> str:
        zone = info.data.get("zone", "UTC")  # absent when the zone itself was refused
        parsed = windows.parse(value, zone)
        if isinstance(parsed, windows.WindowError):
            why = parsed.why
            # The parser names the span; with one span that is the whole value, said already.
            lead = f"{' '.join(value.split())!r} "
            if why.startswith(lead):
                why = why[len(lead) :]
            raise PydanticCustomError("window", "{why}", {"why": why})
        return value

    # -- builders ------------------------------------------------------------------------------

    @property
    def unit(self) -> model.Unit:
        """What the pool's demand and ``per_node`` are counted in."""
        return self._capacity.unit

    @property
    def per_node(self) -> float:
        """What one warm node serves at the latency target, in ``unit``."""
        return self._capacity.per_node

    @property
    def rps_per_node(self) -> float:
        """``per_node`` by the name it had when demand was always requests per second (the
        simulator, and ``core.policy.PoolPolicy``, still call it that): in ``unit``."""
        return self._capacity.per_node

    @property
    def _capacity(self) -> CapacitySettings:
        assert self.capacity is not None, "validated at load: given, or made of rps_per_node"
        return self.capacity

    def queries(self) -> Queries:
        """The metrics adapter's queries for this pool: demand and history in its unit."""
        return self.metrics.queries(self.unit)

    def parsed_window(self) -> windows.Window:
        parsed = windows.parse(self.window, self.zone)
        assert isinstance(parsed, windows.Window), "validated at load"
        return parsed

    def lend_spec(self, keys: nodestate.Keys) -> nodestate.LendSpec:
        """Serving taints out, lent taints in; serving labels removed, lent labels set."""
        if self.lent_taints is None:
            add: tuple[model.Taint, ...] = (
                model.Taint(key=keys.lent_taint, value="training", effect="NoSchedule"),
            )
        else:
            add = tuple(t.taint() for t in self.lent_taints)
        labels: dict[str, str | None] = dict.fromkeys(self.serving_labels)
        labels.update(self.lent_labels)
        # What a restore from the specification sets: a label the lend changes that the pool
        # selects on serves with the selector's value.
        serving = {k: v for k, v in self.node_selector.items() if k in labels}
        return nodestate.LendSpec(
            remove_taints=tuple(t.taint() for t in self.serving_taints),
            add_taints=add,
            labels=labels,
            serving_labels={**serving, **self.serving_labels},
        )

    def policy(self, keys: nodestate.Keys) -> PoolPolicy:
        lim = self.limits
        return PoolPolicy(
            rps_per_node=self.per_node,
            unit=self.unit,
            min_serving=lim.min_serving,
            headroom=lim.headroom,
            max_lent_fraction=lim.max_lent_fraction,
            min_loan=lim.min_loan,
            unused_loan=lim.unused_loan,
            cooldown=lim.cooldown,
            max_step_fraction=lim.max_step_fraction,
            staleness=lim.staleness,
            stale_grace=lim.stale_grace,
            queue_limit=lim.queue_limit,
            queue_reclaims=lim.queue_reclaims,
            drop_floor=lim.drop_floor,
            drop_hold=lim.drop_hold,
            reclaim_deadline=lim.reclaim_deadline,
            warmup=lim.warmup,
            window=self.parsed_window(),
            zone=self.zone,
            lend_spec=self.lend_spec(keys),
            lend_only_to_takers=self.lend_only_to_takers,
        )

    def pod_rules(self, keys: nodestate.Keys) -> model.PodRules:

        return model.PodRules(
            lend_taints=self.lend_spec(keys).add_taints,
            serving_taints=tuple(t.taint() for t in self.serving_taints),
            inference_selector=dict(self.inference_selector),
        )

    def build_strategy(self) -> Strategy:
        return self.strategy.build()

    def alert_selectors(self) -> tuple[alerts.Selector, ...]:
        return tuple(w.selector() for w in self.wake_on)


class LeaderElectionSettings(_Model):
    enabled: bool = True
    lease_name: str = Field(default="rebalancer", min_length=1)
    lease_namespace: str = Field(default="default", min_length=1)
    lease_duration: PositiveDuration = timedelta(seconds=15)
    renew_deadline: PositiveDuration = timedelta(seconds=10)
    retry_period: PositiveDuration = timedelta(seconds=2)

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSettings:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise PydanticCustomError(
                "timings",
                "needs retry_period < renew_deadline < lease_duration, got {got}",
                {
                    "got": ", ".join(
                        f"{t.total_seconds():g}s"
                        for t in (self.retry_period, self.renew_deadline, self.lease_duration)
                    )
                },
            )
        return self


class PrometheusSettings(_Model):
    url: str = "http://127.0.0.1:9090"
    timeout: PositiveDuration = timedelta(seconds=5)
    attempts: int = Field(default=3, ge=1)
    retry_budget: PositiveDuration = timedelta(seconds=10)
    backoff: Duration = timedelta(seconds=0.2)
    lookback: WholeSeconds = timedelta(minutes=10)
    resolution: WholeSeconds = timedelta(seconds=15)

    @pydantic.field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise PydanticCustomError(
                "url", "write an http:// or https:// URL, e.g. http://prometheus:9090"
            )
        return value


class AuditSettings(_Model):
    url: str = Field(default=auditurl.DEFAULT_URL, min_length=1)

    @pydantic.field_validator("url")
    @classmethod
    def _supported(cls, value: str) -> str:
        if not value.startswith(AUDIT_SCHEMES):
            raise PydanticCustomError(
                "audit_url",
                "the audit log is kept in SQLite (sqlite+aiosqlite:///PATH) or PostgreSQL "
                "(postgresql+asyncpg://USER@HOST/DB)",
            )
        return value


AUDIT_SCHEMES = ("sqlite+aiosqlite://", "postgresql+asyncpg://")  # the drivers installed


class AlertmanagerSettings(_Model):
    """``POST /api/v1/alertmanager`` (docs/design/alertmanager.md)."""

    # Set: a notification must carry ``Authorization: Bearer <token>`` (Alertmanager's
    # ``http_config.authorization``). Unset: anyone who reaches the port may post.
    token: pydantic.SecretStr | None = None
    # A firing alert holds its pool at most this long after its last notification: keep the
    # receiver's route ``repeat_interval`` well under it.
    max_age: PositiveDuration = timedelta(hours=1)


class HttpSettings(_Model):
    host: str = Field(default="0.0.0.0", min_length=1)  # all interfaces: it serves in a pod
    port: int = Field(default=8080, ge=1, le=65535)


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[str, ...] = typing.get_args(LogLevel)


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


class Settings(_Model):
    """Everything ``rebalancer run`` is configured with. Made by ``load``."""

    # Which cluster this controller runs in: on every audit record, on the Events it records and
    # in rebalancer_cluster_info, so that a fleet sharing one audit store and one dashboard can
    # tell its controllers apart (docs/design/fleet.md). The default is a name, not '': an
    # empty label value is an absent label to Prometheus, and schema version 2 gave the audit
    # rows written before it this same name.
    cluster_name: str = Field(
        default=audit.DEFAULT_CLUSTER,
        json_schema_extra={"pattern": _NAME_PATTERN, "maxLength": 63},
    )
    key_prefix: str = Field(
        default="rebalancer.io/",
        json_schema_extra={"pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$"},
    )
    dry_run: bool = False
    paused: bool = False  # every pool: no lending; safety reclaims still happen
    frozen: bool = False  # every pool: nothing moves at all, not even safety reclaims
    tick_interval: PositiveDuration = timedelta(seconds=30)
    strategy_timeout: PositiveDuration = timedelta(seconds=10)
    # A clock (the API server's, a pool's Prometheus) further than this from the controller's,
    # for certain, stops lending (docs/design/clocks.md).
    clock_skew_bound: Annotated[Duration, pydantic.AfterValidator(_a_second_or_more)] = (
        clocks.DEFAULT_BOUND
    )
    lend_concurrency: int = Field(default=4, ge=1, le=64)  # lends of one tick sent at once
    log_level: Annotated[
        LogLevel,
        pydantic.BeforeValidator(_upper),
        pydantic.WithJsonSchema({"enum": [*LOG_LEVELS, *(v.lower() for v in LOG_LEVELS)]}),
    ] = "INFO"
    leader_election: LeaderElectionSettings = LeaderElectionSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    audit: AuditSettings = AuditSettings()
    http: HttpSettings = HttpSettings()
    alertmanager: AlertmanagerSettings = AlertmanagerSettings()
    pools: tuple[PoolSettings, ...] = ()

    @pydantic.field_validator("cluster_name")
    @classmethod
    def _cluster_label(cls, value: str) -> str:
        if len(value) > 63 or not _NAME.fullmatch(value):
            raise PydanticCustomError(
                "cluster_name",
                "a cluster name is 1 to 63 lower-case letters, digits and '-', starting and "
                "ending with a letter or digit, e.g. prod-eu-1",
            )
        return value

    @pydantic.field_validator("key_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            nodestate.Keys(prefix=value)
        except ValueError:
            raise PydanticCustomError(
                "prefix", "must be a DNS subdomain followed by '/', e.g. 'rebalancer.io/'"
            ) from None
        return value

    # -- builders ------------------------------------------------------------------------------

    def keys(self) -> nodestate.Keys:
        return nodestate.Keys(prefix=self.key_prefix)

    def pool(self, name: str) -> PoolSettings:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def policies(self) -> dict[str, PoolPolicy]:
        keys = self.keys()
        return {pool.name: pool.policy(keys) for pool in self.pools}

    def timings(self) -> leadership.Timings:
        from rebalancer.adapters import leadership

        le = self.leader_election
        return leadership.Timings(
            lease_duration=le.lease_duration.total_seconds(),
            renew_deadline=le.renew_deadline.total_seconds(),
            retry_period=le.retry_period.total_seconds(),
        )

    def metrics_settings(self, pool: PoolSettings | None = None) -> metrics.Settings:
        """The metrics adapter's settings, with ``pool``'s queries (the defaults without one)."""
        from rebalancer.adapters import metrics

        p = self.prometheus
        return metrics.Settings(
            url=p.url,
            timeout=p.timeout.total_seconds(),
            attempts=p.attempts,
            retry_budget=p.retry_budget.total_seconds(),
            backoff=p.backoff.total_seconds(),
            lookback=p.lookback,
            resolution=p.resolution,
            queries=pool.queries() if pool is not None else MetricsSettings().queries(),
        )


# ---------------------------------------------------------------------------------------------
# Loading


class _EnvShape(BaseSettings, Settings):
    """``Settings`` as pydantic-settings sees it, to read ``REBALANCER_*`` variables.

    Only its environment source is used (``_MappingEnvSource``); it is never instantiated.
    ``Settings`` itself is a plain model so that validating it reads nothing from the process.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, reading a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items()}


def config_path(arg: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The config file: ``--config`` if given, else ``REBALANCER_CONFIG``, else none."""
    if arg is not None:
        return arg
    environ = os.environ if env is None else env
    value = environ.get(CONFIG_ENV, "").strip()
    return Path(value) if value else None


def load(path: Path | None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``path`` (None: defaults only) with ``env`` over it (None: os.environ).

    ``path`` is taken as given: the CLI resolves ``--config`` / ``REBALANCER_CONFIG`` with
    ``config_path``. Raises ``InvalidSettings`` (a ``ConfigError``) with one line per problem
    (``exc.lines``), and nothing else, for bad input.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    lines: list[str] = []
    data: dict[str, Any] = {}
    if path is not None:
        file_data = _read_yaml(path)
        if isinstance(file_data, str):
            lines.append(file_data)
        else:
            data = file_data
    env_data, env_lines = _read_env(environ)
    lines.extend(env_lines)
    merged = _merge(data, env_data)
    lines.extend(_duplicate_pools(merged.get("pools")))
    settings: Settings | None = None
    try:
        settings = Settings.model_validate(merged)
    except pydantic.ValidationError as exc:
        lines.extend(_lines(exc))
    if lines or settings is None:
        raise InvalidSettings(lines)
    return settings


class InvalidSettings(ConfigError):
    """Every problem found in the settings, one line each (``lines``), the CLI prints them."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why a YAML file could not be read: the words after its name in an error line."""

    why: str


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path`` (the settings file, a pools file), or ``Unreadable``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Unreadable("does not exist")
    except IsADirectoryError:
        return Unreadable("is a directory, not a file")
    except PermissionError:
        return Unreadable("cannot be read (permission denied)")
    except UnicodeDecodeError:
        return Unreadable("is not UTF-8 text")
    except OSError as exc:
        return Unreadable(f"cannot be read ({exc.strerror or exc})")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        return Unreadable(f"not valid YAML{where}: {problem}")


def _read_yaml(path: Path) -> dict[str, Any] | str:
    doc = read_yaml(path)
    if isinstance(doc, Unreadable):
        return f"config file {str(path)!r}: {doc.why}"
    if doc is None:
        return {}  # an empty file: every default
    if not isinstance(doc, dict):
        return (
            f"config file {str(path)!r}: must be a mapping of settings (key: value), "
            f"not a {_yaml_kind(doc)}"
        )
    bad_keys = [k for k in doc if not isinstance(k, str)]
    if bad_keys:
        name = errors.shown(bad_keys[0])
        return f"config file {str(path)!r}: setting names must be text, not {name}"
    return doc


def _yaml_kind(doc: object) -> str:
    if isinstance(doc, list):
        return "list"
    if isinstance(doc, str):
        return "string"
    return type(doc).__name__


_COMPOUND = ("leader_election", "prometheus", "audit", "http", "alertmanager", "pools")


def _read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    fields = set(Settings.model_fields)
    lines: list[str] = []
    unreadable = False
    for name, value in sorted(environ.items()):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper == CONFIG_ENV:
            continue
        rest = upper[len(ENV_PREFIX) :]
        top = rest.split("__", 1)[0].lower()
        if top not in fields:
            lines.append(
                f"{upper}={errors.shown(value)}: unknown setting; known: "
                + ", ".join(ENV_PREFIX + f.upper() for f in Settings.model_fields)
            )
        elif top in _COMPOUND and "__" not in rest:
            try:
                json.loads(value)
            except ValueError as exc:
                lines.append(
                    f"{upper}={errors.shown(value)}: not JSON ({exc}); write this setting as JSON"
                )
                unreadable = True
    if unreadable:
        return {}, lines
    try:
        data = _MappingEnvSource(_EnvShape, environ)()
    except SettingsError as exc:
        cause = exc.__cause__
        lines.append(f"environment: {exc}" + (f" ({cause})" if cause else ""))
        return {}, lines
    return data, lines


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``; mappings merge key by key, anything else (lists too) replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _duplicate_pools(pools: object) -> list[str]:
    if not isinstance(pools, list | tuple):
        return []
    first: dict[str, int] = {}
    lines = []
    for index, pool in enumerate(pools):
        name = pool.get("name") if isinstance(pool, Mapping) else None
        if not isinstance(name, str):
            continue
        if name in first:
            lines.append(
                f"pools[{index}].name={errors.shown(name)}: duplicate pool name; "
                f"pools[{first[name]}] has it already"
            )
        else:
            first[name] = index
    return lines


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(settings)"


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model that holds the field at ``loc`` (for listing its known keys)."""
    current: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _model_in(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _known(holder: type[BaseModel]) -> str:
    """The keys a settings block takes, as they are written (an alias, where a field has one)."""
    return ", ".join(field.alias or name for name, field in holder.model_fields.items())


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _lines(exc: pydantic.ValidationError) -> list[str]:
    lines: list[str] = []
    found = exc.errors(include_url=False)
    refused = {tuple(error["loc"]) for error in found}
    for error in found:
        loc = list(error["loc"])
        kind = error["type"]
        value = error.get("input")
        ctx = error.get("ctx") or {}
        if kind == "capacity_missing" and (*loc[:-1], "rps_per_node") in refused:
            continue  # rps_per_node was given, and its own line says what is wrong with it
        if kind == "strategy_params":
            base = _path(loc)
            lines.extend(f"{base}.params.{problem}" for problem in ctx.get("lines", ()))
            continue
        if kind == "templates":
            base = _path(loc)
            lines.extend(f"{base}.{problem}" for problem in ctx.get("lines", ()))
            continue
        path = _path(loc)
        given = errors.shown(value)
        if kind in ("timings", "capacity_missing"):
            lines.append(f"{path}: {error['msg']}")
        elif kind == "missing":
            lines.append(f"{path}: is required")
        elif kind == "extra_forbidden":
            holder = _model_at(loc[:-1])
            known = _known(holder) if holder is not None else ""
            lines.append(
                f"{path}={given}: unknown setting" + (f"; known: {known}" if known else "")
            )
        elif kind == "model_type":
            lines.append(f"{path}={given}: must be a mapping of settings (key: value)")
        elif kind == "string_type" and isinstance(value, bool | int | float):
            lines.append(f"{path}={given}: must be text; quote it in YAML: '{json.dumps(value)}'")
        else:
            # Lists are kept as tuples (settings are immutable); a YAML user writes a list.
            msg = error["msg"].removeprefix("Value error, ").replace("valid tuple", "valid list")
            lines.append(f"{path}={given}: {msg}")
    return _dedupe(lines)


def _dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
