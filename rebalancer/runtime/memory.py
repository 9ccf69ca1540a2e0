"""What the controller remembers from one tick to the next, as one immutable value.

Where it sits: ``runtime.reconcile.Reconciler`` holds the one ``Memory``; ``runtime.step``
takes it with the tick's observation and returns the next one with the tick's effects, and
``runtime.flight.settle`` folds in what carrying the effects out came to. Besides it, the
``Observer`` keeps what it read (each demand history, and what it covers, judged as each read
continues the last), ``Strategies`` the calls still running in their threads, and start-up's
``Recovery`` what it read back from the store and the Events and what it has said of them: no
decision of the step reads any of them (docs/design/pure-step.md).

Every field says why it outlives a tick. A process that restarts starts from ``Memory()``:
what must survive a restart is on the nodes and in the audit log, and start-up reads it back
(``runtime.recovering``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import demand, model
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import Action, NodeName, NodeView, PoolName
from rebalancer.core.tick import Decision, Failure, Stage


@dataclass(frozen=True)
class Episode:
    """One failure of a pool's strategy or planner that persists, from when it began; audited
    once when it starts (``announced``) and once when it ends."""

    failure: Failure
    since: datetime
    announced: bool = False


EpisodeKey = tuple[PoolName, Stage]
# An episode whose record is due: its pool and stage, the episode, and whether it ended.
Announcement = tuple[PoolName, Stage, Episode, bool]


@dataclass(frozen=True)
class Drain:
    """A reclaim in flight whose node may vanish: looked at again under the node's UID, its
    intent and its deadline (None: passed) until it ends, wherever the node went."""

    pool: PoolName
    uid: str
    decision: str
    deadline: datetime | None


@dataclass(frozen=True)
class Removal:
    """The borrowed pods an earlier node of a name left, being removed under one intent."""

    pool: PoolName
    intent: AuditRecord
    deadline: datetime


@dataclass(frozen=True)
class Loan:
    """A node lent as of the last leading tick, as seen then: a loan whose node is deleted (and
    perhaps created again under its name) is ended under an intent of its own."""

    pool: PoolName
    view: NodeView


@dataclass(frozen=True)
class Memory:
    # The leadership term start-up last ran for, and whether it could not write to the store
    # (then it is tried again next tick while the tick's safety reclaims go on).
    started: object = None
    start_unaudited: bool = False
    # Each pool's demand as believed after the last tick (``core.demand``): unknown since the
    # last good sample, an implausible fall held.
    beliefs: Mapping[PoolName, demand.Belief] = field(default_factory=dict)
    # What was said once and is not said again until it changes: each pool's clock problems,
    # the pairs of pools found selecting a node, the orphans taken back, and the objects that
    # cannot be read (with why).
    clock_problems: Mapping[PoolName, tuple[str, ...]] = field(default_factory=dict)
    said_overlaps: frozenset[tuple[NodeName, PoolName]] = frozenset()
    said_orphans: frozenset[NodeName] = frozenset()
    said_unreadable: Mapping[str, str] = field(default_factory=dict)
    # The last tick's snapshot, and what was decided on it: for wake-ups and explain.
    last: model.Snapshot | None = None
    last_decided: tuple[model.Snapshot, Decision] | None = None
    # The failure episodes going on, and those ended whose end is not audited yet.
    episodes: Mapping[EpisodeKey, Episode] = field(default_factory=dict)
    ended: tuple[tuple[PoolName, Stage, Episode], ...] = ()
    # Per pool, the minutes lending cost within its error budget's window (restored from the
    # audit log at start-up): each minute counts once however many ticks see it.
    costs: Mapping[PoolName, tuple[datetime, ...]] = field(default_factory=dict)
    # When the audit store's failure episode began (None: it works).
    store_since: datetime | None = None
    # A dry run writes nothing, so it plans the same steps tick after tick: each is said (and
    # audited) once, when it enters the plan; and each node in flight it would drive, once.
    would: frozenset[tuple[PoolName, NodeName, Action]] = frozenset()
    would_drive: frozenset[NodeName] = frozenset()
    # The reclaims in flight, looked at once more when their node vanishes.
    draining: Mapping[NodeName, Drain] = field(default_factory=dict)
    # The loans of the last leading tick.
    loans: Mapping[NodeName, Loan] = field(default_factory=dict)
    # The removals of what an earlier node of a name left, under way.
    removing: Mapping[NodeName, Removal] = field(default_factory=dict)
    # What the last in_progress record of each drain said (intent id, message): a pass that
    # says the same and changed nothing is not recorded again.
    said: Mapping[NodeName, tuple[str, str]] = field(default_factory=dict)

    def failing(self) -> frozenset[PoolName]:
        """The pools planned with the safety-only proposal: a failure episode is going on."""
        return frozenset(pool for pool, _ in self.episodes)
