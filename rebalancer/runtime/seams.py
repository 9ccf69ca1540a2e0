"""What the reconcile step is given and what it gives back: the pool as the runtime drives it
(``PoolConfig``), one small Protocol per dependency (views, metrics, clocks, actuators, the
audit trail, the node ledger, leadership, events, alerts, the controller's own metrics), the
null objects that stand in when a dependency is optional, and what a tick did (``TickReport``).

Where it sits: below ``runtime.reconcile`` and the modules it delegates to (``deciding``,
``budgets``); ``runtime.wiring`` builds the real adapters that satisfy these seams, and the tests
pass in-memory fakes. Kept apart so that a reader meets the controller's dependencies in one
place, and the step's code reads as its verbs without them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, Protocol

from rebalancer.core import audit, clocks, model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import (
    Action,
    Clock,
    HistoryResult,
    NodeName,
    NodeView,
    PodMarks,
    PoolMetrics,
    PoolName,
    Term,
)
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.strategy import Strategy

# ---------------------------------------------------------------------------------------------
# Configuration: what the runtime needs of a pool (the settings module builds it)


@dataclass(frozen=True)
class PoolConfig:
    """One pool as the runtime drives it."""

    name: PoolName
    node_selector: Mapping[str, str]  # equality on labels (the node's serving labels)
    policy: PoolPolicy  # its ``lend_spec`` is what lending does to the pool's nodes
    marks: PodMarks  # how the pool's pods are told apart
    strategy: Strategy
    strategy_name: str
    strategy_params: Mapping[str, Any] = field(default_factory=dict)
    paused: bool = False  # the pool's pause: no lending, safety reclaims still happen
    frozen: bool = False  # the pool's freeze: nothing moves, not even safety reclaims
    wants_history: bool | None = None  # None: as the strategy says (``reads_history``)
    slo: model.Slo | None = None  # the pool's error budget; None: none, fixed margins

    @property
    def lent_taints(self) -> tuple[model.Taint, ...]:
        """The taints lending puts on the pool's nodes: what every reading of their phase
        takes (``core.tick.phase``)."""
        return self.lend_spec.add_taints

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
        memo_key = self._memo_keys.get(keys.prefix)
        if memo_key is None:
            memo_key = self._memo_keys[keys.prefix] = repr(("selects", self._selector, keys.prefix))
        found = view.memo.get(memo_key)
        if not isinstance(found, bool):
            found = view.memo[memo_key] = self._matches(view, keys)
        return found

    @cached_property
    def _selector(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.node_selector.items()))

    @cached_property
    def _memo_keys(self) -> dict[str, str]:
        """The memo key of ``selects`` by key prefix: a string, whose hash is kept, where a
        tuple of the selector's pairs is hashed again at every look-up (20,000 a tick at
        5,000 nodes and four pools)."""
        return {}

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
    # The grid the history's end is on (``observing.history_end``): it is read again each time
    # ``now`` crosses a line of it, so at most this often, and at ``now`` every process holds
    # the same window.
    refresh: timedelta = timedelta(minutes=5)


# ---------------------------------------------------------------------------------------------
# Seams


class ViewSource(Protocol):
    """``adapters.informer.Informer``: the cached nodes with their pods."""

    def node_views(self, marks: PodMarks) -> tuple[NodeView, ...]: ...

    def pending(self, marks: PodMarks) -> tuple[model.PendingPod, ...]:
        """The pods waiting for a node that tolerate the lend taints of ``marks``."""
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
    """``adapters.actuator.Actuator`` (one per pool: lend spec and pod marks are the pool's)."""

    async def lend(self, node: str, decision: str) -> ActionResult: ...

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """With ``uid``, only that incarnation of the node: another one ends ``gone``."""
        ...

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """A reclaim that begins as a notice: the pods must be gone by ``deadline``."""
        ...

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        """A notice withdrawn: the node stays lent."""
        ...

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        """With ``uid``, only that incarnation: when it was replaced or deleted, the pods it
        took are removed (evicted before ``deadline``) before the pass ends ``gone``."""
        ...

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        """The borrowed pods bound to the name before its node was created, removed."""
        ...


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

    async def cost_minutes(self, pool: str, since: datetime) -> tuple[datetime, ...]:
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

    async def copies(self, views: Iterable[NodeView]) -> Sequence[KeptCopy]:
        """The intents read back from the controller's own Events, oldest first, each
        vouched for or not by its node's decision (raises if they cannot be listed)."""
        ...

    async def retell(self, record: AuditRecord, why: str, node: str | None = None) -> bool:
        """Record the Event carrying ``record`` again (its copy must outlive the Event TTL)."""
        ...


class KeptCopy(Protocol):
    """``adapters.ledger.Copy``: an intent read back from an Event, and when that was made."""

    @property
    def record(self) -> AuditRecord: ...

    @property
    def told(self) -> datetime: ...

    @property
    def vouched(self) -> bool:
        """Its node's ``decision`` names it: an action carried out, not a forged Event."""
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
class Observation:
    snapshot: model.Snapshot
    metrics: Mapping[PoolName, PoolMetrics]
    clocks: Mapping[PoolName, clocks.Clocks] = field(default_factory=dict)  # as measured
    unreadable: Mapping[str, str] = field(default_factory=dict)  # objects left out, with why
