"""Baselines every simulator report shows next to the real strategies (docs/evaluation.md).

- ``static``: never lend; the safety reference.
- ``cron``: lend every node above ``min_serving`` from 22:00 to 06:00 in the pool's zone and take
  them all back at 06:00, like a kube-green schedule.
- ``reactive``: lend what the current load leaves over, with no hysteresis and no look-ahead,
  like a naive KEDA-style threshold.

The simulator runs them with the planner's guards off, so that the figures show what each rule
does on its own.
"""

from __future__ import annotations

from typing import ClassVar

import pydantic

from rebalancer.core import model, strategy, windows


class NoParams(strategy.Params):
    pass


class CronParams(strategy.Params):
    hours: str = pydantic.Field(default="22:00-06:00", description="HH:MM-HH:MM, pool zone")

    @pydantic.field_validator("hours")
    @classmethod
    def _parses(cls, value: str) -> str:
        parsed = windows.parse(f"daily {value}")
        if isinstance(parsed, windows.WindowError):
            raise ValueError(parsed.why)
        return value


class Static:
    name: ClassVar[str] = "static"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: NoParams) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        return model.Proposal(0, "static: never lend")


class Cron:
    name: ClassVar[str] = "cron"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: CronParams) -> None:
        self.params = params
        self._windows: dict[str, windows.Window] = {}

    def decide(self, pool: model.PoolView) -> model.Proposal:
        window = self._windows.get(pool.zone)
        if window is None:
            parsed = windows.parse(f"daily {self.params.hours} {pool.zone}")
            assert isinstance(parsed, windows.Window), "hours were validated with the parameters"
            window = self._windows[pool.zone] = parsed
        if window.is_open(pool.now):
            # A minimum above the pool's size (a pool shrunk under its policy) lends nothing.
            lendable = max(0, pool.size - pool.min_serving)
            return model.Proposal(lendable, f"cron: inside {window}")
        return model.Proposal(0, f"cron: outside {window}")


class Reactive:
    name: ClassVar[str] = "reactive"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: NoParams) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        if pool.demand is None:
            return model.Proposal(0, "reactive: demand unknown")
        need = pool.need(pool.demand.value)
        return model.Proposal(
            max(0, pool.size - need),
            f"reactive: {pool.demand.value:.1f} {pool.unit.symbol} needs {need} nodes",
            {"demand_rps": pool.demand.value, "need": need},
        )


STATIC = strategy.Plugin(NoParams, Static, "never lend")
CRON = strategy.Plugin(CronParams, Cron, "lend everything inside fixed hours")
REACTIVE = strategy.Plugin(NoParams, Reactive, "lend what current load leaves")
