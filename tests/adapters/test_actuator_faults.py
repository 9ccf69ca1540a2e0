"""Hundreds of lend/reclaim transitions on several nodes through an API server that answers a
seeded share of writes with 409, 429 or 500: the cluster converges and no transition is applied
twice. The actuator opens no watch; dropped watch streams are exercised, with the informer in
the loop, by test_convergence.py.

Emulator only: the faults are injected by the emulator's server (``Sandbox.faults``), which a
real kube-apiserver has no way to do; the same transitions without faults run on both servers
in test_actuator.py and test_actuator_crash.py."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from rebalancer.core.outcomes import ActionResult, Outcome
from sandbox.emulator.faults import Faults
from sandbox.emulator.resources import NODES as NODE_RESOURCE
from sandbox.emulator.store import WatchRequest
from sandbox.emulator.watcher import Scope, Watcher
from tests.support.actuation import (
    EDGES,
    KEYS,
    STATE_OF_WRITE,
    Recorder,
    World,
    drive,
    restart_passes,
    world,
)
from tests.support.objects import training
from tests.support.reads import node_obj, pods_on, scheduling_of

NODES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
TRANSITIONS = 300  # applied state changes, across the nodes


def stored_states(server: Watcher) -> dict[str, list[str]]:
    states: dict[str, list[str]] = {}
    while not server.queue.empty():
        event = server.queue.get_nowait()
        assert event is not None
        assert event["type"] == "MODIFIED"
        meta = event["object"]["metadata"]
        states.setdefault(meta["name"], []).append(meta["labels"].get(KEYS.state, "serving"))
    return states


async def tick(w: World, rec: Recorder, node: str, jobs: Counter[str]) -> ActionResult:
    """What the planner would ask of ``node`` now: lend it if serving, take it back if lent,
    else drive what is in flight."""
    act = w.actuator(rec)
    phase = node_obj(w.objects, node)["metadata"]["labels"].get(KEYS.state)
    if phase is None:
        result = await act.lend(node, f"audit-{node}-{sum(jobs.values())}")
        if result.outcome is Outcome.APPLIED:
            jobs[node] += 1  # training lands on the lent node
            training(w.objects, f"job-{node}-{jobs[node]}", 2, node)
        return result
    if phase == "lent":
        return await act.reclaim(node, "audit-r", w.now() + timedelta(seconds=90))
    return await act.progress(node)


async def test_faulty_writes_never_apply_a_transition_twice_and_the_cluster_converges() -> None:
    async with world(*NODES) as w:
        originals = {n: scheduling_of(w.objects, n) for n in NODES}
        # The server's own record of every node write, in process (no HTTP, no dropped stream).
        since = str(w.box.store.resource_version)
        server = w.box.store.watch(
            WatchRequest(Scope(NODE_RESOURCE), resource_version=since, timeout=1e9)
        )
        w.box.faults.configure(
            Faults(
                conflict_rate=0.1, throttle_rate=0.1, error_rate=0.1, drop_watch_rate=0.1, seed=11
            )
        )
        rec, jobs = w.writer(), Counter[str]()
        results: list[ActionResult] = []
        while sum(len(s) for s in rec.states.values()) < TRANSITIONS:
            for node in NODES:
                results.append(await tick(w, rec, node, jobs))
            w.box.clock.advance(20)
        outcomes = Counter(r.outcome for r in results)
        assert outcomes[Outcome.CONFLICT] > 0  # the faults did bite
        assert outcomes[Outcome.APPLIED] > 0

        # Every applied state write follows an edge from the state before it.
        for node, states in rec.states.items():
            for before, after in zip(["serving", *states], states, strict=False):
                assert (before, after) in EDGES, (node, before, after)
        # Every write the cluster took is reported exactly once by the call that made it.
        reported = [
            STATE_OF_WRITE[x.kind] for r in results for x in r.applied if x.kind in STATE_OF_WRITE
        ]
        assert len(reported) == sum(len(s) for s in rec.states.values())
        assert Counter(reported) == Counter(s for v in rec.states.values() for s in v)
        # No call wrote the same transition twice.
        for result in results:
            kinds = Counter(x.kind for x in result.applied if x.kind in STATE_OF_WRITE)
            assert all(n == 1 for n in kinds.values()), result
        # The server stored exactly the node writes the actuator saw succeed, in that order.
        assert stored_states(server) == rec.states

        # The faults stop; a restart ends what is in flight and every lent node is taken back.
        w.box.faults.configure(Faults())
        restarted = w.writer()
        act = w.actuator(restarted)
        for result in await restart_passes(act, restarted):
            await drive(act, result.node, result, w)
        for node in NODES:
            if node_obj(w.objects, node)["metadata"]["labels"].get(KEYS.state) == "lent":
                await drive(act, node, await act.reclaim(node, "audit-end", w.now()), w)
        for node in NODES:
            assert scheduling_of(w.objects, node) == originals[node]
            assert set(pods_on(w.objects, node)) == {f"kube-system/gpu-exporter-{node}"}
