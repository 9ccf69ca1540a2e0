"""The plan a tick makes: proposals, intents, the steps and refusals they end as, and the
stable reason codes that audit records, metrics and dashboards key on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from rebalancer.core import bounded
from rebalancer.core.model.names import NodeName, PoolName


class Action(StrEnum):
    """What a step, an actuator call or an audit record does to a node. The planner plans
    ``LEND``, ``RECLAIM`` (at once, or with a notice) and ``WITHDRAW`` (a notice no longer
    needed); the runtime adds the other two."""

    LEND = "lend"
    RECLAIM = "reclaim"
    WITHDRAW = "withdraw"  # a reclaim notice withdrawn: the node stays lent
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
    WINDOW_CLOSING = "window_closing"  # the window closes within the notice: noticed now
    NOTICE_WITHDRAWN = "notice_withdrawn"  # the strategy wants the noticed node lent after all
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
    STATE_UNVERIFIED = "state_unverified"  # not signed by the controller for this node
    LENT_TAINT_LOST = "lent_taint_lost"  # a lent node lost a lent taint: anything may land
    FOREIGN_POD = "foreign_pod"  # a lent node runs a pod neither inference, daemon nor borrowed
    ORPHANED = "orphaned"  # carries our keys, yet no pool selects it now
    SELECTED_BY_MANY_POOLS = "selected_by_many_pools"  # a finding: the first pool drives it
    CLOCK_SKEW = "clock_skew"  # a clock is past the skew bound, or cannot be measured: no lending
    SINCE_IN_FUTURE = "since_in_future"  # a node's since is ahead of the API server's clock
    # a borrowed pod's last-checkpoint-time is not believed: its job is costed as one that
    # does not report (docs/design/reclaim-notice.md#victims-by-work-lost)
    CHECKPOINT_NOT_BELIEVED = "checkpoint_not_believed"
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
    # A reclaim's notice: how far ahead the borrowed pods are told (zero: at once).
    notice: timedelta = timedelta(0)


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
    # A reclaim: how far ahead its borrowed pods are told (zero: evicted at once), and why
    # that much (docs/design/reclaim-notice.md).
    notice: timedelta = timedelta(0)
    notice_note: str = ""


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
    """Something wrong with the input that the operator should fix (a bad annotation).

    ``key`` and ``value`` come from outside (an annotation may hold 256 KiB): a finding keeps
    them cut (``bounded.cut``: the start, the size and a digest), and ``message``, which quotes
    the value short where it is built, is cut at ``bounded.SENTENCE``; so every copy of a
    finding (its audit record, Event, ``explain``) carries a big value once, bounded
    (docs/design/bounded-copies.md)."""

    node: NodeName
    key: str
    value: str
    reason: Reason
    message: str

    def __post_init__(self) -> None:
        # Cut where the value enters, not at each copy: a copy made later cannot forget to.
        object.__setattr__(self, "key", bounded.cut(self.key))
        object.__setattr__(self, "value", bounded.cut(self.value))
        object.__setattr__(self, "message", bounded.cut(self.message, bounded.SENTENCE))


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
