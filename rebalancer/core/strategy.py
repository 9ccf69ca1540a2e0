"""The contract a strategy implements, built-in or shipped by a team as a package of its own.

Where it sits: each tick, the runtime (or the simulator) hands every pool's ``model.PoolView``
to that pool's ``Strategy`` and gets a ``model.Proposal``; the planner then applies the safety
rules and may refuse any part of it. A strategy is found by name through the
``rebalancer.strategies`` entry points, each naming a ``Plugin``: the parameters the strategy
takes and how to make one from them (``rebalancer.adapters.registry`` looks them up).

Why it is in the core: a strategy depends on nothing but the core's values, and the controller
must be able to hold one without importing any strategy module. The built-ins in the top-level
``strategies`` package implement this contract exactly as a third party's would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import pydantic

from rebalancer.core import model


class Params(pydantic.BaseModel):
    """Base of strategy parameters: unknown keys are errors, values are immutable."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Strategy(Protocol):
    name: ClassVar[str]
    # Whether ``decide`` reads ``pool.history``: the runtime asks Prometheus for the demand
    # history (days of it, refreshed every few minutes) only for a strategy that does.
    reads_history: ClassVar[bool]

    def decide(self, pool: model.PoolView) -> model.Proposal:
        """How many nodes of ``pool`` should be lent at ``pool.now``, and why."""
        ...


@dataclass(frozen=True)
class Plugin:
    """What an entry point of the ``rebalancer.strategies`` group names.

    ``make`` is called once per pool with ``params`` validated, i.e. an instance of ``params``
    (the settings' ``strategy.params`` mapping, refused field by field if it does not fit).
    """

    params: type[Params]
    make: Callable[[Any], Strategy]
    summary: str = ""  # one line, for listings


class ParameterError(ValueError):
    """A strategy that cannot be built: an unknown name, a plugin that does not load, or
    parameters that do not validate; one line per problem (one per bad field)."""

    def __init__(self, strategy: str, problems: list[str]) -> None:
        self.strategy = strategy
        self.problems = problems
        super().__init__(f"strategy {strategy!r}: " + "; ".join(problems))
