"""Alertmanager webhook notifications (version 4) as Alertmanager sends them, for the tests of
``POST /api/v1/alertmanager``: every field of its documented payload, a firing alert's
``endsAt`` hidden as Go's zero time, as Alertmanager hides it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"


def alert(
    name: str = "InferenceQueueHigh",
    *,
    status: str = "firing",
    fingerprint: str = "5f0e2c8a1b3d4e6f",
    starts_at: str = "2026-03-02T11:58:00.123456789Z",
    ends_at: str = ZERO_TIME,
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": f"{name} on {labels.get('service', 'llm')}"},
        "startsAt": starts_at,
        "endsAt": ends_at,
        "generatorURL": "http://prometheus:9090/graph?g0.expr=vllm%3Anum_requests_waiting",
        "fingerprint": fingerprint,
    }


def notification(
    alerts: Sequence[Mapping[str, Any]], *, version: str = "4", receiver: str = "rebalancer"
) -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": version,
        "groupKey": '{}/{service="llm"}:{alertname="InferenceQueueHigh"}',
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": receiver,
        "groupLabels": {"alertname": "InferenceQueueHigh"},
        "commonLabels": {"alertname": "InferenceQueueHigh", "service": "llm"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }
