"""Start-up and recovery: what a previous run left open is closed, and every transition it left
in flight is taken over, before the first tick of a stretch of leadership; and the records kept
on nodes while the audit store failed are brought to the store before a tick writes.

Where it sits: ``runtime.reconcile.Reconciler.start`` (on the first leading tick of a term)
calls ``close_open_intents`` then ``take_over``; every tick that writes calls ``catch_up`` first.
Each open intent is judged against its node (``core.recovery``): ``applied`` when its effect is
there, ``superseded`` when it never reached the node, ``interrupted`` when the node is caught
mid-transition under it. An interrupted one, and a node in flight whose decision names no
record at all, gets a recovery intent (origin ``recovery``) written with the verdicts, before
any write; its actuator pass then takes the node over (the node's ``decision`` becomes the
recovery's id, so its Events and writes name it) and its outcome follows. A reclaim still
draining goes on under that intent next tick. Each pool's actuator only touches its own nodes,
so a pool's pod marks never judge another pool's pods. Kept apart from the step because it runs
once per term, and a crash between any two writes must leave something it can end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from rebalancer.core import audit, recovery
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import Clock, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.tick import phase
from rebalancer.runtime import budgets, executing
from rebalancer.runtime.report import Tally
from rebalancer.runtime.seams import PoolConfig

log = logging.getLogger(__name__)

Members = Mapping[NodeName, tuple[PoolName, NodeView]]  # each node with the pool it belongs to
Takeover = tuple[PoolName, NodeName, AuditRecord]  # a node in flight and its recovery intent


class Recovery:
    """What a previous run left behind, closed and ended; the records on nodes, caught up."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        keys: Keys,
        clock: Clock,
        executor: executing.Executor,
        budgets: budgets.Budgets,
        tally: Tally,
        context: Callable[[PoolConfig | None], Context],
    ) -> None:
        self.pools, self.keys, self.clock = tuple(pools), keys, clock
        # The audit log, the ledger and the actuators are the executor's (a test swaps them).
        self.executor, self.budgets = executor, budgets
        self.tally, self.context = tally, context
        self._unkept: set[NodeName] = set()  # nodes whose kept records cannot be read, logged

    async def close_open_intents(self, members: Members, now: datetime) -> list[Takeover]:
        """The verdicts on the intents a previous run left open, and a recovery intent for each
        node to take over, committed in one batch; the error budgets' count restored. Raises if
        the store fails."""
        trail = self.executor.audit_log
        try:
            # Records a run kept on its nodes while the store failed come first: the intents
            # judged below may be among them.
            await self.catch_up([view for _, view in members.values()], now)
            records, takeovers = await self._recovery_records(now, members)
            await trail.tick(records)
            await self.budgets.restore(trail, now)
        except Exception:
            self.tally.audit_failures.append("recover")
            raise
        closed = sum(1 for r in records if r.kind is audit.Kind.OUTCOME)
        if records:
            log.info(
                "start-up: %d open intent(s) closed, %d transition(s) taken over",
                closed,
                len(takeovers),
            )
        return takeovers

    async def take_over(self, takeovers: Sequence[Takeover]) -> tuple[ActionResult, ...]:
        """One actuator pass on each node taken over, under its recovery intent, then its
        outcome."""
        executor = self.executor
        results: list[ActionResult] = []
        for pool, name, intent in takeovers:
            result = await executor.actuators[pool].progress(name, decision=intent.id)
            log.info("recover %s: %s (%s)", name, result.outcome.value, result.message)
            await executor.safely(executor.audit_log.outcome(intent, result, self.clock()))
            executor.reclaimed(pool, intent, result)
            results.append(result)
        return tuple(results)

    async def _recovery_records(
        self, now: datetime, members: Members
    ) -> tuple[list[AuditRecord], list[Takeover]]:
        """The verdicts on the open intents, and the recovery intents, in one batch."""
        records: list[AuditRecord] = []
        takeovers: list[Takeover] = []
        trail = self.executor.audit_log
        untouched = {i.id for i in await trail.pending_intents()}
        for intent in await trail.unfinished_intents():
            member = members.get(NodeName(intent.node or ""))
            begun = intent.id not in untouched  # it has in_progress outcomes: a drain
            verdict = recovery.judge(intent, member[1] if member else None, self.keys, begun)
            message = f"controller restarted: {verdict.message}"
            # The run that wrote the intent (and made what the node shows); this record is
            # written by the new one.
            detail: dict[str, Any] = {"by": intent.controller, "term": intent.term}
            if verdict.take_over and member is not None:
                why = f"a restart found {intent.action} {intent.id} unfinished: ending it"
                taken = self._take_over(now, member[0], member[1], intent.id, why)
                records.append(taken)
                takeovers.append((member[0], member[1].name, taken))
                message += f"; recovery {taken.id} takes it over"
                detail["recovered_by"] = taken.id
            ctx = self.context(self._pool(PoolName(intent.pool)))
            records.append(
                audit.outcome_record(
                    intent, trail.new_id, now, verdict.result, message, detail=detail, ctx=ctx
                )
            )
        for left in await self._left_in_flight(now, members, {n for _, n, _ in takeovers}):
            records.append(left[2])
            takeovers.append(left)
        return records, takeovers

    async def _left_in_flight(
        self, now: datetime, members: Members, taken: set[NodeName]
    ) -> list[Takeover]:
        """Every other node in flight is taken over too, though its intent is closed (a lend
        that ended in a conflict, leaving the node lending): the run that moved it is gone."""
        trail = self.executor.audit_log
        out: list[Takeover] = []
        for name, (pool, view) in members.items():
            config = self._pool(pool)
            lent = config.lend_spec.add_taints if config is not None else ()
            if name in taken or phase(view, self.keys, lent) not in executing.IN_FLIGHT:
                continue
            decision = view.annotations.get(self.keys.decision)
            known = decision is not None and await trail.get(decision) is not None
            what = "an intent with its outcome on record" if known else "no intent on record"
            why = f"node in flight under {decision!r}, {what}"
            out.append((pool, view.name, self._take_over(now, pool, view, decision, why)))
        return out

    def _take_over(
        self, now: datetime, pool: PoolName, view: NodeView, recovers: str | None, why: str
    ) -> AuditRecord:
        """The recovery intent under which a node in flight is ended."""
        return audit.recovery_intent(
            self.context(self._pool(pool)),
            self.executor.audit_log.new_id,
            now,
            str(pool),
            view,
            recovery.recovery_action(view, self.keys),
            recovers,
            why,
        )

    def _pool(self, name: PoolName) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)

    async def catch_up(self, views: Iterable[NodeView], now: datetime) -> None:
        """Bring the store up to date before the tick writes: the spool first, then every
        record a node carries that the store does not have (kept there by this process, by a
        run that died before its spool was written, or by ``rebalancer reclaim``), oldest
        first; each node then lets go of what the store has. Raises nothing: a store still
        failing is found by the tick's own write."""
        if self.executor.ledger is None:
            return
        on_nodes: dict[str, tuple[AuditRecord, ...]] = {}
        for view in views:
            try:
                found = self.executor.ledger.kept(view)
            except Exception as exc:
                if view.name not in self._unkept:
                    self._unkept.add(view.name)
                    log.error("node %s: %s; left as it is", view.name, exc)
                continue
            if found:
                on_nodes[str(view.name)] = found
        if not on_nodes and not self.executor.audit_log.spool:
            return
        try:
            await self.executor.audit_log.flush()
            spooled = {r.id for r in self.executor.audit_log.spool}
            missing = []
            for record in sorted(
                (r for rs in on_nodes.values() for r in rs), key=lambda r: (r.time, r.id)
            ):
                if (
                    record.id not in spooled
                    and await self.executor.audit_log.get(record.id) is None
                ):
                    missing.append(record)
            if missing:
                self.executor.audit_log.hold(missing)
                await self.executor.audit_log.flush()
                log.info("%d record(s) kept on nodes written to the audit store", len(missing))
        except Exception:
            return  # the store still fails: the nodes keep their records
        self.executor.store_works(now)
        for node, found in on_nodes.items():
            try:
                await self.executor.ledger.release(node, [r.id for r in found])
            except Exception as exc:  # harmless: the next tick finds them in the store
                log.warning("node %s: records kept on it not removed yet: %s", node, exc)
