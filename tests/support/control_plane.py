"""The rest of a control plane beside ``kube.running``'s kube-apiserver: the real kube-scheduler
and kube-controller-manager, and KWOK playing the kubelets of fake nodes.

The binaries come from ``tests/kube/build.sh`` with the server's (``kube.binaries``): the
scheduler and the controller-manager from the same ``k8s.io/kubernetes`` release, KWOK from
``sigs.k8s.io/kwok``. ``running`` starts the three beside a running server, in its home:

- all three as the admin (the kubeconfig ``KubeServer.kubeconfig`` writes), leader election
  off: one replica of each;
- the scheduler and the controller-manager serve their health checks on free loopback ports
  (``/readyz``, ``/healthz``), which ``running`` waits for;
- the controller-manager runs ``CONTROLLERS`` only: the ones whose work the suite reads
  (below), not the service-account, certificate, volume or IPAM controllers a cluster also runs;
- KWOK manages only nodes annotated ``kwok.x-k8s.io/node: fake`` (``fake_node``), playing
  ``tests/kube/stages``: such a node turns Ready at once and renews its Lease; a pod bound to it
  runs and is Ready at once; a deleted one stops after its ``rebalancer.test/stop-after``
  annotation (a training job's checkpoint), at most its grace period, then is reported Failed
  and deleted as a kubelet would.

It stops the three (SIGTERM, then SIGKILL) before the server, leaving no process behind.

What KWOK does not do: pull images, run containers, probe them, or end a pod by itself (a pod
runs until it is deleted); pods on nodes without the annotation are left alone.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import kube
from tests.support.processes import ROOT, free_port

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
STOP_AFTER = "rebalancer.test/stop-after"  # a Go duration: how long a deleted pod takes to stop
STAGES = ROOT / "tests" / "kube" / "stages"

# Job (its pods), disruption (budgets' status, which the Eviction API reads), garbage collector
# (owned objects), ReplicaSet and Deployment (workloads that are not Jobs), namespace (deleting
# one), pod GC (terminated and orphaned pods), node lifecycle (the not-ready taint taken off a
# node once it is Ready; taints when its Lease stops) and taint eviction (NoExecute).
CONTROLLERS = (
    "job-controller",
    "disruption-controller",
    "garbage-collector-controller",
    "replicaset-controller",
    "deployment-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
)


@dataclass(frozen=True)
class ControlPlane:
    server: kube.KubeServer
    pids: Mapping[str, int]  # by name (kube-scheduler...): what a measurement reads in /proc


def fake_node(name: str, allocatable: Mapping[str, str]) -> dict[str, Any]:
    """A Node that KWOK manages, with ``allocatable`` (and the same capacity), as a test creates
    it: KWOK keeps the status it was created with and adds the rest."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def settle(what: str, check: Callable[[], bool], within: float) -> float:
    """Poll ``check()`` every 0.1 s until it is true; the seconds it took. Fails after
    ``within`` seconds: the components act on their own, so a test waits for what they do."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > within:
            raise AssertionError(f"not done in {within} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - began


def _healthy(url: str) -> bool:
    """Whether a component's own health endpoint answers 200 (its self-signed certificate is
    not checked: a loopback probe, as the kubelet's)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def kwok_command(
    bin_dir: Path,
    config: Path,
    lease_s: int = 40,
    cidr: str = "10.244.0.0/16",
    extra: Sequence[str] = (),
) -> list[str]:
    """KWOK for the nodes annotated ``KWOK_ANNOTATION=fake`` only, with the Stages of
    ``tests/kube/stages`` (``extra``: more flags, such as a configuration of its own)."""
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--node-lease-duration-seconds={lease_s}",
        f"--cidr={cidr}",
        *extra,
        *(f"--config={stage}" for stage in sorted(STAGES.glob("*.yaml"))),
    ]


def kwok_env(home: Path) -> dict[str, str]:
    """KWOK reads ~/.kwok/kwok.yaml too when there is one: its work directory is ``home``'s."""
    return {**os.environ, "KWOK_WORKDIR": str(home / "kwok")}


@contextlib.contextmanager
def running(
    server: kube.KubeServer,
    within: float = 60.0,
    components: Sequence[str] = ("kube-scheduler", "kube-controller-manager", "kwok"),
    controllers: Sequence[str] = CONTROLLERS,
) -> Iterator[ControlPlane]:
    """kube-scheduler, kube-controller-manager and KWOK beside ``server``, in its home, until
    the block ends; only ``components`` of them, the controller-manager running
    ``controllers``."""
    bin_dir = kube.binaries()
    home = server.home
    config = server.kubeconfig(home / "admin.kubeconfig")
    scheduler_port, manager_port = free_port(), free_port()
    served = [
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--authentication-skip-lookup",  # no client CA: no extension-apiserver-authentication
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
    ]
    commands = {
        "kube-scheduler": [
            str(bin_dir / "kube-scheduler"),
            *served,
            f"--secure-port={scheduler_port}",
            f"--cert-dir={home / 'scheduler-certs'}",
        ],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"),
            *served,
            f"--secure-port={manager_port}",
            f"--cert-dir={home / 'controller-manager-certs'}",
            f"--controllers={','.join(controllers)}",
        ],
        "kwok": kwok_command(bin_dir, config),
    }
    commands = {name: command for name, command in commands.items() if name in components}
    env = kwok_env(home)
    health = {
        name: url
        for name, url in (
            ("kube-scheduler", f"https://127.0.0.1:{scheduler_port}/readyz"),
            ("kube-controller-manager", f"https://127.0.0.1:{manager_port}/healthz"),
        )
        if name in components
    }
    logs = {name: (home / f"{name}.log").open("wb") for name in commands}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, command in commands.items():
            processes[name] = subprocess.Popen(
                command, stdout=logs[name], stderr=subprocess.STDOUT, env=env
            )

        def ready() -> bool:
            for name, p in processes.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}: see {home}")
            return all(_healthy(url) for url in health.values())

        settle(f"kube-scheduler and kube-controller-manager healthy (see {home})", ready, within)
        yield ControlPlane(server, {name: p.pid for name, p in processes.items()})
    finally:
        for p in reversed(processes.values()):
            kube.stop(p)
        for log in logs.values():
            log.close()
