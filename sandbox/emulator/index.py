"""Indexes over one stored collection: a request costs what it selects, not what is stored.

kube-apiserver's watch cache answers a LIST of the pods on one node from an index on
``spec.nodeName``, not by reading every pod of the cluster; the emulator does the same for every
collection, so that a cluster of 150,000 pods answers a narrow request as fast as a small one.
Each stored object is indexed by its namespace, by each of its labels (key and value) and by
each field a field selector may name (``ResourceType.fields``). ``candidates`` picks the
smallest set that a request's scope narrows to: its namespace, an equality or ``in`` label
requirement, or an equality field requirement. The scope still filters the candidates, so an
index can only make a request cheaper, never change its answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sandbox.emulator.resources import ResourceType
from sandbox.emulator.watcher import Scope

Obj = dict[str, Any]
Key = tuple[str, str]
_EQUALS = ("=", "==", "in")


class Index:
    def __init__(self, rt: ResourceType) -> None:
        self._rt = rt
        # Fields by their stored path: two API versions may name one field differently
        # (``regarding.name`` and ``involvedObject.name`` of an Event).
        self._paths = {".".join(path): name for name, path in rt.fields.items()}
        self._entries: dict[tuple[str, str, str], set[Key]] = {}

    def add(self, key: Key, obj: Obj) -> None:
        for entry in self._entries_of(obj):
            self._entries.setdefault(entry, set()).add(key)

    def discard(self, key: Key, obj: Obj) -> None:
        for entry in self._entries_of(obj):
            keys = self._entries.get(entry)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._entries[entry]

    def keys(self, kind: str, name: str, value: str) -> set[Key]:
        """The keys of the objects whose ``kind`` (``namespace``, ``label`` or ``field``, by
        its stored path) ``name`` has ``value`` (read only)."""
        return self._entries.get((kind, name, value), set())

    def candidates(self, scope: Scope) -> set[Key] | None:
        """A superset of the keys ``scope`` selects, as small as the indexes make it; ``None``
        when nothing narrows it (every object is a candidate)."""
        options: list[set[Key]] = []
        if scope.namespace is not None:
            options.append(self.keys("namespace", "", scope.namespace))
        for label in scope.labels.requirements:
            if label.operator in _EQUALS:
                found = [self.keys("label", label.key, v) for v in label.values]
                options.append(found[0] if len(found) == 1 else set().union(*found))
        for requirement in scope.fields.requirements:
            path = ".".join(scope.rt.fields.get(requirement.field, ()))
            if not requirement.negate and path in self._paths:
                options.append(self.keys("field", path, requirement.value))
        return min(options, key=len) if options else None

    def _entries_of(self, obj: Obj) -> Iterator[tuple[str, str, str]]:
        meta = obj["metadata"]
        if self._rt.namespaced:
            yield "namespace", "", str(meta.get("namespace") or "")
        for key, value in (meta.get("labels") or {}).items():
            yield "label", key, str(value)
        values = self._rt.field_values(obj)
        for path, name in self._paths.items():
            yield "field", path, values[name]
