"""One open watch: its filter, its queue of event lines, its deadline and bookmark schedule.

The store offers every change of the watched collection to every watcher; the watcher turns it
into what kube-apiserver's watch cache would send (``cacheWatcher.convertToWatchEvent``): an
update that makes an object match the selectors is ``ADDED``, one that makes it stop matching is
``DELETED`` carrying the *previous* object with the new ``resourceVersion``, and a ``DELETED`` is
sent when the object matched before its deletion. Objects are converted to the API version the
client watches (Events are served under two).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandbox.emulator import conversion, selector
from sandbox.emulator.resources import ResourceType

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """A stored change: ``previous`` is the object before it (``None`` for a creation)."""

    type: str  # ADDED, MODIFIED, DELETED
    object: Obj
    previous: Obj | None
    resource_version: int


@dataclass(frozen=True, slots=True)
class Scope:
    """What a watch or list selects."""

    rt: ResourceType
    namespace: str | None = None
    labels: selector.Selector = selector.EVERYTHING
    fields: selector.FieldSelector = selector.NO_FIELDS

    def selects(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(
            self.rt.field_values(obj)
        )


class Watcher:
    def __init__(
        self, scope: Scope, bookmarks: bool, deadline: datetime, bookmark_at: datetime | None
    ) -> None:
        self.scope = scope
        self.bookmarks = bookmarks
        self.deadline = deadline
        self.bookmark_at = bookmark_at
        self.queue: asyncio.Queue[Obj | None] = asyncio.Queue()
        self.closed = False

    def offer(self, change: Change) -> None:
        event = self._convert(change)
        if event is not None:
            self.send(event)

    def _convert(self, change: Change) -> Obj | None:
        now = change.type != "DELETED" and self.scope.selects(change.object)
        before = change.previous is not None and self.scope.selects(change.previous)
        if change.type == "DELETED":
            return self._event("DELETED", change.object) if before else None
        if now and not before:
            return self._event("ADDED", change.object)
        if now and before:
            return self._event("MODIFIED", change.object)
        if before and change.previous is not None:
            gone = copy.deepcopy(change.previous)
            gone["metadata"]["resourceVersion"] = str(change.resource_version)
            return self._event("DELETED", gone)
        return None

    def _event(self, kind: str, obj: Obj) -> Obj:
        return {"type": kind, "object": conversion.from_storage(self.scope.rt, obj)}

    def added(self, obj: Obj) -> None:
        self.send(self._event("ADDED", obj))

    def bookmark(self, resource_version: int, initial_events_end: bool = False) -> None:
        rt = self.scope.rt
        metadata: Obj = {"resourceVersion": str(resource_version)}
        if initial_events_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        self.send(
            {
                "type": "BOOKMARK",
                "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": metadata},
            }
        )

    def error(self, status: Obj) -> None:
        self.send({"type": "ERROR", "object": status})
        self.close()

    def send(self, event: Obj) -> None:
        if not self.closed:
            self.queue.put_nowait(event)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)
