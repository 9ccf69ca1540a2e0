"""Real nodes beside ``kube.running``'s server: a real kubelet over containerd and runc, so that a
pod is a process that receives its SIGTERM, runs its ``preStop`` hook and is killed at its grace
period (KWOK, in ``control_plane.py``, only says so).

The kubelet is built with the control plane (``tests/kube/build.sh``); containerd 1.6, runc 1.1,
the CNI plugins and busybox are Debian's (``make system-deps``). Debian's containerd 1.6 lacks
the CRI ``RuntimeConfig`` call: the 1.36 kubelet falls back to its own cgroup driver setting,
which its code says ends in 1.37, when containerd 2.x will be needed (docs/design/real-nodes.md).

``running`` starts one node and stops it, leaving the machine as it found it:

- **One mount namespace per node**, which containerd is started in (``unshare -m``, mounts
  propagated from the host only) and the kubelet joins (``nsenter``). In it, and only there:
  files holding the values the kubelet insists on are bind-mounted over the three kernel
  settings it would otherwise write for the whole machine (``vm.overcommit_memory``,
  ``kernel.panic``, ``kernel.panic_on_oops``), and over ``net.ipv4.ip_forward``, which the CNI
  bridge sets; and the paths the kubelet, containerd and CNI hard-code (``/var/lib/kubelet``,
  ``/var/log/containers``, ``/var/lib/cni``, ``/var/run/netns``) are bind-mounted to the
  node's own directories. Containers' overlays, ``/dev/shm`` and network-namespace pins are
  mounted there too, so none is seen by the host, and all go with the namespace.
- **Its own cgroup root** (``/rebalancer-node-<slot>`` in every cgroup v1 hierarchy), so that
  neither kubelet touches the other's pods, and ending the node can kill what runs in it.
- **A slot** (a lock file held with ``flock`` while the node runs, freed if the process dies):
  the bridge ``rbnode<slot>``, the pod subnet ``10.244.<slot>.0/24``, the cgroup root and the
  run directory ``/tmp/rebalancer-node-<slot>`` (containerd's sockets and the kubelet's root:
  a unix socket's path may not exceed 104 bytes, which a test's directory can) are the slot's,
  so that nodes of parallel test workers never share one. The rest of a node's state is under
  the ``home`` its test gives.
- **The kubelet's user**: ``system:node:<name>`` (``kube.NODE_TOKENS``), bound to the
  ``system:node`` ClusterRole (the server authorizes with RBAC alone).
- **Flags**: ``failCgroupV1: false`` (this machine's controllers are cgroup v1); containerd's
  ``restrict_oom_score_adj`` (root here lacks ``CAP_SYS_RESOURCE``, so the -998 the kubelet
  asks for a sandbox would fail in runc); no registry: images are imported from the tarballs
  ``images.build`` writes, and ``PAUSE`` is the sandbox image.

Stopping: the kubelet (SIGTERM), then every process of the node's cgroups (its containers,
SIGKILL: no kubelet is left to honour a grace period), then containerd and its shims (the
processes of its mount namespace); then the bridge, the cgroups, the run directory and the
mount points made on the host for the namespace's binds (the last node out removes them).
``machine`` and ``traces`` are what a test compares to show that nothing is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.support import images, kube
from tests.support.processes import free_port, locked
from tests.support.training_cluster import conditions

Obj = dict[str, Any]
LOCKS = Path("/tmp/rebalancer-test-nodes")  # one lock file per slot
# One node at a time makes or removes the host mount points (a node that found them could
# otherwise see them removed by the last one out before it binds over them).
MOUNT_POINTS_LOCK = LOCKS / "mount-points.lock"
SLOTS = range(10, 60)
# The kubelet's periodic resync of every pod (a cluster's default: 1m). A change to a pod's
# annotations is synced at once; this bounds a downward-API file's refresh when that is missed.
SYNC_SECONDS = 5
CGROUPS = Path("/sys/fs/cgroup")
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
# What the kubelet writes to the kernel unless told not to, with the value it writes; and the
# bridge plugin's forwarding switch. Each is faked inside the node's mount namespace.
SYSCTLS = {
    "vm/overcommit_memory": "1",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "net/ipv4/ip_forward": "1",
}
# Host paths hard-coded by the kubelet, containerd's CRI and CNI: each bound to the node's own.
HOST_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/lib/cni", "/var/run/netns")
NODE_ROLE_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "rebalancer-test-nodes"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
    ],
}


class NodeFailed(RuntimeError):
    """The node did not come up; the message names the log to read."""


@dataclass(frozen=True)
class RealNode:
    name: str
    home: Path
    slot: int
    containerd: int  # pids
    kubelet: int
    mount_namespace: str  # as ``readlink /proc/PID/ns/mnt`` names it
    ready_after: float  # seconds from the kubelet's start to the Node's Ready condition

    @property
    def bridge(self) -> str:
        return bridge(self.slot)

    @property
    def cgroup_root(self) -> str:
        return cgroup_root(self.slot)


# What a slot names: a node's bridge, its cgroup root (in every hierarchy), its run directory.
BRIDGE, CGROUP = "rbnode", "rebalancer-node-"


def bridge(slot: int) -> str:
    return f"{BRIDGE}{slot}"


def cgroup_root(slot: int) -> str:
    return f"{CGROUP}{slot}"


@contextlib.contextmanager
def _slot() -> Iterator[int]:
    LOCKS.mkdir(exist_ok=True)
    for slot in SLOTS:
        lock: IO[bytes] = (LOCKS / f"{slot}.lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            yield slot
        finally:
            lock.close()
        return
    raise NodeFailed(f"every node slot {SLOTS.start}-{SLOTS.stop - 1} is taken ({LOCKS})")


def _alone() -> bool:
    """No node's slot is held (so the host mount points made for them may go)."""
    for path in LOCKS.glob("[0-9]*.lock"):  # the slots
        with path.open("ab") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
    return True


def _make_mount_points() -> None:
    """The host paths a node's namespace binds over, made where missing and listed in
    ``LOCKS/made``, so that the last node out removes them (``_remove_mount_points``)."""
    with locked(MOUNT_POINTS_LOCK), (LOCKS / "made").open("a") as listed:
        for path in map(Path, HOST_PATHS):
            if not path.exists():
                path.mkdir(parents=True)
                listed.write(f"{path}\n")


def _listed_mount_points() -> list[str]:
    listed = LOCKS / "made"
    return listed.read_text().splitlines() if listed.exists() else []


def _remove_mount_points() -> None:
    with locked(MOUNT_POINTS_LOCK):
        if not _alone():
            return
        for line in reversed(_listed_mount_points()):
            with contextlib.suppress(OSError):  # not empty: something else put files there
                Path(line).rmdir()
        (LOCKS / "made").unlink(missing_ok=True)


def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies (those the kubelet manages pods in here)."""
    return sorted(h for h in CGROUPS.iterdir() if (h / "cgroup.procs").exists() and h.is_dir())


def _make_cgroups(root: str) -> None:
    for hierarchy in _hierarchies():
        made = hierarchy / root
        made.mkdir(exist_ok=True)
        if (hierarchy / "cpuset.cpus").exists():  # a cpuset cgroup starts empty: no process fits
            for name in ("cpuset.cpus", "cpuset.mems"):
                (made / name).write_text((hierarchy / name).read_text())


def _cgroups(root: str) -> list[Path]:
    """Every cgroup under ``root`` in every hierarchy, deepest first. The kubelet and runc make
    and remove them as this walks: one gone meanwhile is left out, not an error."""
    found = []
    for hierarchy in _hierarchies():
        for directory, _, _ in os.walk(hierarchy / root):  # os.walk skips what vanished
            found.append(Path(directory))
    return sorted(found, key=lambda p: -len(p.parts))


def _cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for cgroup in _cgroups(root):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    return pids


def _remove_cgroups(root: str) -> None:
    for cgroup in _cgroups(root):
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def _namespace_pids(mnt: str) -> set[int]:
    """The processes in the mount namespace ``mnt`` (as ``readlink /proc/PID/ns/mnt`` says)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == mnt:
                    found.add(int(entry.name))
    return found


def _end(pids: Callable[[], set[int]], within: float = 10.0) -> None:
    """SIGTERM the ``pids()`` callable's processes once, SIGKILL those left after ``within``
    seconds (at once when 0), and wait until none is left."""
    deadline = time.monotonic() + within
    sig = signal.SIGKILL if within <= 0 else signal.SIGTERM
    told: set[int] = set()
    while left := pids():
        if time.monotonic() > deadline:
            sig, told = signal.SIGKILL, set()
        for pid in left - told:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        told |= left
        time.sleep(0.05)


def run_dir(slot: int) -> Path:
    """Where a node's containerd listens and the kubelet keeps its root (with sockets in it): a
    unix socket's path has at most 104 bytes, which a test's temporary directory may exceed."""
    return Path("/tmp") / cgroup_root(slot)


def containerd_config(home: Path, slot: int, stream_port: int) -> str:
    state = home / "containerd"
    return f"""version = 2
root = "{state}/root"
state = "{state}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{run_dir(slot)}/containerd.sock"
[ttrpc]
  address = "{run_dir(slot)}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "{stream_port}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{state}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{home}/cni/net.d"
"""


def cni_config(home: Path, slot: int) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": bridge(slot),
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge(slot),
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(home / "cni" / "ipam"),
                    "ranges": [[{"subnet": f"10.244.{slot}.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def kubelet_config(home: Path, slot: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": "/" + cgroup_root(slot),
        "containerRuntimeEndpoint": f"unix://{run_dir(slot)}/containerd.sock",
        "address": "127.0.0.1",
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": False,
        "podLogsDir": str(home / "pod-logs"),
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "nodeStatusUpdateFrequency": "2s",
        "fileCheckFrequency": "2s",
        "syncFrequency": f"{SYNC_SECONDS}s",
    }


def _namespace_script(home: Path, containerd: Sequence[str]) -> str:
    """What runs in the new mount namespace before containerd (which it becomes)."""
    lines = ["set -eu"]
    for name in SYSCTLS:
        lines.append(f"mount --bind {home}/sysctl/{name.replace('/', '.')} /proc/sys/{name}")
    for path in HOST_PATHS:
        lines.append(f"mount --bind {home}/host{path} {path}")
    lines.append("exec " + " ".join(containerd))
    return "\n".join(lines)


def _ready(server: kube.KubeServer, name: str) -> bool:
    code, doc = server.request("GET", f"/api/v1/nodes/{name}")
    return code == 200 and conditions(doc).get("Ready", {}).get("status") == "True"


@contextlib.contextmanager
def running(
    server: kube.KubeServer,
    kube_dir: Path,
    home: Path,
    name: str = "real-0",
    labels: Mapping[str, str] | None = None,
    taints: Sequence[str] = (),
    within: float = 60.0,
    extra_images: Sequence[Path] = (),
) -> Iterator[RealNode]:
    """A real node ``name`` (one of ``kube.NODE_TOKENS``) registered with ``server``, with
    ``labels`` and ``taints`` (``key=value:Effect``) from its start, the suite's images and
    ``extra_images`` (docker-archive tarballs) imported; until the block ends. ``kube_dir``
    holds the kubelet and pause binaries (``tests/kube/build.sh``)."""
    code, doc = server.request(
        "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", NODE_ROLE_BINDING
    )
    assert code in (201, 409), doc
    home.mkdir(parents=True, exist_ok=True)
    tarballs = images.build(kube_dir / "pause", home.parent / "images")
    try:
        with _slot() as slot, contextlib.ExitStack() as undo:
            # Each step is undone in reverse, whatever an undoing before it raised.
            loaded = [*tarballs, *extra_images]
            yield from _started(
                server, kube_dir, home, name, slot, undo, labels, taints, within, loaded
            )
    finally:
        _remove_mount_points()


def _started(
    server: kube.KubeServer,
    kube_dir: Path,
    home: Path,
    name: str,
    slot: int,
    undo: contextlib.ExitStack,
    labels: Mapping[str, str] | None,
    taints: Sequence[str],
    within: float,
    tarballs: Sequence[Path],
) -> Iterator[RealNode]:
    root = cgroup_root(slot)
    _make_mount_points()
    for sysctl, value in SYSCTLS.items():
        fake = home / "sysctl" / sysctl.replace("/", ".")
        fake.parent.mkdir(exist_ok=True)
        fake.write_text(value + "\n")
    for path in HOST_PATHS:
        (home / "host" / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (home / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    (home / "cni" / "net.d" / "10-node.conflist").write_text(json.dumps(cni_config(home, slot)))
    (home / "containerd").mkdir(exist_ok=True)
    shutil.rmtree(run_dir(slot), ignore_errors=True)  # a killed run's
    run_dir(slot).mkdir()
    undo.callback(shutil.rmtree, run_dir(slot), ignore_errors=True)
    (home / "containerd.toml").write_text(containerd_config(home, slot, free_port()))
    _make_cgroups(root)
    undo.callback(_remove_cgroups, root)
    delete = ["ip", "link", "delete", bridge(slot)]
    undo.callback(subprocess.run, delete, check=False, capture_output=True)
    log = undo.enter_context((home / "containerd.log").open("wb"))
    script = _namespace_script(home, ["containerd", "--config", str(home / "containerd.toml")])
    containerd = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    undo.callback(_end, lambda: {containerd.pid} if containerd.poll() is None else set())
    socket = run_dir(slot) / "containerd.sock"
    _settle(socket.exists, containerd, home / "containerd.log", within)
    mnt = os.readlink(f"/proc/{containerd.pid}/ns/mnt")
    undo.callback(_end, lambda: _namespace_pids(mnt))  # containerd's shims
    undo.callback(_end, lambda: _cgroup_pids(root), 0)  # the pods' processes: no grace now
    for tarball in tarballs:
        subprocess.run(
            ["ctr", "-a", str(socket), "-n", "k8s.io", "images", "import", str(tarball)],
            check=True,
            capture_output=True,
        )
    (home / "kubelet.yaml").write_text(json.dumps(kubelet_config(home, slot)))
    kubeconfig = server.kubeconfig(home / "kubelet.kubeconfig", kube.NODE_TOKENS[name])
    flags = [
        f"--config={home / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={run_dir(slot) / 'kubelet'}",
        f"--cert-dir={home / 'pki'}",
        f"--hostname-override={name}",
    ]
    if labels:
        flags.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
    if taints:
        flags.append("--register-with-taints=" + ",".join(taints))
    log = undo.enter_context((home / "kubelet.log").open("wb"))
    started = time.monotonic()
    kubelet = subprocess.Popen(
        ["nsenter", "-t", str(containerd.pid), "-m", "--", str(kube_dir / "kubelet"), *flags],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    undo.callback(_end, lambda: {kubelet.pid} if kubelet.poll() is None else set())
    _settle(lambda: _ready(server, name), kubelet, home / "kubelet.log", within)
    yield RealNode(name, home, slot, containerd.pid, kubelet.pid, mnt, time.monotonic() - started)


def _settle(
    check: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, within: float
) -> None:
    deadline = time.monotonic() + within
    while not check():
        if process.poll() is not None:
            raise NodeFailed(f"it exited ({process.returncode}): read {log}")
        if time.monotonic() > deadline:
            raise NodeFailed(f"not ready within {within:.0f}s: read {log}")
        time.sleep(0.1)


# -- What runs on a real node, and what it records ------------------------------------------------


def training(
    template: Obj, records: Path, seconds: int, size: int, gpus: int = 0, checkpoint: str = ""
) -> Obj:
    """``template`` (a Pod, or a Job's pod template) with one container, the training image's
    process (``images.TRAIN``), in place of its own: it records to ``records`` (a host
    directory), and on SIGTERM writes a checkpoint of ``size`` bytes over ``seconds`` seconds to
    ``<records>/<checkpoint>`` (by default ``checkpoint-<the Job's completion index>``); its
    ``preStop`` hook records too, and its annotations are at ``/etc/podinfo`` (downward API).
    It asks for ``gpus`` GPUs and nothing else (the node's CPUs are this machine's)."""
    spec = template["spec"]
    (container,) = spec["containers"]
    gpu = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    named = [{"name": "CHECKPOINT", "value": f"/records/{checkpoint}"}] if checkpoint else []
    spec["containers"] = [
        {
            "name": container["name"],
            "image": images.TRAINING,
            "imagePullPolicy": "Never",
            "resources": {"requests": gpu, "limits": gpu},
            "env": [
                {"name": "RECORDS", "value": "/records"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "CHECKPOINT_SECONDS", "value": str(seconds)},
                {"name": "CHECKPOINT_BYTES", "value": str(size)},
                *named,
            ],
            "lifecycle": {"preStop": {"exec": {"command": ["/bin/train", "prestop"]}}},
            "volumeMounts": [
                {"name": "records", "mountPath": "/records"},
                {"name": "podinfo", "mountPath": "/etc/podinfo"},
            ],
        }
    ]
    annotations = {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
    spec["volumes"] = [
        {"name": "records", "hostPath": {"path": str(records), "type": "Directory"}},
        {"name": "podinfo", "downwardAPI": {"items": [annotations]}},
    ]
    return template


def container_log(node: RealNode, namespace: str, pod: str, container: str) -> Path | None:
    """The file the node keeps what ``container`` of ``pod`` prints in (``podLogsDir``:
    ``<namespace>_<pod>_<uid>/<container>/0.log``), once made. The kubelet removes it as soon
    as the containers of a deleted (an evicted) pod have ended, before the pod is gone: a test
    that reads it after holds it open from the start (``log_lines``)."""
    found = sorted((node.home / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/0.log"))
    return found[0] if found else None


def log_lines(log: IO[str]) -> list[str]:
    """The text of each line of an open container log, from its start (each line in the CRI's
    format: time, stream, tag, text), removed from the node or not."""
    log.seek(0)
    return [line.split(" ", 3)[-1] for line in log.read().splitlines()]


@dataclass(frozen=True)
class Record:
    event: str  # start, resume, notice, prestop, sigterm, checkpoint, exit
    at: float  # time.time() of it: /proc/uptime mapped onto the wall clock
    detail: str


def boot_to_wall() -> float:
    """What to add to a /proc/uptime reading to get the wall clock (``time.time()``)."""
    return time.time() - float(Path("/proc/uptime").read_text().split()[0])


def records(directory: Path, pod: str) -> list[Record]:
    """What the training process of ``pod`` recorded, in order (none before it started)."""
    path = directory / f"{pod}.log"
    if not path.exists():
        return []
    offset = boot_to_wall()
    out = []
    for line in path.read_text().splitlines():
        event, at, *detail = line.split(" ", 2)
        out.append(Record(event, float(at) + offset, detail[0] if detail else ""))
    return out


# -- The machine's state, which a node must leave as it found it -----------------------------------

NODE_DEVICES = (BRIDGE, "veth")  # a node's bridge and its pods' links (any node's)


@dataclass(frozen=True)
class Machine:
    """What a node could change on the machine and must not have once stopped, as seen from
    the host: kernel settings, mounts, network links, top-level cgroups, the hard-coded host
    paths. Another node's bridge, links and cgroup root (a parallel test's) are left out."""

    sysctls: Mapping[str, str]
    mounts: frozenset[str]
    links: frozenset[str]
    cgroups: frozenset[str]
    paths: frozenset[str]


def _sysctls() -> dict[str, str]:
    values = {}
    for path in Path("/proc/sys").rglob("*"):
        name = str(path.relative_to("/proc/sys"))
        if any(f"/{d}" in name for d in NODE_DEVICES):  # a link's own settings come and go
            continue
        with contextlib.suppress(OSError):
            if path.is_file() and path.stat().st_mode & 0o200:  # a setting, not a statistic
                values[name] = path.read_text()
    return values


def machine() -> Machine:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    names = {line.split(":")[1].strip().split("@")[0] for line in links.stdout.splitlines()}
    return Machine(
        sysctls=_sysctls(),
        mounts=frozenset(
            " ".join(line.split()[4:])  # mount point, options, type, source: not the ids
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ),
        links=frozenset(n for n in names if not n.startswith(NODE_DEVICES)),
        cgroups=frozenset(
            str(c)
            for h in _hierarchies()
            for c in h.iterdir()
            if c.is_dir() and not c.name.startswith(CGROUP)  # any node's
        ),
        # Those made for the nodes running (a parallel test's) are theirs to remove.
        paths=frozenset(
            p for p in HOST_PATHS if Path(p).exists() and p not in _listed_mount_points()
        ),
    )


# Writable, yet a counter: the last process id given out, which any process started moves.
COUNTERS = frozenset({"kernel/ns_last_pid"})


def settled_sysctls(wait: float = 1.0) -> frozenset[str]:
    """The kernel settings that change on their own: ``COUNTERS``, and any other seen to change
    when read twice, ``wait`` seconds apart, with no node running in between on this worker."""
    first = _sysctls()
    time.sleep(wait)
    second = _sysctls()
    moved = {k for k in first.keys() | second.keys() if first.get(k) != second.get(k)}
    return COUNTERS | moved


def traces(node: RealNode) -> list[str]:
    """What is left of ``node`` once stopped: its processes (in its cgroups or its mount
    namespace), its bridge, its cgroups, the host paths made for it while no node runs."""
    left = [f"process {pid}" for pid in _cgroup_pids(node.cgroup_root)]
    left += [f"process {pid}" for pid in _namespace_pids(node.mount_namespace)]
    shown = subprocess.run(["ip", "link", "show", node.bridge], capture_output=True, check=False)
    if shown.returncode == 0:
        left.append(f"bridge {node.bridge}")
    left += [str(h / node.cgroup_root) for h in _hierarchies() if (h / node.cgroup_root).exists()]
    if _alone():
        left += [f"made {line}" for line in _listed_mount_points()]
    return left


def rss(pid: int) -> str:
    """A process's resident memory, as /proc says it (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return line.split(":", 1)[1].strip()
    return "?"
