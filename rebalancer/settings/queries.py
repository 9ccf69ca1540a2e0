"""A pool's PromQL: the metrics block of ``PoolSettings``, a server's preset or templates.

Where it sits: ``PoolSettings.metrics``; ``runtime.adapterconfig.queries`` turns it into the
metrics adapter's ``Queries`` (rebalancer/adapters/promql.py) in the pool's unit. Every template
is checked here as the settings are read, so that a typo in a placeholder stops the start
instead of failing the pool's query on every tick. The templates a preset fills in are values
of the fields, and stay here; the adapter's objects are built in the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from string import Template
from typing import Any

import pydantic
from pydantic import Field
from pydantic_core import PydanticCustomError

from rebalancer.adapters import presets
from rebalancer.core import model
from rebalancer.settings.values import SettingsBlock

# The default server: its templates are the defaults of ``MetricsSettings`` (and the adapter's).
_VLLM = presets.preset(presets.Engine.VLLM)
_DEFAULT_SCOPE = 'max by (namespace, pod, node) (kube_pod_info{node=~"$nodes"})'


class MetricQuerySettings(SettingsBlock):
    """One metric as two PromQL templates; see rebalancer/adapters/promql.py ``MetricQuery``.

    ``sampled`` left out is filled in by ``MetricsSettings`` from the preset where ``value``
    reads one of its series (``presets.sampled_for``); where it reads none it is refused here,
    saying what ``sampled`` is."""

    value: str = Field(min_length=1)
    sampled: str = Field(default="", validate_default=True)

    @pydantic.field_validator("sampled")
    @classmethod
    def _sampled_given(cls, value: str) -> str:
        if not value:
            raise PydanticCustomError(
                "sampled_missing",
                "is required where value reads none of the preset's series: when the series "
                "value reads were last scraped, scoped to the pool, e.g. 'timestamp(my_metric) "
                "and on (namespace, pod) $scope' (docs/configuration.md, metrics)",
            )
        return value


def _gauge_query(gauge: presets.Gauge) -> MetricQuerySettings:
    """A preset's gauge summed over the pool's pods, sampled by its scrape times."""
    return MetricQuerySettings(value=presets.pooled(gauge), sampled=presets.sampled(gauge.selector))


class MetricsSettings(SettingsBlock):
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
        filled = {k: _with_sampled(preset, k, v) for k, v in data.items()}
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
            ("history", self.history, HISTORY_PLACEHOLDERS),
            ("node_served", self.node_served, HISTORY_PLACEHOLDERS),
            ("node_saturated", self.node_saturated, HISTORY_PLACEHOLDERS),
            ("scope", self.scope, SCOPE_PLACEHOLDERS),
        ]
        for name in ("demand", "queue", "running", "gpu_busy"):
            query: MetricQuerySettings | None = getattr(self, name)
            if query is not None:
                templates.append((f"{name}.value", query.value, QUERY_PLACEHOLDERS))
                templates.append((f"{name}.sampled", query.sampled, QUERY_PLACEHOLDERS))
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

    def demand_in(self, unit: model.Unit) -> MetricQuerySettings:
        """``demand``, or where it is left out the preset's in ``unit``."""
        if self.demand is not None:
            return self.demand
        return MetricQuerySettings(
            value=presets.demand_value(self.server, unit),
            sampled=presets.demand_sampled(self.server, unit),
        )

    def history_in(self, unit: model.Unit) -> str:
        """``history``, or where it is left out the preset's in ``unit``."""
        return self.history or presets.history(self.server, unit)

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


def _with_sampled(preset: presets.Preset, name: str, given: Any) -> Any:
    """A metric written as ``value`` alone, with the preset's ``sampled`` where it reads one of
    the preset's series; anything else as given (the fields refuse what is wrong)."""
    if name not in _METRICS or not isinstance(given, Mapping) or "sampled" in given:
        return given
    value = given.get("value")
    found = presets.sampled_for(preset, value) if isinstance(value, str) else None
    return given if found is None else {**given, "sampled": found}


_METRICS = ("demand", "queue", "running", "gpu_busy")

# What ``rebalancer.adapters.metrics.render`` fills in (a test holds them equal): ``$scope``,
# ``$nodes`` and ``$pool`` in a query, ``$window`` too in ``history``, ``node_served`` and
# ``node_saturated``; ``scope`` itself is filled in with ``$nodes`` and ``$pool``.
QUERY_PLACEHOLDERS = ("scope", "nodes", "pool")
HISTORY_PLACEHOLDERS = (*QUERY_PLACEHOLDERS, "window")
SCOPE_PLACEHOLDERS = ("nodes", "pool")


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
