"""The audit log tells the truth across ``kill -9``: the controller process killed at random points.

The controller (``tests.support.harness``) runs against the emulator with 150 ms added to every
API request, training pods waiting for GPUs and demand flipping between low and high every 1.5 s,
so kills land in the middle of lends, rollbacks, reclaims and drains. It is killed with SIGKILL
``KILLS`` times, each a seeded random moment after it became ready, and started again; at the end
one more run takes every node back and stops cleanly.

The truth is checked against the API server's own record, not the controller's: a watch on the
nodes, opened before the first run, sees every transition of every node (its state label
changing), and each one carries the ``rebalancer.io/decision`` annotation of the write that made
it. For every transition that decision must name an intent on record for that node, with
exactly one final outcome (``in_progress`` passes aside) that says what happened; no intent may
be left open; and once reclaimed every node must be byte for byte as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import Outcome
from sandbox.emulator.faults import Faults
from tests.support.harness import INFERENCE, LOW, PEAK, STATE, Harness, harness
from tests.support.reads import scheduling
from tests.support.waits import until

KILLS = 20
SEED = 2026
DECISION = "rebalancer.io/decision"
FLIP = 1.5  # seconds between demand flips


@dataclass(frozen=True)
class Seen:
    """One node as a watch event showed it."""

    node: str
    state: str  # "serving" when the label is absent
    decision: str | None
    version: int


async def watch_nodes(h: Harness, seen: list[Seen]) -> None:
    """List, then watch every node from that version, until cancelled."""
    listed = await h.get("/api/v1/nodes")
    for n in listed["items"]:
        seen.append(_seen(n))
    version = listed["metadata"]["resourceVersion"]
    while True:
        query = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "600"}
        async with h.session.get(h.url + "/api/v1/nodes", params=query) as r:
            async for line in r.content:
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED"):
                    seen.append(_seen(event["object"]))
                    version = event["object"]["metadata"]["resourceVersion"]


def _seen(node: dict[str, Any]) -> Seen:
    meta = node["metadata"]
    return Seen(
        node=meta["name"],
        state=(meta.get("labels") or {}).get(STATE, "serving"),
        decision=(meta.get("annotations") or {}).get(DECISION),
        version=int(meta["resourceVersion"]),
    )


# What the final outcome of the intent behind each kind of transition may say: the node did move
# under it, so "superseded" (never carried out) is never true of one.
TRUTHFUL = {
    ("serving", "lending"): {
        ("lend", o) for o in ("applied", "interrupted", "refused", "conflict", "failed")
    },
    ("lending", "lent"): {("lend", "applied")},
    ("lending", "serving"): {("rollback", "applied"), ("lend", "refused")},
    ("lent", "reclaiming"): {
        ("reclaim", o) for o in ("applied", "interrupted", "conflict", "failed")
    },
    ("reclaiming", "serving"): {("reclaim", "applied")},
}


def transitions(seen: list[Seen]) -> list[tuple[Seen, Seen]]:
    """(before, after) for every change of a node's state, in the order the server made them."""
    last: dict[str, Seen] = {}
    out = []
    for s in sorted(seen, key=lambda s: s.version):
        before = last.get(s.node)
        if before is not None and before.state != s.state:
            out.append((before, s))
        last[s.node] = s
    return out


async def flip_demand(h: Harness) -> None:
    while True:
        for rps in (LOW, PEAK):
            h.exporter.set_load(rps, 0)
            await asyncio.sleep(FLIP)


async def test_kill_9_at_random_points_leaves_every_transition_with_one_intent_and_outcome(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    began = time.monotonic()
    seen: list[Seen] = []
    async with harness(tmp_path, faults=Faults(latency=0.15)) as h:
        originals = {name: scheduling(n) for name, n in (await h.nodes()).items()}
        # As much churn as the emulator allows: no cooldown, lends and reclaims each tick.
        config = h.config(limits={"cooldown": "0s", "drop_hold": "0s", "reclaim_deadline": "3s"})
        watcher = asyncio.create_task(watch_nodes(h, seen))
        flipper = asyncio.create_task(flip_demand(h))
        try:
            # Each run's process is started, held, while the run before it goes on (its imports
            # take seconds of a loaded machine's CPU), and let go once that one is killed.
            held = await h.held(config)
            try:
                for kill in range(1, KILLS + 1):
                    c = await h.let_go(held)
                    if kill < KILLS:
                        held = await h.held(config)
                    await asyncio.sleep(rng.uniform(0.3, 2.0))
                    await h.kill(c)
            finally:
                await h.kill(held)  # the next, if one was started (the last is killed already)
            flipper.cancel()
            h.exporter.set_load(PEAK, 0)  # the last run takes every node back and stops
            async with h.controller(config) as c:
                await h.wait_all_serving(c, within=60)
                await until("a quiet tick", lambda: _quiet(h), c.proc, 10)
            await asyncio.sleep(0.5)  # the watch catches up with the last writes
        finally:
            for task in (watcher, flipper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await task
        nodes = await h.nodes()
        records = await h.records()

    intents = {r.id: r for r in records if r.kind is Kind.INTENT}
    finals: dict[str, list[AuditRecord]] = defaultdict(list)
    closed: set[str] = set()
    for r in records:
        if r.kind is Kind.OUTCOME and r.intent_id is not None:
            closed.add(r.intent_id)
            if r.outcome != Outcome.IN_PROGRESS.value:
                finals[r.intent_id].append(r)
    assert set(intents) - closed == set(), "no intent is left open"
    assert set(intents) - set(finals) == set(), "every intent has its final outcome"
    moves = transitions(seen)
    problems = []
    for before, after in moves:
        intent = intents.get(after.decision or "")
        if intent is None or intent.node != after.node:
            problems.append(
                f"{after.node} {before.state}->{after.state}: no intent {after.decision}"
            )
            continue
        outcomes = [o.outcome for o in finals[intent.id]]
        move = f"{after.node} {before.state}->{after.state} under {intent.action} {intent.id}"
        if len(outcomes) != 1:
            problems.append(f"{move}: final outcomes {outcomes}")
        elif (intent.action, outcomes[0]) not in TRUTHFUL.get((before.state, after.state), ()):
            problems.append(f"{move}: says {outcomes[0]}")
    assert problems == [], problems
    for name in INFERENCE:
        assert scheduling(nodes[name]) == originals[name], name
    by_outcome: dict[str, int] = defaultdict(int)
    for final in finals.values():
        by_outcome[str(final[0].outcome)] += 1
    recoveries = sum(1 for r in intents.values() if r.origin == "recovery")
    print(
        f"\nkill -9: {KILLS} kills, {len(moves)} transitions in the watch stream, "
        f"{len(intents)} intents ({recoveries} recoveries) and their outcomes matched "
        f"{dict(sorted(by_outcome.items()))}, 0 open, all {len(INFERENCE)} nodes restored; "
        f"{time.monotonic() - began:.1f}s"
    )


async def _quiet(h: Harness) -> bool:
    return await h.serving() == set(INFERENCE)
