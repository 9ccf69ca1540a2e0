"""``bench/scale.py --backend real``: the same cluster on a real kube-apiserver and etcd, with
KWOK playing the kubelets, and what the controller costs them.

The server is ``tests.support.kube.running``'s (etcd with ``--unsafe-no-fsync``, RBAC, an audit
log of the controller's user's requests only), with the TaintNodesByCondition admission plugin
off: no node lifecycle controller runs to take a new node's ``not-ready`` taint off again. Only
KWOK runs beside it (managing the nodes annotated ``kwok.x-k8s.io/node: fake``, playing
``tests/kube/stages``): no scheduler and no controller-manager, since nothing is scheduled. As
the emulator's backend does, every pod is created already bound (``spec.nodeName``), and KWOK
reports it Running and Ready; nodes are created without conditions, and KWOK makes them Ready
and renews their Leases (every 100 s: ``LEASE_S``). The controller runs as the chart's
service account under the chart's rendered RBAC.

Seeding (namespaces, nodes, pods created by the admin ``SEED_CONCURRENCY`` at a time over
aiohttp, then waiting for KWOK to run them all) is timed apart and is not the controller's cost.

What is read off the server: ``/proc/<pid>/stat`` (utime + stime) and ``/proc/<pid>/status``
(VmRSS) of kube-apiserver and etcd, sampled every 0.2 s by the driver and read at the
controller's own marks (sync started, synced, idle ticks...); and the controller's requests as
the apiserver's audit log recorded them, by verb, between those marks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tables

Obj = dict[str, Any]
SEED_CONCURRENCY = 48
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# KWOK plays more pods at a time than its default 4 (seeding 150,000 pods); its Leases last 400 s
# instead of the kubelet's 40 s, renewed every 100 s instead of every 10 s: 5,000 nodes' renewals
# at the kubelet's pace (500 writes a second) would take one of the machine's two cores from
# everything measured. The controller reads no Lease.
KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    "options": {  # a configuration file's options are not defaulted: every parallelism given
        "podPlayStageParallelism": 32,
        "nodePlayStageParallelism": 8,
        "nodeLeaseParallelism": 4,
        "podsOnNodeSyncParallelism": 1,
    },
}
LEASE_S = 400


# ---------------------------------------------------------------------------------------------
# /proc


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MB (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reading(pids: Mapping[str, int]) -> dict[str, float]:
    """The time (epoch seconds) and each process's CPU and resident set now."""
    out = {"t": time.time()}
    for name, pid in pids.items():
        out[f"{name}_cpu_s"] = cpu_s(pid)
        out[f"{name}_rss_mb"] = rss_mb(pid)
    return out


class Sampler:
    """Reads ``pids`` every ``every`` seconds in a thread of the driver (not the controller's
    process, whose CPU is measured), until stopped; ``add`` one while it runs."""

    def __init__(self, pids: Mapping[str, int], every: float = 0.2) -> None:
        self.pids = dict(pids)
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, pid: int) -> None:
        self.pids = {**self.pids, name: pid}  # a new dict: the thread may be reading the old

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(reading(self.pids))
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[dict[str, float]]:
        return [s for s in self.samples if start <= s["t"] <= end]


def pids_of(home: Path) -> dict[str, int]:
    """kube-apiserver's and etcd's pids, found by the directories ``kube.running`` gave them."""
    marks = {"etcd": f"--data-dir={home / 'etcd'}", "apiserver": f"--cert-dir={home / 'certs'}"}
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for name, mark in marks.items():
            if mark.encode() in args:
                found[name] = int(entry.name)
    missing = set(marks) - set(found)
    if missing:
        raise RuntimeError(f"no process found for {sorted(missing)} under {home}")
    return found


# ---------------------------------------------------------------------------------------------
# The cluster


@dataclass
class Plane:
    server: Any  # tests.support.kube.KubeServer
    kubeconfig: Path  # the controller's: the chart's service account
    pods: int
    pids: dict[str, int]  # apiserver, etcd, kwok
    seed_create_s: float  # nodes and pods created
    seed_running_s: float  # then all of them Ready/Running by KWOK
    quiet_s: float = 0.0  # then until the server and KWOK were quiet
    baseline: dict[str, float] = field(default_factory=dict)

    @property
    def audit(self) -> Path:
        return Path(self.server.home) / "audit.log"


def _kwok(bin_dir: Path, home: Path, config: Path) -> subprocess.Popen[bytes]:
    """KWOK as ``control_plane.running`` starts it, with its Leases renewed every ``LEASE_S``
    and the parallelism of ``KWOK_OPTIONS``."""
    from tests.support.control_plane import kwok_command, kwok_env

    options = home / "kwok-options.yaml"
    options.write_text(json.dumps(KWOK_OPTIONS), encoding="utf-8")
    extra = ["-v=WARN", f"--config={options}"]  # -v: not a line per pod it patches
    command = kwok_command(bin_dir, config, lease_s=LEASE_S, cidr="10.0.0.0/8", extra=extra)
    with (home / "kwok.log").open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=kwok_env(home))


def _rbac(server: Any) -> None:
    """The chart's ServiceAccount, ClusterRoles, Roles and bindings, applied as the admin."""
    from sandbox.emulator.clock import ManualClock
    from tests.support.backends import RealCluster
    from tests.support.chart import render
    from tests.support.rbac import apply_to, rbac_of

    docs = rbac_of(render(None))
    apply_to(RealCluster(server, ManualClock(datetime.now(UTC))), docs, within=60.0)


@contextlib.contextmanager
def running(nodes: list[Obj], pods: Iterable[Obj], home: Path) -> Iterator[Plane]:
    """A real control plane in ``home`` holding ``nodes`` (annotated for KWOK) and ``pods``
    (bound), all Ready and Running, until the block ends. The nodes are made Ready before any
    pod is created: a pod KWOK meets both through its watch and through its node's first sync
    is played twice, and the second patch of its status is refused for ever after."""
    from tests.support import kube

    home.mkdir(parents=True, exist_ok=True)
    flags = ["--disable-admission-plugins=ServiceAccount,TaintNodesByCondition"]
    with kube.running(home, within=120.0, flags=flags) as server:
        _rbac(server)
        bin_dir = kube.binaries()
        kwok = _kwok(bin_dir, home, server.kubeconfig(home / "admin.kubeconfig"))
        seeding = threading.Event()
        compactor = threading.Thread(target=_compacting, args=(server, seeding), daemon=True)
        compactor.start()
        try:
            started = time.perf_counter()
            asyncio.run(_seed(server, [("/api/v1/nodes", n) for n in nodes]))
            _all_running(server, len(nodes), kwok, pods=False)
            collection = "/api/v1/namespaces/{}/pods"
            bound = ((collection.format(p["metadata"]["namespace"]), p) for p in pods)
            made = asyncio.run(_seed(server, bound))
            created = time.perf_counter() - started
            _all_running(server, len(nodes), kwok, pods=True)
            running_s = time.perf_counter() - started - created
            seeding.set()
            compactor.join()
            pids = {**pids_of(home), "kwok": kwok.pid}
            yield Plane(
                server,
                server.kubeconfig(home / "controller.kubeconfig", kube.CONTROLLER_TOKEN),
                made,
                pids,
                created,
                running_s,
            )
        finally:
            seeding.set()
            kube.stop(kwok)


def _compacting(server: Any, done: threading.Event, every: float = 60.0) -> None:
    """Compact etcd every minute while seeding (kube-apiserver does every 5 minutes): a pod's
    first version, replaced by KWOK's status, is then free space that the next pods reuse,
    and 150,000 pods stay under etcd's 2 GiB quota."""
    while not done.wait(every):
        with contextlib.suppress(OSError, ValueError, KeyError):
            server.compact()


def etcd_db_mb(home: Path) -> float:
    """The size of etcd's database file."""
    db = home / "etcd" / "member" / "snap" / "db"
    return db.stat().st_size / 1e6 if db.exists() else 0.0


async def _seed(server: Any, objects: Iterable[tuple[str, Obj]]) -> int:
    """Create every object, ``SEED_CONCURRENCY`` at a time (namespaces as they are met); the
    number of objects."""
    import aiohttp

    context = ssl.create_default_context(cafile=str(server.ca))
    headers = {"Authorization": f"Bearer {server_token()}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(ssl=context, limit=SEED_CONCURRENCY)
    count = 0
    namespaces: set[str] = set()
    async with aiohttp.ClientSession(server.url, headers=headers, connector=connector) as session:

        async def post(path: str, body: Obj) -> None:
            data = json.dumps(body)
            for attempt in range(20):
                try:
                    async with session.post(path, data=data) as answer:
                        if answer.status in (201, 409):
                            return
                        text = await answer.text()
                        if answer.status < 429:
                            raise RuntimeError(f"POST {path}: {answer.status} {text[:500]}")
                except aiohttp.ClientError:
                    if attempt == 19:
                        raise
                await asyncio.sleep(0.1 * (attempt + 1))
            raise RuntimeError(f"POST {path}: still refused")

        queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue(maxsize=4 * SEED_CONCURRENCY)

        async def worker() -> None:
            while (item := await queue.get()) is not None:
                await post(*item)

        workers = [asyncio.create_task(worker()) for _ in range(SEED_CONCURRENCY)]
        try:
            for path, body in objects:
                ns = body["metadata"].get("namespace")
                if ns and ns not in namespaces:
                    namespaces.add(ns)
                    await post("/api/v1/namespaces", {"metadata": {"name": ns}})
                count += 1
                await queue.put((path, body))
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
    return count


def server_token() -> str:
    from tests.support import kube

    return kube.ADMIN_TOKEN


def _all_running(
    server: Any, nodes: int, kwok: subprocess.Popen[bytes], pods: bool, within: float = 3600.0
) -> None:
    """Wait until KWOK has made every node Ready (and, with ``pods``, every pod Running)."""
    deadline = time.monotonic() + within
    last = ""
    while time.monotonic() < deadline:
        if kwok.poll() is not None:
            log = Path(server.home) / "kwok.log"
            raise RuntimeError(f"kwok exited with {kwok.returncode}: {log.read_text()[-3000:]}")
        pending = "/api/v1/pods?fieldSelector=status.phase!%3DRunning&limit=1"
        code, doc = server.request("GET", pending) if pods else (200, {"items": []})
        if code == 200 and not doc["items"]:
            listed = server.request("GET", "/api/v1/nodes?resourceVersion=0")[1]["items"]
            ready = sum(
                1
                for n in listed
                for c in n["status"].get("conditions", [])
                if c["type"] == "Ready" and c["status"] == "True"
            )
            if ready == nodes:
                return
            last = f"{ready}/{nodes} nodes Ready"
        else:
            last = "pods not yet Running"
        time.sleep(5.0 if pods else 1.0)
    raise TimeoutError(f"KWOK did not run the cluster in {within:.0f} s ({last})")


def quiesce(plane: Plane, within: float = 300.0) -> float:
    """Wait (5 s at a time) until kube-apiserver and KWOK have done with the seeding's work:
    under 200 and 100 ms of CPU a second. The seconds waited."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        rates = baseline(plane, 5.0)
        if rates["apiserver_cpu_ms_per_s"] < 200 and rates["kwok_cpu_ms_per_s"] < 100:
            break
    return time.monotonic() - began


def baseline(plane: Plane, seconds: float) -> dict[str, float]:
    """The server at rest with KWOK renewing Leases, before the controller starts: CPU per
    second and resident sets over ``seconds``."""
    first = reading(plane.pids)
    time.sleep(seconds)
    last = reading(plane.pids)
    span = last["t"] - first["t"]
    out = {"seconds": span}
    for name in plane.pids:
        out[f"{name}_cpu_ms_per_s"] = (last[f"{name}_cpu_s"] - first[f"{name}_cpu_s"]) * 1000 / span
        out[f"{name}_rss_mb"] = last[f"{name}_rss_mb"]
    return out


# ---------------------------------------------------------------------------------------------
# The audit log


Event = tuple[float, str, str, float]  # received (epoch s), verb, resource, latency (ms)


def audit_events(path: Path, user: str) -> list[Event]:
    """(epoch seconds the request was received, verb, resource[/subresource], ms from received
    to answered) of each of ``user``'s requests, once each (a watch's ResponseStarted and
    ResponseComplete are one: its latency is the time to its first byte)."""
    seen: set[str] = set()
    out: list[Event] = []
    if not path.exists():
        return out
    with path.open("rb") as lines:
        for line in lines:
            event = json.loads(line)
            if event["user"]["username"] != user or event["auditID"] in seen:
                continue
            seen.add(event["auditID"])
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            at = _time(event["requestReceivedTimestamp"])
            took = (_time(event["stageTimestamp"]) - at) * 1000
            out.append((at, event["verb"], resource or event["requestURI"], took))
    return out


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def by_verb(events: Iterable[Event], start: float, end: float) -> dict[str, int]:
    return dict(Counter(verb for at, verb, _, _ in events if start <= at < end))


def by_request(events: Iterable[Event], start: float, end: float) -> dict[str, int]:
    return dict(Counter(f"{verb} {what}" for at, verb, what, _ in events if start <= at < end))


def latency(events: Iterable[Event], start: float, end: float, verb: str) -> float:
    """The median time the apiserver took to answer ``verb`` requests received in the window;
    NaN when there was none (a sync whose lists were streamed made no LIST)."""
    taken = [took for at, v, _, took in events if start <= at < end and v == verb]
    return _median(taken) if taken else float("nan")


# ---------------------------------------------------------------------------------------------
# What the controller cost the server


def other_load(mine: Iterable[int]) -> dict[str, Any]:
    """Control-plane processes on the machine that are not this run's, and the load average:
    whether anything else competed for the two cores while this run measured."""
    own = set(mine) | {os.getpid()}
    others = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if Path(argv0).name in ("kube-apiserver", "etcd", "kwok", "kube-scheduler"):
            others.append(Path(argv0).name)
    return {
        "others": dict(Counter(others)),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


# The budgets a run is held to, as Karpenter's scale tests hold its controller to a memory and a
# CPU budget: figure -> (at most, what it is)
BUDGETS = {
    "controller_p95_rss_mb": (300.0, "p95 RSS over the run <= 300 MB (the issue's target)"),
    "controller_peak_rss_mb": (512.0, "peak RSS <= 512 MiB (the chart's memory limit)"),
    "controller_avg_cpu_cores": (1.0, "average CPU over the run <= 1 core (the chart's limit)"),
    "controller_rest_cpu_cores": (0.1, "average CPU at rest <= 100m (the chart's request)"),
    "server_idle_lists": (0.0, "LISTs per idle tick, as the apiserver saw them: 0"),
    "server_rest_requests": (0.0, "requests at rest (no tick) as the apiserver saw them: 0"),
}


def server_figures(
    plane: Plane,
    run: Any,
    samples: list[dict[str, float]],
    started: float,
    user: str,
) -> dict[str, Any]:
    """What the run cost kube-apiserver and etcd, and the controller's own budget figures."""
    r = run.readings
    base = plane.baseline
    events = audit_events(plane.audit, user)
    sync, synced = r["sync"], r["synced"]
    sync_wall = synced["t"] - sync["t"]
    during_sync = [s for s in samples if sync["t"] <= s["t"] <= synced["t"]] or [synced]

    def rate(a: dict[str, float], b: dict[str, float], name: str) -> float:
        return (b[f"{name}_cpu_s"] - a[f"{name}_cpu_s"]) * 1000 / (b["t"] - a["t"])

    ticks = {kind: [t for t in run.ticks if t.kind == kind] for kind in ("idle", "lend", "reclaim")}

    def in_ticks(kind: str) -> list[dict[str, int]]:
        return [by_verb(events, t.started, t.ended + 0.001) for t in ticks[kind]]

    idle = in_ticks("idle")
    controller_rss = sorted(s.get("controller_rss_mb", 0.0) for s in samples)
    controller_rss = [m for m in controller_rss if m] or [0.0]
    p95 = controller_rss[min(len(controller_rss) - 1, round(0.95 * (len(controller_rss) - 1)))]
    end = r.get("rested", r["scripted"])
    sync_verbs = by_verb(events, sync["t"], synced["t"] + 0.001)
    out: dict[str, Any] = {
        "seed_create_s": plane.seed_create_s,
        "seed_running_s": plane.seed_running_s,
        "quiet_s": plane.quiet_s,
        "apiserver_rss_before_mb": base["apiserver_rss_mb"],
        "apiserver_rss_sync_peak_mb": max(s["apiserver_rss_mb"] for s in during_sync),
        "apiserver_rss_synced_mb": synced["apiserver_rss_mb"],
        "apiserver_rss_end_mb": end["apiserver_rss_mb"],
        "etcd_rss_before_mb": base["etcd_rss_mb"],
        "etcd_rss_sync_peak_mb": max(s["etcd_rss_mb"] for s in during_sync),
        "etcd_rss_end_mb": end["etcd_rss_mb"],
        "etcd_db_mb": etcd_db_mb(Path(plane.server.home)),
        "apiserver_base_cpu_ms_per_s": base["apiserver_cpu_ms_per_s"],
        "etcd_base_cpu_ms_per_s": base["etcd_cpu_ms_per_s"],
        "apiserver_sync_cpu_s": synced["apiserver_cpu_s"] - sync["apiserver_cpu_s"],
        "apiserver_sync_cpu_over_base_s": synced["apiserver_cpu_s"]
        - sync["apiserver_cpu_s"]
        - base["apiserver_cpu_ms_per_s"] * sync_wall / 1000,
        "etcd_sync_cpu_s": synced["etcd_cpu_s"] - sync["etcd_cpu_s"],
        "apiserver_idle_cpu_ms_per_s": rate(r["idle"], r["idled"], "apiserver"),
        "apiserver_rest_cpu_ms_per_s": rate(r["rest"], end, "apiserver") if "rest" in r else 0.0,
        "server_sync_lists": sync_verbs.get("list", 0),
        "server_sync_watches": sync_verbs.get("watch", 0),
        "server_idle_requests": _median([sum(c.values()) for c in idle]),
        "server_idle_lists": _median([c.get("list", 0) for c in idle]),
        "server_lend_requests": sum(sum(c.values()) for c in in_ticks("lend")),
        "server_reclaim_requests": sum(sum(c.values()) for c in in_ticks("reclaim")),
        "server_watches": by_verb(events, 0, end["t"] + 1).get("watch", 0),
        "server_requests": len([e for e in events if e[0] <= end["t"] + 1]),
        "server_rest_requests": (
            # the rest's one tick excluded: the informer's requests alone
            sum(by_verb(events, r["rest"]["t"] + 5.0, end["t"]).values()) if "rest" in r else 0
        ),
        "controller_p95_rss_mb": p95,
        "controller_peak_rss_mb": controller_rss[-1],
        "controller_avg_cpu_cores": end["controller_cpu_s"] / (end["t"] - started),
        "controller_rest_cpu_cores": (
            (end["controller_cpu_s"] - r["rest"]["controller_cpu_s"]) / (end["t"] - r["rest"]["t"])
            if "rest" in r
            else 0.0
        ),
    }
    out["server_requests_by_kind"] = by_request(events, 0, end["t"] + 1)
    (lend,) = ticks["lend"]
    out["server_lend_patch_ms"] = latency(events, lend.started, lend.ended, "patch")
    out["server_lend_list_ms"] = latency(events, lend.started, lend.ended, "list")
    out["server_sync_list_ms"] = latency(events, sync["t"], synced["t"], "list")
    out["apiserver_rss_at_sync_mb"] = sync["apiserver_rss_mb"]
    return out


def _median(values: list[int] | list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


ROWS = (  # figure, label, format
    ("pods", "pods (all Running by KWOK)", "{:,.0f}"),
    ("seed_create_s", "seeding: nodes and pods created (s, not the controller's)", "{:.0f}"),
    ("seed_running_s", "seeding: then all Running by KWOK (s)", "{:.0f}"),
    ("quiet_s", "seeding: then until the server was quiet (s)", "{:.0f}"),
    ("apiserver_rss_before_mb", "kube-apiserver RSS before the controller (MB)", "{:,.0f}"),
    ("apiserver_rss_sync_peak_mb", "kube-apiserver RSS, peak during its sync (MB)", "{:,.0f}"),
    ("apiserver_rss_synced_mb", "kube-apiserver RSS once it has synced (MB)", "{:,.0f}"),
    ("apiserver_rss_end_mb", "kube-apiserver RSS at the end of the run (MB)", "{:,.0f}"),
    ("etcd_rss_before_mb", "etcd RSS before the controller (MB)", "{:,.0f}"),
    ("etcd_rss_sync_peak_mb", "etcd RSS, peak during its sync (MB)", "{:,.0f}"),
    ("etcd_rss_end_mb", "etcd RSS at the end of the run (MB)", "{:,.0f}"),
    ("etcd_db_mb", "etcd database file (MB)", "{:,.0f}"),
    ("apiserver_base_cpu_ms_per_s", "kube-apiserver CPU before it, KWOK's Leases (ms/s)", "{:.0f}"),
    ("apiserver_sync_cpu_s", "kube-apiserver CPU during its sync (s)", "{:.2f}"),
    ("apiserver_sync_cpu_over_base_s", "  of which above the rate before it (s)", "{:.2f}"),
    ("etcd_sync_cpu_s", "etcd CPU during its sync (s)", "{:.2f}"),
    ("apiserver_idle_cpu_ms_per_s", "kube-apiserver CPU during the idle ticks (ms/s)", "{:.0f}"),
    ("apiserver_rest_cpu_ms_per_s", "kube-apiserver CPU, controller at rest (ms/s)", "{:.0f}"),
    ("server_sync_lists", "sync: LIST requests (pages) the apiserver served it", "{:.0f}"),
    ("server_sync_watches", "sync: WATCH requests", "{:.0f}"),
    ("server_watches", "WATCH requests in the whole run", "{:.0f}"),
    ("server_idle_requests", "requests per idle tick, apiserver's audit log", "{:.0f}"),
    ("server_idle_lists", "LISTs per idle tick, apiserver's audit log", "{:.0f}"),
    ("server_rest_requests", "requests at rest, apiserver's audit log", "{:.0f}"),
    ("server_lend_requests", "lend wave: requests, apiserver's audit log", "{:.0f}"),
    ("server_reclaim_requests", "reclaim tick: requests, apiserver's audit log", "{:.0f}"),
    ("server_lend_patch_ms", "lend wave: apiserver's median PATCH (ms, audit log)", "{:.1f}"),
    ("server_lend_list_ms", "lend wave: apiserver's median LIST of a node's pods (ms)", "{:.1f}"),
    ("server_sync_list_ms", "sync: apiserver's median LIST page (ms)", "{:.0f}"),
    ("server_requests", "requests in the whole run, apiserver's audit log", "{:,.0f}"),
    ("controller_p95_rss_mb", "controller RSS, p95 over the run (MB)", "{:.0f}"),
    ("controller_peak_rss_mb", "controller RSS, peak (MB)", "{:.0f}"),
    ("controller_avg_cpu_cores", "controller CPU, average over the run (cores)", "{:.2f}"),
    ("controller_rest_cpu_cores", "controller CPU at rest, one tick in 30 s (cores)", "{:.3f}"),
)


def table(results: list[dict[str, Any]]) -> str:
    """One column per size; each budget marked met or not at every size measured."""
    header = ["figure"] + [f"{f['nodes']:,} nodes" for f in results] + ["budget"]
    lines = [header]
    for key, label, fmt in ROWS:
        values = [f.get(key, float("nan")) for f in results]
        mark = ""
        if key in BUDGETS:
            goal, _ = BUDGETS[key]
            over = [f"{f['nodes']:,}" for f in results if f.get(key, 0) > goal]
            mark = f"<= {goal:g}: " + ("met" if not over else f"NOT met at {', '.join(over)}")
        lines.append([label] + [fmt.format(v) for v in values] + [mark])
    return tables.aligned(lines)
