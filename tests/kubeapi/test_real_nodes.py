"""Real nodes: a real kubelet over containerd and runc (``tests/support/realnode.py``), so that
a pod is a process, and what a reclaim does to training is what the process records, not what
KWOK is told to say.

A node registers with the session's control plane (kube-scheduler, kube-controller-manager,
KWOK for the other nodes) and runs the images built here (``tests/support/images.py``). The
training process records each event with the time since boot, which the test maps onto the
wall clock: ``start`` or ``resume`` (it found its checkpoint), ``prestop`` (its hook),
``sigterm``, ``checkpoint`` (written whole), ``exit``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import kube, realnode
from tests.support.control_plane import ControlPlane

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def volatile() -> frozenset[str]:
    """The kernel settings that change by themselves here: not a node's doing."""
    return realnode.settled_sysctls()


def evict(server: kube.KubeServer, namespace: str, name: str) -> float:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    posted = time.time()
    code, doc = server.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
    assert code == 201, doc
    return posted


def wait(what: str, check: Any, within: float) -> float:
    """Poll ``check()`` every 0.05 s; the wall-clock time it became true."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.05)
    return time.time()


def ensure_namespace(server: kube.KubeServer, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, doc = server.request("POST", "/api/v1/namespaces", body)
    assert code in (201, 409), doc


def test_a_pod_killed_at_its_grace_and_the_machine_as_it_was(
    plane: ControlPlane, tmp_path: Path, volatile: frozenset[str]
) -> None:
    """A checkpoint longer than the grace period: the preStop hook and the SIGTERM arrive at
    once, the kubelet kills the process at its grace period (137), no checkpoint is left. Once
    the node is stopped: no process, bridge, cgroup, mount or kernel setting of it is left."""
    server = plane.server
    before = realnode.machine()
    records = tmp_path / "records"
    records.mkdir()
    grace = 3
    with realnode.running(server, kube.binaries(), tmp_path / "node", "real-0") as node:
        ensure_namespace(server, "real-grace")
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "slow", "namespace": "real-grace"},
            "spec": {
                "nodeName": node.name,
                "terminationGracePeriodSeconds": grace,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "trainer"}],
            },
        }
        realnode.training(pod, records, "slow.ckpt", seconds=30, size=30_000)
        created = time.time()
        code, doc = server.request("POST", "/api/v1/namespaces/real-grace/pods", pod)
        assert code == 201, doc
        started = wait("the process started", lambda: realnode.records(records, "slow"), 30)
        posted = evict(server, "real-grace", "slow")

        seen: list[Obj] = []  # the container's terminated state, once reported

        def terminated() -> bool:
            code, doc = server.request("GET", "/api/v1/namespaces/real-grace/pods/slow")
            statuses = doc.get("status", {}).get("containerStatuses") or [] if code == 200 else []
            seen.extend(s["state"]["terminated"] for s in statuses if "terminated" in s["state"])
            return bool(seen)

        ended = wait("the container terminated", terminated, 30)
        path = "/api/v1/namespaces/real-grace/pods/slow"
        gone = wait("the pod gone", lambda: server.request("GET", path)[0] == 404, 30)
        events = {r.event: r.at for r in realnode.records(records, "slow") if r.event != "notice"}
        print(
            f"\nreal node: Ready {node.ready_after:.2f}s after the kubelet started; pod started "
            f"{started - created:.2f}s after its creation; after the eviction: preStop "
            f"{events['prestop'] - posted:+.2f}s, SIGTERM {events['sigterm'] - posted:+.2f}s, "
            f"terminated ({seen[-1]['exitCode']}) {ended - posted:+.2f}s, "
            f"gone {gone - posted:+.2f}s"
        )
        assert seen[-1]["exitCode"] == 137, seen[-1]  # SIGKILL
        assert list(events) == ["start", "prestop", "sigterm"], events
        assert events["prestop"] <= events["sigterm"]
        assert 0 <= events["sigterm"] - posted < 1.0
        assert grace - 0.5 <= ended - events["sigterm"] < grace + 3
        assert not (records / "slow.ckpt").exists()
    after = realnode.machine()
    assert realnode.traces(node) == []
    changed = {
        k
        for k in before.sysctls.keys() | after.sysctls.keys()
        if k not in volatile and before.sysctls.get(k) != after.sysctls.get(k)
    }
    assert changed == set(), {k: (before.sysctls.get(k), after.sysctls.get(k)) for k in changed}
    assert after.mounts == before.mounts, after.mounts ^ before.mounts
    assert after.links == before.links, after.links ^ before.links
    assert after.cgroups == before.cgroups, after.cgroups ^ before.cgroups
    assert after.paths == before.paths
    code, _ = server.request("DELETE", f"/api/v1/nodes/{node.name}")
    assert code == 200
