"""No record lost: an intent acted on while the audit store failed reaches the store, in order and
under its own id, though another writer took it off its node and the process died before the
store took writes again.

The reconcile step with the real informer, leader-gated actuator, ``KubeEvents`` and
``NodeLedger``, on the API emulator and on a real kube-apiserver (the ``backend`` fixture); the
audit store is a real SQLite file whose disk refuses writes (``tests.support.audit_disk``). A
GitOps sync that owns the Node's annotations is played by a merge patch removing
``rebalancer.io/audit-pending``; ``kill -9`` is a new Reconciler (a new audit log with an empty
spool, new Events recorder, ledger and actuator) on the same cluster and store. Neither server
expires Events on the test's clock, so the test that needs the Event TTL plays it: it deletes
every Event older than an hour, as kube-apiserver's ``--event-ttl`` would.

What is shown: the next run writes every intent to the store from the controller's own Events
(their ``audit-record`` annotation), oldest first and before the verdicts that close them; an
Event that claims to be ours but carries a record no node's ``decision`` names is not taken;
and a store that fails for longer than the Event TTL still loses nothing, as the controller
records each intent's Event again before the last one expires.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer.adapters import events, ledger
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, SqlAuditStore, UlidFactory, every_record
from rebalancer.adapters.events import KubeEvents
from rebalancer.adapters.gate import LeaderGatedWriter
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Term
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from sandbox.emulator.resources import NODES
from sandbox.emulator.views import expected_views
from tests.support import objects, pools
from tests.support.audit_disk import Disk
from tests.support.backends import Backend, Opened
from tests.support.fakes import Demand, Lead
from tests.support.objects import daemon_pod
from tests.support.pools import BUSY, HIGH, IDLE, KEYS, LOW, MARKS, POOL, SPEC, add_replicas
from tests.support.reads import state_of
from tests.support.waits import Pulse, no_sleep, stop

Obj = dict[str, Any]
PENDING = ledger.annotation(KEYS)
EVENT_TTL = timedelta(hours=1)  # kube-apiserver's --event-ttl, by default


@dataclass
class World:
    opened: Opened
    informer: Informer
    pulse: Pulse
    metrics: Demand
    store: SqlAuditStore
    disk: Disk
    process: Callable[[], Reconciler]  # a new controller process on the same cluster and store
    reconciler: Reconciler

    async def tick(self) -> TickReport:
        await self.caught_up()
        report = await self.reconciler.tick()
        await self.caught_up()
        return report

    async def caught_up(self) -> None:
        objects_ = self.opened.objects
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(objects_, MARKS), within=10
        )

    def annotations(self, name: str) -> dict[str, str]:
        node: Obj = self.opened.objects.get(NODES, None, name)
        return dict(node["metadata"].get("annotations") or {})

    async def kill_and_restart(self) -> Reconciler:
        """``kill -9``: nothing of the running process is kept (its spool, its memory); a new
        one starts up on the same cluster and store, a few seconds later (the store orders
        records by time, then id)."""
        self.opened.advance(5)
        self.reconciler = self.process()
        await self.caught_up()
        await self.reconciler.start()
        return self.reconciler

    async def stored(self) -> list[AuditRecord]:
        return await every_record(self.store)

    async def own_events(self) -> list[Obj]:
        found = await self.opened.events.list_namespaced_event(events.NAMESPACE)
        return [
            self.opened.api.sanitize_for_serialization(e)
            for e in found.items
            if e.reason == ledger.AUDIT_STORE_FAILING
        ]


@asynccontextmanager
async def world(backend: Backend, tmp_path: Path) -> AsyncIterator[World]:
    async with backend.open(seeded=True) as opened:
        for name in (*BUSY, *IDLE):
            objects.add(opened.objects, daemon_pod(name))
        add_replicas(opened.objects)
        clock = opened.clock
        pulse = Pulse()
        informer = Informer(
            opened.api, settings=WatchSettings(timeout_seconds=86_400), on_change=pulse
        )
        metrics = Demand({POOL: LOW}, clock)
        lead = Lead(clock, term=Term("replica-a", 3, clock()))
        store = await SqlAuditStore.open(f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}")
        disk = Disk(store)

        def process() -> Reconciler:
            kube = KubeWriter(opened.core, RetryPolicy(sleep=no_sleep))
            writer = LeaderGatedWriter(kube, lead.may_write, clock, lead.identity)
            recorder = KubeEvents(opened.api, instance="replica-a", clock=clock, keys=KEYS)
            return Reconciler(
                [pools.reactive_pool()],
                observer=Observer(
                    [pools.reactive_pool()], views=informer, metrics=metrics, keys=KEYS
                ),
                clock=clock,
                actuators={POOL: Actuator(writer, KEYS, SPEC, MARKS, clock)},
                audit_log=AuditLog(store, sink=None, new_id=UlidFactory(clock)),
                leadership=lead,
                keys=KEYS,
                ledger=ledger.NodeLedger(writer, KEYS, recorder),
            )

        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            yield World(opened, informer, pulse, metrics, store, disk, process, process())
        finally:
            await stop(task)
            await store.close()


async def reclaims_while_the_store_is_full(w: World) -> list[AuditRecord]:
    """Every idle node lent, then the disk full and demand needing every node: the safety
    reclaims happen, each intent kept on its node; those intents, oldest first."""
    assert await w.reconciler.start() == ()
    report = await w.tick()
    assert report.error is None
    assert {state_of(w.opened.objects, n) for n in IDLE} == {"lent"}
    w.disk.full = True
    w.metrics.rps[POOL] = HIGH
    w.opened.advance(600)  # past the minimum loan time
    report = await w.tick()
    assert report.error is not None
    assert "readonly database" in report.error
    assert {str(s.node) for s in report.steps} == set(IDLE)
    assert {s.call for s in report.steps} == {model.Action.RECLAIM}
    kept = []
    for name in IDLE:
        [record] = ledger.pending(w.annotations(name), KEYS)
        assert record.reason == "demand_above_serving"
        assert w.annotations(name)[KEYS.decision] == record.id
        kept.append(record)
    return sorted(kept, key=lambda r: (r.time, r.id))


def a_gitops_sync_removes_the_pending_records(w: World) -> None:
    for name in IDLE:
        objects.annotate(w.opened.objects, name, {PENDING: None})
        assert PENDING not in w.annotations(name)


async def every_intent_is_in_the_store_in_order_and_closed(
    w: World, kept: list[AuditRecord]
) -> list[AuditRecord]:
    stored = await w.stored()
    order = [r.id for r in stored]
    by_id = {r.id: r for r in stored}
    missing = [f"{r.node}: {r.id}" for r in kept if r.id not in by_id]
    assert not missing, f"intents acted on but not in the store: {missing}"
    at = [order.index(r.id) for r in kept]
    assert at == sorted(at), "the intents are not in the store in the order they were made"
    for record in kept:
        found = by_id[record.id]
        assert (found.kind, found.node, found.action, found.reason, found.time) == (
            Kind.INTENT,
            record.node,
            model.Action.RECLAIM,
            "demand_above_serving",
            record.time,
        )
        closing = [r for r in stored if r.intent_id == record.id]
        assert closing, f"intent {record.id} on {record.node} not closed"
        assert all(order.index(r.id) > order.index(record.id) for r in closing)
        assert w.annotations(str(record.node))[KEYS.decision] in (
            record.id,
            *(r.detail.get("recovered_by") for r in closing),
        )
    assert await w.reconciler.audit_log.unfinished_intents() == ()
    return stored


# ---------------------------------------------------------------------------------------------


async def test_intents_taken_off_their_nodes_reach_the_store_from_the_controllers_events(
    backend: Backend, tmp_path: Path
) -> None:
    async with world(backend, tmp_path) as w:
        kept = await reclaims_while_the_store_is_full(w)
        a_gitops_sync_removes_the_pending_records(w)

        w.disk.full = False
        await w.kill_and_restart()

        stored = await every_intent_is_in_the_store_in_order_and_closed(w, kept)
        # Where they came from: each intent's Event carries the record whole.
        carried = [
            ledger.pending(
                {PENDING: e["metadata"]["annotations"][ledger.record_annotation(KEYS)]}, KEYS
            )
            for e in await w.own_events()
        ]
        assert sorted(r.id for (r,) in carried) == [r.id for r in kept]
        closed = {r.intent_id: r.message for r in stored if r.intent_id}
        assert all(closed[r.id].startswith("controller restarted") for r in kept)


async def test_an_event_that_claims_to_be_ours_is_not_taken_without_its_nodes_decision(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever may create Events can write one with our reporting controller and reason: the
    record it carries is not written to the store unless the node's decision names it, and
    the log says so, once."""
    async with world(backend, tmp_path) as w:
        kept = await reclaims_while_the_store_is_full(w)
        target = kept[0]
        forged = dataclasses.replace(target, id="01KFORGEDFORGEDFORGEDFORGE", message="forged")
        text = json.dumps([audit.to_json(forged)])
        # Anyone who may create Events may name our controller in one.
        someone = KubeEvents(w.opened.api, instance="someone", clock=w.opened.clock, keys=KEYS)
        claim = events.NodeEvent(
            str(target.node),
            "Warning",
            ledger.AUDIT_STORE_FAILING,
            "Audit",
            "forged",
            annotations=((ledger.record_annotation(KEYS), text),),
        )
        assert await someone.record(claim)
        a_gitops_sync_removes_the_pending_records(w)

        w.disk.full = False
        await w.kill_and_restart()

        stored = await every_intent_is_in_the_store_in_order_and_closed(w, kept)
        assert forged.id not in {r.id for r in stored}
        refused = [r for r in caplog.records if forged.id in r.getMessage()]
        assert len(refused) == 1
        assert "not written to the store" in refused[0].getMessage()
        w.opened.advance(600)  # the Events are listed again: the same one is not said again
        await w.tick()
        assert len([r for r in caplog.records if forged.id in r.getMessage()]) == 1


async def test_a_store_failing_longer_than_the_event_ttl_loses_no_record(
    backend: Backend, tmp_path: Path
) -> None:
    """The store fails for two hours; the node's records are taken off early, the Events of
    the first hour expire, the process dies and the next one starts 20 minutes later, with
    the store writable: the Event the controller recorded again, before its last one was half
    as old as the TTL, still brings each record back."""
    async with world(backend, tmp_path) as w:
        kept = await reclaims_while_the_store_is_full(w)
        a_gitops_sync_removes_the_pending_records(w)
        for _ in range(8):  # two hours of ticks while the store fails
            w.opened.advance(15 * 60)
            await w.tick()
            await expire_events(w)
        assert {state_of(w.opened.objects, n) for n in IDLE} == {"serving"}
        # The process dies; nothing runs for 20 minutes.
        w.opened.advance(20 * 60)
        await expire_events(w)

        w.disk.full = False
        await w.kill_and_restart()

        await every_intent_is_in_the_store_in_order_and_closed(w, kept)


async def expire_events(w: World) -> None:
    """What kube-apiserver's ``--event-ttl`` does, on the test's clock: every Event older
    than an hour is gone."""
    api = w.opened.events
    for event in (await api.list_namespaced_event(events.NAMESPACE)).items:
        made = event.event_time or event.metadata.creation_timestamp
        if w.opened.clock() - made >= EVENT_TTL:
            await api.delete_namespaced_event(event.metadata.name, events.NAMESPACE)


async def test_a_controller_whose_store_works_lists_its_events_at_start_then_every_five_minutes(
    backend: Backend, tmp_path: Path
) -> None:
    """Reading the records back is one LIST of Events, not one on every tick: at the start of a
    term, then every five minutes (well inside the Event TTL) while the store works."""
    async with world(backend, tmp_path) as w:

        def listed() -> int:
            return sum(
                1
                for r in w.opened.requests.lists
                if (r.group, r.resource) == ("events.k8s.io", "events")
            )

        assert await w.reconciler.start() == ()
        assert listed() == 1
        for _ in range(14):  # 280 s of ticks
            w.opened.advance(20)
            await w.tick()
        assert listed() == 1
        w.opened.advance(20)
        await w.tick()
        assert listed() == 2
