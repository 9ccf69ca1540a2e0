"""Lend every idle node the planner allows inside a time window, and take them back before it
closes, early enough (``lead_minutes``) that they serve warm again when the window ends.

The simplest strategy to reason about: it ignores load, and relies on the planner's headroom
rule to keep enough nodes serving. Use it where the quiet hours are known and stable.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy, windows


class Params(strategy.Params):
    window: str = pydantic.Field(
        default="Mon-Sun 22:00-06:00",
        description="when lending is wanted; the pool's zone applies when none is named",
    )
    lead_minutes: int = pydantic.Field(default=10, ge=0, le=24 * 60)

    @pydantic.field_validator("window")
    @classmethod
    def _parses(cls, value: str) -> str:
        parsed = windows.parse(value)
        if isinstance(parsed, windows.WindowError):
            raise ValueError(parsed.why)
        return value


@cache
def _window(text: str, zone: str) -> windows.Window:
    parsed = windows.parse(text, zone)
    assert isinstance(parsed, windows.Window), "validated when the parameters were built"
    return parsed


class Window:
    name: ClassVar[str] = "window"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        window = _window(self.params.window, pool.zone)
        lead = timedelta(minutes=self.params.lead_minutes)
        closes = window.next_edge(pool.now)
        if window.is_open(pool.now) and (closes is None or closes > pool.now + lead):
            return model.Proposal(pool.size, f"inside window {window}")
        return model.Proposal(0, f"outside window {window} (or closing within {lead})")


PLUGIN = strategy.Plugin(Params, Window, "lend everything the planner allows inside fixed hours")
