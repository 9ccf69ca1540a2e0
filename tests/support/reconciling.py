"""The reconcile step's world for the tests that drive it tick by tick: the API emulator over
HTTP with the default inference pool (daemon pods everywhere, replicas on the busy nodes), the
real informer, a leader-gated actuator, a scripted demand and an in-memory audit store whose
journal, with the emulator's record of each node write it took, tells in what order the
intents were committed and the nodes changed (``tests/runtime/test_reconcile.py`` and the suites
beside it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from kubernetes_asyncio import client

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.adapters.gate import LeaderGatedWriter
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, NodeWriter, RetryPolicy
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Term
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import PoolConfig
from sandbox.emulator import cluster
from sandbox.emulator.server import Request
from sandbox.emulator.store import Store
from sandbox.emulator.views import expected_views
from tests.support import emulated, pools
from tests.support.emulated import Sandbox
from tests.support.fakes import Demand, Entry, JournalStore, Lead
from tests.support.objects import daemon_pod
from tests.support.observers import Seen
from tests.support.pools import BUSY, IDLE, KEYS, MARKS, POOL, SPEC, add_replicas
from tests.support.reads import scheduling_of
from tests.support.waits import Pulse, no_sleep, stop

CONFIG = pools.reactive_pool()
LOW, HIGH = pools.LOW, pools.HIGH


def journal_node_writes(journal: list[Entry]) -> Callable[[Request], None]:
    """An emulator request observer that notes, in ``journal``, each node patch the server
    took, with the decision and state it left on the node."""

    def note(request: Request) -> None:
        if request.resource != "nodes" or request.verb != "patch" or not emulated.taken(request):
            return
        assert request.response is not None
        meta = request.response["metadata"]
        decision = (meta.get("annotations") or {}).get(KEYS.decision, "")
        state = (meta.get("labels") or {}).get(KEYS.state, "serving")
        journal.append(("node", meta["name"], decision, state))

    return note


@dataclass
class World:
    box: Sandbox
    informer: Informer
    pulse: Pulse
    metrics: Demand
    lead: Lead
    audit: JournalStore
    journal: list[Entry]
    reconciler: Reconciler
    originals: dict[str, tuple[str, str]]
    writer: NodeWriter
    seen: Seen

    @property
    def store(self) -> Store:
        return self.box.store

    async def caught_up(self) -> None:
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(self.store, MARKS)
        )

    async def tick(self) -> TickReport:
        await self.caught_up()
        report = self.seen.record(await self.reconciler.tick())
        await self.caught_up()
        return report

    def advance(self, seconds: float) -> None:
        self.box.clock.advance(seconds)
        self.store.schedule()

    def node_writes(self) -> list[Entry]:
        return [e for e in self.journal if e[0] == "node"]

    def records(self, kind: Kind) -> list[AuditRecord]:
        return [r for r in self.audit.records if r.kind is kind]


def add_training(store: Store, jobs: int) -> None:
    """One training pod per job, scheduled at once by the emulator onto the nodes lent."""
    for job in range(jobs):
        cluster.add(store, cluster.training_pod(f"job-{job}", 0, priority_class=None))
    store.schedule()


def make_reconciler(
    box: Sandbox,
    writer: NodeWriter,
    informer: Informer,
    metrics: Demand,
    lead: Lead,
    store: MemoryAuditStore,
    config: PoolConfig = CONFIG,
) -> Reconciler:
    actuator = Actuator(writer, KEYS, SPEC, MARKS, box.clock)
    return Reconciler(
        [config],
        observer=Observer([config], views=informer, metrics=metrics, keys=KEYS),
        clock=box.clock,
        actuators={POOL: actuator},
        audit_log=AuditLog(store, sink=None, new_id=UlidFactory(box.clock)),
        leadership=lead,
        keys=KEYS,
    )


@asynccontextmanager
async def world(config: PoolConfig = CONFIG) -> AsyncIterator[World]:
    journal: list[Entry] = []
    async with emulated.running(seeded=True, on_request=journal_node_writes(journal)) as box:
        store = box.store
        for name in (*BUSY, *IDLE):
            cluster.add(store, daemon_pod(name))
        add_replicas(store)
        originals = {name: scheduling_of(store, name) for name in (*BUSY, *IDLE)}
        pulse = Pulse()
        informer = Informer(
            box.api, settings=WatchSettings(timeout_seconds=86_400), on_change=pulse
        )
        metrics = Demand({POOL: LOW}, box.clock)
        lead = Lead(box.clock, term=Term("replica-a", 3, box.clock()))
        kube = KubeWriter(client.CoreV1Api(box.api), RetryPolicy(sleep=no_sleep))
        writer = LeaderGatedWriter(kube, lead.may_write, box.clock, lead.identity)
        audit = JournalStore(journal)
        seen = Seen()
        reconciler = make_reconciler(box, writer, informer, metrics, lead, audit, config)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            yield World(
                box,
                informer,
                pulse,
                metrics,
                lead,
                audit,
                journal,
                reconciler,
                originals,
                writer,
                seen,
            )
        finally:
            await stop(task)
