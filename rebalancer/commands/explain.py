"""The body of ``rebalancer explain``: one node, or one pool, as the next tick would see it.

Where it sits: ``rebalancer.cli.explain`` opens a controller that only reads and prints the
document; this module observes and decides once, read-only (``Reconciler.preview``: the loop's
own observe and decide, then ``core.tick.plan_tick``), and explains from that with
``runtime.explaining.answer``, the same document ``GET /api/v1/explain`` gives from the loop's
last tick.
"""

from __future__ import annotations

from datetime import timedelta

from rebalancer.core import explain
from rebalancer.core.explain import Json
from rebalancer.runtime import explaining
from rebalancer.runtime.reconcile import Reconciler


async def preview(
    reconciler: Reconciler,
    *,
    node: str | None,
    pool: str | None,
    interval: timedelta = timedelta(seconds=30),
) -> Json:
    """The explanation of ``node`` or ``pool`` as the next tick would see it
    (``explaining.NotExplained`` for one the controller does not drive), from the inputs the
    loop holds: the demand history on its grid, and each pool's belief about its demand read
    back over the last ``drop_hold`` as a loop ticking every ``interval`` (the
    ``tick_interval`` setting) judged it."""
    snapshot, decision = await reconciler.preview(recall=interval)
    return explaining.answer(reconciler, snapshot, decision, node=node, pool=pool)


def lines(doc: Json) -> list[str]:
    return explain.node_lines(doc) if "node" in doc else explain.pool_lines(doc)
