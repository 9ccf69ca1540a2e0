"""What one tick did, as a value: the report ``Reconciler.tick`` returns.

The phases do not call the controller's metrics. What they measure or meet on the way (a clock's
skew, a strategy that timed out, a reclaim that ended, an audit store that failed) they note in
the reconciler's ``Tally``; the tick hands what the tally holds over in its report, and
whoever runs the loop gives the report to ``runtime.telemetry``. A tick that raises hands
nothing over: what it noted stays in the tally and comes with the next report, so a
counter is late by one tick, never lost.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import clocks, model
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import Action, PoolName
from rebalancer.runtime.seams import Applied


@dataclass
class Tally:
    """What the phases of a tick (and of any failed tick before it) noted, for the telemetry.

    A gauge's reading stays ``None`` when no tick measured it since the last ``take`` (a tick
    that stopped early); the telemetry then keeps the value it has. The lists are events, in
    the order they happened.
    """

    leader: tuple[str, bool] | None = None  # (this replica's identity, whether it may write)
    lent: Mapping[str, int] | None = None  # nodes on loan, per pool
    overdue: Mapping[str, int] | None = None  # nodes whose reclaim is past its deadline
    safety_only: Mapping[str, bool] | None = None  # planned on safety rules alone
    demand_held: Mapping[str, bool] | None = None  # demand held over a failed read
    frozen_under_pressure: Mapping[str, bool] | None = None
    clocks: Mapping[PoolName, clocks.Clocks] | None = None
    unreadable: Mapping[str, int] | None = None  # objects the informer could not read, by kind
    budgets: Mapping[str, model.ErrorBudget] | None = None
    audit_store: tuple[bool, int] | None = None  # (failing, records waiting in the spool)
    decided: list[model.Plan] = field(default_factory=list)  # plans the leader carried out
    strategy_failures: list[tuple[str, str, str]] = field(default_factory=list)  # pool, name, kind
    planner_failures: list[str] = field(default_factory=list)  # pools
    borrowing_minutes: list[str] = field(default_factory=list)  # a pool per minute lending cost
    audit_failures: list[str] = field(default_factory=list)  # the store operation that raised
    spool_overflows: int = 0
    reclaims: list[tuple[str, datetime, datetime]] = field(default_factory=list)  # decided, serving

    def take(self) -> Tally:
        """What was noted since the last ``take``; this tally starts again empty."""
        taken = copy.copy(self)
        vars(self).update(vars(Tally()))
        return taken


@dataclass(frozen=True)
class TickReport:
    now: datetime
    snapshot: model.Snapshot
    proposals: Mapping[PoolName, model.Proposal]
    plan: model.Plan
    leading: bool  # this tick wrote (it led, and had started up for this term)
    audited: tuple[AuditRecord, ...] = ()  # what ``AuditLog.tick`` wrote
    applied: tuple[Applied, ...] = ()
    error: str | None = None  # why nothing was written (the audit store failed)
    happened: Tally = field(default_factory=Tally)

    @property
    def steps(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call is not Action.PROGRESS)

    @property
    def progressed(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call is Action.PROGRESS)
