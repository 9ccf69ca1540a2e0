"""The values passed between the planner's stages, and the plan of one pool while it is built.

Where it sits: ``reading`` builds a ``Pool`` (every node decoded once, demand judged) that does
not change while a tick is decided; each intent then writes into the ``Draft``, so that later
intents see the steps of earlier ones. Kept apart so that every stage reads the same few types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from rebalancer.core import clocks, model, nodestate, overrides, takers, windows
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.policy import Guard, PoolPolicy

# The phases in their order, iterated at every tick: iterating the Enum class itself builds a
# generator over its member names each time.
PHASES = tuple(Phase)


class Health(Enum):
    FRESH = "fresh"
    STALE = "stale"  # no new lending
    LOST = "lost"  # stale past the grace period: reclaim everything


@dataclass(frozen=True, slots=True)
class Node:
    """One node as the planner sees it: decoded once per node version, reused across ticks."""

    view: model.NodeView
    name: model.NodeName
    state: nodestate.NodeState
    phase: Phase
    overrides: overrides.Overrides
    window: windows.Window | None  # the node's own window override; None: the pool's
    unreadable: bool = False  # an override could not be read: fail closed, never lend it
    # Why the node is taken back whatever the strategy says (another writer changed it: its
    # state is unreadable, its label or lent taint lost, a foreign pod on it; or no pool
    # selects it now), None for a node as the controller left it. Lent nodes only.
    problem: Reason | None = None
    # The node's state could not be read: it is planned as lent (away from serving, for every
    # cap) and taken back from the pool's specification.
    error: nodestate.StateError | None = None

    def as_of(self, now: datetime) -> Node:
        """The node at ``now``: past ``override-until`` every override lapses, an unreadable
        one too."""
        if self.overrides.active(now) is self.overrides:
            return self
        return dataclasses.replace(self, overrides=overrides.NONE, window=None, unreadable=False)


@dataclass(frozen=True, slots=True)
class DecodedNode:
    node: Node  # one whose state cannot be read too, planned as lent (``Node.error``)
    findings: tuple[model.Finding, ...]


@dataclass(frozen=True, slots=True)
class Demand:
    """What the tick knows of a pool's demand."""

    health: Health
    note: str  # how old the sample is, or why there is none: for the sentences
    need: int | None  # nodes demand needs now; None when demand is unknown
    value: float | None  # the demand sample planned with, in the pool's unit; None: unknown
    queue: float | None  # requests waiting, from a fresh sample; None when unknown
    held: model.DropHeld | None  # an implausible fall of demand, not believed yet


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool as the tick found it. It does not change while intents are decided: what they
    decide is in the ``Draft``."""

    name: model.PoolName
    now: datetime
    policy: PoolPolicy
    by_phase: Mapping[Phase, tuple[Node, ...]]  # every phase, in the order of ``Phase``
    unreadable: int  # nodes whose state could not be read: planned as lent, taken back
    not_ready: int  # serving nodes that are NotReady: no capacity, not lendable
    warming: frozenset[model.NodeName]  # serving, Ready, not warm yet: capacity soon, not now
    demand: Demand
    budget: model.ErrorBudget | None  # the pool's error budget, where it has an slo
    cover: model.Cover | None  # what the pool's history covers, where it has an slo
    findings: tuple[model.Finding, ...]
    window_open: bool  # the pool's window, evaluated once per tick
    paused: bool  # a global or pool pause: lending and non-safety moves are refused
    frozen: bool  # a global or pool freeze: every intent is refused
    takers: tuple[takers.Gang, ...]  # pending jobs no other pool has room for, in place order
    alerts: tuple[model.FiringAlert, ...] = ()  # matched Alertmanager alerts firing now
    clocks: clocks.Clocks = clocks.NONE  # as the tick measured them: no lending past the bound
    # Nodes whose ``since`` is ahead of the API server's clock: not trusted to hold a reclaim
    # (the minimum loan); the cooldown and the warm-up count it as now, or later.
    future: frozenset[model.NodeName] = frozenset()
    # The lent nodes under a reclaim notice, in the order of ``by_phase``: found once a tick,
    # for the rules that look at them (most ticks none is).
    noticed: tuple[Node, ...] = ()

    @property
    def size(self) -> int:
        return self.count(*PHASES)  # an unreadable node is among the lent ones

    def count(self, *phases: Phase) -> int:
        return sum(len(self.by_phase[phase]) for phase in phases)

    @property
    def notice(self) -> timedelta:
        """How far ahead the pods of a reclaim that can wait are told."""
        return self.policy.reclaim_notice

    def is_open(self, node: Node) -> bool:
        """Whether the node's window (its own, or the pool's) is open now."""
        return self.window_open if node.window is None else node.window.is_open(self.now)

    def open_for_a_loan(self, node: Node) -> bool:
        """Whether the node's window is open now and still at the end of a notice: a loan
        its window would take back before its pods could be told in full is not made."""
        if not self.is_open(node):
            return False
        window = node.window or self.policy.window
        return not self.notice or window.is_open(self.now + self.notice)

    @property
    def budget_short(self) -> bool:
        """Whether the pool's error budget cannot pay for another loan's worst case: from
        then on only covered loans stay (docs/design/budget.md)."""
        budget, policy = self.budget, self.policy
        if Guard.ERROR_BUDGET not in policy.guards or budget is None:
            return False
        return not budget.covers(policy.loan_risk_minutes)


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes that could take an intent's steps, and every other node it is about with
    the reason it is excluded (in the nodes' order, which breaks ties between reasons)."""

    eligible: tuple[Node, ...]
    excluded: Mapping[model.NodeName, Reason]


@dataclass(frozen=True, slots=True)
class Limit:
    """What one rule allows an intent: at most ``cap`` steps, and the words for the rest."""

    cap: int
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Allowance:
    """How many steps an intent may take, and the refusals of the rest."""

    allowed: int
    refused: tuple[model.Rejection, ...]


@dataclass
class Draft:
    """The plan of one pool while it is built: what the intents so far asked for, took and
    were refused. Counts read through it include the steps already decided, so a node moves
    at most once a tick and capacity is never lent twice."""

    pool: Pool
    intents: list[Intent] = field(default_factory=list)
    steps: list[model.Step] = field(default_factory=list)
    rejections: list[model.Rejection] = field(default_factory=list)
    changed: set[model.NodeName] = field(default_factory=set)
    per_tick_left: int = field(init=False)  # strategy steps this tick still allows
    lends: int = 0
    cold_lends: int = 0  # lends of warming nodes: they took no warm capacity away
    reclaims: int = 0
    served: set[str] = field(default_factory=set)  # jobs this pool's room or lends are for

    def __post_init__(self) -> None:
        self.per_tick_left = self.pool.policy.step_budget(self.pool.size)

    def untouched(self, *phases: Phase) -> list[Node]:
        """Nodes in ``phases`` that no step of this tick has touched yet."""
        by_phase = self.pool.by_phase
        if not self.changed:  # before the first step, as most ticks stay: no test per node
            return [n for phase in phases for n in by_phase[phase]]
        return [n for phase in phases for n in by_phase[phase] if n.name not in self.changed]

    @property
    def lent_count(self) -> int:
        """Nodes lent or being lent after the steps decided so far; a node under notice is
        lent until its reclaim begins."""
        return self.pool.count(Phase.LENT, Phase.LENDING) + self.lends - self.reclaims

    def noticed(self) -> list[Node]:
        """Lent nodes under a reclaim notice that no step of this tick has touched."""
        return [n for n in self.pool.noticed if n.name not in self.changed]

    @property
    def kept_count(self) -> int:
        """The loans the pool means to keep: lent or being lent, less those under notice. What
        a strategy's target is measured against."""
        return self.lent_count - len(self.noticed())

    @property
    def serving_count(self) -> int:
        """Warm serving nodes after the steps decided so far: a NotReady node serves nothing,
        and a node back from a loan serves once its inference is warm (``core.warmth``)."""
        pool = self.pool
        warm = pool.count(Phase.SERVING) - pool.not_ready - len(pool.warming)
        return warm - (self.lends - self.cold_lends)

    @property
    def returning(self) -> int:
        """Nodes on their way back to serving: reclaiming, warming up, or reclaimed this tick."""
        warming = len(self.pool.warming) - self.cold_lends
        return self.pool.count(Phase.RECLAIMING) + warming + self.reclaims

    def step(self, intent: Intent, node: Node, taker: str | None = None) -> None:
        notice, note = _notice(intent, node)
        # A reclaim for anything but the strategy protects inference: its deadline is short.
        urgent = (
            intent.action is Action.RECLAIM and not notice and intent.origin is not Origin.STRATEGY
        )
        message = intent.message if taker is None else f"{intent.message}; for job {taker}"
        self.steps.append(
            model.Step(
                pool=self.pool.name,
                node=node.name,
                action=intent.action,
                reason=intent.reason,
                message=message,
                intent=intent,
                urgent=urgent,
                taker=taker,
                notice=notice,
                notice_note=note,
            )
        )
        self.changed.add(node.name)
        if intent.origin is Origin.STRATEGY:
            self.per_tick_left -= 1
        if intent.action is Action.LEND:
            self.lends += 1
            self.cold_lends += node.name in self.pool.warming
        elif intent.action is Action.RECLAIM:
            self.reclaims += 1

    def finish(self, proposal: model.Proposal | None) -> model.PoolPlan:
        pool = self.pool
        need = "unknown" if pool.demand.need is None else str(pool.demand.need)
        target = "-" if proposal is None else str(proposal.lend_target)
        counts = ", ".join(
            f"{len(nodes)} {phase.value}" for phase, nodes in pool.by_phase.items() if nodes
        )
        if pool.unreadable:
            counts += f" ({pool.unreadable} of them unreadable)"
        return model.PoolPlan(
            pool=pool.name,
            intents=tuple(self.intents),
            steps=tuple(self.steps),
            rejections=tuple(self.rejections),
            findings=pool.findings,
            summary=(
                f"pool {pool.name}: {counts}; need {need}; target {target}; "
                f"{len(self.steps)} steps, {len(self.rejections)} refusals"
            ),
            served=frozenset(self.served),
        )


def _notice(intent: Intent, node: Node) -> tuple[timedelta, str]:
    """How far ahead a reclaim step tells the node's borrowed pods, and why that much
    (docs/design/reclaim-notice.md): the intent's notice, none where no borrowed pod runs, and
    none for a reclaim that cannot wait (a node under notice is then cut short)."""
    if intent.action is not Action.RECLAIM:
        return timedelta(0), ""
    if intent.notice <= timedelta(0):
        cut = "its notice is cut short: " if node.state.noticed else ""
        why = f"no notice for a {intent.reason.value} reclaim"
        return timedelta(0), f"{cut}{why}; its pods get their own grace period"
    if not node.view.borrowed_pods:
        return timedelta(0), "no notice: no borrowed pod runs on it"
    return intent.notice, f"its borrowed pods are told {intent.notice} ahead"
