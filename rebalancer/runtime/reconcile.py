"""The reconcile step: observe, decide, plan, audit, apply, audit outcomes; then drive what is in
flight. Level-triggered: every tick starts again from the cluster as the informer's cache holds
it, so a step that failed, or a 409, is simply planned again on fresh state next tick.

Where it sits: ``runtime.loop`` calls ``Reconciler.tick`` on a schedule (and early, on window
edges and informer changes). Every dependency is a seam given to the constructor (a views
source, a metrics source, a clock, one actuator per pool, the audit log, leadership), so a test
passes fakes or the real adapters against the API emulator.

The order inside a tick (docs/design/runtime.md):

1. observe: node views per pool from the informer's cache (a lent node belongs to the pool its
   *original* labels select, ``nodestate.serving_labels``), the last demand and queue samples
   with their sample times, and the demand history for strategies that want one, refreshed at
   most every ``history_refresh``;
2. decide: each pool's strategy turns its ``PoolView`` into a ``Proposal``;
3. plan: ``planning.make_plan`` with the pools' policies and pauses;
4. audit: the tick's records (intents first of all) are committed through ``AuditLog.tick``
   BEFORE anything is written; if the store fails, nothing is written this tick;
5. apply: each step through its pool's actuator (whose writer is leader-gated), the intent id as
   the node's ``decision`` annotation; leadership is checked again before each step, and a step
   not carried out because leadership went away is closed as ``superseded``;
6. outcomes: one outcome record per actuator call;
7. in flight: every ``lending``/``reclaiming`` node that got no step is driven with
   ``progress``; the outcome goes on the intent the node's ``decision`` annotation names.

A follower (``may_write`` false at the start of the write phase) observes, decides and plans (its
caches stay warm, its log says what it would do) but writes nothing: no cluster write, and no
audit record either, so a shared audit store holds only the leader's decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from rebalancer.adapters.actuator import ActionResult, Outcome
from rebalancer.adapters.audit import AuditLog
from rebalancer.adapters.convert import PodRules
from rebalancer.adapters.events import EventRecorder, NoEvents
from rebalancer.adapters.leadership import Term
from rebalancer.adapters.metrics import HistoryResult, PoolMetrics
from rebalancer.core import audit, model, nodestate, planning, windows
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.policy import PoolPolicy
from strategies.base import Strategy

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


# ---------------------------------------------------------------------------------------------
# Configuration: what the runtime needs of a pool (the settings module builds it)


@dataclass(frozen=True)
class PoolConfig:
    """One pool as the runtime drives it."""

    name: PoolName
    node_selector: Mapping[str, str]  # equality on labels (the node's serving labels)
    policy: PoolPolicy  # its ``lend_spec`` is what lending does to the pool's nodes
    rules: PodRules  # how the pool's pods are told apart
    strategy: Strategy
    strategy_name: str
    strategy_params: Mapping[str, Any] = field(default_factory=dict)
    paused: bool = False  # the pool's pause: nodes frozen as they are
    wants_history: bool | None = None  # None: only the forecast strategy reads history

    @property
    def lend_spec(self) -> nodestate.LendSpec:
        return self.policy.lend_spec

    @property
    def needs_history(self) -> bool:
        if self.wants_history is None:
            return self.strategy_name == "forecast"
        return self.wants_history

    def selects(self, view: NodeView, keys: Keys) -> bool:
        """Whether the node belongs to the pool: by its labels as they are when it serves."""
        state = nodestate.read(view, keys)
        labels = view.labels if isinstance(state, nodestate.StateError) else None
        if labels is None:
            assert isinstance(state, nodestate.NodeState)
            labels = nodestate.serving_labels(view, state)
        return all(labels.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True)
class HistorySettings:
    span: timedelta = timedelta(days=8)  # the forecast looks back up to a week, plus a day
    step: timedelta = timedelta(minutes=1)
    refresh: timedelta = timedelta(minutes=5)  # a history is asked for at most this often


# ---------------------------------------------------------------------------------------------
# Seams


class ViewSource(Protocol):
    """``adapters.informer.Informer``: the cached nodes with their pods."""

    def node_views(self, rules: PodRules) -> tuple[NodeView, ...]: ...


class MetricsSource(Protocol):
    """``adapters.metrics.Metrics`` (or one per pool behind a dispatcher)."""

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics: ...

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult: ...


class NodeActuator(Protocol):
    """``adapters.actuator.Actuator`` (one per pool: lend spec and pod rules are the pool's)."""

    async def lend(self, node: str, decision: str) -> ActionResult: ...

    async def reclaim(self, node: str, decision: str, deadline: datetime) -> ActionResult: ...

    async def progress(self, node: str) -> ActionResult: ...

    async def recover(self) -> tuple[ActionResult, ...]: ...


class Leadership(Protocol):
    """``adapters.leadership.LeaderElector``: whether this replica may write, on its clock."""

    @property
    def identity(self) -> str: ...

    @property
    def term(self) -> Term | None: ...

    @property
    def now(self) -> Clock: ...

    def may_write(self, now: datetime) -> bool: ...


class Observer(Protocol):
    """``runtime.telemetry.Telemetry``: the controller's own metrics. Optional."""

    def observe_snapshot(self, snapshot: model.Snapshot) -> None: ...

    def observe_lent(self, lent: Mapping[str, int]) -> None: ...

    def observe_overdue(self, overdue: Mapping[str, int]) -> None: ...

    def observe_plan(self, plan: model.Plan) -> None: ...

    def observe_leader(self, identity: str, leading: bool) -> None: ...

    def observe_audit_failure(self, operation: str) -> None: ...

    def observe_reclaim_done(self, pool: str, started: datetime, serving: datetime) -> None: ...


class _NoObserver:
    def observe_snapshot(self, snapshot: model.Snapshot) -> None:
        pass

    def observe_lent(self, lent: Mapping[str, int]) -> None:
        pass

    def observe_overdue(self, overdue: Mapping[str, int]) -> None:
        pass

    def observe_plan(self, plan: model.Plan) -> None:
        pass

    def observe_leader(self, identity: str, leading: bool) -> None:
        pass

    def observe_audit_failure(self, operation: str) -> None:
        pass

    def observe_reclaim_done(self, pool: str, started: datetime, serving: datetime) -> None:
        pass


@dataclass
class AlwaysLeader:
    """Leadership for a single replica without election (``--no-leader-election``, tests)."""

    identity: str = "rebalancer"
    term: Term | None = None
    now: Clock = field(default=lambda: datetime.now(UTC))

    def may_write(self, now: datetime) -> bool:
        return True


# ---------------------------------------------------------------------------------------------
# What a tick did


@dataclass(frozen=True)
class Applied:
    """One actuator call of the tick and the audit records around it."""

    node: NodeName
    call: str  # "lend", "reclaim", "progress"
    result: ActionResult | None  # None: not called (leadership lost before it)
    intent: AuditRecord | None
    outcome: AuditRecord | None


@dataclass(frozen=True)
class TickReport:
    now: datetime
    snapshot: model.Snapshot
    proposals: Mapping[PoolName, model.Proposal]
    plan: model.Plan
    leading: bool
    audited: tuple[AuditRecord, ...] = ()  # what ``AuditLog.tick`` wrote
    applied: tuple[Applied, ...] = ()
    error: str | None = None  # why nothing was written (the audit store failed)

    @property
    def steps(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call != "progress")

    @property
    def progressed(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call == "progress")


@dataclass(frozen=True)
class Observation:
    snapshot: model.Snapshot
    metrics: Mapping[PoolName, PoolMetrics]


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
        audit_log: AuditLog,
        leadership: Leadership,
        keys: Keys | None = None,
        history: HistorySettings | None = None,
        paused: Callable[[], bool] = lambda: False,
        dry_run: bool = False,
        observer: Observer | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        missing = sorted(set(names) - set(actuators))
        if missing:
            raise ValueError(f"no actuator for pool(s) {', '.join(missing)}")
        self.pools = tuple(pools)
        self.views, self.metrics, self.clock = views, metrics, clock
        self.actuators, self.audit_log, self.leadership = actuators, audit_log, leadership
        self.keys = keys or Keys()
        self.history_settings = history or HistorySettings()
        self.paused, self.dry_run = paused, dry_run
        self.observer: Observer = observer or _NoObserver()
        # Transitions are recorded by the actuators (see wiring.RecordingActuator); the refused
        # overrides are known only here, from the plan.
        self.events: EventRecorder = events or NoEvents()
        self._started: object = _NOT_STARTED  # the leadership term ``start`` last ran for
        self._histories: dict[PoolName, tuple[datetime, model.DemandHistory]] = {}
        self._warned: set[NodeName] = set()
        self.last: model.Snapshot | None = None  # the last tick's snapshot (for wake-ups)

    # -----------------------------------------------------------------------------------------
    # Start-up

    async def start(self) -> tuple[ActionResult, ...]:
        """Before the first tick (informer synced, leading): close the intents a previous run
        left open, then end every transition it left half done.

        Each pool's actuator recovers only its own nodes (``progress`` on each ``lending`` or
        ``reclaiming`` node of the pool, fresh from the API), so a pool's pod rules never judge
        another pool's pods; with one pool this is exactly ``Actuator.recover()``.
        """
        now = self.clock()
        try:
            closed = await self.audit_log.supersede_pending(
                now, "controller restarted; recover() ends what was in flight", self._context(None)
            )
        except Exception:
            self.observer.observe_audit_failure("supersede")
            raise
        self._started = self._term_key()
        if closed:
            log.info("superseded %d intent(s) left open by a previous run", len(closed))
        results: list[ActionResult] = []
        if len(self.pools) == 1:
            results.extend(await self.actuators[self.pools[0].name].recover())
        else:
            for name, views in self._members().items():
                actuator = self.actuators[name]
                for view in views:
                    if _phase(view, self.keys) in (Phase.LENDING, Phase.RECLAIMING):
                        results.append(await actuator.progress(view.name))
        for r in results:
            log.info("recover %s: %s (%s)", r.node, r.outcome.value, r.message)
        return tuple(results)

    # -----------------------------------------------------------------------------------------
    # One tick

    async def tick(self) -> TickReport:
        now = self.clock()
        seen = await self.observe(now)
        self.last = seen.snapshot
        proposals = self.decide(seen.snapshot)
        plan = self.plan(seen.snapshot, proposals)
        report = TickReport(now, seen.snapshot, proposals, plan, leading=False)
        for line in (p.summary for p in plan.pools.values()):
            log.info("plan: %s", line)
        leading = self._leading()
        self.observer.observe_leader(self.leadership.identity, leading)
        self.observer.observe_snapshot(seen.snapshot)
        pools = seen.snapshot.pools.items()
        self.observer.observe_lent(
            {
                str(name): sum(1 for v in pool.nodes if _phase(v, self.keys) in _LENT_PHASES)
                for name, pool in pools
            }
        )
        self.observer.observe_overdue(
            {
                str(name): sum(1 for v in pool.nodes if _overdue(v, self.keys, now))
                for name, pool in pools
            }
        )
        if not leading:
            log.info("not leading: %d step(s) planned, none carried out", len(plan.steps))
            return report
        if self._started != self._term_key():
            # First tick of this stretch of leadership: what a previous leader (or this
            # process before a restart) left open is closed and ended first, then re-plan.
            await self.start()
            return await self.tick()
        self.observer.observe_plan(plan)
        try:
            tick, written = await self.audit_intents(seen.snapshot, proposals, plan)
        except Exception as exc:  # the store failed: an action with no intent must not happen
            log.exception("audit store failed; nothing is written this tick")
            self.observer.observe_audit_failure("tick")
            return replace(report, leading=True, error=f"audit store failed: {exc}")
        await self.events.findings(plan)
        applied = await self.apply(plan, tick)
        acted = {a.node for a in applied}
        progressed = await self.drive(seen.snapshot, acted)
        return replace(report, leading=True, audited=written, applied=applied + progressed)

    # -- observe ------------------------------------------------------------------------------

    def _members(self) -> dict[PoolName, tuple[NodeView, ...]]:
        """Each pool's nodes; a node two pools select goes to the first (and is warned about)."""
        taken: dict[NodeName, PoolName] = {}
        out: dict[PoolName, tuple[NodeView, ...]] = {}
        for pool in self.pools:
            mine = []
            for view in self.views.node_views(pool.rules):
                if not pool.selects(view, self.keys):
                    continue
                first = taken.setdefault(view.name, pool.name)
                if first != pool.name:
                    if view.name not in self._warned:
                        self._warned.add(view.name)
                        log.warning(
                            "node %s is selected by pools %s and %s; only %s drives it",
                            view.name,
                            first,
                            pool.name,
                            first,
                        )
                    continue
                mine.append(view)
            out[pool.name] = tuple(mine)
        return out

    async def observe(self, now: datetime) -> Observation:
        pools: dict[PoolName, model.PoolSnapshot] = {}
        read: dict[PoolName, PoolMetrics] = {}
        members = self._members()
        for pool in self.pools:
            views = members[pool.name]
            names = [v.name for v in views]
            metrics = await self._read(pool.name, names, now)
            read[pool.name] = metrics
            history = await self._history(pool, names, now) if pool.needs_history else None
            pools[pool.name] = model.PoolSnapshot(
                nodes=views, demand=metrics.demand, queue=metrics.queue, history=history
            )
        snapshot = model.Snapshot(now=now, pools=pools, paused=self.paused())
        return Observation(snapshot, read)

    async def _read(self, pool: PoolName, nodes: Sequence[NodeName], now: datetime) -> PoolMetrics:
        try:
            found = await self.metrics.read(pool, nodes, now)
        except Exception:  # unknown is never zero: no sample, the planner fails toward inference
            log.exception("pool %s: metrics read failed", pool)
            return PoolMetrics(pool=pool, demand=None, queue=None)
        for error in found.errors:
            log.warning("%s", error)
        return found

    async def _history(
        self, pool: PoolConfig, nodes: Sequence[NodeName], now: datetime
    ) -> model.DemandHistory:
        cached = self._histories.get(pool.name)
        hs = self.history_settings
        if cached is not None and now - cached[0] < hs.refresh:
            return cached[1]
        until = _floor(now, hs.step)
        try:
            got = await self.metrics.history(pool.name, nodes, until - hs.span, until, hs.step)
        except Exception:
            log.exception("pool %s: demand history failed", pool.name)
            return cached[1] if cached else model.DemandHistory.empty(now)
        if got.error is not None:
            log.warning("%s", got.error)
            if cached is not None:  # keep the last good one; try again next tick
                return cached[1]
        self._histories[pool.name] = (now, got.history)
        return got.history

    # -- decide, plan -------------------------------------------------------------------------

    def decide(self, snapshot: model.Snapshot) -> dict[PoolName, model.Proposal]:
        proposals = {}
        for pool in self.pools:
            seen = snapshot.pools[pool.name]
            lent = sum(1 for v in seen.nodes if _phase(v, self.keys) in _LENT_PHASES)
            view = pool.policy.view(pool.name, snapshot.now, seen, lent)
            proposals[pool.name] = pool.strategy.decide(view)
        return proposals

    def plan(
        self, snapshot: model.Snapshot, proposals: Mapping[PoolName, model.Proposal]
    ) -> model.Plan:
        return planning.make_plan(
            snapshot,
            proposals,
            {p.name: p.policy for p in self.pools},
            self.keys,
            paused_pools=[p.name for p in self.pools if p.paused],
        )

    # -- audit, apply, outcomes ---------------------------------------------------------------

    async def audit_intents(
        self,
        snapshot: model.Snapshot,
        proposals: Mapping[PoolName, model.Proposal],
        plan: model.Plan,
    ) -> tuple[audit.Tick, tuple[AuditRecord, ...]]:
        """Build every record of the tick (one context per pool: its strategy) and commit them.
        Raises if the store fails."""
        records: list[AuditRecord] = []
        intents: dict[tuple[str, str, str], AuditRecord] = {}
        for pool in self.pools:
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
        written = await self.audit_log.tick(records)
        return audit.Tick(records=tuple(records), intents=intents), written

    async def apply(self, plan: model.Plan, tick: audit.Tick) -> tuple[Applied, ...]:
        done: list[Applied] = []
        by_pool = {p.name: p for p in self.pools}
        for step in plan.steps:
            intent = tick.intent_for(step)
            pool = by_pool[step.pool]
            if not self._leading():
                why = "leadership lost before the step was carried out"
                outcome = await self._safely(self.audit_log.supersede(intent, self.clock(), why))
                done.append(Applied(step.node, step.action.value, None, intent, outcome))
                continue
            actuator = self.actuators[step.pool]
            if step.action is model.Action.LEND:
                result = await actuator.lend(step.node, intent.id)
            else:
                deadline = self.clock() + pool.policy.reclaim_deadline
                result = await actuator.reclaim(step.node, intent.id, deadline)
            log.info(
                "%s %s: %s (%s)", step.action.value, step.node, result.outcome.value, result.message
            )
            outcome = await self._safely(self.audit_log.outcome(intent, result, self.clock()))
            self._reclaimed(step.pool, intent, result)
            done.append(Applied(step.node, step.action.value, result, intent, outcome))
        return tuple(done)

    async def drive(self, snapshot: model.Snapshot, acted: set[NodeName]) -> tuple[Applied, ...]:
        """``progress`` on every node in flight that got no step this tick."""
        done: list[Applied] = []
        for pool in self.pools:
            for view in snapshot.pools[pool.name].nodes:
                if view.name in acted or _phase(view, self.keys) not in _IN_FLIGHT:
                    continue
                if not self._leading():
                    return tuple(done)
                result = await self.actuators[pool.name].progress(view.name)
                log.info("progress %s: %s (%s)", view.name, result.outcome.value, result.message)
                intent = await self._intent_of(view)
                outcome = None
                if intent is not None:
                    outcome = await self._safely(
                        self.audit_log.outcome(intent, result, self.clock())
                    )
                self._reclaimed(pool.name, intent, result)
                done.append(Applied(view.name, "progress", result, intent, outcome))
        return tuple(done)

    async def _intent_of(self, view: NodeView) -> AuditRecord | None:
        decision = view.annotations.get(self.keys.decision)
        if not decision:
            return None
        try:
            found = await self.audit_log.store.get(decision)
        except Exception:
            log.exception("audit store failed reading intent %s", decision)
            return None
        if found is None or found.kind is not audit.Kind.INTENT:
            log.warning("node %s: decision %s is not an intent on record", view.name, decision)
            return None
        return found

    async def _safely(self, write: Awaitable[AuditRecord]) -> AuditRecord | None:
        """An outcome the store did not take is logged: the write it describes is done."""
        try:
            return await write
        except Exception:
            log.exception("audit store failed writing an outcome")
            self.observer.observe_audit_failure("outcome")
            return None

    def _reclaimed(self, pool: PoolName, intent: AuditRecord | None, result: ActionResult) -> None:
        if intent is not None and intent.action == "reclaim" and result.outcome is Outcome.DONE:
            self.observer.observe_reclaim_done(str(pool), intent.time, self.clock())

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
_IN_FLIGHT = (Phase.LENDING, Phase.RECLAIMING)
_LENT_PHASES = (Phase.LENDING, Phase.LENT)


def _phase(view: NodeView, keys: Keys) -> Phase | None:
    state = nodestate.read(view, keys)
    return None if isinstance(state, nodestate.StateError) else state.phase


def _overdue(view: NodeView, keys: Keys, now: datetime) -> bool:
    """A reclaim still open after its deadline (the drain should have been forced by then)."""
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError) or state.phase is not Phase.RECLAIMING:
        return False
    return state.deadline is not None and state.deadline < now


def _floor(when: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + step * ((when - epoch) // step)
