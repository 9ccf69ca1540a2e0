"""The Alertmanager alerts that speak for a pool (``wake_on``): selectors of matchers.

Where it sits: ``PoolSettings.wake_on``; each selector is parsed by ``core.alerts`` as the
settings are read, so that a matcher it cannot read stops the start (docs/design/alertmanager.md).
"""

from __future__ import annotations

import pydantic
from pydantic_core import PydanticCustomError

from rebalancer.core import alerts
from rebalancer.settings.values import SettingsBlock


class WakeOnSettings(SettingsBlock):
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
