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
   Each pool's demand goes through its ``core.demand`` belief: unknown since the last good
   sample, and an implausible fall held (docs/design/safety-rules.md);
2. decide: each pool's strategy turns its ``PoolView`` into a ``Proposal``, in a thread of its
   own with a time limit. A strategy that raises, answers garbage or overruns is replaced, for
   that pool and tick only, by the safety-only proposal (hold what is lent; the planner's
   safety rules still reclaim): one pool's strategy never stops another pool, nor its own
   pool's safety rules (docs/design/fault-isolation.md);
3. plan: ``planning.plan_pool`` per pool with its policy, pause and freeze; a planner failure
   in one pool is isolated the same way;
4. audit: the tick's records (intents first of all) are committed through ``AuditLog.tick``
   BEFORE anything is written. If the store fails, nothing is lent; the safety reclaims (an
   urgent step: any reclaim not the strategy's own) and the drives of nodes in flight still
   happen, each intent first recorded on its Node (``NodeLedger``), in an Event, on stdout and
   in the log's spool, which the store gets, in order, once it takes writes again
   (docs/design/audit-failure.md);
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

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Protocol, TypeVar

from rebalancer.core import (
    audit,
    clocks,
    demand,
    exposure,
    model,
    nodestate,
    recovery,
    windows,
)
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.concurrency import RECLAIM_CONCURRENCY
from rebalancer.core.model import (
    Action,
    Clock,
    HistoryResult,
    NodeName,
    NodeView,
    PodRules,
    PoolMetrics,
    PoolName,
    Term,
)
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.outcomes import ActionResult, Outcome, WriteOutcome
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.strategy import Strategy
from rebalancer.core.tick import (
    Answer,
    Decision,
    Failure,
    FailureKind,
    PoolRules,
    Stage,
    costs,
    lent_count,
    operator_reclaims,
    phase,
    plan_tick,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


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
    paused: bool = False  # the pool's pause: no lending, safety reclaims still happen
    frozen: bool = False  # the pool's freeze: nothing moves, not even safety reclaims
    wants_history: bool | None = None  # None: as the strategy says (``reads_history``)
    slo: model.Slo | None = None  # the pool's error budget; None: none, fixed margins

    @property
    def lend_spec(self) -> nodestate.LendSpec:
        return self.policy.lend_spec

    @property
    def needs_history(self) -> bool:
        if self.slo is not None:
            return True  # the error budget's cover is judged on it (``core.exposure``)
        if self.wants_history is None:
            # A strategy written before ``reads_history`` existed says nothing: it reads none.
            return bool(getattr(self.strategy, "reads_history", False))
        return self.wants_history

    def selects(self, view: NodeView, keys: Keys) -> bool:
        """Whether the node belongs to the pool: by its labels as they are when it serves.
        Judged once per node value and selector (the view's ``memo``): every tick asks it of
        every node for every pool, and a node's labels change far less often."""
        memo_key = ("selects", self._selector, keys.prefix)
        found = view.memo.get(memo_key)
        if not isinstance(found, bool):
            found = view.memo[memo_key] = self._matches(view, keys)
        return found

    @cached_property
    def _selector(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.node_selector.items()))

    def _matches(self, view: NodeView, keys: Keys) -> bool:
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

    def pending(self, rules: PodRules) -> tuple[model.PendingPod, ...]:
        """The pods waiting for a node that tolerate the lend taints of ``rules``."""
        ...

    def unreadable(self) -> Mapping[str, str]:
        """Objects left out of the views because they could not be read: key -> why."""
        ...


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


class ApiServerClock(Protocol):
    """``adapters.kubeclient.ClockProbe``: the API server's clock against the controller's own.
    The Reconciler's ``clock`` is the one it corrects (``ClockProbe.now``)."""

    async def measure_skew(self) -> clocks.Skew | None: ...


class PrometheusClock(Protocol):
    """``runtime.wiring.PoolMetricsRouter``: the clock of the Prometheus a pool is read from,
    against the controller's own."""

    async def measure_skew(self, pool: PoolName) -> clocks.Skew | None: ...


class NodeActuator(Protocol):
    """``adapters.actuator.Actuator`` (one per pool: lend spec and pod rules are the pool's)."""

    async def lend(self, node: str, decision: str) -> ActionResult: ...

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """With ``uid``, only that incarnation of the node: another one ends ``gone``."""
        ...

    async def progress(
        self, node: str, decision: str | None = None, *, uid: str | None = None
    ) -> ActionResult: ...


class AuditTrail(Protocol):
    """``adapters.audit.AuditLog``: every record is stored before what it describes is done."""

    new_id: audit.NewId

    async def tick(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        """Commit a batch (intents first of all); raises if the store fails."""
        ...

    async def outcome(
        self, intent: AuditRecord, result: ActionResult, now: datetime
    ) -> AuditRecord: ...

    async def supersede(self, intent: AuditRecord, now: datetime, why: str) -> AuditRecord: ...

    async def get(self, record_id: str) -> AuditRecord | None: ...

    async def pending_intents(self) -> tuple[AuditRecord, ...]:
        """Intents with no outcome at all."""
        ...

    async def unfinished_intents(self) -> tuple[AuditRecord, ...]:
        """Intents with no final outcome (none, or only ``in_progress`` ones)."""
        ...

    async def costs(self, pool: str, since: datetime) -> tuple[datetime, ...]:
        """The minutes after ``since`` that lending cost ``pool`` (its ``cost`` records)."""
        ...

    # The spool (``adapters.audit.AuditLog``): what the store has not taken yet.
    spool: list[AuditRecord]
    failing: str | None  # why the store's last write failed; None: it works

    def room(self, count: int = 1) -> bool: ...

    def hold(self, batch: Iterable[AuditRecord]) -> tuple[AuditRecord, ...]:
        """Keep ``batch`` for the store (raises ``SpoolFull`` when there is no room)."""
        ...

    async def flush(self) -> tuple[AuditRecord, ...]:
        """Write the spool; raises if the store still fails. The spooled records taken."""
        ...


class NodeLedger(Protocol):
    """``adapters.ledger.NodeLedger``: records kept on their Nodes while the store fails."""

    async def hold(self, node: str, records: Sequence[AuditRecord], why: str) -> None:
        """Record on the node (and in an Event) before what they describe is done; raises
        if the node cannot carry them."""
        ...

    async def release(self, node: str, ids: Iterable[str]) -> None: ...

    def kept(self, view: NodeView) -> tuple[AuditRecord, ...]:
        """The records the node carries (raises if they cannot be read)."""
        ...


class Leadership(Protocol):
    """``adapters.leadership.LeaderElector``: whether this replica may write, on its clock."""

    @property
    def identity(self) -> str: ...

    @property
    def term(self) -> Term | None: ...

    @property
    def now(self) -> Clock: ...

    def may_write(self, now: datetime) -> bool: ...


class EventRecorder(Protocol):
    """``adapters.events.KubeEvents``: Kubernetes Events on the nodes (``NoEvents``: none)."""

    async def action(self, result: ActionResult, decision: str | None = None) -> None: ...

    async def findings(self, plan: model.Plan) -> None: ...


class AlertSource(Protocol):
    """``runtime.alerts.AlertStore``: the matched Alertmanager alerts that hold a pool now."""

    def firing(self, pool: PoolName, now: datetime) -> tuple[model.FiringAlert, ...]: ...


class NoEvents:
    async def action(self, result: ActionResult, decision: str | None = None) -> None:
        pass

    async def findings(self, plan: model.Plan) -> None:
        pass


class Observer(Protocol):
    """``runtime.telemetry.Telemetry``: the controller's own metrics. Optional."""

    def observe_snapshot(self, snapshot: model.Snapshot) -> None: ...

    def observe_lent(self, lent: Mapping[str, int]) -> None: ...

    def observe_overdue(self, overdue: Mapping[str, int]) -> None: ...

    def observe_plan(self, plan: model.Plan) -> None: ...

    def observe_leader(self, identity: str, leading: bool) -> None: ...

    def observe_audit_failure(self, operation: str) -> None: ...

    def observe_reclaim_done(self, pool: str, started: datetime, serving: datetime) -> None: ...

    def observe_strategy_failure(self, pool: str, strategy: str, kind: str) -> None: ...

    def observe_planner_failure(self, pool: str) -> None: ...

    def observe_safety_only(self, states: Mapping[str, bool]) -> None: ...

    def observe_unreadable(self, counts: Mapping[str, int]) -> None: ...

    def observe_frozen_under_pressure(self, states: Mapping[str, bool]) -> None: ...

    def observe_demand_held(self, states: Mapping[str, bool]) -> None: ...

    def observe_borrowing_cost(self, pool: str) -> None: ...

    def observe_budgets(self, budgets: Mapping[str, model.ErrorBudget]) -> None: ...

    def observe_audit_store(self, failing: bool, spooled: int) -> None: ...

    def observe_spool_overflow(self) -> None: ...
    def observe_clocks(self, measured: Mapping[PoolName, clocks.Clocks]) -> None: ...


class NoObserver:
    """An ``Observer`` that ignores everything; test observers extend it."""

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

    def observe_strategy_failure(self, pool: str, strategy: str, kind: str) -> None:
        pass

    def observe_planner_failure(self, pool: str) -> None:
        pass

    def observe_safety_only(self, states: Mapping[str, bool]) -> None:
        pass

    def observe_unreadable(self, counts: Mapping[str, int]) -> None:
        pass

    def observe_frozen_under_pressure(self, states: Mapping[str, bool]) -> None:
        pass

    def observe_demand_held(self, states: Mapping[str, bool]) -> None:
        pass

    def observe_borrowing_cost(self, pool: str) -> None:
        pass

    def observe_budgets(self, budgets: Mapping[str, model.ErrorBudget]) -> None:
        pass

    def observe_audit_store(self, failing: bool, spooled: int) -> None:
        pass

    def observe_spool_overflow(self) -> None:
        pass

    def observe_clocks(self, measured: Mapping[PoolName, clocks.Clocks]) -> None:
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
    call: Action  # lend, reclaim, progress
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
        return tuple(a for a in self.applied if a.call is not Action.PROGRESS)

    @property
    def progressed(self) -> tuple[Applied, ...]:
        return tuple(a for a in self.applied if a.call is Action.PROGRESS)


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
        audit_log: AuditTrail,
        leadership: Leadership,
        keys: Keys | None = None,
        history: HistorySettings | None = None,
        paused: Callable[[], bool] = lambda: False,
        frozen: Callable[[], bool] = lambda: False,
        dry_run: bool = False,
        observer: Observer | None = None,
        events: EventRecorder | None = None,
        strategy_timeout: timedelta = timedelta(seconds=10),
        reclaim_concurrency: int = RECLAIM_CONCURRENCY,
        lend_concurrency: int = 4,
        alerts: AlertSource | None = None,
        ledger: NodeLedger | None = None,
        apiserver_clock: ApiServerClock | None = None,
        prometheus_clock: PrometheusClock | None = None,
        clock_bound: timedelta = clocks.DEFAULT_BOUND,
    ) -> None:
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        missing = sorted(set(names) - set(actuators))
        if missing:
            raise ValueError(f"no actuator for pool(s) {', '.join(missing)}")
        self.pools = tuple(pools)
        self._rules = {p.name: PoolRules(p.policy, p.paused, p.frozen) for p in pools}
        self.views, self.metrics, self.clock = views, metrics, clock
        self.actuators, self.audit_log, self.leadership = actuators, audit_log, leadership
        self.keys = keys or Keys()
        self.history_settings = history or HistorySettings()
        self.paused, self.frozen, self.dry_run = paused, frozen, dry_run
        self.strategy_timeout = strategy_timeout
        self.reclaim_concurrency = reclaim_concurrency
        self.lend_concurrency = lend_concurrency
        self.observer: Observer = observer or NoObserver()
        self.alerts = alerts  # None: no Alertmanager receiver, no alert holds a pool
        # Where a record goes when the store fails (None: nowhere, so nothing is done then).
        self.ledger = ledger
        self._store_since: datetime | None = None  # the store's failure episode began then
        self._start_unaudited = False  # start-up could not write to the store: tried again
        # The clocks measured each tick (None: not measured, as with in-memory fakes), and the
        # skew past which a pool lends nothing (docs/design/clocks.md).
        self.apiserver_clock, self.prometheus_clock = apiserver_clock, prometheus_clock
        self.clock_bound = clock_bound
        self._clock_problems: dict[PoolName, tuple[str, ...]] = {}
        # Transitions are recorded by the actuators (see wiring.RecordingActuator); the refused
        # overrides are known only here, from the plan.
        self.events: EventRecorder = events or NoEvents()
        self._started: object = _NOT_STARTED  # the leadership term ``start`` last ran for
        # The minutes that cost each pool, within its error budget's window (the last one only
        # for a pool without a budget); restored from the audit log by ``start``.
        self._costs: dict[PoolName, list[datetime]] = {}
        self._histories: dict[PoolName, tuple[datetime, model.DemandHistory]] = {}
        self._jumps: dict[PoolName, exposure.Jumps] = {}  # pools with an slo: their covers
        self._warned: set[tuple[NodeName, PoolName]] = set()  # overlaps logged, per pair
        self._unkept: set[NodeName] = set()  # nodes whose kept records cannot be read, logged
        self._adopted: set[NodeName] = set()  # orphans logged
        self._beliefs: dict[PoolName, demand.Belief] = {}
        self._episodes = _Episodes()
        self._running: dict[PoolName, asyncio.Future[object]] = {}  # strategy calls in threads
        self._unreadable: dict[str, str] = {}  # what was last reported unreadable
        self.last: model.Snapshot | None = None  # the last tick's snapshot (for wake-ups)
        # The last tick's snapshot with what was decided on it (for explain).
        self.last_decided: tuple[model.Snapshot, Decision] | None = None
        # A dry run writes nothing, so it plans the same steps tick after tick: each is
        # audited once, when it enters the plan (``_new_steps``).
        self._would: frozenset[tuple[PoolName, NodeName, Action]] = frozenset()
        self._would_drive: frozenset[NodeName] = frozenset()
        # The reclaims in flight, each with its pool, the UID of the node it drains and its
        # intent: one whose node is no longer seen in flight under that UID (deleted, created
        # again under its name, or out of every pool) is looked at once more (``_vanished``).
        self._draining: dict[NodeName, tuple[PoolConfig, str, str]] = {}
        # The lent nodes of the last leading tick, as seen then: a loan whose node is deleted
        # (and perhaps created again under its name) is ended here (``_replaced_loans``).
        self._loans: dict[NodeName, tuple[PoolConfig, NodeView]] = {}
        # What the last in_progress record of each drain said (intent id, message): a pass that
        # says the same and changed nothing is not recorded again (a drain a finalizer holds
        # would write a record every tick).
        self._said: dict[NodeName, tuple[str, str]] = {}

    # -----------------------------------------------------------------------------------------
    # Start-up

    async def start(self) -> tuple[ActionResult, ...]:
        """Before the first tick (informer synced, leading): say what the intents a previous run
        left open came to, and end every transition it left in flight, audited like any step.

        Each open intent is judged against its node (``core.recovery``): ``applied`` when its
        effect is there, ``superseded`` when it never reached the node, ``interrupted`` when the
        node is caught mid-transition under it. An interrupted one, and a node in flight whose
        decision names no record at all, gets a recovery intent (origin ``recovery``) written
        with the verdicts, before any write; its actuator pass then takes the node over (the
        node's ``decision`` becomes the recovery's id, so its Events and writes name it) and
        its outcome follows. A reclaim still draining goes on under that intent next tick.
        Each pool's actuator only touches its own nodes, so a pool's pod rules never judge
        another pool's pods.
        """
        now = self.clock()
        members = {
            view.name: (pool, view) for pool, views in self._members().items() for view in views
        }
        try:
            # Records a run kept on its nodes while the store failed come first: the intents
            # judged below may be among them.
            await self._catch_up([view for _, view in members.values()], now)
            records, takeovers = await self._recovery_records(now, members)
            await self.audit_log.tick(records)
            for config in self.pools:
                since = now - (config.slo.window if config.slo else MINUTE)
                self._costs[config.name] = list(await self.audit_log.costs(config.name, since))
        except Exception:
            self.observer.observe_audit_failure("recover")
            raise
        self._started = self._term_key()
        closed = sum(1 for r in records if r.kind is audit.Kind.OUTCOME)
        if records:
            log.info(
                "start-up: %d open intent(s) closed, %d transition(s) taken over",
                closed,
                len(takeovers),
            )
        results: list[ActionResult] = []
        for pool, name, intent in takeovers:
            result = await self.actuators[pool].progress(name, decision=intent.id)
            log.info("recover %s: %s (%s)", name, result.outcome.value, result.message)
            await self._safely(self.audit_log.outcome(intent, result, self.clock()))
            self._reclaimed(pool, intent, result)
            results.append(result)
        return tuple(results)

    async def _recovery_records(
        self, now: datetime, members: Mapping[NodeName, tuple[PoolName, NodeView]]
    ) -> tuple[list[AuditRecord], list[tuple[PoolName, NodeName, AuditRecord]]]:
        """The verdicts on the open intents, and the recovery intents, in one batch."""
        by_name = {p.name: p for p in self.pools}
        records: list[AuditRecord] = []
        takeovers: list[tuple[PoolName, NodeName, AuditRecord]] = []

        def take_over(pool: PoolName, view: NodeView, recovers: str | None, why: str) -> str:
            action = recovery.recovery_action(view, self.keys)
            intent = audit.recovery_intent(
                self._context(by_name[pool]),
                self.audit_log.new_id,
                now,
                str(pool),
                view,
                action,
                recovers,
                why,
            )
            records.append(intent)
            takeovers.append((pool, view.name, intent))
            return intent.id

        trail = self.audit_log
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
                recovery_id = take_over(member[0], member[1], intent.id, why)
                message += f"; recovery {recovery_id} takes it over"
                detail["recovered_by"] = recovery_id
            ctx = self._context(by_name.get(PoolName(intent.pool)))
            records.append(
                audit.outcome_record(
                    intent,
                    self.audit_log.new_id,
                    now,
                    verdict.result,
                    message,
                    detail=detail,
                    ctx=ctx,
                )
            )
        # Every other node in flight is taken over too, though its intent is closed (a lend
        # that ended in a conflict, leaving the node lending): the run that moved it is gone.
        taken = {name for _, name, _ in takeovers}
        for name, (pool, view) in members.items():
            if name in taken or phase(view, self.keys) not in _IN_FLIGHT:
                continue
            decision = view.annotations.get(self.keys.decision)
            known = decision is not None and await trail.get(decision) is not None
            what = "an intent with its outcome on record" if known else "no intent on record"
            take_over(pool, view, decision, f"node in flight under {decision!r}, {what}")
        return records, takeovers

    async def _count_costs(self, snapshot: model.Snapshot) -> None:
        """Count each minute in which a pool's requests queue beyond its limit while nodes are
        away on loan (``core.tick.costs``): what lending cost, once per minute however many ticks
        see it, as a metric and a ``cost`` record. Only the leader counts, so replicas never
        count a minute twice, and a new leader (or this one restarted) takes up the count from
        the audit log (``start``). A record the store fails to take is logged and the minute
        still counts: the measurement is true, and the tick's intents meet the same store."""
        minute = snapshot.now.replace(second=0, microsecond=0)
        records = []
        for pool in self.pools:
            seen = snapshot.pools.get(pool.name)
            spent = self._costs.setdefault(pool.name, [])
            if seen is None or minute in spent:
                continue
            away = costs(seen, pool.policy, self.keys, snapshot.now)
            if not away:
                continue
            keep = pool.slo.window if pool.slo else MINUTE
            spent[:] = [m for m in spent if m > minute - keep] + [minute]
            self.observer.observe_borrowing_cost(str(pool.name))
            budget = pool.slo.budget(spent, minute) if pool.slo else None
            records.append(
                audit.cost_record(
                    self._context(pool),
                    self.audit_log.new_id,
                    minute,
                    seen,
                    str(pool.name),
                    pool.policy,
                    away,
                    budget,
                )
            )
        if not records:
            return
        try:
            await self.audit_log.tick(records)
        except Exception:
            log.exception("audit store failed; %d cost minute(s) not recorded", len(records))
            self.observer.observe_audit_failure("cost")

    # -----------------------------------------------------------------------------------------
    # One tick

    async def tick(self) -> TickReport:
        if self._started != self._term_key() and self._leading():
            # First tick of this stretch of leadership: what a previous leader (or this
            # process before a restart) left unfinished is closed and ended first, then the
            # tick observes and plans from what start-up left.
            try:
                await self.start()
                self._start_unaudited = False
            except Exception as exc:
                if self.ledger is None or self.audit_log.failing is None:
                    raise
                # The store fails: the safety reclaims below must not wait for it. Start-up is
                # tried again next tick; the nodes in flight are driven by this one.
                self._store_failed(exc, self.clock())
                self._start_unaudited = True
        # The clocks first: the tick's now is the API server's, corrected by what they say.
        measured = await self._measure_clocks()
        now = self.clock()
        seen = await self.observe(now, measured)
        self.last = seen.snapshot
        decision = await self.decide(seen.snapshot)
        self.last_decided = (seen.snapshot, decision)
        proposals, plan = decision.proposals, decision.plan
        report = TickReport(now, seen.snapshot, proposals, plan, leading=False)
        for line in (p.summary for p in plan.pools.values()):
            log.info("%s: %s", "dry run, would plan" if self.dry_run else "plan", line)
        leading = self._leading()
        self.observer.observe_leader(self.leadership.identity, leading)
        self._observe_health(seen.snapshot, plan)
        pools = seen.snapshot.pools.items()
        self.observer.observe_lent({str(name): lent_count(pool, self.keys) for name, pool in pools})
        self.observer.observe_overdue(
            {
                str(name): sum(1 for v in pool.nodes if _overdue(v, self.keys, now))
                for name, pool in pools
            }
        )
        if not leading:
            log.info("not leading: %d step(s) planned, none carried out", len(plan.steps))
            return report
        if self._started != self._term_key() and not self._start_unaudited:
            # Leadership came between the start-up check and now: start up on the next tick.
            log.info("leading since this tick began: start-up runs first next tick")
            return report
        self.observer.observe_plan(plan)
        # The strategy and the planner saw the budget as of the last tick (the snapshot's): this
        # minute counts from the next. The gauges show it counted.
        await self._count_costs(seen.snapshot)
        self.observer.observe_budgets(
            {
                str(p.name): p.slo.budget(self._costs.get(p.name, ()), now)
                for p in self.pools
                if p.slo is not None
            }
        )
        acting = self._new_steps(plan) if self.dry_run else plan
        if not self.dry_run:
            await self._catch_up(self._all_views(seen.snapshot), now)
        tick, episodes = self._tick_records(seen.snapshot, proposals, acting)
        try:
            written = await self.audit_log.tick(tick.records)
        except Exception as exc:  # no intent on record in the store: only what keeps inference
            return await self._without_store(report, seen.snapshot, acting, tick, exc)
        self._episodes.announced(episodes)
        self._store_works(now)
        if self.dry_run:
            self._would = frozenset((s.pool, s.node, s.action) for s in plan.steps)
        await self.events.findings(plan)
        applied = await self.apply(acting, tick)
        progressed = await self.drive(seen.snapshot, applied)
        return replace(report, leading=True, audited=written, applied=applied + progressed)

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
            now = self.clock()
            for config in self.pools:
                if config.slo is not None and config.name not in self._costs:
                    since = now - config.slo.window
                    self._costs[config.name] = list(await self.audit_log.costs(config.name, since))
        measured = await self._measure_clocks()
        seen = await self.observe(self.clock(), measured)
        return seen.snapshot, await self.decide(seen.snapshot)

    def pool_rules(self, name: PoolName) -> PoolRules:
        return self._rules[name]

    # -- observe ------------------------------------------------------------------------------

    def _members(self) -> dict[PoolName, tuple[NodeView, ...]]:
        """Each pool's nodes, orphans adopted (``_membership``)."""
        return self._membership().members

    def _membership(self) -> _Membership:
        """Each pool's nodes. A node two pools select goes to the first, and is reported to it
        (``PoolSnapshot.overlaps``: a finding and an Event on the node, once per pair of
        pools). A node no pool selects that carries our keys (GPU Feature Discovery relabelled
        a lent node out of every selector) is an orphan: the pool ``adopter`` names takes it
        as a member to finish it (``PoolSnapshot.orphans``), and it is logged once."""
        found = _Membership()
        taken: dict[NodeName, PoolName] = {}
        every: dict[PoolName, tuple[NodeView, ...]] = {}
        for pool in self.pools:
            mine = []
            every[pool.name] = views = self.views.node_views(pool.rules)
            for view in views:
                if not pool.selects(view, self.keys):
                    continue
                first = taken.setdefault(view.name, pool.name)
                if first != pool.name:
                    found.overlap(first, view.name, pool.name)
                    if (view.name, pool.name) not in self._warned:
                        self._warned.add((view.name, pool.name))
                        log.warning(
                            "node %s is selected by pools %s and %s; only %s drives it",
                            view.name,
                            first,
                            pool.name,
                            first,
                        )
                    continue
                mine.append(view)
            found.members[pool.name] = tuple(mine)
        for pool, view in self._orphans(every, taken):
            found.adopt(pool.name, view)
        return found

    def _orphans(
        self,
        every: Mapping[PoolName, tuple[NodeView, ...]],
        taken: Mapping[NodeName, PoolName],
    ) -> list[tuple[PoolConfig, NodeView]]:
        """The nodes no pool selects that carry our keys, each with the pool that adopts it
        (as that pool's pod rules see the node)."""
        if not self.pools:
            return []
        out = []
        for view in every[self.pools[0].name]:
            if view.name in taken:
                continue
            pool = adopter(self.pools, view, self.keys)
            if pool is None:
                continue
            if view.name not in self._adopted:
                self._adopted.add(view.name)
                log.warning(
                    "node %s carries the controller's keys but no pool selects it: pool %s "
                    "takes it back",
                    view.name,
                    pool.name,
                )
            adopted = next(v for v in every[pool.name] if v.name == view.name)
            out.append((pool, adopted))
        return out

    async def observe(
        self, now: datetime, measured: Mapping[PoolName, clocks.Clocks] | None = None
    ) -> Observation:
        """The snapshot at ``now``; ``measured``: the clocks, measured before ``now`` was read
        (so that ``now`` is corrected by the same readings); None: measured here."""
        pools: dict[PoolName, model.PoolSnapshot] = {}
        read: dict[PoolName, PoolMetrics] = {}
        membership = self._membership()
        members = membership.members
        self._report_unreadable()
        if measured is None:
            measured = await self._measure_clocks()
        for pool in self.pools:
            views = members[pool.name]
            names = [v.name for v in views]
            # Read at Prometheus' now, not this controller's: a clock behind would be answered
            # with samples as old as it is behind, one ahead with none at all.
            seen_clocks = measured[pool.name]
            metrics = await self._read(pool.name, names, clocks.prometheus_now(seen_clocks, now))
            read[pool.name] = metrics
            reading = self._believe(pool, metrics.demand, now)
            history = await self._history(pool, names, now) if pool.needs_history else None
            pools[pool.name] = model.PoolSnapshot(
                nodes=views,
                demand=reading.demand,
                queue=metrics.queue,
                history=history,
                demand_known=reading.known,
                unknown_since=reading.unknown_since,
                held=reading.held,
                budget=pool.slo.budget(self._costs.get(pool.name, ()), now) if pool.slo else None,
                cover=self._cover(pool, history),
                takers=self.views.pending(pool.rules) if pool.policy.lend_only_to_takers else (),
                alerts=self.alerts.firing(pool.name, now) if self.alerts is not None else (),
                orphans=membership.orphans.get(pool.name, frozenset()),
                overlaps=membership.overlaps.get(pool.name, {}),
                clocks=seen_clocks,
            )
        self.observer.observe_clocks(measured)
        snapshot = model.Snapshot(now=now, pools=pools, paused=self.paused(), frozen=self.frozen())
        return Observation(snapshot, read)

    async def _measure_clocks(self) -> dict[PoolName, clocks.Clocks]:
        """Each pool's clocks this tick: the API server's skew (which the tick's ``now`` is
        already corrected by) and that of the pool's Prometheus. A clock that should be
        measured and has no reading lately is ``unmeasured``: the pool lends nothing."""
        unmeasured: set[clocks.Against] = set()
        skews: list[clocks.Skew] = []
        if self.apiserver_clock is not None:
            api = await self._safely_measure(self.apiserver_clock.measure_skew())
            skews += [api] if api is not None else []
            unmeasured |= {clocks.Against.APISERVER} if api is None else set()
        api_skew = skews[0] if skews else None
        correction = api_skew.offset if api_skew is not None and api_skew.known else timedelta(0)
        out: dict[PoolName, clocks.Clocks] = {}
        for pool in self.pools:
            mine, missing = list(skews), set(unmeasured)
            if self.prometheus_clock is not None:
                prom = await self._safely_measure(self.prometheus_clock.measure_skew(pool.name))
                mine += [prom] if prom is not None else []
                missing |= {clocks.Against.PROMETHEUS} if prom is None else set()
            out[pool.name] = clocks.Clocks(
                tuple(mine), frozenset(missing), self.clock_bound, correction
            )
            problems = out[pool.name].problems()
            if problems != self._clock_problems.get(pool.name, ()):  # logged once a change
                if problems:
                    log.warning("pool %s: no lending: %s", pool.name, "; ".join(problems))
                else:
                    log.info("pool %s: the clocks can be trusted again", pool.name)
            self._clock_problems[pool.name] = problems
        return out

    @staticmethod
    async def _safely_measure(measuring: Awaitable[clocks.Skew | None]) -> clocks.Skew | None:
        try:
            return await measuring
        except Exception:  # not measured is what it means: the pool lends nothing
            log.exception("a clock could not be measured")
            return None

    def _believe(
        self, pool: PoolConfig, seen: model.Sample | None, now: datetime
    ) -> demand.Reading:
        before = self._beliefs.get(pool.name) or demand.start(now)
        belief, reading = demand.judge(before, seen, now, pool.policy.drop_rule)
        self._beliefs[pool.name] = belief
        if reading.held is not None and before.held is None:
            held = reading.held
            log.warning(
                "pool %s: demand fell from %.4g to %.4g %s faster than traffic falls; held at "
                "%.4g for up to %s",
                pool.name,
                held.level.value,
                held.seen.value,
                pool.policy.unit.symbol,
                held.level.value,
                pool.policy.drop_hold,
            )
        elif before.held is not None and reading.held is None:
            log.info("pool %s: demand fall no longer held", pool.name)
        return reading

    def _report_unreadable(self) -> None:
        """Objects the informer could not read are left out of every view (their node is left
        alone); each is logged once per reason, and counted in ``/metrics`` every tick."""
        found = dict(self.views.unreadable())
        for key, why in found.items():
            if self._unreadable.get(key) != why:
                log.error("%s cannot be read and is left alone: %s", key, why)
        for key in self._unreadable.keys() - found.keys():
            log.info("%s can be read again", key)
        self._unreadable = found
        counts = {"node": 0, "pod": 0}
        for key in found:
            kind = key.split("/", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
        self.observer.observe_unreadable(counts)

    async def _read(self, pool: PoolName, nodes: Sequence[NodeName], now: datetime) -> PoolMetrics:
        try:
            found = await self.metrics.read(pool, nodes, now)
        except Exception:  # unknown is never zero: no sample, the planner fails toward inference
            log.exception("pool %s: metrics read failed", pool)
            return PoolMetrics(pool=pool, demand=None, queue=None)
        for error in found.errors:
            log.warning("%s", error)
        return found

    def _cover(self, pool: PoolConfig, history: model.DemandHistory | None) -> model.Cover | None:
        """What the pool's history covers, for its error budget: judged incrementally, one
        ``Jumps`` per pool, as each history read continues the last."""
        if pool.slo is None or history is None:
            return None
        jumps = self._jumps.get(pool.name)
        if jumps is None:
            jumps = self._jumps[pool.name] = exposure.Jumps(exposure.shape_of(pool.policy))
        return jumps.cover(history)

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

    async def decide(self, snapshot: model.Snapshot) -> Decision:
        """Each pool's strategy answers, then ``core.tick.plan_tick`` plans every pool from the
        answers (a failed or invalid answer, or a failed planner, makes that pool's plan the
        safety-only one); each failure episode is logged and counted here."""
        answers: dict[PoolName, Answer] = {}
        for pool in self.pools:
            seen = snapshot.pools[pool.name]
            lent = lent_count(seen, self.keys, pool.lend_spec.add_taints)
            view = pool.policy.view(pool.name, snapshot.now, seen, lent)
            answers[pool.name] = await self._propose(pool, view)
        decision = plan_tick(snapshot, answers, self._rules, self.keys)
        for pool in self.pools:
            for stage in Stage:
                failure = decision.failures.get((pool.name, stage))
                if failure is None:
                    self._episodes.fine(pool.name, stage)
                else:
                    self._failed(pool, stage, failure, snapshot.now)
        return decision

    def _failed(self, pool: PoolConfig, stage: Stage, failure: Failure, now: datetime) -> None:
        new = self._episodes.failed(pool.name, stage, failure, now)
        if stage is Stage.STRATEGY:
            self.observer.observe_strategy_failure(pool.name, pool.strategy_name, failure.kind)
            if new:
                log.error("pool %s: strategy %s failed: %s", pool.name, pool.strategy_name, failure)
            else:
                log.warning("pool %s: strategy still failing: %s", pool.name, failure.message)
        else:
            self.observer.observe_planner_failure(pool.name)
            if new:
                log.error("pool %s: the planner failed: %s", pool.name, failure)

    async def _propose(self, pool: PoolConfig, view: model.PoolView) -> Answer:
        """The strategy's answer, run in a thread of its own (a strategy is plain code that
        may loop or block), within ``strategy_timeout``; ``core.tick`` checks it."""
        running = self._running.get(pool.name)
        limit = self.strategy_timeout
        timeout = FailureKind.TIMEOUT
        if running is not None and not running.done():
            return Failure(timeout, f"a call is still running, past {limit}")
        call = _in_thread(pool.strategy.decide, view, f"strategy-{pool.name}")
        self._running[pool.name] = call
        try:
            return await asyncio.wait_for(asyncio.shield(call), limit.total_seconds())
        except TimeoutError:
            return Failure(timeout, f"no answer within {limit}")
        except Exception as exc:
            log.debug("pool %s: the strategy raised", pool.name, exc_info=True)
            return Failure.raised(exc)

    def _observe_health(self, snapshot: model.Snapshot, plan: model.Plan) -> None:
        """The gauges that say a pool is not planned as usual."""
        self.observer.observe_snapshot(snapshot)
        names = [str(p.name) for p in self.pools]
        failing = self._episodes.failing()
        self.observer.observe_safety_only({n: PoolName(n) in failing for n in names})
        self.observer.observe_demand_held(
            {str(n): p.held is not None for n, p in snapshot.pools.items()}
        )
        self.observer.observe_frozen_under_pressure(
            {str(n): _frozen_under_pressure(p) for n, p in plan.pools.items()}
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
        tick, episodes = self._tick_records(snapshot, proposals, plan)
        written = await self.audit_log.tick(tick.records)
        self._episodes.announced(episodes)
        return tick, written

    def _tick_records(
        self,
        snapshot: model.Snapshot,
        proposals: Mapping[PoolName, model.Proposal],
        plan: model.Plan,
    ) -> tuple[audit.Tick, list[Announcement]]:
        by_name = {p.name: p for p in self.pools}
        episodes = self._episodes.to_announce()
        new_id = self.audit_log.new_id
        announced = [
            _episode_record(self._context(by_name[n]), new_id, plan.now, n, stage, e, ended)
            for n, stage, e, ended in episodes
        ]
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
        exc: Exception,
    ) -> TickReport:
        """The tick's intents were not committed. Nothing is lent; each safety reclaim is
        carried out once its intent is kept on its node and in the spool (``keep``), and the
        nodes in flight are driven on; their outcomes wait in the spool."""
        self._store_failed(exc, snapshot.now)
        error = f"audit store failed: {exc}"
        if self.dry_run or self.ledger is None:
            return replace(report, leading=True, error=error)
        kept = [s for s in plan.steps if keeps_inference(s)]
        kept = [s for s in kept if await self.keep(s.node, tick.intent_for(s))]
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
        applied = await self.apply(only, tick)
        progressed = await self.drive(snapshot, applied)
        self.observer.observe_audit_store(True, len(self.audit_log.spool))
        return replace(report, leading=True, error=error, applied=applied + progressed)

    async def keep(self, node: NodeName | str, intent: AuditRecord) -> bool:
        """Record ``intent`` where a record can still be written, before what it describes is
        done: on its node (with an Event), then in the spool (and its JSON line on stdout).
        False when it could not be: then it must not be done."""
        if self.ledger is None:
            return False
        if not self.audit_log.room(1):
            self.observer.observe_spool_overflow()
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

    def _store_failed(self, exc: BaseException, now: datetime) -> None:
        """Count a failed write; the traceback once per episode, a line on later ticks."""
        self.observer.observe_audit_failure("tick")
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
        self.observer.observe_audit_store(True, len(self.audit_log.spool))

    def _store_works(self, now: datetime) -> None:
        if self._store_since is not None:
            log.info(
                "audit store takes writes again after %ss",
                int((now - self._store_since).total_seconds()),
            )
            self._store_since = None
        self.observer.observe_audit_store(False, len(self.audit_log.spool))

    async def _catch_up(self, views: Iterable[NodeView], now: datetime) -> None:
        """Bring the store up to date before the tick writes: the spool first, then every
        record a node carries that the store does not have (kept there by this process, by a
        run that died before its spool was written, or by ``rebalancer reclaim``), oldest
        first; each node then lets go of what the store has. Raises nothing: a store still
        failing is found by the tick's own write."""
        if self.ledger is None:
            return
        on_nodes: dict[str, tuple[AuditRecord, ...]] = {}
        for view in views:
            try:
                found = self.ledger.kept(view)
            except Exception as exc:
                if view.name not in self._unkept:
                    self._unkept.add(view.name)
                    log.error("node %s: %s; left as it is", view.name, exc)
                continue
            if found:
                on_nodes[str(view.name)] = found
        if not on_nodes and not self.audit_log.spool:
            return
        try:
            await self.audit_log.flush()
            spooled = {r.id for r in self.audit_log.spool}
            missing = []
            for record in sorted(
                (r for rs in on_nodes.values() for r in rs), key=lambda r: (r.time, r.id)
            ):
                if record.id not in spooled and await self.audit_log.get(record.id) is None:
                    missing.append(record)
            if missing:
                self.audit_log.hold(missing)
                await self.audit_log.flush()
                log.info("%d record(s) kept on nodes written to the audit store", len(missing))
        except Exception:
            return  # the store still fails: the nodes keep their records
        self._store_works(now)
        for node, found in on_nodes.items():
            try:
                await self.ledger.release(node, [r.id for r in found])
            except Exception as exc:  # harmless: the next tick finds them in the store
                log.warning("node %s: records kept on it not removed yet: %s", node, exc)

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
        ``carry_out``, as a tick's are."""
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

    async def apply(self, plan: model.Plan, tick: audit.Tick) -> tuple[Applied, ...]:
        """The tick's steps: reclaims first, ``reclaim_concurrency`` at a time and every
        deadline counted from the same start, so each node of a wave gets its serving taints
        back without waiting for the others' API calls (and its drain begins); then lends,
        ``lend_concurrency`` at a time (a lend is never urgent, so fewer at once: a wave of
        them should not crowd the API server). Each node's own writes stay in order: one step
        is one call. A step that raises cancels the others in flight and ends the tick, as a
        crash would; every intent was committed before the first write."""
        started = self.clock()

        def wave(action: model.Action) -> list[model.Step]:
            return [s for s in plan.steps if s.action is action]

        def each(step: model.Step) -> Awaitable[Applied]:
            return self.carry_out(step, tick, started)

        done = await self._together(wave(Action.RECLAIM), each, self.reclaim_concurrency)
        done += await self._together(wave(Action.LEND), each, self.lend_concurrency)
        return tuple(done)

    async def carry_out(self, step: model.Step, tick: audit.Tick, started: datetime) -> Applied:
        """One step of ``tick``: the actuator's call (the intent's id as the node's decision,
        a reclaim's deadline counted from ``started``), then its outcome record."""
        intent = tick.intent_for(step)
        if not self._leading():
            why = "leadership lost before the step was carried out"
            outcome = await self._safely(self.audit_log.supersede(intent, self.clock(), why))
            return Applied(step.node, step.action, None, intent, outcome)
        actuator = self.actuators[step.pool]
        if step.action is model.Action.LEND:
            result = await actuator.lend(step.node, intent.id)
        else:
            pool = next(p for p in self.pools if p.name == step.pool)
            deadline = started + pool.policy.reclaim_deadline
            uid = _node_uid(intent)
            result = await actuator.reclaim(step.node, intent.id, deadline, uid=uid)
            if result.outcome is Outcome.IN_PROGRESS and uid:
                self._draining[step.node] = (pool, uid, intent.id)
        log.info(
            "%s %s: %s (%s)", step.action.value, step.node, result.outcome.value, result.message
        )
        outcome = await self._safely(self.audit_log.outcome(intent, result, self.clock()))
        self._remember(step.node, intent, result, outcome)
        self._reclaimed(step.pool, intent, result)
        return Applied(step.node, step.action, result, intent, outcome)

    async def drive(
        self, snapshot: model.Snapshot, applied: Sequence[Applied]
    ) -> tuple[Applied, ...]:
        """``progress`` on every node in flight that got no step this tick (``applied``), the
        drains of a wave together (``reclaim_concurrency`` at a time), as the reclaims that
        began them; then the end of every loan whose node was replaced."""
        acted = {a.node for a in applied}
        in_flight = [
            (pool, view)
            for pool in self.pools
            for view in snapshot.pools[pool.name].nodes
            if view.name not in acted and phase(view, self.keys) in _IN_FLIGHT
        ]
        if self.dry_run:
            # A node in flight was left so by a run that writes: a dry run neither drives it
            # on nor closes the intent it answers to. Each is said once.
            names = frozenset(view.name for _, view in in_flight)
            for pool, view in in_flight:
                if view.name not in self._would_drive:
                    state = phase(view, self.keys)
                    log.warning(
                        "dry run: node %s of pool %s is %s; a run that writes would drive it on",
                        view.name,
                        pool.name,
                        state.value if state else "unreadable",
                    )
            self._would_drive = names
            return ()

        async def one(item: tuple[PoolConfig, NodeView]) -> Applied | None:
            pool, view = item
            if not self._leading():
                return None
            if phase(view, self.keys) is Phase.LENDING:
                return await self._roll_back(pool, view, snapshot.now)
            decision = view.annotations.get(self.keys.decision)
            progress = self.actuators[pool.name].progress
            result = await progress(view.name, decision, uid=view.uid or None)
            log.info("progress %s: %s (%s)", view.name, result.outcome.value, result.message)
            intent = await self._intent_of(view)
            return await self._passed(pool, view.name, intent, result)

        seen = {v.name: v for p in self.pools for v in snapshot.pools[p.name].nodes}
        vanished = self._vanished(seen, {v.name for _, v in in_flight} | acted)
        self._draining = {
            **{name: d for name, d in self._draining.items() if name in acted},  # this tick's
            **{
                view.name: (pool, view.uid, view.annotations.get(self.keys.decision, ""))
                for pool, view in in_flight
                if view.uid and phase(view, self.keys) is Phase.RECLAIMING
            },
        }
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
            if view.uid and (phase(view, self.keys) is Phase.LENT or view.name in lent_now)
        }
        done = await self._together(in_flight, one, self.reclaim_concurrency)
        done += await self._together(vanished, self._drive_vanished, self.reclaim_concurrency)
        for pool, view in ended:
            done.append(await self._end_replaced_loan(pool, view, snapshot.now))
        return tuple(a for a in done if a is not None)

    async def _end_replaced_loan(
        self, pool: PoolConfig, lent: NodeView, now: datetime
    ) -> Applied | None:
        """A lent node that was deleted, and perhaps created again under its name, is not
        lent any more, and nothing in its snapshot says so: the new node is serving, and the
        pods the loan took are still bound to the name. The loan is ended under an intent of
        its own (a reclaim for the lent node's UID, which finds it gone) and the pods bound to
        the earlier node are deleted, as the pod garbage collector would have."""
        if not self._leading():
            return None
        decision = lent.annotations.get(self.keys.decision)
        why = (
            f"node {lent.name} (uid {lent.uid}) was lent under {decision} and has been deleted: "
            "its loan ends, and the pods bound to it are removed"
        )
        intent = audit.recovery_intent(
            self._context(pool),
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
        except Exception as exc:  # the node is gone: nothing waits on it; tried next tick
            self._store_failed(exc, now)
            self._loans.setdefault(lent.name, (pool, lent))
            return None
        deadline = now + pool.policy.reclaim_deadline
        result = await self.actuators[pool.name].reclaim(
            lent.name, intent.id, deadline, uid=lent.uid
        )
        log.info("end loan %s: %s (%s)", lent.name, result.outcome.value, result.message)
        outcome = await self._safely(self.audit_log.outcome(intent, result, self.clock()))
        return Applied(lent.name, Action.RECLAIM, result, intent, outcome)

    def _vanished(
        self, seen: Mapping[NodeName, NodeView], looked_at: set[NodeName]
    ) -> list[tuple[NodeName, tuple[PoolConfig, str, str]]]:
        """The drains of the last pass whose node is not seen in flight under the same UID:
        deleted, created again under its name, or out of every pool's selector."""
        return [
            (name, drain)
            for name, drain in self._draining.items()
            if name not in looked_at and (name not in seen or seen[name].uid != drain[1])
        ]

    async def _drive_vanished(
        self, item: tuple[NodeName, tuple[PoolConfig, str, str]]
    ) -> Applied | None:
        """One pass over a drain whose node vanished from the pools: for its own UID only, so
        a node that was replaced ends ``gone`` at once (a new node under the name is not in
        flight, and nothing else would close the intent), and one that is out of every pool
        but still there is driven on."""
        name, (pool, uid, decision) = item
        if not self._leading():
            return None
        result = await self.actuators[pool.name].progress(name, decision or None, uid=uid)
        log.info("progress %s: %s (%s)", name, result.outcome.value, result.message)
        intent = None
        if decision:
            with contextlib.suppress(Exception):  # a store failure: the outcome is logged
                intent = await self.audit_log.get(decision)
        if intent is not None and intent.kind is not audit.Kind.INTENT:
            intent = None
        if result.outcome is Outcome.IN_PROGRESS:
            self._draining[name] = (pool, uid, decision)
        return await self._passed(pool, name, intent, result)

    async def _passed(
        self, pool: PoolConfig, name: NodeName, intent: AuditRecord | None, result: ActionResult
    ) -> Applied:
        """The outcome record of one pass over a node in flight, unless it says only what the
        last one said."""
        outcome = None
        if intent is not None and self._news(name, intent, result):
            outcome = await self._safely(self.audit_log.outcome(intent, result, self.clock()))
            self._remember(name, intent, result, outcome)
        self._reclaimed(pool.name, intent, result)
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
        self, items: Sequence[T], work: Callable[[T], Awaitable[R]], limit: int
    ) -> list[R]:
        """``work`` on every item, ``limit`` at a time, results in item order. One that raises
        cancels the others in flight and is raised, as a crash would end them."""
        gate = asyncio.Semaphore(limit)

        async def gated(item: T) -> R:
            async with gate:
                return await work(item)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(gated(item)) for item in items]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _roll_back(self, pool: PoolConfig, view: NodeView, now: datetime) -> Applied:
        """A lend left unfinished (its call ended in a conflict or a failure, and its intent is
        closed with that) is rolled back under an intent of its own, like a restart's."""
        decision = view.annotations.get(self.keys.decision)
        why = f"lend {decision} left the node lending: rolling it back"
        intent = audit.recovery_intent(
            self._context(pool),
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
        except Exception as exc:  # a rollback keeps inference: recorded on the node instead
            self._store_failed(exc, now)
            if not await self.keep(view.name, intent):
                log.warning(
                    "node %s stays lending this tick: its rollback is not recorded", view.name
                )
                return Applied(view.name, Action.PROGRESS, None, None, None)
        result = await self.actuators[pool.name].progress(view.name, intent.id)
        log.info("roll back %s: %s (%s)", view.name, result.outcome.value, result.message)
        outcome = await self._safely(self.audit_log.outcome(intent, result, self.clock()))
        return Applied(view.name, Action.PROGRESS, result, intent, outcome)

    async def _intent_of(self, view: NodeView) -> AuditRecord | None:
        decision = view.annotations.get(self.keys.decision)
        if not decision:
            return None
        try:
            found = await self.audit_log.get(decision)
        except Exception:
            log.exception("audit store failed reading intent %s", decision)
            return None
        if found is None or found.kind is not audit.Kind.INTENT:
            log.warning("node %s: decision %s is not an intent on record", view.name, decision)
            return None
        return found

    async def _safely(self, write: Awaitable[AuditRecord]) -> AuditRecord | None:
        """An outcome the store did not take waits in the spool (``AuditLog.outcome``); one the
        spool has no room for is logged: the write it describes is done."""
        try:
            written = await write
        except Exception:
            log.exception("audit store failed writing an outcome, and the spool is full")
            self.observer.observe_audit_failure("outcome")
            self.observer.observe_spool_overflow()
            return None
        if self.audit_log.failing is not None:
            self.observer.observe_audit_failure("outcome")
        return written

    def _reclaimed(self, pool: PoolName, intent: AuditRecord | None, result: ActionResult) -> None:
        if (
            intent is not None
            and intent.action is Action.RECLAIM
            and result.outcome is Outcome.APPLIED
        ):
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


@dataclass
class _Membership:
    """Which pool drives each node, as ``Reconciler._membership`` found it."""

    members: dict[PoolName, tuple[NodeView, ...]] = field(default_factory=dict)
    orphans: dict[PoolName, frozenset[NodeName]] = field(default_factory=dict)
    overlaps: dict[PoolName, dict[NodeName, tuple[PoolName, ...]]] = field(default_factory=dict)

    def overlap(self, first: PoolName, node: NodeName, other: PoolName) -> None:
        seen = self.overlaps.setdefault(first, {})
        seen[node] = (*seen.get(node, ()), other)

    def adopt(self, pool: PoolName, view: NodeView) -> None:
        self.members[pool] = (*self.members.get(pool, ()), view)
        self.orphans[pool] = self.orphans.get(pool, frozenset()) | {view.name}


def adopter(pools: Sequence[PoolConfig], view: NodeView, keys: Keys) -> PoolConfig | None:
    """The pool that finishes a node no pool selects, or None when the node carries none of
    our keys (state label, original, a lent taint): the first pool whose every lent taint the
    node carries (its own lend, most likely), else the first configured pool. A readable
    original restores the node whatever pool finishes it; the pool's pod rules say which pods
    on it are borrowed, and its specification what it serves with when the original cannot
    be read (docs/design/other-writers.md)."""
    lent = tuple(t for p in pools for t in p.lend_spec.add_taints)
    if not pools or not nodestate.carries_ours(view, keys, lent):
        return None
    carried = {(t.key, t.value, t.effect) for t in view.taints}
    for pool in pools:
        wanted = pool.lend_spec.add_taints
        if wanted and all((t.key, t.value, t.effect) in carried for t in wanted):
            return pool
    return pools[0]


_NOT_STARTED = object()
MINUTE = timedelta(minutes=1)
_IN_FLIGHT = (Phase.LENDING, Phase.RECLAIMING)
# What a write that changed something came to (a 429 from a budget changed nothing).
_CHANGED = frozenset({WriteOutcome.APPLIED, WriteOutcome.EVICTED, WriteOutcome.GONE})


def _node_uid(intent: AuditRecord) -> str | None:
    """The UID of the node an intent was decided for, as its record holds it."""
    uid = intent.detail.get("node_uid")
    return uid if isinstance(uid, str) and uid else None


# ---------------------------------------------------------------------------------------------
# Failure episodes: what failed, audited once when it starts and once when it ends


@dataclass
class _Episode:
    failure: Failure
    since: datetime
    announced: bool = False


Announcement = tuple[PoolName, Stage, _Episode, bool]  # pool, stage, episode, ended


class _Episodes:
    """Per pool and stage (strategy, planner), the failure going on, if any.

    An episode is one failure that persists: it starts when a call fails after working (or at
    the first call), and a different kind or exception type starts a new one. Its start and its
    end (``recovered``) are each audited once, by the leader; a follower remembers them until
    it leads, so no episode goes unrecorded and none is recorded per tick."""

    def __init__(self) -> None:
        self._open: dict[tuple[PoolName, Stage], _Episode] = {}
        self._ended: list[tuple[PoolName, Stage, _Episode]] = []

    def failed(self, pool: PoolName, stage: Stage, failure: Failure, now: datetime) -> bool:
        """Record a failure; True when it starts a new episode."""
        current = self._open.get((pool, stage))
        if current is not None and (current.failure.kind, current.failure.error) == (
            failure.kind,
            failure.error,
        ):
            return False
        if current is not None:
            self.fine(pool, stage)
        self._open[(pool, stage)] = _Episode(failure, now)
        return True

    def fine(self, pool: PoolName, stage: Stage) -> None:
        episode = self._open.pop((pool, stage), None)
        if episode is not None and episode.announced:
            self._ended.append((pool, stage, episode))

    def failing(self) -> set[PoolName]:
        return {pool for pool, _ in self._open}

    def to_announce(self) -> list[Announcement]:
        started = [(p, s, e, False) for (p, s), e in self._open.items() if not e.announced]
        return [*((p, s, e, True) for p, s, e in self._ended), *started]

    def announced(self, done: Sequence[Announcement]) -> None:
        for _, _, episode, _ in done:
            episode.announced = True
        ended_ids = {id(e) for _, _, e, ended in done if ended}
        self._ended = [item for item in self._ended if id(item[2]) not in ended_ids]


def _episode_record(
    ctx: Context,
    new_id: audit.NewId,
    now: datetime,
    pool: PoolName,
    stage: Stage,
    episode: _Episode,
    ended: bool,
) -> AuditRecord:
    failure = episode.failure
    detail = {
        "stage": stage,
        "kind": failure.kind,
        "error": failure.error or None,
        "failure": failure.message,
        "since": nodestate.format_time(episode.since),
    }
    if ended:
        reason = model.Reason.RECOVERED
        message = f"the {stage} works again; the pool is planned as usual"
    else:
        reason = (
            model.Reason.STRATEGY_FAILED if stage is Stage.STRATEGY else model.Reason.PLANNER_FAILED
        )
        message = (
            f"the {stage} failed ({failure}); the pool is planned with the safety-only "
            "proposal: no new loans, safety reclaims still happen"
        )
    return audit.episode_record(ctx, new_id, now, str(pool), reason, message, detail)


def _in_thread(fn: Callable[[Any], object], arg: object, name: str) -> asyncio.Future[object]:
    """``fn(arg)`` in a daemon thread: a call that never returns neither blocks the loop nor
    keeps the process from exiting (a pool executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            result, error = fn(arg), None
        except Exception as exc:
            result, error = None, exc
        # The loop may be gone (shutdown): then nobody waits for the answer.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


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


def _overdue(view: NodeView, keys: Keys, now: datetime) -> bool:
    """A reclaim still open after its deadline (the drain should have been forced by then)."""
    state = nodestate.read(view, keys)
    if isinstance(state, nodestate.StateError) or state.phase is not Phase.RECLAIMING:
        return False
    return state.deadline is not None and state.deadline < now


def _floor(when: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + step * ((when - epoch) // step)
