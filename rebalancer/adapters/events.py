"""Kubernetes Events for what the controller does to a node, and for overrides it refuses.

Where it sits: the reconciler (``runtime.reconcile``) hands the recorder every actuator result
of a leading tick (``await events.action(result)``) and, once per leading tick, the plan
(``await events.findings(plan)``). ``kubectl describe node NAME`` then shows the loan's story
next to the kubelet's own events, and a bad ``rebalancer.io/...`` annotation is reported where
the operator who wrote it looks.

What is recorded (events.k8s.io/v1, ``reportingController`` ``rebalancer.io/controller``):

- a lend completed (``finish_lend`` applied): Normal ``Lent``, action ``Lend``;
- a reclaim began (``begin_reclaim`` applied: serving taints and labels back, the drain
  starts): Normal ``Reclaiming``, action ``Reclaim``;
- a reclaim finished (the node serves again): Normal ``Restored``, action ``Reclaim``;
- an unfinished lend was rolled back: Normal ``LendRolledBack``, action ``Lend``;
- each of the three restores above (``Reclaiming``, ``Restored``, ``LendRolledBack``) names, in
  its note, the taints of other writers it kept (``kept taints other writers own: ...``): the
  restore undoes only what the lend changed (docs/design/actuator.md);
- a drain past its deadline that a finalizer holds (``ActionResult.held``): Warning
  ``DrainBlocked``, action ``Reclaim``, the note naming each pod and its finalizers. Once per
  change: the same pods held by the same finalizers on every pass make one Event;
- the planner refused an override annotation (a ``core.model.Finding``): Warning
  ``OverrideRefused``, action ``Refuse``, the note naming the key, the value and why;
- the planner found a node another writer changed, or that is not where it belongs (a
  ``Finding`` with a state reason): Warning, action ``Report``, the reason saying what it is
  (``StateUnreadable``, ``StateUnverified``, ``StateLabelLost``, ``LentTaintLost``,
  ``ForeignPodOnLentNode``, ``NodeOrphaned``, ``SelectedByManyPools``, ``SinceInFuture``),
  the note saying what is done about it. Once per node, key and value, as a refused override;
- the planner refused, for now, what an operator asked of the node by a valid annotation
  (``lend=now`` with no room to lend, a ``reclaim=now`` on a frozen pool: a ``Rejection`` of an
  operator's intent about the node): Warning ``RequestRefused``, action ``Refuse``, the note
  naming the request, the rule and its sentence. Once while the refusal lasts: when it leaves
  the plan (granted, or the annotation removed) and comes back, it is recorded again.

Why it is shaped like this:
- Every Event about a Node is created in the ``default`` namespace with ``regarding`` the Node:
  a Node is cluster-scoped, and the strict events.k8s.io/v1 validation accepts an Event about a
  cluster-scoped object only in ``default`` (the emulator enforces it too: its README). As the
  kubelet does for its node events, ``regarding.uid`` is the node's name.
- Each Event is named as client-go's recorder names one, ``<node>.<wall-clock nanoseconds in
  hex>``, made strictly increasing within the process so that two Events of the same instant
  never collide. (A ``generateName`` of ``<node>.`` is refused by kube-apiserver: a generated
  name's prefix must itself be a DNS subdomain, and one cannot end in a dot.)
- Recording never fails the tick: an API error is logged and counted (``failures``), nothing
  raises out of ``action`` or ``findings``.
- A refused override is recorded once per bad value: the key is (node, annotation key, value),
  remembered for the life of the process, so a bad value seen on every tick makes one Event; a
  changed value (still bad) makes a new one.
- Dry-run results (``ActionResult.dry_run``) and results with nothing applied record nothing:
  an Event says what happened to the node.
- Every Event carries the annotation ``<prefix>cluster`` naming the cluster (the
  ``cluster_name`` setting). Inside the cluster that goes without saying; an event exporter
  that ships Events of a fleet to one place keeps an object's annotations, and there it tells
  the clusters' Events apart. The note (what ``kubectl describe`` shows) and
  ``reportingInstance`` (the replica, as the Lease and the audit records name it) stay as they
  are (docs/design/fleet.md).
- An Event may carry annotations of its own: the ``AuditStoreFailing`` Event of an intent kept
  while the audit store fails carries the whole record (``adapters.ledger``), and ``own``
  lists this controller's Events of one reason, so that a later run reads the records back
  (docs/design/audit-failure.md). It is the one thing the recorder reads.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.core import model
from rebalancer.core.audit import DEFAULT_CLUSTER
from rebalancer.core.model import Clock
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult, Outcome, WriteKind, WriteOutcome

log = logging.getLogger(__name__)

Obj = dict[str, Any]

CONTROLLER = "rebalancer.io/controller"
NAMESPACE = "default"  # where an Event about a cluster-scoped object lives
NOTE_LIMIT = 1024
NAME_LIMIT = 253

LENT, RECLAIMING, RESTORED, ROLLED_BACK = "Lent", "Reclaiming", "Restored", "LendRolledBack"
OVERRIDE_REFUSED = "OverrideRefused"
DRAIN_BLOCKED = "DrainBlocked"
NOTICED, WITHDRAWN = "ReclaimNoticed", "ReclaimNoticeWithdrawn"
REQUEST_REFUSED = "RequestRefused"
# Every state problem says what it is (docs/design/other-writers.md).
STATE_EVENTS = {
    model.Reason.STATE_UNREADABLE: "StateUnreadable",
    model.Reason.STATE_LABEL_LOST: "StateLabelLost",
    model.Reason.STATE_UNVERIFIED: "StateUnverified",
    model.Reason.LENT_TAINT_LOST: "LentTaintLost",
    model.Reason.FOREIGN_POD: "ForeignPodOnLentNode",
    model.Reason.ORPHANED: "NodeOrphaned",
    model.Reason.SELECTED_BY_MANY_POOLS: "SelectedByManyPools",
    model.Reason.SINCE_IN_FUTURE: "SinceInFuture",  # written by a clock ahead of the server's
    # not the node's state but a borrowed pod's word on it: reported, refused nothing
    model.Reason.CHECKPOINT_NOT_BELIEVED: "CheckpointNotBelieved",
}


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One Event to record about a node; ``annotations`` go on the Event object, beside the
    cluster's (an audit record kept while the store fails: ``adapters.ledger``)."""

    node: str
    type: str  # Normal or Warning
    reason: str
    action: str
    note: str
    annotations: tuple[tuple[str, str], ...] = ()
    # What it is about, when not a node (``node`` then names it): the controller's own Pod, for
    # what happened to its settings (``runtime.livesettings``); such an Event lives in the
    # object's namespace.
    kind: str = "Node"
    namespace: str = NAMESPACE


# ---------------------------------------------------------------------------------------------
# What to record: pure


def _applied(result: ActionResult, kind: WriteKind) -> bool:
    return any(w.kind is kind and w.outcome is WriteOutcome.APPLIED for w in result.writes)


def transition_events(result: ActionResult, decision: str | None = None) -> list[NodeEvent]:
    """The Events one actuator call is worth (none for dry-run, a refusal, a conflict, ...)."""
    if result.dry_run:
        return []
    tail = f" (decision {decision})" if decision else ""
    kept = f"; kept taints other writers own: {', '.join(result.kept)}" if result.kept else ""
    out: list[NodeEvent] = []
    node = result.node
    if _applied(result, WriteKind.FINISH_LEND) and result.outcome is Outcome.APPLIED:
        note = f"lent to training: serving taints and labels replaced{tail}"
        out.append(NodeEvent(node, "Normal", LENT, "Lend", note))
    if _applied(result, WriteKind.NOTICE):
        note = (
            "reclaim noticed: the borrowed pods are told when they must be gone; the node "
            f"stays lent until they answer or their time is up{tail}"
        )
        out.append(NodeEvent(node, "Normal", NOTICED, "Reclaim", note))
    if _applied(result, WriteKind.WITHDRAW):
        note = f"reclaim notice withdrawn: the node stays lent, its pods run on{tail}"
        out.append(NodeEvent(node, "Normal", WITHDRAWN, "Reclaim", note))
    if _applied(result, WriteKind.BEGIN_RECLAIM):
        note = (
            "reclaim started: serving taints and labels restored, draining the pods of the "
            f"loan{kept}{tail}"
        )
        out.append(NodeEvent(node, "Normal", RECLAIMING, "Reclaim", note))
    if _applied(result, WriteKind.FINISH) and result.outcome is Outcome.APPLIED:
        if result.message.startswith("rolled back"):
            note = f"unfinished lend rolled back: the node serves as before{kept}{tail}"
            out.append(NodeEvent(node, "Normal", ROLLED_BACK, "Lend", note))
        elif result.action in (model.Action.RECLAIM, model.Action.PROGRESS):
            note = f"restored: the node serves inference again{kept}{tail}"
            out.append(NodeEvent(node, "Normal", RESTORED, "Reclaim", note))
    return out


def drain_blocked_event(result: ActionResult, decision: str | None = None) -> NodeEvent:
    tail = f" (decision {decision})" if decision else ""
    note = (
        "reclaim past its deadline held by finalizers nobody removes: "
        f"{'; '.join(result.held)}; the node stays reclaiming (counted away){tail}"
    )
    return NodeEvent(result.node, "Warning", DRAIN_BLOCKED, "Reclaim", note)


def finding_event(finding: model.Finding) -> NodeEvent:
    reason = STATE_EVENTS.get(finding.reason)
    if reason is not None:
        return NodeEvent(str(finding.node), "Warning", reason, "Report", finding.message)
    # The message names the key and quotes the value (short): the value is not copied again.
    note = f"annotation refused: {finding.message}"
    return NodeEvent(str(finding.node), "Warning", OVERRIDE_REFUSED, "Refuse", note)


def request_event(rejection: model.Rejection) -> NodeEvent:
    intent = rejection.intent
    note = (
        f"{intent.action.value} asked by an operator ({intent.reason.value}) refused for now: "
        f"{rejection.reason.value}: {rejection.message}"
    )
    return NodeEvent(str(rejection.node), "Warning", REQUEST_REFUSED, "Refuse", note)


def _operator_requests(plan: model.Plan) -> dict[tuple[str, str, str], model.Rejection]:
    """The refusals of what an operator asked of one node, by (node, asked, refused)."""
    return {
        (str(r.node), r.intent.reason.value, r.reason.value): r
        for r in plan.rejections
        if r.node is not None and r.intent.origin is model.Origin.OPERATOR
    }


def micro_time(when: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with six fractional digits."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_name(node: str, stamp: int) -> str:
    """``<node>.<stamp in hex>``, the node's part cut so the whole stays a valid name (253)."""
    suffix = f".{stamp:x}"
    return node[: NAME_LIMIT - len(suffix)] + suffix


def event_body(
    event: NodeEvent,
    instance: str,
    now: datetime,
    stamp: int,
    annotations: Mapping[str, str] | None = None,
) -> Obj:
    metadata: Obj = {"name": event_name(event.node, stamp), "namespace": event.namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": metadata,
        "eventTime": micro_time(now),
        "reportingController": CONTROLLER,
        "reportingInstance": instance[:128],
        "action": event.action,
        "reason": event.reason,
        "type": event.type,
        "regarding": _regarding(event),
        "note": event.note[:NOTE_LIMIT],
    }


def _regarding(event: NodeEvent) -> Obj:
    if event.kind != "Node":
        return {
            "apiVersion": "v1",
            "kind": event.kind,
            "namespace": event.namespace,
            "name": event.node,
        }
    # kubelet's convention for node events: the node's name as its uid
    return {"apiVersion": "v1", "kind": "Node", "name": event.node, "uid": event.node}


# ---------------------------------------------------------------------------------------------
# The recorder


class KubeEvents:
    """``EventRecorder`` that creates events.k8s.io/v1 Events through the API."""

    def __init__(
        self,
        api: Any,
        *,
        instance: str,
        clock: Clock = lambda: datetime.now(UTC),
        stamps: Callable[[], int] = time.time_ns,
        cluster: str = DEFAULT_CLUSTER,
        keys: Keys | None = None,
    ) -> None:
        self._events = client.EventsV1Api(api)
        self.instance, self.clock, self._stamps = instance, clock, stamps
        self.annotations = {(keys or Keys()).cluster: cluster}
        self._last_stamp = 0
        self._seen: set[tuple[str, str, str]] = set()  # (node, key, value) already reported
        self._requests: set[tuple[str, str, str]] = set()  # refused requests still refused
        self._held: dict[str, tuple[str, ...]] = {}  # node -> the pods a finalizer holds, told
        self.recorded = 0
        self.failures = 0

    async def action(self, result: ActionResult, decision: str | None = None) -> None:
        for event in transition_events(result, decision):
            await self.record(event)
        if result.dry_run:
            return
        if not result.held:
            self._held.pop(result.node, None)  # a block that ends is told again if it returns
        elif self._held.get(result.node) != result.held and await self.record(
            drain_blocked_event(result, decision)
        ):
            self._held[result.node] = result.held

    async def findings(self, plan: model.Plan) -> None:
        for pool in plan.pools.values():
            await self.refused(pool.findings)
        requests = _operator_requests(plan)
        self._requests &= requests.keys()  # a refusal that went away is reported when it returns
        for key, rejection in requests.items():
            if key not in self._requests and await self.record(request_event(rejection)):
                self._requests.add(key)

    async def refused(self, findings: Iterable[model.Finding]) -> None:
        for finding in findings:
            key = (str(finding.node), finding.key, finding.value)
            if key in self._seen:
                continue
            if await self.record(finding_event(finding)):
                self._seen.add(key)  # a failed create is tried again next tick

    async def record(self, event: NodeEvent) -> bool:
        """Create the Event; whether it was stored. Never raises."""
        self._last_stamp = max(self._stamps(), self._last_stamp + 1)
        annotations = {**self.annotations, **dict(event.annotations)}
        body = event_body(event, self.instance, self.clock(), self._last_stamp, annotations)
        create: Any = self._events.create_namespaced_event  # a plain dict body is sent as is
        try:
            # The answer is not read into the client's models: parsing its times with dateutil
            # cost a wave of 100 reclaims about 150 ms of CPU, for an answer nobody reads.
            await _answer(await create(event.namespace, body, _preload_content=False))
        except Exception as exc:
            self.failures += 1
            log.warning(
                "event %s on %s %s not recorded: %s",
                event.reason,
                event.kind.lower(),
                event.node,
                _why(exc),
            )
            return False
        self.recorded += 1
        return True

    async def own(self, reason: str) -> list[Obj]:
        """The Events of ``reason`` this controller reported (any replica, any run), as the
        server holds them: a field selector on ``reason`` and ``reportingController``. That
        tells them from other controllers' Events, not from a forged one (whoever may create
        Events may name any controller): what is read back is checked by the caller. Raises
        what the API raises."""
        selector = f"reason={reason},reportingController={CONTROLLER}"
        listing: Any = self._events.list_namespaced_event
        text = await _answer(
            await listing(NAMESPACE, field_selector=selector, _preload_content=False)
        )
        items: list[Obj] = json.loads(text).get("items") or []
        return items


def _why(error: Exception) -> str:
    """What the server said (an ``ApiException``'s status and ``Status`` message), else the
    error itself."""
    code, body = getattr(error, "status", None), getattr(error, "body", None)
    if code is None:
        return repr(error)
    try:
        message = json.loads(body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = str(body or "")[:200]
    return f"HTTP {code}: {message}" if message else f"HTTP {code}"


async def _answer(response: Any) -> bytes:
    """The body of a raw (``_preload_content=False``) answer, read whole so that the connection
    goes back to the pool; an ``ApiException`` with that body when it is not a 2xx."""
    try:
        body: Any = await response.read()
        if not 200 <= response.status <= 299:
            failed = ApiException(status=response.status, reason=response.reason)
            failed.body = body.decode(errors="replace")  # the text, as the client's own carry
            raise failed
    finally:
        response.release()
    return bytes(body)
