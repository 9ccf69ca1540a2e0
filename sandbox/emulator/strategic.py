"""Strategic merge patch with the list semantics of the Kubernetes types.

A list field is merged only when its Go type says so (``patchStrategy:"merge"``, with a
``patchMergeKey`` for lists of objects); every other list is atomic and the patch replaces it
whole. That is why ``spec.taints`` on a Node is replaced (``NodeSpec.Taints`` carries no patch
strategy) while ``metadata.finalizers`` is merged as a set and ``status.conditions`` is merged by
``type``. The table below holds the strategies of the fields a node or pod controller touches;
fields it does not name are atomic lists and merged maps, as for any field without tags.

The algorithm follows ``k8s.io/apimachinery/pkg/util/strategicpatch``, including its ordering:
items named in the patch come in patch order, items only on the server keep theirs, and the two
are interleaved by the server's order, so a *new* item lands in front of the existing ones.
Directives: ``$patch: replace|delete`` on maps and list items, ``$deleteFromPrimitiveList/``,
``$setElementOrder/`` and ``$retainKeys``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.emulator import status

Path = tuple[str, ...]
ITEM = "*"
_DELETE_PRIMITIVES = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"


@dataclass(frozen=True, slots=True)
class ListStrategy:
    """How a list field merges: ``merge_key`` is ``None`` for a set of scalars."""

    merge_key: str | None = None


def _metadata() -> dict[Path, ListStrategy]:
    return {
        ("metadata", "finalizers"): ListStrategy(),
        ("metadata", "ownerReferences"): ListStrategy("uid"),
    }


def _containers(prefix: Path) -> dict[Path, ListStrategy]:
    item = (*prefix, ITEM)
    return {
        prefix: ListStrategy("name"),
        (*item, "ports"): ListStrategy("containerPort"),
        (*item, "env"): ListStrategy("name"),
        (*item, "volumeMounts"): ListStrategy("mountPath"),
        (*item, "volumeDevices"): ListStrategy("devicePath"),
    }


SCHEMAS: dict[str, dict[Path, ListStrategy]] = {
    "Node": {
        **_metadata(),
        ("spec", "podCIDRs"): ListStrategy(),
        ("status", "conditions"): ListStrategy("type"),
        ("status", "addresses"): ListStrategy("type"),
    },
    "Pod": {
        **_metadata(),
        **_containers(("spec", "containers")),
        **_containers(("spec", "initContainers")),
        **_containers(("spec", "ephemeralContainers")),
        ("spec", "volumes"): ListStrategy("name"),
        ("spec", "imagePullSecrets"): ListStrategy("name"),
        ("spec", "hostAliases"): ListStrategy("ip"),
        ("spec", "topologySpreadConstraints"): ListStrategy("topologyKey"),
        ("spec", "schedulingGates"): ListStrategy("name"),
        ("spec", "resourceClaims"): ListStrategy("name"),
        ("status", "conditions"): ListStrategy("type"),
        ("status", "podIPs"): ListStrategy("ip"),
        ("status", "hostIPs"): ListStrategy("ip"),
    },
    "PodDisruptionBudget": {**_metadata(), ("status", "conditions"): ListStrategy("type")},
    "Lease": _metadata(),
    "Event": _metadata(),
}


def apply(document: Mapping[str, Any], patch: Any, kind: str) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise status.bad_request("invalid JSON document")
    return _Merger(SCHEMAS.get(kind, _metadata())).merge_map(
        dict(copy.deepcopy(document)), patch, ()
    )


def _bad(message: str) -> status.ApiError:
    return status.bad_request(message)


class _Merger:
    def __init__(self, schema: Mapping[Path, ListStrategy]) -> None:
        self.schema = schema

    def merge_map(
        self, original: dict[str, Any], patch: dict[str, Any], path: Path
    ) -> dict[str, Any]:
        patch = dict(patch)
        if "$patch" in patch:
            directive = patch.pop("$patch")
            if directive == "replace":
                replaced: dict[str, Any] = _clean(patch)
                return replaced
            if directive == "delete":
                return {}
            raise _bad(f"Unknown patch type: {directive} in map: {patch}")
        result = dict(original)
        self._retain_keys(result, patch)
        orders = {
            k[len(_SET_ORDER) :]: patch.pop(k) for k in list(patch) if k.startswith(_SET_ORDER)
        }
        for key in [k for k in patch if k.startswith(_DELETE_PRIMITIVES)]:
            self._delete_primitives(result, key[len(_DELETE_PRIMITIVES) :], patch.pop(key))
        for key, value in patch.items():
            self._field(result, key, value, (*path, key))
        for key, order in orders.items():
            self._set_order(result, key, order, (*path, key), original.get(key))
        return result

    def _retain_keys(self, result: dict[str, Any], patch: dict[str, Any]) -> None:
        if "$retainKeys" not in patch:
            return
        keep = patch.pop("$retainKeys")
        if not isinstance(keep, list):
            raise _bad("invalid patch: $retainKeys must be a list")
        for key, value in patch.items():
            if value is not None and not key.startswith("$") and key not in keep:
                raise _bad("doesn't match $retainKeys directive")
        for key in [k for k in result if k not in keep]:
            del result[key]

    def _delete_primitives(self, result: dict[str, Any], key: str, values: Any) -> None:
        if not isinstance(values, list):
            raise _bad("invalid patch: $deleteFromPrimitiveList must be a list")
        if isinstance(result.get(key), list):
            result[key] = [v for v in result[key] if v not in values]

    def _field(self, result: dict[str, Any], key: str, value: Any, path: Path) -> None:
        if value is None:
            result.pop(key, None)
            return
        if key not in result or type(result[key]) is not type(value):
            result[key] = _clean(value)
        elif isinstance(value, dict):
            result[key] = self.merge_map(result[key], value, path)
        elif isinstance(value, list):
            result[key] = self.merge_list(result[key], value, path)
        else:
            result[key] = value

    def merge_list(self, original: list[Any], patch: list[Any], path: Path) -> list[Any]:
        strategy = self.schema.get(path)
        if strategy is None:
            return [_clean(v) for v in patch]
        if not original and not patch:
            return original
        if strategy.merge_key is None:
            merged = list(dict.fromkeys([*original, *patch]))
            patch_items = [v for v in merged if v in patch]
            server_only = [v for v in merged if v not in patch]
            return _interleave(server_only, _ordered(patch_items, patch, None), original, None)
        return self._objects(original, patch, path, strategy.merge_key)

    def _objects(self, original: list[Any], patch: list[Any], path: Path, key: str) -> list[Any]:
        if not all(isinstance(v, dict) for v in (*original, *patch)):
            raise status.internal_error("merging a list whose items are not all objects")
        items, replace = [copy.deepcopy(v) for v in original], False
        plain: list[dict[str, Any]] = []
        for element in patch:
            directive = element.get("$patch")
            if directive is None:
                plain.append(element)
            elif directive == "delete":
                items = [v for v in items if v.get(key) != _merge_value(element, key)]
            elif directive == "replace":
                replace = True
            else:
                raise _bad(f"Unknown patch type: {directive} in map: {element}")
        if replace:
            return [_clean(v) for v in plain]
        for element in plain:
            value = _merge_value(element, key)
            index = next((i for i, v in enumerate(items) if v.get(key) == value), None)
            if index is None:
                items.append(_clean(element))
            else:
                items[index] = self.merge_map(items[index], element, (*path, ITEM))
        names = [v[key] for v in plain]
        patch_items = [v for v in items if v.get(key) in names]
        server_only = [v for v in items if v.get(key) not in names]
        return _interleave(server_only, _ordered(patch_items, plain, key), original, key)

    def _set_order(
        self, result: dict[str, Any], key: str, order: Any, path: Path, original: Any
    ) -> None:
        if not isinstance(order, list) or not isinstance(result.get(key), list):
            return
        strategy = self.schema.get(path)
        merge_key = strategy.merge_key if strategy else None
        wanted = [v.get(merge_key) if isinstance(v, dict) and merge_key else v for v in order]
        items = result[key]
        patch_items = [v for v in items if _identity(v, merge_key) in wanted]
        server_only = [v for v in items if _identity(v, merge_key) not in wanted]
        patch_items.sort(key=lambda v: wanted.index(_identity(v, merge_key)))
        server_order = original if isinstance(original, list) else []
        result[key] = _interleave(server_only, patch_items, server_order, merge_key)


def _merge_value(element: dict[str, Any], key: str) -> Any:
    if key not in element:
        raise status.internal_error(f"map: {element} does not contain declared merge key: {key}")
    return element[key]


def _identity(item: Any, key: str | None) -> Any:
    return item.get(key) if key is not None and isinstance(item, dict) else item


def _ordered(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    wanted = [_identity(v, key) for v in order]
    return sorted(items, key=lambda v: wanted.index(_identity(v, key)))


def _interleave(left: list[Any], right: list[Any], server: list[Any], key: str | None) -> list[Any]:
    """``mergeSortedSlice``: server-only items (left) go before a patch item (right) only when
    both are on the server and the server has them in that order."""
    positions = {_hashable(_identity(v, key)): i for i, v in reversed(list(enumerate(server)))}
    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            out.append(left[i])
            i += 1
            continue
        if i < len(left):
            li = positions.get(_hashable(_identity(left[i], key)))
            ri = positions.get(_hashable(_identity(right[j], key)))
            if li is not None and ri is not None and li < ri:
                out.append(left[i])
                i += 1
                continue
        out.append(right[j])
        j += 1
    return out


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, dict | list) else value


def _clean(value: Any) -> Any:
    """Drop directive keys, as decoding into the typed object would."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value
