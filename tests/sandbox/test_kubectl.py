"""The real kubectl against the emulator: discovery, server-side tables, describe, annotate.

kubectl (built from ``k8s.io/kubernetes`` at the pinned release by ``tests/kube/build.sh``)
reads the emulator as it reads a cluster: aggregated discovery to resolve ``nodes``, ``Table``
answers for ``get``, field selectors for ``describe node``'s pods and events, a merge patch for
``annotate``, OpenAPI v3 for ``explain`` and for ``create`` with validation on. Each test reads
what kubectl printed, and the annotate test reads the node back from the store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.emulator import cluster
from sandbox.emulator.clock import rfc3339
from sandbox.emulator.resources import CORE_EVENTS, NODES
from sandbox.emulator.server import write_kubeconfig
from tests.support.emulated import Sandbox, running
from tests.support.kubectl import Kubectl, binary, columns

LENT = "inference-3"


@pytest.fixture
async def box() -> AsyncIterator[Sandbox]:
    """The default cluster, a node lent (state label, cordoned), a serving replica on
    ``inference-0`` and an Event about it, three hours after the nodes were created."""
    async with running(seeded=True) as box:
        store = box.store
        patch = {
            "metadata": {"labels": {"rebalancer.io/state": "lent"}},
            "spec": {"unschedulable": True},
        }
        store.patch(NODES, None, LENT, "application/merge-patch+json", json.dumps(patch).encode())
        cluster.add(store, cluster.inference_pod(0, node_name="inference-0"))
        node = store.get(NODES, None, "inference-0")
        box.clock.advance(3 * 3600)
        now = rfc3339(box.clock())
        event = {
            "metadata": {"name": "inference-0.lend", "namespace": "default"},
            "involvedObject": {
                "kind": "Node",
                "name": "inference-0",
                "uid": node["metadata"]["uid"],
            },
            "reason": "Reclaimed",
            "message": "back to serving: demand 41 rps over 35",
            "type": "Normal",
            "source": {"component": "rebalancer"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        store.create(CORE_EVENTS, "default", event)
        yield box


@pytest.fixture
def kubectl(box: Sandbox, tmp_path: Path) -> Kubectl:
    config = write_kubeconfig(box.url, tmp_path / "kubeconfig")
    return Kubectl(binary(), config, tmp_path / "kube-cache")


async def test_get_nodes_shows_the_state_label_and_the_server_columns(kubectl: Kubectl) -> None:
    out = await kubectl.run("get", "nodes", "-L", "rebalancer.io/state")
    rows = {row["NAME"]: row for row in columns(out)}
    assert out.split("\n", 1)[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "STATE"]
    assert len(rows) == 12
    assert rows[LENT] == {
        "NAME": LENT,
        "STATUS": "Ready,SchedulingDisabled",
        "ROLES": "<none>",
        "AGE": "3h",  # on the emulator's clock
        "VERSION": "v1.34.0",
        "STATE": "lent",
    }
    assert rows["inference-0"]["STATUS"] == "Ready"
    assert rows["inference-0"]["STATE"] == ""


async def test_describe_node_lists_the_pods_on_it_and_its_events(
    kubectl: Kubectl, box: Sandbox
) -> None:
    out = await kubectl.run("describe", "node", "inference-0")
    assert out.startswith("Name:               inference-0\n")
    assert "Taints:             workload=inference:NoSchedule" in out
    assert "Non-terminated Pods:          (1 in total)" in out
    assert "llm-serving-7d9f8c6b5-00000" in out
    events = out[out.index("\nEvents:") :]
    assert "Reclaimed" in events
    assert "back to serving: demand 41 rps over 35" in events
    assert "rebalancer" in events
    asked = [r.query.get("fieldSelector", "") for r in box.requests.lists]
    assert any("spec.nodeName=inference-0" in s and "status.phase!=Failed" in s for s in asked)
    assert any("involvedObject.name=inference-0" in s for s in asked)


async def test_annotate_node_changes_the_node_on_the_server(kubectl: Kubectl, box: Sandbox) -> None:
    out = await kubectl.run("annotate", "node", "inference-2", "rebalancer.io/paused=true")
    assert out.strip() == "node/inference-2 annotated"
    annotations = box.store.get(NODES, None, "inference-2")["metadata"].get("annotations")
    assert annotations == {"rebalancer.io/paused": "true"}
    (patch,) = box.requests.writes_of("nodes")
    assert patch.method == "PATCH"
    assert patch.name == "inference-2"


async def test_get_events_prints_them_as_the_server_tabulates_them(kubectl: Kubectl) -> None:
    out = await kubectl.run("get", "events", "-n", "default")
    (row,) = columns(out)
    assert row == {
        "LAST SEEN": "0s",
        "TYPE": "Normal",
        "REASON": "Reclaimed",
        "OBJECT": "node/inference-0",
        "MESSAGE": "back to serving: demand 41 rps over 35",
    }


async def test_explain_and_validated_create_read_the_openapi_documents(
    kubectl: Kubectl, box: Sandbox, tmp_path: Path
) -> None:
    explained = await kubectl.run("explain", "nodes")
    assert "KIND:       Node" in explained
    assert "spec\t<Object>" in explained
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "rebalancer", "namespace": "rebalancer"},
        "spec": {"holderIdentity": "rebalancer-0"},
    }
    manifest = tmp_path / "lease.json"
    manifest.write_text(json.dumps(lease), encoding="utf-8")
    created = await kubectl.run("create", "-f", str(manifest))
    assert created.strip() == "lease.coordination.k8s.io/rebalancer created"
    (post,) = [r for r in box.requests.seen if r.method == "POST"]
    assert post.query.get("fieldValidation") == "Strict"
