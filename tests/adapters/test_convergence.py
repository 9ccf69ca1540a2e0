"""End to end through the real kubernetes-asyncio client against the emulator over HTTP: with 10 %
each of 409, 429 and 500 on writes and dropped watch streams, a few hundred lend/reclaim
transitions driven by a miniature reconcile loop (informer -> snapshot -> ``plan_tick`` ->
actuator, ``progress`` on what is in flight), the cluster converges and no transition is applied
twice.

The loop is written here, not the runtime's: each tick it reads ``node_views`` from the
informer, plans the inference pool against a demand that flips between low (lend all it may) and
high (take everything back), applies the steps with one fresh decision id each, drives every
``lending``/``reclaiming`` node with ``progress``, then moves the emulator's clock 30 s (grace
periods and reclaim deadlines pass) and runs its scheduler (preemptible training pods land on the
lent nodes). The informer's cache is awaited, bounded, until it matches the store, so each tick
plans on the state the previous one left.

What is checked afterwards comes from the server's own record (in-process watches of every node
and pod change), not from what the client believes: each state write follows an edge of the state
machine and each decision id reaches each of its writes at most once; only borrowed pods on lent
nodes were ever evicted or deleted; after the faults stop, a restart's passes on the nodes in
flight and a few ticks with target 0, every inference node's labels and taints are byte for byte
what they were; and the informer listed each resource once, plus once per 410.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import model
from rebalancer.core.nodestate import Phase
from rebalancer.core.outcomes import ActionResult, Outcome, WriteKind, WriteOutcome
from rebalancer.core.tick import PoolControls, plan_tick
from sandbox.emulator import cluster
from sandbox.emulator.faults import Faults
from sandbox.emulator.resources import NODES, PODS, ResourceType
from sandbox.emulator.server import Request
from sandbox.emulator.store import ListRequest, Store, WatchRequest
from sandbox.emulator.views import expected_views
from sandbox.emulator.watcher import Scope, Watcher
from tests.support import emulated
from tests.support.actuation import EDGES, Recorder, restart_passes
from tests.support.emulated import Sandbox
from tests.support.objects import daemon_pod
from tests.support.pools import KEYS, MARKS, POLICY, POOL, SPEC, add_replicas
from tests.support.reads import all_pods
from tests.support.waits import Pulse, stop

Obj = dict[str, Any]
FAULTS = Faults(
    conflict_rate=0.1, throttle_rate=0.1, error_rate=0.1, drop_watch_rate=0.1, seed=2026
)
TICK = 30.0  # emulator seconds per tick
LOW, HIGH = 100.0, 500.0  # requests per second: need 2 nodes, then 6 (headroom 20 %)
LOW_TICKS, PERIOD = 2, 6  # demand is low for 2 ticks of every 6
TRANSITIONS = 300  # completed lends plus completed reclaims the faulty run must reach
MAX_TICKS = 400
FINAL_TICKS = 12
PENDING = 6  # pending training pods kept waiting for a lent node
# Far beyond the run (at most 400 ticks of 30 s): every new watch is a drop or a 410, not a timeout.
WATCH_TIMEOUT = 86_400
# What a state write means, from the state label before and after it.
KIND_OF = {
    ("serving", "lending"): WriteKind.BEGIN_LEND,
    ("lending", "lent"): WriteKind.FINISH_LEND,
    ("lending", "serving"): WriteKind.FINISH,  # a rolled-back lend
    ("lent", "reclaiming"): WriteKind.BEGIN_RECLAIM,
    ("reclaiming", "serving"): WriteKind.FINISH,
}
STATE_KINDS = frozenset(KIND_OF.values())
DONE = (("lending", "lent"), ("reclaiming", "serving"))  # a completed lend, a completed reclaim


def demand_at(tick: int) -> tuple[float, int]:
    """The demand sample and the strategy's lend target at ``tick``."""
    low = tick % PERIOD < LOW_TICKS
    return (LOW, cluster.INFERENCE.size) if low else (HIGH, 0)


def drain(watcher: Watcher) -> list[Obj]:
    events: list[Obj] = []
    while not watcher.queue.empty():
        event = watcher.queue.get_nowait()
        assert event is not None, "the server closed its own record"
        events.append(event)
    return events


def server_watch(store: Store, rt: ResourceType) -> Watcher:
    """The server's record of every change from now on, in process: no HTTP, no faults (and
    not one of the requests the server answered)."""
    since = str(store.resource_version)
    return store.watch(WatchRequest(Scope(rt), resource_version=since, timeout=1e9))


def edges(states: dict[str, list[str]]) -> Counter[tuple[str, str]]:
    return Counter(
        pair for seq in states.values() for pair in zip(["serving", *seq], seq, strict=False)
    )


def completed(states: dict[str, list[str]]) -> int:
    done = edges(states)
    return sum(done[e] for e in DONE)


def lent(states: dict[str, list[str]]) -> int:
    return sum(1 for seq in states.values() if seq and seq[-1] == "lent")


@dataclass
class Counts:
    ticks: int = 0
    steps: int = 0
    retries: int = 0
    informer_sleeps: int = 0
    outcomes: Counter[Outcome] = field(default_factory=Counter)


@dataclass
class Loop:
    """The miniature reconcile loop, and what it saw."""

    box: Sandbox
    informer: Informer
    pulse: Pulse
    writer: Recorder
    actuator: Actuator
    counts: Counts
    pool: tuple[str, ...]
    results: list[ActionResult] = field(default_factory=list)
    jobs: int = 0
    landed: int = 0  # borrowed pods the scheduler put on an inference node

    async def tick(self, demand: float, target: int) -> model.Plan:
        now = self.box.clock()
        views = tuple(
            v for v in self.informer.node_views(MARKS) if v.labels.get("gpu-pool") == POOL
        )
        assert {str(v.name) for v in views} == set(self.pool)
        snapshot = model.Snapshot(
            now=now,
            pools={POOL: model.PoolSnapshot(nodes=views, demand=model.Sample(demand, now))},
        )
        proposal = model.Proposal(target, f"test: demand {demand:.0f} rps")
        plan = plan_tick(snapshot, {POOL: proposal}, {POOL: PoolControls(POLICY)}, KEYS).plan
        assert not plan.findings, plan.findings
        acted: set[str] = set()
        for step in plan.steps:
            self.counts.steps += 1
            decision = f"d{self.counts.steps:05d}-{step.action.value}-{step.node}"
            if step.action is model.Action.LEND:
                result = await self.actuator.lend(step.node, decision)
            else:
                deadline = now + POLICY.reclaim_deadline
                result = await self.actuator.reclaim(step.node, decision, deadline)
            self.record(result)
            acted.add(step.node)
        for view in views:
            phase = view.labels.get(KEYS.state)
            if view.name not in acted and phase in (Phase.LENDING, Phase.RECLAIMING):
                self.record(await self.actuator.progress(view.name))
        self.counts.ticks += 1
        return plan

    def record(self, result: ActionResult) -> None:
        self.results.append(result)
        self.counts.outcomes[result.outcome] += 1

    def advance(self, top_up: bool) -> None:
        """Time passes; training keeps asking for GPUs; the scheduler runs."""
        store = self.box.store
        self.box.clock.advance(TICK)
        if top_up:
            pods = all_pods(store)
            waiting = [
                p
                for p in pods
                if p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
                and not p["spec"].get("nodeName")
            ]
            for _ in range(PENDING - len(waiting)):
                self.jobs += 1
                pod = cluster.training_pod(f"job-{self.jobs}", 0, priority_class=None)
                if self.jobs % 3 == 0:  # a budget that allows no eviction: deleted at deadline
                    pod["metadata"]["labels"]["budget"] = "strict"
                cluster.add(store, pod)
        bound = store.schedule()
        self.landed += sum(1 for _, _, node in bound if node in self.pool)

    async def caught_up(self) -> None:
        """Wait (bounded) until the informer's views are those the store's objects give."""
        store = self.box.store
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(store, MARKS)
        )


def informer_lists(box: Sandbox, plural: str) -> int:
    """Lists shaped like the informer's, streamed or paged (the actuator's lists carry other
    selectors)."""

    def informers(request: Request) -> bool:
        if request.resource != plural or not emulated.asks_for_list(request):
            return False
        if plural == "nodes":
            return not request.query.get("labelSelector")
        return "status.phase" in request.query.get("fieldSelector", "")

    return sum(1 for r in box.requests.seen if informers(r))


def seed_workloads(store: Store, pool: Iterable[str]) -> dict[str, str]:
    """Pods that are not borrowed (inference replicas, DaemonSet pods) and training that fills
    the training pool; their uids, by ``namespace/name``."""
    made = [cluster.add(store, daemon_pod(node)) for node in pool]
    made += add_replicas(store)
    for i in range(cluster.TRAINING.size):
        cluster.add(store, cluster.training_pod(f"resident-{i}", 0, priority_class=None))
    store.schedule()
    residents = [p for p in all_pods(store) if p["metadata"]["name"].startswith("resident-")]
    assert sorted(p["spec"]["nodeName"] for p in residents) == [
        n["metadata"]["name"] for n in cluster.pool_nodes(cluster.TRAINING)
    ]
    made += residents
    cluster.add(
        store,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "strict", "namespace": cluster.TRAINING_NAMESPACE},
            "spec": {"selector": {"matchLabels": {"budget": "strict"}}, "maxUnavailable": 0},
        },
    )
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["uid"] for p in made
    }


async def test_faulty_writes_and_dropped_watches_converge_and_apply_no_transition_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rebalancer.adapters.informer")
    started = time.monotonic()
    async with emulated.running(seeded=True) as box:
        store = box.store
        pool = tuple(
            n["metadata"]["name"]
            for n in store.list_page(ListRequest(Scope(NODES))).items
            if n["metadata"]["labels"].get("gpu-pool") == POOL
        )
        assert len(pool) == cluster.INFERENCE.size
        originals = {
            name: (
                json.dumps(store.get(NODES, None, name)["metadata"]["labels"]),
                json.dumps(store.get(NODES, None, name)["spec"]["taints"]),
            )
            for name in pool
        }
        kept = seed_workloads(store, pool)
        nodes_record, pods_record = server_watch(store, NODES), server_watch(store, PODS)

        counts = Counts()

        async def retry_sleep(_: float) -> None:
            counts.retries += 1  # a retried write; the backoff is not waited for

        async def informer_sleep(_: float) -> None:
            counts.informer_sleeps += 1
            await asyncio.sleep(0)

        pulse = Pulse()
        informer = Informer(
            box.api,
            settings=WatchSettings(timeout_seconds=WATCH_TIMEOUT),
            sleep=informer_sleep,
            on_change=pulse,
        )
        writer = Recorder(KubeWriter(client.CoreV1Api(box.api), RetryPolicy(sleep=retry_sleep)))
        actuator = Actuator(writer, KEYS, SPEC, MARKS, box.clock)
        loop = Loop(box, informer, pulse, writer, actuator, counts, pool)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await loop.caught_up()

            # The faulty run: until enough transitions have completed and some nodes are lent,
            # so that the final ticks below have loans to end.
            box.faults.configure(FAULTS)
            while completed(writer.states) < TRANSITIONS or not lent(writer.states):
                assert counts.ticks < MAX_TICKS, f"too few transitions: {edges(writer.states)}"
                await loop.tick(*demand_at(counts.ticks))
                loop.advance(top_up=True)
                await loop.caught_up()
            faulty = replace(counts, outcomes=Counter(counts.outcomes))
            faulty_transitions = completed(writer.states)
            drops = informer.nodes.watches + informer.pods.watches - 2
            out = Counter(seq[-1] for seq in writer.states.values() if seq[-1] != "serving")

            # The faults stop; a restart ends what is in flight; the target goes to zero.
            box.faults.configure(Faults())
            for result in await restart_passes(actuator, writer):
                loop.record(result)
            for _ in range(FINAL_TICKS):
                await loop.caught_up()
                views = informer.node_views(MARKS)
                if all(KEYS.state not in v.labels for v in views):
                    break
                await loop.tick(LOW, 0)
                loop.advance(top_up=False)
            await loop.caught_up()
        finally:
            await stop(task)
        node_events, pod_events = drain(nodes_record), drain(pods_record)
        final_nodes = store.list_page(ListRequest(Scope(NODES))).items
        final_pods = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in all_pods(store)
        }
        lists = {p: informer_lists(box, p) for p in ("nodes", "pods")}
        # The same nodes as the informer last received them over HTTP.
        received = {name: informer.node(name) or {} for name in pool}
        watches = {p: len(box.requests.watches_of(p)) for p in ("nodes", "pods")}
    elapsed = time.monotonic() - started

    # --- What the server stored, node by node: each write an edge, each decision once. ---
    server_states: dict[str, list[str]] = {}
    applied: Counter[tuple[str, WriteKind]] = Counter()
    decision_nodes: dict[str, set[str]] = {}
    for event in node_events:
        assert event["type"] == "MODIFIED", event["type"]
        meta = event["object"]["metadata"]
        name = meta["name"]
        assert name in pool, f"a node outside the pool was written: {name}"
        seq = server_states.setdefault(name, [])
        before, after = (seq[-1] if seq else "serving"), meta["labels"].get(KEYS.state, "serving")
        assert (before, after) in EDGES, (name, before, after)
        seq.append(after)
        decision = meta["annotations"][KEYS.decision]
        applied[decision, KIND_OF[before, after]] += 1
        decision_nodes.setdefault(decision, set()).add(name)
    assert server_states == writer.states  # the server took exactly what the actuator saw applied
    twice = {key: n for key, n in applied.items() if n > 1}
    assert not twice, f"transitions applied more than once: {twice}"
    assert all(len(nodes) == 1 for nodes in decision_nodes.values())
    for decision, kind in applied:  # a decision id names one step: a lend or a reclaim
        lending = kind in (WriteKind.BEGIN_LEND, WriteKind.FINISH_LEND)
        reclaiming = kind is WriteKind.BEGIN_RECLAIM
        assert not (lending and "-reclaim-" in decision), decision
        assert not (reclaiming and "-lend-" in decision), decision
    # Every write the server took is reported once, by the call that made it.
    reported = Counter(w.kind for r in loop.results for w in r.applied if w.kind in STATE_KINDS)
    assert reported == Counter(kind for _, kind in applied.elements())

    # --- Pods: only borrowed pods on lent nodes were ever evicted or deleted. ---
    disrupted: dict[str, Obj] = {}
    for event in pod_events:
        pod = event["object"]
        if event["type"] == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            disrupted[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
    for key, pod in disrupted.items():
        assert convert.role(pod, MARKS) is model.PodRole.BORROWED, key
        assert pod["spec"].get("nodeName") in pool, key
        assert key not in kept, key
    assert writer.pod_targets <= set(disrupted)
    for key, uid in kept.items():
        assert key in final_pods, key
        assert final_pods[key]["metadata"]["uid"] == uid, key
        assert "deletionTimestamp" not in final_pods[key]["metadata"], key

    # --- Converged: every node as it was, no state left, informer listed once per 410. ---
    for node in final_nodes:
        assert KEYS.state not in node["metadata"].get("labels", {}), node["metadata"]["name"]
    by_name = {n["metadata"]["name"]: n for n in final_nodes}
    for name, (labels, taints) in originals.items():
        assert json.dumps(by_name[name]["metadata"]["labels"]) == labels, name
        assert json.dumps(by_name[name]["spec"]["taints"]) == taints, name
        assert json.dumps(received[name]["metadata"]["labels"]) == labels, name
        assert json.dumps(received[name]["spec"]["taints"]) == taints, name
    relisted = Counter(
        r.getMessage().split(":")[0] for r in caplog.records if "listing again" in r.getMessage()
    )
    # A streamed list the faults cut short is listed again page by page: asked for twice.
    paged = Counter(
        r.getMessage().split(":")[0] for r in caplog.records if "page by page" in r.getMessage()
    )
    for plural, reflector in (("nodes", informer.nodes), ("pods", informer.pods)):
        assert reflector.lists == 1 + relisted[plural], (plural, relisted)
        assert lists[plural] == reflector.lists + paged[plural], (plural, lists, paged)
        assert reflector.watches == watches[plural]

    done = edges(server_states)
    evictions = sum(1 for r in loop.results for w in r.applied if w.outcome is WriteOutcome.EVICTED)
    deletions = sum(
        1
        for r in loop.results
        for w in r.applied
        if w.kind is WriteKind.DELETE and w.outcome is WriteOutcome.APPLIED
    )
    print(
        f"\nconvergence: faulty ticks {faulty.ticks} (then not serving: {dict(out)}), "
        f"final ticks {counts.ticks - faulty.ticks}, "
        f"steps {counts.steps}\n"
        f"transitions: {faulty_transitions} completed under faults; in all "
        f"{done['lending', 'lent']} lends and {done['reclaiming', 'serving']} reclaims completed, "
        f"{done['lending', 'serving']} lends rolled back, {sum(done.values())} state writes\n"
        f"faults: {faulty.outcomes[Outcome.CONFLICT]} conflicts, "
        f"{faulty.outcomes[Outcome.FAILED]} failed, {faulty.retries} retries, "
        f"{drops} dropped watches, {sum(relisted.values())} relists after 410\n"
        f"pods: {loop.landed} borrowed landed on lent nodes, {evictions} evictions, "
        f"{deletions} deletes past a deadline, {len(disrupted)} pods disrupted in all\n"
        f"informer: lists {lists}, watches {watches}; wall time {elapsed:.1f}s"
    )
    assert faulty_transitions >= TRANSITIONS
    # The faults did bite, and every path was taken.
    assert faulty.outcomes[Outcome.CONFLICT] > 0
    assert faulty.retries > 0
    assert drops > 0
    assert done["lending", "serving"] > 0
    assert loop.landed > 0
    assert evictions > 0
    assert deletions > 0
    assert counts.ticks > faulty.ticks  # the final ticks had loans to end
    assert counts.informer_sleeps == 0  # the informer resumed every stream without a failure
