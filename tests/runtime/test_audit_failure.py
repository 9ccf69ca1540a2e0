"""Inference does not wait on the disk: the reconcile step with an audit store that refuses writes.

A real SQLite store (a file in a temp dir) is made to refuse every write as a full or read-only
disk does, by ``PRAGMA query_only`` on each connection it hands out (SQLite answers "attempt to
write a readonly database"); lifting it is the disk freed. The cluster is the API emulator over
HTTP with the real informer, actuator, Events and the real ``NodeLedger``; the metrics are
scripted; ``Telemetry`` is the real one.

What is shown: with demand needing every node, the lent nodes are taken back in the same tick
the store fails, each intent recorded on its node (the ``audit-pending`` annotation, naming the
record the ``decision`` annotation names), in a Warning Event and on stdout before its first
write; nothing is lent; the traceback is logged once; the gauge and readiness say so; once the
store takes writes, it holds every record, ids kept, in the order they were made, and the nodes
carry none. A run that dies before that loses nothing: the next one reads the records back from
the nodes. A full spool stops what it cannot record.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import events, ledger
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, SqlAuditStore, UlidFactory, every_record
from rebalancer.adapters.events import KubeEvents
from rebalancer.adapters.gate import LeaderGatedWriter
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Term
from rebalancer.runtime import http
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.telemetry import Telemetry
from sandbox.emulator import cluster
from sandbox.emulator.resources import NODES
from sandbox.emulator.views import expected_views
from tests.support import emulated, pools
from tests.support.audit_disk import Disk
from tests.support.emulated import Sandbox
from tests.support.fakes import Demand, Lead
from tests.support.objects import daemon_pod
from tests.support.pools import BUSY, IDLE, KEYS, MARKS, POOL, SPEC, add_replicas
from tests.support.reads import scheduling_of, state_of
from tests.support.waits import Pulse, no_sleep, stop

Obj = dict[str, Any]
CONFIG = pools.reactive_pool()
LOW, HIGH = pools.LOW, pools.HIGH
PENDING = ledger.annotation(KEYS)


@dataclass
class World:
    box: Sandbox
    informer: Informer
    pulse: Pulse
    metrics: Demand
    store: SqlAuditStore
    disk: Disk
    log: AuditLog
    lines: list[str]
    telemetry: Telemetry
    reconciler: Reconciler
    originals: dict[str, tuple[str, str]]
    make: Any  # () -> a new Reconciler on the same cluster and store: a restarted process

    async def tick(self) -> TickReport:
        await self.caught_up()
        report = await self.reconciler.tick()
        self.telemetry.record(report)
        await self.caught_up()
        return report

    async def caught_up(self) -> None:
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(self.box.store, MARKS)
        )

    def node(self, name: str) -> Obj:
        found: Obj = self.box.store.get(NODES, None, name)
        return found

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("annotations") or {})

    async def stored(self) -> list[AuditRecord]:
        return await every_record(self.store)

    def gauge(self, name: str) -> float | None:
        return self.telemetry.registry.get_sample_value(name)


@asynccontextmanager
async def world(tmp_path: Path, spool_limit: int = 10_000) -> AsyncIterator[World]:
    async with emulated.running(seeded=True) as box:
        for name in (*BUSY, *IDLE):
            cluster.add(box.store, daemon_pod(name))
        add_replicas(box.store)
        originals = {name: scheduling_of(box.store, name) for name in (*BUSY, *IDLE)}
        pulse = Pulse()
        informer = Informer(
            box.api, settings=WatchSettings(timeout_seconds=86_400), on_change=pulse
        )
        metrics = Demand({POOL: LOW}, box.clock)
        lead = Lead(box.clock, term=Term("replica-a", 3, box.clock()))
        kube = KubeWriter(client.CoreV1Api(box.api), RetryPolicy(sleep=no_sleep))
        writer = LeaderGatedWriter(kube, lead.may_write, box.clock, lead.identity)
        store = await SqlAuditStore.open(f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}")
        disk = Disk(store)
        lines: list[str] = []
        telemetry = Telemetry()
        recorder = KubeEvents(box.api, instance="replica-a", clock=box.clock, keys=KEYS)

        def make(log: AuditLog) -> Reconciler:
            return Reconciler(
                [CONFIG],
                observer=Observer([CONFIG], views=informer, metrics=metrics, keys=KEYS),
                clock=box.clock,
                actuators={POOL: Actuator(writer, KEYS, SPEC, MARKS, box.clock)},
                audit_log=log,
                leadership=lead,
                keys=KEYS,
                ledger=ledger.NodeLedger(writer, KEYS, recorder),
            )

        def new_log() -> AuditLog:
            return AuditLog(
                store, sink=lines.append, new_id=UlidFactory(box.clock), spool_limit=spool_limit
            )

        first = new_log()
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            yield World(
                box,
                informer,
                pulse,
                metrics,
                store,
                disk,
                first,
                lines,
                telemetry,
                make(first),
                originals,
                lambda: make(new_log()),
            )
        finally:
            await stop(task)
            await store.close()


async def lend_every_idle_node(w: World) -> None:
    assert await w.reconciler.start() == ()
    w.metrics.rps[POOL] = LOW
    report = await w.tick()
    assert report.error is None
    assert {str(s.node) for s in report.steps} == set(IDLE)
    assert {state_of(w.box.store, n) for n in IDLE} == {"lent"}


async def store_failing_events(w: World) -> list[Any]:
    found = await client.EventsV1Api(w.box.api).list_namespaced_event(events.NAMESPACE)
    return [e for e in found.items if e.reason == ledger.AUDIT_STORE_FAILING]


# ---------------------------------------------------------------------------------------------


async def test_a_full_audit_disk_does_not_hold_back_the_reclaims_that_keep_inference_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with world(tmp_path) as w:
        await lend_every_idle_node(w)
        before = {r.id for r in await w.stored()}
        w.disk.full = True
        w.metrics.rps[POOL] = HIGH  # demand needs all 8 nodes
        w.box.clock.advance(600)  # past the minimum loan time

        caplog.set_level(logging.INFO, logger="rebalancer.runtime.reconcile")
        report = await w.tick()

        # The same tick: every lent node is taken back, though no record reached the store.
        assert report.error is not None
        assert "readonly database" in report.error
        assert {str(s.node) for s in report.steps} == set(IDLE)
        assert {s.call for s in report.steps} == {model.Action.RECLAIM}
        for name in IDLE:
            assert state_of(w.box.store, name) in ("reclaiming", "serving")
            assert scheduling_of(w.box.store, name)[0] == w.originals[name][0]  # taints back
        assert {r.id for r in await w.stored()} == before  # the store took nothing
        # Each intent is on its node, named by its decision, in an Event, and on stdout.
        intents = {}
        for name in IDLE:
            notes = w.annotations(name)
            [kept] = json.loads(notes[PENDING])
            assert kept["kind"] == "intent"
            assert kept["action"] == "reclaim"
            assert kept["reason"] == "demand_above_serving"
            assert kept["node"] == name
            assert notes[KEYS.decision] == kept["id"]
            intents[name] = kept["id"]
        warned = await store_failing_events(w)
        assert sorted(e.regarding.name for e in warned) == sorted(IDLE)
        assert all(e.type == "Warning" and intents[e.regarding.name] in e.note for e in warned)
        printed = [json.loads(line)["id"] for line in w.lines]
        assert set(intents.values()) <= set(printed)
        # The gauge, the spool and readiness say the store fails.
        assert w.gauge("rebalancer_audit_store_failing") == 1
        assert w.gauge("rebalancer_audit_spooled_records") == len(w.log.spool) >= len(IDLE)
        ready = http.readiness(True, True, "replica-a", w.log.failing)
        assert ready.ready
        assert "the audit store fails" in ready.reason

        # Still failing: the drain goes on, nothing is lent, and no second traceback.
        w.metrics.rps[POOL] = LOW
        w.box.store.schedule()
        report = await w.tick()
        assert report.error is not None
        assert not [s for s in report.steps if s.call is model.Action.LEND]
        tracebacks = [r for r in caplog.records if r.exc_info and "audit store" in r.message]
        assert len(tracebacks) == 1

        # The disk is freed: the store gets every record, ids kept, in the order made.
        spooled = [r.id for r in w.log.spool]
        w.disk.full = False
        await w.tick()
        stored = await w.stored()
        new = [r.id for r in stored if r.id not in before]
        assert new[: len(spooled)] == spooled
        assert spooled == sorted(spooled)  # made in this order (ids increase in a process)
        by_id = {r.id: r for r in stored}
        for name, ident in intents.items():
            assert by_id[ident].kind is Kind.INTENT
            assert by_id[ident].node == name
            closes = [r for r in stored if r.intent_id == ident]
            assert closes
            assert all(new.index(r.id) > new.index(ident) for r in closes)
            assert PENDING not in w.annotations(name)
        assert w.log.spool == []
        assert w.gauge("rebalancer_audit_store_failing") == 0


async def test_a_run_that_dies_before_the_store_recovers_loses_nothing_the_nodes_carry_it(
    tmp_path: Path,
) -> None:
    async with world(tmp_path) as w:
        await lend_every_idle_node(w)
        w.disk.full = True
        w.metrics.rps[POOL] = HIGH
        w.box.clock.advance(600)
        report = await w.tick()
        taken = {str(s.node): s.intent.id for s in report.steps if s.intent is not None}
        assert set(taken) == set(IDLE)
        # The process dies here: its spool is gone. The disk is freed; a new run starts.
        w.disk.full = False
        again = w.make()
        await w.caught_up()
        await again.start()

        stored = {r.id: r for r in await w.stored()}
        for name, ident in taken.items():
            assert stored[ident].kind is Kind.INTENT
            assert stored[ident].node == name
            assert any(r.intent_id == ident for r in stored.values())  # judged: closed
            assert PENDING not in w.annotations(name)
        assert await again.audit_log.unfinished_intents() == ()


async def test_a_full_spool_stops_what_it_cannot_record_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with world(tmp_path, spool_limit=2) as w:
        await lend_every_idle_node(w)
        w.disk.full = True
        w.metrics.rps[POOL] = HIGH
        w.box.clock.advance(600)
        report = await w.tick()

        carried = {str(s.node) for s in report.steps}
        # Two intents fit; each step's outcome then finds the spool full and is logged.
        assert len(carried) == 2
        for name in set(IDLE) - carried:
            assert state_of(w.box.store, name) == "lent"  # not touched: no record anywhere
            assert PENDING not in w.annotations(name)
        assert "the audit spool is full" in caplog.text
        overflows = w.gauge("rebalancer_audit_spool_overflows_total")
        assert overflows is not None
        assert overflows >= len(IDLE) - 2
