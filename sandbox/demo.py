"""``rebalancer demo``: the real controller against the API emulator, on a replayed trace.

In one process, with no network, cluster or Prometheus:

- the settings of one inference pool, as a platform team would write them;
- the controller as ``rebalancer run`` builds it (``runtime.wiring.Controller.open``), given the
  emulator's client, a manual clock and the replayed trace as its seams: informer, actuator,
  Events, reconciler, audit log (SQLite in a temporary directory), telemetry;
- the Kubernetes API emulator serving its default cluster over HTTP on 127.0.0.1 (8 L20
  inference nodes, 4 A100 training nodes) on a ``ManualClock`` set to the trace's start;
  inference replicas run on a few inference nodes (so those are never idle), and preemptible
  training jobs (tolerating the lend taint) wait, a few always pending;
- ``sim.replay.Replay`` replays the trace behind the controller's metrics seam: the clock moves
  one trace minute per step, so cooldowns and deadlines follow the trace.

Each decision is printed as it happens and every minute is scored as the simulator scores it
(``sim.engine.score``). At the end every loan is taken back by ``rebalancer reclaim``'s own wave
(``runtime.takeback``), and a summary says what was lent, what was breached, and whether every
node's taints and labels are back byte for byte. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio import client

from rebalancer.adapters import convert
from rebalancer.adapters.audit import SqlAuditStore, UlidFactory, every_record, json_line
from rebalancer.core import model, nodestate, warmth
from rebalancer.core.audit import AuditRecord
from rebalancer.core.outcomes import Outcome
from rebalancer.errors import TraceError
from rebalancer.runtime import takeback
from rebalancer.runtime.reconcile import TickReport
from rebalancer.runtime.wiring import Controller, Seams
from rebalancer.settings import Settings
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.server import serve
from sandbox.emulator.store import Store
from sandbox.emulator.views import expected_views
from sandbox.sim import engine, traces
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
BUSY = ("inference-0", "inference-1")  # run inference replicas: never idle, never lent
PENDING = 3  # training pods kept waiting, so borrowed capacity is really used
MODEL = engine.PoolModel(size=cluster.INFERENCE.size)  # 2 min drain, 5 min warm-up, as scored
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


def settings(strategy: str, rps_per_node: float) -> Settings:
    """The demo's settings: one inference pool; no election (one replica), no HTTP server."""
    return Settings.model_validate(
        {
            "leader_election": {"enabled": False},
            "pools": [
                {
                    "name": "inference",
                    "node_selector": {"gpu-pool": cluster.INFERENCE.name},
                    "inference_selector": {"app": "llm-serving"},
                    "rps_per_node": rps_per_node,
                    "strategy": {"name": strategy},
                    "limits": {
                        "min_serving": MODEL.min_serving,
                        "headroom": MODEL.headroom,
                        "reclaim_deadline": MODEL.drain,
                        "warmup": MODEL.warmup,
                    },
                }
            ],
        }
    )


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
            for p in self.store.peek(PODS)
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


@dataclass
class World:
    """The emulated cluster and the trace, before the controller runs."""

    trace: traces.Trace
    first: int  # the trace minute the replay begins at
    steps: int  # trace minutes to replay
    rps_per_node: float
    clock: ManualClock
    store: Store
    training: Training
    names: list[str]  # every node
    inference: list[str]  # the inference pool's nodes
    at_start: dict[str, dict[str, str]]
    replay: Replay


def build(opts: Options) -> World:
    trace = _load(opts)
    first = round(opts.start * 60)
    steps = min(round(opts.hours * 60), trace.minutes - first)
    if steps <= 0:
        raise DemoError(f"--start {opts.start} h is past the trace's end ({trace.minutes} min)")
    if trace.peak <= 0:
        raise DemoError(f"trace {trace.name} has no demand above zero")
    rps_per_node = MODEL.calibrate(trace)
    clock = ManualClock(trace.start + timedelta(minutes=first))
    store = Store(clock, seed=1)
    cluster.seed(store)
    for i, name in enumerate(BUSY):
        cluster.add(store, cluster.inference_pod(i, node_name=name))
    training = Training(store)
    training.top_up()
    names = sorted(n["metadata"]["name"] for n in store.peek(NODES))
    return World(
        trace=trace,
        first=first,
        steps=steps,
        rps_per_node=rps_per_node,
        clock=clock,
        store=store,
        training=training,
        names=names,
        inference=[n for n in names if n.startswith(cluster.INFERENCE.name + "-")],
        at_start={name: scheduling(store, name) for name in names},
        replay=Replay(trace, clock, rps_per_node),
    )


# ---------------------------------------------------------------------------------------------
# Scoring: every replayed minute, as the simulator scores its own


@dataclass
class Tally:
    """What the demo counts minute by minute and step by step."""

    timeline: list[engine.Minute] = field(default_factory=list)
    lent_since: dict[str, datetime] = field(default_factory=dict)
    loan_minutes: list[float] = field(default_factory=list)
    borrowed_gpu_minutes: float = 0.0  # GPUs training pods actually ran on lent nodes
    loans: int = 0
    reclaims: int = 0  # taken back by the controller during the replay
    operator_reclaims: int = 0  # taken back at the end
    refused: int = 0
    first_lend: datetime | None = None
    first_reclaim: datetime | None = None

    @property
    def minutes(self) -> int:
        return len(self.timeline)

    @property
    def max_lent(self) -> int:
        return max((m.lent for m in self.timeline), default=0)


def score_minute(w: World, rules: model.PodRules, tally: Tally, now: datetime) -> None:
    """The minute that begins at ``now``: warm capacity by the planner's own rule
    (``core.warmth.is_warm``, with a returned node's cold start), what is lent, what training
    ran on it, and the demand that arrived."""
    pods: dict[str, list[model.PodView]] = {}
    borrowed: dict[str, float] = {}
    for pod in w.store.peek(PODS):
        node = pod["spec"].get("nodeName")
        if node and not convert.finished(pod):
            pods.setdefault(node, []).append(convert.pod_view(pod, rules))
            if (pod.get("status") or {}).get("phase") == "Running":
                borrowed[node] = borrowed.get(node, 0.0) + _gpus(pod)
    serving = lent = returning = 0
    for raw in w.store.peek(NODES):
        name = raw["metadata"]["name"]
        if name not in w.inference:
            continue
        view = convert.node_view(raw, pods.get(name, ()))
        state = nodestate.read(view, nodestate.Keys())
        assert isinstance(state, nodestate.NodeState), state
        if state.phase in (nodestate.Phase.LENDING, nodestate.Phase.LENT):
            lent += 1
            tally.lent_since.setdefault(name, now)
            tally.borrowed_gpu_minutes += borrowed.get(name, 0.0)
            continue
        if name in tally.lent_since:
            tally.loan_minutes.append((now - tally.lent_since.pop(name)) / timedelta(minutes=1))
        if warmth.is_warm(view, state, now, MODEL.warmup):
            serving += 1
        else:
            returning += 1
    minute = w.replay.minute(now)
    demand = w.replay.demand_at(minute)
    need = None if demand is None else MODEL.need(demand, w.rps_per_node)
    tally.timeline.append(
        engine.Minute(now, demand, need, serving, lent, returning, w.replay.queue)
    )
    w.replay.record(serving)


def figures(w: World, tally: Tally) -> engine.Figures:
    return engine.score(
        tally.timeline,
        [m.need for m in tally.timeline],
        MODEL,
        w.rps_per_node,
        tally.loan_minutes,
        tally.loans,
        tally.reclaims + tally.operator_reclaims,
    )


# ---------------------------------------------------------------------------------------------
# The run


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%a %Y-%m-%d %H:%M")


@dataclass(frozen=True)
class Summary:
    exit_code: int
    restored: bool
    tally: Tally
    figures: engine.Figures
    rps_per_node: float
    audit_rows: int
    wall_seconds: float
    ticks: int


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
        url = f"sqlite+aiosqlite:///{Path(tmp) / 'audit.sqlite3'}"
        audit_store = await SqlAuditStore.open(url, now=w.clock)
        try:
            ticks = await _drive(opts, w, audit_store, tally, say)
            records = await every_record(audit_store)
        finally:
            await audit_store.close()
    at_end = {name: scheduling(w.store, name) for name in w.names}
    restored = at_end == w.at_start
    summary = Summary(
        exit_code=0 if restored else 1,
        restored=restored,
        tally=tally,
        figures=figures(w, tally),
        rps_per_node=w.rps_per_node,
        audit_rows=len(records),
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
    """Serve the emulator, open the controller on it, tick it through the replay; the ticks."""
    ticks = 0
    loop = asyncio.get_running_loop()
    pace = opts.pace / (24 * 60)  # wall seconds per trace minute
    due = loop.time()
    async with (
        serve(w.store) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        seams = Seams(
            api=api,
            clock=w.clock,
            metrics=w.replay,
            audit_store=audit_store,
            new_id=UlidFactory(w.clock),
            sink=None,
            name="rebalancer-demo",
            serve_http=False,
        )
        async with Controller.open(settings(opts.strategy, w.rps_per_node), seams) as c:
            (pool,) = c.pools
            task = asyncio.create_task(c.informer.run())
            try:
                await asyncio.wait_for(c.informer.synced.wait(), 10)
                for step in range(w.steps):
                    if step % opts.speed == 0:
                        await _caught_up(c, w.store)
                        report = await c.reconciler.tick()
                        ticks += 1
                        _print_tick(report, str(pool.name), tally, say)
                    score_minute(w, pool.rules, tally, w.clock())
                    w.clock.advance(60)
                    w.training.top_up()
                    due += pace
                    if pace > 0 and due > loop.time():
                        await asyncio.sleep(due - loop.time())
                await _caught_up(c, w.store)
                await _take_back(c, w, tally, say)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    return ticks


async def _caught_up(c: Controller, store: Store, within: float = 10.0) -> None:
    """Until the informer's cache holds what the store holds, so every tick sees the minute
    it is in (woken by the informer's changes, checked every few milliseconds)."""
    (pool,) = c.pools
    async with asyncio.timeout(within):
        while c.informer.node_views(pool.rules) != expected_views(store, pool.rules):
            c.informer.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.informer.changed.wait(), 0.005)


def _print_tick(report: TickReport, pool: str, tally: Tally, say: Callable[[str], None]) -> None:
    when = _stamp(report.now)
    for a in report.applied:
        intent = a.intent
        outcome = a.result.outcome if a.result is not None else None
        if a.call is model.Action.PROGRESS:
            if outcome is not Outcome.APPLIED:
                continue
            back = intent is None or intent.action is model.Action.RECLAIM
            message = a.result.message if a.result is not None else ""
            say(
                f"{when:<20} {pool:<10} {a.node:<12} {'restored' if back else 'lent':<14} {message}"
            )
            continue
        reason = intent.message if intent is not None else ""
        code = intent.reason if intent is not None else ""
        if outcome not in (Outcome.APPLIED, Outcome.IN_PROGRESS):
            tally.refused += 1
            say(f"{when:<20} {pool:<10} {a.node:<12} {a.call + ' ' + str(outcome):<14} {reason}")
            continue
        if a.call is model.Action.LEND:
            tally.loans += 1
            tally.first_lend = tally.first_lend or report.now
        else:
            tally.reclaims += 1
            tally.first_reclaim = tally.first_reclaim or report.now
        say(f"{when:<20} {pool:<10} {a.node:<12} {a.call:<14} [{code}] {reason}")


async def _take_back(c: Controller, w: World, tally: Tally, say: Callable[[str], None]) -> None:
    """Every loan back as ``rebalancer reclaim --all`` takes it: one audited wave; the clock
    moves a poll at a time while the drains run."""
    say(f"{_stamp(w.clock()):<20} {'operator':<10} {'(all)':<12} {'reclaim all':<14} end of replay")

    async def wait(seconds: float) -> None:
        w.clock.advance(seconds)
        w.training.top_up()
        await _caught_up(c, w.store)

    known = await takeback.lent_nodes(c)
    done = await takeback.reclaim_wave(c, list(known), known=known, poll=10.0, sleep=wait)
    for d in done:
        if not d.ok:
            raise DemoError(f"{d.node} was not taken back: {d.message}")
        tally.operator_reclaims += 1
        say(f"{_stamp(w.clock()):<20} {'operator':<10} {d.node:<12} {'restored':<14} {d.message}")


def _print_summary(
    s: Summary, at_start: dict[str, dict[str, str]], at_end: dict[str, dict[str, str]], out: TextIO
) -> None:
    t, f, gpus = s.tally, s.figures, cluster.INFERENCE.gpus
    breaches = [m.time for m in t.timeline if engine.breached(m, s.rps_per_node)]
    changed = sorted(n for n in at_start if at_start[n] != at_end.get(n))
    lines = [
        "",
        "summary",
        f"  replayed            {t.minutes / 60:g} h of trace in {s.ticks} reconcile ticks, "
        f"{s.wall_seconds:.1f} s wall",
        f"  GPU-hours lent      {f.lent_node_hours * gpus:.1f} "
        f"({f.lent_node_hours:.2f} node-hours x {gpus} GPUs; at most {t.max_lent} nodes "
        f"at once; {f.harvest_ratio:.3f} of the oracle's)",
        f"  GPU-hours trained   {t.borrowed_gpu_minutes / 60:.1f} (training pods running on "
        "lent nodes)",
        f"  loans               {t.loans}",
        f"  reclaims            {t.reclaims + t.operator_reclaims} ({t.reclaims} by the "
        f"controller, {t.operator_reclaims} by the operator at the end)",
        f"  breach minutes      {f.breach_minutes} of {t.minutes}"
        + (f" (from {', '.join(_stamp(b)[4:] for b in breaches[:5])})" if breaches else ""),
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
    t, f, gpus = s.tally, s.figures, cluster.INFERENCE.gpus
    doc = {
        "options": {
            "trace": str(opts.trace),
            "trace_name": w.trace.name,
            "service": opts.service,
            "hours": opts.hours,
            "start_hours": opts.start,
            "speed": opts.speed,
            "pace": opts.pace,
            "strategy": opts.strategy,
        },
        "rps_per_node": w.rps_per_node,
        "summary": {
            "minutes": t.minutes,
            "ticks": s.ticks,
            "lent_node_hours": round(f.lent_node_hours, 4),
            "lent_gpu_hours": round(f.lent_node_hours * gpus, 4),
            "harvest_ratio": f.harvest_ratio,
            "trained_gpu_hours": round(t.borrowed_gpu_minutes / 60.0, 4),
            "loans": t.loans,
            "reclaims": t.reclaims,
            "operator_reclaims": t.operator_reclaims,
            "breach_minutes": f.breach_minutes,
            "breaches": [
                nodestate.format_time(m.time)
                for m in t.timeline
                if engine.breached(m, w.rps_per_node)
            ],
            "audit_rows": s.audit_rows,
            "restored": s.restored,
            "wall_seconds": round(s.wall_seconds, 2),
        },
        "nodes": {
            name: {
                "start": {k: json.loads(v) for k, v in w.at_start[name].items()},
                "end": {k: json.loads(v) for k, v in at_end[name].items()},
                "same": w.at_start[name] == at_end[name],
            }
            for name in sorted(w.at_start)
        },
        "audit": [json.loads(json_line(r)) for r in records],
    }
    opts.report.mkdir(parents=True, exist_ok=True)
    (opts.report / "demo.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
