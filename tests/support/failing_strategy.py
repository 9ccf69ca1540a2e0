"""``python -m tests.support.failing_strategy ARGS``: ``rebalancer`` with one more strategy.

The end-to-end tests need a controller process whose strategy fails on every call, to show that
a pool keeps its safety rules without it. This module registers ``always-raises`` through the
registry's public ``register`` (as a team's own strategy would be) and runs the real entry point.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from rebalancer import cli
from rebalancer.adapters import registry
from rebalancer.core import model, strategy


class AlwaysRaises:
    name: ClassVar[str] = "always-raises"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: strategy.Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        raise ZeroDivisionError("float division by zero")


class _NoParams(strategy.Params):
    pass


if __name__ == "__main__":
    registry.register("always-raises", _NoParams, AlwaysRaises, "raises on every call")
    sys.exit(cli.main())
