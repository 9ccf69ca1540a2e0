"""What the controller's informer must hold once it has caught up with the emulator's store.

The demo waits for it before each tick (so every tick sees the minute it is in), and tests use
it to check that the informer converges on the truth: the node views, each with its unfinished
pods as the pool's marks classify them, read straight from the store.
"""

from __future__ import annotations

from typing import Any, Protocol

from rebalancer.adapters import convert
from rebalancer.core import model
from sandbox.emulator.resources import NODES, PODS, ResourceType


class Peeks(Protocol):
    """What is read here: every object of a type (the emulator's ``Store``, or the tests'
    ``RealCluster``, which answers it from a real kube-apiserver)."""

    def peek(self, rt: ResourceType) -> list[dict[str, Any]]: ...


def expected_views(store: Peeks, marks: model.PodMarks) -> tuple[model.NodeView, ...]:
    """Every node's view, in name order, its unfinished pods in (namespace, name) order."""
    on: dict[str, list[dict[str, Any]]] = {}
    for pod in store.peek(PODS):
        node = pod["spec"].get("nodeName")
        if node and not convert.finished(pod):
            on.setdefault(node, []).append(pod)
    views = []
    for node in store.peek(NODES):
        name = node["metadata"]["name"]
        pods = sorted(
            on.get(name, []), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])
        )
        views.append(convert.node_view(node, [convert.pod_view(p, marks) for p in pods]))
    return tuple(sorted(views, key=lambda v: v.name))
