"""What a test reads back: from the cluster directly (``backends.Objects``: the emulator's store
or a real kube-apiserver), and from the API's answers.

A check reads the server's own record, not what a client believes: ``scheduling`` is a node's
labels and taints as JSON text (key order, taint order and every field count, so "restored byte
for byte" means what it says). The node views an informer's cache must come to hold are
``sandbox.emulator.views.expected_views``, which the demo waits on too.
"""

from __future__ import annotations

import json
from typing import Any

from rebalancer.core.nodestate import Keys
from sandbox.emulator.resources import NODES, PODS
from tests.support.backends import Objects

Obj = dict[str, Any]


def node_obj(store: Objects, name: str) -> Obj:
    return store.get(NODES, None, name)


def scheduling(node: Obj) -> tuple[str, str]:
    """What a restore must give back byte for byte: the labels and the taints, as JSON text."""
    return json.dumps(node["metadata"].get("labels")), json.dumps(node["spec"].get("taints"))


def scheduling_of(store: Objects, name: str) -> tuple[str, str]:
    return scheduling(node_obj(store, name))


def state_of(store: Objects, name: str, keys: Keys | None = None) -> str:
    """The node's state label; ``serving`` when it has none."""
    labels = node_obj(store, name)["metadata"].get("labels") or {}
    return str(labels.get((keys or Keys()).state, "serving"))


def all_pods(store: Objects) -> list[Obj]:
    return store.peek(PODS)


def pods_on(store: Objects, node: str) -> dict[str, Obj]:
    """Every pod bound to ``node``, by ``namespace/name``."""
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
        for p in all_pods(store)
        if p["spec"].get("nodeName") == node
    }


def status_body(error: Any) -> dict[str, Any]:
    """The ``Status`` object of an ``ApiException``."""
    body: dict[str, Any] = json.loads(error.body)
    return body


async def raw(response: Any) -> Any:
    """The JSON of a response asked for with ``_preload_content=False``."""
    try:
        return json.loads(await response.read())
    finally:
        response.release()
