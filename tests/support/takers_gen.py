"""Generated clusters for holding ``core.takers`` to the real kube-scheduler
(``tests/kubeapi/test_takers_differential.py``).

A case is a small cluster of its own: one to three GPU nodes of a pool, as they will be once lent
(the pool's serving taint swapped for its lend taint, its lent labels set: ``LEND_SPEC``), some
holding pods already (bound, highest priority: nothing preempts them), and one pending pod. Every
node of a case carries the label ``CASE_LABEL`` with the case's name and the case's pods select it
(``nodeSelector``): many cases share one API server and one scheduler without ever meeting, and a
case's one pending pod competes with no other for room.

What is drawn, seeded (``cases(seed, count)`` is the same list every time):

- nodes: GPU family and memory labels (sometimes missing, sometimes not a whole number: ``80Gi``,
  ``81_920``, a number past int64, leading zeros), other labels; taints besides the lend taint
  with every effect (``NoSchedule``, ``NoExecute``, ``PreferNoSchedule``), with and without a
  value; allocatable GPUs (or none said), CPU and memory; pods holding part of it (init
  containers and a RuntimeClass's overhead among them);
- the pending pod: tolerations (``Equal``, ``Exists``, with and without a key or an effect,
  right and wrong values and effects, the lend taint's own or not), a ``nodeSelector``, a
  required node affinity with every operator (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``,
  ``Gt``, ``Lt``; ``matchFields`` on ``metadata.name``; integers written as Go would not read
  them), containers whose requests (or limits only) land near a node's free room, init
  containers (sidecars too: ``restartPolicy: Always``), a RuntimeClass with overhead, a
  priority class.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rebalancer.adapters import convert
from rebalancer.core import model, nodestate, takers
from tests.support.control_plane import fake_node

Obj = dict[str, Any]

KEYS = nodestate.Keys()
CASE_LABEL = "rebalancer.test/case"
FAMILY = "nvidia.com/gpu.family"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
GPU = "nvidia.com/gpu"
SERVING_TAINT = model.Taint(key="workload", value="inference", effect="NoSchedule")
LEND_TAINT = model.Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule")
LEND_SPEC = nodestate.LendSpec(
    remove_taints=(SERVING_TAINT,),
    add_taints=(LEND_TAINT,),
    labels={"workload": "training", "rebalancer-test/borrowed": "yes"},
)

# Cluster-wide objects the cases use: created once, before any case.
HOLDER_CLASS = "holder"  # the holding pods': above every pending pod's, so none is preempted
PRIORITY_CLASSES = {HOLDER_CLASS: 1_000_000, "low": -10, "mid": 100, "high": 10_000}
RUNTIME_CLASSES = {
    "kata": {"cpu": "250m", "memory": "160Mi"},
    "gvisor": {"cpu": "1", "memory": "1Gi"},
}

FAMILIES = ("hopper", "ampere", "ada", "blackwell")
MEMORIES = ("81559", "81920", "46068", "143771", "24564")
ODD_MEMORIES = ("80Gi", "81_920", "0081920", "99999999999999999999", "9223372036854775807")
OTHER_TAINTS = (
    model.Taint("nvidia.com/gpu", "NoSchedule", "present"),
    model.Taint("nvidia.com/gpu", "NoSchedule"),
    model.Taint("dedicated", "NoExecute", "ml"),
    model.Taint("spot", "PreferNoSchedule", "true"),
    model.Taint("maintenance", "NoExecute"),
    model.Taint("zone", "NoSchedule", "b"),
    model.Taint("example.com/quirk", "PreferNoSchedule"),
)


@dataclass(frozen=True)
class Case:
    """One cluster: its nodes as they serve (JSON, as created; ``lend_patch`` lends them), the
    pods holding part of them (bound by ``spec.nodeName``) and the pending pod."""

    name: str  # c0042: the nodes' CASE_LABEL, the pending pod's name
    nodes: tuple[Obj, ...]
    holders: tuple[Obj, ...]
    pending: Obj


def cases(seed: int, count: int) -> list[Case]:
    return [_case(random.Random(seed * 100_003 + i), f"c{i:04d}") for i in range(count)]


# ---------------------------------------------------------------------------------------------
# Edge cases, written by hand: each on the one rule it names, everything else welcoming, so that
# the suite always holds takers to them (the random cases meet most of them only now and then).

_SEVENTY_GB = {"key": MEMORY, "operator": "Gt", "values": ["70000"]}
_EDGES: tuple[tuple[str, Obj, Obj], ...] = (
    # (what, node: labels/taints/allocatable, pod: spec fields); the node serves with
    # SERVING_TAINT and is lent, the pod tolerates the lend taint.
    (
        "Gt on a label Go cannot read (81_920)",
        {"labels": {MEMORY: "81_920"}},
        {"terms": [[_SEVENTY_GB]]},
    ),
    (
        "Gt on a label past int64",
        {"labels": {MEMORY: "99999999999999999999"}},
        {"terms": [[_SEVENTY_GB]]},
    ),
    (
        "Gt on a label with leading zeros",
        {"labels": {MEMORY: "0081920"}},
        {"terms": [[_SEVENTY_GB]]},
    ),
    (
        "Gt on the largest int64",
        {"labels": {MEMORY: "9223372036854775807"}},
        {"terms": [[_SEVENTY_GB]]},
    ),
    (
        "Gt bound Go cannot read (70_000)",
        {"labels": {MEMORY: "81920"}},
        {"terms": [[{"key": MEMORY, "operator": "Gt", "values": ["70_000"]}]]},
    ),
    (
        "Lt bound with leading zero",
        {"labels": {MEMORY: "46068"}},
        {"terms": [[{"key": MEMORY, "operator": "Lt", "values": ["070000"]}]]},
    ),
    ("an empty term alone", {}, {"terms": [[]]}),
    (
        "an empty term beside one that matches",
        {},
        {"terms": [[], [{"key": "pool", "operator": "Exists"}]]},
    ),
    (
        "matchFields metadata.name NotIn its own name",
        {},
        {"fields": [{"key": "metadata.name", "operator": "NotIn", "values": ["SELF"]}]},
    ),
    (
        "matchFields metadata.name In its own name",
        {},
        {"fields": [{"key": "metadata.name", "operator": "In", "values": ["SELF"]}]},
    ),
    (
        "a label named metadata.name is not the node's name",
        {"labels": {"metadata.name": "other"}},
        {"terms": [[{"key": "metadata.name", "operator": "In", "values": ["SELF"]}]]},
    ),
    (
        "a sidecar runs beside the containers",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "7500m", "sidecar": "1"},
    ),
    (
        "an init container after a sidecar needs both at once",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "1", "sidecar": "1", "init": "7500m"},
    ),
    (
        "an init container alone larger than the node",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "1", "init": "8500m"},
    ),
    (
        "an init container as large as the node",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "1", "init": "8"},
    ),
    (
        "pod-level requests over the node",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "1", "pod_cpu": "9"},
    ),
    (
        "pod-level requests within the node",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "1", "pod_cpu": "8"},
    ),
    (
        "overhead tips it over",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "7800m", "runtime": "kata"},
    ),
    (
        "overhead just fits",
        {"allocatable": {"cpu": "8"}},
        {"cpu": "7750m", "runtime": "kata"},
    ),
    (
        "milli-bytes rounded up past the node",
        {"allocatable": {"memory": "16Gi"}},
        {"memory": f"{16 * 2**30}001m"},
    ),
    (
        "milli-bytes rounded up to the node",
        {"allocatable": {"memory": "16Gi"}},
        {"memory": f"{16 * 2**30 - 1}001m"},
    ),
    ("a limit stands in for a request", {"allocatable": {"cpu": "8"}}, {"cpu_limit": "9"}),
    ("GPUs past the node", {"allocatable": {GPU: "4"}}, {"gpu": "5"}),
    ("GPUs on a node that says none", {"allocatable": {}}, {"gpu": "1"}),
    (
        "PreferNoSchedule never blocks",
        {"taints": [model.Taint("spot", "PreferNoSchedule", "true")]},
        {"tolerate": []},
    ),
    (
        "NoExecute not tolerated",
        {"taints": [model.Taint("maintenance", "NoExecute")]},
        {"tolerate": []},
    ),
    (
        "NoExecute tolerated as NoSchedule",
        {"taints": [model.Taint("maintenance", "NoExecute")]},
        {"tolerate": [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]},
    ),
    (
        "one toleration with no key and no effect tolerates all",
        {
            "taints": [
                model.Taint("maintenance", "NoExecute"),
                model.Taint("zone", "NoSchedule", "b"),
            ]
        },
        {"tolerate": [{"operator": "Exists"}], "lend": False},
    ),
    (
        "Equal without a value tolerates a taint without one",
        {"taints": [model.Taint("maintenance", "NoExecute")]},
        {"tolerate": [{"key": "maintenance", "operator": "Equal"}]},
    ),
    (
        "Equal without a value does not tolerate a taint with one",
        {"taints": [model.Taint("zone", "NoSchedule", "b")]},
        {"tolerate": [{"key": "zone", "operator": "Equal"}]},
    ),
    ("the lend taint not tolerated", {}, {"lend": False}),
    ("the serving label asked for, gone once lent", {}, {"selector": {"workload": "inference"}}),
    ("the lent label asked for", {}, {"selector": {"workload": "training"}}),
)


def edge_cases(first: int = 9000) -> list[Case]:
    """``_EDGES``, one case each, named from ``c{first}`` on."""
    return [_edge(f"c{first + i:04d}", node, pod) for i, (_, node, pod) in enumerate(_EDGES)]


def edge_reasons(first: int = 9000) -> dict[str, str]:
    return {f"c{first + i:04d}": what for i, (what, _, _) in enumerate(_EDGES)}


def _edge(name: str, node_spec: Obj, pod: Obj) -> Case:
    node_name = f"{name}-n0"
    allocatable = {"cpu": "16", "memory": "64Gi", GPU: "8"}
    if "allocatable" in node_spec:
        allocatable = {"cpu": "16", "memory": "64Gi", **node_spec["allocatable"]}
    node = fake_node(node_name, allocatable)
    labels = node["metadata"]["labels"]
    labels.update({CASE_LABEL: name, "pool": "gpu", "workload": "inference", FAMILY: "hopper"})
    labels.update({MEMORY: "81559", **node_spec.get("labels", {})})
    taints = [SERVING_TAINT, *node_spec.get("taints", ())]
    node["spec"] = {"taints": [t.to_doc() for t in taints]}

    tolerations = list(pod.get("tolerate", ()))
    if pod.get("lend", True):
        tolerations.append({"key": LEND_TAINT.key, "operator": "Exists"})
    requests = {"cpu": pod.get("cpu", "1"), "memory": pod.get("memory", "1Gi")}
    container: Obj = {"name": "c0", "image": "example.com/train:1", "resources": {}}
    if "cpu_limit" in pod:
        container["resources"]["limits"] = {"cpu": pod["cpu_limit"], "memory": "1Gi"}
    else:
        container["resources"]["requests"] = requests
    if "gpu" in pod:
        container["resources"].setdefault("limits", {})[GPU] = pod["gpu"]
    spec: Obj = {
        "nodeSelector": {CASE_LABEL: name, **pod.get("selector", {})},
        "tolerations": tolerations,
        "containers": [container],
    }
    inits = []
    if "sidecar" in pod:
        sidecar = _container("sidecar", {"cpu": pod["sidecar"], "memory": "1Gi"}, False)
        inits.append({**sidecar, "restartPolicy": "Always"})
    if "init" in pod:
        inits.append(_container("init", {"cpu": pod["init"], "memory": "1Gi"}, False))
    if inits:
        spec["initContainers"] = inits
    if "pod_cpu" in pod:
        spec["resources"] = {"requests": {"cpu": pod["pod_cpu"]}}
    if "runtime" in pod:
        spec["runtimeClassName"] = pod["runtime"]
    terms = [{"matchExpressions": term} if term else {} for term in pod.get("terms", ())]
    if "fields" in pod:
        terms.append({"matchFields": pod["fields"]})
    if terms:
        text = json.dumps(terms).replace("SELF", node_name)
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": json.loads(text)
                }
            }
        }
    return Case(name, (node,), (), _pod(name, spec))


# ---------------------------------------------------------------------------------------------
# What core.takers says, from the objects as the API server holds them


def lend_patch(node: Obj) -> Obj:
    """The merge patch that lends a serving node as the actuator's lend leaves it: the pool's
    serving taint swapped for its lend taint, its lent labels set (``LEND_SPEC``). Written
    once KWOK has made the node Ready, it also takes off the ``node.kubernetes.io/not-ready``
    taint the server put on at creation (the lifecycle controller would, at 10 nodes a second)."""
    view = convert.node_view(node)
    taints = nodestate.lent_taints(view.taints, LEND_SPEC)
    return {
        "metadata": {"labels": dict(LEND_SPEC.labels)},
        "spec": {"taints": [t.to_doc() for t in taints]},
    }


def rooms(nodes: Sequence[Obj], holders: Sequence[Obj]) -> list[takers.Room]:
    """Each serving node as the planner builds its room for a lend (``core.planning.rooms``,
    a node not lent yet): the labels and taints it carries once lent, free = allocatable less
    what its pods request."""
    out = []
    for node in nodes:
        view = convert.node_view(node)
        change = nodestate.NodeChange(
            nodestate.lent_taints(view.taints, LEND_SPEC), LEND_SPEC.labels, {}
        )
        after = nodestate.apply(view, change)
        labels, taints = after.labels, after.taints
        held = [
            convert.pod_record(p).requests
            for p in holders
            if p["spec"].get("nodeName") == view.name and not convert.finished(p)
        ]
        free = None
        if view.allocatable is not None:
            free = view.allocatable - sum(held, model.NOTHING)
        out.append(takers.Room(view.name, labels, taints, free))
    return out


def fits(pod: Obj, room: takers.Room) -> bool:
    """Whether ``core.takers`` places the pod (read by ``convert.pending_pod``) on this room."""
    pending = convert.pending_pod(pod, pod["spec"])
    placed = takers.place(takers.gangs([pending]), (), (room,), 1)
    return bool(placed.lend)


def refusal(pod: Obj, room: takers.Room) -> str:
    """Why takers refuses the room (its first filter), or what it fits."""
    pending = convert.pending_pod(pod, pod["spec"])
    why = takers.accepts(pending, room.labels, room.taints, room.node)
    if why is not None:
        return why
    if fits(pod, room):
        return "fits"
    return f"asks {pending.requests}, free {room.free}"


# ---------------------------------------------------------------------------------------------
# Drawing a case


def _case(rng: random.Random, name: str) -> Case:
    count = rng.choice((1, 1, 2, 2, 3))
    serving = [_serving_node(rng, f"{name}-n{j}", name) for j in range(count)]
    # The nodes as they are once lent: what the pending pod is drawn against.
    lent = []
    for node, room in zip(serving, rooms(serving, ()), strict=True):
        drawn = copy.deepcopy(node)
        drawn["metadata"]["labels"] = dict(room.labels)
        drawn["spec"] = {"taints": [t.to_doc() for t in room.taints]}
        lent.append(drawn)
    holders = []
    for node in lent:
        for k in range(rng.choice((0, 0, 1, 1, 2))):
            holders.append(_holder(rng, node, f"{name}-{node['metadata']['name'][-2:]}-h{k}"))
    pending = _pending(rng, name, lent, holders)
    return Case(name, tuple(serving), tuple(holders), pending)


def _serving_node(rng: random.Random, name: str, case: str) -> Obj:
    gpus = rng.choice((0, 1, 2, 4, 8, 8, None))
    allocatable = {
        "cpu": rng.choice(("4", "8", "16", "32", "7500m")),
        "memory": rng.choice(("16Gi", "64Gi", "128Gi", "250Gi", "100G")),
    }
    if gpus is not None:
        allocatable[GPU] = str(gpus)
    node = fake_node(name, allocatable)
    labels = node["metadata"]["labels"]
    labels.update({CASE_LABEL: case, "pool": "gpu", "workload": "inference"})
    if rng.random() < 0.85:
        labels[FAMILY] = rng.choice(FAMILIES)
    if rng.random() < 0.85:
        labels[MEMORY] = rng.choice(ODD_MEMORIES if rng.random() < 0.3 else MEMORIES)
    if gpus and rng.random() < 0.5:
        labels[COUNT] = str(gpus)
    taints = [SERVING_TAINT]
    for taint in rng.sample(OTHER_TAINTS, rng.choice((0, 0, 1, 1, 2, 3))):
        if all((t.key, t.effect) != (taint.key, taint.effect) for t in taints):
            taints.append(taint)  # the API holds one taint per key and effect
    node["spec"] = {"taints": [t.to_doc() for t in taints]}
    return node


def _holder(rng: random.Random, node: Obj, name: str) -> Obj:
    """A pod bound to ``node`` holding part of it: tolerates everything (the taint eviction
    controller leaves it), the highest priority (no pending pod preempts it)."""
    allocatable = node["status"]["allocatable"]
    gpus = int(allocatable.get(GPU, "0"))
    spec: Obj = {
        "nodeName": node["metadata"]["name"],
        "priorityClassName": HOLDER_CLASS,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            _container(
                "work",
                {
                    GPU: rng.randint(0, gpus // 2) if gpus else 0,
                    "cpu": rng.choice(("500m", "1", "2", "3500m")),
                    "memory": rng.choice(("1Gi", "8Gi", "20Gi", "3G")),
                },
                rng.random() < 0.2,
            )
        ],
    }
    if rng.random() < 0.3:
        spec["initContainers"] = [_container("setup", {"cpu": "3", "memory": "24Gi"}, False)]
    if rng.random() < 0.2:
        sidecar = _container("proxy", {"cpu": "1", "memory": "2Gi"}, False)
        sidecar["restartPolicy"] = "Always"
        spec.setdefault("initContainers", []).append(sidecar)
    if rng.random() < 0.3:
        spec["runtimeClassName"] = rng.choice(sorted(RUNTIME_CLASSES))
    return _pod(name, spec)


def _pending(rng: random.Random, name: str, nodes: Sequence[Obj], holders: Sequence[Obj]) -> Obj:
    target = rng.choice(nodes)  # the node whose room, labels and taints the pod is drawn near
    # One filter (or all of them) drawn to be passed or failed alike; the others drawn to be
    # passed on ``target``: else nearly every pod would fail one of the four, and the cases
    # would hold takers to saying no.
    focus = rng.choice(("taints", "selector", "affinity", "requests", "all"))
    spec: Obj = {
        "nodeSelector": {CASE_LABEL: name, **_selector(rng, target, focus in ("selector", "all"))},
        "tolerations": _tolerations(rng, target, focus in ("taints", "all")),
        **_requests(rng, target, holders, focus in ("requests", "all")),
    }
    affinity = _affinity(rng, nodes, target, focus in ("affinity", "all"))
    if affinity is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}
            }
        }
    if rng.random() < 0.3:
        spec["runtimeClassName"] = rng.choice(sorted(RUNTIME_CLASSES))
    if rng.random() < 0.4:
        spec["priorityClassName"] = rng.choice(("low", "mid", "high"))
    return _pod(name, spec)


def _selector(rng: random.Random, node: Obj, hard: bool) -> dict[str, str]:
    labels = node["metadata"]["labels"]
    chosen: dict[str, str] = {}
    if not hard:
        own = [k for k in (FAMILY, MEMORY, "pool", "workload") if k in labels]
        return {k: labels[k] for k in rng.sample(own, rng.choice((0, 0, 1, 2)))}
    roll = rng.random()
    if roll < 0.3 and FAMILY in labels:
        chosen[FAMILY] = labels[FAMILY]  # its own family
    elif roll < 0.4:
        chosen[FAMILY] = rng.choice(FAMILIES)
    if rng.random() < 0.2:
        chosen["workload"] = rng.choice(("training", "inference"))  # lent, or as it served
    if rng.random() < 0.1:
        chosen["rebalancer-test/borrowed"] = "yes"
    return chosen


def _tolerations(rng: random.Random, node: Obj, hard: bool) -> list[Obj]:
    out: list[Obj] = []
    lend = rng.random() if hard else rng.random() * 0.82
    if lend < 0.55:
        out.append({"key": LEND_TAINT.key, "operator": "Equal", "value": "training"})
        if rng.random() < 0.5:
            out[-1]["effect"] = rng.choice(("NoSchedule", "NoSchedule", "NoExecute"))
    elif lend < 0.75:
        out.append({"key": LEND_TAINT.key, "operator": "Exists"})
        if rng.random() < 0.3:
            out[-1]["effect"] = "NoSchedule"
    elif lend < 0.82:
        out.append({"operator": "Exists"})  # tolerates every taint
        if rng.random() < 0.4:
            out[-1]["effect"] = rng.choice(("NoSchedule", "NoExecute", "PreferNoSchedule"))
    elif lend < 0.9:
        out.append({"key": LEND_TAINT.key, "operator": "Equal", "value": "inference"})
    # else: does not tolerate the lend taint at all
    taints = [
        model.Taint(str(t["key"]), str(t["effect"]), t.get("value"))
        for t in node["spec"]["taints"]
        if t["key"] != LEND_TAINT.key
    ]
    for taint in [*taints, *rng.sample(OTHER_TAINTS, 1)]:
        if not hard:
            effect = {"effect": taint.effect} if rng.random() < 0.5 else {}
            out.append({"key": taint.key, "operator": "Exists", **effect})
            continue
        if rng.random() < 0.25:
            continue  # left untolerated
        out.append(_toleration(rng, taint))
    rng.shuffle(out)
    return out


def _toleration(rng: random.Random, taint: model.Taint) -> Obj:
    kind = rng.random()
    if kind < 0.35 and taint.value is not None:
        value = taint.value if rng.random() < 0.85 else taint.value + "x"
        t: Obj = {"key": taint.key, "operator": "Equal", "value": value}
    elif kind < 0.45:
        t = {"key": taint.key, "operator": "Equal"}  # no value: tolerates a taint without one
    else:
        t = {"key": taint.key, "operator": "Exists"}
    roll = rng.random()
    if roll < 0.5:
        t["effect"] = taint.effect
    elif roll < 0.65:
        others = ("NoSchedule", "NoExecute", "PreferNoSchedule")
        t["effect"] = rng.choice([e for e in others if e != taint.effect])  # the wrong one
    if t.get("effect") == "NoExecute" and rng.random() < 0.5:
        # Both ignore it when placing; not 0: the taint eviction controller would delete the
        # pod at once, before the test reads where it was bound.
        t["tolerationSeconds"] = rng.choice((300, 3600))
    return t


def _affinity(
    rng: random.Random, nodes: Sequence[Obj], target: Obj, hard: bool
) -> list[Obj] | None:
    if rng.random() < 0.4:
        return None
    if not hard:
        return [{"matchExpressions": _welcoming(rng, target)}]
    terms = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        term: Obj = {}
        expressions: list[Obj] = []
        fields: list[Obj] = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            requirement = _requirement(rng, nodes)
            (fields if requirement.pop("field", False) else expressions).append(requirement)
        if expressions:
            term["matchExpressions"] = expressions
        if fields:
            term["matchFields"] = fields
        if rng.random() < 0.03:
            term = {}  # an empty term
        terms.append(term)
    return terms


def _welcoming(rng: random.Random, node: Obj) -> list[Obj]:
    """Requirements ``node`` meets."""
    labels = node["metadata"]["labels"]
    out: list[Obj] = [{"key": "example.com/absent", "operator": "DoesNotExist"}]
    if FAMILY in labels:
        out.append({"key": FAMILY, "operator": "In", "values": [labels[FAMILY], "hopper"]})
    else:
        out.append({"key": FAMILY, "operator": "NotIn", "values": ["ampere"]})
    if labels.get(MEMORY, "").isdigit() and len(labels[MEMORY]) < 10:
        out.append({"key": MEMORY, "operator": "Gt", "values": [str(int(labels[MEMORY]) - 1)]})
    out.append({"key": "pool", "operator": "Exists"})
    return rng.sample(out, rng.choice((1, 2)))


def _requirement(rng: random.Random, nodes: Sequence[Obj]) -> Obj:
    roll = rng.random()
    if roll < 0.2:
        values = rng.sample(FAMILIES, rng.choice((1, 1, 2, 3)))
        return {"key": FAMILY, "operator": rng.choice(("In", "NotIn")), "values": values}
    if roll < 0.55:
        bound = rng.choice(("70000", "46068", "81559", "100000", "0", "70_000", "070000", "7e4"))
        key = MEMORY if rng.random() < 0.85 else COUNT
        if key == COUNT:
            bound = rng.choice(("1", "2", "4", "7"))
        return {"key": key, "operator": rng.choice(("Gt", "Lt")), "values": [bound]}
    if roll < 0.7:
        key = rng.choice((FAMILY, MEMORY, COUNT, "example.com/absent", "pool"))
        return {"key": key, "operator": rng.choice(("Exists", "DoesNotExist"))}
    if roll < 0.8:
        key = rng.choice(("workload", "rebalancer-test/borrowed", "pool"))
        values = rng.sample(("training", "inference", "yes", "gpu"), rng.choice((1, 2)))
        return {"key": key, "operator": rng.choice(("In", "NotIn")), "values": values}
    if roll < 0.9:
        key = MEMORY if rng.random() < 0.5 else COUNT
        values = rng.sample((*MEMORIES, "8", "4", "2"), rng.choice((1, 2)))
        return {"key": key, "operator": rng.choice(("In", "NotIn")), "values": values}
    name = rng.choice(nodes)["metadata"]["name"]
    return {
        "key": "metadata.name",
        "operator": rng.choice(("In", "NotIn")),
        "values": [name],
        "field": True,
    }


def _requests(rng: random.Random, node: Obj, holders: Sequence[Obj], hard: bool) -> Obj:
    """Containers (and init containers) whose requests land near what ``node`` has free: just
    in, just out, or anywhere."""
    allocatable = node["status"]["allocatable"]
    gpus = int(allocatable.get(GPU, rng.choice(("0", "1"))))
    held = [
        convert.requests(p["spec"])
        for p in holders
        if p["spec"]["nodeName"] == node["metadata"]["name"]
    ]
    free = (convert.node_view(node).allocatable or model.NOTHING) - sum(held, model.NOTHING)
    # Rough: the RuntimeClass overhead and the pending pod's own drawing move it a little.
    near = rng.random()
    want_gpu = max(0, free.gpu + rng.choice((-1, 0, 0, 1))) if near < 0.7 else rng.randint(0, gpus)
    want_cpu = max(100, free.cpu + rng.choice((-500, -1, 0, 0, 1, 500, -2000)))
    want_mem = max(2**20, free.memory + rng.choice((-(2**30), -1, 0, 0, 1, 2**30, -(2**33))))
    if near >= 0.7:
        want_cpu = rng.randint(100, 8000)
        want_mem = rng.randint(2**28, 2**35)
    if not hard:  # well within, the overhead and init containers too
        want_gpu = max(0, min(want_gpu, free.gpu))
        want_cpu = max(100, min(want_cpu, free.cpu // 2 - 1500))
        want_mem = max(2**20, min(want_mem, free.memory // 2 - 2**31))
    shares = rng.choice((1, 1, 2, 3))
    containers = []
    for i in range(shares):
        cpu, memory = _quantities(rng, _share(want_cpu, shares, i), _share(want_mem, shares, i))
        part = {GPU: _share(want_gpu, shares, i), "cpu": cpu, "memory": memory}
        containers.append(_container(f"c{i}", part, rng.random() < 0.2))
    out: Obj = {"containers": containers}
    inits = []
    if rng.random() < 0.35:
        # An init container that asks more (or less) than all containers together.
        scale = rng.choice((0.5, 1.0, 1.2))
        need: dict[str, object] = {
            "cpu": f"{int(want_cpu * scale)}m",
            "memory": str(int(want_mem * scale)),
        }
        if rng.random() < 0.3:
            need[GPU] = max(0, want_gpu + rng.choice((0, 1)))
        inits.append(_container("init", need, rng.random() < 0.2))
    if rng.random() < 0.2:
        sidecar = _container("sidecar", {"cpu": "500m", "memory": "1Gi"}, False)
        sidecar["restartPolicy"] = "Always"
        inits.insert(rng.randint(0, len(inits)), sidecar)
    if inits:
        out["initContainers"] = inits
    if rng.random() < 0.2:
        # Pod-level requests: the containers' (or more), which the scheduler counts instead.
        # (At least the containers' together, as the API demands.)
        extra_cpu, extra_mem = rng.choice(((0, 0), (500, 2**30), (4000, 2**34)))
        least = convert.requests(out)
        cpu, memory = _quantities(rng, least.cpu + extra_cpu, least.memory + extra_mem)
        out["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return out


def _quantities(rng: random.Random, millicores: int, size: int) -> tuple[str, str]:
    """The same amounts written as the API takes them, one way or another."""
    cpu = f"{millicores}m" if millicores % 1000 or rng.random() < 0.5 else str(millicores // 1000)
    if rng.random() < 0.3:
        cpu = f"{millicores / 1000:g}" if millicores % 10 == 0 else cpu
    memory = str(size)
    roll = rng.random()
    if roll < 0.2 and size % 2**20 == 0:
        memory = f"{size // 2**20}Mi"
    elif roll < 0.3 and size % 1000 == 0:
        memory = f"{size // 1000}k"
    elif roll < 0.4:
        memory = f"{size * 1000 + rng.choice((0, 1, 999))}m"  # milli-bytes: rounded up
    return cpu, memory


def _share(total: int, parts: int, i: int) -> int:
    return total // parts + (total % parts if i == 0 else 0)


def _container(name: str, wanted: Mapping[str, object], limits_only: bool) -> Obj:
    """A container asking ``wanted``: as requests (and the GPUs as limits too, as the API
    demands of an extended resource), or as limits only (the API defaults requests to them)."""
    requests = {k: str(v) for k, v in wanted.items() if not (k == GPU and not v)}
    resources: Obj = {"limits": dict(requests)} if limits_only else {"requests": requests}
    if GPU in requests:
        resources.setdefault("limits", {})[GPU] = requests[GPU]
    return {"name": name, "image": "example.com/train:1", "resources": resources}


def _pod(name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 0, **spec},
    }
