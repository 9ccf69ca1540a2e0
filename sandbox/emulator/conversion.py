"""Conversion between the stored Event and its ``events.k8s.io/v1`` representation.

kube-apiserver keeps one Event collection and serves it under both ``core/v1`` and
``events.k8s.io/v1``: an Event created through one API is listed and watched through the other,
with fields renamed (``note`` is ``message``, ``regarding`` is ``involvedObject``,
``reportingController`` is ``reportingComponent``, and the old counters become
``deprecated*``). The store holds the ``core/v1`` form; this module renames on the way in and out.
"""

from __future__ import annotations

from typing import Any

from sandbox.emulator.resources import EVENTS, ResourceType

Obj = dict[str, Any]

# events.k8s.io/v1 name -> core/v1 name
_RENAMES = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_BACK = {core: v1 for v1, core in _RENAMES.items()}


def to_storage(rt: ResourceType, obj: Obj) -> Obj:
    if rt is not EVENTS:
        return obj
    out = {_RENAMES.get(k, k): v for k, v in obj.items()}
    out["apiVersion"], out["kind"] = "v1", "Event"
    return out


def from_storage(rt: ResourceType, obj: Obj) -> Obj:
    """The object as ``rt`` presents it; ``kind`` and ``apiVersion`` first, as the server does."""
    if rt is EVENTS:
        body = {_BACK.get(k, k): v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    else:
        body = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return {"kind": rt.kind, "apiVersion": rt.api_version, **body}
