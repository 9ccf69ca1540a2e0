"""In-memory fakes of the Reconciler's seams, for ticks that touch no network.

``runtime.reconcile.Reconciler`` takes every dependency as an argument; these stand in for
them, as plain objects a test passes in and then reads:

- ``Views`` (a ``ViewSource``, what the informer's cache would hold): a list of node views the
  test edits, and the objects it pretends it could not read;
- ``Demand`` (a ``MetricsSource``): each pool's demand as the test sets it, sampled at the
  moment of the read (or at ``at``, to make it stale);
- ``ClockedPrometheus`` (a ``MetricsSource`` and a ``PrometheusClock``): a Prometheus that
  scrapes on its own clock, answers a read with the last sample at or before the time asked,
  and answers ``time()`` with its clock, timed on the controller's;
- ``CodecActuator`` (a ``NodeActuator``): moves the nodes of a ``Views`` through the node-state
  codec as the real actuator's writes would, and records each call; ``Calls`` only records them
  and says every call worked;
- ``Lead`` (a ``Leadership``): leading or not, as scripted;
- ``JournalStore``: ``MemoryAuditStore`` (the product's in-memory audit store) that also notes
  each record it took in a shared journal, so its order can be checked against other writes;
- ``Scripted``: a strategy whose answer, or failure, the test sets.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.core import clocks, model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import (
    Clock,
    HistoryResult,
    NodeName,
    PodMarks,
    PodRole,
    PoolMetrics,
    PoolName,
    Term,
)
from rebalancer.core.nodestate import Keys, LendSpec, Phase, StateError
from rebalancer.core.outcomes import ActionResult, Outcome


@dataclass
class Views:
    """The informer's cache as the test sets it: every node, whatever the pod marks."""

    nodes: list[model.NodeView]
    broken: dict[str, str] = field(default_factory=dict)  # key -> why it cannot be read
    waiting: list[model.PendingPod] = field(default_factory=list)  # pods no node holds yet

    def node_views(self, marks: PodMarks) -> tuple[model.NodeView, ...]:
        return tuple(self.nodes)

    def pending(self, marks: PodMarks) -> tuple[model.PendingPod, ...]:
        return tuple(
            p
            for p in self.waiting
            if all(model.tolerates(p.tolerations, t) for t in marks.lend_taints)
        )

    def unreadable(self) -> Mapping[str, str]:
        return self.broken

    def get(self, name: str) -> model.NodeView:
        found = [v for v in self.nodes if v.name == name]
        assert found, f"no node {name}"
        return found[0]

    def put(self, view: model.NodeView) -> None:
        """The node as it is now (the informer saw it change)."""
        self.nodes = [view if v.name == view.name else v for v in self.nodes]


class NoHistory:
    """A metrics source that keeps no demand history: every history read is empty."""

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        return HistoryResult(model.DemandHistory.empty(since))


@dataclass
class Demand(NoHistory):
    """Each pool's demand in requests per second, and what is queued (nothing, unless set).

    ``at`` None: every sample is taken at the moment it is read, on ``clock``; set it to make
    the samples stale. A pool without a figure has no sample at all (unknown demand).
    """

    rps: dict[PoolName, float]
    clock: Clock
    at: datetime | None = None
    reads: list[PoolName] = field(default_factory=list)
    queued: dict[PoolName, float] = field(default_factory=dict)  # requests waiting, else 0
    # A pool's demand history, as a function of the time of each step (else none).
    past: dict[PoolName, Callable[[datetime], float]] = field(default_factory=dict)

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        if pool not in self.past:
            return await super().history(pool, nodes, since, until, step)
        count = int((until - since) / step)
        values = [self.past[pool](since + step * i) for i in range(count)]
        return HistoryResult(model.DemandHistory(since, step, values, count))

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        self.reads.append(pool)
        at = self.at if self.at is not None else self.clock()
        if pool not in self.rps:
            return PoolMetrics(pool, None, None)
        queue = model.Sample(self.queued.get(pool, 0.0), at)
        return PoolMetrics(pool, model.Sample(self.rps[pool], at), queue)


@dataclass
class ClockedPrometheus(NoHistory):
    """One pool's demand on a Prometheus whose clock is not the controller's.

    ``clock`` is Prometheus' own (the true time), ``own`` the controller's; it scrapes every
    ``every`` on its own clock (sample times are multiples of it), each sample the rps set for
    the pool at that time (``rps``, changed by the test as time goes; ``stopped``: no sample
    after it). ``read(now=t)`` answers the newest sample at or before ``t``, as the adapter's
    query evaluated at ``t`` does, or none within the 10 minutes of its lookback."""

    clock: Clock
    own: Clock
    rps: dict[PoolName, float]
    every: timedelta = timedelta(seconds=15)
    stopped: datetime | None = None
    asked: list[datetime] = field(default_factory=list)  # the evaluation times of the reads
    estimator: clocks.Estimator = field(
        default_factory=lambda: clocks.Estimator(clocks.Against.PROMETHEUS)
    )
    _seen: dict[PoolName, list[tuple[datetime, float]]] = field(default_factory=dict)

    def scrape(self) -> None:
        """Take this scrape interval's sample of every pool (call it as time moves)."""
        now = self.clock()
        if self.stopped is not None and now > self.stopped:
            return
        at = now - timedelta(seconds=now.timestamp() % self.every.total_seconds())
        for pool, value in self.rps.items():
            samples = self._seen.setdefault(pool, [])
            if not samples or samples[-1][0] < at:
                samples.append((at, value))

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        self.scrape()
        when = self.clock() if now is None else now
        self.asked.append(when)
        older = [(t, v) for t, v in self._seen.get(pool, []) if when - LOOKBACK <= t <= when]
        if not older:
            return PoolMetrics(pool, None, None)
        at, value = older[-1]
        return PoolMetrics(pool, model.Sample(value, at), model.Sample(0.0, at))

    async def measure_skew(self, pool: PoolName) -> clocks.Skew | None:
        sent, server, received = self.own(), self.clock(), self.own()
        reading = clocks.Reading(sent, received, server, clocks.MILLISECOND)
        self.estimator = clocks.add(self.estimator, reading)
        return clocks.estimate(self.estimator, self.own())


LOOKBACK = timedelta(minutes=10)


@dataclass
class Calls:
    """A ``NodeActuator`` that does what it is asked and remembers it; changes no node."""

    made: list[tuple[str, str]] = field(default_factory=list)  # (call, node)

    async def lend(self, node: str, decision: str) -> ActionResult:
        self.made.append(("lend", node))
        return ActionResult(node, model.Action.LEND, Outcome.APPLIED, "lent")

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        self.made.append(("reclaim", node))
        return ActionResult(node, model.Action.RECLAIM, Outcome.APPLIED, "serving")

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        self.made.append(("notice", node))
        return ActionResult(node, model.Action.RECLAIM, Outcome.IN_PROGRESS, "told")

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        self.made.append(("withdraw", node))
        return ActionResult(node, model.Action.WITHDRAW, Outcome.APPLIED, "withdrawn")

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        return ActionResult(node, model.Action.PROGRESS, Outcome.NOTHING, "")

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        self.made.append(("remove_earlier", node))
        return ActionResult(node, model.Action.RECLAIM, Outcome.NOTHING, "")

    def of(self, call: str) -> list[str]:
        """The nodes ``call`` was made for, in order."""
        return [n for what, n in self.made if what == call]


@dataclass(frozen=True)
class Call:
    call: str  # "lend", "reclaim", "progress", "remove_earlier"
    node: str
    decision: str | None
    outcome: Outcome
    deadline: datetime | None = None  # a reclaim's


@dataclass
class CodecActuator:
    """A ``NodeActuator`` over the nodes of ``views``, for one pool's lend spec.

    Each call changes the node as the real actuator's writes would, through the codec
    (``nodestate.begin_lend``/``finish_lend``/``begin_reclaim``/``finish``, then ``apply``): a
    lend goes to ``lent`` at once; a reclaim restores the serving taints and, while borrowed pods
    run on the node, leaves it ``reclaiming`` (``waiting``) for a progress pass to evict them and
    finish; a progress pass on a ``lending`` node rolls the lend back. A call on a node in the
    wrong phase is refused and changes nothing, as the real one refuses.
    """

    views: Views
    spec: LendSpec
    clock: Clock
    keys: Keys = field(default_factory=Keys)
    calls: list[Call] = field(default_factory=list)
    answering: bool = True  # a node's pods answer a notice at once; False: never

    async def lend(self, node: str, decision: str) -> ActionResult:
        view, now = self.views.get(node), self.clock()
        if self._phase(view) is not Phase.SERVING:
            return self._done("lend", node, decision, Outcome.REFUSED, "not serving")
        begin = nodestate.begin_lend(view, self.spec, self.keys, now, decision)
        begun = nodestate.apply(view, begin)
        finish = nodestate.finish_lend(self.spec, self._state(begun), self.keys, now)
        self.views.put(nodestate.apply(begun, finish))
        return self._done("lend", node, decision, Outcome.APPLIED, "lent")

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        view, now = self.views.get(node), self.clock()
        if isinstance(nodestate.read_in_pool(view, self.keys, self.spec.add_taints), StateError):
            # As the real one: back from the pool's specification, then drained and finished.
            change = nodestate.begin_restore_from_spec(
                view, self.spec, self.keys, now, deadline, decision
            )
            self.views.put(nodestate.apply(view, change))
            return self._finish("reclaim", node, decision, deadline)
        if self._phase(view) is not Phase.LENT:
            return self._done("reclaim", node, decision, Outcome.REFUSED, "not lent", deadline)
        change = nodestate.begin_reclaim(
            self._state(view),
            self.keys,
            now,
            deadline,
            decision,
            taints=view.taints,
            spec=self.spec,
        )
        self.views.put(nodestate.apply(view, change))
        if any(p.role is PodRole.BORROWED for p in view.pods):
            return self._done("reclaim", node, decision, Outcome.IN_PROGRESS, "draining", deadline)
        return self._finish("reclaim", node, decision, deadline)

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """The node stays lent, told; its pods answer at once (``progress`` then reclaims),
        unless ``answering`` is off."""
        view = self.views.get(node)
        if self._phase(view) is not Phase.LENT:
            return self._done("notice", node, decision, Outcome.REFUSED, "not lent", deadline)
        self.views.put(nodestate.apply(view, nodestate.notice(self.keys, deadline, decision)))
        return self._done("notice", node, decision, Outcome.IN_PROGRESS, "told", deadline)

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        view = self.views.get(node)
        state = nodestate.read(view, self.keys)
        if not isinstance(state, nodestate.NodeState) or not state.noticed:
            return self._done("withdraw", node, decision, Outcome.NOTHING, "no notice")
        self.views.put(nodestate.apply(view, nodestate.withdraw(self.keys, decision)))
        return self._done("withdraw", node, decision, Outcome.APPLIED, "withdrawn")

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        view = self.views.get(node)
        if decision is not None:  # the transition changes hands (a recovery's intent)
            view = nodestate.apply(view, nodestate.take_over(self.keys, decision))
            self.views.put(view)
        state = nodestate.read(view, self.keys)
        if isinstance(state, nodestate.NodeState) and state.noticed:
            if not self.answering:
                return self._done("progress", node, decision, Outcome.IN_PROGRESS, "told")
            return self._finish("progress", node, decision)
        if self._phase(view) not in (Phase.LENDING, Phase.RECLAIMING):
            return self._done("progress", node, decision, Outcome.NOTHING, "nothing in flight")
        return self._finish("progress", node, decision)

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        """Nothing to remove: the views' pods carry no bind time before their node's."""
        self.calls.append(Call("remove_earlier", node, decision, Outcome.NOTHING, deadline))
        return ActionResult(node, model.Action.RECLAIM, Outcome.NOTHING, "none")

    def of(self, call: str) -> list[str]:
        """The nodes ``call`` was made for, in order."""
        return [c.node for c in self.calls if c.call == call]

    def _finish(
        self, call: str, node: str, decision: str | None, deadline: datetime | None = None
    ) -> ActionResult:
        """Borrowed pods evicted (gone at once), then the node back to serving."""
        view = self.views.get(node)
        kept = [p for p in view.pods if p.role is not PodRole.BORROWED]
        change = nodestate.finish(
            self._state(view), self.keys, self.clock(), taints=view.taints, spec=self.spec
        )
        self.views.put(dataclasses.replace(nodestate.apply(view, change), pods=tuple(kept)))
        return self._done(call, node, decision, Outcome.APPLIED, "serving", deadline)

    def _done(
        self,
        call: str,
        node: str,
        decision: str | None,
        outcome: Outcome,
        message: str,
        deadline: datetime | None = None,
    ) -> ActionResult:
        self.calls.append(Call(call, node, decision, outcome, deadline))
        action = model.Action.RECLAIM if call == "notice" else model.Action(call)
        return ActionResult(node, action, outcome, message)

    def _state(self, view: model.NodeView) -> nodestate.NodeState:
        state = nodestate.read(view, self.keys)
        assert isinstance(state, nodestate.NodeState), f"{view.name}: {state}"
        return state

    def _phase(self, view: model.NodeView) -> Phase | None:
        state = nodestate.read(view, self.keys)
        return state.phase if isinstance(state, nodestate.NodeState) else None


@dataclass
class Lead:
    """Leadership as the test scripts it: ``answers`` first, then ``leading``."""

    clock: Clock
    leading: bool = True
    answers: deque[bool] = field(default_factory=deque)
    identity: str = "replica-a"
    term: Term | None = None

    @property
    def now(self) -> Clock:
        return self.clock

    def may_write(self, now: datetime) -> bool:
        return self.answers.popleft() if self.answers else self.leading


Entry = tuple[str, str, str, str]  # ("audit", kind, id, node) or ("node", name, decision, state)


class JournalStore(MemoryAuditStore):
    """The in-memory audit store, noting each record it takes in ``journal`` as it takes it."""

    def __init__(self, journal: list[Entry]) -> None:
        super().__init__()
        self.journal = journal

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        await super().append(batch)
        for r in batch:
            self.journal.append(("audit", r.kind.value, r.id, r.node or ""))


class Scripted:
    """A strategy whose answer (or failure) the test sets; ``gate`` makes it block.

    ``answer`` None: lend every node of the pool; an exception: raise it; anything else is
    returned as it is (garbage included, to see what the Reconciler makes of it).
    """

    name: ClassVar[str] = "scripted"
    reads_history: ClassVar[bool] = False

    def __init__(self, answer: Any = None, gate: threading.Event | None = None) -> None:
        self.answer, self.gate, self.calls = answer, gate, 0

    def decide(self, pool: model.PoolView) -> model.Proposal:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(timeout=30)
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is None:
            return model.Proposal(pool.size, "lend everything")
        answer: model.Proposal = self.answer
        return answer
