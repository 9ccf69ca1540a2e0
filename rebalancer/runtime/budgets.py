"""The error budgets' count restored: the minutes in which a pool's requests queued beyond its
limit while nodes were away on loan, as the audit log holds them.

Where it sits: ``runtime.recovering`` restores the count at start-up (a new leader, or this one
restarted, takes it up where the last one left it), and ``Reconciler.preview`` for a process
that only explains; ``runtime.step`` counts each new minute (``count_costs``) and hands each
pool's budget to the snapshot it observes. Kept apart because it is the one read of the count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from rebalancer.core.model import PoolName
from rebalancer.runtime.seams import AuditTrail, PoolConfig

MINUTE = timedelta(minutes=1)

Costs = Mapping[PoolName, tuple[datetime, ...]]


async def restore(pools: Sequence[PoolConfig], trail: AuditTrail, now: datetime) -> Costs:
    """Every pool's minutes as the audit log holds them, within its error budget's window (the
    last minute only for a pool without a budget). Raises if the store fails."""
    out = {}
    for config in pools:
        since = now - (config.slo.window if config.slo else MINUTE)
        out[config.name] = tuple(await trail.cost_minutes(config.name, since))
    return out


async def restore_unknown(
    pools: Sequence[PoolConfig], costs: Costs, trail: AuditTrail, now: datetime
) -> Costs:
    """``costs`` with the minutes of each pool with an error budget whose count is not known
    yet (a process that only explains, and never started up)."""
    out = dict(costs)
    for config in pools:
        if config.slo is not None and config.name not in out:
            since = now - config.slo.window
            out[config.name] = tuple(await trail.cost_minutes(config.name, since))
    return out
