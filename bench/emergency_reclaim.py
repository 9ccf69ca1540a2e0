"""How long ``rebalancer reclaim --all`` takes to give inference its nodes back.

What it measures, for 6 and 50 lent nodes, each running training pods, against the API emulator
served over HTTP in this process with 150 ms of real wall-clock latency added to every request
(``Faults(latency=...)``), through the command's own code (``Controller.open`` in the
operator's role, ``lent_nodes``, ``reclaim_wave``: the real client, Events, the audit store in
SQLite):
- the time to the last serving taint, as the server saw it (the moment the emulator took the
  write that put the node's serving taint back) and as the command reports it (when the node's
  reclaim call returned, which also asked for its evictions);
- the time to the last node back (serving again), against the 2-minute default deadline.
By default the training pods take longer to terminate than the deadline allows (a trainer that
checkpoints for 10 minutes): every node waits for the deadline and its pods are then deleted,
the worst case. ``--pod-grace 30`` gives pods that leave on their own after 30 s.

``--sequential`` also measures the former path (one node after another, the next
started only when the previous is back): it takes about nodes x deadline, so only with few nodes
or a short ``--deadline``. ``--controller`` measures the controller's own reclaim wave the calls
``Reconciler.apply`` makes, formerly one after another (each step's ``reclaim`` and outcome
record) and now together (``reclaim_concurrency`` at once), plus one ``drive`` pass
(``progress`` on every node in flight) each way; these time only the calls, no drain is waited
for.

    .venv/bin/python bench/emergency_reclaim.py                       # 6 and 50 nodes, ~5 min
    .venv/bin/python bench/emergency_reclaim.py --nodes 6 --deadline 20 --sequential
    .venv/bin/python bench/emergency_reclaim.py --controller --no-wave
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rebalancer import settings as settings_mod
from rebalancer.adapters import convert
from rebalancer.commands import reclaim
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from sandbox.emulator import cluster
from sandbox.emulator.faults import FaultInjector, Faults
from sandbox.emulator.resources import NODES
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store

Obj = dict[str, Any]
SERVING = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
GOAL_TAINT = 2.0  # seconds: every node serving-tainted within this
GOAL_SLACK = 5.0  # seconds past the deadline: every node back within this


class TimedStore(Store):
    """The emulator's store, noting (wall clock) when each node first has its serving taint
    back after ``arm``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed: float | None = None
        self.tainted: dict[str, float] = {}

    def arm(self) -> None:
        self.armed, self.tainted = time.perf_counter(), {}

    def patch(self, rt: Any, namespace: str | None, name: str, *args: Any, **kwargs: Any) -> Obj:
        out = super().patch(rt, namespace, name, *args, **kwargs)
        taints = (out.get("spec") or {}).get("taints") or []
        if self.armed is not None and rt is NODES and SERVING in taints:
            self.tainted.setdefault(name, time.perf_counter() - self.armed)
        return out


def config_text(audit_db: Path, deadline: float) -> str:
    return f"""
leader_election: {{enabled: false}}
prometheus: {{url: "http://127.0.0.1:9"}}
audit: {{url: "sqlite+aiosqlite:///{audit_db}"}}
pools:
  - name: inference
    node_selector: {{gpu-pool: inference}}
    inference_selector: {{app: llm-serving}}
    rps_per_node: 100
    limits: {{reclaim_deadline: {deadline}s}}
"""


@dataclass
class Lab:
    store: TimedStore
    faults: FaultInjector
    controller: wiring.Controller
    nodes: list[str]


@contextlib.asynccontextmanager
async def lab(
    size: int, pods: int, pod_grace: int, deadline: float, latency: float
) -> AsyncIterator[Lab]:
    """``size`` lent inference nodes (plus two serving), ``pods`` training pods on each; the
    latency is switched on once the loans are made."""
    store = TimedStore(seed=1)
    cluster.seed(
        store, (cluster.Pool("inference", size + 2, "NVIDIA-L20", cluster.INFERENCE_TAINT),)
    )
    faults = FaultInjector()
    with tempfile.TemporaryDirectory() as tmp:
        async with serve(store, faults=faults) as url:
            kubeconfig = write_kubeconfig(url, Path(tmp) / "kubeconfig")
            path = Path(tmp) / "config.yaml"
            path.write_text(config_text(Path(tmp) / "audit.sqlite3", deadline), encoding="utf-8")
            config = settings_mod.load(path, env={})
            seams = wiring.Seams(kubeconfig=kubeconfig, name="bench", sink=None)
            async with wiring.Controller.open(config, seams, wiring.Role.OPERATOR) as controller:
                (pool,) = controller.pools
                nodes = [f"inference-{i}" for i in range(2, size + 2)]
                for node in nodes:
                    lent = await controller.reconciler.actuators[pool.name].lend(node, "bench-lend")
                    assert lent.outcome is Outcome.APPLIED, lent.message
                    for index in range(pods):
                        pod = cluster.training_pod(
                            f"job-{node}", index, gpus=4, priority_class=None
                        )
                        pod["spec"]["nodeName"] = node
                        pod["spec"]["terminationGracePeriodSeconds"] = pod_grace
                        cluster.add(store, pod)
                faults.configure(Faults(latency=latency))
                yield Lab(store, faults, controller, nodes)


@dataclass
class Figures:
    label: str
    nodes: int
    taint_server: float  # s to the last serving taint, as the emulator took it
    taint_reported: float  # s to the last serving taint, as the command reports it
    back: float  # s to the last node back
    not_back: int
    extra: dict[str, float] = field(default_factory=dict)


async def wave(lab: Lab, concurrency: int) -> Figures:
    """What ``rebalancer reclaim --all`` does, timed from before its LIST of lent nodes."""
    lab.store.arm()
    started = time.perf_counter()
    reported: dict[str, float] = {}

    def seen(event: reclaim.ReclaimEvent) -> None:
        if event.stage is reclaim.Stage.SERVING_TAINTED:
            reported.setdefault(event.node, time.perf_counter() - started)

    known = await reclaim.lent_nodes(lab.controller)
    done = await reclaim.reclaim_wave(
        lab.controller, list(known), known=known, concurrency=concurrency, on_event=seen
    )
    back = time.perf_counter() - started
    return Figures(
        f"wave, concurrency {concurrency}",
        len(done),
        max(lab.store.tainted.values(), default=float("nan")),
        max(reported.values(), default=float("nan")),
        back,
        sum(not d.ok for d in done),
        {"audit errors": float(sum(len(d.audit_errors) for d in done))},
    )


async def sequential(lab: Lab) -> Figures:
    """The former path: one node at a time, each to the end of its drain."""
    lab.store.arm()
    started = time.perf_counter()
    done: list[reclaim.Reclaimed] = []
    for node in await reclaim.lent_nodes(lab.controller):
        done.extend(await reclaim.reclaim_wave(lab.controller, [node], concurrency=1))
    return Figures(
        "one node after another (before)",
        len(done),
        max(lab.store.tainted.values(), default=float("nan")),
        float("nan"),
        time.perf_counter() - started,
        sum(not d.ok for d in done),
    )


async def controller(lab: Lab, concurrency: int | None) -> Figures:
    """The controller's reclaim wave as ``Reconciler.apply`` runs it (``concurrency`` None: one
    step after another, as it formerly did) or with the steps run together, then one ``drive``
    pass."""
    reconciler = lab.controller.reconciler
    (pool,) = lab.controller.pools
    actuator = reconciler.actuators[pool.name]
    known = await reclaim.lent_nodes(lab.controller)
    views = [convert.node_view(raw) for raw in known.values()]
    # The intents, committed as a tick's are before apply: untimed.
    plan, tick = reconciler.operator_plan({pool.name: views}, "bench")
    await reconciler.audit_log.tick(tick.records)
    intents = {str(s.node): tick.intent_for(s) for s in plan.steps}
    audit_log, clock = reconciler.audit_log, reconciler.clock
    deadline = clock() + pool.policy.reclaim_deadline
    limit = asyncio.Semaphore(concurrency or 1)

    async def step(node: str) -> None:
        async with limit:
            result = await actuator.reclaim(node, intents[node].id, deadline)
        await audit_log.outcome(intents[node], result, clock())

    async def drive(node: str) -> None:
        async with limit:
            await actuator.progress(node)

    lab.store.arm()
    started = time.perf_counter()
    await run_all(step, list(known), together=concurrency is not None)
    applied = time.perf_counter() - started
    started = time.perf_counter()
    await run_all(drive, list(known), together=concurrency is not None)
    driven = time.perf_counter() - started
    how = "one after another (former)" if concurrency is None else f"{concurrency} at once"
    return Figures(
        f"controller apply, {how}",
        len(known),
        max(lab.store.tainted.values(), default=float("nan")),
        float("nan"),
        float("nan"),
        0,
        {"apply": applied, "drive pass": driven},
    )


async def run_all(each: Callable[[str], Any], nodes: Sequence[str], together: bool) -> None:
    if together:
        await asyncio.gather(*(each(n) for n in nodes))
    else:
        for node in nodes:
            await each(node)


def show(f: Figures, deadline: float) -> None:
    def s(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.1f}s"

    verdicts = []
    if not math.isnan(f.taint_server):
        verdicts.append("taint ok" if f.taint_server <= GOAL_TAINT else "taint MISSED")
    if not math.isnan(f.back):
        ok = f.back <= deadline + GOAL_SLACK and not f.not_back
        verdicts.append("back ok" if ok else "back MISSED")
    extra = "".join(
        f" {k} {int(v)}" if k == "audit errors" else f" {k} {s(v)}" for k, v in f.extra.items()
    )
    print(
        f"{f.nodes:>5} {f.label:<42} last taint {s(f.taint_server):>7} (reported "
        f"{s(f.taint_reported)}) last back {s(f.back):>7} not back {f.not_back}{extra}  "
        f"{' '.join(verdicts)}",
        flush=True,
    )


async def run(args: argparse.Namespace) -> None:
    deadline = args.deadline
    print(
        f"latency {args.latency * 1000:.0f} ms per request, deadline {deadline:.0f}s, "
        f"{args.pods} training pods per node, grace {args.pod_grace}s; goals: every node "
        f"serving-tainted within {GOAL_TAINT:.0f}s, back within deadline + {GOAL_SLACK:.0f}s",
        flush=True,
    )
    options = (args.pods, args.pod_grace, deadline, args.latency)
    for size in args.nodes:
        if args.wave:
            for concurrency in args.concurrency:
                async with lab(size, *options) as box:
                    show(await wave(box, concurrency), deadline)
        if args.sequential:
            async with lab(size, *options) as box:
                show(await sequential(box), deadline)
        if args.controller:
            for concurrency in (None, *args.concurrency):
                async with lab(size, *options) as box:
                    show(await controller(box, concurrency), deadline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[6, 50], help="lent nodes (6 50)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8], help="at once (8)")
    parser.add_argument("--latency", type=float, default=0.15, help="s per request (0.15)")
    parser.add_argument("--deadline", type=float, default=120.0, help="reclaim deadline s (120)")
    parser.add_argument("--pods", type=int, default=2, help="training pods per node (2)")
    parser.add_argument("--pod-grace", type=int, default=600, help="their grace period s (600)")
    parser.add_argument("--no-wave", dest="wave", action="store_false", help="skip the command")
    parser.add_argument("--sequential", action="store_true", help="also the former path")
    parser.add_argument("--controller", action="store_true", help="also Reconciler.apply's wave")
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
