"""``python -m tests.support.failing_strategy ARGS``: ``rebalancer`` with one more strategy.

The end-to-end tests need a controller process whose strategy fails on every call, to show that
a pool keeps its safety rules without it. This module registers ``always-raises`` through the
registry's public ``register`` (as a team's own strategy would be) and runs the real entry point.
"""

from __future__ import annotations

import importlib
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


# ``--held ARGS``: the modules ``rebalancer run`` imports as it starts imported first, then
# nothing more until a line comes on stdin, then ``rebalancer ARGS`` as always. A test that starts
# the controller many times in a row (tests/test_kill9.py) starts the next process while the last
# one still runs, so that the next is ready within a moment of being let go.
HELD = "--held"
RUN_IMPORTS = ("rebalancer.runtime.loop", "rebalancer.runtime.wiring")


def main(argv: list[str]) -> int:
    registry.register("always-raises", _NoParams, AlwaysRaises, "raises on every call")
    if argv[:1] == [HELD]:
        argv = argv[1:]
        for name in RUN_IMPORTS:
            importlib.import_module(name)
        sys.stdin.readline()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
