"""``rebalancer demo``: the real controller against the API emulator, on a replayed trace.

In one process, with no network, cluster or Prometheus:

- the settings of two inference pools, as a platform team would write them: 8 L20 nodes serving
  one service of the trace, 4 T4 nodes serving another, each lending only to a pending job that
  would run on its nodes (``lend_only_to_takers``, the default);
- the controller as ``rebalancer run`` builds it (``runtime.wiring.Controller.open``), given the
  emulator's client, a manual clock and the replayed traces as its seams: informer, actuator,
  Events, reconciler, audit log (SQLite in a temporary directory), telemetry;
- the Kubernetes API emulator serving a heterogeneous cluster over HTTP on 127.0.0.1 (the L20
  and T4 inference pools and 4 A100 training nodes, labelled as GPU Feature Discovery labels
  them) on a ``ManualClock`` set to the trace's start; inference replicas run on a few inference
  nodes (so those are never idle);
- ``sandbox.training``: preemptible training jobs of one, two and four nodes, each asking by node
  affinity for the GPU it can use (48 GB cards, Turing cards, Hopper cards that no pool has),
  a few of each always waiting, each job a gang placed whole or not at all, restarted whole from
  its last checkpoint when preempted;
- ``sim.replay.Replay`` replays each pool's demand behind the controller's metrics seam: the
  clock moves one trace minute per step, so cooldowns and deadlines follow the trace.

Every minute of each pool is scored as the simulator scores it (``sim.engine.score``). At the
end every loan is taken back by ``rebalancer reclaim``'s own wave (``commands.reclaim``), and a
summary of a screen says what was lent and what training used of it, what was refused for want
of a taker (a line per pool and reason, ``sandbox.refusals``), what reclaims cost training,
whether a gang was ever left half-running or a job put on a GPU it cannot use, what was
breached, and whether every node's taints and labels are back byte for byte. Beside it, what a
reclaim notice saves training: the simulator's model of the same day, pools and strategy
(``notice_model``), with the pools' ``reclaim_notice`` and without. ``--report DIR`` writes
demo.json and the day's picture, day.svg (``sandbox.picture``).

Quiet by default, and as fast as it runs: a newcomer reads the summary. ``-v`` prints each
decision as it is made, a trace day to a wall minute so they can be followed; ``--keep``
serves the emulated cluster to kubectl from the start and after the summary until Ctrl-C, so
the kubectl commands it prints name a cluster that is still there. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio import client

from rebalancer.adapters import convert, kubeclient, registry
from rebalancer.adapters.audit import SqlAuditStore, UlidFactory, every_record, json_line
from rebalancer.commands import reclaim
from rebalancer.core import model, nodestate, warmth
from rebalancer.core.audit import AuditRecord
from rebalancer.core.model import PoolName
from rebalancer.core.outcomes import Outcome
from rebalancer.errors import TraceError
from rebalancer.runtime.poolmetrics import PoolMetricsRouter
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.wiring import Controller, Seams
from rebalancer.settings import Settings
from sandbox import picture, refusals, training
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store
from sandbox.emulator.views import expected_views
from sandbox.sim import engine, jobs, traces
from sandbox.sim.replay import Replay

Obj = dict[str, Any]

DEFAULT_TRACE = (
    Path(__file__).resolve().parent.parent
    / "examples"
    / "traces"
    / "azure_llm_2024_week_per_minute.csv"
)
DEFAULT_SPEED = 1  # trace minutes per reconcile tick: a day is 1440 ticks
DEFAULT_PACE = 60.0  # wall seconds per trace day with -v: a day's decisions in about a minute
LENDERS = (cluster.L20, cluster.T4)  # the inference pools the controller lends from
CLUSTER = cluster.HETEROGENEOUS  # and the A100 training pool
SERVING = {cluster.L20.name: "llm-serving", cluster.T4.name: "llm-small"}  # each pool's service
BUSY = ("l20-0", "l20-1", "t4-0")  # run inference replicas: never idle, never lent
REPORT_KEYS = ("options", "rps_per_node", "summary", "series", "nodes", "audit")


class DemoError(Exception):
    pass


@dataclass(frozen=True)
class Options:
    trace: Path
    service: str | None
    t4_service: str | None
    hours: float
    start: float
    speed: int
    pace: float
    report: Path | None
    strategy: str
    verbose: bool
    keep: bool


def pool_model(pool: cluster.Pool) -> engine.PoolModel:
    """The simulator's model of ``pool``: 2 min drain, 5 min warm-up, as scored."""
    return engine.PoolModel(size=pool.size)


def settings(strategy: str, rps_per_node: dict[str, float], keys: Path | None = None) -> Settings:
    """The demo's settings: the two inference pools; no election (one replica), no server;
    ``keys``, the directory of the node-state key (``node_keys``)."""
    pools = []
    for pool in LENDERS:
        m = pool_model(pool)
        pools.append(
            {
                "name": pool.name,
                "node_selector": {"gpu-pool": pool.name},
                "inference_selector": {"app": SERVING[pool.name]},
                "rps_per_node": rps_per_node[pool.name],
                "strategy": {"name": strategy},
                "lend_only_to_takers": True,
                "limits": {
                    "min_serving": m.min_serving,
                    "headroom": m.headroom,
                    "reclaim_deadline": m.drain,
                    "warmup": m.warmup,
                },
            }
        )
    doc: dict[str, Any] = {"leader_election": {"enabled": False}, "pools": pools}
    if keys is not None:
        doc["node_state_keys"] = str(keys)
    return Settings.model_validate(doc)


def node_keys(home: Path) -> Path:
    """A node-state key of the demo's own, made at random in ``home`` (the demo's scratch
    directory), as the chart makes one per release (docs/design/node-state-integrity.md)."""
    directory = home / "node-state-keys"
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / "current").write_text(secrets.token_urlsafe(48), encoding="utf-8")
    return directory


# ---------------------------------------------------------------------------------------------
# Command line


def parse(argv: Sequence[str]) -> Options:
    p = parser()
    return _options(p, p.parse_args(list(argv)))


def parser() -> argparse.ArgumentParser:
    """The demo's flags (``rebalancer completion`` reads them too)."""
    p = argparse.ArgumentParser(
        prog="rebalancer demo",
        description=(
            "Run the real controller (informer, actuator, reconciler, audit log) against the "
            "in-process Kubernetes API emulator while a trace is replayed at high speed."
        ),
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace CSV (bundled Azure)")
    p.add_argument(
        "--service", default="code", help="service the L20 pool serves, of a per-minute trace"
    )
    p.add_argument(
        "--t4-service", default="conv", help="service the T4 pool serves, of a per-minute trace"
    )
    p.add_argument(
        "--hours", type=float, default=24.0, metavar="DURATION", help="trace time to replay (24h)"
    )
    p.add_argument(
        "--start",
        type=float,
        default=0.0,
        metavar="DURATION",
        help="how far into the trace to begin (0)",
    )
    p.add_argument(
        "--speed",
        type=int,
        default=DEFAULT_SPEED,
        metavar="DURATION",
        help=f"trace time per reconcile tick ({DEFAULT_SPEED}m: a day in about a minute)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=None,
        metavar="DURATION",
        help=f"wall time per trace day at most (0: as fast as it runs; {DEFAULT_PACE:g}s with -v)",
    )
    p.add_argument("--report", type=Path, default=None, help="write DIR/demo.json and DIR/day.svg")
    p.add_argument(
        "--strategy",
        default=registry.DEFAULT,
        choices=registry.names(),
        help=f"strategy ({registry.DEFAULT})",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="print every decision as it is made"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="serve the emulated cluster to kubectl from the start until Ctrl-C after the end",
    )
    return p


def _options(p: argparse.ArgumentParser, a: argparse.Namespace) -> Options:
    """The options parsed; without ``--pace``, flat out unless ``-v`` asks to watch."""
    if a.pace is None:
        a.pace = DEFAULT_PACE if a.verbose else 0.0
    if a.hours <= 0 or a.start < 0 or a.speed < 1 or a.pace < 0:
        p.error("--hours must be > 0, --start >= 0, --speed >= 1 and --pace >= 0")
    return Options(
        trace=a.trace,
        service=a.service or None,
        t4_service=a.t4_service or None,
        hours=a.hours,
        start=a.start,
        speed=a.speed,
        pace=a.pace,
        report=a.report,
        strategy=a.strategy,
        verbose=a.verbose,
        keep=a.keep,
    )


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    try:
        summary = asyncio.run(run(opts, sys.stdout))
    except (TraceError, DemoError) as exc:
        print(f"rebalancer demo: {exc}", file=sys.stderr)
        return 2
    return summary.exit_code


# ---------------------------------------------------------------------------------------------
# The world


def _load(path: Path, service: str | None) -> traces.Trace:
    with contextlib.suppress(OSError), path.open() as handle:
        if handle.readline().startswith("time,"):
            service = None  # a time,rps trace has one series: both pools replay it
    return traces.load(path, service)


def scheduling(store: Store, name: str) -> dict[str, str]:
    """What a restore must give back byte for byte: labels and taints, as JSON text."""
    obj = store.get(NODES, None, name)
    return {
        "labels": json.dumps(obj["metadata"].get("labels")),
        "taints": json.dumps(obj["spec"].get("taints")),
    }


def _gpus(obj: Obj) -> float:
    total = 0.0
    for c in obj["spec"].get("containers", []):
        total += float(((c.get("resources") or {}).get("requests") or {}).get(cluster.GPU, 0))
    return total


@dataclass
class Tally:
    """What the demo counts minute by minute and step by step, for one pool."""

    timeline: list[engine.Minute] = field(default_factory=list)
    lent_since: dict[str, datetime] = field(default_factory=dict)
    loan_minutes: list[float] = field(default_factory=list)
    lent_gpu_minutes: float = 0.0  # GPUs of the nodes lent
    borrowed_gpu_minutes: float = 0.0  # GPUs training pods actually ran on lent nodes
    loans: int = 0
    reclaims: int = 0  # taken back by the controller during the replay
    operator_reclaims: int = 0  # taken back at the end
    no_taker: int = 0  # refusals for want of a taker (one per tick it happened)
    no_taker_nodes: int = 0  # nodes the strategy wanted to lend in them
    no_taker_hopper: int = 0  # of the refusals, those naming a job that waits for Hopper
    last_no_taker: str = ""  # the last refusal -v printed, in brief
    refused: dict[str, refusals.Refusals] = field(default_factory=dict)  # by reason
    reclaimed: dict[int, int] = field(default_factory=dict)  # minute of the replay: nodes

    @property
    def reclaim_series(self) -> list[int]:
        """Nodes the controller took back, per replayed minute."""
        return [self.reclaimed.get(i, 0) for i in range(self.minutes)]

    @property
    def minutes(self) -> int:
        return len(self.timeline)

    @property
    def max_lent(self) -> int:
        return max((m.lent for m in self.timeline), default=0)


@dataclass
class Lender:
    """One inference pool the controller lends from: its nodes, its trace, its score."""

    pool: cluster.Pool
    model: engine.PoolModel
    trace: traces.Trace
    rps_per_node: float
    replay: Replay
    nodes: list[str]
    tally: Tally = field(default_factory=Tally)


@dataclass
class World:
    """The emulated cluster and the traces, before the controller runs."""

    first: int  # the trace minute the replay begins at
    steps: int  # trace minutes to replay
    clock: ManualClock
    store: Store
    training: training.Training
    names: list[str]  # every node
    lenders: dict[str, Lender]
    at_start: dict[str, dict[str, str]]
    refused: int = 0  # steps the actuator could not carry out

    def lender_of(self, node: str) -> Lender | None:
        return next((x for x in self.lenders.values() if node in x.nodes), None)


def build(opts: Options) -> World:
    first = round(opts.start * 60)
    services = {cluster.L20.name: opts.service, cluster.T4.name: opts.t4_service}
    loaded = {pool.name: _load(opts.trace, services[pool.name]) for pool in LENDERS}
    # Each pool replays its service from that series' own first minute (in the bundled trace
    # ``conv`` begins two days after ``code``), both on the L20 pool's calendar.
    start = loaded[cluster.L20.name].start
    loaded = {name: dataclasses.replace(t, start=start) for name, t in loaded.items()}
    steps = min(round(opts.hours * 60), *(t.minutes - first for t in loaded.values()))
    if steps <= 0:
        raise DemoError(f"--start {opts.start} h is past the trace's end")
    for trace in loaded.values():
        if trace.peak <= 0:
            raise DemoError(f"trace {trace.name} has no demand above zero")
    clock = ManualClock(start + timedelta(minutes=first))
    store = Store(clock, seed=1)
    cluster.seed(store, CLUSTER)
    names = sorted(n["metadata"]["name"] for n in store.peek(NODES))
    lenders = {}
    for pool in LENDERS:
        trace, m = loaded[pool.name], pool_model(pool)
        rps = m.calibrate(trace)
        nodes = [n for n in names if n.startswith(pool.name + "-")]
        lenders[pool.name] = Lender(pool, m, trace, rps, Replay(trace, clock, rps), nodes)
        busy = [n for n in BUSY if n in nodes]
        for i, name in enumerate(busy):
            replica = cluster.inference_pod(
                i, deployment=SERVING[pool.name], node_name=name, pool=pool.name
            )
            cluster.add(store, replica)
    jobs = training.Training(store, CLUSTER, lenders=[p.name for p in LENDERS])
    jobs.step()
    return World(
        first=first,
        steps=steps,
        clock=clock,
        store=store,
        training=jobs,
        names=names,
        lenders=lenders,
        at_start={name: scheduling(store, name) for name in names},
    )


# ---------------------------------------------------------------------------------------------
# Scoring: every replayed minute, as the simulator scores its own


def score_minute(w: World, marks: model.PodMarks, now: datetime) -> None:
    """The minute that begins at ``now``, for each pool: warm capacity by the planner's own
    rule (``core.warmth.is_warm``, with a returned node's cold start), what is lent, what
    training ran on it, and the demand that arrived."""
    pods: dict[str, list[model.PodView]] = {}
    borrowed: dict[str, float] = {}
    for pod in w.store.peek(PODS):
        node = pod["spec"].get("nodeName")
        if node and not convert.finished(pod):
            pods.setdefault(node, []).append(convert.pod_view(pod, marks))
            if (pod.get("status") or {}).get("phase") == "Running":
                borrowed[node] = borrowed.get(node, 0.0) + _gpus(pod)
    raw = {n["metadata"]["name"]: n for n in w.store.peek(NODES)}
    for x in w.lenders.values():
        tally = x.tally
        serving = lent = returning = 0
        for name in x.nodes:
            view = convert.node_view(raw[name], pods.get(name, ()))
            state = nodestate.read(view, nodestate.Keys())
            assert isinstance(state, nodestate.NodeState), state
            if state.phase in (nodestate.Phase.LENDING, nodestate.Phase.LENT):
                lent += 1
                tally.lent_since.setdefault(name, now)
                tally.lent_gpu_minutes += x.pool.gpus
                tally.borrowed_gpu_minutes += borrowed.get(name, 0.0)
                continue
            if name in tally.lent_since:
                since = tally.lent_since.pop(name)
                tally.loan_minutes.append((now - since) / timedelta(minutes=1))
            if warmth.is_warm(view, state, now, x.model.warmup):
                serving += 1
            else:
                returning += 1
        minute = x.replay.minute(now)
        demand = x.replay.demand_at(minute)
        need = None if demand is None else x.model.need(demand, x.rps_per_node)
        tally.timeline.append(
            engine.Minute(now, demand, need, serving, lent, returning, x.replay.queue)
        )
        x.replay.record(serving)


def figures(x: Lender) -> engine.Figures:
    t = x.tally
    return engine.score(
        t.timeline,
        [m.need for m in t.timeline],
        x.model,
        x.rps_per_node,
        t.loan_minutes,
        t.loans,
        t.reclaims + t.operator_reclaims,
    )


# ---------------------------------------------------------------------------------------------
# The run


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M")


def _row(when: datetime, pool: str, node: str, action: str, reason: str) -> str:
    """A decision as ``-v`` prints it: trace time (UTC, month-day hour:minute), pool, node,
    action, then the reason, in columns narrow enough to leave the reason most of a line."""
    return f"{when.astimezone(UTC):%m-%d %H:%M} {pool:<5} {node:<7} {action:<13} {reason}"


@dataclass(frozen=True)
class Noticed:
    """The simulator's model of the demo's day (``notice_model``), per pool: a run with the
    pool's reclaim notice and one without, each lending to the simulator's queue of the jobs
    that can use the pool's GPU."""

    notice: timedelta
    training: dict[str, jobs.TrainingModel]
    runs: dict[str, tuple[engine.Run, engine.Run]]  # (with, without)


def notice_model(w: World, strategy: str, notice: timedelta) -> Noticed:
    """The demo's day, pools and strategy replayed by the simulator with ``notice`` and
    without: what the notice saves training and costs inference, for four simulated days that
    take the simulator a few seconds. The simulator's jobs answer a notice as ``jobs`` says (a share
    never does); the demo's own jobs are in the cluster, and what the controller did to them
    is the summary's other lines."""
    queues, runs = {}, {}
    for name, x in w.lenders.items():
        day = dataclasses.replace(
            x.trace,
            start=x.trace.start + timedelta(minutes=w.first),
            rps=x.trace.rps[w.first : w.first + w.steps],
        )
        kind = next(k for k in training.KINDS if k.fits(x.pool))
        queue = jobs.TrainingModel(
            backlog=kind.backlog, gpus_per_node=kind.gpus, sizes=kind.sizes, hours=kind.hours
        )
        pair = tuple(
            engine.run(
                day,
                registry.build(strategy),
                dataclasses.replace(x.model, rps_per_node=x.rps_per_node, notice=given),
                training=queue,
            )
            for given in (notice, timedelta(0))
        )
        queues[name], runs[name] = queue, (pair[0], pair[1])
    return Noticed(notice, queues, runs)


@dataclass(frozen=True)
class Summary:
    """What the day showed. The lending figures add both pools up; ``pools`` has each one."""

    exit_code: int
    restored: bool
    lenders: dict[str, Lender]
    figures: dict[str, engine.Figures]
    training: training.Record
    replay_end: datetime  # preemptions from here on are the operator's take-back's
    audit_rows: int
    refused: int
    wall_seconds: float
    ticks: int
    at_end: dict[str, dict[str, str]]  # each node's labels and taints at the end, as JSON text
    notice: Noticed | None = None

    @property
    def lent_gpu_hours(self) -> float:
        return sum(x.tally.lent_gpu_minutes for x in self.lenders.values()) / 60.0

    @property
    def used_gpu_hours(self) -> float:
        return sum(x.tally.borrowed_gpu_minutes for x in self.lenders.values()) / 60.0

    @property
    def used_share(self) -> float:
        """GPU-hours training used on lent nodes over GPU-hours lent (1 when nothing was)."""
        lent = self.lent_gpu_hours
        return self.used_gpu_hours / lent if lent > 0 else 1.0

    @property
    def no_taker(self) -> int:
        return sum(x.tally.no_taker for x in self.lenders.values())

    @property
    def loans(self) -> int:
        return sum(x.tally.loans for x in self.lenders.values())

    @property
    def reclaims(self) -> int:
        return sum(x.tally.reclaims for x in self.lenders.values())

    @property
    def operator_reclaims(self) -> int:
        return sum(x.tally.operator_reclaims for x in self.lenders.values())

    @property
    def breach_minutes(self) -> int:
        return sum(f.breach_minutes for f in self.figures.values())

    @property
    def minutes(self) -> int:
        return max(x.tally.minutes for x in self.lenders.values())


async def run(opts: Options, out: TextIO) -> Summary:
    """The whole demo; prints to ``out``; writes ``DIR/demo.json`` and ``DIR/day.svg`` with
    ``--report DIR``. Quiet unless ``--verbose``: the pools, a line every quarter of the
    replay, the summary. With ``--keep`` the cluster is served to kubectl until Ctrl-C."""
    began = time.monotonic()
    w = build(opts)

    def say(line: str) -> None:
        if opts.verbose:
            print(line, file=out, flush=True)

    print("\n".join(_header(opts, w)), file=out, flush=True)
    say(f"{'UTC':<11} {'pool':<5} {'node':<7} {'action':<13} reason")
    with tempfile.TemporaryDirectory(prefix="rebalancer-demo-") as tmp:
        async with serve(w.store) as url:
            if opts.keep:
                kubeconfig = write_kubeconfig(url, Path(tmp) / "kubeconfig")
                print("\n".join(_kubectl_hints(url, kubeconfig, w.names[0])), file=out, flush=True)
            ticks, replay_end, records = await _audited(opts, w, url, Path(tmp), say, out)
            summary = _summarize(opts, w, records, replay_end, ticks, began)
            _print_summary(summary, w.at_start, summary.at_end, out)
            if opts.report is not None:
                _write_report(opts, w, summary, summary.at_end, records)
                print(f"report: {opts.report / 'demo.json'}, {opts.report / 'day.svg'}", file=out)
            if opts.keep:
                print(f"kubectl: serving {url} until Ctrl-C", file=out, flush=True)
                await _until_interrupted()
    return summary


def _header(opts: Options, w: World) -> list[str]:
    """What is replayed, on which pools, at what pace, and what ``-v`` and ``--keep`` add."""
    pace = f"a trace day per {opts.pace:g} s at most" if opts.pace else "as fast as it runs"
    lines = [
        f"demo: {w.steps / 60:g} h from {_stamp(w.clock())} UTC, strategy {opts.strategy}, {pace}"
    ]
    for x in w.lenders.values():
        busy = [n for n in BUSY if n in x.nodes]
        lines.append(
            f"  {x.pool.name:<4} {len(x.nodes)} {x.pool.product} nodes serving {x.trace.name} "
            f"at {x.rps_per_node:.2f} rps a node; {', '.join(busy)} "
            f"run{'s' if len(busy) == 1 else ''} inference"
        )
    if not opts.verbose:
        lines.append("  (-v prints every decision; --keep serves the cluster to kubectl)")
    return lines


async def _until_interrupted() -> None:
    """Wait until Ctrl-C (the task cancelled), then return: the summary is the demo's answer."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


async def _audited(
    opts: Options, w: World, url: str, tmp: Path, say: Callable[[str], None], out: TextIO
) -> tuple[int, datetime, list[AuditRecord]]:
    """The replay with its audit store (SQLite in ``tmp``): ticks, end and every record."""
    audit_store = await SqlAuditStore.open(
        f"sqlite+aiosqlite:///{tmp / 'audit.sqlite3'}", now=w.clock
    )
    try:
        ticks, replay_end = await _drive(opts, w, audit_store, say, url, tmp, out)
        return ticks, replay_end, list(await every_record(audit_store))
    finally:
        await audit_store.close()


def _summarize(
    opts: Options,
    w: World,
    records: Sequence[AuditRecord],
    replay_end: datetime,
    ticks: int,
    began: float,
) -> Summary:
    """The day's figures, and whether every node is back as it was (the exit code)."""
    at_end = {name: scheduling(w.store, name) for name in w.names}
    restored = at_end == w.at_start
    record = w.training.record
    sound = restored and not record.broken and not record.misplaced
    return Summary(
        exit_code=0 if sound else 1,
        restored=restored,
        lenders=w.lenders,
        figures={name: figures(x) for name, x in w.lenders.items()},
        training=record,
        replay_end=replay_end,
        audit_rows=len(records),
        refused=w.refused,
        wall_seconds=time.monotonic() - began,
        ticks=ticks,
        at_end=at_end,
        notice=notice_model(w, opts.strategy, _notice(opts.strategy, w)),
    )


async def _drive(
    opts: Options,
    w: World,
    audit_store: SqlAuditStore,
    say: Callable[[str], None],
    url: str,
    home: Path,
    out: TextIO,
) -> tuple[int, datetime]:
    """Open the controller on the emulator served at ``url``, tick it through the replay; the
    ticks and the time the replay ended. ``home`` holds the node-state key."""
    ticks = 0
    loop = asyncio.get_running_loop()
    pace = opts.pace / (24 * 60)  # wall seconds per trace minute
    due = loop.time()
    every = _progress_every(w.steps)
    async with kubeclient.opened(client.Configuration(host=url)) as api:
        seams = Seams(
            api=api,
            clock=w.clock,
            metrics=PoolMetricsRouter({PoolName(n): x.replay for n, x in w.lenders.items()}),
            audit_store=audit_store,
            new_id=UlidFactory(w.clock),
            sink=None,
            name="rebalancer-demo",
            serve_http=False,
        )
        rps = {name: x.rps_per_node for name, x in w.lenders.items()}
        config = settings(opts.strategy, rps, node_keys(home))
        async with Controller.open(config, seams) as c:
            marks = c.pools[0].marks
            task = asyncio.create_task(c.informer.run())
            try:
                await asyncio.wait_for(c.informer.synced.wait(), 10)
                for step in range(w.steps):
                    if step % opts.speed == 0:
                        await _caught_up(c, w.store)
                        report = await c.tick()
                        ticks += 1
                        _print_tick(report, w, say)
                    score_minute(w, marks, w.clock())
                    if not opts.verbose and (step + 1) % every == 0 and step + 1 < w.steps:
                        print(_progress(w), file=out, flush=True)
                    w.clock.advance(60)
                    w.training.step()
                    due += pace
                    if pace > 0 and due > loop.time():
                        await asyncio.sleep(due - loop.time())
                replay_end = w.clock()
                await _caught_up(c, w.store)
                await _take_back(c, w, say)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    return ticks, replay_end


def _progress_every(steps: int) -> int:
    """Replayed minutes between two progress lines: a quarter of the replay, in whole hours
    (six hours of a day), and at least an hour."""
    return max(60, steps // 4 // 60 * 60)


def _progress(w: World) -> str:
    """Where the replay is: each pool's nodes lent now; loans, reclaims, breach minutes so far."""
    pools = ", ".join(
        f"{name} {x.tally.timeline[-1].lent} of {len(x.nodes)}" for name, x in w.lenders.items()
    )
    loans = sum(x.tally.loans for x in w.lenders.values())
    taken = sum(x.tally.reclaims for x in w.lenders.values())
    breach = sum(
        engine.breached(m, x.rps_per_node) for x in w.lenders.values() for m in x.tally.timeline
    )
    when = _stamp(w.clock() + timedelta(minutes=1))
    return (
        f"  {when}  lent now: {pools}; so far {loans} loans, {taken} reclaims, "
        f"{breach} breach minutes"
    )


def _kubectl_hints(url: str, kubeconfig: Path, node: str) -> list[str]:
    """How to watch the emulated cluster with kubectl (``--keep``, docs/demo.md)."""
    kubectl = f"kubectl --kubeconfig {kubeconfig}"
    return [
        f"kubectl: the cluster is served at {url}, and kept after the end until Ctrl-C:",
        f"  {kubectl} get nodes -L {nodestate.Keys().state} -w",
        f"  {kubectl} describe node {node}",
        f"  {kubectl} get events -A",
    ]


async def _caught_up(c: Controller, store: Store, within: float = 10.0) -> None:
    """Until the informer's cache holds what the store holds (every pool's nodes and the pods
    waiting for one), so every tick sees the minute it is in (woken by the informer's changes,
    checked every few milliseconds)."""
    async with asyncio.timeout(within):
        while not _same(c, store):
            c.informer.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.informer.changed.wait(), 0.005)


def _same(c: Controller, store: Store) -> bool:
    for pool in c.pools:
        if c.informer.node_views(pool.marks) != expected_views(store, pool.marks):
            return False
    waiting = {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in store.peek(PODS)
        if not p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Pending"
    }
    seen = {(p.namespace, p.name) for p in c.informer.pending(c.pools[0].marks)}
    return seen == waiting


def _print_tick(report: TickReport, w: World, say: Callable[[str], None]) -> None:
    when = report.now
    for r in report.plan.rejections:
        if r.reason is not model.Reason.NO_TAKER:
            continue
        t = w.lenders[str(r.intent.pool)].tally
        t.no_taker += 1
        t.no_taker_nodes += r.count
        t.no_taker_hopper += "hopper" in r.message
        refusals.add(t.refused, r.message, r.count)
        line = f"{r.count} node{'s' if r.count != 1 else ''}: {refusals.brief(r.message)}"
        if line != t.last_no_taker:  # printed when it says something new, counted every time
            t.last_no_taker = line
            say(refusals.fit(_row(when, str(r.intent.pool), "-", "no taker", line)))
    for a in report.applied:
        x = w.lender_of(a.node)
        pool = x.pool.name if x is not None else "?"
        intent = a.intent
        outcome = a.result.outcome if a.result is not None else None
        if a.call is model.Action.PROGRESS:
            if outcome is not Outcome.APPLIED:
                continue
            back = intent is None or intent.action is model.Action.RECLAIM
            message = a.result.message if a.result is not None else ""
            say(_row(when, pool, a.node, "restored" if back else "lent", message))
            continue
        reason = intent.message if intent is not None else ""
        code = intent.reason if intent is not None else ""
        if outcome not in (Outcome.APPLIED, Outcome.IN_PROGRESS):
            w.refused += 1
            say(_row(when, pool, a.node, f"{a.call} {outcome}", reason))
            continue
        if x is not None and a.call is model.Action.LEND:
            x.tally.loans += 1
        elif x is not None and a.call is model.Action.RECLAIM:
            x.tally.reclaims += 1
            minute = x.tally.minutes  # the minute this tick begins, scored after it
            x.tally.reclaimed[minute] = x.tally.reclaimed.get(minute, 0) + 1
        say(_row(when, pool, a.node, a.call, f"[{code}] {reason}"))


async def _take_back(c: Controller, w: World, say: Callable[[str], None]) -> None:
    """Every loan back as ``rebalancer reclaim --all`` takes it: one audited wave; the clock
    moves a poll at a time while the drains run, and the training jobs react as they do."""
    say(_row(w.clock(), "-", "(all)", "reclaim all", "end of replay: the operator's wave"))

    async def wait(seconds: float) -> None:
        w.clock.advance(seconds)
        w.training.step()
        await _caught_up(c, w.store)

    known = await reclaim.lent_nodes(c)
    done = await reclaim.reclaim_wave(c, list(known), known=known, poll=10.0, sleep=wait)
    for d in done:
        if not d.ok:
            raise DemoError(f"{d.node} was not taken back: {d.message}")
        x = w.lender_of(d.node)
        if x is not None:
            x.tally.operator_reclaims += 1
        pool = x.pool.name if x is not None else "?"
        say(_row(w.clock(), pool, d.node, "restored", d.message))
    w.training.check(w.clock())


def _notice(strategy: str, w: World) -> timedelta:
    """The reclaim notice the demo's settings give its pools (the controller's default)."""
    config = settings(strategy, {name: x.rps_per_node for name, x in w.lenders.items()})
    given = {p.limits.reclaim_notice for p in config.pools}
    assert len(given) == 1, "the demo's pools share their limits"
    return given.pop()


def _notice_lines(n: Noticed) -> list[str]:
    """The summary's lines on the notice: each pool with it and without, in the simulator."""
    some = next(iter(n.training.values()))
    given = f"{n.notice.total_seconds() / 60:g} min"
    lines = [
        f"  reclaim notice      the simulator on the same day, pools and strategy; its jobs save "
        f"{some.save.total_seconds() / 60:g} min when told, {some.silent:.0%} never answer"
    ]
    for name, (told, plain) in n.runs.items():
        for label, run in ((f"with {given}", told), ("without", plain)):
            t, f = run.training, run.figures
            assert t is not None
            lines.append(
                f"    {name:<4} {label:<10} {t.lost_gpu_hours:5.1f} GPU-h lost "
                f"({t.lost_answering_gpu_hours:.1f} by jobs that answer), "
                f"goodput {t.goodput:.1%}, harvest {f.harvest_ratio:.3f}, "
                f"{f.breach_minutes} breach min, {f.reclaims} reclaims"
            )
    return lines


def _notice_report(n: Noticed) -> dict[str, Any]:
    def figures(run: engine.Run) -> dict[str, Any]:
        t, f = run.training, run.figures
        assert t is not None
        return {
            "lost_gpu_hours": t.lost_gpu_hours,
            "lost_answering_gpu_hours": t.lost_answering_gpu_hours,
            "lost_silent_gpu_hours": t.lost_silent_gpu_hours,
            "held_gpu_hours": t.held_gpu_hours,
            "kept_gpu_hours": t.kept_gpu_hours,
            "goodput": t.goodput,
            "lent_gpu_hours": t.lent_gpu_hours,
            "harvest_ratio": f.harvest_ratio,
            "breach_minutes": f.breach_minutes,
            "reclaims": f.reclaims,
            "notices": f.notices,
            "withdrawals": f.withdrawals,
        }

    some = next(iter(n.training.values()))
    return {
        "modelled": "simulator",
        "seconds": n.notice.total_seconds(),
        "save_seconds": some.save.total_seconds(),
        "silent": some.silent,
        "pools": {
            name: {"with": figures(told), "without": figures(plain)}
            for name, (told, plain) in n.runs.items()
        },
    }


def _print_summary(
    s: Summary, at_start: dict[str, dict[str, str]], at_end: dict[str, dict[str, str]], out: TextIO
) -> None:
    r = s.training
    changed = sorted(n for n in at_start if at_start[n] != at_end.get(n))
    at_end_preempted = sum(1 for p in r.preemptions if p.time > s.replay_end)
    lines = [
        "",
        "summary",
        f"  replayed            {s.minutes / 60:g} h of trace in {s.ticks} reconcile ticks, "
        f"{s.wall_seconds:.1f} s wall",
        f"  GPU-hours lent      {s.lent_gpu_hours:.1f}",
        *(
            f"    {name:<16}  {x.tally.lent_gpu_minutes / 60:.1f} ({f.lent_node_hours:.2f} "
            f"node-hours x {x.pool.gpus} GPUs; at most {x.tally.max_lent} nodes at once; "
            f"{f.harvest_ratio:.3f} of the oracle's)"
            for (name, x), f in zip(s.lenders.items(), s.figures.values(), strict=True)
        ),
        f"  GPU-hours used      {s.used_gpu_hours:.1f} by training on lent nodes: "
        f"{s.used_share:.1%} of what was lent",
        f"  refused, no taker   {s.no_taker} lends refused for want of a taker (one per pool "
        f"per tick); {sum(x.tally.no_taker_hopper for x in s.lenders.values())} while a "
        "Hopper job waited",
        *refusals.lines({name: x.tally.refused for name, x in s.lenders.items()}),
        f"  jobs preempted      {r.jobs_preempted} ({len(r.preemptions)} preemptions, "
        f"{at_end_preempted} by the take-back at the end)",
        f"  GPU-hours lost      {r.lost_gpu_hours:.1f} of training at reclaims (work since "
        f"each job's last checkpoint, every {training.CHECKPOINT.seconds // 60} min)",
        f"  gangs half-running  {r.gangs_broken} ({len(r.broken)} sightings in "
        f"{r.checks} checks, one a minute)",
        f"  jobs on a wrong GPU {len({m.pod for m in r.misplaced})} pods "
        f"({len(r.misplaced)} sightings in {r.checks} checks)",
        "  training jobs       "
        + ", ".join(
            f"{kind}: {r.submitted.get(kind, 0)} submitted, {r.completed.get(kind, 0)} done"
            for kind in (k.name for k in training.KINDS)
        ),
        f"  loans, reclaims     {s.loans} loans, {s.reclaims + s.operator_reclaims} reclaims "
        f"({s.reclaims} by the controller, {s.operator_reclaims} by the operator at the end)",
        "  breach minutes      "
        + "; ".join(
            f"{name} {f.breach_minutes} of {x.tally.minutes}" + _first_breaches(x)
            for (name, x), f in zip(s.lenders.items(), s.figures.values(), strict=True)
        ),
        f"  audit rows          {s.audit_rows}",
        f"  nodes restored      {'yes' if s.restored else 'NO'}: "
        + (
            f"all {len(at_start)} nodes' taints and labels are byte for byte as at the start"
            if s.restored
            else f"changed: {', '.join(changed)}"
        ),
    ]
    if s.notice is not None:
        lines += _notice_lines(s.notice)
    if s.refused:
        lines.append(f"  steps not done      {s.refused}")
    print("\n".join(lines), file=out, flush=True)


def _first_breaches(x: Lender) -> str:
    breaches = [m.time for m in x.tally.timeline if engine.breached(m, x.rps_per_node)]
    if not breaches:
        return ""
    return f" (from {', '.join(f'{b.astimezone(UTC):%H:%M}' for b in breaches[:3])})"


def _write_report(
    opts: Options,
    w: World,
    s: Summary,
    at_end: dict[str, dict[str, str]],
    records: Sequence[AuditRecord],
) -> None:
    assert opts.report is not None
    r = s.training
    doc = {
        "options": _options_report(opts),
        "rps_per_node": {name: x.rps_per_node for name, x in w.lenders.items()},
        "summary": {
            "minutes": s.minutes,
            "ticks": s.ticks,
            "lent_gpu_hours": round(s.lent_gpu_hours, 4),
            "used_gpu_hours": round(s.used_gpu_hours, 4),
            "used_share": round(s.used_share, 4),
            "no_taker_refusals": s.no_taker,
            "jobs_preempted": r.jobs_preempted,
            "preemptions": len(r.preemptions),
            "preemptions_at_take_back": sum(1 for p in r.preemptions if p.time > s.replay_end),
            "lost_gpu_hours": round(r.lost_gpu_hours, 4),
            "gangs_half_running": r.gangs_broken,
            "half_running_sightings": [
                {
                    "time": nodestate.format_time(b.time),
                    "job": b.job,
                    "running": b.running,
                    "size": b.size,
                }
                for b in r.broken
            ],
            "pods_on_wrong_gpu": len({m.pod for m in r.misplaced}),
            "checks": r.checks,
            "jobs_submitted": r.submitted,
            "jobs_completed": r.completed,
            "loans": s.loans,
            "reclaims": s.reclaims,
            "operator_reclaims": s.operator_reclaims,
            "breach_minutes": s.breach_minutes,
            "audit_rows": s.audit_rows,
            "restored": s.restored,
            "wall_seconds": round(s.wall_seconds, 2),
            "pools": {name: _pool_report(x, s.figures[name]) for name, x in s.lenders.items()},
            "notice": None if s.notice is None else _notice_report(s.notice),
        },
        "series": {name: _series(x) for name, x in w.lenders.items()},
        "nodes": _nodes_report(w.at_start, at_end),
        "audit": [json.loads(json_line(r)) for r in records],
    }
    opts.report.mkdir(parents=True, exist_ok=True)
    (opts.report / "demo.json").write_text(json.dumps(doc, indent=1) + "\n")
    (opts.report / "day.svg").write_text(_picture(w, opts.strategy), encoding="utf-8")


def _options_report(opts: Options) -> dict[str, Any]:
    return {
        "trace": str(opts.trace),
        "service": opts.service,
        "t4_service": opts.t4_service,
        "hours": opts.hours,
        "start_hours": opts.start,
        "speed": opts.speed,
        "pace": opts.pace,
        "strategy": opts.strategy,
    }


def _nodes_report(
    at_start: dict[str, dict[str, str]], at_end: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """Each node's labels and taints at the start and the end, and whether they are the same."""
    return {
        name: {
            "start": {k: json.loads(v) for k, v in at_start[name].items()},
            "end": {k: json.loads(v) for k, v in at_end[name].items()},
            "same": at_start[name] == at_end[name],
        }
        for name in sorted(at_start)
    }


def _series(x: Lender) -> dict[str, Any]:
    """One pool's day, a value per replayed minute from ``start``: what the picture draws."""
    t = x.tally
    return {
        "start": nodestate.format_time(t.timeline[0].time) if t.timeline else None,
        "step_seconds": 60,
        "nodes": len(x.nodes),
        "rps_per_node": x.rps_per_node,
        "demand_rps": [m.demand_rps for m in t.timeline],
        "serving": [m.serving for m in t.timeline],
        "lent": [m.lent for m in t.timeline],
        "reclaims": t.reclaim_series,
    }


def _picture(w: World, strategy: str) -> str:
    """The day as an SVG (``sandbox.picture``): a panel per pool."""
    panels = [
        picture.Panel(
            pool=name,
            title=f"{name}: {len(x.nodes)} {x.pool.product} nodes serving {x.trace.name}",
            size=len(x.nodes),
            start=x.tally.timeline[0].time if x.tally.timeline else w.clock(),
            demand=[
                None if m.demand_rps is None else m.demand_rps / x.rps_per_node
                for m in x.tally.timeline
            ],
            serving=[m.serving for m in x.tally.timeline],
            lent=[m.lent for m in x.tally.timeline],
            reclaims=x.tally.reclaim_series,
        )
        for name, x in w.lenders.items()
    ]
    first = min(p.start for p in panels)
    return picture.svg(panels, f"rebalancer demo, {first:%Y-%m-%d} UTC, strategy {strategy}")


def _pool_report(x: Lender, f: engine.Figures) -> dict[str, Any]:
    t = x.tally
    return {
        "trace_name": x.trace.name,
        "nodes": len(x.nodes),
        "gpus_per_node": x.pool.gpus,
        "lent_node_hours": round(f.lent_node_hours, 4),
        "lent_gpu_hours": round(t.lent_gpu_minutes / 60.0, 4),
        "used_gpu_hours": round(t.borrowed_gpu_minutes / 60.0, 4),
        "harvest_ratio": f.harvest_ratio,
        "no_taker_refusals": t.no_taker,
        "no_taker_nodes": t.no_taker_nodes,
        "no_taker_naming_hopper": t.no_taker_hopper,
        "loans": t.loans,
        "reclaims": t.reclaims,
        "operator_reclaims": t.operator_reclaims,
        "breach_minutes": f.breach_minutes,
        "breaches": [
            nodestate.format_time(m.time) for m in t.timeline if engine.breached(m, x.rps_per_node)
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
