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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from rebalancer.adapters import audit as auditing
from rebalancer.adapters import events as eventing
from rebalancer.adapters.writer import Conflict, NodeWriter, NotFound
from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.nodestate import Keys
from rebalancer.errors import RebalancerError

log = logging.getLogger(__name__)

AUDIT_STORE_FAILING = "AuditStoreFailing"  # the Event's reason
NODE_LIMIT = 32  # records on one node at most: a few reclaims of one episode, and their outcomes
_TRIES = 3  # a 409 means the node changed since it was read: read it again, a few times


def annotation(keys: Keys) -> str:
    return keys.prefix + "audit-pending"


class EventSink(Protocol):
    """``adapters.events.KubeEvents``: creates one Event, never raises."""

    async def record(self, event: eventing.NodeEvent) -> bool: ...


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

    async def hold(self, node: str, records: Sequence[AuditRecord], why: str) -> None:
        """Add ``records`` to the node's annotation (before what they describe is done), then
        one Event per intent. ``NotKept`` if the node cannot carry them."""
        await self._rewrite(node, lambda kept: _merged(kept, records))
        if self.events is not None:
            for record in records:
                if record.kind is audit.Kind.INTENT:
                    text = note(record, why, self.keys)
                    event = eventing.NodeEvent(node, "Warning", AUDIT_STORE_FAILING, "Audit", text)
                    await self.events.record(event)

    def kept(self, view: model.NodeView) -> tuple[AuditRecord, ...]:
        return pending(view.annotations, self.keys)

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
            kept = list(pending(meta.get("annotations") or {}, self.keys))
            wanted: list[AuditRecord] = change(kept)
            if [r.id for r in wanted] == [r.id for r in kept]:
                return
            if len(wanted) > NODE_LIMIT:
                raise NotKept(
                    f"node {node} carries {len(kept)} records already ({NODE_LIMIT} at most)"
                )
            text = _text(wanted) if wanted else None
            body = nodestate.NodeChange(taints=None, labels={}, annotations={key: text})
            try:
                await self.writer.patch_node(node, body, str(meta.get("resourceVersion", "")))
                return
            except Conflict:
                if attempt == _TRIES - 1:
                    raise
        raise AssertionError("unreachable")


def _merged(kept: list[AuditRecord], new: Sequence[AuditRecord]) -> list[AuditRecord]:
    ids = {r.id for r in kept}
    return [*kept, *(r for r in new if r.id not in ids)]


def _text(records: Sequence[AuditRecord]) -> str:
    return json.dumps([audit.to_json(r) for r in records], sort_keys=True, separators=(",", ":"))
