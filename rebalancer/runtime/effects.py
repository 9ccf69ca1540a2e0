"""The values the tick's pure step exchanges with the rest of the runtime: what it runs by
(``Rules``) and is given (``Seen``); what it returns, in the order it is carried out
(``Effects``: lines to log, records to commit, and per branch of the commit the waves of calls);
and what carrying them out came to (``Done``, ``StoreEvent``), which ``runtime.flight.settle``
folds into the next memory.

Where it sits: ``runtime.step`` makes them, ``runtime.shell`` carries them out. Values only:
tests build them to ask the step a question, and assert on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.concurrency import LEND_CONCURRENCY, RECLAIM_CONCURRENCY
from rebalancer.core.model import NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.tick import Decision, PoolControls, Unchecked
from rebalancer.runtime.memory import Memory
from rebalancer.runtime.seams import PoolConfig

# ---------------------------------------------------------------------------------------------
# What the step is given


@dataclass(frozen=True)
class Rules:
    """What the step runs by, the same every tick: the pools, the node keys, the switches."""

    pools: tuple[PoolConfig, ...]
    keys: Keys
    dry_run: bool = False
    # Whether a record can be kept on its node while the audit store fails (a ledger): without
    # one, nothing is carried out then. A dry run keeps nothing.
    can_keep: bool = True
    reclaim_concurrency: int = RECLAIM_CONCURRENCY
    lend_concurrency: int = LEND_CONCURRENCY

    def pool(self, name: PoolName) -> PoolConfig:
        return next(p for p in self.pools if p.name == name)

    @property
    def controls(self) -> dict[PoolName, PoolControls]:
        return {p.name: PoolControls(p.policy, p.paused, p.frozen) for p in self.pools}


@dataclass(frozen=True)
class Seen:
    """What one tick saw: the snapshot, each pool's strategy answer, and who this replica is."""

    snapshot: model.Snapshot
    answers: Mapping[PoolName, Unchecked]
    identity: str
    term: int | None  # the leadership term; None when not leading
    leading: bool  # may write now
    term_key: object  # the stretch of leadership start-up runs once for

    def context(self, pool: PoolConfig | None, dry_run: bool) -> Context:
        return context(self.identity, self.term, pool, dry_run)


def context(identity: str, term: int | None, pool: PoolConfig | None, dry_run: bool) -> Context:
    """Who decides, and with what: the context of a pool's records (none: the controller's)."""
    return Context(
        controller=identity,
        term=term,
        strategy=pool.strategy_name if pool else "",
        params=dict(pool.strategy_params) if pool else {},
        dry_run=dry_run,
    )


# ---------------------------------------------------------------------------------------------
# What the step returns


@dataclass(frozen=True)
class Say:
    """A line for the log, in the order the step decided it."""

    level: int
    message: str
    error: BaseException | None = None  # its traceback is logged with it


@dataclass(frozen=True)
class Carry:
    """One step of the plan through its pool's actuator, under its committed intent; while
    the store fails (``keep_first``) only once the intent is kept on its node."""

    step: model.Step
    intent: AuditRecord
    keep_first: bool = False


@dataclass(frozen=True)
class Progress:
    """One pass over a node in flight (or over a drain whose node vanished, under its UID)."""

    pool: PoolName
    node: NodeName
    decision: str | None
    uid: str | None
    deadline: datetime | None
    said: tuple[str, str] | None  # what the drain's last record said
    vanished: bool = False


@dataclass(frozen=True)
class RollBack:
    """A lend left half-done, rolled back under an intent of its own, committed first."""

    pool: PoolName
    node: NodeName
    intent: AuditRecord


@dataclass(frozen=True)
class EndLoan:
    """The loan of a lent node that was deleted (perhaps created again under its name) ended
    under an intent of its own, committed first: a reclaim for the lent node's UID."""

    pool: PoolName
    view: NodeView
    intent: AuditRecord
    deadline: datetime


@dataclass(frozen=True)
class RemoveLeft:
    """One pass over the borrowed pods bound to a name before its node was created; the first
    under a new intent, committed first (``new``), each later one under the same."""

    pool: PoolName
    node: NodeName
    intent: AuditRecord
    deadline: datetime
    new: bool
    said: tuple[str, str] | None


Drive = Progress | RollBack | EndLoan | RemoveLeft


@dataclass(frozen=True)
class Wave:
    """Effects carried out together, ``limit`` at a time; the next wave waits for this one."""

    items: tuple[Carry | Drive, ...]
    limit: int


@dataclass(frozen=True)
class Branch:
    """What follows the tick's records, as the store takes them or not: the memory to settle
    the results into, and the effects in order."""

    memory: Memory
    says: tuple[Say, ...] = ()
    findings: model.Plan | None = None  # the findings' Events, recorded once the store has them
    waves: tuple[Wave, ...] = ()
    error: bool = False  # the tick's records were not taken


@dataclass(frozen=True)
class Noted:
    """The gauges and counts of one tick, as the step decided them (``runtime.telemetry``)."""

    leader: tuple[str, bool] | None = None  # (this replica's identity, whether it may write)
    lent: Mapping[str, int] | None = None  # nodes on loan, per pool
    overdue: Mapping[str, int] | None = None  # nodes whose reclaim is past its deadline
    safety_only: Mapping[str, bool] | None = None  # planned on safety rules alone
    demand_held: Mapping[str, bool] | None = None  # demand held over a failed read
    frozen_under_pressure: Mapping[str, bool] | None = None
    budgets: Mapping[str, model.ErrorBudget] | None = None
    decided: tuple[model.Plan, ...] = ()  # the plan the leader carried out, if it led
    strategy_failures: tuple[tuple[str, str, str], ...] = ()  # pool, strategy, kind
    planner_failures: tuple[str, ...] = ()  # pools
    borrowing_minutes: tuple[str, ...] = ()  # a pool per minute lending cost


@dataclass(frozen=True)
class Effects:
    """Everything one tick does, in order: say the lines; write the cost records (a failure is
    logged, the tick goes on); bring the records kept on nodes to the store (``catch_up``);
    commit ``batch``; then ``taken`` if the store took it, else ``refused``. No batch: the
    tick writes nothing (a follower, or leading since the tick began)."""

    decision: Decision
    says: tuple[Say, ...] = ()
    noted: Noted = field(default_factory=Noted)
    costs: tuple[AuditRecord, ...] = ()
    catch_up: tuple[NodeView, ...] | None = None  # whose kept records go to the store first
    batch: audit.Tick | None = None
    taken: Branch | None = None
    refused: Branch | None = None


# ---------------------------------------------------------------------------------------------
# The step


@dataclass(frozen=True)
class Done:
    """What carrying out one effect came to (``runtime.shell``)."""

    effect: Carry | Drive
    result: ActionResult | None  # None: not called (leadership lost, or not kept)
    intent: AuditRecord | None = None  # the intent its outcome goes on, when one is known
    recorded: bool = False  # its outcome record was written (or spooled)
    unaudited: bool = False  # its own intent could not be committed: nothing was done
    deadline: datetime | None = None  # a reclaim's: counted from when its wave began


@dataclass(frozen=True)
class StoreEvent:
    """The audit store failed a write (``error``), or took one (None), at ``now``."""

    now: datetime
    error: BaseException | None
    failing: str | None = None  # why the store fails, as the audit log says
