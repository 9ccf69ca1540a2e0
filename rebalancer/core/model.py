"""The vocabulary of a decision: what the controller sees, proposes, does and refuses.

Everything here is a frozen value. A tick builds a ``Snapshot`` (what the cluster and the
metrics looked like at ``now``), a strategy turns each pool's ``PoolView`` into a ``Proposal``,
and ``tick.plan_tick`` turns proposals and operator overrides into ``Intent``s, each of which
ends as ``Step``s (what the actuator will do) or a ``Rejection`` (why not). Nothing in this module
knows about Kubernetes objects or Prometheus responses: adapters translate into these values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import NewType

from rebalancer.core import clocks as clocks_module

NodeName = NewType("NodeName", str)
PoolName = NewType("PoolName", str)
Clock = Callable[[], datetime]  # the one clock type: every seam that reads time is given one


class Unit(StrEnum):
    """What a pool's demand, and one node's capacity, are counted in: the operator's choice
    (``capacity.unit``). The planner's arithmetic does not care which (it compares demand with
    nodes times the capacity of one); the words it writes, and a waiting queue's size in
    nodes, do."""

    REQUESTS_PER_SECOND = "requests_per_second"  # requests completed per second
    TOKENS_PER_SECOND = "tokens_per_second"  # tokens generated per second
    CONCURRENT_SEQUENCES = "concurrent_sequences"  # requests in flight at once

    @property
    def symbol(self) -> str:
        """How a figure is written in a sentence: ``120 rps``, ``9500 tokens/s``."""
        return _SYMBOLS[self]

    def backlog_nodes(self, waiting: float, per_node: float) -> int | None:
        """Nodes that take ``waiting`` queued requests off the queue within a minute; None
        when a request has no size in this unit (tokens: a request's length is not known)."""
        if self is Unit.REQUESTS_PER_SECOND:
            return max(1, math.ceil(waiting / (per_node * 60)))
        if self is Unit.CONCURRENT_SEQUENCES:  # each waiting request takes a sequence's place
            return max(1, math.ceil(waiting / per_node))
        return None


_SYMBOLS = {
    Unit.REQUESTS_PER_SECOND: "rps",
    Unit.TOKENS_PER_SECOND: "tokens/s",
    Unit.CONCURRENT_SEQUENCES: "sequences",
}


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint exactly as the API holds it (``value`` may be absent)."""

    key: str
    effect: str
    value: str | None = None
    time_added: str | None = None  # as the API wrote it (RFC 3339), kept for exact restores

    def __str__(self) -> str:
        value = "" if self.value is None else f"={self.value}"
        return f"{self.key}{value}:{self.effect}"

    def to_doc(self) -> dict[str, str]:
        """The taint as the API writes it, in its field order (a restore gives back the very
        bytes a node had): absent fields left out, nothing normalised."""
        doc = {"key": self.key}
        if self.value is not None:
            doc["value"] = self.value
        doc["effect"] = self.effect
        if self.time_added is not None:
            doc["timeAdded"] = self.time_added
        return doc


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration as the API holds it (empty strings for absent fields)."""

    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" tolerates every effect


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Kubernetes' toleration matching (k8s.io/api/core/v1 ToleratesTaint)."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.operator == "Equal" and t.key == taint.key and t.value == (taint.value or ""):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Resources:
    """What a pod requests or a node offers, in the three units a GPU job is placed by:
    ``nvidia.com/gpu`` devices, CPU in millicores, memory in bytes."""

    gpu: int = 0
    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpu + other.gpu, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpu - other.gpu, self.cpu - other.cpu, self.memory - other.memory)

    def covers(self, wanted: Resources) -> bool:
        return self.gpu >= wanted.gpu and self.cpu >= wanted.cpu and self.memory >= wanted.memory

    def __str__(self) -> str:
        return f"{self.gpu} GPU, {self.cpu}m CPU, {self.memory / 2**30:.4g} GiB"


NOTHING = Resources()


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry of a required node affinity term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        values = f" {list(self.values)}" if self.values else ""
        return f"{self.key} {self.operator}{values}"


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod waiting to be scheduled that would run on lent capacity: a possible taker.

    ``affinity`` is the required node affinity: any one term (a tuple of requirements that must
    all hold) admits a node; empty, no affinity. ``job`` is the pod's job identity: the pending
    pods of one job are a gang, placed together or not at all (``core.takers``)."""

    namespace: str
    name: str
    tolerations: tuple[Toleration, ...]
    requests: Resources = NOTHING
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[Requirement, ...], ...] = ()
    job: str | None = None
    priority: int = 0
    created: datetime | None = None


class PodRole(StrEnum):
    """What a pod is to the controller; decided by the adapter from the pool's selectors."""

    INFERENCE = "inference"  # a serving replica: its node is busy and never lent
    BORROWED = "borrowed"  # preemptible training that tolerates the lend taint
    DAEMON = "daemon"  # a DaemonSet pod: does not make a node busy
    OTHER = "other"  # anything else: the node is not idle, so it is not lent


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    role: PodRole
    priority: int = 0
    job: str | None = None  # the training job the pod belongs to, if any
    created: datetime | None = None
    terminating: bool = False
    ready: bool = True  # the pod's Ready condition: an inference pod serves only when Ready
    requests: Resources = NOTHING  # what it holds of its node (a lent node's room for takers)


@dataclass(frozen=True)
class PodRules:
    """How a pool tells its pods apart: a pod that tolerates every lend taint is borrowed, one
    whose labels match ``inference_selector`` serves (``adapters.convert`` reads them so)."""

    lend_taints: tuple[Taint, ...]
    serving_taints: tuple[Taint, ...] = ()
    inference_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeView:
    """A Node as the core needs it. Parsed annotations are cached on the (immutable) value."""

    name: NodeName
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    pods: tuple[PodView, ...] = ()
    ready: bool = True
    resource_version: str = ""
    allocatable: Resources | None = None  # None: unknown, so no taker can be shown to fit
    # Which incarnation of the name this is: a node deleted and re-created under its name is
    # another node, and a pod bound before ``created`` was bound to an earlier one.
    uid: str = ""
    created: datetime | None = None
    # Derived values the core computes once per node value (parsed state, overrides). Not an
    # init field, so ``dataclasses.replace`` gives the new value a memo of its own.
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False, init=False)

    @cached_property
    def busy_with_inference(self) -> bool:
        return any(p.role is PodRole.INFERENCE for p in self.pods)

    @cached_property
    def idle(self) -> bool:
        """No pod that makes lending unsafe: DaemonSet pods and borrowed ones do not count."""
        return all(p.role in (PodRole.DAEMON, PodRole.BORROWED) for p in self.pods)

    @cached_property
    def inference_ready(self) -> bool | None:
        """Whether every inference pod on the node is Ready; None when it runs none (pods that
        are terminating do not count). Computed once per node value, not per tick."""
        inference = [p for p in self.pods if p.role is PodRole.INFERENCE and not p.terminating]
        return all(p.ready for p in inference) if inference else None

    @cached_property
    def borrowed_pods(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if p.role is PodRole.BORROWED)


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric value with the time Prometheus says it was sampled (never the query time)."""

    value: float
    at: datetime

    def age(self, now: datetime) -> timedelta:
        return now - self.at


@dataclass(frozen=True, slots=True)
class DemandHistory:
    """Demand in the pool's unit (``Unit``) on a regular grid, up to (and never past) ``end``.

    ``values[i]`` is the demand over ``[start + i*step, start + (i+1)*step)``; ``None`` is a gap
    (no sample), which is never read as zero. Strategies use it for same-hour-yesterday
    forecasts and trends; the simulator passes a view that ends where the metric pipeline ends,
    so no strategy can peek at the future.
    """

    start: datetime
    step: timedelta
    values: Sequence[float | None]
    end_index: int  # exclusive: values[end_index:] are not visible

    @property
    def end(self) -> datetime:
        return self.start + self.step * self.end_index

    def index_of(self, when: datetime) -> int:
        return math.floor((when - self.start) / self.step)

    def window(self, since: datetime, until: datetime) -> list[float]:
        """Known values whose bucket starts in ``[since, until)``, clipped to what is visible."""
        lo = max(0, self.index_of(since))
        hi = min(self.end_index, self.index_of(until))
        if hi <= lo:
            return []
        return [v for v in self.values[lo:hi] if v is not None]

    @staticmethod
    def empty(at: datetime) -> DemandHistory:
        return DemandHistory(start=at, step=timedelta(minutes=1), values=(), end_index=0)


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How much risk a pool may still take: breach minutes allowed per rolling ``window``, and
    how many the window before ``now`` has spent. A strategy spends it instead of a fixed
    margin: wider while it burns, narrower while it is unspent."""

    allowed_minutes: int
    window: timedelta
    spent_minutes: int

    @property
    def burned(self) -> float:
        """The share spent: 0 untouched, 1 (or more) gone; a budget of zero is always gone."""
        if self.allowed_minutes <= 0:
            return 1.0
        return self.spent_minutes / self.allowed_minutes

    def covers(self, minutes: int) -> bool:
        """Whether ``minutes`` more could be spent within the budget."""
        return self.spent_minutes + minutes <= self.allowed_minutes

    @property
    def spent_text(self) -> str:
        """``3 of 10 minute(s) spent in the last 7 day(s)``."""
        days, rest = divmod(self.window, timedelta(days=1))
        span = f"{days} day(s)" if not rest else f"{self.window / timedelta(hours=1):g} hour(s)"
        return f"{self.spent_minutes} of {self.allowed_minutes} minute(s) spent in the last {span}"


@dataclass(frozen=True, slots=True)
class Jump:
    """The largest jump of demand within one loan's risk over one peak window's peak, in the
    span a ``Cover`` was judged on; ``peak`` is that window's peak at its end."""

    window: timedelta
    peak: float | None  # None: no sample in the window
    ratio: float  # what the cover takes: ``seen``, stretched (``core.exposure``)
    seen: float  # the largest jump seen; infinite: out of a peak of zero, covers nothing


@dataclass(frozen=True, slots=True)
class Cover:
    """What the pool's own history says its loans are exposed to (``core.exposure``): warm
    serving nodes that carry a window's peak times its largest jump would have ridden out
    every jump of demand the last ``judged`` held within one loan's risk. Loans that leave that
    much serving are *covered*; the rest are *exposed* and spend the error budget
    (docs/design/budget.md)."""

    jumps: tuple[Jump, ...]
    judged: timedelta
    # The most the coming minutes brought at this time of day on the last days: a return to a
    # level the pool saw at this hour is no jump, however far it is from the recent peak.
    usual: float | None = None

    def demand(self, rps: float | None = None) -> tuple[float, Jump] | None:
        """The least demand that covers, with the window that gives it; ``rps``, a sample newer
        than the history, raises every peak to it. None: no window covers anything."""
        best: tuple[float, Jump] | None = None
        for jump in self.jumps:
            peaks = [p for p in (jump.peak, rps) if p is not None]
            if not peaks or math.isinf(jump.ratio):
                continue
            covered = max(peaks) * jump.ratio
            if best is None or covered < best[0]:
                best = (covered, jump)
        if best is not None and self.usual is not None and self.usual > best[0]:
            return (self.usual, best[1])
        return best

    def keep(self, need: Callable[[float], int], rps: float | None = None) -> int | None:
        """The serving nodes the covering demand ``need``s (None: no window covers)."""
        found = self.demand(rps)
        return None if found is None else need(found[0])

    def text(self, rps: float | None = None, unit: Unit = Unit.REQUESTS_PER_SECOND) -> str:
        """``the 30-minute peak 120 rps x 1.45, the largest jump within a loan's risk in the
        last 8 days``; the figure in ``unit``."""
        found = self.demand(rps)
        days = f"{self.judged / timedelta(days=1):.3g}"
        if found is None:
            return f"no peak window covers a jump of the last {days} days"
        covered, jump = found
        minutes = jump.window / timedelta(minutes=1)
        return (
            f"{covered:.4g} {unit.symbol}, the {minutes:g}-minute peak x {jump.ratio:.3g} (the "
            f"largest jump within a loan's risk in the last {days} days was {jump.seen:.3g}), "
            "or the most this hour brought on the last days"
        )


@dataclass(frozen=True, slots=True)
class Slo:
    """A pool's error budget: at most ``max_breach_minutes`` minutes per rolling ``window`` in
    which lending cost the pool (a live pool: requests queued beyond its limit while nodes were
    away on loan; the simulator: warm capacity below demand)."""

    max_breach_minutes: int
    window: timedelta = timedelta(days=7)

    def budget(self, spent: Iterable[datetime], now: datetime) -> ErrorBudget:
        """The budget at ``now``, given the minutes that cost the pool (those within the window
        before ``now`` count)."""
        since = now - self.window
        count = sum(1 for minute in spent if since < minute <= now)
        return ErrorBudget(self.max_breach_minutes, self.window, count)


@dataclass(frozen=True, slots=True)
class Limits:
    """The planner's churn and metrics rules a strategy's proposal will meet (``PoolPolicy``'s
    values), for a strategy that models what the planner will make of it."""

    cooldown: timedelta = timedelta(minutes=15)  # a returned node is not lent again sooner
    max_step_fraction: float = 0.25  # strategy lends and reclaims per tick, as a pool share
    drain: timedelta = timedelta(minutes=2)  # borrowed pods' deadline on a reclaim
    metrics_grace: timedelta = timedelta(minutes=7)  # demand unknown this long: reclaim all
    drop_floor: float = 1 / 3  # a fall below this share of the level is held ...
    drop_hold: timedelta = timedelta(minutes=10)  # ... this long before it is believed


@dataclass(frozen=True)
class PoolView:
    """What a strategy sees of one pool at ``now``."""

    name: PoolName
    now: datetime
    size: int  # every node of the pool, whatever its state
    lent: int  # nodes lent or being lent
    demand: Sample | None  # in ``unit``
    queue: Sample | None  # requests waiting
    history: DemandHistory
    # What one warm node serves at the latency target, in ``unit`` (named from when demand was
    # always requests per second).
    rps_per_node: float
    min_serving: int
    headroom: float
    return_time: timedelta  # from a reclaim decision until the node serves warm again
    zone: str  # the pool's time zone, for strategies that think in local hours
    # The pool's error budget where it has an ``slo`` (the controller counts it, and keeps the
    # count in the audit log; ``rebalancer simulate --slo``); None: no budget, fixed margins.
    budget: ErrorBudget | None = None
    limits: Limits = Limits()
    unit: Unit = Unit.REQUESTS_PER_SECOND  # what demand and ``rps_per_node`` are counted in

    def need(self, rps: float) -> int:
        """Nodes that must serve ``rps`` with headroom, never fewer than the minimum."""
        return nodes_needed(rps, self.rps_per_node, self.headroom, self.min_serving)


def nodes_needed(rps: float, rps_per_node: float, headroom: float, min_serving: int) -> int:
    raw = rps * (1.0 + headroom) / rps_per_node
    if not raw < MAX_NODES:  # an absurd rate (or an overflow) needs more than any pool has
        return max(min_serving, MAX_NODES)
    # A hair of tolerance so that 14.4000000001 from float noise is not a 15th node.
    return max(min_serving, math.ceil(raw - 1e-9))


MAX_NODES = 10**9  # more nodes than any pool holds: what an absurd demand "needs"


@dataclass(frozen=True, slots=True)
class DropHeld:
    """A fall of demand too fast to be believed yet (``core.demand``): the planner plans with
    the level before it and lends nothing until it persists or recovers."""

    level: Sample  # the last believed sample, before the fall
    seen: Sample  # the newest sample, the one not believed
    since: datetime  # when the fall was first seen


@dataclass(frozen=True, slots=True)
class FiringAlert:
    """An Alertmanager alert that fires and matched one of the pool's ``wake_on`` selectors:
    inference is short, as the alert's rule sees it (docs/design/alertmanager.md). It counts
    as pressure until ``until``: its own ``endsAt`` when the notification gave one, else the
    last firing notification plus the configured maximum age, so that a lost ``resolved``
    cannot hold a pool for ever."""

    name: str  # the alert's ``alertname`` label
    fingerprint: str  # Alertmanager's identity of the alert (its label set)
    starts_at: datetime
    matcher: str  # the selector that matched, in Alertmanager's syntax
    received: datetime  # the last firing notification of it
    until: datetime


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool at ``Snapshot.now``.

    ``demand`` is the sample to plan with: the newest one that was believed, with the time it
    was sampled. When this tick's read gave nothing usable (Prometheus unreachable, an empty
    result, NaN) ``demand_known`` is False and ``demand`` is the last good sample, so demand is
    unknown since that sample; with no sample at all it is unknown since ``unknown_since``
    (the controller's start). ``held`` is set while an implausibly fast fall is not believed.
    """

    nodes: tuple[NodeView, ...]
    demand: Sample | None = None
    queue: Sample | None = None
    history: DemandHistory | None = None
    demand_known: bool = True
    unknown_since: datetime | None = None
    held: DropHeld | None = None
    # The pool's error budget, counted up to now, where it has an ``slo``: one that cannot
    # cover another loan's worst case stops lending (``core.planning``), and strategies are
    # shown it (``PoolView.budget``).
    budget: ErrorBudget | None = None
    # What the pool's history covers (``core.exposure``), where it has an ``slo``: once the
    # budget cannot pay for another loan, only covered loans stay (``core.planning``).
    cover: Cover | None = None
    # Pending pods that tolerate the pool's lend taints: who would use a lent node. A pool
    # that lends only to takers (``PoolPolicy.lend_only_to_takers``) lends none without one.
    takers: tuple[PendingPod, ...] = ()
    # Alertmanager alerts that fire and match the pool's ``wake_on``: the pool lends nothing
    # while one holds, and the planner takes nodes back as it does for a queue.
    alerts: tuple[FiringAlert, ...] = ()
    # Nodes of ``nodes`` no pool selects that carry our keys: the pool adopted them to finish
    # them (``runtime.reconcile``); each is taken back from its own original.
    orphans: frozenset[NodeName] = frozenset()
    # Nodes of ``nodes`` other pools select too, with those pools: this pool drives them.
    overlaps: Mapping[NodeName, tuple[PoolName, ...]] = field(default_factory=dict)
    # The clocks as this tick measured them (``core.clocks``): sample ages are judged on
    # Prometheus' clock, and nothing is lent while one is past the bound or unmeasured.
    clocks: clocks_module.Clocks = clocks_module.NONE


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick decides from. ``now`` is an argument, never read from a clock."""

    now: datetime
    pools: Mapping[PoolName, PoolSnapshot]
    paused: bool = False  # the global pause: no lending, safety reclaims still happen
    frozen: bool = False  # the global freeze: nothing moves at all


class Action(StrEnum):
    """What a step, an actuator call or an audit record does to a node. The planner plans only
    ``LEND`` and ``RECLAIM``; the runtime adds the other two."""

    LEND = "lend"
    RECLAIM = "reclaim"
    PROGRESS = "progress"  # an actuator pass driving a transition in flight
    ROLLBACK = "rollback"  # a recovery that undoes an unfinished lend


class Origin(StrEnum):
    """Who asked for an intent: the strategy, an operator annotation, or a safety rule."""

    STRATEGY = "strategy"
    OPERATOR = "operator"
    SAFETY = "safety"
    SCHEDULE = "schedule"
    RECOVERY = "recovery"  # a restarted controller ending what a previous run left in flight


class Reason(StrEnum):
    """Reason codes. Stable strings: audit records, metrics and dashboards key on them."""

    # why something is done
    STRATEGY = "strategy"
    OPERATOR_LEND_NOW = "operator_lend_now"
    OPERATOR_RECLAIM_NOW = "operator_reclaim_now"
    OPERATOR_NEVER = "operator_lend_never"
    WINDOW_CLOSED = "window_closed"
    DEMAND_ABOVE_SERVING = "demand_above_serving"
    QUEUE_ABOVE_LIMIT = "queue_above_limit"
    BUDGET_EXPOSED = "budget_exposed"  # the budget is short: loans its history does not cover
    METRICS_LOST = "metrics_lost"
    RECOVERY = "recovery"  # a restart ends a transition left in flight
    BAD_OVERRIDE_RECLAIM = "bad_override_reclaim"
    GANG_PREEMPTED = "gang_preempted"  # a job losing pods elsewhere: its other nodes come back
    UNUSED_LOAN = "unused_loan"  # lent, yet no job runs on it or waits for it
    ALERT_FIRING = "alert_firing"  # a matched Alertmanager alert fires: no lending, reclaim
    # a node another writer changed, reported and taken back (docs/design/other-writers.md)
    STATE_UNREADABLE = "state_unreadable"  # an owned key cannot be read: back from the spec
    STATE_LABEL_LOST = "state_label_lost"  # the state label is gone, the original is there
    LENT_TAINT_LOST = "lent_taint_lost"  # a lent node lost a lent taint: anything may land
    FOREIGN_POD = "foreign_pod"  # a lent node runs a pod neither inference, daemon nor borrowed
    ORPHANED = "orphaned"  # carries our keys, yet no pool selects it now
    SELECTED_BY_MANY_POOLS = "selected_by_many_pools"  # a finding: the first pool drives it
    CLOCK_SKEW = "clock_skew"  # a clock is past the skew bound, or cannot be measured: no lending
    SINCE_IN_FUTURE = "since_in_future"  # a node's since is ahead of the API server's clock
    # why something is refused
    PAUSED = "paused"
    FROZEN = "frozen"
    NODE_PAUSED = "node_paused"
    METRICS_STALE = "metrics_stale"
    METRICS_MISSING = "metrics_missing"
    DEMAND_DROP_HELD = "demand_drop_held"
    QUEUE_BUILDING = "queue_building"
    BUDGET_SPENT = "budget_spent"
    MIN_SERVING = "min_serving"
    HEADROOM = "headroom"
    MAX_FRACTION = "max_fraction"
    MIN_LOAN_TIME = "min_loan_time"
    COOLDOWN = "cooldown"
    RATE_LIMIT = "rate_limit"
    OUTSIDE_WINDOW = "outside_window"
    NOT_IDLE = "not_idle"
    NOT_READY = "not_ready"
    WARMING = "warming"
    LEND_NEVER = "lend_never"
    NO_TAKER = "no_taker"  # no pending training pod would run on the node
    NO_CANDIDATE = "no_candidate"
    BAD_STATE = "bad_state"
    BAD_OVERRIDE = "bad_override"
    IN_FLIGHT = "in_flight"
    # why a pool was planned with the safety-only proposal, and when that ended
    STRATEGY_FAILED = "strategy_failed"
    PLANNER_FAILED = "planner_failed"
    RECOVERED = "recovered"
    UNREADABLE_OBJECT = "unreadable_object"
    # what lending cost: a minute of the pool's error budget
    BORROWING_COST = "borrowing_cost"


@dataclass(frozen=True, slots=True)
class Proposal:
    """A strategy's answer for one pool: how many nodes should be lent now, and why."""

    lend_target: int
    reason: str
    evidence: Mapping[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Intent:
    """A wish to change ``count`` nodes (or one named node), before the safety rules."""

    pool: PoolName
    action: Action
    count: int
    origin: Origin
    reason: Reason
    message: str
    node: NodeName | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One node transition the actuator will carry out, with the intent that caused it."""

    pool: PoolName
    node: NodeName
    action: Action
    reason: Reason
    message: str
    intent: Intent
    urgent: bool = False  # a reclaim that protects inference: the deadline is short
    taker: str | None = None  # a lend: the job (gang) it is for, when the pool lends to takers


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why (part of) an intent was refused. ``count`` nodes of the intent were not changed."""

    intent: Intent
    reason: Reason
    message: str
    count: int
    node: NodeName | None = None
    # The nodes the intent was about that could not take a step, each with its own reason
    # (a refusal for want of candidates): what ``explain`` and the audit log say per node.
    excluded: tuple[tuple[NodeName, Reason], ...] = ()


@dataclass(frozen=True, slots=True)
class Finding:
    """Something wrong with the input that the operator should fix (a bad annotation)."""

    node: NodeName
    key: str
    value: str
    reason: Reason
    message: str


@dataclass(frozen=True)
class PoolPlan:
    pool: PoolName
    intents: tuple[Intent, ...]
    steps: tuple[Step, ...]
    rejections: tuple[Rejection, ...]
    findings: tuple[Finding, ...]
    summary: str  # one line: what the pool looks like and what the tick did
    served: frozenset[str] = frozenset()  # pending jobs its lent room or its lends are for


@dataclass(frozen=True)
class Plan:
    now: datetime
    pools: Mapping[PoolName, PoolPlan]

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for p in self.pools.values() for s in p.steps)

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        return tuple(r for p in self.pools.values() for r in p.rejections)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for p in self.pools.values() for f in p.findings)


# ---------------------------------------------------------------------------------------------
# What the metrics and leadership seams answer


@dataclass(frozen=True)
class MetricError:
    """Why a metric of a pool is unknown: a failed or refused query. Never raised."""

    pool: str
    metric: str
    query: str
    reason: str

    def __str__(self) -> str:
        return f"pool {self.pool}: {self.metric} unknown: {self.reason} (query: {self.query})"


@dataclass(frozen=True)
class PoolMetrics:
    """One pool's load. ``None`` is unknown (see ``errors`` for why, when it was an error)."""

    pool: PoolName
    demand: Sample | None
    queue: Sample | None
    running: Sample | None = None
    gpu_busy: Mapping[NodeName, Sample] = field(default_factory=dict)
    errors: tuple[MetricError, ...] = ()


@dataclass(frozen=True)
class HistoryResult:
    history: DemandHistory
    error: MetricError | None = None


@dataclass(frozen=True)
class Term:
    """One uninterrupted stretch of leadership, as the audit log records it."""

    holder: str
    number: int  # the lease's leaseTransitions written when the stretch began
    acquired: datetime
