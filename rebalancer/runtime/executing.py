"""The execute step: a tick's steps carried out through each pool's actuator, and every node
in flight driven one pass on, each actuator call followed by its outcome record.

Where it sits: ``runtime.reconcile.Reconciler`` owns one ``Executor`` and hands it the plan once
the tick's intents are committed (``apply``), then the snapshot (``drive``); ``rebalancer
reclaim`` (``runtime.takeback``) carries its steps out through the same ``carry_out``, so an
operator's reclaim and a tick's are one code path. Reclaims go in waves, ``reclaim_concurrency``
at a time with one deadline start; lends after them, fewer at once. Leadership is checked again
before each call: a step not carried out because leadership went away is closed as
``superseded``.

It also holds what executing needs across ticks: the drains in flight under their node's UID,
the loans of the last tick (a node deleted while lent has its loan ended), the borrowed pods an
earlier node of a name left being removed, what the last record of each drain said, and the
audit store's failure episode, during which a safety reclaim is carried out only once its
intent is kept on its node and in the spool (``keep``, docs/design/audit-failure.md).

Every loan ends, whatever happens to its node (docs/design/other-writers.md): a lent node
deleted ends its loan under an intent of its own (``_end_replaced_loan``), whose drain goes on
while the node is away and after a node is created again under its name; and since a process
that restarts remembers none of that, every tick also looks at each node for borrowed pods
bound to its name before it was created (``victims.left_by_earlier_node``), and removes them
under an intent of their own (``_remove_left``), seconds or hours after the node came back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from datetime import datetime
from typing import TypeVar

from rebalancer import errors
from rebalancer.core import audit, model, nodestate, recovery, victims
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import Action, Clock, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.outcomes import ActionResult, Outcome, WriteOutcome
from rebalancer.core.tick import phase
from rebalancer.runtime.report import Tally
from rebalancer.runtime.seams import (
    Applied,
    AuditTrail,
    NodeActuator,
    NodeLedger,
    PoolConfig,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class Executor:
    """The actuator calls of the controller and the outcome records that follow them."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        keys: Keys,
        clock: Clock,
        actuators: Mapping[PoolName, NodeActuator],
        audit_log: AuditTrail,
        ledger: NodeLedger | None,
        tally: Tally,
        leading: Callable[[], bool],
        context: Callable[[PoolConfig], Context],
        dry_run: bool,
        reclaim_concurrency: int,
        lend_concurrency: int,
    ) -> None:
        self.pools, self.keys, self.clock = tuple(pools), keys, clock
        self.actuators, self.audit_log = actuators, audit_log
        # Where a record goes when the store fails (None: nowhere, so nothing is done then).
        self.ledger = ledger
        self.tally, self.leading, self.context = tally, leading, context
        self.dry_run = dry_run
        self.reclaim_concurrency = reclaim_concurrency
        self.lend_concurrency = lend_concurrency
        self._store_since: datetime | None = None  # the store's failure episode began then
        # The nodes in flight a dry run has said it would drive (each is said once).
        self._would_drive: frozenset[NodeName] = frozenset()
        # The reclaims in flight, each with its pool, the UID of the node it drains and its
        # intent: one whose node is no longer seen in flight under that UID (deleted, created
        # again under its name, or out of every pool) is looked at once more (``_vanished``).
        # Its deadline too (None: passed), for the pods the node took once it is gone.
        self._draining: dict[NodeName, Drain] = {}
        # The lent nodes of the last leading tick, as seen then: a loan whose node is deleted
        # (and perhaps created again under its name) is ended here (``_end_replaced_loan``).
        self._loans: dict[NodeName, tuple[PoolConfig, NodeView]] = {}
        # The nodes whose borrowed pods, bound to the name before the node was created, are
        # being removed, each under its intent and deadline (``_remove_left``).
        self._removing: dict[NodeName, tuple[PoolConfig, AuditRecord, datetime]] = {}
        # What the last in_progress record of each drain said (intent id, message): a pass that
        # says the same and changed nothing is not recorded again (a drain a finalizer holds
        # would write a record every tick).
        self._said: dict[NodeName, tuple[str, str]] = {}

    async def apply(self, plan: model.Plan, tick: audit.Tick) -> tuple[Applied, ...]:
        """The tick's steps: reclaims first, ``reclaim_concurrency`` at a time and every
        deadline counted from the same start, so each node of a wave gets its serving taints
        back without waiting for the others' API calls (and its drain begins); then lends,
        ``lend_concurrency`` at a time (a lend is never urgent, so fewer at once: a wave of
        them should not crowd the API server; ``core.concurrency`` says why that many). Each
        node's own writes stay in order: one step is one call. Every intent was committed before
        the first write, so every step runs to its end whatever the others do: a call that
        raises is its intent's ``failed`` outcome (``_called``), and the others go on
        (``_together``)."""
        started = self.clock()

        def wave(action: model.Action) -> list[model.Step]:
            return [s for s in plan.steps if s.action is action]

        def each(step: model.Step) -> Awaitable[Applied]:
            return self.carry_out(step, tick, started)

        def what(step: model.Step) -> str:
            return f"{step.action.value} {step.node} of pool {step.pool}"

        done = await self._together(wave(Action.RECLAIM), each, self.reclaim_concurrency, what)
        done += await self._together(wave(Action.LEND), each, self.lend_concurrency, what)
        return tuple(done)

    async def carry_out(self, step: model.Step, tick: audit.Tick, started: datetime) -> Applied:
        """One step of ``tick``: the actuator's call (the intent's id as the node's decision,
        a reclaim's deadline counted from ``started``), then its outcome record."""
        intent = tick.intent_for(step)
        if not self.leading():
            why = "leadership lost before the step was carried out"
            outcome = await self.safely(self.audit_log.supersede(intent, self.clock(), why))
            return Applied(step.node, step.action, None, intent, outcome)
        actuator = self.actuators[step.pool]
        if step.action is model.Action.LEND:
            result = await self._called(intent, actuator.lend(step.node, intent.id))
        else:
            pool = next(p for p in self.pools if p.name == step.pool)
            deadline = started + pool.policy.reclaim_deadline
            uid = _node_uid(intent)
            call = actuator.reclaim(step.node, intent.id, deadline, uid=uid)
            result = await self._called(intent, call)
            if result.outcome is Outcome.IN_PROGRESS and uid:
                self._draining[step.node] = (pool, uid, intent.id, deadline)
        log.info(
            "%s %s: %s (%s)", step.action.value, step.node, result.outcome.value, result.message
        )
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        self._remember(step.node, intent, result, outcome)
        self.reclaimed(step.pool, intent, result)
        return Applied(step.node, step.action, result, intent, outcome)

    async def drive(
        self, snapshot: model.Snapshot, applied: Sequence[Applied]
    ) -> tuple[Applied, ...]:
        """``progress`` on every node in flight that got no step this tick (``applied``), the
        drains of a wave together (``reclaim_concurrency`` at a time), as the reclaims that
        began them; then the end of every loan whose node was replaced; then the removal of
        the borrowed pods an earlier node of a name left on the node there now."""
        acted = {a.node for a in applied}
        in_flight = [
            (pool, view)
            for pool in self.pools
            for view in snapshot.pools[pool.name].nodes
            if view.name not in acted and phase(view, self.keys, _lent(pool)) in IN_FLIGHT
        ]
        if self.dry_run:
            self._say_would_drive(in_flight)
            return ()
        seen = {v.name: v for p in self.pools for v in snapshot.pools[p.name].nodes}
        vanished = self._vanished(seen, {v.name for _, v in in_flight} | acted)
        self._track_drains(in_flight, acted)
        # A loan whose node was being reclaimed ends with that drain, under its intent.
        draining = {name for name, _ in vanished}
        ended = [e for e in self._track_loans(snapshot, applied, seen) if e[1].name not in draining]

        def one(item: tuple[PoolConfig, NodeView]) -> Awaitable[Applied | None]:
            return self._progress(item, snapshot.now)

        def node(item: tuple[PoolConfig, NodeView]) -> str:
            return f"progress {item[1].name} of pool {item[0].name}"

        def gone(item: tuple[NodeName, Drain]) -> str:
            return f"progress {item[0]} (uid {item[1][1]}) of pool {item[1][0].name}"

        limit = self.reclaim_concurrency
        done = await self._together(in_flight, one, limit, node)
        done += await self._together(vanished, self._drive_vanished, limit, gone)
        for pool, view in ended:
            done.append(await self._end_replaced_loan(pool, view, snapshot.now))
        # A node a reclaim or a drain has this tick takes them itself; one lent this tick
        # does not, and is looked at as the snapshot saw it (its pods are the server's).
        reclaimed = {a.node for a in applied if a.call is not Action.LEND}
        busy = reclaimed | {v.name for _, v in in_flight} | set(self._draining)
        left = self._left_behind(snapshot, busy)

        def earlier(item: tuple[PoolConfig, NodeName, NodeView | None]) -> str:
            return f"removal of what an earlier {item[1]} left, of pool {item[0].name}"

        done += await self._together(left, self._remove_left, limit, earlier)
        return tuple(a for a in done if a is not None)

    def _say_would_drive(self, in_flight: Sequence[tuple[PoolConfig, NodeView]]) -> None:
        """A node in flight was left so by a run that writes: a dry run neither drives it on
        nor closes the intent it answers to. Each is said once."""
        names = frozenset(view.name for _, view in in_flight)
        for pool, view in in_flight:
            if view.name not in self._would_drive:
                state = phase(view, self.keys, _lent(pool))
                log.warning(
                    "dry run: node %s of pool %s is %s; a run that writes would drive it on",
                    view.name,
                    pool.name,
                    state.value if state else "unreadable",
                )
        self._would_drive = names

    def _track_drains(
        self, in_flight: Sequence[tuple[PoolConfig, NodeView]], acted: set[NodeName]
    ) -> None:
        """The drains to look at again next tick: this tick's reclaims, and every node seen
        reclaiming under its UID."""
        self._draining = {
            **{name: d for name, d in self._draining.items() if name in acted},  # this tick's
            **{
                view.name: (
                    pool,
                    view.uid,
                    view.annotations.get(self.keys.decision, ""),
                    self._deadline(view),
                )
                for pool, view in in_flight
                if view.uid and phase(view, self.keys, _lent(pool)) is Phase.RECLAIMING
            },
        }

    def _track_loans(
        self,
        snapshot: model.Snapshot,
        applied: Sequence[Applied],
        seen: Mapping[NodeName, NodeView],
    ) -> list[tuple[PoolConfig, NodeView]]:
        """The loans of the last tick whose node was replaced (to be ended), and the loans of
        this one remembered for the next."""
        # By UID alone, acted on this tick or not: a new node under the name may be lent
        # already, and the pods bound to the old one are still there.
        ended = [
            loan
            for name, loan in self._loans.items()
            if name not in seen or seen[name].uid != loan[1].uid
        ]
        # The nodes lent as of this tick: those the snapshot shows lent, and those this tick
        # lent (a node may be replaced before the next tick sees it lent).
        lent_now = {
            a.node
            for a in applied
            if a.call is Action.LEND and a.result and a.result.outcome is Outcome.APPLIED
        }
        self._loans = {
            view.name: (pool, view)
            for pool in self.pools
            for view in snapshot.pools[pool.name].nodes
            if view.uid
            and (phase(view, self.keys, _lent(pool)) is Phase.LENT or view.name in lent_now)
        }
        return ended

    async def _progress(self, item: tuple[PoolConfig, NodeView], now: datetime) -> Applied | None:
        """One pass over a node in flight: a lend left unfinished is rolled back, a reclaim
        drained on."""
        pool, view = item
        if not self.leading():
            return None
        if phase(view, self.keys, _lent(pool)) is Phase.LENDING:
            return await self._roll_back(pool, view, now)
        decision = view.annotations.get(self.keys.decision)
        progress = self.actuators[pool.name].progress
        result = await progress(
            view.name, decision, uid=view.uid or None, deadline=self._deadline(view)
        )
        log.info("progress %s: %s (%s)", view.name, result.outcome.value, result.message)
        intent = await self._intent_of(view)
        return await self._passed(pool, view.name, intent, result)

    async def _end_replaced_loan(
        self, pool: PoolConfig, lent: NodeView, now: datetime
    ) -> Applied | None:
        """A lent node that was deleted, and perhaps created again under its name, is not
        lent any more, and nothing in its snapshot says so: a new node is serving, and the
        pods the loan took are still bound to the name. The loan is ended under an intent of
        its own (a reclaim for the lent node's UID, which finds it gone or replaced), and the
        pods bound to the earlier node are removed as a drain removes them: evicted, deleted
        past the deadline. While any is left the drain is driven on every tick
        (``_drive_vanished``), whether the name has a node again or not."""
        if not self.leading():
            return None
        decision = lent.annotations.get(self.keys.decision)
        # A node lent by this very tick is seen as it was before the lend: no decision yet.
        under = f" under {decision}" if decision else ""
        why = (
            f"node {lent.name} (uid {lent.uid}) was lent{under} and has been deleted: "
            "its loan ends, and the pods bound to it are removed"
        )
        intent = audit.recovery_intent(
            self.context(pool),
            self.audit_log.new_id,
            now,
            str(pool.name),
            lent,
            Action.RECLAIM,
            decision,
            why,
        )
        try:
            await self.audit_log.tick([intent])
        except errors.StoreFailed as exc:  # the node is gone: nothing waits on it; next tick
            self.store_failed(exc, now)
            self._loans.setdefault(lent.name, (pool, lent))
            return None
        deadline = now + pool.policy.reclaim_deadline
        call = self.actuators[pool.name].reclaim(lent.name, intent.id, deadline, uid=lent.uid)
        result = await self._called(intent, call)
        log.info("end loan %s: %s (%s)", lent.name, result.outcome.value, result.message)
        if result.outcome is Outcome.IN_PROGRESS:
            self._draining[lent.name] = (pool, lent.uid, intent.id, deadline)
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        self._remember(lent.name, intent, result, outcome)
        return Applied(lent.name, Action.RECLAIM, result, intent, outcome)

    def _left_behind(
        self, snapshot: model.Snapshot, busy: Set[NodeName]
    ) -> list[tuple[PoolConfig, NodeName, NodeView | None]]:
        """The nodes to remove borrowed pods from that an earlier node of their name left:
        each that shows some (none in flight: its drain takes them), and each whose removal
        is under way (until a pass finds none, so that its intent is closed)."""
        found = {
            view.name: (pool, view.name, view)
            for pool in self.pools
            for view in snapshot.pools[pool.name].nodes
            if view.name not in busy
            and phase(view, self.keys, _lent(pool)) not in IN_FLIGHT
            and victims.left_by_earlier_node(view)
        }
        going = [
            (pool, name, None)
            for name, (pool, _, _) in self._removing.items()
            if name not in found and name not in busy
        ]
        return [*found.values(), *going]

    async def _remove_left(
        self, item: tuple[PoolConfig, NodeName, NodeView | None]
    ) -> Applied | None:
        """One pass over the borrowed pods bound to a name before its node was created: the
        first under an intent of its own (the pods named), each later one under the same
        intent and deadline, until none is left."""
        pool, name, view = item
        if not self.leading():
            return None
        now = self.clock()
        going = self._removing.get(name)
        if going is not None:
            _, intent, deadline = going
        else:
            assert view is not None  # a removal not under way begins with a node seen
            intent = self._left_intent(pool, view, now)
            try:
                await self.audit_log.tick([intent])
            except errors.StoreFailed as exc:  # nothing is removed unrecorded; next tick
                self.store_failed(exc, now)
                return None
            deadline = now + pool.policy.reclaim_deadline
        call = self.actuators[pool.name].remove_earlier(name, intent.id, deadline)
        result = await self._called(intent, call)
        log.info("left by an earlier %s: %s (%s)", name, result.outcome.value, result.message)
        if result.outcome is Outcome.IN_PROGRESS:
            self._removing[name] = (pool, intent, deadline)
        else:
            self._removing.pop(name, None)
        return await self._passed(pool, name, intent, result)

    def _left_intent(self, pool: PoolConfig, view: NodeView, now: datetime) -> AuditRecord:
        pods = [f"{p.namespace}/{p.name}" for p in victims.left_by_earlier_node(view)]
        shown = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
        created = nodestate.format_time(view.created) if view.created else "?"
        why = (
            f"node {view.name} (uid {view.uid}, created {created}) runs borrowed pod(s) bound "
            f"to its name before it was created: {shown}; an earlier node of the name was lent "
            "and deleted, and its loan ends: they are removed"
        )
        return audit.recovery_intent(
            self.context(pool),
            self.audit_log.new_id,
            now,
            str(pool.name),
            view,
            Action.RECLAIM,
            None,
            why,
            detail={recovery.EARLIER_PODS: pods},
        )

    def _deadline(self, view: NodeView) -> datetime | None:
        """The reclaim deadline the node carries (None: none readable, so passed)."""
        state = nodestate.read(view, self.keys)
        return state.deadline if isinstance(state, nodestate.NodeState) else None

    def _vanished(
        self, seen: Mapping[NodeName, NodeView], looked_at: set[NodeName]
    ) -> list[tuple[NodeName, Drain]]:
        """The drains of the last pass whose node is not seen in flight under the same UID:
        deleted, created again under its name, or out of every pool's selector."""
        return [
            (name, drain)
            for name, drain in self._draining.items()
            if name not in looked_at and (name not in seen or seen[name].uid != drain[1])
        ]

    async def _drive_vanished(self, item: tuple[NodeName, Drain]) -> Applied | None:
        """One pass over a drain whose node vanished from the pools: for its own UID only, so
        a node that was replaced or deleted has the pods it took removed and ends ``gone``
        once none is left (a new node under the name is not in flight, and nothing else would
        close the intent), and one that is out of every pool but still there is driven on."""
        name, (pool, uid, decision, deadline) = item
        if not self.leading():
            return None
        progress = self.actuators[pool.name].progress
        result = await progress(name, decision or None, uid=uid, deadline=deadline)
        log.info("progress %s: %s (%s)", name, result.outcome.value, result.message)
        intent = None
        if decision:
            try:
                intent = await self.audit_log.get(decision)
            except errors.StoreFailed as exc:
                log.warning(
                    "node %s of pool %s: intent %s not read, the audit store fails (%s): this "
                    "pass is not recorded",
                    name,
                    pool.name,
                    decision,
                    exc,
                )
        if intent is not None and intent.kind is not audit.Kind.INTENT:
            intent = None
        if result.outcome is Outcome.IN_PROGRESS:
            self._draining[name] = (pool, uid, decision, deadline)
        return await self._passed(pool, name, intent, result)

    async def _passed(
        self, pool: PoolConfig, name: NodeName, intent: AuditRecord | None, result: ActionResult
    ) -> Applied:
        """The outcome record of one pass over a node in flight, unless it says only what the
        last one said."""
        outcome = None
        if intent is not None and self._news(name, intent, result):
            outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
            self._remember(name, intent, result, outcome)
        self.reclaimed(pool.name, intent, result)
        return Applied(name, Action.PROGRESS, result, intent, outcome)

    def _news(self, name: NodeName, intent: AuditRecord, result: ActionResult) -> bool:
        """Whether a pass is worth a record: it ended, changed something (a pod evicted or
        deleted, a node written), or says something else than the last record of its drain.
        A budget's 429 changes nothing."""
        if result.outcome is not Outcome.IN_PROGRESS:
            return True
        changed = any(w.outcome in _CHANGED for w in result.writes)
        return changed or self._said.get(name) != (intent.id, result.message)

    def _remember(
        self,
        name: NodeName,
        intent: AuditRecord,
        result: ActionResult,
        outcome: AuditRecord | None,
    ) -> None:
        if result.outcome is not Outcome.IN_PROGRESS:
            self._said.pop(name, None)
        elif outcome is not None:  # recorded: the next pass saying the same is not news
            self._said[name] = (intent.id, result.message)

    async def _together(
        self,
        items: Sequence[T],
        work: Callable[[T], Awaitable[R]],
        limit: int,
        what: Callable[[T], str],
    ) -> list[R]:
        """``work`` on every item, ``limit`` at a time; the results in item order.

        Every item runs to its end whatever the others do: a step's intent is on record before
        the first call, so one cut short would stay open until the next term. An item whose
        work raises is logged, once, as ``what`` names it and with what it raised, and leaves
        no result. Only what is not an ``Exception`` (the process made to stop) ends the
        others at once, as it ends the process: the first is raised, any other logged.
        """
        gate = asyncio.Semaphore(limit)

        async def gated(item: T) -> R | _Raised:
            async with gate:
                try:
                    return await work(item)
                except Exception:
                    log.exception("%s raised; the others go on", what(item))
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

    async def _roll_back(self, pool: PoolConfig, view: NodeView, now: datetime) -> Applied:
        """A lend left unfinished (its call ended in a conflict or a failure, and its intent is
        closed with that) is rolled back under an intent of its own, like a restart's."""
        decision = view.annotations.get(self.keys.decision)
        why = f"lend {decision} left the node lending: rolling it back"
        intent = audit.recovery_intent(
            self.context(pool),
            self.audit_log.new_id,
            now,
            str(pool.name),
            view,
            recovery.ROLLBACK,
            decision,
            why,
        )
        try:
            await self.audit_log.tick([intent])
        except errors.StoreFailed as exc:  # a rollback keeps inference: kept on the node instead
            self.store_failed(exc, now)
            if not await self.keep(view.name, intent):
                log.warning(
                    "node %s stays lending this tick: its rollback is not recorded", view.name
                )
                return Applied(view.name, Action.PROGRESS, None, None, None)
        call = self.actuators[pool.name].progress(view.name, intent.id)
        result = await self._called(intent, call)
        log.info("roll back %s: %s (%s)", view.name, result.outcome.value, result.message)
        outcome = await self.safely(self.audit_log.outcome(intent, result, self.clock()))
        return Applied(view.name, Action.PROGRESS, result, intent, outcome)

    async def _intent_of(self, view: NodeView) -> AuditRecord | None:
        decision = view.annotations.get(self.keys.decision)
        if not decision:
            return None
        try:
            found = await self.audit_log.get(decision)
        except errors.StoreFailed as exc:
            log.warning(
                "node %s: intent %s not read, the audit store fails (%s): this pass is not "
                "recorded",
                view.name,
                decision,
                exc,
            )
            return None
        if found is None or found.kind is not audit.Kind.INTENT:
            log.warning("node %s: decision %s is not an intent on record", view.name, decision)
            return None
        return found

    async def safely(self, write: Awaitable[AuditRecord]) -> AuditRecord | None:
        """An outcome the store did not take waits in the spool (``AuditLog.outcome``, which
        raises a store failure only when the spool has no room: ``SpoolFull`` says so). One
        that is not recorded is logged as what kept it, the spool or a bug: the write it
        describes is done either way, and the tick goes on."""
        try:
            written = await write
        except errors.StoreFailed as exc:
            log.error("audit: an outcome is not recorded: %s: %s", type(exc).__name__, exc)
            self.tally.audit_failures.append("outcome")
            self.tally.spool_overflows += 1
            return None
        except Exception:
            log.exception("audit: an outcome is not recorded: a bug, not the store failing")
            return None
        if self.audit_log.failing is not None:
            self.tally.audit_failures.append("outcome")
        return written

    def reclaimed(self, pool: PoolName, intent: AuditRecord | None, result: ActionResult) -> None:
        if (
            intent is not None
            and intent.action is Action.RECLAIM
            and result.outcome is Outcome.APPLIED
        ):
            self.tally.reclaims.append((str(pool), intent.time, self.clock()))

    # -- when the audit store fails -----------------------------------------------------------

    async def keep(self, node: NodeName | str, intent: AuditRecord) -> bool:
        """Record ``intent`` where a record can still be written, before what it describes is
        done: on its node (with an Event), then in the spool (and its JSON line on stdout).
        False when it could not be: then it must not be done."""
        if self.ledger is None:
            return False
        if not self.audit_log.room(1):
            self.tally.spool_overflows += 1
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

    def store_failed(self, exc: BaseException, now: datetime) -> None:
        """Count a failed write; the traceback once per episode, a line on later ticks."""
        self.tally.audit_failures.append("tick")
        if self._store_since is None:
            self._store_since = now
            log.error(
                "audit store failed; lending stops, safety reclaims go on recorded on their "
                "nodes until it takes writes again",
                exc_info=exc,
            )
        else:
            log.warning(
                "audit store still failing since %s: %s",
                nodestate.format_time(self._store_since),
                self.audit_log.failing or exc,
            )
        self.tally.audit_store = (True, len(self.audit_log.spool))

    def store_works(self, now: datetime) -> None:
        if self._store_since is not None:
            log.info(
                "audit store takes writes again after %ss",
                int((now - self._store_since).total_seconds()),
            )
            self._store_since = None
        self.tally.audit_store = (False, len(self.audit_log.spool))


class _Raised:
    """An item of ``Executor._together`` whose work raised (and was logged)."""


_RAISED = _Raised()
IN_FLIGHT = (Phase.LENDING, Phase.RECLAIMING)
# A drain whose node may vanish: its pool, the node's UID, its intent's id and its deadline.
Drain = tuple[PoolConfig, str, str, datetime | None]
# What a write that changed something came to (a 429 from a budget changed nothing).
_CHANGED = frozenset({WriteOutcome.APPLIED, WriteOutcome.EVICTED, WriteOutcome.GONE})


def _lent(pool: PoolConfig) -> tuple[model.Taint, ...]:
    """The pool's lent taints, which every reading of its nodes' phase takes."""
    return pool.lend_spec.add_taints


def _node_uid(intent: AuditRecord) -> str | None:
    """The UID of the node an intent was decided for, as its record holds it."""
    uid = intent.detail.get("node_uid")
    return uid if isinstance(uid, str) and uid else None
