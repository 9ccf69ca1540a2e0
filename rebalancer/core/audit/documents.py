"""Records and their parts as JSON documents (``to_json``, ``jsonable``): the one place that
decides how a time, a number or a node is written."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from rebalancer.core import model
from rebalancer.core.audit.record import AuditRecord, Json


def node_doc(view: model.NodeView) -> Json:
    """Taints and labels of a node, in the API's shape (taint order kept)."""
    return {
        "taints": [t.to_doc() for t in view.taints],
        "labels": dict(sorted(view.labels.items())),
    }


def intent_doc(intent: model.Intent) -> Json:
    return {
        "action": intent.action.value,
        "count": intent.count,
        "origin": intent.origin.value,
        "reason": intent.reason.value,
        "message": intent.message,
        "node": intent.node,
    }


def sample_doc(sample: model.Sample | None) -> Json | None:
    if sample is None:
        return None
    return {"value": _number(sample.value), "at": time_doc(sample.at)}


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # JSON has no NaN or infinity


def time_doc(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


_AS_IS = frozenset({str, int, bool, type(None)})  # exact types written as they are


def jsonable(value: Any) -> Any:
    """``value`` with datetimes, durations, enums, tuples and sets made JSON-safe."""
    # The common shapes by their exact type first, each as ``_jsonable`` makes it: a wave of
    # 100 reclaims writes about 20,000 values into its records, and an ``isinstance`` against
    # ``Mapping`` asks the ABC machinery. A subclass (an enum is one of ``str`` or ``int``) is
    # not its base's exact type, and takes the full path.
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind is dict:
        return {str(k): jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(v) for v in value]
    if kind is float:
        return _number(value)
    if kind is datetime:
        return time_doc(value)
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, datetime):
        return time_doc(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [jsonable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return str(value)


def to_json(record: AuditRecord) -> Json:
    """The record as one JSON document (the stdout line, and what readers get)."""
    return {
        "id": record.id,
        "time": time_doc(record.time),
        "cluster": record.cluster,
        "kind": record.kind.value,
        "controller": record.controller,
        "term": record.term,
        "pool": record.pool,
        "node": record.node,
        "action": record.action,
        "origin": record.origin,
        "reason": record.reason,
        "message": record.message,
        "count": record.count,
        "strategy": record.strategy,
        "params": jsonable(record.params),
        "inputs": jsonable(record.inputs),
        "before": jsonable(record.before),
        "after": jsonable(record.after),
        "pods": list(record.pods),
        "dry_run": record.dry_run,
        "error": record.error,
        "outcome": record.outcome,
        "intent_id": record.intent_id,
        "detail": jsonable(record.detail),
    }
