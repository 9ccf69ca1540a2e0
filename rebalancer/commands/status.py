"""The body of ``rebalancer status``: each pool and its nodes as the next tick would see them.

Where it sits: ``rebalancer.cli.status`` opens a controller that only reads (``common.reading``)
and prints; this module observes once as the loop does (``Reconciler.preview``: the nodes from
the informer's first list, each pool's error budget from the audit log) and hands the snapshot
to ``core.status``, which makes the rows.
"""

from __future__ import annotations

from rebalancer.core import bounded, status
from rebalancer.core.model import PoolName
from rebalancer.errors import ConfigError
from rebalancer.runtime.reconcile import Reconciler


async def preview(reconciler: Reconciler, *, pool: str | None) -> status.Json:
    """The status of every pool (or of ``pool``: a ``ConfigError`` when none is so named)."""
    names = [p.name for p in reconciler.pools]
    if pool is not None and pool not in names:
        known = ", ".join(names) or "none"
        raise ConfigError(
            f"--pool={bounded.quoted(pool)}: no configured pool has that name ({known})"
        )
    snapshot, _ = await reconciler.preview()
    held = {
        name: status.Held(c.paused, c.frozen)
        for name in names
        for c in (reconciler.pool_controls(name),)
    }
    only = None if pool is None else PoolName(pool)
    return status.status(snapshot, held, reconciler.keys, only)
