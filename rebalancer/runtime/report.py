"""What one tick did, as a value: the report ``Reconciler.tick`` returns.

No phase calls the controller's metrics. The step decides the tick's gauges and counts as
values (``runtime.effects.Noted``), the shell gathers what carrying the effects out came to
(``runtime.shell.Run``), and the observation says what it measured (the clocks, what could
not be read); the tick puts them together in its report as ``Happened``, and whoever runs the
loop gives the report to ``runtime.telemetry``. A tick that raises reports nothing: its gauges
keep their values until the next tick measures them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import clocks, model
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import Action, PoolName
from rebalancer.core.outcomes import Notice
from rebalancer.runtime.effects import Noted
from rebalancer.runtime.seams import Applied


@dataclass(frozen=True)
class Happened(Noted):
    """The gauges and counts of one tick, for the telemetry: what the step decided (``Noted``),
    what the observation measured, and what carrying the effects out met.

    A gauge's reading is ``None`` when the tick did not measure it (a tick that stopped
    early); the telemetry then keeps the value it has. The tuples are events, in the order
    they happened.
    """

    clocks: Mapping[PoolName, clocks.Clocks] | None = None
    unreadable: Mapping[str, int] | None = None  # objects the informer could not read, by kind
    audit_store: tuple[bool, int] | None = None  # (failing, records waiting in the spool)
    audit_failures: tuple[str, ...] = ()  # the store operation that raised
    spool_overflows: int = 0
    reclaims: tuple[tuple[str, datetime, datetime], ...] = ()  # pool, decided, serving
    notices: tuple[tuple[str, Notice], ...] = ()  # pool, what a reclaim's notice came to


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
    happened: Happened = field(default_factory=Happened)

    @property
    def steps(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call is not Action.PROGRESS)

    @property
    def progressed(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call is Action.PROGRESS)
