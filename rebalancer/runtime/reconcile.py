"""The reconcile tick: observe, perceive, ask the strategies, step, carry the effects out,
settle. Level-triggered: every tick starts again from the cluster as the informer's cache
holds it, so a step that failed, or a 409, is simply planned again on fresh state next tick.

Where it sits: ``runtime.loop`` calls ``Reconciler.tick`` on a schedule (and early, on window
edges and informer changes). The Reconciler is the shell around one pure step: it holds the
one ``Memory`` (``runtime.memory``) and the seams (the ``Observer``, one actuator per pool, the
audit log, where a record is kept while the store fails, leadership), so a test passes fakes
or the real adapters against the API emulator, or builds a memory and asks ``runtime.step``.

The order inside a tick (docs/design/runtime.md, docs/design/pure-step.md):

1. start-up, on the first tick of a stretch of leadership (``runtime.recovering``): what a
   previous run left open is closed and what it left in flight is ended, audited;
2. observe (``runtime.observing``): node views per pool from the informer's cache (a lent node
   belongs to the pool its *original* labels select), the demand and queue samples, the
   demand history for strategies that want one, takers, alerts and clocks;
3. perceive (``runtime.perception``, pure): each pool's demand through its ``core.demand``
   belief (unknown since the last good sample, an implausible fall held), its error budget,
   and what is said once;
4. ask (``runtime.deciding``): each pool's strategy, in a thread of its own with a time limit
   (one that raises, answers garbage or overruns is replaced by the safety-only proposal for
   that pool and tick only: docs/design/fault-isolation.md);
5. step (``runtime.step``, pure): the plan (``core.tick.plan_tick``), the failure episodes,
   the minute's cost, the tick's records, and, for each outcome of their commit, what follows:
   if the store takes them every step (reclaims first) and every node in flight driven on; if
   it fails only the reclaims that keep inference, each kept on its node first
   (docs/design/audit-failure.md);
6. carry out (``runtime.shell``): the records committed BEFORE anything is written, then the
   branch the commit chose, leadership checked again before each call (a step not carried
   out because leadership went away is closed as ``superseded``), each call followed by its
   outcome record;
7. settle (``runtime.flight.settle``, pure): what the calls came to, folded into the memory
   the next tick starts from.

A follower (``may_write`` false at the step) observes, perceives, asks and plans (its caches
stay warm, its log says what it would do) but writes nothing: no cluster write, and no audit
record either, so a shared audit store holds only the leader's decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from rebalancer.core import audit, demand, model, windows
from rebalancer.core.audit import Context
from rebalancer.core.concurrency import LEND_CONCURRENCY, RECLAIM_CONCURRENCY
from rebalancer.core.model import Clock, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.tick import Decision, PoolControls, operator_reclaims, plan_tick
from rebalancer.runtime import deciding, effects, flight, perception, recovering, step
from rebalancer.runtime.memory import Memory
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.report import Happened, TickReport
from rebalancer.runtime.seams import (
    AuditTrail,
    EventRecorder,
    Leadership,
    NodeActuator,
    NodeLedger,
    NoEvents,
    PoolConfig,
)
from rebalancer.runtime.shell import Run, Shell, say

log = logging.getLogger(__name__)


class Reconciler:
    """The memory, the seams the effects go through, and the tick that joins them."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        observer: Observer,
        clock: Clock,
        actuators: Mapping[PoolName, NodeActuator],
        audit_log: AuditTrail,
        leadership: Leadership,
        keys: Keys | None = None,
        dry_run: bool = False,
        events: EventRecorder | None = None,
        strategy_timeout: timedelta = timedelta(seconds=10),
        reclaim_concurrency: int = RECLAIM_CONCURRENCY,
        lend_concurrency: int = LEND_CONCURRENCY,
        ledger: NodeLedger | None = None,
    ) -> None:
        _check_pools(pools, actuators)
        self.pools = tuple(pools)
        self.keys = keys or Keys()
        self.clock, self.leadership, self.observer = clock, leadership, observer
        # The seams the effects go through (a test may swap one between ticks).
        self.actuators, self.audit_log, self.ledger = actuators, audit_log, ledger
        # Transitions are recorded by the actuators (``runtime.recording``); the findings'
        # Events are known only here, from the plan.
        self.events: EventRecorder = events or NoEvents()
        self.dry_run = dry_run
        self.reclaim_concurrency, self.lend_concurrency = reclaim_concurrency, lend_concurrency
        self.strategies = deciding.Strategies(self.pools, self.keys, strategy_timeout)
        self.recovery = recovering.Recovery(
            self.pools, keys=self.keys, clock=clock, context=self._context
        )
        self.memory = Memory(started=_NOT_STARTED)

    def reconfigure(self, pools: Sequence[PoolConfig], changed: Reconfigured) -> None:
        """Run by new settings from the next tick on (``runtime.livesettings``): the same pools
        by name, their policies, strategies and switches new. Between ticks only (the loop never
        runs two at once): the memory, the observer's caches and the strategy calls still
        running are kept, as each is keyed by pool name."""
        _check_pools(pools, changed.actuators)
        self.pools = tuple(pools)
        self.actuators = changed.actuators
        self.observer.reconfigure(
            self.pools,
            paused=changed.paused,
            frozen=changed.frozen,
            clock_bound=changed.clock_bound,
        )
        self.strategies.pools, self.strategies.timeout = self.pools, changed.strategy_timeout
        self.recovery.pools = self.pools
        self.lend_concurrency = changed.lend_concurrency

    @property
    def rules(self) -> effects.Rules:
        """What the step runs by: the pools, the keys and the switches, as they stand."""
        return effects.Rules(
            self.pools,
            self.keys,
            dry_run=self.dry_run,
            can_keep=self.ledger is not None,
            reclaim_concurrency=self.reclaim_concurrency,
            lend_concurrency=self.lend_concurrency,
        )

    def shell(self) -> Shell:
        """The effects' seams as they stand, with a fresh account of what they come to."""
        return Shell(
            self.pools,
            self.actuators,
            self.audit_log,
            self.ledger,
            self.events,
            self.clock,
            self.leadership,
            self.recovery,
        )

    @property
    def last(self) -> model.Snapshot | None:
        """The last tick's snapshot (for wake-ups)."""
        return self.memory.last

    @property
    def last_decided(self) -> tuple[model.Snapshot, Decision] | None:
        """The last tick's snapshot with what was decided on it (for explain)."""
        return self.memory.last_decided

    # -----------------------------------------------------------------------------------------
    # Start-up

    async def start(self, shell: Shell | None = None) -> tuple[ActionResult, ...]:
        """Before the first tick (informer synced, leading): say what the intents a previous run
        left open came to, and end every transition it left in flight, audited like any step
        (``runtime.recovering``); the error budgets' count taken up from the audit log."""
        shell = shell or self.shell()
        members = {
            view.name: (pool, view)
            for pool, views in self.observer.members().items()
            for view in views
        }
        now = self.clock()
        try:
            takeovers, costs = await self.recovery.close_open_intents(shell, members, now)
        finally:
            self._settle(self.memory, shell.run)
        self.memory = replace(self.memory, costs=costs, started=self._term_key())
        return await self.recovery.take_over(shell, takeovers)

    async def _start_up_if_new_term(self, shell: Shell) -> None:
        """On the first tick of this stretch of leadership, what a previous leader (or this
        process before a restart) left unfinished is closed and ended first, then the tick
        observes and plans from what start-up left."""
        if self.memory.started == self._term_key() or not self._leading():
            return
        try:
            await self.start(shell)
            self.memory = replace(self.memory, start_unaudited=False)
        except Exception as exc:
            if self.ledger is None or self.audit_log.failing is None:
                raise
            # The store fails: the safety reclaims below must not wait for it. Start-up is
            # tried again next tick; the nodes in flight are driven by this one.
            shell.store_failed(exc)
            self.memory = replace(self.memory, start_unaudited=True)

    # -----------------------------------------------------------------------------------------
    # One tick

    async def tick(self) -> TickReport:
        """One step: observe, ask the strategies, step, carry the effects out, settle (the
        order in this module's docstring); a follower's step has no effect but its log."""
        shell = self.shell()
        await self._start_up_if_new_term(shell)
        # The clocks first: the tick's now is the API server's, corrected by what they say.
        measured = await self.observer.measure_clocks()
        now = self.clock()
        seen = await self.observer.observe(now, measured)
        self.memory, perceived = perception.perceive(self.memory, seen, self.rules)
        say(perceived.says)
        answers = await self.strategies.answers(perceived.snapshot)
        term = self.leadership.term
        facts = effects.Seen(
            perceived.snapshot,
            answers,
            self.leadership.identity,
            term.number if term is not None else None,
            self._leading(),
            self._term_key(),
        )
        memory, done = step.step(self.memory, facts, self.rules, self.audit_log.new_id)
        self.memory = memory
        branch = await shell.effects(done)
        # A tick that wrote nothing settles too: start-up may have met the store.
        self._settle(branch.memory if branch is not None else memory, shell.run)
        decision, run = done.decision, shell.run
        happened = Happened(
            **vars(done.noted),
            clocks=seen.clocks,
            unreadable=perceived.unreadable,
            audit_store=run.audit_store,
            audit_failures=tuple(run.audit_failures),
            spool_overflows=run.spool_overflows,
            reclaims=tuple(run.reclaims),
            notices=tuple(run.notices),
        )
        return TickReport(
            now,
            perceived.snapshot,
            decision.proposals,
            decision.plan,
            leading=branch is not None,
            audited=run.audited,
            applied=tuple(run.applied),
            error=run.error,
            happened=happened,
        )

    def _settle(self, memory: Memory, run: Run) -> None:
        """The memory after what the effects came to; what it says about them, logged."""
        self.memory, says = flight.settle(memory, run.done, run.store)
        run.done.clear()
        run.store.clear()
        say(says)

    async def preview(self, recall: timedelta | None = None) -> tuple[model.Snapshot, Decision]:
        """Observe and decide as a tick does, and write nothing, to the cluster or the audit
        log: ``rebalancer explain``. The error budgets' minutes are read from the audit log
        first when no start-up has (a process that only explains); with ``recall`` (the loop's
        tick interval), each pool's demand belief too, as the loop holds it
        (``recall_beliefs``)."""
        now = self.clock()
        if self.memory.started is _NOT_STARTED:
            costs = await recovering.restore_unknown_costs(
                self.pools, self.memory.costs, self.audit_log, now
            )
            self.memory = replace(self.memory, costs=costs)
            if recall is not None:
                await self.recall_beliefs(now, recall)
        measured = await self.observer.measure_clocks()
        seen = await self.observer.observe(self.clock(), measured)
        _, perceived = perception.perceive(self.memory, seen, self.rules)
        snapshot = perceived.snapshot
        answers = await self.strategies.answers(snapshot)
        return snapshot, plan_tick(snapshot, answers, self.rules.controls, self.keys)

    async def recall_beliefs(self, now: datetime, step: timedelta) -> None:
        """Each pool's demand belief as a loop ticking every ``step`` holds it at ``now``: the
        samples of the last ``drop_hold`` (and the minute before it) read again at each step,
        as the loop read them, and judged in order. A process that only explains has no memory
        of its own; without this it believes a fall the loop holds for up to ``drop_hold``, and
        the two answer differently all that while. Stops at a pool's first read that fails
        (Prometheus not reachable from here): the belief is what was read until then, and none
        (as a process that just started) when nothing was."""
        members = self.observer.members()
        beliefs = dict(self.memory.beliefs)
        for pool in self.pools:
            names = [v.name for v in members[pool.name]]
            rule = pool.policy.drop_rule
            at = now - rule.hold - demand.SPAN
            belief, read = demand.start(at), False
            while at < now:
                found = await self.observer.read_again(pool.name, names, at)
                if found is None:
                    break
                belief, _ = demand.judge(belief, found.demand, at, rule)
                at, read = at + step, True
            if read:
                beliefs[pool.name] = belief
        self.memory = replace(self.memory, beliefs=beliefs)

    def pool_controls(self, name: PoolName) -> PoolControls:
        return self.rules.controls[name]

    def operator_plan(
        self, members: Mapping[PoolName, Sequence[NodeView]], message: str
    ) -> tuple[model.Plan, audit.Tick]:
        """An operator's reclaim of these nodes now (``rebalancer reclaim``): planned by
        ``core.tick.operator_reclaims``, its intents built like a tick's, not committed yet.
        Each step is then carried out with ``Shell.carry``, as a tick's are."""
        now = self.clock()
        names = {pool: [v.name for v in views] for pool, views in members.items()}
        plan = operator_reclaims(now, names, message)
        snapshot = model.Snapshot(
            now, {pool: model.PoolSnapshot(nodes=tuple(v)) for pool, v in members.items()}
        )
        return plan, step.tick_records(
            snapshot, {}, plan, self.rules, self._context, self.audit_log.new_id
        )

    # -----------------------------------------------------------------------------------------
    # Wake-ups

    def next_edge(self, now: datetime) -> datetime | None:
        """The next instant a window (a pool's, or a node's override as last seen) opens or
        closes: the loop wakes the step there rather than up to an interval late."""
        found: list[datetime] = []
        seen = self.last.pools if self.last is not None else {}
        for pool in self.pools:
            wins = [pool.policy.window]
            snap = seen.get(pool.name)
            for view in snap.nodes if snap is not None else ():
                text = view.annotations.get(self.keys.window)
                parsed = windows.parse(text, pool.policy.zone) if text else None
                if isinstance(parsed, windows.Window):
                    wins.append(parsed)
            found.extend(e for e in (w.next_edge(now) for w in wins) if e is not None)
        return min(found, default=None)

    # -----------------------------------------------------------------------------------------

    def _term_key(self) -> object:
        term = self.leadership.term
        return (self.leadership.identity, term.number if term is not None else None)

    def _leading(self) -> bool:
        return self.leadership.may_write(self.leadership.now())

    def _context(self, pool: PoolConfig | None) -> Context:
        term = self.leadership.term
        number = term.number if term is not None else None
        return effects.context(self.leadership.identity, number, pool, self.dry_run)


_NOT_STARTED = object()


@dataclass(frozen=True)
class Reconfigured:
    """What new settings change in a running reconciler besides its pools."""

    actuators: Mapping[PoolName, NodeActuator]
    paused: bool
    frozen: bool
    clock_bound: timedelta
    strategy_timeout: timedelta
    lend_concurrency: int


def _check_pools(pools: Sequence[PoolConfig], actuators: Mapping[PoolName, NodeActuator]) -> None:
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique: {names}")
    missing = sorted(set(names) - set(actuators))
    if missing:
        raise ValueError(f"no actuator for pool(s) {', '.join(missing)}")
