"""PodDisruptionBudget arithmetic, as the disruption controller and the Eviction API do it.

``budget_status`` is the disruption controller's ``updatePdbStatus``: healthy pods are the
matching pods that are Ready and not terminating; ``desiredHealthy`` comes from an integer
``minAvailable`` directly, and from a percentage or ``maxUnavailable`` scaled over the pods'
controllers (the emulator keeps no ReplicaSets: a controller's scale is what
``Store.set_scale`` declared for its uid, else the number of pods naming it; pods without a
controller are "unmanaged" and not counted, as in the real controller); ``disruptionsAllowed``
is ``currentHealthy - desiredHealthy`` floored at 0, and 0 when no pod is expected.

``eviction_refusal`` is the Eviction subresource's check: a terminal, pending or terminating pod
is deleted without looking at budgets; more than one matching budget is a 500; a budget whose
status is behind its generation or has no disruptions left answers 429 with a
``DisruptionBudget`` cause naming the budget; an unready pod may go when the budget is healthy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sandbox.emulator import selector, status
from sandbox.emulator.clock import rfc3339

Obj = dict[str, Any]
EVICTION_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


def is_ready(pod: Obj) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def selects(budget: Obj, pod: Obj) -> bool:
    """The controller's matching: a nil selector selects nothing, ``{}`` every pod."""
    if budget["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    try:
        chosen = selector.from_object((budget.get("spec") or {}).get("selector"))
    except selector.SelectorError:
        return False
    return chosen is not None and chosen.matches(pod["metadata"].get("labels"))


@dataclass(frozen=True, slots=True)
class Counts:
    expected: int
    desired: int
    healthy: int

    @property
    def allowed(self) -> int:
        if self.expected <= 0:
            return 0
        return max(0, self.healthy - self.desired)


def counts(budget: Obj, pods: Iterable[Obj], scales: Mapping[str, int]) -> Counts:
    matching = [p for p in pods if selects(budget, p)]
    spec = budget.get("spec") or {}
    healthy = sum(1 for p in matching if not p["metadata"].get("deletionTimestamp") and is_ready(p))
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if max_unavailable is not None:
        expected = _controller_scale(matching, scales)
        desired = max(0, expected - _scaled(max_unavailable, expected))
    elif isinstance(min_available, int):
        expected, desired = len(matching), min_available
    elif min_available is not None:
        expected = _controller_scale(matching, scales)
        desired = _scaled(min_available, expected)
    else:
        expected, desired = len(matching), 0
    return Counts(expected=expected, desired=desired, healthy=healthy)


def _controller_scale(pods: list[Obj], scales: Mapping[str, int]) -> int:
    """The summed scale of the pods' controllers: a declared scale, else the pods naming it."""
    controllers = Counter(
        str(ref.get("uid"))
        for pod in pods
        for ref in pod["metadata"].get("ownerReferences") or []
        if ref.get("controller")
    )
    return sum(scales.get(uid, count) for uid, count in controllers.items())


def _scaled(value: int | str, total: int) -> int:
    """``GetScaledValueFromIntOrPercent`` rounding up."""
    if isinstance(value, int):
        return value
    return math.ceil(int(value.rstrip("%")) * total / 100)


def budget_status(
    budget: Obj, pods: Iterable[Obj], now: datetime, scales: Mapping[str, int]
) -> Obj:
    numbers = counts(budget, pods, scales)
    old = budget.get("status") or {}
    allowed = numbers.allowed
    condition = {
        "type": "DisruptionAllowed",
        "status": "True" if allowed > 0 else "False",
        "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
        "message": "",
        "observedGeneration": budget["metadata"].get("generation", 1),
        "lastTransitionTime": rfc3339(now),
    }
    previous = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None
    )
    if previous is not None and previous.get("status") == condition["status"]:
        condition["lastTransitionTime"] = previous["lastTransitionTime"]
    return {
        "observedGeneration": budget["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": numbers.healthy,
        "desiredHealthy": numbers.desired,
        "expectedPods": numbers.expected,
        "conditions": [condition],
    }


def can_ignore_budgets(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def eviction_refusal(pod: Obj, budgets: list[Obj]) -> status.ApiError | None:
    """Why an eviction of ``pod`` is refused, or ``None`` when the pod may be deleted."""
    if can_ignore_budgets(pod):
        return None
    matching = [b for b in budgets if _eviction_selects(b, pod)]
    if len(matching) > 1:
        return status.ApiError(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
                "code": 500,
            }
        )
    if not matching:
        return None
    return _budget_refusal(matching[0], pod)


def _eviction_selects(budget: Obj, pod: Obj) -> bool:
    raw = (budget.get("spec") or {}).get("selector")
    # The eviction handler skips budgets whose selector is nil or empty.
    return bool(raw) and selects(budget, pod)


def _budget_refusal(budget: Obj, pod: Obj) -> status.ApiError | None:
    name = budget["metadata"]["name"]
    budget_status_ = budget.get("status") or {}
    if budget_status_.get("observedGeneration", 0) < budget["metadata"].get("generation", 1):
        cause = f"The disruption budget {name} is still being processed by the server."
        return status.too_many_requests(
            EVICTION_REFUSED, 10, [{"reason": "DisruptionBudget", "message": cause}]
        )
    policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy")
    healthy = budget_status_.get("currentHealthy", 0)
    desired = budget_status_.get("desiredHealthy", 0)
    if not is_ready(pod) and (policy == "AlwaysAllow" or healthy >= desired > 0):
        return None
    if budget_status_.get("disruptionsAllowed", 0) <= 0:
        cause = (
            f"The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
        )
        return status.too_many_requests(
            EVICTION_REFUSED, 0, [{"reason": "DisruptionBudget", "message": cause}]
        )
    return None
