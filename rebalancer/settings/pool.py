"""One pool of inference nodes (``pools[]``): which nodes, when they may be lent, how.

Where it sits: ``Settings.pools``; made of the blocks beside it (taints, queries, limits,
strategy, slo, wake_on) and of ``capacity``, it builds what the core takes for the pool:
``policy(keys)``, ``lend_spec(keys)``, ``pod_marks(keys)``, ``build_strategy()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
from pydantic import ConfigDict, Field
from pydantic_core import PydanticCustomError

from rebalancer import errors
from rebalancer.core import alerts, model, nodestate, windows
from rebalancer.core.policy import PoolPolicy
from rebalancer.settings.limits import LimitSettings
from rebalancer.settings.queries import MetricsSettings
from rebalancer.settings.slo import DEFAULT_SLO, SLO_OFF, SloSettings, slo_word
from rebalancer.settings.strategy import StrategySettings
from rebalancer.settings.taints import TaintSettings
from rebalancer.settings.values import NAME, NAME_PATTERN, SettingsBlock, Zone
from rebalancer.settings.wake_on import WakeOnSettings

if TYPE_CHECKING:
    from rebalancer.core.strategy import Strategy


def _default_serving_taints() -> tuple[TaintSettings, ...]:
    return (TaintSettings(key="workload", value="inference", effect="NoSchedule"),)


class CapacitySettings(SettingsBlock):
    """What one warm node of the pool serves at the latency target, and what that is counted
    in. The pool's demand is read in the same unit (``metrics``), so that the two compare;
    ``rebalancer capacity`` measures ``per_node`` from the pool's history (docs/capacity.md)."""

    unit: model.Unit
    per_node: float = Field(gt=0, allow_inf_nan=False)


def _window_schema() -> dict[str, Any]:
    """What ``windows.parse`` reads, for the chart's schema: ``always``, ``never`` or spans
    ``DAYS HH:MM-HH:MM [ZONE]`` separated by ``;``, as two patterns, the days' and the times'.

    Helm refuses a value by printing the pattern it does not match: one pattern for the whole
    grammar, every day spelt in both cases, came back as a line of 1,186 characters for a
    misspelt day. Each of these is short and case-blind (``(?i)``, which Go's and Python's
    expressions both read), and the one a misspelt day fails lists the days it takes. The
    checks a pattern cannot make (a span that starts and ends at once, a day written ``Mon.``,
    which the loader reads by its first three letters) are left to the loader."""
    day = f"({'|'.join(windows.DAYS)})"
    days = rf"(?i)^\s*(always|never|((^|;)\s*(\*|daily|({day}\w*[-,]?)+)\s[^;]*)+)$"
    time = r"([01]?\d|2[0-4]):[0-5]\d"
    times = rf"(?i)^\s*(always|never|((^|;)[^;]*\s{time}-{time}(\s+[^;\s]+)?\s*)+)$"
    return {
        "pattern": days,  # not under allOf: Helm would print an "'allOf' failed" line first
        "allOf": [{"pattern": times}],
        "description": "always, never, or DAYS HH:MM-HH:MM [ZONE] spans separated by ';': "
        "DAYS is daily, * or days of mon tue wed thu fri sat sun, e.g. Mon-Fri 22:00-06:00",
    }


def _no_budget_word(schema: dict[str, Any]) -> None:
    schema["anyOf"].append({"const": SLO_OFF, "description": "no error budget"})


class PoolSettings(SettingsBlock):
    # The chart's schema says what ``_one_capacity`` says: one of the two, not both. (Merged
    # with ``SettingsBlock``'s: unknown keys are still errors, values still immutable.)
    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["capacity"]}, {"required": ["rps_per_node"]}]}
    )

    name: str = Field(min_length=1, max_length=63, json_schema_extra={"pattern": NAME_PATTERN})
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
        json_schema_extra=_window_schema(),
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
    slo: Annotated[SloSettings | None, pydantic.BeforeValidator(slo_word)] = Field(
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
        if not NAME.fullmatch(value):
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
            # One line per template; ``problem_lines`` puts each under ``.metrics``.
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
            reclaim_notice=lim.reclaim_notice,
            reclaim_deadline=lim.reclaim_deadline,
            warmup=lim.warmup,
            window=self.parsed_window(),
            zone=self.zone,
            lend_spec=self.lend_spec(keys),
            lend_only_to_takers=self.lend_only_to_takers,
        )

    def pod_marks(self, keys: nodestate.Keys) -> model.PodMarks:

        return model.PodMarks(
            lend_taints=self.lend_spec(keys).add_taints,
            serving_taints=tuple(t.taint() for t in self.serving_taints),
            inference_selector=dict(self.inference_selector),
            prefix=keys.prefix,
        )

    def build_strategy(self) -> Strategy:
        return self.strategy.build()

    def alert_selectors(self) -> tuple[alerts.Selector, ...]:
        return tuple(w.selector() for w in self.wake_on)
