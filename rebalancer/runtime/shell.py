"""The shell: the tick's effects carried out in the order ``runtime.step`` gave them, and what
they came to, for ``runtime.flight.settle`` and the tick's report. It decides nothing the step
decided and keeps nothing from one tick to the next.

Where it sits: ``runtime.reconcile.Reconciler.tick`` hands it the step's ``Effects``; start-up
(``runtime.recovering``) and ``rebalancer reclaim`` carry their calls out through the same
``carry``, so an operator's reclaim and a tick's are one code path.

The order: the cost records (a failure is logged; the tick goes on), the records kept on nodes
brought to the store, the tick's records committed, then the branch the commit chose: the
findings' Events, each wave of steps and drives ``limit`` at a time, reclaims first (every
deadline of a wave counted from the same start), each call followed by its outcome record. Two
checks stay here because they are about the moment, not the plan: leadership is checked again
before each call (a step not carried out because leadership went away is closed as
``superseded``), and while the store fails a step is carried out only once its intent is kept
on its node and in the spool (``keep``, docs/design/audit-failure.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from rebalancer import errors
from rebalancer.core import audit
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import Action, Clock, NodeName, NodeView, PoolName
from rebalancer.core.outcomes import ActionResult, Notice, Outcome
from rebalancer.runtime.effects import (
    Branch,
    Carry,
    Done,
    Drive,
    Effects,
    EndLoan,
    Progress,
    RemoveLeft,
    RollBack,
    Say,
    StoreEvent,
    Wave,
)
from rebalancer.runtime.flight import news, node_uid
from rebalancer.runtime.seams import (
    Applied,
    AuditTrail,
    EventRecorder,
    Leadership,
    NodeActuator,
    NodeLedger,
    PoolConfig,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class CatchingUp(Protocol):
    """Brings the records kept on nodes (or in Events) to the store (``runtime.recovering``)."""

    async def catch_up(self, shell: Shell, views: Iterable[NodeView], now: datetime) -> None: ...


@dataclass
class Run:
    """What one tick's effects came to, in the order they happened: gathered while they are
    carried out, read once they are all done. A value of one tick, never kept."""

    done: list[Done] = field(default_factory=list)
    store: list[StoreEvent] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    audited: tuple[AuditRecord, ...] = ()
    error: str | None = None  # why the tick's records were not taken
    audit_failures: list[str] = field(default_factory=list)  # the store operation that raised
    spool_overflows: int = 0
    reclaims: list[tuple[str, datetime, datetime]] = field(default_factory=list)  # decided, back
    notices: list[tuple[str, Notice]] = field(default_factory=list)  # what each notice came to
    audit_store: tuple[bool, int] | None = None  # (failing, records waiting in the spool)


@dataclass(frozen=True)
class Did:
    """What one effect came to: the report's line and what ``flight.settle`` reads."""

    applied: Applied | None
    done: Done | None


NOTHING = Did(None, None)  # not carried out: leadership went, or its intent was not committed


def say(lines: Sequence[Say]) -> None:
    for line in lines:
        log.log(line.level, "%s", line.message, exc_info=line.error)


@dataclass
class Shell:
    """The seams the effects go through, as the reconciler holds them at the tick's start."""

    pools: Sequence[PoolConfig]
    actuators: Mapping[PoolName, NodeActuator]
    audit_log: AuditTrail
    ledger: NodeLedger | None
    events: EventRecorder
    clock: Clock
    leadership: Leadership
    recovery: CatchingUp
    run: Run = field(default_factory=Run)

    def leading(self) -> bool:
        """Whether this replica may write now: checked again before each call."""
        return self.leadership.may_write(self.leadership.now())

    async def effects(self, effects: Effects) -> Branch | None:
        """Carry ``effects`` out; the branch the tick's commit chose (None: nothing written)."""
        say(effects.says)
        if effects.batch is None:
            return None
        await self._costs(effects.costs)
        if effects.catch_up is not None:
            await self.recovery.catch_up(self, effects.catch_up, effects.decision.plan.now)
        try:
            self.run.audited = await self.audit_log.tick(effects.batch.records)
        except errors.StoreFailed as exc:  # no intent on record: only what keeps inference
            # Only the store's own failure: a bug on the way to it ends the tick as it is,
            # rather than pass for a full disk and carry out safety reclaims without the store.
            self.store_failed(exc)
            self.run.error = f"audit store failed: {exc}"
            branch = effects.refused
        else:
            self.store_works()
            branch = effects.taken
        assert branch is not None, "a tick with records has both branches"
        say(branch.says)
        if branch.findings is not None:
            await self.events.findings(branch.findings)
        waves: Sequence[Wave] = branch.waves
        if branch.error and waves:
            waves = await self._kept(waves, len(effects.decision.plan.steps))
        started = self.clock()

        def one(effect: Carry | Drive) -> Awaitable[Did]:
            return self._one(effect, started)

        for wave in waves:
            # In the wave's order, whatever order the calls ended in: the report reads so.
            for did in await self._together(wave.items, one, wave.limit):
                if did.applied is not None:
                    self.run.applied.append(did.applied)
                if did.done is not None:
                    self.run.done.append(did.done)
        if branch.error:
            self.run.audit_store = (True, len(self.audit_log.spool))
        return branch

    async def _kept(self, waves: Sequence[Wave], planned: int) -> list[Wave]:
        """While the store fails: each step's intent kept on its node and in the spool first,
        in the plan's order; a step whose intent cannot be kept is not carried out."""
        out, kept = [], 0
        for wave in waves:
            items = [
                item
                for item in wave.items
                if not isinstance(item, Carry)
                or not item.keep_first
                or await self.keep(item.step.node, item.intent)
            ]
            kept += sum(1 for item in items if isinstance(item, Carry))
            out.append(replace(wave, items=tuple(items)))
        log.warning(
            "audit store failing: %d safety reclaim(s) carried out, recorded on their nodes; "
            "%d step(s) not carried out (no lending while the store fails)",
            kept,
            planned - kept,
        )
        return out

    async def _costs(self, records: Sequence[AuditRecord]) -> None:
        """The minutes lending cost: a record the store fails to take is logged and the minute
        still counts (the measurement is true, and the tick's intents meet the same store)."""
        if not records:
            return
        try:
            await self.audit_log.tick(records)
        except errors.StoreFailed as exc:
            log.error("audit store fails (%s); %d cost minute(s) not recorded", exc, len(records))
            self.run.audit_failures.append("cost")
        except Exception:  # the tick's own records go on: a budget's minute is not worth them
            log.exception("%d cost minute(s) not recorded: a bug, not the store", len(records))

    # -- one effect -----------------------------------------------------------------------

    async def _one(self, effect: Carry | Drive, started: datetime) -> Did:
        match effect:
            case Carry():
                return await self._carry(effect, started)
            case Progress():
                return await self._progress(effect)
            case RollBack():
                return await self._roll_back(effect)
            case EndLoan():
                return await self._end_loan(effect)
            case RemoveLeft():
                return await self._remove_left(effect)
        raise TypeError(f"not an effect: {effect!r}")

    async def carry(self, carry: Carry, started: datetime) -> Applied:
        """One step: the actuator's call (the intent's id as the node's decision, a reclaim's
        deadline counted from ``started``), then its outcome record."""
        did = await self._carry(carry, started)
        assert did.applied is not None, "a step always says what came of it"
        return did.applied

    async def _carry(self, carry: Carry, started: datetime) -> Did:
        step, intent = carry.step, carry.intent
        if not self.leading():
            why = "leadership lost before the step was carried out"
            outcome = await self.safely(self.audit_log.supersede(intent, self.clock(), why))
            return self._applied(carry, step.action, None, intent, outcome)
        actuator = self.actuators[step.pool]
        deadline = None
        if step.action is Action.LEND:
            result = await self._called(intent, actuator.lend(step.node, intent.id))
        elif step.action is Action.WITHDRAW:
            result = await self._called(intent, actuator.withdraw(step.node, intent.id))
        elif step.notice > timedelta(0):
            # The pods must be gone by then; the reclaim begins when they answer.
            deadline = started + step.notice
            call = actuator.notice(step.node, intent.id, deadline, uid=node_uid(intent))
            result = await self._called(intent, call)
        else:
            pool = next(p for p in self.pools if p.name == step.pool)
            deadline = started + pool.policy.reclaim_deadline
            call = actuator.reclaim(step.node, intent.id, deadline, uid=node_uid(intent))
            result = await self._called(intent, call)
        log.info(
            "%s %s: %s (%s)", step.action.value, step.node, result.outcome.value, result.message
        )
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        self.reclaimed(step.pool, intent, result)
        return self._applied(carry, step.action, result, intent, outcome, deadline)

    async def _progress(self, effect: Progress) -> Did:
        """One pass over a node in flight, or over a drain whose node vanished from the pools
        (for its own UID only: a node replaced or deleted has the pods it took removed and
        ends ``gone`` once none is left; one out of every pool but still there is driven
        on)."""
        if not self.leading():
            return NOTHING
        progress = self.actuators[effect.pool].progress
        name = effect.node
        result = await progress(name, effect.decision, uid=effect.uid, deadline=effect.deadline)
        log.info("progress %s: %s (%s)", name, result.outcome.value, result.message)
        intent = await self._intent(name, effect.pool, effect.decision, effect.vanished)
        return await self._passed(effect, effect.pool, intent, result, effect.said)

    async def _roll_back(self, effect: RollBack) -> Did:
        """A lend left unfinished, rolled back under its own intent, committed first (kept on
        the node while the store fails)."""
        if not self.leading():
            return NOTHING
        name, intent = effect.node, effect.intent
        if not await self._committed([intent], keep_on=name):
            log.warning("node %s stays lending this tick: its rollback is not recorded", name)
            return Did(Applied(name, Action.PROGRESS, None, None, None), None)
        call = self.actuators[effect.pool].progress(name, intent.id)
        result = await self._called(intent, call)
        log.info("roll back %s: %s (%s)", name, result.outcome.value, result.message)
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        return self._applied(effect, Action.PROGRESS, result, intent, outcome)

    async def _end_loan(self, effect: EndLoan) -> Did:
        """A replaced lent node's loan ended: its intent committed (the node is gone: nothing
        waits on it, so a store failing ends it next tick), then the reclaim for its UID."""
        if not self.leading():
            return NOTHING
        lent, intent = effect.view, effect.intent
        if not await self._committed([intent]):
            return Did(None, Done(effect, None, unaudited=True))
        call = self.actuators[effect.pool].reclaim(
            lent.name, intent.id, effect.deadline, uid=lent.uid
        )
        result = await self._called(intent, call)
        log.info("end loan %s: %s (%s)", lent.name, result.outcome.value, result.message)
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        return self._applied(effect, Action.RECLAIM, result, intent, outcome)

    async def _remove_left(self, effect: RemoveLeft) -> Did:
        """One pass over the borrowed pods an earlier node of a name left; the first commits
        its intent (nothing is removed unrecorded: a store failing tries again next tick)."""
        if not self.leading():
            return NOTHING
        name, intent = effect.node, effect.intent
        if effect.new and not await self._committed([intent]):
            return NOTHING
        call = self.actuators[effect.pool].remove_earlier(name, intent.id, effect.deadline)
        result = await self._called(intent, call)
        log.info("left by an earlier %s: %s (%s)", name, result.outcome.value, result.message)
        return await self._passed(effect, effect.pool, intent, result, effect.said)

    async def _passed(
        self,
        effect: Progress | RemoveLeft,
        pool: PoolName,
        intent: AuditRecord | None,
        result: ActionResult,
        said: tuple[str, str] | None,
    ) -> Did:
        """The outcome record of one pass over a node in flight, unless it says only what the
        last one said."""
        outcome = None
        if intent is not None and news(said, intent, result):
            outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        self.reclaimed(pool, intent, result)
        return self._applied(effect, Action.PROGRESS, result, intent, outcome)

    def _applied(
        self,
        effect: Carry | Drive,
        call: Action,
        result: ActionResult | None,
        intent: AuditRecord | None,
        outcome: AuditRecord | None,
        deadline: datetime | None = None,
    ) -> Did:
        node = (
            effect.view.name
            if isinstance(effect, EndLoan)
            else (effect.step.node if isinstance(effect, Carry) else effect.node)
        )
        done = Done(effect, result, intent, outcome is not None, deadline=deadline)
        return Did(Applied(node, call, result, intent, outcome), done)

    async def _intent(
        self, name: NodeName, pool: PoolName, decision: str | None, vanished: bool
    ) -> AuditRecord | None:
        """The intent a node in flight answers to, as its ``decision`` names it."""
        if not decision:
            return None
        try:
            found = await self.audit_log.get(decision)
        except errors.StoreFailed as exc:
            where = f"node {name} of pool {pool}" if vanished else f"node {name}"
            log.warning(
                "%s: intent %s not read, the audit store fails (%s): this pass is not recorded",
                where,
                decision,
                exc,
            )
            return None
        if found is None or found.kind is not audit.Kind.INTENT:
            if not vanished:
                log.warning("node %s: decision %s is not an intent on record", name, decision)
            return None
        return found

    # -- the store -------------------------------------------------------------------------

    async def _committed(
        self, batch: Sequence[AuditRecord], keep_on: NodeName | None = None
    ) -> bool:
        """``batch`` (an intent of a drive) committed; while the store fails, kept on the node
        ``keep_on`` names instead, if any. False: it is not on record, so not done."""
        try:
            await self.audit_log.tick(batch)
        except errors.StoreFailed as exc:
            self.store_failed(exc)
            return keep_on is not None and await self.keep(keep_on, batch[0])
        return True

    async def keep(self, node: NodeName | str, intent: AuditRecord) -> bool:
        """Record ``intent`` where a record can still be written, before what it describes is
        done: on its node (with an Event), then in the spool (and its JSON line on stdout).
        False when it could not be: then it must not be done."""
        if self.ledger is None:
            return False
        if not self.audit_log.room(1):
            self.run.spool_overflows += 1
            log.error(
                "node %s: %s %s NOT carried out: the audit spool is full (%d records wait for "
                "the store, which fails: %s); fix the store",
                node,
                intent.action,
                intent.id,
                len(self.audit_log.spool),
                self.audit_log.failing,
            )
            return False
        try:
            await self.ledger.hold(str(node), [intent], self.audit_log.failing or "")
        except Exception as exc:
            log.error(
                "node %s: %s %s not carried out this tick: it cannot be recorded on the node "
                "while the audit store fails (%s)",
                node,
                intent.action,
                intent.id,
                exc,
            )
            return False
        self.audit_log.hold([intent])
        return True

    async def safely(self, write: Awaitable[AuditRecord]) -> AuditRecord | None:
        """An outcome the store did not take waits in the spool (``AuditLog.outcome``, which
        raises a store failure only when the spool has no room: ``SpoolFull`` says so). One
        that is not recorded is logged as what kept it, the spool or a bug: the write it
        describes is done either way, and the tick goes on."""
        try:
            written = await write
        except errors.StoreFailed as exc:
            log.error("audit: an outcome is not recorded: %s: %s", type(exc).__name__, exc)
            self.run.audit_failures.append("outcome")
            self.run.spool_overflows += 1
            return None
        except Exception:
            log.exception("audit: an outcome is not recorded: a bug, not the store failing")
            return None
        if self.audit_log.failing is not None:
            self.run.audit_failures.append("outcome")
        return written

    def reclaimed(self, pool: PoolName, intent: AuditRecord | None, result: ActionResult) -> None:
        if result.notice is not None and not result.dry_run:
            self.run.notices.append((str(pool), result.notice))
        if (
            intent is not None
            and intent.action is Action.RECLAIM
            and result.outcome is Outcome.APPLIED
        ):
            self.run.reclaims.append((str(pool), intent.time, self.clock()))

    def store_failed(self, exc: BaseException) -> None:
        """A write the store failed: counted, and its episode goes on (``flight.settle``)."""
        self.run.audit_failures.append("tick")
        self.run.store.append(StoreEvent(self.clock(), exc, self.audit_log.failing))
        self.run.audit_store = (True, len(self.audit_log.spool))

    def store_works(self) -> None:
        self.run.store.append(StoreEvent(self.clock(), None))
        self.run.audit_store = (False, len(self.audit_log.spool))

    # -- calls -----------------------------------------------------------------------------

    async def _together(
        self, items: Sequence[T], work: Callable[[T], Awaitable[R]], limit: int
    ) -> list[R]:
        """``work`` on every item, ``limit`` at a time; the results in item order.

        Every item runs to its end whatever the others do: a step's intent is on record before
        the first call, so one cut short would stay open until the next term. An item whose
        work raises is logged, once, with what it raised, and leaves no result. Only what is
        not an ``Exception`` (the process made to stop) ends the others at once, as it ends
        the process: the first is raised, any other logged.
        """
        gate = asyncio.Semaphore(limit)

        async def gated(item: T) -> R | _Raised:
            async with gate:
                try:
                    return await work(item)
                except Exception:
                    log.exception("%s raised; the others go on", _what(item))
                    return _RAISED

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(gated(item)) for item in items]
        except BaseExceptionGroup as stopped:
            first, *others = stopped.exceptions
            for other in others:
                log.error("stopped as well: %s", type(other).__name__, exc_info=other)
            raise first from None
        return [r for r in (task.result() for task in tasks) if not isinstance(r, _Raised)]

    async def _called(self, intent: AuditRecord, call: Awaitable[ActionResult]) -> ActionResult:
        """The actuator's answer to a call made under ``intent``. A call that raises instead (a
        bug, or a failure the actuator does not foresee) is the intent's ``failed`` outcome,
        logged once with what it raised: recorded like any other, it closes the intent, and
        the next tick plans from the node as the call left it (a lend left half-done is rolled
        back, a reclaim begun is driven on)."""
        try:
            return await call
        except Exception as exc:
            log.exception(
                "%s %s of pool %s under %s: the actuator raised %s; recorded as failed",
                intent.action,
                intent.node,
                intent.pool,
                intent.id,
                type(exc).__name__,
            )
            message = f"the actuator raised {type(exc).__name__}: {str(exc)[:200]}"
            action = intent.action or Action.PROGRESS
            return ActionResult(str(intent.node), action, Outcome.FAILED, message)


def _what(item: object) -> str:
    """An effect as the log names it when carrying it out raised."""
    match item:
        case Carry(step=s):
            return f"{s.action.value} {s.node} of pool {s.pool}"
        case Progress(vanished=True):
            return f"progress {item.node} (uid {item.uid}) of pool {item.pool}"
        case Progress() | RollBack():
            return f"progress {item.node} of pool {item.pool}"
        case EndLoan():
            return f"end of the loan of {item.view.name} of pool {item.pool}"
        case RemoveLeft():
            return f"removal of what an earlier {item.node} left, of pool {item.pool}"
    return repr(item)


class _Raised:
    """An item of ``Shell._together`` whose work raised (and was logged)."""


_RAISED = _Raised()
