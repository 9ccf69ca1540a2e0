"""The text formats of the owned keys: times, and the ``original`` record (versions 1 and 2);
decoding never raises, it says why a text is not readable."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rebalancer.core import bounded, model
from rebalancer.core.nodestate.values import Original, TaintKey


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | str:
    """An RFC 3339 time with a zone, or the reason it is not one."""
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        return "not an RFC 3339 time such as 2026-01-31T22:00:00Z"
    if when.tzinfo is None:
        return "has no time zone; write it in UTC with a trailing Z"
    try:
        return when.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is past the last representable UTC time
        return "is out of the representable range once converted to UTC"


def encode_original(original: Original) -> str:
    """Version 2 when the record says what the lend did to the taints, else version 1."""
    doc: dict[str, Any] = {
        "v": 1,
        "taints": [t.to_doc() for t in original.taints],
        "labels": dict(original.labels),
    }
    if original.added is not None and original.removed is not None:
        doc["v"] = 2
        doc["added"] = [t.to_doc() for t in original.added]
        doc["removed"] = [{"key": k, "effect": e} for k, e in original.removed]
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_original(text: str) -> Original | str:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, RecursionError) as exc:  # an over-long integer, nesting too deep
        return f"not readable JSON ({type(exc).__name__})"
    if not isinstance(doc, dict) or type(doc.get("v")) is not int or doc["v"] not in (1, 2):
        return (
            'not a version 1 or 2 record ({"v": 2, "taints": [...], "labels": {...}, '
            '"added": [...], "removed": [...]})'
        )
    taints_doc, labels_doc = doc.get("taints"), doc.get("labels")
    if not isinstance(taints_doc, list) or not isinstance(labels_doc, dict):
        return "needs a list 'taints' and an object 'labels'"
    taints = _taints_from_docs(taints_doc)
    if isinstance(taints, str):
        return taints
    for key, value in labels_doc.items():
        if not (value is None or isinstance(value, str)):
            shown = bounded.quoted(value)
            return f"label {bounded.quoted(key)} must map to a string or null, not {shown}"
    if doc["v"] == 1:
        return Original(taints=taints, labels=dict(labels_doc))
    added_doc, removed_doc = doc.get("added"), doc.get("removed")
    if not isinstance(added_doc, list) or not isinstance(removed_doc, list):
        return "a version 2 record needs the lists 'added' and 'removed'"
    added = _taints_from_docs(added_doc)
    if isinstance(added, str):
        return added
    removed: list[TaintKey] = []
    for item in removed_doc:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("key", "effect")
        ):
            return f"removed taint {bounded.quoted(item)} needs string 'key' and 'effect'"
        removed.append((item["key"], item["effect"]))
    return Original(taints=taints, labels=dict(labels_doc), added=added, removed=tuple(removed))


def _taints_from_docs(docs: list[Any]) -> tuple[model.Taint, ...] | str:
    taints: list[model.Taint] = []
    for item in docs:
        taint = _taint_from_doc(item)
        if taint is None:
            return (
                f"taint {bounded.quoted(item)} needs string 'key' and 'effect', and optional "
                "string 'value' and 'timeAdded'"
            )
        taints.append(taint)
    return tuple(taints)


def _taint_from_doc(item: Any) -> model.Taint | None:
    if not isinstance(item, dict):
        return None
    key, effect, value = item.get("key"), item.get("effect"), item.get("value")
    added = item.get("timeAdded")
    if not isinstance(key, str) or not isinstance(effect, str):
        return None
    if any(v is not None and not isinstance(v, str) for v in (value, added)):
        return None
    return model.Taint(key=key, effect=effect, value=value, time_added=added)
