"""The actuator: the only code that writes to the cluster (docs/design/actuator.md).

Where it sits: the planner's steps come here (``lend``, ``reclaim``), each tick drives the node
transitions in flight (``progress``), and start-up ends whatever a crash left half done
(``recover``). It reads the node again before every step, computes the writes with the pure
transitions of ``core.nodestate``, and sends them through a ``NodeWriter``.

Why it is shaped like this:
- Every node write carries the resourceVersion just read. A 409 means someone else changed the
  node: the step stops there and says so (``Outcome.CONFLICT``); the planner re-plans on fresh
  state next tick. A 409 is never retried blindly.
- The order of writes is chosen so that a crash between any two leaves a node ``recover`` can end:
  ``begin_lend`` records the originals before anything that changes scheduling, ``begin_reclaim``
  restores taints and labels before any pod is evicted, and ``finish`` comes only when no borrowed
  pod is left. See docs/design/actuator.md for each crash point.
- The controller is not the only writer on the node: a restore undoes only what the lend
  changed and keeps every other writer's taints (``nodestate.restore``); the result names them.
- A drain takes the pods that landed during the loan and nothing else (``_taken``): neither
  inference nor a DaemonSet's (nor a static pod's mirror). A lend needs the node idle, so
  every such pod came during the loan, whether it tolerates the lent taint or landed because
  someone removed it. Evictions go through the Eviction API
  (PodDisruptionBudgets honoured, 429 means wait), and only past the deadline are the pods left
  deleted with grace 0. A pod bound to the name before this node was created belongs to an
  earlier node of that name: it is deleted at once, as the pod garbage collector would have.
- A node is known by its UID: a step or pass for one incarnation of a name finds another (the
  node was deleted and re-created) or none (deleted) and writes no node; the loan it was for
  is over, and the pods it took, still bound to the name, are removed as a drain removes them
  (evicted, and deleted past the deadline) before it ends ``gone``: a kubelet re-registering
  under the name would run them on a node that serves. ``remove_earlier`` does the same for
  the borrowed pods a tick finds on a node created after they were bound, whatever happened in
  between (docs/design/other-writers.md).
- Every call returns an ``ActionResult`` naming each write it made (or, in dry-run mode, would
  make, with the exact body) so the audit log can record it.

What it reads from the informer's cache, and what it asks the server again (a wave of 100
lends must not queue 600 requests behind each other; docs/design/actuator.md):
- the node and its pods before a step come from the cache (``NodeCache``) when it holds them.
  That is safe because every node write is locked to the resourceVersion read: a cache behind
  the server makes the write a 409, never a write over a change it did not see;
- pods do not change a node's resourceVersion, so what a lend's safety needs of them is asked
  of the server: once ``begin_lend`` has marked the node, its pods are listed there, and a
  node that is not idle after all is rolled back;
- a drain lists the node's pods on the server (it evicts what is there, not what the cache
  saw), and lists them again before ``finish``: a node goes back to serving only when the
  server holds no borrowed pod on it;
- a reclaim, or a pass over a node in flight, whose cached read meets a 409, or finds nothing
  to do, reads the node from the server and tries once more at once: giving inference its
  node back must not wait a tick for a cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from rebalancer.adapters import convert, evictionrequests, noticing
from rebalancer.adapters.evictionrequests import EvictionRequests, Target
from rebalancer.adapters.writer import (
    Conflict,
    NodeWriter,
    NotFound,
    WriteError,
    annotations_patch,
    condition_patch,
    delete_body,
    eviction_body,
    merge_patch,
)
from rebalancer.core import model, nodestate, notice, victims
from rebalancer.core.model import Clock
from rebalancer.core.nodestate import Keys, LendSpec, NodeChange, NodeState, Phase
from rebalancer.core.outcomes import (
    ActionResult,
    Notice,
    Outcome,
    Write,
    WriteKind,
    WriteOutcome,
)

Obj = dict[str, Any]


@dataclass
class _Pass:
    """What one call has written so far, so that an abort still reports it."""

    node: str
    action: model.Action
    dry_run: bool
    writes: list[Write] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # other writers' taints a restore kept
    notes: list[str] = field(default_factory=list)  # what else the result must say
    held: tuple[str, ...] = ()  # pods a finalizer holds past the deadline
    notice: Notice | None = None  # a reclaim's notice, once its evictions begin

    def result(self, outcome: Outcome, message: str) -> ActionResult:
        for note in self.notes:
            message += f"; {note}"
        if self.kept:
            message += f"; kept taints other writers own: {', '.join(dict.fromkeys(self.kept))}"
        if self.dry_run and outcome in (Outcome.APPLIED, Outcome.IN_PROGRESS):
            outcome, message = Outcome.WOULD_APPLY, self._would(message)
        return ActionResult(
            self.node,
            self.action,
            outcome,
            message,
            tuple(self.writes),
            self.dry_run,
            kept=tuple(dict.fromkeys(self.kept)),
            held=self.held,
            notice=self.notice,
        )

    def _would(self, message: str) -> str:
        """A dry run's words for a change it did not make: ``would lend (lent): 2 writes not
        sent``."""
        verb = _WOULD[self.action]
        count = len(self.writes)
        return f"would {verb} ({message}): {count} write{'s' * (count != 1)} not sent"


_WOULD = {
    model.Action.LEND: "lend",
    model.Action.RECLAIM: "reclaim",
    model.Action.WITHDRAW: "withdraw the notice",
    model.Action.PROGRESS: "drive on",
}


class NodeCache(Protocol):
    """``adapters.informer.Informer``: a node with its pods under a pool's marks, as cached;
    None when it does not hold it (or has not synced)."""

    def view(self, name: str, marks: model.PodMarks) -> model.NodeView | None: ...


class NoCache:
    """Every read goes to the server (an operator's command runs no informer)."""

    def view(self, name: str, marks: model.PodMarks) -> model.NodeView | None:
        return None


@dataclass(frozen=True, slots=True)
class _Pod:
    view: model.PodView
    uid: str
    bound: datetime | None = None  # its PodScheduled condition's time, else its creation
    finalizers: tuple[str, ...] = ()
    grace: int | None = None  # the grace period of a deletion under way
    mirror: bool = False  # a static pod's mirror: the kubelet owns it, no API call removes it
    told: noticing.Told = field(default_factory=noticing.Told)


class Actuator:
    def __init__(
        self,
        writer: NodeWriter,
        keys: Keys,
        spec: LendSpec,
        marks: model.PodMarks,
        clock: Clock,
        dry_run: bool = False,
        cache: NodeCache | None = None,
        drain: timedelta = timedelta(minutes=2),
        requests: EvictionRequests | None = None,
    ) -> None:
        self._writer, self._keys, self._spec, self._marks = writer, keys, spec, marks
        self._clock, self._dry_run = clock, dry_run
        self._cache = cache or NoCache()
        self._drain_time = drain  # the pool's reclaim_deadline: a drain's time, from its start
        # Where the cluster serves EvictionRequests, a notice is filed as one per pod too
        # (docs/design/eviction-requests.md); whether it does is asked once it matters.
        self._requests = requests
        self._served: bool | None = None

    # -----------------------------------------------------------------------------------------
    # The public steps: each catches the writer's errors and turns them into a result

    async def lend(self, node: str, decision: str) -> ActionResult:
        run = _Pass(node, model.Action.LEND, self._dry_run)
        return await self._guarded(run, self._lend(run, decision))

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """Take the node back. With ``uid``, only that incarnation of the name: another one
        (the node was deleted and re-created) ends the step ``gone``, with no write."""
        run = _Pass(node, model.Action.RECLAIM, self._dry_run)
        step = self._reclaim(run, decision, deadline, uid)
        return await self._guarded(run, self._unless_deleted(run, step, uid, deadline))

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        """Begin a reclaim with a notice: the lent node's borrowed pods are told that they
        must be gone by ``deadline`` (``decision``, the notice's record, is the reclaim id they
        are told); the reclaim itself begins when they have answered, or at the deadline less
        their grace (``progress`` drives it on). A node that is not a verified loan is taken
        back at once, as ``reclaim`` takes it (docs/design/reclaim-notice.md)."""
        run = _Pass(node, model.Action.RECLAIM, self._dry_run)
        step = self._notice(run, decision, deadline, uid)
        return await self._guarded(run, self._unless_deleted(run, step, uid, deadline))

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        """Withdraw a node's notice: its pods are untold first, then the node's deadline goes
        (so that a pass cut short leaves a notice that goes on, never a pod told of a notice
        the node does not carry); ``decision`` records why. The node stays lent."""
        run = _Pass(node, model.Action.WITHDRAW, self._dry_run)
        return await self._guarded(run, self._withdraw(run, decision))

    async def _unless_deleted(
        self, run: _Pass, step: Any, uid: str | None, deadline: datetime | None
    ) -> ActionResult:
        """``step``; when the node turns out deleted (a 404) and the call was for one
        incarnation of it (``uid``), the pods that node took are removed instead."""
        try:
            result: ActionResult = await step
        except NotFound:
            if not uid:
                raise
            return await self._end_earlier(run, None, uid, deadline)
        return result

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        """Drive a node in flight one pass on. With ``decision`` (a recovery's intent), the
        transition is first taken over by it, so its remaining writes name that record; with
        ``uid``, only that incarnation of the name is driven: when it was replaced or deleted,
        the pods it took are removed (evicted before ``deadline``, deleted after it or without
        one) and the pass ends ``gone`` once none is left."""
        run = _Pass(node, model.Action.PROGRESS, self._dry_run)
        step = self._progress(run, None, decision, uid, deadline)
        return await self._guarded(run, self._unless_deleted(run, step, uid, deadline))

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        """Remove the borrowed pods bound to ``node``'s name before the node there now was
        created (``victims.left_by_earlier_node``; all those bound to the name when it has no
        node): evicted before ``deadline``, deleted after it, as a drain's. No node is written.
        ``applied`` once none is left, ``nothing`` when there was none."""
        run = _Pass(node, model.Action.RECLAIM, self._dry_run)
        return await self._guarded(run, self._remove_earlier(run, deadline))

    async def _guarded(self, run: _Pass, step: Any) -> ActionResult:
        try:
            result: ActionResult = await step
        except Conflict as exc:
            return run.result(Outcome.CONFLICT, f"{exc}; re-plan on a fresh read")
        except NotFound as exc:
            return run.result(Outcome.GONE, str(exc))
        except WriteError as exc:  # ApiFailure: refused, or retries exhausted
            return run.result(Outcome.FAILED, str(exc))
        return result

    # -----------------------------------------------------------------------------------------
    # Lend: serving -> lending -> lent

    async def _lend(self, run: _Pass, decision: str) -> ActionResult:
        view, state = await self._read_node(run.node)
        if isinstance(state, nodestate.StateError):
            return run.result(Outcome.REFUSED, f"unreadable state: {state}")
        if self._keys.original in view.annotations:
            # Never overwritten: it may be the only record of what the node served with.
            return run.result(Outcome.REFUSED, f"node carries {self._keys.original} already")
        if state.phase is not Phase.SERVING or not state.verified:
            return run.result(Outcome.REFUSED, f"node is {state.phase.value}, not serving")
        if not view.idle:
            return run.result(Outcome.REFUSED, f"node is not idle: {_busy(view)}")
        now = self._clock()
        begin = nodestate.begin_lend(view, self._spec, self._keys, now, decision)
        after = await self._patch(run, WriteKind.BEGIN_LEND, view, begin)
        lending = nodestate.read(after, self._keys)
        assert isinstance(lending, NodeState)
        if not self._dry_run:
            # A pod may have landed since the first read: the state label changes no scheduling.
            again = await self._pods(run.node)
            busy = model.NodeView(after.name, after.labels, after.taints, pods=_views(again))
            if not busy.idle:
                await self._patch(run, WriteKind.FINISH, after, self._finish(run, after, lending))
                return run.result(Outcome.REFUSED, f"node became busy: {_busy(busy)}; rolled back")
        finish = nodestate.finish_lend(self._spec, lending, self._keys, now)
        await self._patch(run, WriteKind.FINISH_LEND, after, finish)
        return run.result(Outcome.APPLIED, "lent")

    # -----------------------------------------------------------------------------------------
    # Notice: lent -> noticed -> (the pods answered, or their time is up) -> reclaiming

    async def _notice(
        self, run: _Pass, decision: str, deadline: datetime, uid: str | None, cached: bool = True
    ) -> ActionResult:
        view, state = await self._read_node(run.node, cached, with_pods=False)
        if _replaced(view, uid):
            if cached:
                return await self._notice(run, decision, deadline, uid, cached=False)
            assert uid is not None
            return await self._end_earlier(run, view, uid, deadline)
        loan = isinstance(state, NodeState) and state.verified and state.phase is Phase.LENT
        if not isinstance(state, NodeState) or not loan:  # as any reclaim, at once
            return await self._reclaim(run, decision, self._clock() + self._drain_time, uid, cached)
        if state.noticed:
            return await self._told(run, view, state)
        try:
            after = await self._patch(
                run, WriteKind.NOTICE, view, nodestate.notice(self._keys, deadline, decision)
            )
        except Conflict:
            if not cached:
                raise
            return await self._notice(run, decision, deadline, uid, cached=False)
        noticed = nodestate.read(after, self._keys)
        assert isinstance(noticed, NodeState)
        assert noticed.noticed
        return await self._told(run, after, noticed)

    async def _told(self, run: _Pass, view: model.NodeView, state: NodeState) -> ActionResult:
        """One pass over a node under notice: every borrowed pod told (once), and, when they
        have all answered or the deadline less their grace has come, the reclaim begun."""
        reclaim, deadline = state.decision or "", state.deadline
        assert deadline is not None
        pods = [p for p in await self._pods(run.node, ended=True) if _taken(p)]
        await self._tell(run, [p for p in pods if not p.told.ended], reclaim, deadline)
        now = self._clock()
        answers = [
            dataclasses.replace(answer, acked=True)
            if not answer.answered and await self._responded(run, p)
            else answer
            for p, answer in [(p, p.told.answer(reclaim)) for p in pods]
        ]
        why = notice.due(now, deadline, answers)
        if why is None:
            start = notice.begins(deadline, answers)
            answered = sum(1 for a in answers if a.answered)
            return run.result(
                Outcome.IN_PROGRESS,
                f"notice {reclaim}: {len(pods)} pod(s) told, {answered} answered; evictions "
                f"begin at {nodestate.format_time(start or now)}, deadline "
                f"{nodestate.format_time(deadline)}",
            )
        if self._dry_run:
            return run.result(Outcome.IN_PROGRESS, f"notice {reclaim} over: {why}")
        run.notice = notice.summary(reclaim, now, answers, why)
        change = nodestate.begin_reclaim(
            state,
            self._keys,
            now,
            now + self._drain_time,
            reclaim,
            taints=view.taints,
            spec=self._spec,
        )
        run.notes.append(f"notice {reclaim} over: {why}")
        return await self._drain(run, *await self._begin_reclaim(run, view, change))

    async def _tell(
        self, run: _Pass, pods: Sequence[_Pod], reclaim: str, deadline: datetime
    ) -> None:
        """Tell each pod not told of ``reclaim`` yet: its annotations, then its condition."""
        for pod in pods:
            if pod.told.of(reclaim) and pod.told.since is not None:
                continue
            notes = noticing.tell(self._keys, reclaim, deadline)
            condition = noticing.condition(self._keys, reclaim, deadline)
            await self._pod_write(run, pod, WriteKind.TELL, notes, condition)
            await self._request(run, pod, evictionrequests.Intent.EVICTION)

    async def _request(self, run: _Pass, pod: _Pod, intent: evictionrequests.Intent) -> None:
        """File (or withdraw) the pod's EvictionRequest where the cluster serves them. A
        request the API refuses is noted and the notice goes on: the annotations are the
        protocol, the request a courtesy to whoever responds to it."""
        requests = self._requests
        if requests is None or not await self._serves_requests(run):
            return
        target = Target(pod.view.namespace, pod.view.name, pod.uid)
        body = evictionrequests.request_body(requests.requester, target, intent)
        where = f"evictionrequest/{pod.view.namespace}/{pod.view.name}"
        outcome = WriteOutcome.PLANNED
        if not self._dry_run:
            try:
                if intent is evictionrequests.Intent.EVICTION:
                    await requests.request(target)
                else:
                    await requests.withdraw(target)
                outcome = WriteOutcome.APPLIED
            except WriteError as exc:
                run.notes.append(f"{where}: {exc}")
                return
        run.writes.append(Write(WriteKind.REQUEST, where, body, outcome))

    async def _serves_requests(self, run: _Pass) -> bool:
        """Whether the cluster serves EvictionRequests, asked once (an answer that fails is
        asked again next time, and counts as no)."""
        if self._served is None and self._requests is not None:
            try:
                self._served = await self._requests.served()
            except WriteError as exc:
                run.notes.append(f"whether EvictionRequests are served is not known: {exc}")
                return False
        return bool(self._served)

    async def _responded(self, run: _Pass, pod: _Pod) -> bool:
        """Whether the pod's EvictionRequest says its responders are done with it (only once
        a controller handles the request: ``RequestState.answered``)."""
        requests = self._requests
        if requests is None or not await self._serves_requests(run):
            return False
        target = Target(pod.view.namespace, pod.view.name, pod.uid)
        try:
            state = await requests.state(target)
        except WriteError as exc:
            run.notes.append(f"evictionrequest/{target.namespace}/{target.name}: {exc}")
            return False
        return state is not None and state.answered()

    async def _pod_write(
        self,
        run: _Pass,
        pod: _Pod,
        kind: WriteKind,
        notes: Mapping[str, str | None],
        condition: Mapping[str, str],
    ) -> None:
        """A pod's notice annotations, then its condition: a pod re-created under its name
        (or gone) is written no further."""
        ns, name = pod.view.namespace, pod.view.name
        target = f"pod/{ns}/{name}"
        outcome = WriteOutcome.PLANNED
        if not self._dry_run:
            done = await self._writer.annotate_pod(ns, name, pod.uid, notes)
            outcome = WriteOutcome.APPLIED if done else WriteOutcome.GONE
        run.writes.append(Write(kind, target, annotations_patch(pod.uid, notes), outcome))
        if outcome is WriteOutcome.GONE:
            return
        if not self._dry_run:
            done = await self._writer.set_pod_condition(ns, name, pod.uid, condition)
            outcome = WriteOutcome.APPLIED if done else WriteOutcome.GONE
        body = condition_patch(pod.uid, condition, None, self._clock())
        run.writes.append(Write(WriteKind.CONDITION, target, body, outcome))

    async def _withdraw(self, run: _Pass, decision: str, cached: bool = True) -> ActionResult:
        view, state = await self._read_node(run.node, cached, with_pods=False)
        if isinstance(state, nodestate.StateError) or not state.verified or not state.noticed:
            if cached:  # the server says so first
                return await self._withdraw(run, decision, cached=False)
            phase = "unreadable" if isinstance(state, nodestate.StateError) else state.phase.value
            return run.result(Outcome.NOTHING, f"node is {phase}, under no notice to withdraw")
        reclaim = state.decision or ""
        for pod in await self._pods(run.node):
            if _taken(pod) and pod.told.of(reclaim):
                condition = noticing.condition(self._keys, reclaim, None)
                await self._pod_write(
                    run, pod, WriteKind.TELL, noticing.untell(self._keys), condition
                )
                await self._request(run, pod, evictionrequests.Intent.WITHDRAWN)
        try:
            await self._patch(
                run, WriteKind.WITHDRAW, view, nodestate.withdraw(self._keys, decision)
            )
        except Conflict:
            if not cached:
                raise
            return await self._withdraw(run, decision, cached=False)
        return run.result(Outcome.APPLIED, f"notice {reclaim} withdrawn: the node stays lent")

    # -----------------------------------------------------------------------------------------
    # Reclaim: lent -> reclaiming -> (evict, then after the deadline delete) -> serving

    async def _reclaim(
        self,
        run: _Pass,
        decision: str,
        deadline: datetime,
        uid: str | None,
        cached: bool = True,
    ) -> ActionResult:
        view, state = await self._read_node(run.node, cached, with_pods=False)
        if _replaced(view, uid):
            if cached:  # a cache behind the server may not have seen the new node yet
                return await self._reclaim(run, decision, deadline, uid, cached=False)
            assert uid is not None
            return await self._end_earlier(run, view, uid, deadline)
        if isinstance(state, nodestate.StateError):
            # Its own original cannot be read: back from the pool's specification, then the
            # drain and finish of any reclaim (docs/design/other-writers.md).
            change = nodestate.begin_restore_from_spec(
                view, self._spec, self._keys, self._clock(), deadline, decision
            )
            return await self._drain(run, *await self._begin_reclaim(run, view, change))
        if not state.verified:
            # Not provably its own: never acted on as written, in whatever phase it says it
            # is; back within what the pool's specification confirms, then drained and
            # finished as any reclaim (docs/design/node-state-integrity.md).
            change = nodestate.begin_restore_confirmed(
                view, state, self._spec, self._keys, self._clock(), deadline, decision
            )
            return await self._drain(run, *await self._begin_reclaim(run, view, change))
        if state.phase in (Phase.LENDING, Phase.RECLAIMING):  # already on its way
            seen = None if cached else (view, state)
            return await self._progress(run, seen, None, uid, deadline)
        if state.phase is not Phase.LENT:
            if cached:  # nothing to do on the cache's word: the server says so first
                return await self._reclaim(run, decision, deadline, uid, cached=False)
            return run.result(Outcome.NOTHING, "node is already serving")
        change = nodestate.begin_reclaim(
            state,
            self._keys,
            self._clock(),
            deadline,
            decision,
            taints=view.taints,
            spec=self._spec,
        )
        try:
            begun = await self._begin_reclaim(run, view, change)
        except Conflict:
            if not cached:
                raise
            run.kept.clear()  # what the server's node holds is judged again
            return await self._reclaim(run, decision, deadline, uid, cached=False)
        return await self._drain(run, *begun, lent=state)

    def _unnoticed(self, lent: NodeState, state: NodeState, pods: Sequence[_Pod]) -> Notice:
        """What a reclaim (``state``) that did not wait costs the pods of the loan it began
        from (``lent``): none given, or the notice they were told of cut short."""
        if lent.noticed:
            told = lent.decision or ""
            answers = [p.told.answer(told) for p in pods]
            return notice.summary(told, self._clock(), answers, f"notice {told} cut short")
        reclaim = state.decision or ""
        answers = [p.told.answer(reclaim) for p in pods]
        return notice.summary(reclaim, self._clock(), answers, "no notice")

    async def _begin_reclaim(
        self, run: _Pass, view: model.NodeView, change: nodestate.NodeChange
    ) -> tuple[model.NodeView, NodeState]:
        """A reclaim's first write (taints and labels back, so nothing new lands), and the
        state it leaves, signed by that write: what the drain goes on from."""
        run.kept.extend(str(t) for t in change.kept)
        after = await self._patch(run, WriteKind.BEGIN_RECLAIM, view, change)
        reclaiming = nodestate.read(after, self._keys)
        assert isinstance(reclaiming, NodeState)
        assert reclaiming.verified
        return after, reclaiming

    async def _progress(
        self,
        run: _Pass,
        seen: tuple[model.NodeView, NodeState] | None,
        decision: str | None = None,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        if seen is not None:
            return await self._carry_on(run, *seen, decision)
        for cached in (True, False):
            view, state = await self._read_node(run.node, cached, with_pods=False)
            if _replaced(view, uid):
                if cached:
                    continue  # the server says so first
                assert uid is not None
                return await self._end_earlier(run, view, uid, deadline)
            if isinstance(state, nodestate.StateError):
                return run.result(Outcome.REFUSED, f"unreadable state: {state}")
            if not state.verified:  # the planner's safety reclaim takes it back
                return run.result(Outcome.REFUSED, f"unverified state: {state.drift[0]}")
            try:
                result = await self._carry_on(run, view, state, decision)
                if result.outcome is not Outcome.NOTHING or not cached:
                    return result
                # Nothing in flight on the cache's word: the server says so first.
            except Conflict:
                # A node in flight is being given back (or rolled back): a cache behind the
                # server must not hold that up a tick. Its writes are level-based, so a second
                # pass from the server's node repeats none of them wrongly.
                if not cached:
                    raise
        raise AssertionError("unreachable: the pass from the server returns or raises")

    async def _carry_on(
        self, run: _Pass, view: model.NodeView, state: NodeState, decision: str | None
    ) -> ActionResult:
        in_flight = state.phase in (Phase.LENDING, Phase.RECLAIMING)
        if decision is not None and in_flight and state.decision != decision:
            view = await self._patch(
                run, WriteKind.TAKE_OVER, view, nodestate.take_over(self._keys, decision)
            )
            taken = nodestate.read(view, self._keys)
            assert isinstance(taken, NodeState)
            state = taken
        if state.phase is Phase.LENDING:
            # An unfinished lend (a crash, a 409) is rolled back, never finished: the plan that
            # asked for it is stale, and rolling back only restores what begin_lend recorded.
            await self._patch(run, WriteKind.FINISH, view, self._finish(run, view, state))
            return run.result(Outcome.APPLIED, "rolled back an unfinished lend")
        if state.noticed:
            return await self._told(run, view, state)
        if state.phase is not Phase.RECLAIMING:
            return run.result(Outcome.NOTHING, f"node is {state.phase.value}: nothing in flight")
        return await self._drain(run, view, state)

    async def _drain(
        self,
        run: _Pass,
        view: model.NodeView,
        state: NodeState,
        lent: NodeState | None = None,
    ) -> ActionResult:
        """One pass: evict (before the deadline) or delete (after) the pods that landed during
        the loan, and delete at once those bound to an earlier node of this name; when none is
        left, finish. A missing deadline counts as passed: fail toward inference. The first
        pass of a reclaim that did not wait for its pods (``lent``: the loan it began from)
        says what that cost them (``run.notice``)."""
        listed = await self._pods(run.node, ended=lent is not None)
        if lent is not None and not self._dry_run:
            run.notice = self._unnoticed(lent, state, [p for p in listed if _taken(p)])
        pods = [p for p in listed if not p.told.ended]
        taken = [p for p in pods if _taken(p)]
        if taken:
            past = state.deadline is None or self._clock() >= state.deadline
            stale = [p for p in taken if _earlier(p, view)]
            blocked = 0
            if stale and not self._dry_run:
                names = ", ".join(f"{p.view.namespace}/{p.view.name}" for p in stale)
                run.notes.append(f"deleted pod(s) bound to an earlier node of this name: {names}")
            # Deletions with grace 0 asked for before this pass: only such a pod still there is
            # held by its finalizers. One this pass deletes is not, yet: a Job's pod keeps the
            # Job controller's finalizer until its kubelet reports it stopped.
            asked = {p.uid for p in taken if p.grace == 0}
            if past:
                await self._delete(run, taken)
            else:
                await self._delete(run, stale)
                fresh = [p for p in taken if p not in stale]
                blocked = await self._evict(run, fresh)
            if self._dry_run:
                return run.result(Outcome.IN_PROGRESS, "borrowed pods would be evicted or deleted")
            # What the writes did: pods deleted at once, or still terminating.
            pods = await self._pods(run.node)
            left = [p for p in pods if _taken(p)]
            if left:
                why = self._left(run, left, blocked, past, asked)
                return run.result(Outcome.IN_PROGRESS, why)
        await self._patch(run, WriteKind.FINISH, view, self._finish(run, view, state))
        return run.result(Outcome.APPLIED, "reclaimed: serving again")

    async def _end_earlier(
        self, run: _Pass, view: model.NodeView | None, uid: str, deadline: datetime | None
    ) -> ActionResult:
        """The loan of the node ``uid``, replaced by ``view`` or deleted (``view`` None), is
        over, and so is its drain; the pods it took, still bound to the name, are removed (the
        kubelet of a node created again under the name would run them on a node that serves).
        With a new node, only those bound no later than the second it was created (the API's
        times are whole seconds, and a node may be replaced within the second a pod was bound
        to the old one): a pod the drain takes is never placed on a new, serving node by the
        scheduler, so one bound in that second was bound to the old node."""
        if view is None:
            note = f"node {run.node} (uid {uid}) was deleted"
        else:
            note = _replaced_note(view, uid)

        def left(pod: _Pod) -> bool:
            return _taken(pod) and (view is None or _earlier(pod, view, or_same=True))

        return await self._remove(run, left, deadline, Outcome.GONE, note, note)

    async def _remove_earlier(self, run: _Pass, deadline: datetime) -> ActionResult:
        try:
            view: model.NodeView | None
            view, _ = await self._read_node(run.node, cached=False, with_pods=False)
        except NotFound:
            view = None  # deleted again: every pod bound to the name is an earlier node's

        def left(pod: _Pod) -> bool:
            borrowed = pod.view.role is model.PodRole.BORROWED
            return borrowed and (view is None or _earlier(pod, view))

        done = "no borrowed pod bound to an earlier node of this name is left"
        going = "borrowed pods bound to an earlier node of this name"
        return await self._remove(run, left, deadline, Outcome.APPLIED, done, going)

    async def _remove(
        self,
        run: _Pass,
        left: Callable[[_Pod], bool],
        deadline: datetime | None,
        done: Outcome,
        note: str,
        going: str,
    ) -> ActionResult:
        """One pass over the pods ``left`` says an earlier node of the name left: evicted
        (before ``deadline``) or deleted (after it, or with none), as a drain's. ``done`` with
        ``note`` once none is left; ``in_progress``, its message led by ``going``, while any
        is."""
        found = [p for p in await self._pods(run.node) if left(p)]
        if not found:
            return run.result(done, note)
        past = deadline is None or self._clock() >= deadline
        asked = {p.uid for p in found if p.grace == 0}
        blocked = 0
        if past:
            acted = [p for p in found if p.grace != 0]
            await self._delete(run, acted)
        else:
            acted = [p for p in found if not p.view.terminating]
            blocked = await self._evict(run, acted)
        if acted and not self._dry_run:
            names = ", ".join(
                f"{p.view.namespace}/{p.view.name}" for p in _cheapest_first(acted, self._clock())
            )
            verb = "deleted" if past else "evicted"
            run.notes.append(f"{verb} pod(s) bound to an earlier node of this name: {names}")
        if self._dry_run:
            return run.result(Outcome.IN_PROGRESS, f"{going}; would be removed")
        still = [p for p in await self._pods(run.node) if left(p)]
        if still:
            return run.result(
                Outcome.IN_PROGRESS, f"{going}: {self._left(run, still, blocked, past, asked)}"
            )
        return run.result(done, note)

    def _left(
        self, run: _Pass, left: Sequence[_Pod], blocked: int, past: bool, asked: set[str]
    ) -> str:
        """What holds the node reclaiming, in words that change only when it does: how many
        pods are left, how many a budget blocks, and, past the deadline, the pods a finalizer
        holds with their finalizers (``run.held``, for a Warning Event of its own): those whose
        deletion with grace 0 was ``asked`` for before this pass."""
        why = f"{len(left)} pod(s) of the loan left, {blocked} blocked by a budget"
        if past:
            run.held = tuple(
                f"{p.view.namespace}/{p.view.name} ({', '.join(p.finalizers)})"
                for p in sorted(left, key=lambda p: (p.view.namespace, p.view.name))
                if p.finalizers and p.uid in asked
            )
            if run.held:
                why += f"; held past the deadline by finalizers: {'; '.join(run.held)}"
        return why

    async def _evict(self, run: _Pass, pods: Sequence[_Pod]) -> int:
        """Evict the pods not yet terminating, cheapest first; how many were blocked."""
        blocked = 0
        for pod in _cheapest_first([p for p in pods if not p.view.terminating], self._clock()):
            outcome = await self._evict_one(run, pod)
            blocked += outcome is WriteOutcome.BLOCKED
        return blocked

    async def _evict_one(self, run: _Pass, pod: _Pod) -> WriteOutcome:
        assert _taken(pod)  # never evict anything else
        ns, name = pod.view.namespace, pod.view.name
        body = eviction_body(ns, name, pod.uid)
        outcome = WriteOutcome.PLANNED
        if not self._dry_run:
            outcome = await self._writer.evict(ns, name, pod.uid)  # evicted, blocked or gone
        run.writes.append(Write(WriteKind.EVICT, f"pod/{ns}/{name}", body, outcome))
        return outcome

    async def _delete(self, run: _Pass, pods: Sequence[_Pod]) -> None:
        """Delete the pods with grace 0, terminating ones too (a shorter grace is allowed); not
        one whose deletion already has grace 0 (a finalizer holds it: asking again changes
        nothing, and would write every pass)."""
        for pod in _cheapest_first([p for p in pods if p.grace != 0], self._clock()):
            assert _taken(pod)  # never delete anything else
            ns, name = pod.view.namespace, pod.view.name
            outcome = WriteOutcome.PLANNED
            if not self._dry_run:
                deleted = await self._writer.delete_pod(ns, name, pod.uid)
                outcome = WriteOutcome.APPLIED if deleted else WriteOutcome.GONE
            body = delete_body(pod.uid)
            run.writes.append(Write(WriteKind.DELETE, f"pod/{ns}/{name}", body, outcome))

    # -----------------------------------------------------------------------------------------
    # Reading and writing one node

    async def _read_node(
        self, name: str, cached: bool = True, with_pods: bool = True
    ) -> tuple[model.NodeView, NodeState | nodestate.StateError]:
        """The node (with its pods, unless ``with_pods`` is false and it is read from the
        server) from the cache when ``cached`` and it holds it, else from the server."""
        view = self._cache.view(name, self._marks) if cached else None
        if view is None:
            raw = await self._writer.get_node(name)
            pods = _views(await self._pods(name)) if with_pods else ()
            view = convert.node_view(raw, pods)
        return view, nodestate.read_in_pool(view, self._keys, self._spec.add_taints)

    async def _pods(self, node: str, ended: bool = False) -> list[_Pod]:
        """The node's pods on the server; with ``ended``, those whose containers ended too."""
        raw = await self._writer.list_pods(node)
        return [_pod(p, self._marks, self._keys) for p in raw if ended or not convert.finished(p)]

    async def _patch(
        self, run: _Pass, kind: WriteKind, view: model.NodeView, change: NodeChange
    ) -> model.NodeView:
        """Send ``change`` locked to the version of ``view``, signed (``nodestate.seal``: every
        write of a key the controller acts on later carries the signature of what it leaves);
        the node as it is afterwards."""
        change = nodestate.seal(view, change, self._keys)
        body = merge_patch(change, view.resource_version)
        if self._dry_run:
            run.writes.append(Write(kind, f"node/{view.name}", body, WriteOutcome.PLANNED))
            # What the node would look like; the next write of this pass is shown against it.
            return nodestate.apply(view, change)
        raw = await self._writer.patch_node(view.name, change, view.resource_version)
        run.writes.append(Write(kind, f"node/{view.name}", body, WriteOutcome.APPLIED))
        return convert.node_view(raw, view.pods)

    def _finish(self, run: _Pass, view: model.NodeView, state: NodeState) -> NodeChange:
        """``finish`` of ``view``; the other writers' taints it keeps are noted for the result."""
        change = nodestate.finish(
            state, self._keys, self._clock(), taints=view.taints, spec=self._spec
        )
        run.kept.extend(str(t) for t in change.kept)
        return change


def _views(pods: Sequence[_Pod]) -> tuple[model.PodView, ...]:
    return tuple(p.view for p in pods)


def _pod(raw: Obj, marks: model.PodMarks, keys: Keys) -> _Pod:
    meta = raw.get("metadata") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    view = convert.pod_view(raw, marks)
    return _Pod(
        view=view,
        uid=str(meta.get("uid", "")),
        bound=convert.bound_time(raw),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        grace=grace if isinstance(grace, int) and meta.get("deletionTimestamp") else None,
        mirror=_MIRROR in (meta.get("annotations") or {}),
        told=noticing.told(raw, view, keys),
    )


_MIRROR = "kubernetes.io/config.mirror"


def _taken(pod: _Pod) -> bool:
    """Whether a drain takes ``pod``: it is neither inference nor a DaemonSet's nor a static
    pod's mirror (the kubelet owns that one). A lend needs the node idle (DaemonSet and borrowed
    pods only), so every other pod landed during the loan, tolerant of the lent taint or not.

    No bind time is compared with the reclaim's ``since``: the one is the API server's clock,
    the other the controller's, and they differ. Nothing is lost by it: once ``begin_reclaim``
    has put the serving taints back, a pod the scheduler places there tolerates them, which
    makes it inference."""
    return pod.view.role not in (model.PodRole.INFERENCE, model.PodRole.DAEMON) and not pod.mirror


def _cheapest_first(pods: Sequence[_Pod], now: datetime) -> list[_Pod]:
    """``victims.eviction_order`` at ``now`` over every pod a drain takes: one that landed
    without tolerating the lent taint costs what a borrowed one does (its job, priority and
    the work it would lose)."""
    by_name = {(p.view.namespace, p.view.name): p for p in pods}
    views = (dataclasses.replace(p.view, role=model.PodRole.BORROWED) for p in pods)
    return [by_name[(v.namespace, v.name)] for v in victims.eviction_order(views, now)]


def _earlier(pod: _Pod, node: model.NodeView, or_same: bool = False) -> bool:
    """Bound to an earlier node of this name: before this one was created (``or_same``: or
    in the same whole second)."""
    if node.created is None or pod.bound is None:
        return False
    return pod.bound <= node.created if or_same else pod.bound < node.created


def _replaced(view: model.NodeView, uid: str | None) -> bool:
    return bool(uid) and bool(view.uid) and view.uid != uid


def _replaced_note(view: model.NodeView, uid: str | None) -> str:
    return (
        f"node {view.name} was replaced: the step was for uid {uid}, the node now is uid "
        f"{view.uid} (deleted and created again under its name)"
    )


def _busy(view: model.NodeView) -> str:
    names = [
        f"{p.namespace}/{p.name} ({p.role.value})"
        for p in view.pods
        if p.role not in (model.PodRole.DAEMON, model.PodRole.BORROWED)
    ]
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
