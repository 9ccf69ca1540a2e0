"""``rebalancer demo``: the real controller against the API emulator, on a replayed trace.

In one process, with no network, cluster or Prometheus:

- the Kubernetes API emulator (``sandbox``) serves its default cluster over HTTP on 127.0.0.1
  (8 L20 inference nodes, 4 A100 training nodes) on a ``ManualClock`` set to the trace's start;
  inference replicas run on a few inference nodes (so those are never idle), and preemptible
  training jobs (tolerating the lend taint) wait, a few always pending, scheduled every minute;
- the real controller pieces talk to it over HTTP: the informer, the actuator through
  ``KubeWriter`` (behind the leader gate), the reconciler with the chosen strategy, and the audit
  log in SQLite in a temporary directory;
- ``sim.replay.Replay`` replays the trace behind the reconciler's metrics seam: the clock moves one
  trace minute per step, so cooldowns and deadlines follow the trace.

Each decision is printed as it happens. At the end every loan is taken back through the same
audited path (an operator ``reclaim: now`` on every lent node), and a summary says what was lent,
what was breached, and whether every node's taints and labels are back byte for byte.
See docs/demo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio import client

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, AuditQuery, SqlAuditStore, UlidFactory, json_line
from rebalancer.adapters.gate import LeaderGatedWriter
from rebalancer.adapters.informer import Informer, WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import model
from rebalancer.core.audit import AuditRecord
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import Outcome
from rebalancer.core.policy import PoolPolicy, default_lend_spec
from rebalancer.errors import TraceError
from rebalancer.runtime.reconcile import AlwaysLeader, PoolConfig, Reconciler, TickReport
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.server import serve
from sandbox.emulator.store import ListRequest, Store
from sandbox.emulator.watcher import Scope
from sandbox.sim import traces
from sandbox.sim.replay import Replay
from strategies import registry

Obj = dict[str, Any]

DEFAULT_TRACE = (
    Path(__file__).resolve().parent.parent
    / "examples"
    / "traces"
    / "azure_llm_2024_week_per_minute.csv"
)
DEFAULT_SPEED = 1  # trace minutes per reconcile tick: a day is 1440 ticks
DEFAULT_PACE = 60.0  # wall seconds per trace day: a day runs in about a minute
KEYS = Keys()
SPEC = default_lend_spec(KEYS)
RULES = model.PodRules(
    lend_taints=SPEC.add_taints,
    serving_taints=SPEC.remove_taints,
    inference_selector={"app": "llm-serving"},
)
POOL = model.PoolName("inference")
BUSY = ("inference-0", "inference-1")  # run inference replicas: never idle, never lent
PENDING = 3  # training pods kept waiting, so borrowed capacity is really used
PEAK_SHARE = 0.9  # rps per node is calibrated so the trace's peak needs 90 % of the pool
DRAIN = timedelta(minutes=2)
WARMUP = timedelta(minutes=5)
LENT_STATES = ("lending", "lent")
REPORT_KEYS = ("options", "rps_per_node", "summary", "nodes", "audit")


class DemoError(Exception):
    pass


@dataclass(frozen=True)
class Options:
    trace: Path
    service: str | None
    hours: float
    start: float
    speed: int
    pace: float
    report: Path | None
    strategy: str
    quiet: bool


@dataclass
class Tally:
    """What the demo counts minute by minute and step by step."""

    minutes: int = 0
    lent_node_minutes: int = 0
    borrowed_gpu_minutes: float = 0.0  # GPUs training pods actually ran on lent nodes
    breach_minutes: int = 0
    loans: int = 0
    reclaims: int = 0  # taken back by the controller during the replay
    operator_reclaims: int = 0  # taken back at the end
    refused: int = 0
    max_lent: int = 0
    first_lend: datetime | None = None
    first_reclaim: datetime | None = None
    warm_at: dict[str, datetime] = field(default_factory=dict)  # returned: serves from then
    away: set[str] = field(default_factory=set)  # nodes last seen not serving
    breaches: list[datetime] = field(default_factory=list)  # the breach minutes' starts


@dataclass(frozen=True)
class Summary:
    exit_code: int
    restored: bool
    tally: Tally
    audit_rows: int
    gpus_per_node: int
    wall_seconds: float
    ticks: int


# ---------------------------------------------------------------------------------------------
# Command line


def parse(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(
        prog="rebalancer demo",
        description=(
            "Run the real controller (informer, actuator, reconciler, audit log) against the "
            "in-process Kubernetes API emulator while a trace is replayed at high speed."
        ),
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace CSV (bundled Azure)")
    p.add_argument("--service", default="code", help="service of a per-minute trace (code)")
    p.add_argument("--hours", type=float, default=24.0, help="trace hours to replay (24)")
    p.add_argument("--start", type=float, default=0.0, help="hours into the trace to begin (0)")
    p.add_argument(
        "--speed",
        type=int,
        default=DEFAULT_SPEED,
        help=f"trace minutes per reconcile tick ({DEFAULT_SPEED}: a day in about a minute)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=DEFAULT_PACE,
        help=f"wall seconds per trace day at most ({DEFAULT_PACE:g}; 0: as fast as it runs)",
    )
    p.add_argument("--report", type=Path, default=None, help="write DIR/demo.json")
    p.add_argument(
        "--strategy",
        default=registry.DEFAULT,
        choices=registry.names(),
        help=f"strategy ({registry.DEFAULT})",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    a = p.parse_args(list(argv))
    if a.hours <= 0 or a.start < 0 or a.speed < 1 or a.pace < 0:
        p.error("--hours must be > 0, --start >= 0, --speed >= 1 and --pace >= 0")
    return Options(
        trace=a.trace,
        service=a.service or None,
        hours=a.hours,
        start=a.start,
        speed=a.speed,
        pace=a.pace,
        report=a.report,
        strategy=a.strategy,
        quiet=a.quiet,
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


def _load(opts: Options) -> traces.Trace:
    service = opts.service
    with contextlib.suppress(OSError), opts.trace.open() as handle:
        if handle.readline().startswith("time,"):
            service = None  # a time,rps trace has one series
    return traces.load(opts.trace, service)


def scheduling(store: Store, name: str) -> dict[str, str]:
    """What a restore must give back byte for byte: labels and taints, as JSON text."""
    obj = store.get(NODES, None, name)
    return {
        "labels": json.dumps(obj["metadata"].get("labels")),
        "taints": json.dumps(obj["spec"].get("taints")),
    }


def _nodes(store: Store) -> list[Obj]:
    return list(Store.list_page(store, ListRequest(Scope(NODES))).items)


def _pods(store: Store) -> list[Obj]:
    return list(Store.list_page(store, ListRequest(Scope(PODS))).items)


def expected_views(store: Store) -> tuple[model.NodeView, ...]:
    """The node views the informer must hold once it has caught up with the store."""
    on: dict[str, list[Obj]] = {}
    for pod in _pods(store):
        node = pod["spec"].get("nodeName")
        if node and not convert.finished(pod):
            on.setdefault(node, []).append(pod)
    views = []
    for node in _nodes(store):
        name = node["metadata"]["name"]
        pods = sorted(
            on.get(name, []), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])
        )
        views.append(convert.node_view(node, [convert.pod_view(p, RULES) for p in pods]))
    return tuple(sorted(views, key=lambda v: v.name))


def state_of(node: Obj) -> str:
    return str((node["metadata"].get("labels") or {}).get(KEYS.state, "serving"))


def _gpus(obj: Obj) -> float:
    total = 0.0
    for c in obj["spec"].get("containers", []):
        total += float(((c.get("resources") or {}).get("requests") or {}).get(cluster.GPU, 0))
    return total


class Training:
    """Preemptible training jobs: a few always pending, so lent nodes are really used."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs = 0

    def top_up(self) -> None:
        pending = sum(
            1
            for p in _pods(self.store)
            if p["metadata"].get("namespace") == cluster.TRAINING_NAMESPACE
            and not p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
        )
        for _ in range(PENDING - pending):
            cluster.add(
                self.store,
                cluster.training_pod(f"train-{self.jobs:04d}", 0, priority_class=None),
            )
            self.jobs += 1
        self.store.schedule()


class Synced:
    """Wait until the informer's cache is what the store holds (woken by informer changes)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __call__(self, *_: object) -> None:
        self.event.set()

    async def until(self, check: Callable[[], bool], within: float = 10.0) -> None:
        async with asyncio.timeout(within):
            while not check():
                self.event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.event.wait(), 0.05)


# ---------------------------------------------------------------------------------------------
# The run


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M")


@dataclass
class World:
    """The emulated cluster and everything the controller is built with, before it runs."""

    trace: traces.Trace
    steps: int  # trace minutes to replay
    rps_per_node: float
    clock: ManualClock
    store: Store
    training: Training
    names: list[str]  # every node
    inference: list[str]  # the inference pool's nodes
    at_start: dict[str, dict[str, str]]
    config: PoolConfig
    replay: Replay
    lead: AlwaysLeader


def build(opts: Options) -> World:
    trace = _load(opts)
    start = trace.start + timedelta(hours=opts.start)
    first = round(opts.start * 60)
    steps = min(round(opts.hours * 60), trace.minutes - first)
    if steps <= 0:
        raise DemoError(f"--start {opts.start} h is past the trace's end ({trace.minutes} min)")
    if trace.peak <= 0:
        raise DemoError(f"trace {trace.name} has no demand above zero")
    rps_per_node = trace.peak / (PEAK_SHARE * cluster.INFERENCE.size)
    clock = ManualClock(start)
    store = Store(clock, seed=1)
    cluster.seed(store)
    for i, name in enumerate(BUSY):
        cluster.add(store, cluster.inference_pod(i, node_name=name))
    training = Training(store)
    training.top_up()
    names = sorted(n["metadata"]["name"] for n in _nodes(store))
    policy = PoolPolicy(
        rps_per_node=rps_per_node,
        min_serving=2,
        headroom=0.2,
        reclaim_deadline=DRAIN,
        warmup=WARMUP,
        lend_spec=SPEC,
    )
    config = PoolConfig(
        name=POOL,
        node_selector={"gpu-pool": cluster.INFERENCE.name},
        policy=policy,
        rules=RULES,
        strategy=registry.build(opts.strategy),
        strategy_name=opts.strategy,
    )
    return World(
        trace=trace,
        steps=steps,
        rps_per_node=rps_per_node,
        clock=clock,
        store=store,
        training=training,
        names=names,
        inference=[n for n in names if n.startswith(cluster.INFERENCE.name + "-")],
        at_start={name: scheduling(store, name) for name in names},
        config=config,
        replay=Replay(trace, clock, rps_per_node),
        lead=AlwaysLeader(identity="rebalancer-demo", now=clock),
    )


async def run(opts: Options, out: TextIO) -> Summary:
    """The whole demo; prints to ``out``; writes ``DIR/demo.json`` with ``--report DIR``."""
    began = time.monotonic()
    w = build(opts)

    def say(line: str) -> None:
        if not opts.quiet:
            print(line, file=out, flush=True)

    say(
        f"demo: {w.trace.name}, {w.steps / 60:g} h from {_stamp(w.clock())} UTC, strategy "
        f"{opts.strategy}, {len(w.inference)} inference nodes ({', '.join(BUSY)} run "
        f"inference), {w.rps_per_node:.2f} rps per node"
    )
    say(f"{'time (UTC)':<20} {'pool':<10} {'node':<12} {'action':<14} reason")
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="rebalancer-demo-") as tmp:
        audit_store = await SqlAuditStore.open(
            f"sqlite+aiosqlite:///{Path(tmp) / 'audit.sqlite3'}", now=w.clock
        )
        try:
            ticks = await _drive(opts, w, audit_store, tally, say)
            records = await _all_records(audit_store)
        finally:
            await audit_store.close()
    at_end = {name: scheduling(w.store, name) for name in w.names}
    restored = at_end == w.at_start
    summary = Summary(
        exit_code=0 if restored else 1,
        restored=restored,
        tally=tally,
        audit_rows=len(records),
        gpus_per_node=cluster.INFERENCE.gpus,
        wall_seconds=time.monotonic() - began,
        ticks=ticks,
    )
    _print_summary(summary, w.at_start, at_end, out)
    if opts.report is not None:
        _write_report(opts, w, summary, at_end, records)
        print(f"report: {opts.report / 'demo.json'}", file=out, flush=True)
    return summary


async def _drive(
    opts: Options,
    w: World,
    audit_store: SqlAuditStore,
    tally: Tally,
    say: Callable[[str], None],
) -> int:
    """Serve the emulator, run the controller over HTTP through the replay; the ticks run."""
    ticks = 0
    loop = asyncio.get_running_loop()
    pace = opts.pace / (24 * 60)  # wall seconds per trace minute
    async with (
        serve(w.store) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        synced = Synced()
        informer = Informer(api, settings=WatchSettings(timeout_seconds=86_400), on_change=synced)
        kube = KubeWriter(client.CoreV1Api(api), RetryPolicy())
        writer = LeaderGatedWriter(kube, w.lead.may_write, w.clock, w.lead.identity)
        reconciler = Reconciler(
            [w.config],
            views=informer,
            metrics=w.replay,
            clock=w.clock,
            actuators={POOL: Actuator(writer, KEYS, SPEC, RULES, w.clock)},
            audit_log=AuditLog(audit_store, sink=None, new_id=UlidFactory(w.clock)),
            leadership=w.lead,
            keys=KEYS,
        )

        async def caught_up() -> None:
            await synced.until(lambda: informer.node_views(RULES) == expected_views(w.store))

        async def tick() -> TickReport:
            nonlocal ticks
            await caught_up()
            report = await reconciler.tick()
            ticks += 1
            _print_tick(report, tally, say)
            await caught_up()
            return report

        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            await reconciler.start()
            due = loop.time()
            for step in range(w.steps):
                if step % opts.speed == 0:
                    await tick()
                _score(w.store, w.inference, w.replay, tally, w.clock())
                w.clock.advance(60)
                w.training.top_up()
                due += pace
                if pace > 0 and due > loop.time():
                    await asyncio.sleep(due - loop.time())
            await _take_back(w, tick, tally, say)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return ticks


def _print_tick(report: TickReport, tally: Tally, say: Callable[[str], None]) -> None:
    when = _stamp(report.now)
    for a in report.applied:
        intent = a.intent
        outcome = a.result.outcome if a.result is not None else None
        if a.call == "progress":
            if outcome is not Outcome.APPLIED:
                continue
            action = "restored" if intent is None or intent.action == "reclaim" else "lent"
            message = a.result.message if a.result is not None else ""
            say(f"{when:<20} {POOL:<10} {a.node:<12} {action:<14} {message}")
            continue
        reason = intent.message if intent is not None else ""
        code = intent.reason if intent is not None else ""
        if outcome is not Outcome.APPLIED and outcome is not Outcome.IN_PROGRESS:
            tally.refused += 1
            say(f"{when:<20} {POOL:<10} {a.node:<12} {a.call + ' ' + str(outcome):<14} {reason}")
            continue
        if a.call == "lend":
            tally.loans += 1
            tally.first_lend = tally.first_lend or report.now
        elif intent is not None and intent.origin == "operator":
            tally.operator_reclaims += 1
        else:
            tally.reclaims += 1
            tally.first_reclaim = tally.first_reclaim or report.now
        say(f"{when:<20} {POOL:<10} {a.node:<12} {a.call:<14} [{code}] {reason}")


def _score(
    store: Store, inference: Sequence[str], replay: Replay, tally: Tally, now: datetime
) -> None:
    """Score the minute that begins at ``now`` as docs/evaluation.md does.

    A node serves (warm) when its state is ``serving`` and, if it came back from a loan, once
    ``WARMUP`` (the inference replica's cold start) has passed since; a breach is a minute whose
    demand is above ``rps_per_node`` times the warm nodes.
    """
    nodes = {n["metadata"]["name"]: n for n in _nodes(store)}
    serving = lent = 0
    for name in inference:
        state = state_of(nodes[name])
        if state != "serving":
            tally.away.add(name)
            lent += state in LENT_STATES
            continue
        if name in tally.away:
            tally.away.discard(name)
            tally.warm_at[name] = now + WARMUP
        if tally.warm_at.get(name, now) <= now:
            serving += 1
    lent_names = {n for n in inference if state_of(nodes[n]) in LENT_STATES}
    borrowed = sum(
        _gpus(p)
        for p in _pods(store)
        if p["spec"].get("nodeName") in lent_names
        and p["metadata"].get("namespace") == cluster.TRAINING_NAMESPACE
        and (p.get("status") or {}).get("phase") == "Running"
    )
    tally.minutes += 1
    tally.lent_node_minutes += lent
    tally.borrowed_gpu_minutes += borrowed
    tally.max_lent = max(tally.max_lent, lent)
    demand = replay.demand_at(replay.minute(now))
    if demand is not None and replay.rps_per_node * serving < demand - 1e-9:
        tally.breach_minutes += 1
        tally.breaches.append(now)
    replay.record(serving)


async def _take_back(
    w: World,
    tick: Callable[[], Awaitable[TickReport]],
    tally: Tally,
    say: Callable[[str], None],
) -> None:
    """Every loan back through the audited path: an operator ``reclaim: now`` on each node that
    is not serving (and ``lend: never`` on the others, so nothing new is lent meanwhile), ticks
    until all serve, then the operator's annotations are removed."""
    store, clock = w.store, w.clock
    say(f"{_stamp(clock()):<20} {'operator':<10} {'(all)':<12} {'reclaim all':<14} end of replay")
    for name in w.inference:
        mark: dict[str, str | None] = (
            {KEYS.reclaim: "now"}
            if state_of(store.get(NODES, None, name)) != "serving"
            else {KEYS.lend: "never"}
        )
        _annotate(store, name, mark)
    for _ in range(60):
        await tick()
        if all(state_of(store.get(NODES, None, n)) == "serving" for n in w.inference):
            break
        clock.advance(60)
        w.training.top_up()
    else:
        raise DemoError("the loans were not all back within an hour of trace time")
    for name in w.inference:
        _annotate(store, name, {KEYS.reclaim: None, KEYS.lend: None})


def _annotate(store: Store, name: str, annotations: dict[str, str | None]) -> None:
    """What ``kubectl annotate`` does (a merge patch), as an operator would."""
    body = json.dumps({"metadata": {"annotations": annotations}}).encode()
    store.patch(NODES, None, name, "application/merge-patch+json", body)


async def _all_records(audit_store: SqlAuditStore) -> list[AuditRecord]:
    found: list[AuditRecord] = []
    query = AuditQuery(limit=1000)
    while True:
        page = await audit_store.query(query)
        found.extend(page.records)
        if page.next is None:
            return found
        query = AuditQuery(limit=1000, after=page.next)


def _print_summary(
    s: Summary, at_start: dict[str, dict[str, str]], at_end: dict[str, dict[str, str]], out: TextIO
) -> None:
    t = s.tally
    node_hours = t.lent_node_minutes / 60.0
    changed = sorted(n for n in at_start if at_start[n] != at_end.get(n))
    lines = [
        "",
        "summary",
        f"  replayed            {t.minutes / 60:g} h of trace in {s.ticks} reconcile ticks, "
        f"{s.wall_seconds:.1f} s wall",
        f"  GPU-hours lent      {node_hours * s.gpus_per_node:.1f} "
        f"({node_hours:.2f} node-hours x {s.gpus_per_node} GPUs; at most {t.max_lent} nodes "
        "at once)",
        f"  GPU-hours trained   {t.borrowed_gpu_minutes / 60:.1f} (training pods running on "
        "lent nodes)",
        f"  loans               {t.loans}",
        f"  reclaims            {t.reclaims + t.operator_reclaims} ({t.reclaims} by the "
        f"controller, {t.operator_reclaims} by the operator at the end)",
        f"  breach minutes      {t.breach_minutes} of {t.minutes}"
        + (f" (from {', '.join(_stamp(b)[4:] for b in t.breaches[:5])})" if t.breaches else ""),
        f"  audit rows          {s.audit_rows}",
        f"  nodes restored      {'yes' if s.restored else 'NO'}: "
        + (
            f"all {len(at_start)} nodes' taints and labels are byte for byte as at the start"
            if s.restored
            else f"changed: {', '.join(changed)}"
        ),
    ]
    if t.refused:
        lines.append(f"  steps not done      {t.refused}")
    print("\n".join(lines), file=out, flush=True)


def _write_report(
    opts: Options,
    w: World,
    s: Summary,
    at_end: dict[str, dict[str, str]],
    records: Sequence[AuditRecord],
) -> None:
    assert opts.report is not None
    t, trace, rps_per_node, at_start = s.tally, w.trace, w.rps_per_node, w.at_start
    doc = {
        "options": {
            "trace": str(opts.trace),
            "trace_name": trace.name,
            "service": opts.service,
            "hours": opts.hours,
            "start_hours": opts.start,
            "speed": opts.speed,
            "pace": opts.pace,
            "strategy": opts.strategy,
        },
        "rps_per_node": rps_per_node,
        "summary": {
            "minutes": t.minutes,
            "ticks": s.ticks,
            "lent_node_hours": round(t.lent_node_minutes / 60.0, 4),
            "lent_gpu_hours": round(t.lent_node_minutes / 60.0 * s.gpus_per_node, 4),
            "trained_gpu_hours": round(t.borrowed_gpu_minutes / 60.0, 4),
            "loans": t.loans,
            "reclaims": t.reclaims,
            "operator_reclaims": t.operator_reclaims,
            "breach_minutes": t.breach_minutes,
            "breaches": [_iso(b) for b in t.breaches],
            "audit_rows": s.audit_rows,
            "restored": s.restored,
            "wall_seconds": round(s.wall_seconds, 2),
        },
        "nodes": {
            name: {
                "start": {k: json.loads(v) for k, v in at_start[name].items()},
                "end": {k: json.loads(v) for k, v in at_end[name].items()},
                "same": at_start[name] == at_end[name],
            }
            for name in sorted(at_start)
        },
        "audit": [json.loads(json_line(r)) for r in records],
    }
    opts.report.mkdir(parents=True, exist_ok=True)
    (opts.report / "demo.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
