"""Start-up and recovery: what a previous run left open is closed, and every transition it left
in flight is taken over, before the first tick of a stretch of leadership; and the records kept
on nodes (or in the controller's Events, for a node whose records another writer removed)
while the audit store failed are brought to the store before a tick writes.

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
from datetime import datetime, timedelta
from typing import Any

from rebalancer import errors
from rebalancer.core import audit, bounded, recovery
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import Clock, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.tick import phase
from rebalancer.runtime.budgets import MINUTE
from rebalancer.runtime.flight import IN_FLIGHT
from rebalancer.runtime.seams import AuditTrail, KeptCopy, NodeLedger, PoolConfig
from rebalancer.runtime.shell import Shell

log = logging.getLogger(__name__)

# An intent's Event is recorded again when its newest is this old, while the store fails:
# half kube-apiserver's default --event-ttl (1 h), so a copy younger than the TTL always exists.
RETELL = timedelta(minutes=30)
# How often the Events are listed while the store works (every tick while it fails, and at the
# start of each term): well inside the TTL, so a record that ``rebalancer reclaim`` kept there
# is found before its Event expires, and a LIST of Events is not made on every tick.
RELIST = timedelta(minutes=5)

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
        context: Callable[[PoolConfig | None], Context],
    ) -> None:
        # The audit log, the ledger and the actuators are the shell's, as the reconciler holds
        # them at the call (a test swaps them between ticks): each call is handed it.
        self.pools, self.keys, self.clock, self.context = tuple(pools), keys, clock, context
        # What it has said, and what it has read, so as not to say or read it again: the
        # recovery's own log and read cache, which no decision reads.
        self._unkept: set[NodeName] = set()  # nodes whose kept records cannot be read, logged
        self._unlisted = False  # the Events could not be listed, logged
        self._bugs: set[type[BaseException]] = set()  # catch_up's own failures, each logged
        self._listed: datetime | None = None  # when the Events were last listed
        # Ids read back from Events and found in the store: not asked of it again.
        self._stored: set[str] = set()
        self._refused: set[str] = set()  # ids read back that no node vouches for, logged

    async def close_open_intents(
        self, shell: Shell, members: Members, now: datetime
    ) -> tuple[list[Takeover], Costs]:
        """The verdicts on the intents a previous run left open, and a recovery intent for each
        node to take over, committed in one batch; the error budgets' count restored. Raises if
        the store fails."""
        trail = shell.audit_log
        self._listed = None  # a new term reads the Events back whatever the last one read
        try:
            # Records a run kept on its nodes while the store failed come first: the intents
            # judged below may be among them.
            await self.catch_up(shell, [view for _, view in members.values()], now)
            records, takeovers = await self._recovery_records(shell, now, members)
            await trail.tick(records)
            costs = await restore_costs(self.pools, trail, now)
        except Exception:
            shell.run.audit_failures.append("recover")
            raise
        closed = sum(1 for r in records if r.kind is audit.Kind.OUTCOME)
        if records:
            log.info(
                "start-up: %d open intent(s) closed, %d transition(s) taken over",
                closed,
                len(takeovers),
            )
        return takeovers, costs

    async def take_over(
        self, shell: Shell, takeovers: Sequence[Takeover]
    ) -> tuple[ActionResult, ...]:
        """One actuator pass on each node taken over, under its recovery intent, then its
        outcome."""
        results: list[ActionResult] = []
        for pool, name, intent in takeovers:
            result = await shell.actuators[pool].progress(name, decision=intent.id)
            log.info("recover %s: %s (%s)", name, result.outcome.value, result.message)
            await shell.safely(shell.audit_log.outcome(intent, result, self.clock()))
            shell.reclaimed(pool, intent, result)
            results.append(result)
        return tuple(results)

    async def _recovery_records(
        self, shell: Shell, now: datetime, members: Members
    ) -> tuple[list[AuditRecord], list[Takeover]]:
        """The verdicts on the open intents, and the recovery intents, in one batch."""
        records: list[AuditRecord] = []
        takeovers: list[Takeover] = []
        trail = shell.audit_log
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
                taken = self._take_over(shell, now, member[0], member[1], intent.id, why)
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
        for left in await self._left_in_flight(shell, now, members, {n for _, n, _ in takeovers}):
            records.append(left[2])
            takeovers.append(left)
        return records, takeovers

    async def _left_in_flight(
        self, shell: Shell, now: datetime, members: Members, taken: set[NodeName]
    ) -> list[Takeover]:
        """Every other node in flight is taken over too, though its intent is closed (a lend
        that ended in a conflict, leaving the node lending): the run that moved it is gone."""
        trail = shell.audit_log
        out: list[Takeover] = []
        for name, (pool, view) in members.items():
            config = self._pool(pool)
            lent = config.lend_spec.add_taints if config is not None else ()
            if name in taken or phase(view, self.keys, lent) not in IN_FLIGHT:
                continue
            decision = view.annotations.get(self.keys.decision)
            known = decision is not None and await trail.get(decision) is not None
            what = "an intent with its outcome on record" if known else "no intent on record"
            why = f"node in flight under {bounded.quoted(decision)}, {what}"
            out.append((pool, view.name, self._take_over(shell, now, pool, view, decision, why)))
        return out

    def _take_over(
        self,
        shell: Shell,
        now: datetime,
        pool: PoolName,
        view: NodeView,
        recovers: str | None,
        why: str,
    ) -> AuditRecord:
        """The recovery intent under which a node in flight is ended."""
        return audit.recovery_intent(
            self.context(self._pool(pool)),
            shell.audit_log.new_id,
            now,
            str(pool),
            view,
            recovery.recovery_action(view, self.keys),
            recovers,
            why,
        )

    def _pool(self, name: PoolName) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)

    async def catch_up(self, shell: Shell, views: Iterable[NodeView], now: datetime) -> None:
        """Bring the store up to date before the tick writes: the spool first, then every
        record a node carries, or an Event of this controller's holds for the node's decision,
        that the store does not have (kept there by this process, by a run that died before its
        spool was written, or by ``rebalancer reclaim``), oldest first; each node then lets go
        of what the store has. While the store still fails, an intent whose newest Event is
        getting old is told again (``RETELL``). Raises nothing: a store still failing is found
        by the tick's own write."""
        ledger = shell.ledger
        if ledger is None:
            return
        views = list(views)
        on_nodes = self._on_nodes(ledger, views)
        copies = await self._copies(shell, ledger, views, now)
        trail = shell.audit_log
        if not on_nodes and not copies and not trail.spool:
            return
        try:
            await trail.flush()
            missing = await self._missing(shell.audit_log, on_nodes, copies or ())
            if missing:
                trail.hold(missing)
                await trail.flush()
                self._stored.update(r.id for r in missing)
                log.info(
                    "%d record(s) kept on nodes or in Events written to the audit store",
                    len(missing),
                )
            await self._refuse(shell.audit_log, copies or ())
        except errors.StoreFailed:
            # The store still fails: the nodes and the Events keep their records.
            if copies is not None:
                await self._retell(shell.audit_log, ledger, views, on_nodes, copies, now)
            return
        except Exception as exc:
            # A bug of ours, not the store: the records stay where they are (nothing is
            # released below), the tick's safety reclaims go on, and it is said once per kind.
            if type(exc) not in self._bugs:
                self._bugs.add(type(exc))
                log.exception("writing the records kept on nodes and in Events failed: a bug")
            return
        shell.store_works()
        for node, found in on_nodes.items():
            try:
                await ledger.release(node, [r.id for r in found])
            except Exception as exc:  # harmless: the next tick finds them in the store
                log.warning("node %s: records kept on it not removed yet: %s", node, exc)

    def _on_nodes(
        self, ledger: NodeLedger, views: Iterable[NodeView]
    ) -> dict[str, tuple[AuditRecord, ...]]:
        """The records each node carries (a node whose records cannot be read is left as it
        is, and said once)."""
        on_nodes: dict[str, tuple[AuditRecord, ...]] = {}
        for view in views:
            try:
                found = ledger.kept(view)
            except Exception as exc:
                if view.name not in self._unkept:
                    self._unkept.add(view.name)
                    log.error("node %s: %s; left as it is", view.name, exc)
                continue
            if found:
                on_nodes[str(view.name)] = found
        return on_nodes

    async def _copies(
        self, shell: Shell, ledger: NodeLedger, views: Sequence[NodeView], now: datetime
    ) -> Sequence[KeptCopy] | None:
        """The intents read back from this controller's Events (``adapters.ledger.copies``);
        None when they were not read: not due (``RELIST``), or they cannot be listed (said
        once until they can)."""
        listed, failing = self._listed, shell.audit_log.failing is not None
        if not failing and listed is not None and now - listed < RELIST:
            return None
        try:
            copies = await ledger.copies(views)
        except Exception as exc:
            if not self._unlisted:
                self._unlisted = True
                log.error(
                    "the controller's own Events cannot be listed (%s): a record kept only "
                    "in one waits until they can",
                    exc,
                )
            return None
        self._unlisted, self._listed = False, now
        ids = {c.record.id for c in copies}
        self._stored &= ids  # an Event gone is not asked of again
        self._refused &= ids
        return copies

    async def _missing(
        self,
        trail: AuditTrail,
        on_nodes: Mapping[str, Sequence[AuditRecord]],
        copies: Sequence[KeptCopy],
    ) -> list[AuditRecord]:
        """The records kept on nodes or in Events that neither the spool nor the store has,
        oldest first (a record already stored is never written twice)."""
        spooled = {r.id for r in trail.spool}
        found = {r.id: r for rs in on_nodes.values() for r in rs}
        for copy in copies:
            if copy.vouched:
                found.setdefault(copy.record.id, copy.record)
        missing = []
        for record in sorted(found.values(), key=lambda r: (r.time, r.id)):
            if record.id in spooled or record.id in self._stored:
                continue
            if await trail.get(record.id) is None:
                missing.append(record)
            else:
                self._stored.add(record.id)
        return missing

    async def _refuse(self, trail: AuditTrail, copies: Sequence[KeptCopy]) -> None:
        """Say, once each, which records read back from Events are not written to the store:
        those the store does not have and no node vouches for (its ``decision`` names another
        record, or another writer removed it, or the Event is not ours but claims to be)."""
        for copy in copies:
            record = copy.record
            if copy.vouched or record.id in self._stored or record.id in self._refused:
                continue
            if await trail.get(record.id) is not None:
                self._stored.add(record.id)
                continue
            self._refused.add(record.id)
            log.warning(
                "node %s: an AuditStoreFailing Event carries %s %s, which the audit store does "
                "not have and the node's decision does not name: not written to the store (an "
                "Event anyone may create is taken only for an action the node shows)",
                record.node,
                record.action,
                record.id,
            )

    async def _retell(
        self,
        trail: AuditTrail,
        ledger: NodeLedger,
        views: Sequence[NodeView],
        on_nodes: Mapping[str, Sequence[AuditRecord]],
        copies: Sequence[KeptCopy],
        now: datetime,
    ) -> None:
        """While the store fails, every intent acted on (its node's decision names it) that is
        kept on its node, in the spool or in an Event gets a new Event once its newest is
        ``RETELL`` old: an Event expires (kube-apiserver's ``--event-ttl``), and the copy
        must outlast the node's annotation, which another writer may remove."""
        decisions = {str(v.name): v.annotations.get(self.keys.decision) for v in views}
        told = {c.record.id: c.told for c in copies}
        kept = [
            *(r for rs in on_nodes.values() for r in rs),
            *trail.spool,
            *(c.record for c in copies if c.vouched),
        ]
        done: set[str] = set()
        for record in kept:
            if (
                record.id in done
                or record.kind is not audit.Kind.INTENT
                or record.node is None
                or decisions.get(record.node) != record.id
            ):
                continue
            done.add(record.id)
            last = told.get(record.id)
            if last is None or now - last >= RETELL:
                await ledger.retell(record, trail.failing or "")


Costs = Mapping[PoolName, tuple[datetime, ...]]  # each pool's minutes that cost its error budget


async def restore_costs(pools: Sequence[PoolConfig], trail: AuditTrail, now: datetime) -> Costs:
    """Every pool's minutes as the audit log holds them, within its error budget's window (the
    last minute only for a pool without a budget): a new leader, or this one restarted, takes
    the count up where the last one left it. Raises if the store fails."""
    out = {}
    for config in pools:
        since = now - (config.slo.window if config.slo else MINUTE)
        out[config.name] = tuple(await trail.cost_minutes(config.name, since))
    return out


async def restore_unknown_costs(
    pools: Sequence[PoolConfig], costs: Costs, trail: AuditTrail, now: datetime
) -> Costs:
    """``costs`` with the minutes of each pool with an error budget whose count is not known
    yet (a process that only explains, and never started up)."""
    out = dict(costs)
    for config in pools:
        if config.slo is not None and config.name not in out:
            out[config.name] = tuple(await trail.cost_minutes(config.name, now - config.slo.window))
    return out
