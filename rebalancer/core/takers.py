"""Who would use a lent node: pending training pods, as gangs, placed on what a pool could lend.

Where it sits: the planner (``core.planning``) asks ``place`` which of the nodes it may lend a
pending job would run on, and lends only those when the pool lends to takers only
(``PoolPolicy.lend_only_to_takers``). A lent node that no job can use harvests nothing and
still has to come back; one a job cannot use properly (the wrong GPU, too little memory) is
worse. Pure: no I/O, no clock.

How a node is judged, as kube-scheduler's filters would judge it once the node is lent (held to
the real scheduler: tests/kubeapi/test_takers_differential.py, docs/design/takers.md):

- every ``NoSchedule``/``NoExecute`` taint the node will carry is tolerated (the lend taint
  among them; ``PreferNoSchedule`` never blocks);
- ``nodeSelector`` and one term of the required node affinity match the labels it will carry
  (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``: so a job that asks for
  ``nvidia.com/gpu.family In [hopper]`` or ``nvidia.com/gpu.memory Gt 70000`` is never lent an
  Ampere node or a 48 GB card; an empty term matches no node, ``matchFields`` the node's name,
  and ``Gt``/``Lt`` read integers as Go does);
- its requests (GPUs, CPU, memory) fit what the node offers less what its pods hold. A node
  whose allocatable is unknown fits nothing that asks for anything.

Gangs: the pending pods of one job (``PendingPod.job``; a pod without one is a job of its own)
run together or not at all, so they are placed together: on room the pool has lent already,
then on as few new nodes as it takes, and lent only if the whole gang fits within what the
rules allow this tick. Placing is greedy and deterministic: jobs by priority (highest first),
then age (oldest first); pods largest first; each on the first node where it fits, nodes
already lent before new ones, new ones in the planner's order (cheapest first).

A pod that fits on room already lent needs no new loan: that room counts first, so a node
lent last tick for a job the scheduler has not placed yet is not lent a second time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rebalancer.core.model import (
    NodeName,
    PendingPod,
    Requirement,
    Resources,
    Taint,
    tolerates,
)

_BLOCKING = ("NoSchedule", "NoExecute")
# A required node affinity's ``matchFields`` entry (``metadata.name``, the one field) is read as a
# requirement on this key, which no label can have (a label key has no colon): it is matched
# against the node's name.
NODE_NAME_FIELD = "field:metadata.name"
_DECIMAL_INTEGER = re.compile(r"[+-]?[0-9]+")
_NEVER = datetime.max.replace(tzinfo=UTC)  # a pod with no creation time queues last


@dataclass(frozen=True, slots=True)
class Room:
    """A node as a pending pod would find it: the labels and taints it carries (once lent, for
    a node not lent yet), and what its pods leave free (None: unknown)."""

    node: NodeName
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    free: Resources | None


@dataclass(frozen=True, slots=True)
class Gang:
    """The pending pods of one job: they run together or not at all."""

    key: str
    pods: tuple[PendingPod, ...]

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @property
    def created(self) -> datetime:
        return min(p.created or _NEVER for p in self.pods)


@dataclass(frozen=True)
class Placement:
    """What ``place`` found: the new nodes to lend, each with the job it is lent for, in the
    order they were taken; the jobs that fit on room already lent; and, for each job that
    could not be placed, why."""

    lend: tuple[tuple[NodeName, str], ...] = ()
    served: tuple[str, ...] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)
    used: frozenset[NodeName] = frozenset()  # the ``lent`` rooms a placed pod went to


def gangs(pods: Iterable[PendingPod]) -> tuple[Gang, ...]:
    """The pods grouped by job, in the order they are placed."""
    groups: dict[str, list[PendingPod]] = {}
    for pod in pods:
        groups.setdefault(job_key(pod), []).append(pod)
    built = [
        Gang(key, tuple(sorted(members, key=_largest_first))) for key, members in groups.items()
    ]
    return tuple(sorted(built, key=lambda g: (-g.priority, g.created, g.key)))


def job_key(pod: PendingPod) -> str:
    return pod.job if pod.job is not None else f"pod:{pod.namespace}/{pod.name}"


def place(
    jobs: Sequence[Gang], lent: Sequence[Room], offered: Sequence[Room], budget: int
) -> Placement:
    """Place ``jobs`` on ``lent`` room first, then on at most ``budget`` of the ``offered``
    nodes (in their order); see the module docstring."""
    free = {room.node: room.free for room in (*lent, *offered)}
    rooms = list(lent)
    fresh = list(offered)
    lend: list[tuple[NodeName, str]] = []
    served: list[str] = []
    waiting: dict[str, str] = {}
    used: set[NodeName] = set()
    held = {room.node for room in lent}
    for gang in jobs:
        trial = dict(free)
        taken: list[Room] = []
        why = None
        landed: set[NodeName] = set()
        for pod in gang.pods:
            room = _first_fit(pod, rooms + taken, trial) or _first_fit(pod, fresh, trial)
            if room is None:
                why = _why_nowhere(pod, rooms + fresh)
                break
            if room not in rooms and room not in taken:
                fresh.remove(room)
                taken.append(room)
            trial[room.node] = _less(trial[room.node], pod.requests)
            landed.add(room.node)
        if why is None and len(lend) + len(taken) > budget:
            why = f"needs {len(taken)} more nodes at once; {budget - len(lend)} may be lent"
        if why is not None:
            waiting[gang.key] = why
            fresh = [room for room in offered if room in fresh or room in taken]
            continue
        free = trial
        used |= landed & held
        rooms.extend(taken)
        lend.extend((room.node, gang.key) for room in taken)
        if not taken:
            served.append(gang.key)
    return Placement(tuple(lend), tuple(served), waiting, frozenset(used))


def accepts(
    pod: PendingPod,
    labels: Mapping[str, str],
    taints: Iterable[Taint],
    node: NodeName | None = None,
) -> str | None:
    """Why ``pod`` would not be scheduled on ``node``, with these labels and taints (whatever
    its room), or None when it would. A requirement on the node's name (``matchFields``) is met
    by no node when ``node`` is not given."""
    for taint in taints:
        if taint.effect in _BLOCKING and not tolerates(pod.tolerations, taint):
            return f"does not tolerate {taint}"
    for key, value in pod.node_selector:
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    if pod.affinity and not any(_term_matches(term, labels, node) for term in pod.affinity):
        terms = " or ".join(", ".join(map(str, term)) or "(empty)" for term in pod.affinity)
        return f"node affinity {terms}"
    return None


def _term_matches(
    term: Sequence[Requirement], labels: Mapping[str, str], node: NodeName | None
) -> bool:
    """One node selector term: all its requirements hold. An empty term matches no node, as
    kube-scheduler reads it (``nodeaffinity``: a term without requirements selects nothing)."""

    def holds(r: Requirement) -> bool:
        if r.key != NODE_NAME_FIELD:
            return matches(r, labels)
        return node is not None and matches(r, {NODE_NAME_FIELD: node})

    return bool(term) and all(holds(r) for r in term)


def matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """One node selector requirement against a node's labels (``k8s.io/api/core/v1``
    semantics: ``Gt``/``Lt`` compare whole numbers, and a label that is not one never
    matches)."""
    op, value = requirement.operator, labels.get(requirement.key)
    if op == "In":
        return value is not None and value in requirement.values
    if op == "NotIn":
        return value is None or value not in requirement.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(requirement.values) == 1:
        have, bound = _integer(value), _integer(requirement.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False  # an operator the API does not know admits no node


def _integer(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it (the scheduler's ``Gt`` and
    ``Lt``): a sign, ASCII digits and nothing else (no ``_``, no spaces), within int64; else
    None. Python's ``int`` reads ``81_920`` and numbers past int64, which Go refuses."""
    if _DECIMAL_INTEGER.fullmatch(text) is None:
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def _first_fit(
    pod: PendingPod, rooms: Sequence[Room], free: Mapping[NodeName, Resources | None]
) -> Room | None:
    for room in rooms:
        left = free[room.node]
        if accepts(pod, room.labels, room.taints, room.node) is None and _fits(pod.requests, left):
            return room
    return None


def _fits(wanted: Resources, free: Resources | None) -> bool:
    if free is None:
        return wanted == Resources()
    return free.covers(wanted)


def _less(free: Resources | None, used: Resources) -> Resources | None:
    return None if free is None else free - used


def _why_nowhere(pod: PendingPod, rooms: Sequence[Room]) -> str:
    """Why ``pod`` fits none of ``rooms``: the first node's refusal, or its room."""
    name = f"pod {pod.namespace}/{pod.name}"
    if not rooms:
        return f"{name}: no node to lend"
    refusal = accepts(pod, rooms[0].labels, rooms[0].taints, rooms[0].node)
    if refusal is not None:
        return f"{name}: {rooms[0].node} {refusal}"
    return f"{name} asks {pod.requests}: more than any node it accepts has free"


def _largest_first(pod: PendingPod) -> tuple[int, int, int, str, str]:
    r = pod.requests
    return (-r.gpu, -r.memory, -r.cpu, pod.namespace, pod.name)
