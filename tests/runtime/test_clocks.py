"""The reconcile step with a controller clock that is wrong: 90 s behind, 10 min ahead.

The cluster is the API emulator over HTTP on its own clock (the true time, which its ``Date``
headers state), with the real informer, writer and actuator; Prometheus is a fake that
scrapes on the true time too (``fakes.ClockedPrometheus``). The controller's own clock is the
true one plus an offset; it measures both skews as it runs (``kubeclient.ClockProbe`` on
every answer of the emulator, ``time()`` of the fake Prometheus), and must:

- read samples at Prometheus' now and age them on it: behind, an old sample is not fresh and
  a rise of demand is seen at once; ahead, fresh samples are not "lost";
- lend nothing past the bound, naming the clock, and still take loans back;
- write no ``since`` in the future of the API server's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from kubernetes_asyncio import client

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.kubeclient import ClockProbe
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import clocks, model, nodestate
from rebalancer.core.audit import Kind
from rebalancer.core.model import Clock, PoolName, Reason, Term
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from sandbox.emulator import cluster
from sandbox.emulator.views import expected_views
from tests.support import emulated, pools
from tests.support.emulated import Sandbox
from tests.support.fakes import ClockedPrometheus, Lead
from tests.support.objects import daemon_pod
from tests.support.pools import BUSY, IDLE, KEYS, MARKS, POOL, SPEC, add_replicas
from tests.support.reads import state_of
from tests.support.waits import Pulse, no_sleep, stop

CONFIG = pools.reactive_pool()
LOW, HIGH = pools.LOW, pools.HIGH
BEHIND, AHEAD = -90.0, 600.0


@dataclass
class Replica:
    """One controller: its own clock, the probe of the API server's, its reconciler."""

    own: Clock
    probe: ClockProbe
    reconciler: Reconciler
    audit: MemoryAuditStore


@dataclass
class World:
    box: Sandbox
    informer: Informer
    pulse: Pulse
    prometheus: ClockedPrometheus

    async def tick(self, replica: Replica) -> TickReport:
        await self.caught_up()
        self.prometheus.scrape()
        report = await replica.reconciler.tick()
        await self.caught_up()
        return report

    async def caught_up(self) -> None:
        store = self.box.store
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(store, MARKS)
        )

    def advance(self, seconds: float) -> None:
        self.box.clock.advance(seconds)
        self.box.store.schedule()
        self.prometheus.scrape()

    def replica(self, offset: float, bound: timedelta = clocks.DEFAULT_BOUND) -> Replica:
        """A controller whose clock is ``offset`` seconds off the true time."""
        box = self.box

        def own() -> datetime:
            return box.clock() + timedelta(seconds=offset)

        probe = ClockProbe(own)
        probe.watch(box.api)
        kube = KubeWriter(client.CoreV1Api(box.api), RetryPolicy(sleep=no_sleep))
        store = MemoryAuditStore()
        # Prometheus is read by this replica from now on, its clock timed on this one's.
        self.prometheus.own = own
        self.prometheus.estimator = clocks.Estimator(clocks.Against.PROMETHEUS)
        reconciler = Reconciler(
            [CONFIG],
            observer=Observer(
                [CONFIG],
                views=self.informer,
                metrics=self.prometheus,
                apiserver_clock=probe,
                prometheus_clock=self.prometheus,
                clock_bound=bound,
                keys=KEYS,
            ),
            clock=probe.now,
            actuators={POOL: Actuator(kube, KEYS, SPEC, MARKS, probe.now)},
            audit_log=AuditLog(store, sink=None, new_id=UlidFactory(own)),
            leadership=Lead(own, term=Term(f"replica{offset:+.0f}", 1, own())),
            keys=KEYS,
        )
        return Replica(own, probe, reconciler, store)

    def sinces(self) -> dict[str, datetime]:
        found: dict[str, datetime] = {}
        for view in self.informer.node_views(MARKS):
            state = nodestate.read(view, KEYS)
            assert isinstance(state, nodestate.NodeState)
            if state.since is not None:
                found[view.name] = state.since
        return found


@asynccontextmanager
async def world() -> AsyncIterator[World]:
    async with emulated.running(seeded=True) as box:
        for name in (*BUSY, *IDLE):
            cluster.add(box.store, daemon_pod(name))
        add_replicas(box.store)
        pulse = Pulse()
        informer = Informer(
            box.api, settings=WatchSettings(timeout_seconds=86_400), on_change=pulse
        )
        # Scraped every second, so that a rise shows in the next sample.
        prometheus = ClockedPrometheus(
            box.clock, box.clock, {POOL: LOW}, every=timedelta(seconds=1)
        )
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            yield World(box, informer, pulse, prometheus)
        finally:
            await stop(task)


def lent(w: World) -> list[str]:
    return sorted(n for n in IDLE if state_of(w.box.store, n) == "lent")


def reasons(report: TickReport) -> set[Reason]:
    return {r.reason for r in report.plan.rejections} | {s.reason for s in report.plan.steps}


# ---------------------------------------------------------------------------------------------


async def test_a_controller_90s_behind_sees_an_old_sample_as_old_and_a_rise_at_once() -> None:
    async with world() as w:
        # A bound above the skew: what is shown is how samples are read and aged.
        replica = w.replica(BEHIND, bound=timedelta(minutes=2))
        await replica.reconciler.start()
        # One sample, then the series stops; 150 s later (on the true clock) it is older than
        # the 2 minute staleness, though only 60 s old on the controller's clock.
        w.prometheus.scrape()
        w.prometheus.stopped = w.box.clock()
        w.advance(150)
        report = await w.tick(replica)
        assert not report.steps
        assert reasons(report) == {Reason.METRICS_STALE}
        message = report.plan.rejections[0].message
        assert "150s since the last good demand sample" in message
        assert "aged on Prometheus' clock, +90.0s" in message
        # Every read was evaluated at Prometheus' now, not 90 s before it.
        assert abs(w.prometheus.asked[-1] - w.box.clock()) <= timedelta(seconds=1)

        w.prometheus.stopped = None  # scraped again: fresh, the idle nodes are lent
        w.advance(1)
        await w.tick(replica)
        assert lent(w) == sorted(IDLE)

        w.prometheus.rps[POOL] = HIGH  # demand rises now; 3 s later the controller ticks
        w.advance(3)
        report = await w.tick(replica)
        assert sorted(a.node for a in report.steps) == sorted(IDLE)
        assert reasons(report) == {Reason.DEMAND_ABOVE_SERVING}


async def test_a_controller_90s_behind_lends_nothing_past_the_bound_but_takes_loans_back() -> None:
    async with world() as w:
        right = w.replica(0.0)  # a correctly clocked replica lends
        await right.reconciler.start()
        await w.tick(right)
        assert lent(w) == sorted(IDLE)

        wrong = w.replica(BEHIND)  # the replica that takes over is 90 s behind
        w.prometheus.rps[POOL] = LOW
        await wrong.reconciler.start()
        w.advance(3)
        report = await w.tick(wrong)
        assert not report.steps
        assert lent(w) == sorted(IDLE)  # it holds what is lent: no reason to take it back

        w.prometheus.rps[POOL] = HIGH
        w.advance(3)
        report = await w.tick(wrong)
        assert sorted(a.node for a in report.steps) == sorted(IDLE)  # reclaims go on
        for _ in range(8):
            w.advance(30)
            await w.tick(wrong)
        assert lent(w) == []
        # Restarted, the replica finds demand low and every node serving: it lends nothing.
        w.prometheus.rps[POOL] = LOW
        w.advance(3)
        wrong = w.replica(BEHIND)
        await wrong.reconciler.start()
        report = await w.tick(wrong)
        assert reasons(report) == {Reason.CLOCK_SKEW}
        refusal = report.plan.rejections[0].message
        assert "the API server's clock is" in refusal
        assert "ahead of this controller's, past the bound of 30s" in refusal
        record = next(r for r in wrong.audit.records if r.reason == Reason.CLOCK_SKEW.value)
        skews = record.inputs["clocks"]["skew"]
        assert 89 <= skews["apiserver"]["offset_seconds"] <= 91
        assert 89 <= skews["prometheus"]["offset_seconds"] <= 91


async def test_a_controller_10min_ahead_blames_no_prometheus_and_writes_no_future_since() -> None:
    async with world() as w:
        # A bound above the skew, so that it lends and reclaims and its writes can be read.
        replica = w.replica(AHEAD, bound=timedelta(minutes=15))
        await replica.reconciler.start()
        await w.tick(replica)
        assert lent(w) == sorted(IDLE)
        for name, since in w.sinces().items():
            assert since <= w.box.clock() + timedelta(seconds=1), name

        # Fresh samples for longer than staleness and grace together: nothing is "lost".
        for _ in range(20):
            w.advance(30)
            report = await w.tick(replica)
            assert Reason.METRICS_LOST not in reasons(report)
            assert Reason.METRICS_STALE not in reasons(report)
        assert lent(w) == sorted(IDLE)

        w.prometheus.rps[POOL] = HIGH
        w.advance(3)
        report = await w.tick(replica)
        assert reasons(report) == {Reason.DEMAND_ABOVE_SERVING}
        for _ in range(8):
            w.advance(30)
            await w.tick(replica)
        assert lent(w) == []
        for name, since in w.sinces().items():
            assert since <= w.box.clock() + timedelta(seconds=1), name

        # A correctly clocked replica finds nothing in the future and lends at once.
        w.prometheus.rps[POOL] = LOW
        w.advance(1)
        right = w.replica(0.0)
        await right.reconciler.start()
        report = await w.tick(right)
        assert not report.plan.findings
        assert sorted(a.node for a in report.steps) == sorted(IDLE)


async def test_past_the_bound_explain_and_the_audit_record_name_the_clock() -> None:
    async with world() as w:
        replica = w.replica(AHEAD)
        await replica.reconciler.start()
        report = await w.tick(replica)
        assert not report.steps
        assert reasons(report) == {Reason.CLOCK_SKEW}
        message = report.plan.rejections[0].message
        assert "the API server's clock is 599.5s (±0.5s) behind this controller's" in message
        assert "Prometheus' clock is 600.0s (±0.0s) behind" in message
        (record,) = [r for r in replica.audit.records if r.kind is Kind.REFUSAL]
        assert record.reason == Reason.CLOCK_SKEW.value
        assert record.inputs["clocks"]["problems"]
        snapshot, decision = await replica.reconciler.preview()
        pool = snapshot.pools[PoolName(POOL)]
        assert pool.clocks.problems() == report.snapshot.pools[POOL].clocks.problems()
        assert decision.plan.pools[POOL].rejections[0].reason is Reason.CLOCK_SKEW
        assert model.Reason.METRICS_LOST not in reasons(report)
