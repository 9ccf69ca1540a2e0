"""What one controller replica costs on Kubernetes' largest supported cluster (5,000 nodes,
150,000 pods), measured as a new user would meet it: the API emulator in a process of its own,
the controller in another, wired by ``runtime.wiring`` (the real client over HTTP, the informer,
the actuators, the audit log in SQLite), with scripted fresh metrics.

The cluster at N nodes: four inference pools of N/5 nodes each (``gpu-pool=inf-0`` ... ``inf-3``,
tainted ``workload=inference:NoSchedule``), N/5 training nodes, five DaemonSet pods on every node,
and 30 pods per node in all (150,000 at 5,000): serving replicas on 60 % of each inference pool
(the other 40 % idle, so lendable), training workers on the training nodes. Every controller run
goes through the same script, and leaves the cluster as it found it:

1. initial sync: LIST and WATCH of nodes and pods until the cache is synced (controller CPU and
   wall), then the resident set once the collector has run;
2. idle ticks with demand needing every node (nothing to lend, nothing lent), against the
   emulator with one node in ``HEARTBEAT_EVERY`` (5 %) given a new heartbeat before each, as
   KWOK renews nodes' status on a real server (a changed node is a new view: the ticks after
   heartbeats cost more than those in which no node changed);
3. a lend wave: demand falls so that each pool can spare 25 nodes, 100 in one tick;
4. idle ticks with the 100 nodes lent (heartbeats as in 2);
5. a spike: demand needs every node again; the tick that takes the 100 back, and the time from
   its start (the spike visible to the controller) to its first reclaim write; then the ticks
   that finish the reclaims; and the resident set again (every pool's views built by then).
6. (in a process of its own, once the controller's has ended) the reclaim wave's requests
   alone: as many of each verb, for as many nodes, as many at a time, through the client as
   the controller opens it (``alone``). What the wave costs before anything the controller
   decides, records or checks: the part of the reclaim tick no change to the controller's
   own code can take away.

Each tick is timed in controller CPU (``time.process_time``: the strategy threads included) and
wall time, with the API requests it sent counted by verb and the garbage collector's part of its
CPU (``gc.callbacks``: a profile shows a collection only as a slow line). The idle tick is
measured twice: with the four pools sharing one set of pod marks, and with each pool telling
its inference pods apart by a label of its own (four sets of views in the informer).

    .venv/bin/python bench/scale.py                       # 500 to 5,000 nodes, 3 runs each
    .venv/bin/python bench/scale.py --sizes 500 --repeat 1 --plot out/scale.png
    SCALE_PROFILE=lend .venv/bin/python bench/scale.py --sizes 1000 --repeat 1  # scale-*.prof
    SCALE_PROFILE=sync ...   # the initial sync; idle, lend, reclaim, drain: each such tick

``--backend real`` runs the same cluster and the same script against a real kube-apiserver and
etcd, with KWOK playing the kubelets (``bench/realplane.py``): one run per size, pools sharing
one set of pod marks, and a second table of what the controller cost the server (kube-apiserver
and etcd CPU and resident sets from ``/proc``, the controller's requests from the apiserver's
audit log), with the controller's memory and CPU budgets marked met or not. Seeding (minutes at
5,000 nodes) is timed apart; one ``out/scale-real-N.json`` per size.

    .venv/bin/python bench/scale.py --backend real --sizes 500,1000,2000,5000

The figures print as a table with each 5,000-node target (issue: idle tick <= 50 ms CPU, p99
tick <= 250 ms CPU, RSS <= 300 MB, initial sync <= 15 s, 0 LISTs per idle tick, 100 nodes lent
in <= 2 s wall) marked met or not. Medians of the runs; the seeding of the emulator is not
timed. About 15 minutes at the default sizes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tables

Obj = dict[str, Any]

POOLS = 4
DAEMON_PODS = 5  # per node
PODS_PER_NODE = 30
BUSY_SHARE = 0.6  # of an inference pool's nodes run serving replicas
WAVE = 25  # nodes each pool lends in the lend wave (100 in all)
RPS_PER_NODE = 100.0
IDLE_TICKS = 8
# The emulator's backend: the nodes whose Ready condition's heartbeat is renewed before each
# idle tick, one in HEARTBEAT_EVERY (a new resourceVersion, so a new view of each). KWOK renews
# every node's status every 10 to 10.2 minutes (tests/kube/stages/node-heartbeat-with-lease.yaml,
# as a kubelet reporting through its Lease does): at the default tick_interval of 30 s that is
# one node in 20 a tick.
HEARTBEAT_EVERY = 20
SERVING_TAINT = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
TRAINING_TAINT = {"key": "workload", "value": "training", "effect": "NoSchedule"}

TARGETS = {  # figure: (5,000-node target, higher is worse)
    "idle_cpu_ms": 50.0,
    "idle_cpu_ms_marks": 50.0,
    "p99_cpu_ms": 250.0,
    "rss_mb": 300.0,
    "sync_wall_s": 15.0,
    "idle_lists": 0.0,
    "lend_wall_s": 2.0,
}


# ---------------------------------------------------------------------------------------------
# The cluster (built in the emulator's process)


def pool_of(index: int, nodes: int) -> str:
    """The ``gpu-pool`` of node ``index``: four inference pools, then the training nodes."""
    per_pool = nodes // 5
    return f"inf-{index // per_pool}" if index < POOLS * per_pool else "training"


def layout(nodes: int) -> Iterator[tuple[str, str, str]]:
    """(node, pool, what runs on it: ``serving``, ``idle`` or ``training``) for every node."""
    per_pool = nodes // 5
    for i in range(nodes):
        pool = pool_of(i, nodes)
        if pool == "training":
            yield f"training-{i}", pool, "training"
        else:
            busy = (i % per_pool) < int(per_pool * BUSY_SHARE)
            yield f"{pool}-{i % per_pool}", pool, "serving" if busy else "idle"


def build(store: Any, nodes: int) -> int:
    """Seed ``store`` with the cluster; the number of pods."""
    from sandbox.emulator import cluster
    from sandbox.emulator.resources import NODES, PODS
    from sandbox.emulator.store import Store

    for name, pool, _ in layout(nodes):
        store.create(NODES, None, node_body(name, pool))
    # Each kind of pod made once by the real path (created, defaulted, started by the kubelet)
    # on a scratch store, then stamped out as JSON for every pod: the store loads them as a
    # running cluster holds them.
    scratch = Store(seed=1)
    scratch.create(NODES, None, cluster.node("n", cluster.INFERENCE))
    templates = {kind: _template(scratch, kind) for kind in ("daemon", "serving", "training")}
    return int(store.load(PODS, list(stamped(nodes, templates))))


def node_body(name: str, pool: str) -> Obj:
    from sandbox.emulator import cluster

    taint = TRAINING_TAINT if pool == "training" else SERVING_TAINT
    gpu = "NVIDIA-A100-SXM4-80GB" if pool == "training" else "NVIDIA-L20"
    return cluster.node(name, cluster.Pool(pool, 1, gpu, taint))


def stamped(nodes: int, templates: dict[str, str]) -> Iterator[Obj]:
    """Every pod of the cluster at ``nodes``, from ``templates`` (JSON, by kind of pod)."""
    placed = list(layout(nodes))
    busy = sum(1 for _, _, what in placed if what != "idle")
    extra = nodes * (PODS_PER_NODE - DAEMON_PODS)  # beyond the DaemonSet pods
    per_busy, spare = divmod(extra, busy)
    busy_seen = 0
    for name, pool, what in placed:
        for d in range(DAEMON_PODS):
            yield _stamp(templates["daemon"], f"ds-{d}-{name}", name, f"ds-{d}", pool)
        if what == "idle":
            continue
        count = per_busy + (1 if busy_seen < spare else 0)
        busy_seen += 1
        for k in range(count):
            yield _stamp(templates[what], f"{what}-{name}-{k}", name, f"{name}-{k}", pool)


def pod_body(kind: str) -> Obj:
    """A pod of each kind (``daemon``, ``serving``, ``training``) as its controller creates it,
    bound to node ``n``."""
    from sandbox.emulator import cluster

    if kind == "daemon":
        body = cluster.inference_pod(0, "node-exporter", gpus=0, namespace="monitoring")
        body["metadata"]["ownerReferences"][0].update(kind="DaemonSet", name="node-exporter")
        body["spec"]["tolerations"] = [{"operator": "Exists"}]
        del body["spec"]["nodeSelector"]
    elif kind == "serving":
        body = cluster.inference_pod(0, "llm", gpus=1)
    else:
        body = cluster.training_pod("train", 0, gpus=1, priority_class=None)
    body["spec"]["nodeName"] = "n"
    return body


def _template(scratch: Any, kind: str) -> str:
    from sandbox.emulator.resources import PODS

    body = pod_body(kind)
    made = scratch.create(PODS, body["metadata"]["namespace"], body)
    stored = scratch.get(PODS, made["metadata"]["namespace"], made["metadata"]["name"])
    for key in ("uid", "resourceVersion"):
        stored["metadata"].pop(key)
    return json.dumps(stored)


def _sizes(text: str) -> list[int]:
    """``--sizes``: each large enough that every pool's idle nodes hold its share of the wave
    (a fifth of the nodes a pool, ``BUSY_SHARE`` of them serving)."""
    sizes = []
    for part in text.split(","):
        try:
            nodes = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number of nodes: {part!r}") from None
        per_pool = nodes // 5
        if per_pool - int(per_pool * BUSY_SHARE) < WAVE:
            raise argparse.ArgumentTypeError(
                f"{nodes} nodes leave each pool fewer idle nodes than its {WAVE} in the wave"
            )
        sizes.append(nodes)
    return sizes


def real_objects(nodes: int) -> tuple[list[Obj], Iterator[Obj]]:
    """The same cluster as bodies to create on a real kube-apiserver: the nodes, each annotated
    for KWOK and without conditions (KWOK makes it Ready), and the pods as their controllers
    create them, already bound (KWOK runs them)."""
    from tests.support.control_plane import KWOK_ANNOTATION

    made = []
    for name, pool, _ in layout(nodes):
        body = node_body(name, pool)
        body["metadata"]["annotations"] = {KWOK_ANNOTATION: "fake"}
        del body["status"]["conditions"]
        made.append(body)
    templates = {kind: json.dumps(pod_body(kind)) for kind in ("daemon", "serving", "training")}
    return made, stamped(nodes, templates)


def _stamp(template: str, name: str, node: str, tag: str, pool: str) -> Obj:
    pod: Obj = json.loads(template)
    meta = pod["metadata"]
    meta["name"] = name
    labels = meta["labels"]
    labels["instance"] = tag
    if meta["namespace"] == "inference":
        labels["role"] = "inference"  # what pools sharing one set of pod marks select on
        labels["app"] = f"llm-{pool}"  # what pools with marks of their own select on
    pod["spec"]["nodeName"] = node
    return pod


def serve(nodes: int, kubeconfig: Path) -> None:
    """The emulator's process: seed, serve, say where on stdout, run until stdin closes."""
    from sandbox.emulator.server import serve as serving
    from sandbox.emulator.server import write_kubeconfig
    from sandbox.emulator.store import Store

    async def main() -> None:
        store = Store(seed=7, history=200_000)
        started = time.process_time()
        pods = build(store, nodes)
        gc.collect()
        gc.freeze()  # the seeded cluster is not garbage: keep the collector off it
        async with serving(store) as url:
            write_kubeconfig(url, kubeconfig)
            seeded = time.process_time() - started
            print(json.dumps({"url": url, "pods": pods, "seed_s": seeded}), flush=True)
            loop = asyncio.get_running_loop()
            closed = asyncio.Event()
            loop.add_reader(sys.stdin.fileno(), closed.set)
            await closed.wait()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# The controller (in a process of its own)


@dataclass
class Tick:
    kind: str  # idle, lend, reclaim, drain
    cpu_ms: float
    wall_ms: float
    requests: dict[str, int]
    started: float = 0.0  # epoch seconds: what the server's audit log is read between
    ended: float = 0.0
    collector_ms: float = 0.0  # of ``cpu_ms``, the garbage collector's
    between_ms: float = 0.0  # after the tick, outside ``cpu_ms``: its full collection's CPU

    @property
    def lists(self) -> int:
        return self.requests.get("list", 0)


@dataclass
class Run:
    nodes: int
    pods: int
    marks: str
    sync_cpu_s: float = 0.0
    sync_wall_s: float = 0.0
    rss_mb: float = 0.0
    rss_end_mb: float = 0.0  # after the script: every pool's views built, the waves done
    ticks: list[Tick] = field(default_factory=list)
    lent: int = 0
    reclaimed: int = 0
    spike_to_write_ms: float = 0.0
    alone_ms: float = float("nan")  # the reclaim wave's requests sent alone (``alone``)
    # --backend real: readings (epoch time, the controller's CPU, the server's processes' CPU
    # and resident sets) at the script's steps, and the rest after it (one tick, then nothing)
    readings: dict[str, dict[str, float]] = field(default_factory=dict)
    rest_s: float = 0.0


class Counting:
    """Counts the client's requests by verb and notes when the first node write after
    ``arm`` left: wraps the client's one request method (kubernetes_asyncio's ``rest_client``)."""

    def __init__(self, rest: Any) -> None:
        self.counts: Counter[str] = Counter()
        self.armed: float | None = None
        self.first_write: float | None = None
        inner = rest.request

        async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.counts[_verb(method, url, kwargs.get("query_params") or ())] += 1
            node_write = method == "PATCH" and "/nodes/" in url
            if self.armed is not None and self.first_write is None and node_write:
                self.first_write = time.perf_counter()
            return await inner(method, url, *args, **kwargs)

        rest.request = request

    def take(self) -> dict[str, int]:
        out, self.counts = dict(self.counts), Counter()
        return out


class Collector:
    """The CPU the garbage collector takes while the process runs (``gc.callbacks``): a full
    collection that falls in a wave is a large part of it, and a profile does not show it as
    such (it lands on whatever line allocated last)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self._began = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.ms += (time.process_time() - self._began) * 1000

    def take(self) -> float:
        taken, self.ms = self.ms, 0.0
        return taken


def _verb(method: str, url: str, query: Iterable[tuple[str, Any]]) -> str:
    params = dict(query)
    if method != "GET":
        return "evict" if url.endswith("/eviction") else method.lower()
    if str(params.get("watch", "")).lower() == "true":
        return "watch"
    path = url.split("?", maxsplit=1)[0].rstrip("/")
    collection = path.endswith(("/nodes", "/pods", "/events", "/leases"))
    return "list" if collection else "get"


class Script:
    """Fresh metrics that say whatever the script sets: demand per pool, no queue."""

    def __init__(self) -> None:
        self.demand: dict[str, float] = {}

    async def read(self, pool: Any, nodes: Iterable[Any], now: datetime | None = None) -> Any:
        from rebalancer.core import model

        at = now or datetime.now(UTC)
        return model.PoolMetrics(
            pool, model.Sample(self.demand[str(pool)], at), model.Sample(0.0, at)
        )

    async def history(
        self, pool: Any, nodes: Any, since: datetime, until: datetime, step: Any
    ) -> Any:
        """No history, as a Prometheus that has just started holds: every pool has an error
        budget, whose cover is judged on one, and a read that raised was a traceback in the
        log for every pool on every tick."""
        from rebalancer.core import model

        return model.HistoryResult(model.DemandHistory.empty(until))


def config(audit: Path, nodes: int, marks: str) -> str:
    per_pool = nodes // 5
    pools = []
    for i in range(POOLS):
        selector = "{role: inference}" if marks == "same" else f"{{app: llm-inf-{i}}}"
        pools.append(
            f"""
  - name: inf-{i}
    node_selector: {{gpu-pool: inf-{i}}}
    inference_selector: {selector}
    serving_taints: [workload=inference:NoSchedule]
    lend_only_to_takers: false  # the waves are what is measured, not who would take them
    rps_per_node: {RPS_PER_NODE}
    strategy: {{name: reactive}}
    limits: {{drop_floor: 0, max_step_fraction: {min(1.0, (WAVE + 1) / per_pool)}}}"""
        )
    return f"""
leader_election: {{enabled: false}}
prometheus: {{url: "http://127.0.0.1:9"}}
audit: {{url: "sqlite+aiosqlite:///{audit}"}}
log_level: WARNING
pools:{"".join(pools)}
"""


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def measure(
    kubeconfig: Path,
    nodes: int,
    pods: int,
    marks: str,
    server: dict[str, int] | None = None,
    rest_s: float = 0.0,
) -> Run:
    """The module's script in this process; with ``server`` (pids by name), their CPU and
    resident sets read at each step, and ``rest_s`` seconds at rest after it."""
    from rebalancer import settings as settings_mod
    from rebalancer.runtime import wiring

    run = Run(nodes, pods, marks, rest_s=rest_s)
    script = Script()

    def reading(step: str) -> None:
        if server is None:
            return
        import realplane

        run.readings[step] = {"controller_cpu_s": time.process_time(), **realplane.reading(server)}

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config(Path(tmp) / "audit.sqlite3", nodes, marks), encoding="utf-8")
        settings = settings_mod.load(path, env={})
        seams = wiring.Seams(
            kubeconfig=kubeconfig, metrics=script, sink=None, name="bench", serve_http=False
        )
        async with wiring.Controller.open(settings, seams) as controller:
            counting = Counting(controller.api.rest_client)

            reading("sync")
            profile = _profiler("sync")
            cpu, wall = time.process_time(), time.perf_counter()
            informer = asyncio.create_task(controller.informer.run())
            await controller.informer.synced.wait()
            run.sync_cpu_s = time.process_time() - cpu
            run.sync_wall_s = time.perf_counter() - wall
            _dump(profile, f"scale-{nodes}-sync.prof")
            reading("synced")
            gc.collect()
            run.rss_mb = rss_mb()
            counting.take()

            # Only the emulator's nodes get heartbeats here (KWOK renews a real server's); full
            # collections wait for the end of a tick, as while ``Controller.run`` runs.
            with controller.collections.between_ticks():
                await _script(controller, script, counting, run, reading, heartbeats=server is None)
            gc.collect()
            run.rss_end_mb = rss_mb()
            if rest_s:
                await _rest(controller, run, reading)
            informer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await informer
    return run


async def _rest(controller: Any, run: Run, reading: Callable[[str], None]) -> None:
    """One tick, then nothing until ``run.rest_s`` after it began (--backend real)."""
    reading("rest")
    await controller.reconciler.tick()
    await asyncio.sleep(run.rest_s - (time.time() - run.readings["rest"]["t"]))
    reading("rested")


@dataclass
class Ticker:
    """The script's ticks, each timed (CPU, wall, the collector's part) with its requests
    counted; then, outside its time, the full collection the loop runs once a tick has ended.
    With ``heartbeats``, a twentieth of the nodes get a new heartbeat before each idle tick
    (another twentieth each time)."""

    controller: Any
    counting: Counting
    run: Run
    heartbeats: bool
    collector: Collector = field(default_factory=Collector)

    async def __call__(self, kind: str) -> Any:
        controller, run = self.controller, self.run
        if kind == "idle" and self.heartbeats:
            await heartbeat(controller, run.nodes, sum(1 for t in run.ticks if t.kind == "idle"))
        await _settle(controller.informer)
        self.counting.take()
        self.collector.take()
        profile = _profiler(kind)
        cpu, wall, started = time.process_time(), time.perf_counter(), time.time()
        report = await controller.reconciler.tick()
        cpu_ms, wall_ms = (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000
        ended, collected = time.time(), self.collector.take()
        _dump(profile, f"scale-{run.nodes}-{kind}-{len(run.ticks)}.prof")
        cpu = time.process_time()
        controller.collections.after_tick()  # as the loop does once a tick has ended
        between = (time.process_time() - cpu) * 1000
        requests = self.counting.take()
        run.ticks.append(Tick(kind, cpu_ms, wall_ms, requests, started, ended, collected, between))
        return report


def _demand(controller: Any, script: Script, serving: int) -> None:
    """Each pool's demand set to what ``serving`` nodes carry, less half a node's worth."""
    for pool in controller.pools:
        rps = (serving - 0.5) * RPS_PER_NODE
        rps /= 1 + pool.policy.headroom
        assert pool.policy.need(rps) == serving
        script.demand[str(pool.name)] = rps


def _lent(controller: Any) -> int:
    """The first pool's nodes not serving, as the cache shows them."""
    from rebalancer.core import tick as tick_mod
    from rebalancer.core.nodestate import Phase

    views = controller.informer.node_views(controller.pools[0].marks)
    lent_taints = controller.pools[0].lend_spec.add_taints
    return sum(
        1 for v in views if tick_mod.phase(v, controller.keys, lent_taints) is not Phase.SERVING
    )


async def _script(
    controller: Any,
    script: Script,
    counting: Counting,
    run: Run,
    reading: Callable[[str], None],
    heartbeats: bool,
) -> None:
    """Steps 2 to 5 of the module's script (``Ticker``)."""
    per_pool = run.nodes // 5
    tick = Ticker(controller, counting, run, heartbeats)
    _demand(controller, script, per_pool)
    await tick("start")  # start-up: recovery reads what a crash left
    reading("idle")
    for _ in range(IDLE_TICKS):
        await tick("idle")
    reading("idled")
    _demand(controller, script, per_pool - WAVE)
    report = await tick("lend")
    run.lent = sum(1 for a in report.applied if a.result and a.result.outcome == "applied")
    for _ in range(IDLE_TICKS):
        await tick("idle")
    _demand(controller, script, per_pool)
    counting.armed, counting.first_write = time.perf_counter(), None
    report = await tick("reclaim")
    if counting.first_write is not None:
        run.spike_to_write_ms = (counting.first_write - counting.armed) * 1000
    for _ in range(5):
        if _lent(controller) == 0:
            break
        await tick("drain")
    run.reclaimed = run.lent - _lent(controller)
    reading("scripted")


async def heartbeat(controller: Any, nodes: int, beats: int) -> None:
    """Renew the Ready condition's heartbeat of one node in ``HEARTBEAT_EVERY`` (another
    twentieth after ``beats`` renewals), as KWOK's heartbeat stage does on a real server:
    nothing the controller reads but the node's resourceVersion changes, and that makes a new
    view of it. Outside any tick's measure; returns once the informer holds the last one (a
    heartbeat wakes nothing, so ``_settle`` cannot tell)."""
    from kubernetes_asyncio import client

    every = [name for name, _, _ in layout(nodes)]
    names = every[beats % HEARTBEAT_EVERY :: HEARTBEAT_EVERY]
    informer = controller.informer
    core: Any = client.CoreV1Api(controller.api)  # typed for a body it parses, not read raw
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": at}
    body = {"status": {"conditions": [ready]}}
    version = ""
    for name in names:
        answer = await core.patch_node_status(
            name,
            body,
            _content_type="application/strategic-merge-patch+json",
            _preload_content=False,
        )
        written = json.loads(await answer.read())
        if answer.status != 200:
            raise SystemExit(f"node {name}'s heartbeat was answered {answer.status}: {written}")
        version = written["metadata"]["resourceVersion"]
    for _ in range(200):
        held = informer.node(names[-1]) or {}
        if held.get("metadata", {}).get("resourceVersion") == version:
            return
        await asyncio.sleep(0.05)
    raise SystemExit(f"node {names[-1]}'s heartbeat was not seen by the informer in 10 s")


def _profiler(step: str) -> cProfile.Profile | None:
    """A profile of the controller's thread's CPU (not its waiting), started, when
    ``SCALE_PROFILE`` names ``step`` (``sync``, ``idle``, ``lend``, ``reclaim``, ``drain``)."""
    if step != os.environ.get("SCALE_PROFILE"):
        return None
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    return profile


def _dump(profile: cProfile.Profile | None, path: str) -> None:
    if profile is not None:
        profile.disable()
        profile.dump_stats(path)


async def _settle(informer: Any) -> None:
    """Let the watches deliver what the last tick wrote (the informer is level-triggered; the
    next tick plans on what it shows)."""
    for _ in range(50):
        informer.changed.clear()
        await asyncio.sleep(0.05)
        if not informer.changed.is_set():
            return


# ---------------------------------------------------------------------------------------------
# The driver


@dataclass
class Figures:
    nodes: int
    pods: int
    idle_cpu_ms: float
    idle_cpu_ms_marks: float
    p99_cpu_ms: float
    p99_collector_ms: float
    p99_cpu_ms_marks: float
    p99_collector_ms_marks: float
    between_max_ms: float
    rss_mb: float
    rss_end_mb: float
    rss_end_mb_marks: float
    sync_cpu_s: float
    sync_wall_s: float
    idle_lists: float
    idle_requests: float
    lend_requests: float
    lend_wall_s: float
    lend_cpu_ms: float
    reclaim_requests: float
    reclaim_cpu_ms: float
    reclaim_alone_ms: float
    spike_to_write_ms: float
    lent: float
    reclaimed: float


def figures(same: Sequence[Run], different: Sequence[Run]) -> Figures:
    def med(values: Iterable[float]) -> float:
        listed = list(values)
        return statistics.median(listed) if listed else float("nan")  # not measured

    def idle(run: Run) -> list[Tick]:
        return [t for t in run.ticks if t.kind == "idle"]

    def one(run: Run, kind: str) -> Tick:
        return next(t for t in run.ticks if t.kind == kind)

    def p99(run: Run) -> Tick:
        ticks = sorted((t for t in run.ticks if t.kind != "start"), key=lambda t: t.cpu_ms)
        return ticks[min(len(ticks) - 1, round(0.99 * (len(ticks) - 1)))]

    return Figures(
        nodes=same[0].nodes,
        pods=same[0].pods,
        idle_cpu_ms=med(med(t.cpu_ms for t in idle(r)) for r in same),
        idle_cpu_ms_marks=med(med(t.cpu_ms for t in idle(r)) for r in different),
        p99_cpu_ms=med(p99(r).cpu_ms for r in same),
        p99_collector_ms=med(p99(r).collector_ms for r in same),
        p99_cpu_ms_marks=med(p99(r).cpu_ms for r in different),
        p99_collector_ms_marks=med(p99(r).collector_ms for r in different),
        between_max_ms=med(max(t.between_ms for t in r.ticks) for r in same),
        rss_mb=med(r.rss_mb for r in same),
        rss_end_mb=med(r.rss_end_mb for r in same),
        rss_end_mb_marks=med(r.rss_end_mb for r in different),
        sync_cpu_s=med(r.sync_cpu_s for r in same),
        sync_wall_s=med(r.sync_wall_s for r in same),
        idle_lists=med(med(t.lists for t in idle(r)) for r in same),
        idle_requests=med(med(sum(t.requests.values()) for t in idle(r)) for r in same),
        lend_requests=med(sum(one(r, "lend").requests.values()) for r in same),
        lend_wall_s=med(one(r, "lend").wall_ms / 1000 for r in same),
        lend_cpu_ms=med(one(r, "lend").cpu_ms for r in same),
        reclaim_requests=med(sum(one(r, "reclaim").requests.values()) for r in same),
        reclaim_cpu_ms=med(one(r, "reclaim").cpu_ms for r in same),
        reclaim_alone_ms=med(r.alone_ms for r in same),
        spike_to_write_ms=med(r.spike_to_write_ms for r in same),
        lent=med(r.lent for r in same),
        reclaimed=med(r.reclaimed for r in same),
    )


ROWS = (  # figure, label, format
    ("idle_cpu_ms", "idle tick, controller CPU (ms)", "{:.1f}"),
    ("idle_cpu_ms_marks", "idle tick, pools with their own pod marks (ms)", "{:.1f}"),
    ("p99_cpu_ms", "p99 tick, lend and reclaim waves included (ms CPU)", "{:.1f}"),
    ("p99_collector_ms", "  of which the garbage collector (ms CPU)", "{:.1f}"),
    ("p99_cpu_ms_marks", "the same, pools with their own pod marks (ms CPU)", "{:.1f}"),
    ("p99_collector_ms_marks", "  of which the garbage collector (ms CPU)", "{:.1f}"),
    ("between_max_ms", "longest full collection between ticks (ms CPU)", "{:.1f}"),
    ("rss_mb", "controller RSS after sync (MB)", "{:.0f}"),
    ("rss_end_mb", "controller RSS at the end of the run (MB)", "{:.0f}"),
    ("rss_end_mb_marks", "the same, pools with their own pod marks (MB)", "{:.0f}"),
    ("sync_cpu_s", "initial sync, controller CPU (s)", "{:.2f}"),
    ("sync_wall_s", "initial sync, wall (s)", "{:.2f}"),
    ("idle_lists", "LIST requests per idle tick", "{:.0f}"),
    ("idle_requests", "API requests per idle tick", "{:.0f}"),
    ("lend_requests", "lend 100 nodes in one tick: requests", "{:.0f}"),
    ("lend_wall_s", "lend 100 nodes in one tick: wall (s)", "{:.2f}"),
    ("lend_cpu_ms", "lend 100 nodes in one tick: CPU (ms)", "{:.0f}"),
    ("reclaim_requests", "reclaim 100 nodes in one tick: requests", "{:.0f}"),
    ("reclaim_cpu_ms", "reclaim 100 nodes in one tick: CPU (ms)", "{:.0f}"),
    ("reclaim_alone_ms", "  its requests alone, no controller (ms CPU)", "{:.0f}"),
    ("spike_to_write_ms", "spike seen to first reclaim write (ms)", "{:.0f}"),
    ("lent", "nodes lent in the wave", "{:.0f}"),
    ("reclaimed", "nodes back by the end", "{:.0f}"),
)


def table(results: Sequence[Figures]) -> str:
    header = ["figure"] + [f"{f.nodes:,} nodes" for f in results] + ["5,000-node target"]
    lines = [header]
    for key, label, fmt in ROWS:
        values = [getattr(f, key) for f in results]
        mark = ""
        if key in TARGETS:
            at = next((getattr(f, key) for f in results if f.nodes == 5000), None)
            goal = TARGETS[key]
            mark = f"<= {goal:g}" + ("" if at is None else (" met" if at <= goal else " NOT met"))
        lines.append([label] + [fmt.format(v) for v in values] + [mark])
    return tables.aligned(lines)


def plot(results: Sequence[Figures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in ROWS if r[0] not in ("lent", "reclaimed", "idle_lists")]
    cols = 4
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    sizes = [f.nodes for f in results]
    for ax, (key, label, _) in zip(axes.flat, shown, strict=False):
        ax.plot(sizes, [getattr(f, key) for f in results], marker="o")
        if key in TARGETS:
            ax.axhline(TARGETS[key], color="red", linestyle="--", linewidth=1, label="target")
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("nodes", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    fig.suptitle(f"One controller replica against the emulator ({PODS_PER_NODE} pods per node)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


@contextlib.contextmanager
def emulator(nodes: int, tmp: Path) -> Iterator[tuple[Path, int]]:
    kubeconfig = tmp / f"emulator-{nodes}.kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", "--nodes", str(nodes), "--kubeconfig", str(kubeconfig)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        print(
            f"  emulator: {nodes:,} nodes, {ready['pods']:,} pods seeded in {ready['seed_s']:.1f}s",
            file=sys.stderr,
        )
        yield kubeconfig, int(ready["pods"])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


ALONE_WAVES = 5  # the reclaim wave's requests sent alone this many times; the median counts


async def alone(kubeconfig: Path, nodes: int, waves: int = ALONE_WAVES) -> list[float]:
    """The reclaim wave's requests without the controller, ``waves`` times: for each of the
    wave's nodes, as many of each verb as the controller sends (a node patch, its pods listed,
    a second patch, two Events), through the client as the controller opens it, as many at a
    time as it sends them, answers read as its writer reads them. Each wave opens its client
    anew, as a wave after quiet ticks finds no connection open (aiohttp closes one idle for 15
    s), so that its connections (TLS on a real server) are paid as the controller's are. CPU ms
    of each wave: what a reclaim wave costs before anything the controller decides, records or
    checks."""
    from rebalancer.adapters import kubeclient

    idle: dict[str, list[str]] = {}
    for name, pool, kind in layout(nodes):
        if kind == "idle":
            idle.setdefault(pool, []).append(name)
    wave = [name for names in idle.values() for name in names[:WAVE]]
    spent = []
    for n in range(waves):
        async with kubeclient.api_client(kubeconfig) as api:
            send = _wave_of_requests(api, n)
            began = time.process_time()
            await asyncio.gather(*(send(name) for name in wave))
            spent.append((time.process_time() - began) * 1000)
    return spent


def _wave_of_requests(api: Any, n: int) -> Callable[[str], Awaitable[None]]:
    """What ``alone`` sends for one node of wave ``n``, ``RECLAIM_CONCURRENCY`` at a time."""
    from kubernetes_asyncio import client

    from rebalancer.adapters import events
    from rebalancer.adapters.writer import MERGE_PATCH, read_answer
    from rebalancer.core.concurrency import RECLAIM_CONCURRENCY

    core: Any = client.CoreV1Api(api)  # its stubs name no _content_type
    pods = core.list_pod_for_all_namespaces
    event: Any = client.EventsV1Api(api).create_namespaced_event  # a dict body as is
    gate = asyncio.Semaphore(RECLAIM_CONCURRENCY)

    def patch(name: str, text: str) -> Any:
        body = {"metadata": {"annotations": {"bench.rebalancer.io/alone": text}}}
        return core.patch_node(name, body, _content_type=MERGE_PATCH, _preload_content=False)

    def told(name: str, k: int) -> Any:  # as the recorder writes a reclaim's Event
        said = events.NodeEvent(name, "Normal", events.RESTORED, "Reclaim", "requests alone")
        body = events.event_body(said, "bench", datetime.now(UTC), time.time_ns() + k)
        return event(events.NAMESPACE, body, _preload_content=False)

    async def node(name: str) -> None:
        async with gate:
            await read_answer(patch(name, f"{n}-begin {'x' * 600}"))  # a state's size
            await read_answer(pods(field_selector=f"spec.nodeName={name}", _preload_content=False))
            await read_answer(patch(name, f"{n}-finish {'x' * 600}"))
            for k in range(2):
                await read_answer(told(name, k))

    return node


def alone_run(kubeconfig: Path, nodes: int) -> float:
    """``alone`` in a process of its own (as the controller runs in one): the median wave."""
    command = [
        sys.executable, __file__, "alone", "--kubeconfig", str(kubeconfig), "--nodes", str(nodes),
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(statistics.median(json.loads(done.stdout.strip().splitlines()[-1])))


def controller_run(
    kubeconfig: Path,
    nodes: int,
    pods: int,
    marks: str,
    server: dict[str, int] | None = None,
    rest_s: float = 0.0,
    sampler: Any = None,
) -> Run:
    """The controller's process through the script; with ``server``, the pids it reads at each
    step, and a ``sampler`` (``realplane.Sampler``) told the controller's own pid."""
    command = [
        sys.executable, __file__, "measure", "--kubeconfig", str(kubeconfig),
        "--nodes", str(nodes), "--pods", str(pods), "--marks", marks,
    ]  # fmt: skip
    if server is not None:
        command += ["--server", json.dumps(server), "--rest", str(rest_s)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if sampler is not None:
        sampler.add("controller", proc.pid)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"the controller's run at {nodes} nodes failed ({proc.returncode})")
    raw = json.loads(stdout.strip().splitlines()[-1])
    ticks = [Tick(**t) for t in raw.pop("ticks")]
    return Run(**raw, ticks=ticks)


REST_S = 30.0  # --backend real: the controller at rest after the script (one tick, the default
# tick_interval)
BASELINE_S = 10.0  # --backend real: the server read before the controller starts


def real_run(nodes: int, tmp: Path, out: Path | None) -> tuple[Run, dict[str, Any]]:
    """One run of the script on a real control plane of ``nodes`` (``realplane``): the
    controller's run and what it cost the server, written to ``out`` as JSON too."""
    import realplane

    from tests.support import kube

    with realplane.running(*real_objects(nodes), tmp / f"real-{nodes}") as plane:
        print(
            f"  real: {nodes:,} nodes, {plane.pods:,} pods created in "
            f"{plane.seed_create_s:.0f}s, all Running {plane.seed_running_s:.0f}s later",
            file=sys.stderr,
        )
        plane.quiet_s = realplane.quiesce(plane)
        plane.baseline = realplane.baseline(plane, BASELINE_S)
        load = [realplane.other_load(plane.pids.values())]
        with realplane.Sampler(plane.pids) as sampler:
            started = time.time()
            run = controller_run(
                plane.kubeconfig, nodes, plane.pods, "same", plane.pids, REST_S, sampler
            )
        load.append(realplane.other_load([*plane.pids.values(), sampler.pids["controller"]]))
        server = realplane.server_figures(
            plane, run, sampler.samples, started, kube.CONTROLLER_USER
        )
        server.update(nodes=nodes, pods=plane.pods)
        run.alone_ms = alone_run(plane.kubeconfig, nodes)  # after the server's figures are read
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            payload = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "nodes": nodes,
                "version": plane.server.version,
                "server": server,
                "baseline": plane.baseline,
                "other_load": {"before": load[0], "after": load[1]},
                "run": {**asdict(run), "ticks": [asdict(t) for t in run.ticks]},
                "samples": sampler.samples,
            }
            path = out / f"scale-real-{nodes}.json"
            path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
        print(
            f"  real: {nodes:,} nodes: sync {run.sync_wall_s:.2f}s, RSS {run.rss_mb:.0f} MB, "
            f"lent {run.lent}, back {run.reclaimed}; apiserver RSS "
            f"{server['apiserver_rss_before_mb']:.0f} -> {server['apiserver_rss_synced_mb']:.0f}"
            f" MB; other load {load}",
            file=sys.stderr,
        )
        return run, server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="(internal) the emulator's process")
    s.add_argument("--nodes", type=int, required=True)
    s.add_argument("--kubeconfig", type=Path, required=True)
    a = sub.add_parser("alone", help="(internal) the reclaim wave's requests, no controller")
    a.add_argument("--kubeconfig", type=Path, required=True)
    a.add_argument("--nodes", type=int, required=True)
    m = sub.add_parser("measure", help="(internal) the controller's process")
    m.add_argument("--kubeconfig", type=Path, required=True)
    m.add_argument("--nodes", type=int, required=True)
    m.add_argument("--pods", type=int, required=True)
    m.add_argument("--marks", choices=("same", "different"), default="same")
    m.add_argument("--server", type=json.loads, help="pids to read at each step (JSON)")
    m.add_argument("--rest", type=float, default=0.0)
    parser.add_argument(
        "--backend",
        choices=("emulator", "real"),
        default="emulator",
        help="the API emulator, or kube-apiserver + etcd with KWOK nodes (bench/realplane.py;"
        " one run per size, pools sharing one set of pod marks)",
    )
    parser.add_argument(
        "--sizes", type=_sizes, default="500,1000,2000,5000", help="nodes, comma-separated"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plot", default="out/scale.png", help="where to draw ('' for none)")
    parser.add_argument(
        "--json",
        type=Path,
        help="write every run's figures here too (--backend real: a directory, out/ unless"
        " given, one scale-real-NODES.json per size)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        serve(args.nodes, args.kubeconfig)
        return 0
    if args.command == "alone":
        print(json.dumps(asyncio.run(alone(args.kubeconfig, args.nodes))))
        return 0
    if args.command == "measure":
        run = asyncio.run(
            measure(args.kubeconfig, args.nodes, args.pods, args.marks, args.server, args.rest)
        )
        print(json.dumps({**asdict(run), "ticks": [asdict(t) for t in run.ticks]}))
        return 0
    if args.backend == "real":
        return real_main(args)
    return emulator_main(args)


def emulator_main(args: argparse.Namespace) -> int:
    """The emulator's runs (``--repeat`` of each marks mode per size), their table, plot and
    JSON."""
    results, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in args.sizes:
            same: list[Run] = []
            different: list[Run] = []
            for i in range(args.repeat):
                for marks, into in (("same", same), ("different", different)):
                    # A fresh cluster for every run: a run's reclaimed nodes are warming up
                    # (not lendable) for a while, so the next run would find fewer to lend.
                    with emulator(nodes, Path(tmp)) as (kubeconfig, pods):
                        run = controller_run(kubeconfig, nodes, pods, marks)
                        if marks == "same":
                            run.alone_ms = alone_run(kubeconfig, nodes)
                    into.append(run)
                    runs.append(run)
                    idle = statistics.median(t.cpu_ms for t in run.ticks if t.kind == "idle")
                    print(
                        f"  {nodes:,} nodes, run {i + 1} ({marks} marks): sync "
                        f"{run.sync_wall_s:.2f}s, RSS {run.rss_mb:.0f} MB, idle tick "
                        f"{idle:.1f} ms, lent {run.lent}, back {run.reclaimed}",
                        file=sys.stderr,
                    )
            results.append(figures(same, different))
    print(table(results))
    if args.plot:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "figures": [asdict(f) for f in results],
            "runs": [{**asdict(r), "ticks": [asdict(t) for t in r.ticks]} for r in runs],
        }
        args.json.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return 0


def real_main(args: argparse.Namespace) -> int:
    """--backend real: one run per size (seeding a real cluster takes minutes), the
    controller's figures as the emulator's table shows them, then the server's."""
    import realplane

    results, servers = [], []
    out = args.json or Path("out")
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in args.sizes:
            run, server = real_run(nodes, Path(tmp), out)
            results.append(figures([run], []))
            servers.append(server)
            # the tables so far, in case a larger size does not fit
            print(table(results), realplane.table(servers), sep="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
