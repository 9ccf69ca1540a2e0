"""The reconcile step: observe, decide, plan, audit, apply, audit outcomes; then drive what is in
flight. Level-triggered: every tick starts again from the cluster as the informer's cache holds
it, so a step that failed, or a 409, is simply planned again on fresh state next tick.

Where it sits: ``runtime.loop`` calls ``Reconciler.tick`` on a schedule (and early, on window
edges and informer changes). Every dependency is a seam given to the constructor (a views
source, a metrics source, a clock, one actuator per pool, the audit log, leadership), so a test
passes fakes or the real adapters against the API emulator (the seams: ``runtime.seams``).

The Reconciler delegates each verb to a module of its own, so that ``tick`` reads as them:
observing (``runtime.observing``), deciding (``runtime.deciding``), the error budgets' count
(``runtime.budgets``), execution and driving (``runtime.executing``, the ``Executor`` the
Reconciler owns, which ``rebalancer reclaim`` carries its steps out through too), and start-up
and recovery (``runtime.recovering``).

The order inside a tick (docs/design/runtime.md):

1. observe (``runtime.observing``): node views per pool from the informer's cache (a lent node
   belongs to the pool its *original* labels select, ``nodestate.serving_labels``), the last
   demand and queue samples with their sample times, and the demand history for strategies
   that want one, refreshed at most every ``history_refresh``;
   Each pool's demand goes through its ``core.demand`` belief: unknown since the last good
   sample, and an implausible fall held (docs/design/safety-rules.md);
2. decide (``runtime.deciding``): each pool's strategy turns its ``PoolView`` into a
   ``Proposal``, in a thread of its own with a time limit. A strategy that raises, answers
   garbage or overruns is replaced, for that pool and tick only, by the safety-only proposal
   (hold what is lent; the planner's safety rules still reclaim): one pool's strategy never
   stops another pool, nor its own pool's safety rules (docs/design/fault-isolation.md);
3. plan: ``planning.plan_pool`` per pool with its policy, pause and freeze; a planner failure
   in one pool is isolated the same way;
4. audit: the tick's records (intents first of all) are committed through ``AuditLog.tick``
   BEFORE anything is written. If the store fails, nothing is lent; the safety reclaims (an
   urgent step: any reclaim not the strategy's own) and the drives of nodes in flight still
   happen, each intent first recorded on its Node (``NodeLedger``), in an Event, on stdout and
   in the log's spool, which the store gets, in order, once it takes writes again
   (docs/design/audit-failure.md);
5. apply (``runtime.executing``): each step through its pool's actuator (whose writer is
   leader-gated), the intent id as the node's ``decision`` annotation; leadership is checked
   again before each step, and a step not carried out because leadership went away is closed
   as ``superseded``;
6. outcomes: one outcome record per actuator call;
7. in flight: every ``lending``/``reclaiming`` node that got no step is driven with
   ``progress``; the outcome goes on the intent the node's ``decision`` annotation names.

A follower (``may_write`` false at the start of the write phase) observes, decides and plans (its
caches stay warm, its log says what it would do) but writes nothing: no cluster write, and no
audit record either, so a shared audit store holds only the leader's decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from rebalancer import errors
from rebalancer.core import (
    audit,
    clocks,
    model,
    nodestate,
    windows,
)
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.concurrency import LEND_CONCURRENCY, RECLAIM_CONCURRENCY
from rebalancer.core.model import (
    Action,
    Clock,
    NodeName,
    NodeView,
    PoolName,
)
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.tick import (
    Decision,
    PoolControls,
    lent_count,
    operator_reclaims,
)
from rebalancer.runtime import budgets, deciding, executing, observing, recovering
from rebalancer.runtime.report import Tally, TickReport
from rebalancer.runtime.seams import (
    AlertSource,
    ApiServerClock,
    AuditTrail,
    EventRecorder,
    HistorySettings,
    Leadership,
    MetricsSource,
    NodeActuator,
    NodeLedger,
    NoEvents,
    Observation,
    PoolConfig,
    PrometheusClock,
    ViewSource,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------


class Reconciler:
    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        views: ViewSource,
        metrics: MetricsSource,
        clock: Clock,
        actuators: Mapping[PoolName, NodeActuator],
        audit_log: AuditTrail,
        leadership: Leadership,
        keys: Keys | None = None,
        history: HistorySettings | None = None,
        paused: Callable[[], bool] = lambda: False,
        frozen: Callable[[], bool] = lambda: False,
        dry_run: bool = False,
        events: EventRecorder | None = None,
        strategy_timeout: timedelta = timedelta(seconds=10),
        reclaim_concurrency: int = RECLAIM_CONCURRENCY,
        lend_concurrency: int = LEND_CONCURRENCY,
        alerts: AlertSource | None = None,
        ledger: NodeLedger | None = None,
        apiserver_clock: ApiServerClock | None = None,
        prometheus_clock: PrometheusClock | None = None,
        clock_bound: timedelta = clocks.DEFAULT_BOUND,
    ) -> None:
        _check_pools(pools, actuators)
        self.pools = tuple(pools)
        self._controls = {p.name: PoolControls(p.policy, p.paused, p.frozen) for p in pools}
        self.clock = clock
        self.leadership = leadership
        self.keys = keys or Keys()
        self.dry_run = dry_run
        self.tally = Tally()  # what the phases note for the telemetry (``runtime.report``)
        self.executor = self._new_executor(
            actuators, audit_log, ledger, reclaim_concurrency, lend_concurrency
        )
        self._assemble_steps(strategy_timeout)
        self.snapshots = observing.Snapshotter(
            self.pools,
            keys=self.keys,
            views=views,
            metrics=metrics,
            budgets=self.budgets,
            tally=self.tally,
            history=history or HistorySettings(),
            paused=paused,
            frozen=frozen,
            alerts=alerts,
            apiserver_clock=apiserver_clock,
            prometheus_clock=prometheus_clock,
            clock_bound=clock_bound,
        )
        # Transitions are recorded by the actuators (see wiring.RecordingActuator); the refused
        # overrides are known only here, from the plan.
        self.events: EventRecorder = events or NoEvents()
        self._init_tick_memory()

    def _new_executor(
        self,
        actuators: Mapping[PoolName, NodeActuator],
        audit_log: AuditTrail,
        ledger: NodeLedger | None,
        reclaim_concurrency: int,
        lend_concurrency: int,
    ) -> executing.Executor:
        """The executor the plan's steps are carried out by, on this reconciler's pools, keys,
        clock, tally and leadership."""
        return executing.Executor(
            self.pools,
            keys=self.keys,
            clock=self.clock,
            actuators=actuators,
            audit_log=audit_log,
            ledger=ledger,
            tally=self.tally,
            leading=self._leading,
            context=self._context,
            dry_run=self.dry_run,
            reclaim_concurrency=reclaim_concurrency,
            lend_concurrency=lend_concurrency,
        )

    def _init_tick_memory(self) -> None:
        """What the reconciler remembers from one tick to the next, before the first."""
        self._start_unaudited = False  # start-up could not write to the store: tried again
        self._started: object = _NOT_STARTED  # the leadership term ``start`` last ran for
        self.last: model.Snapshot | None = None  # the last tick's snapshot (for wake-ups)
        # The last tick's snapshot with what was decided on it (for explain).
        self.last_decided: tuple[model.Snapshot, Decision] | None = None
        # A dry run writes nothing, so it plans the same steps tick after tick: each is
        # audited once, when it enters the plan (``_new_steps``).
        self._would: frozenset[tuple[PoolName, NodeName, Action]] = frozenset()

    def _assemble_steps(self, strategy_timeout: timedelta) -> None:
        """The parts the step delegates to besides the executor: the strategy calls, the error
        budgets' count (restored from the audit log by ``start``), start-up and recovery."""
        self.decider = deciding.Decider(
            self.pools, self._controls, self.keys, self.tally, strategy_timeout
        )
        self.budgets = budgets.Budgets(self.pools, self.keys, self.tally)
        self.recovery = recovering.Recovery(
            self.pools,
            keys=self.keys,
            clock=self.clock,
            executor=self.executor,
            budgets=self.budgets,
            tally=self.tally,
            context=self._context,
        )

    # The executor's seams, as the Reconciler was given them (a test swaps one in between ticks).

    @property
    def actuators(self) -> Mapping[PoolName, NodeActuator]:
        return self.executor.actuators

    @actuators.setter
    def actuators(self, actuators: Mapping[PoolName, NodeActuator]) -> None:
        self.executor.actuators = actuators

    @property
    def audit_log(self) -> AuditTrail:
        return self.executor.audit_log

    @audit_log.setter
    def audit_log(self, audit_log: AuditTrail) -> None:
        self.executor.audit_log = audit_log

    @property
    def ledger(self) -> NodeLedger | None:
        return self.executor.ledger

    @ledger.setter
    def ledger(self, ledger: NodeLedger | None) -> None:
        self.executor.ledger = ledger

    @property
    def lend_concurrency(self) -> int:
        return self.executor.lend_concurrency

    @lend_concurrency.setter
    def lend_concurrency(self, limit: int) -> None:
        self.executor.lend_concurrency = limit

    # -----------------------------------------------------------------------------------------
    # Start-up

    async def start(self) -> tuple[ActionResult, ...]:
        """Before the first tick (informer synced, leading): say what the intents a previous run
        left open came to, and end every transition it left in flight, audited like any step
        (``runtime.recovering``)."""
        members = {
            view.name: (pool, view)
            for pool, views in self.snapshots.members().items()
            for view in views
        }
        takeovers = await self.recovery.close_open_intents(members, self.clock())
        self._started = self._term_key()
        return await self.recovery.take_over(takeovers)

    # -----------------------------------------------------------------------------------------
    # One tick

    async def tick(self) -> TickReport:
        """One step: observe, decide, audit, execute, drive (the order in this module's
        docstring); a follower stops after deciding. The report carries what the phases noted
        for the telemetry."""
        report = await self._step()
        return replace(report, happened=self.tally.take())

    async def _step(self) -> TickReport:
        await self._start_up_if_new_term()
        # The clocks first: the tick's now is the API server's, corrected by what they say.
        measured = await self.snapshots.measure_clocks()
        now = self.clock()
        seen = await self.observe(now, measured)
        self.last = seen.snapshot
        decision = await self.decide(seen.snapshot)
        self.last_decided = (seen.snapshot, decision)
        report = TickReport(now, seen.snapshot, decision.proposals, decision.plan, leading=False)
        if not self._may_write(report):
            return report
        acting = await self._ready_to_audit(report)
        tick, episodes = self._tick_records(seen.snapshot, decision.proposals, acting)
        try:
            written = await self.audit_log.tick(tick.records)
        except errors.StoreFailed as exc:  # no intent on record: only what keeps inference
            # Only the store's own failure: a bug on the way to it ends the tick as it is,
            # rather than pass for a full disk and carry out safety reclaims without the store.
            return await self._without_store(report, seen.snapshot, acting, tick, exc)
        self._audited(episodes, decision.plan, now)
        await self.events.findings(decision.plan)
        applied = await self.executor.apply(acting, tick)
        progressed = await self.executor.drive(seen.snapshot, applied)
        return replace(report, leading=True, audited=written, applied=applied + progressed)

    async def _start_up_if_new_term(self) -> None:
        """On the first tick of this stretch of leadership, what a previous leader (or this
        process before a restart) left unfinished is closed and ended first, then the tick
        observes and plans from what start-up left."""
        if self._started == self._term_key() or not self._leading():
            return
        try:
            await self.start()
            self._start_unaudited = False
        except Exception as exc:
            if self.ledger is None or self.audit_log.failing is None:
                raise
            # The store fails: the safety reclaims below must not wait for it. Start-up is
            # tried again next tick; the nodes in flight are driven by this one.
            self.executor.store_failed(exc, self.clock())
            self._start_unaudited = True

    def _may_write(self, report: TickReport) -> bool:
        """Say what was planned and how the pools stand; whether this tick writes (it leads,
        and has started up for this term)."""
        for line in (p.summary for p in report.plan.pools.values()):
            log.info("%s: %s", "dry run, would plan" if self.dry_run else "plan", line)
        leading = self._leading()
        self._note_health(report, leading)
        if not leading:
            steps = len(report.plan.steps)
            log.info("not leading: %d step(s) planned, none carried out", steps)
            return False
        if self._started != self._term_key() and not self._start_unaudited:
            # Leadership came between the start-up check and now: start up on the next tick.
            log.info("leading since this tick began: start-up runs first next tick")
            return False
        return True

    async def _ready_to_audit(self, report: TickReport) -> model.Plan:
        """The leader's work before the tick's records: the minute's cost counted, the records
        kept on nodes brought to the store; the plan to audit and carry out."""
        self.tally.decided.append(report.plan)
        # The strategy and the planner saw the budget as of the last tick (the snapshot's): this
        # minute counts from the next. The gauges show it counted.
        await self.budgets.count(report.snapshot, self.audit_log, self._context)
        self.budgets.note(report.now)
        acting = self._new_steps(report.plan) if self.dry_run else report.plan
        if not self.dry_run:
            await self.recovery.catch_up(self._all_views(report.snapshot), report.now)
        return acting

    def _audited(
        self, episodes: Sequence[deciding.Announcement], plan: model.Plan, now: datetime
    ) -> None:
        """The tick's records are in the store: its episodes are announced, the store works."""
        self.decider.announced(episodes)
        self.executor.store_works(now)
        if self.dry_run:
            self._would = frozenset((s.pool, s.node, s.action) for s in plan.steps)

    def _new_steps(self, plan: model.Plan) -> model.Plan:
        """A dry run's plan to audit and carry out: only the steps the last tick did not plan.
        Nothing it "did" changed the cluster, so the rest would be the same records again
        every tick; a step that leaves the plan and comes back is audited again."""
        pools = {
            name: replace(
                pool,
                steps=tuple(s for s in pool.steps if (s.pool, s.node, s.action) not in self._would),
            )
            for name, pool in plan.pools.items()
        }
        kept = len(plan.steps) - sum(len(p.steps) for p in pools.values())
        if kept:
            log.info("dry run: %d step(s) still planned as before, not audited again", kept)
        return replace(plan, pools=pools)

    async def preview(self) -> tuple[model.Snapshot, Decision]:
        """Observe and decide as a tick does, and write nothing, to the cluster or the audit
        log: ``rebalancer explain``. The error budgets' minutes are read from the audit log
        first when no start-up has (a process that only explains)."""
        if self._started is _NOT_STARTED:
            await self.budgets.restore_unknown(self.audit_log, self.clock())
        measured = await self.snapshots.measure_clocks()
        seen = await self.observe(self.clock(), measured)
        return seen.snapshot, await self.decide(seen.snapshot)

    def pool_controls(self, name: PoolName) -> PoolControls:
        return self._controls[name]

    # -- observe ------------------------------------------------------------------------------

    async def observe(
        self, now: datetime, measured: Mapping[PoolName, clocks.Clocks] | None = None
    ) -> Observation:
        """The snapshot at ``now`` (``runtime.observing``)."""
        return await self.snapshots.observe(now, measured)

    # -- decide, plan -------------------------------------------------------------------------

    async def decide(self, snapshot: model.Snapshot) -> Decision:
        """Each pool's strategy answers and every pool is planned (``runtime.deciding``)."""
        return await self.decider.decide(snapshot)

    def _note_health(self, report: TickReport, leading: bool) -> None:
        """How the pools stand, for the gauges: what is lent and overdue, and whether a pool
        is not planned as usual."""
        pools, now, tally = report.snapshot.pools.items(), report.now, self.tally
        tally.leader = (self.leadership.identity, leading)
        tally.lent = {
            str(p.name): lent_count(report.snapshot.pools[p.name], self.keys, _lent(p))
            for p in self.pools
            if p.name in report.snapshot.pools
        }
        tally.overdue = {
            str(name): sum(1 for v in pool.nodes if _overdue(v, self.keys, now))
            for name, pool in pools
        }
        failing = self.decider.failing()
        tally.safety_only = {str(p.name): p.name in failing for p in self.pools}
        tally.demand_held = {str(n): p.held is not None for n, p in pools}
        tally.frozen_under_pressure = {
            str(n): _frozen_under_pressure(p) for n, p in report.plan.pools.items()
        }

    # -- audit, apply, outcomes ---------------------------------------------------------------

    def _tick_records(
        self,
        snapshot: model.Snapshot,
        proposals: Mapping[PoolName, model.Proposal],
        plan: model.Plan,
    ) -> tuple[audit.Tick, list[deciding.Announcement]]:
        new_id = self.audit_log.new_id
        announced, episodes = self.decider.episode_records(self._context, new_id, plan.now)
        built = self._records(snapshot, proposals, plan)
        tick = audit.Tick(records=(*announced, *built.records), intents=built.intents)
        return tick, episodes

    # -- when the audit store fails -----------------------------------------------------------

    async def _without_store(
        self,
        report: TickReport,
        snapshot: model.Snapshot,
        plan: model.Plan,
        tick: audit.Tick,
        exc: errors.StoreFailed,
    ) -> TickReport:
        """The tick's intents were not committed. Nothing is lent; each safety reclaim is
        carried out once its intent is kept on its node and in the spool (``keep``), and the
        nodes in flight are driven on; their outcomes wait in the spool."""
        self.executor.store_failed(exc, snapshot.now)
        error = f"audit store failed: {exc}"
        if self.dry_run or self.ledger is None:
            return replace(report, leading=True, error=error)
        kept = [s for s in plan.steps if keeps_inference(s)]
        kept = [s for s in kept if await self.executor.keep(s.node, tick.intent_for(s))]
        left = len(plan.steps) - len(kept)
        log.warning(
            "audit store failing: %d safety reclaim(s) carried out, recorded on their nodes; "
            "%d step(s) not carried out (no lending while the store fails)",
            len(kept),
            left,
        )
        chosen = {(s.pool, s.node, s.action) for s in kept}
        only = replace(
            plan,
            pools={
                name: replace(
                    pool,
                    steps=tuple(s for s in pool.steps if (s.pool, s.node, s.action) in chosen),
                )
                for name, pool in plan.pools.items()
            },
        )
        applied = await self.executor.apply(only, tick)
        progressed = await self.executor.drive(snapshot, applied)
        self.tally.audit_store = (True, len(self.audit_log.spool))
        return replace(report, leading=True, error=error, applied=applied + progressed)

    def _all_views(self, snapshot: model.Snapshot) -> list[NodeView]:
        return [v for pool in snapshot.pools.values() for v in pool.nodes]

    def _records(
        self,
        snapshot: model.Snapshot,
        proposals: Mapping[PoolName, model.Proposal],
        plan: model.Plan,
    ) -> audit.Tick:
        """The records of ``plan``, each pool's under its own context (its strategy)."""
        records: list[AuditRecord] = []
        intents: dict[tuple[str, str, str], AuditRecord] = {}
        for pool in (p for p in self.pools if p.name in plan.pools):
            one = model.Plan(now=plan.now, pools={pool.name: plan.pools[pool.name]})
            built = audit.build_tick(
                one,
                snapshot,
                self._context(pool),
                self.audit_log.new_id,
                proposals,
                {pool.name: pool.policy},
                self.keys,
            )
            records.extend(built.records)
            intents.update(built.intents)
        return audit.Tick(records=tuple(records), intents=intents)

    async def operator_reclaims(
        self, members: Mapping[PoolName, Sequence[NodeView]], message: str
    ) -> tuple[model.Plan, audit.Tick]:
        """An operator's reclaim of these nodes now (``rebalancer reclaim``): planned by
        ``core.tick.operator_reclaims``, its intents built like a tick's and committed in one
        batch before any write. Raises if the store fails. Each step is then carried out with
        ``Executor.carry_out``, as a tick's are."""
        plan, tick = self.operator_plan(members, message)
        await self.audit_log.tick(tick.records)
        return plan, tick

    def operator_plan(
        self, members: Mapping[PoolName, Sequence[NodeView]], message: str
    ) -> tuple[model.Plan, audit.Tick]:
        """``operator_reclaims``' plan and intents, not committed yet."""
        now = self.clock()
        names = {pool: [v.name for v in views] for pool, views in members.items()}
        plan = operator_reclaims(now, names, message)
        snapshot = model.Snapshot(
            now, {pool: model.PoolSnapshot(nodes=tuple(v)) for pool, v in members.items()}
        )
        return plan, self._records(snapshot, {}, plan)

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
        return Context(
            controller=self.leadership.identity,
            term=term.number if term is not None else None,
            strategy=pool.strategy_name if pool else "",
            params=dict(pool.strategy_params) if pool else {},
            dry_run=self.dry_run,
        )


_NOT_STARTED = object()


def _check_pools(pools: Sequence[PoolConfig], actuators: Mapping[PoolName, NodeActuator]) -> None:
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique: {names}")
    missing = sorted(set(names) - set(actuators))
    if missing:
        raise ValueError(f"no actuator for pool(s) {', '.join(missing)}")


def keeps_inference(step: model.Step) -> bool:
    """Whether a step is carried out while the audit store fails: a reclaim for anything but
    the strategy's own plan (demand or queue above what serves, metrics lost, an alert, the
    window closed, a gang preempted, an operator's reclaim), the same steps the planner makes
    urgent. Never a lend; not the strategy's own give-backs (they can wait for the store)."""
    return step.action is Action.RECLAIM and step.urgent


def _frozen_under_pressure(plan: model.PoolPlan) -> bool:
    """A freeze (or an operator's node pause) refused a reclaim that would keep inference
    served: lent nodes are held while demand needs them."""
    held = (model.Reason.FROZEN, model.Reason.NODE_PAUSED)
    return any(r.reason in held and r.intent.origin is model.Origin.SAFETY for r in plan.rejections)


def _lent(pool: PoolConfig) -> tuple[model.Taint, ...]:
    """The taints lending puts on the pool's nodes: what ``lent_count`` reads them by."""
    return pool.lend_spec.add_taints


def _overdue(view: NodeView, keys: Keys, now: datetime) -> bool:
    """A reclaim still open after its deadline (the drain should have been forced by then)."""
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError) or state.phase is not Phase.RECLAIMING:
        return False
    return state.deadline is not None and state.deadline < now
