"""A pool's error budget (``slo``): the minutes per window in which lending may cost it.

Where it sits: ``PoolSettings.slo``; ``SloSettings.slo()`` is the core's ``model.Slo``. Every
pool has one unless its settings say ``slo: none``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pydantic
from pydantic import ConfigDict, Field
from pydantic_core import PydanticCustomError

from rebalancer.core import model
from rebalancer.settings.values import PositiveDuration, SettingsBlock


class SloSettings(SettingsBlock):
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


def slo_word(value: Any) -> Any:
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
