"""JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on plain JSON values.

Errors carry the status the real server answers with (``handlers/patch.go``): a JSON patch body
that is not a list of operations is 400 BadRequest; a patch that decodes but cannot be applied
(a failed ``test``, a missing path) is 422 with the generic message, because the server passes
the library's error through ``NewGenericServerResponse``, which drops its text. The operation
semantics follow the library the server uses (``evanphx/json-patch`` v4): ``test`` of a missing
member against ``null`` passes, ``replace`` and ``remove`` need the member to exist.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sandbox.emulator import status


class PatchFailed(Exception):
    """A patch that decoded but could not be applied (the server's 422)."""


def decode(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise status.bad_request(f"error decoding patch: {exc}") from None


# ---------------------------------------------------------------------------------------------
# RFC 6902


def json_patch(document: Any, operations: Any) -> Any:
    if not isinstance(operations, list) or not all(isinstance(o, dict) for o in operations):
        raise status.bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    result = copy.deepcopy(document)
    try:
        for operation in operations:
            result = _apply(result, operation)
    except PatchFailed:
        raise status.unprocessable() from None
    return result


def _apply(document: Any, operation: dict[str, Any]) -> Any:
    kind = operation.get("op")
    path = _pointer(operation.get("path"))
    if kind == "add":
        return _add(document, path, copy.deepcopy(operation.get("value")))
    if kind == "remove":
        return _remove(document, path)[0]
    if kind == "replace":
        _remove(document, path)
        return _add(document, path, copy.deepcopy(operation.get("value")))
    if kind == "move":
        document, value = _remove(document, _pointer(operation.get("from")))
        return _add(document, path, value)
    if kind == "copy":
        value = copy.deepcopy(_get(document, _pointer(operation.get("from"))))
        return _add(document, path, value)
    if kind == "test":
        _test(document, path, operation.get("value"))
        return document
    raise PatchFailed(f"Unexpected kind: {kind}")


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str):
        raise PatchFailed("operation has no path")
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchFailed(f"JSON pointer must start with '/': {text!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _parent(document: Any, path: list[str]) -> Any:
    target = document
    for part in path[:-1]:
        target = _child(target, part)
    return target


def _child(container: Any, part: str) -> Any:
    if isinstance(container, dict) and part in container:
        return container[part]
    if isinstance(container, list):
        index = _index(part, len(container) - 1)
        return container[index]
    raise PatchFailed(f"missing path element {part!r}")


def _index(part: str, last: int) -> int:
    if not part.isdigit() or (len(part) > 1 and part.startswith("0")):
        raise PatchFailed(f"bad array index {part!r}")
    index = int(part)
    if index > last:
        raise PatchFailed(f"array index {index} out of bounds")
    return index


def _get(document: Any, path: list[str]) -> Any:
    if not path:
        return document
    return _child(_parent(document, path), path[-1])


def _add(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent, last = _parent(document, path), path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else _index(last, len(parent))
        parent.insert(index, value)
    else:
        raise PatchFailed("add operation does not apply: doc is missing path")
    return document


def _remove(document: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        raise PatchFailed("cannot remove the whole document")
    parent, last = _parent(document, path), path[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchFailed(f"Unable to remove nonexistent key: {last}")
        return document, parent.pop(last)
    if isinstance(parent, list):
        return document, parent.pop(_index(last, len(parent) - 1))
    raise PatchFailed("remove operation does not apply: doc is missing path")


def _test(document: Any, path: list[str], expected: Any) -> None:
    if path:
        parent = _parent(document, path)
        if isinstance(parent, dict) and path[-1] not in parent:
            if expected is None:
                return
            raise PatchFailed("testing value failed")
    if not json_equal(_get(document, path), expected):
        raise PatchFailed("testing value failed")


def json_equal(left: Any, right: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` and ``1`` is ``1.0``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    return bool(type(left) is type(right) or (_number(left) and _number(right))) and left == right


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------
# RFC 7386


def merge_patch(document: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        raise status.bad_request("invalid JSON Patch")
    return _merge(copy.deepcopy(document), patch)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result
