"""The records the audit store could not take, kept on their Nodes until it takes them.

Where it sits: when the audit store fails, the reconciler (and ``rebalancer reclaim``) still
takes nodes back for inference, but only once the intent is recorded somewhere that outlives
the process: here, on the Node itself, in the annotation ``<prefix>audit-pending`` (a JSON
list of records in ``core.audit.to_json`` form, oldest first), written before the reclaim's
first write, with a Warning Event (``AuditStoreFailing``) saying what the record says. When
the store takes writes again, the runtime writes these records to it (ids kept; one already
there is not written twice) and ``release`` removes them from the Node. A process that dies
before that loses nothing: the next leader reads them back from the Nodes (``pending``) before
it judges anything (docs/design/audit-failure.md).

Why on the Node: it is the one place the controller can still write when its own disk cannot
(the API server's etcd), it is what a restart reads first anyway, and it is where an operator
looks (``kubectl get node -o yaml``, ``kubectl describe node``). The write touches only that
one annotation, which only the controller writes, locked to the resourceVersion just read.

A second copy of each intent: another writer may remove the annotation (a GitOps sync that
owns the Node's annotations does) before the store takes the record. So the intent's Event
carries the whole record too, in its annotation ``<prefix>audit-record`` (the note is cut at
1 KiB), and ``copies`` reads those back: this controller's ``AuditStoreFailing`` Events, each
record taken only if it is an intent about the Event's node that the node's own ``decision``
annotation names. Anyone who may create Events can write one that claims to be ours; a record
it carries reaches the store only where the controller itself wrote its id onto the Node, which
is exactly the records of actions carried out. Events expire (kube-apiserver's ``--event-ttl``,
1 h by default): ``retell`` records one again before its copy gets that old.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from rebalancer.adapters import audit as auditing
from rebalancer.adapters import events as eventing
from rebalancer.adapters.writer import Conflict, NodeWriter, NotFound
from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.nodestate import Keys, sealing
from rebalancer.errors import RebalancerError

log = logging.getLogger(__name__)

AUDIT_STORE_FAILING = "AuditStoreFailing"  # the Event's reason
NODE_LIMIT = 32  # records on one node at most: a few reclaims of one episode, and their outcomes
_TRIES = 3  # a 409 means the node changed since it was read: read it again, a few times


def annotation(keys: Keys) -> str:
    return keys.prefix + "audit-pending"


def record_annotation(keys: Keys) -> str:
    """The annotation of an ``AuditStoreFailing`` Event that holds the whole record."""
    return keys.prefix + "audit-record"


def signature(keys: Keys) -> str:
    """The annotation that signs ``annotation`` for its node (docs/design/node-state-integrity.md):
    records a node carries reach the store only if the controller wrote them there."""
    return keys.prefix + "audit-pending-signature"


class EventSink(Protocol):
    """``adapters.events.KubeEvents``: creates one Event (never raises), lists its own."""

    async def record(self, event: eventing.NodeEvent) -> bool: ...

    async def own(self, reason: str) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class Copy:
    """An intent read back from this controller's Events, when its newest Event was made, and
    whether its node vouches for it (the node's ``decision`` names it)."""

    record: AuditRecord
    told: datetime
    vouched: bool


class NotKept(RebalancerError):
    """The records could not be written on the node: what they describe must not be done."""


def pending(annotations: Mapping[str, str], keys: Keys) -> tuple[AuditRecord, ...]:
    """The records a node carries, oldest first; ``NotKept`` naming the node's annotation if
    it cannot be read (garbled by hand): it is then left as it is, for a person to look at."""
    text = annotations.get(annotation(keys))
    if not text:
        return ()
    try:
        docs = json.loads(text)
        if not isinstance(docs, list):
            raise ValueError("not a JSON list")
        return tuple(auditing.from_json(d) for d in docs)
    except (ValueError, TypeError, auditing.UnreadableRecord) as exc:
        raise NotKept(f"annotation {annotation(keys)} cannot be read: {exc}") from None


def note(record: AuditRecord, why: str, keys: Keys) -> str:
    """What the Event says: the record in words, and where it is kept."""
    what = f"{record.action or record.kind.value} {record.id}"
    if record.kind is audit.Kind.OUTCOME:
        what += f" ({record.outcome}, of {record.intent_id})"
    else:
        what += f" ({record.origin}, {record.reason})"
    return (
        f"the audit store cannot take writes ({why}): {what}: {record.message}; recorded on "
        f"this node in annotation {annotation(keys)} until the store takes it"
    )


class NodeLedger:
    """Records kept on their Nodes (the annotation above) while the store fails."""

    def __init__(self, writer: NodeWriter, keys: Keys, events: EventSink | None = None) -> None:
        self.writer, self.keys, self.events = writer, keys, events
        self._named: tuple[Keys, str] = (keys, annotation(keys))

    @property
    def _pending_key(self) -> str:
        """``annotation(self.keys)``, named once per key set: ``kept`` asks it of every node
        on every tick."""
        if self._named[0] is not self.keys:
            self._named = (self.keys, annotation(self.keys))
        return self._named[1]
        self._unread: set[str] = set()  # Events whose record could not be read, said once

    async def hold(self, node: str, records: Sequence[AuditRecord], why: str) -> None:
        """Add ``records`` to the node's annotation (before what they describe is done), then
        one Event per intent. ``NotKept`` if the node cannot carry them."""
        await self._rewrite(node, lambda kept: _merged(kept, records))
        for record in records:
            if record.kind is audit.Kind.INTENT:
                await self.retell(record, why, node)

    async def retell(self, record: AuditRecord, why: str, node: str | None = None) -> bool:
        """The Warning Event of an intent kept while the store fails (about ``node``, else
        the record's), carrying the record whole; whether it was recorded (an Event is a copy:
        its failure stops nothing)."""
        about = node or record.node
        if self.events is None or not about:
            return False
        text = note(record, why, self.keys)
        whole = ((record_annotation(self.keys), _text([record])),)
        event = eventing.NodeEvent(
            about, "Warning", AUDIT_STORE_FAILING, "Audit", text, annotations=whole
        )
        return await self.events.record(event)

    def kept(self, view: model.NodeView) -> tuple[AuditRecord, ...]:
        """The records ``view`` carries; ``NotKept`` if they cannot be read or are not signed
        by the controller for this node (left as they are, for a person to look at)."""
        if not view.annotations.get(self._pending_key):
            return ()  # most nodes, on every tick: said before building a key name twice
        unsigned = _unsigned(view.annotations, view.uid, self.keys)
        if unsigned is not None:
            raise NotKept(f"annotation {annotation(self.keys)}: {unsigned}")
        return pending(view.annotations, self.keys)

    async def copies(self, views: Iterable[model.NodeView]) -> tuple[Copy, ...]:
        """The intents this controller's ``AuditStoreFailing`` Events carry, oldest first,
        each once (with its newest Event's time), each vouched for if one of ``views`` is its
        node and that node's ``decision`` names it: only those are to be written to the store.
        Raises what the API raises."""
        if self.events is None:
            return ()
        decisions = {str(v.name): v.annotations.get(self.keys.decision) for v in views}
        found: dict[str, Copy] = {}
        for event in await self.events.own(AUDIT_STORE_FAILING):
            copy = self._copy(event, decisions)
            if copy is None:
                continue
            seen = found.get(copy.record.id)
            if seen is None or seen.told < copy.told or (copy.vouched and not seen.vouched):
                found[copy.record.id] = copy
        return tuple(sorted(found.values(), key=lambda c: (c.record.time, c.record.id)))

    def _copy(self, event: Mapping[str, Any], decisions: Mapping[str, str | None]) -> Copy | None:
        """The record ``event`` carries, if it is one of ours to read: an intent about the
        Event's node; vouched for if that node's ``decision`` names it."""
        regarding = event.get("regarding") or {}
        meta = event.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(record_annotation(self.keys))
        node = regarding.get("name")
        if (
            event.get("reportingController") != eventing.CONTROLLER
            or regarding.get("kind") != "Node"
            or not text
            or not node
        ):
            return None
        try:
            (record,) = pending({annotation(self.keys): text}, self.keys)
        except (NotKept, ValueError) as exc:
            name = str(meta.get("name"))
            if name not in self._unread:  # said once: the Event is listed again and again
                self._unread.add(name)
                log.warning("event %s on node %s: its record is not read: %s", name, node, exc)
            return None
        if record.kind is not audit.Kind.INTENT or record.node != node:
            return None
        told = _time(event.get("eventTime")) or _time(meta.get("creationTimestamp"))
        return Copy(record, told or record.time, decisions.get(node) == record.id)

    async def release(self, node: str, ids: Iterable[str]) -> None:
        """Remove the records ``ids`` (the store has them now) from the node."""
        gone = set(ids)
        try:
            await self._rewrite(node, lambda kept: [r for r in kept if r.id not in gone])
        except NotFound:
            return

    async def _rewrite(self, node: str, change: Any) -> None:
        key = annotation(self.keys)
        for attempt in range(_TRIES):
            raw = await self.writer.get_node(node)
            meta = raw.get("metadata") or {}
            annotations, uid = meta.get("annotations") or {}, str(meta.get("uid") or "")
            unsigned = _unsigned(annotations, uid, self.keys)
            if unsigned is not None:
                # Not written by the controller: never signed as if it were. Replaced by what
                # is written now (the store never takes what it held).
                log.warning("node %s: %s: %s; replaced", node, annotation(self.keys), unsigned)
                annotations = {}
            kept = list(pending(annotations, self.keys))
            wanted: list[AuditRecord] = change(kept)
            if [r.id for r in wanted] == [r.id for r in kept]:
                return
            if len(wanted) > NODE_LIMIT:
                raise NotKept(
                    f"node {node} carries {len(kept)} records already ({NODE_LIMIT} at most)"
                )
            text = _text(wanted) if wanted else None
            signed = sealing.sign_text(self.keys, uid, key, text)
            body = nodestate.NodeChange(
                taints=None, labels={}, annotations={key: text, signature(self.keys): signed}
            )
            try:
                await self.writer.patch_node(node, body, str(meta.get("resourceVersion", "")))
                return
            except Conflict:
                if attempt == _TRIES - 1:
                    raise
        raise AssertionError("unreachable")


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _unsigned(annotations: Mapping[str, str], uid: str, keys: Keys) -> str | None:
    """Why the records ``annotations`` holds are not the controller's own for the node ``uid``;
    None when they are (or there are none, or nothing is signed)."""
    text = annotations.get(annotation(keys))
    if not text:
        return None
    return sealing.check_text(keys, uid, annotation(keys), text, annotations.get(signature(keys)))


def _merged(kept: list[AuditRecord], new: Sequence[AuditRecord]) -> list[AuditRecord]:
    ids = {r.id for r in kept}
    return [*kept, *(r for r in new if r.id not in ids)]


def _text(records: Sequence[AuditRecord]) -> str:
    return json.dumps([audit.to_json(r) for r in records], sort_keys=True, separators=(",", ":"))
