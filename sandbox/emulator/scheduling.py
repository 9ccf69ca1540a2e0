"""The scheduler stand-in's rules: which nodes a pending pod may go to, and which one it gets.

The filters are those of kube-scheduler's default plugins that matter on a GPU pool:
``NodeUnschedulable`` (``spec.unschedulable`` unless the pod tolerates the unschedulable taint),
``TaintToleration`` (every ``NoSchedule``/``NoExecute`` taint must be tolerated; a
``PreferNoSchedule`` taint never blocks), ``NodeAffinity`` (``nodeSelector`` and the required
node affinity terms, with ``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt``) and
``NodeResourcesFit`` (every requested resource, ``nvidia.com/gpu`` included, against
allocatable minus what the node's non-terminal pods request). Toleration matching is
``Toleration.ToleratesTaint`` from ``k8s.io/api/core/v1``.

It also stands in for Volcano (``schedulerName: volcano``): the pending pods of one PodGroup
(the ``scheduling.k8s.io/group-name`` annotation) are bound all together or not at all, as its
gang plugin does, so a training job never runs with part of its workers.

The choice among feasible nodes is deterministic (the real scheduler breaks ties at random): the
node left with the largest free share of the requested resources, then the lowest name. The
refusal message is aggregated the way the scheduler writes it into ``PodScheduled=False``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sandbox.emulator import quantity

Obj = dict[str, Any]
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"  # Volcano's PodGroup of a pod
VOLCANO = "volcano"
SCHEDULERS = ("default-scheduler", VOLCANO)  # the scheduler names the stand-in answers for


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return False


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return dict(taint)
    return None


def matches_affinity(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(_term(term, node) for term in required.get("nodeSelectorTerms") or [])


def _term(term: Mapping[str, Any], node: Obj) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    by_field = {"metadata.name": node["metadata"]["name"]}
    return all(_expression(e, labels) for e in expressions) and all(
        _expression(f, by_field) for f in fields
    )


def _expression(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    values = [str(v) for v in expression.get("values") or []]
    has, value = key in labels, labels.get(key, "")
    match operator:
        case "In":
            return has and value in values
        case "NotIn":
            return not has or value not in values
        case "Exists":
            return has
        case "DoesNotExist":
            return not has
        case "Gt" | "Lt":
            return has and len(values) == 1 and _compare(value, values[0], operator)
    return False


def _compare(value: str, bound: str, operator: str) -> bool:
    try:
        left, right = int(value), int(bound)
    except ValueError:
        return False
    return left > right if operator == "Gt" else left < right


def requests(pod: Obj) -> dict[str, Decimal]:
    """Effective requests: containers summed, each init container a floor, plus overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, value in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in _container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + quantity.parse(value)
    return total


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity.parse(value) for name, value in merged.items()}


def occupies(pod: Obj) -> bool:
    """Whether a pod still holds its node's resources (terminating pods do)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get(
        "phase"
    ) not in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Placement:
    node: str | None
    message: str


def place(pod: Obj, nodes: Iterable[Obj], used: Mapping[str, Mapping[str, Decimal]]) -> Placement:
    """The node for ``pod``, or ``None`` and the reason, ``used`` being requests per node."""
    wanted = requests(pod)
    wanted["pods"] = Decimal(1)
    reasons: Counter[str] = Counter()
    feasible: list[tuple[Decimal, str]] = []
    node_list = list(nodes)
    for node in node_list:
        name = node["metadata"]["name"]
        reason = _filter(pod, node, wanted, used.get(name, {}))
        if reason is None:
            feasible.append((_free_share(node, wanted, used.get(name, {})), name))
        else:
            reasons[reason] += 1
    if feasible:
        feasible.sort(key=lambda item: (-item[0], item[1]))
        return Placement(feasible[0][1], "")
    listed = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    return Placement(None, f"0/{len(node_list)} nodes are available: {listed}.")


def _filter(
    pod: Obj, node: Obj, wanted: Mapping[str, Decimal], used: Mapping[str, Decimal]
) -> str | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    if (node.get("spec") or {}).get("unschedulable") and not any(
        tolerates(t, UNSCHEDULABLE_TAINT) for t in tolerations
    ):
        return "node(s) were unschedulable"
    if not matches_affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for name, amount in sorted(wanted.items()):
        if amount <= 0:
            continue
        available = quantity.parse(allocatable[name]) if name in allocatable else Decimal(0)
        if used.get(name, Decimal(0)) + amount > available:
            return f"Insufficient {name}" if name != "pods" else "Too many pods"
    return None


def _free_share(node: Obj, wanted: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> Decimal:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    shares = []
    for name, amount in wanted.items():
        if name == "pods" or amount <= 0 or name not in allocatable:
            continue
        total = quantity.parse(allocatable[name])
        if total > 0:
            shares.append((total - used.get(name, Decimal(0)) - amount) / total)
    return sum(shares, Decimal(0)) / len(shares) if shares else Decimal(0)


def placements(pods: Iterable[Obj], nodes: list[Obj]) -> list[tuple[Obj, Placement]]:
    """Where each pending pod goes, in queue order (priority, then age), each placement taking
    its requests from what the later pods may use: one scheduling pass over a snapshot. The
    pending members of one Volcano PodGroup are placed together where the first of them stands
    in the queue, all of them or none."""
    pods = list(pods)
    used = _usage(pods)
    out = []
    for unit in _units(sorted(filter(_pending, pods), key=_queue_order)):
        out.extend(_place_unit(unit, nodes, used))
    return out


def _units(queue: list[Obj]) -> list[list[Obj]]:
    """The queue as what is placed at once: a pod, or the pending members of a PodGroup."""
    units: list[list[Obj]] = []
    groups: dict[tuple[str, str], list[Obj]] = {}
    for pod in queue:
        group = _group(pod)
        if group is None:
            units.append([pod])
        elif group in groups:
            groups[group].append(pod)
        else:
            groups[group] = [pod]
            units.append(groups[group])
    return units


def _group(pod: Obj) -> tuple[str, str] | None:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    name = (meta.get("annotations") or {}).get(GROUP_ANNOTATION)
    if spec.get("schedulerName") != VOLCANO or not name:
        return None
    return meta.get("namespace", ""), name


def _place_unit(
    unit: list[Obj], nodes: list[Obj], used: dict[str, dict[str, Decimal]]
) -> list[tuple[Obj, Placement]]:
    """Place every pod of ``unit`` on a trial copy of ``used``; keep it only if all fit, as
    Volcano's gang plugin binds a job's tasks only once ``minMember`` of them can run (here
    every member still pending: the stand-in reads no PodGroup object)."""
    trial = {name: dict(slot) for name, slot in used.items()}
    out = []
    for pod in unit:
        placement = place(pod, nodes, trial)
        out.append((pod, placement))
        if placement.node is None:
            continue
        slot = trial.setdefault(placement.node, {})
        for resource, amount in {**requests(pod), "pods": Decimal(1)}.items():
            slot[resource] = slot.get(resource, Decimal(0)) + amount
    refused = [p.message for _, p in out if p.node is None]
    if not refused:
        used.clear()
        used.update(trial)
        return out
    if len(unit) == 1:
        return out
    group = _group(unit[0])
    assert group is not None
    message = (
        f"pod group {group[1]}: {len(unit) - len(refused)} of {len(unit)} pods fit, "
        f"none is bound: {refused[0]}"
    )
    return [(pod, Placement(None, message)) for pod in unit]


def _pending(pod: Obj) -> bool:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    return (
        not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and spec.get("schedulerName", "default-scheduler") in SCHEDULERS
        and not spec.get("schedulingGates")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
    )


def _queue_order(pod: Obj) -> tuple[int, str, str, str]:
    meta = pod["metadata"]
    priority = int((pod.get("spec") or {}).get("priority", 0))
    return (-priority, meta.get("creationTimestamp", ""), meta.get("namespace", ""), meta["name"])


def _usage(pods: Iterable[Obj]) -> dict[str, dict[str, Decimal]]:
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        if not occupies(pod):
            continue
        slot = used.setdefault(pod["spec"]["nodeName"], {})
        for resource, amount in {**requests(pod), "pods": Decimal(1)}.items():
            slot[resource] = slot.get(resource, Decimal(0)) + amount
    return used
