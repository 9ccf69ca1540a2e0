"""How one leading tick walks through the code: the calls that cross from one module of the
product to another, and those that come back into the reconciler from elsewhere.

A tick is run for real (the API emulator over HTTP, the informer, a leader-gated actuator and
an in-memory audit store: the world of ``tests/runtime/test_reconcile.py``) under a profiler
that notes each call whose caller and callee are functions of ``rebalancer``. Two ticks are
walked: one that lends the idle nodes, and one that reclaims them and drives the drains.

Printed per tick: the distinct caller -> callee edges that cross a module boundary inside
``rebalancer.runtime`` (the runtime's own zig-zag), those into any other package of the
product, and the distinct edges into ``rebalancer.runtime.reconcile`` from another module (a
re-entry into the reconciler). Distinct edges, not calls: a wave of ten nodes walks the same
edges as one node.

    .venv/bin/python bench/tick_walk.py
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, as the tests

from rebalancer.core.model import PoolName
from tests.support.pools import IDLE, POOL
from tests.support.reconciling import HIGH, LOW, add_training, world

RUNTIME = "rebalancer.runtime"
RECONCILE = "rebalancer.runtime.reconcile"
Edge = tuple[str, str, str, str]  # caller module, caller function, callee module, callee function


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


async def walked(work: Callable[[], Awaitable[Any]]) -> set[Edge]:
    """The edges between functions of the product that ``work`` walks."""
    edges: set[Edge] = set()

    def note(frame: FrameType, event: str, _: object) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = _module(frame), _module(frame.f_back)
        name = frame.f_code.co_qualname
        # A value's own methods (a dataclass's __init__, a comprehension) are not a step of the
        # walk: building an effect is not calling into its module.
        if name.rsplit(".", 1)[-1].startswith(("__", "<")):
            return
        if callee.startswith("rebalancer.") and caller.startswith("rebalancer."):
            edges.add((caller, frame.f_back.f_code.co_qualname, callee, name))

    sys.setprofile(note)
    try:
        await work()
    finally:
        sys.setprofile(None)
    return edges


def figures(edges: set[Edge]) -> tuple[int, int, int, int, str]:
    crossing = {e for e in edges if e[0] != e[2]}
    inside = {e for e in crossing if e[0].startswith(RUNTIME) and e[2].startswith(RUNTIME)}
    out = {e for e in crossing if e[0].startswith(RUNTIME) and not e[2].startswith(RUNTIME)}
    back = {e for e in crossing if e[2] == RECONCILE}
    # How many ways the reconciler goes into each module of the runtime (entry points).
    entries: dict[str, set[str]] = {}
    for caller, _, callee, name in inside:
        if caller == RECONCILE:
            entries.setdefault(callee.rsplit(".", 1)[-1], set()).add(name)
    by_module = ", ".join(f"{m} {len(n)}" for m, n in sorted(entries.items()))
    return len(inside), len(out), len(back), sum(len(n) for n in entries.values()), by_module


async def main() -> None:
    print("tick      runtime->runtime  runtime->other  into reconcile  out of reconcile")
    async with world() as w:
        await w.reconciler.start()
        w.metrics.rps[PoolName(POOL)] = LOW
        lend = await walked(w.tick)
        add_training(w.store, len(IDLE))
        w.metrics.rps[PoolName(POOL)] = HIGH
        reclaim = await walked(w.tick)
        w.advance(30)
        drive = await walked(w.tick)
    for name, edges in (("lend", lend), ("reclaim", reclaim), ("drive", drive)):
        inside, out, back, entries, by_module = figures(edges)
        print(f"{name:<10}{inside:>16}{out:>16}{back:>16}{entries:>18}  ({by_module})")


if __name__ == "__main__":
    asyncio.run(main())
