"""The reconcile step against the Kubernetes API emulator over HTTP, with the real informer and
actuator, a scripted metrics source and the in-memory audit store.

A journal records, in the order they happened, every batch the audit store took and every node
write the emulator's server took (its request observer, ``serve(on_request=...)``, is told of
each before the client gets the answer), so "the intent was committed before the node changed"
is checked on the server's own record, not on what the client believes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import registry
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import model, nodestate
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Term
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime.loop import run_controller
from rebalancer.runtime.report import TickReport
from sandbox.emulator.resources import NODES
from tests.support import emulated
from tests.support.actuation import Crash, Recorder
from tests.support.fakes import Demand, Lead
from tests.support.pools import BUSY, IDLE, KEYS, POLICY, POOL, add_replicas
from tests.support.reads import scheduling_of, state_of
from tests.support.reconciling import (
    CONFIG,
    HIGH,
    LOW,
    World,
    add_training,
    make_reconciler,
    world,
)
from tests.support.waits import no_sleep

Obj = dict[str, Any]


def check_audit_order(w: World) -> None:
    """Every node write names an intent committed before it, and every intent was closed."""
    position = {e[2]: i for i, e in enumerate(w.journal) if e[0] == "audit"}
    intents = {r.id: r for r in w.records(Kind.INTENT)}
    for i, (_, node, decision, _state) in enumerate(w.journal):
        if _ != "node":
            continue
        assert decision in intents, (node, decision)
        assert intents[decision].node == node
        assert position[decision] < i, f"{node}: written before its intent {decision}"
    closed = {r.intent_id for r in w.records(Kind.OUTCOME)}
    assert set(intents) <= closed, set(intents) - closed
    for r in w.records(Kind.OUTCOME):
        assert r.intent_id is not None
        assert position[r.intent_id] < position[r.id]


# ---------------------------------------------------------------------------------------------


async def test_low_demand_lends_idle_nodes_only_and_high_demand_reclaims_them_byte_for_byte() -> (
    None
):
    async with world() as w:
        assert await w.reconciler.start() == ()
        w.metrics.rps[POOL] = LOW
        report = await w.tick()
        assert report.leading
        assert report.error is None
        lent = sorted(a.node for a in report.steps)
        assert lent == sorted(IDLE)
        assert all(a.result and a.result.outcome is Outcome.APPLIED for a in report.steps)
        assert {n: state_of(w.store, n) for n in IDLE} == dict.fromkeys(IDLE, "lent")
        assert {n: state_of(w.store, n) for n in BUSY} == dict.fromkeys(BUSY, "serving")
        for name in BUSY:
            assert scheduling_of(w.store, name) == w.originals[name]
        # The node's decision annotation is the id of its intent record.
        for a in report.steps:
            assert a.intent is not None
            assert a.outcome is not None
            ann = w.store.get(NODES, None, a.node)["metadata"]["annotations"]
            assert ann[KEYS.decision] == a.intent.id
            assert a.outcome.outcome == Outcome.APPLIED.value

        # A steady tick: nothing more to do, nothing written to the cluster.
        before = len(w.node_writes())
        assert not (await w.tick()).applied
        assert len(w.node_writes()) == before

        # Training lands on the lent nodes; demand comes back.
        add_training(w.store, len(IDLE))
        w.metrics.rps[POOL] = HIGH
        report = await w.tick()
        assert sorted(a.node for a in report.steps) == sorted(IDLE)
        assert all(a.call == "reclaim" for a in report.steps)
        for _ in range(6):  # the borrowed pods drain; the deadline passes
            if all(state_of(w.store, n) == "serving" for n in IDLE):
                break
            w.advance(30)
            report = await w.tick()
            assert not report.steps
        assert {n: state_of(w.store, n) for n in IDLE} == dict.fromkeys(IDLE, "serving")
        for name in (*BUSY, *IDLE):
            assert scheduling_of(w.store, name) == w.originals[name], name
        check_audit_order(w)
        # Every transition: an intent, then a node write naming it, then an outcome.
        states = [e[3] for e in w.node_writes()]
        assert states.count("lent") == len(IDLE)
        assert states.count("reclaiming") == len(IDLE)
        progressed = [r for r in w.records(Kind.OUTCOME) if r.detail.get("call") == "progress"]
        assert progressed, "the drains were driven by progress passes and audited"
        assert set(w.seen.leader) == {True}
        assert w.seen.lent[0] == {POOL: 0}
        assert w.seen.lent[1] == {POOL: len(IDLE)}
        assert sorted(p for p, _, _ in w.seen.reclaims) == [POOL] * len(IDLE)
        assert all(started < serving for _, started, serving in w.seen.reclaims)


async def test_a_minute_of_queueing_while_nodes_are_lent_is_counted_once_as_lending_s_cost() -> (
    None
):
    async with world() as w:
        await w.reconciler.start()
        await w.tick()  # low demand: the idle nodes are lent
        assert w.seen.borrowing_minutes == []
        w.metrics.queued[POOL] = 50.0  # beyond the pool's limit (0): serving is short
        report = await w.tick()
        assert {a.call for a in report.steps} == {"reclaim"}  # the queue takes the loans back
        assert w.seen.borrowing_minutes == [POOL]
        w.advance(10)
        await w.tick()  # the same minute, and the nodes are no longer lent
        assert w.seen.borrowing_minutes == [POOL]


async def test_lending_s_cost_is_counted_once_per_minute_however_many_ticks_see_it() -> None:
    # A pool whose queue stops lending but takes nothing back: its loans stay while it queues.
    keeps = replace(CONFIG, policy=replace(POLICY, queue_reclaims=False))
    async with world(keeps) as w:
        await w.reconciler.start()
        await w.tick()
        w.metrics.queued[POOL] = 50.0
        for _ in range(3):  # three ticks within one minute
            await w.tick()
            w.advance(15)
        assert w.seen.borrowing_minutes == [POOL]
        w.advance(30)  # the next minute
        await w.tick()
        assert w.seen.borrowing_minutes == [POOL, POOL]


@dataclass
class Noting:
    """A strategy that answers as ``inner`` does and notes the error budget each call saw."""

    inner: Any
    budgets: list[model.ErrorBudget | None]
    name: ClassVar[str] = "noting"
    reads_history: ClassVar[bool] = False

    def decide(self, pool: model.PoolView) -> model.Proposal:
        self.budgets.append(pool.budget)
        answer: model.Proposal = self.inner.decide(pool)
        return answer


async def test_a_cost_minute_lost_to_a_bug_is_said_to_be_a_bug_and_the_tick_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slo = model.Slo(max_breach_minutes=5, window=timedelta(hours=1))
    keeps = replace(CONFIG, policy=replace(POLICY, queue_reclaims=False), slo=slo)
    async with world(keeps) as w:
        await w.reconciler.start()
        await w.tick()
        w.metrics.queued[POOL] = 50.0
        await w.tick()
        w.advance(60)
        w.audit.fail_next = TypeError("a cost record this store cannot encode")
        caplog.clear()

        report = await w.tick()  # its cost minute is the first write, and meets the bug

        assert report.error is None, "the tick's own records are written"
        assert "cost" not in w.seen.audit_failures, "not counted as the store failing"
        said = [r.getMessage() for r in caplog.records if r.exc_info]
        assert said == ["1 cost minute(s) not recorded: a bug, not the store"]


async def test_each_costly_minute_is_audited_and_a_restarted_run_spends_the_same_budget() -> None:
    budgets: list[model.ErrorBudget | None] = []
    slo = model.Slo(max_breach_minutes=5, window=timedelta(hours=1))
    keeps = replace(
        CONFIG,
        policy=replace(POLICY, queue_reclaims=False),  # the loans stay while the pool queues
        strategy=Noting(registry.build("reactive"), budgets),
        slo=slo,
    )
    async with world(keeps) as w:
        await w.reconciler.start()
        await w.tick()
        w.metrics.queued[POOL] = 50.0
        await w.tick()
        w.advance(60)
        await w.tick()
        costs = w.records(Kind.COST)
        assert [r.detail["spent_minutes"] for r in costs] == [1, 2]
        assert {(r.pool, r.reason, r.count, r.detail["allowed_minutes"]) for r in costs} == {
            (POOL, "borrowing_cost", len(IDLE), 5)
        }
        assert costs[0].message == (
            f"pool {POOL}: 50 request(s) queued beyond the limit of 0 while {len(IDLE)} node(s) "
            "were away on loan: error budget 1 of 5 minute(s) spent in the last 1 hour(s)"
        )
        assert costs[1].time - costs[0].time == timedelta(minutes=1)
        # The strategy saw the budget as of the tick before: nothing, nothing, one minute.
        assert [b.spent_minutes if b else None for b in budgets] == [0, 0, 1]
        assert w.seen.budgets[-1] == {POOL: model.ErrorBudget(5, timedelta(hours=1), 2)}

        # A new run (a restart, or another replica taking over) takes the count up from the
        # audit log: the same minute is not counted again, the next one is.
        again = make_reconciler(
            w.box, w.writer, w.informer, w.metrics, w.lead, w.audit, config=keeps
        )
        await again.start()
        await w.caught_up()
        await again.tick()
        assert budgets[-1] == model.ErrorBudget(5, timedelta(hours=1), 2)
        assert len(w.records(Kind.COST)) == 2
        w.advance(60)
        await w.caught_up()
        await again.tick()
        assert [r.detail["spent_minutes"] for r in w.records(Kind.COST)] == [1, 2, 3]
        w.metrics.queued[POOL] = 0.0
        w.advance(3540)  # an hour after the second minute: only the third is within the window
        await w.caught_up()
        await again.tick()
        assert budgets[-1] == model.ErrorBudget(5, timedelta(hours=1), 1)


async def test_a_controller_reads_back_only_its_own_cluster_s_records_of_a_shared_store() -> None:
    """Another cluster's controller shares the store and has a pool and nodes of the same
    names: its open intent is not judged here, and its costly minutes are not this pool's."""
    budgets: list[model.ErrorBudget | None] = []
    slo = model.Slo(max_breach_minutes=5, window=timedelta(hours=1))
    noting = replace(CONFIG, strategy=Noting(registry.build("reactive"), budgets), slo=slo)
    async with world(noting) as w:
        now = w.box.clock()
        theirs = AuditRecord(
            id="01JUS0000000000000000INTENT",
            time=now - timedelta(minutes=3),
            kind=Kind.INTENT,
            cluster="prod-us",
            pool=POOL,
            controller="replica-us",
            term=9,
            node=IDLE[0],  # serving here: judged here, it would be closed as never carried out
            action=model.Action.LEND,
            reason="strategy",
            message="lend 1 node",
        )
        minutes = [
            replace(
                theirs,
                id=f"01JUS000000000000000000CO{m}",
                time=now - timedelta(minutes=m),
                kind=Kind.COST,
                node=None,
                action=None,
                reason="borrowing_cost",
                message="queued while lent",
            )
            for m in (1, 2)
        ]
        await w.audit.append([theirs, *minutes])

        assert await w.reconciler.start() == ()
        await w.tick()
        assert budgets[-1] == model.ErrorBudget(5, timedelta(hours=1), 0)  # none of theirs
        assert await w.audit.pending_intents("prod-us") == (theirs,)  # still theirs to judge
        assert [r for r in w.audit.records if r.intent_id == theirs.id] == []
        ours = [r for r in w.audit.records if r.cluster != "prod-us"]
        assert ours
        assert {r.cluster for r in ours} == {"default"}


async def test_a_pool_without_an_slo_shows_its_strategy_no_budget() -> None:
    budgets: list[model.ErrorBudget | None] = []
    noting = replace(CONFIG, strategy=Noting(registry.build("reactive"), budgets))
    async with world(noting) as w:
        await w.reconciler.start()
        await w.tick()
        w.metrics.queued[POOL] = 50.0
        await w.tick()
        assert budgets == [None, None]
        assert [r.detail for r in w.records(Kind.COST)] == [
            {"queue": 50.0, "queue_limit": 0.0, "away": len(IDLE)}
        ]


async def test_stale_metrics_stop_lending_and_past_the_grace_the_loans_are_taken_back() -> None:
    async with world() as w:
        await w.reconciler.start()
        w.metrics.rps[POOL] = LOW
        w.metrics.at = w.box.clock() - timedelta(minutes=3)  # older than the 2 min staleness
        report = await w.tick()
        assert not report.plan.steps
        assert {r.reason for r in report.plan.rejections} == {model.Reason.METRICS_STALE}
        assert not w.node_writes()

        w.metrics.at = None  # fresh again: the idle nodes are lent
        report = await w.tick()
        assert len(report.steps) == len(IDLE)

        w.metrics.at = w.box.clock()  # the series stops here
        w.advance(3 * 60)
        report = await w.tick()
        assert not report.plan.steps  # stale: no new lending, loans kept within the grace
        assert all(state_of(w.store, n) == "lent" for n in IDLE)

        w.advance(5 * 60)  # stale past staleness + grace: every loan comes back
        report = await w.tick()
        assert sorted(a.node for a in report.steps) == sorted(IDLE)
        assert {s.reason for s in report.plan.steps} == {model.Reason.METRICS_LOST}
        for _ in range(4):
            if all(state_of(w.store, n) == "serving" for n in IDLE):
                break
            w.advance(30)
            await w.tick()
        for name in IDLE:
            assert scheduling_of(w.store, name) == w.originals[name], name
        check_audit_order(w)


async def test_a_follower_plans_but_writes_nothing_to_the_cluster_or_the_audit_log() -> None:
    async with world() as w:
        w.lead.leading = False
        w.metrics.rps[POOL] = LOW
        report = await w.tick()
        assert not report.leading
        assert len(report.plan.steps) == len(IDLE)  # it knows what it would do
        assert not report.applied
        assert not w.node_writes()
        assert not w.audit.records
        assert w.seen.leader == [False]

        # It takes over: the first tick of its term recovers, then carries the plan out.
        w.lead.leading = True
        w.lead.term = Term("replica-a", 4, w.box.clock())
        report = await w.tick()
        assert sorted(a.node for a in report.steps) == sorted(IDLE)
        check_audit_order(w)


async def test_leadership_lost_after_the_intents_supersedes_them_and_writes_no_node() -> None:
    async with world() as w:
        await w.reconciler.start()
        w.metrics.rps[POOL] = LOW
        w.lead.answers.extend([True])  # leads when the tick begins, then no more
        w.lead.leading = False
        report = await w.tick()
        assert report.leading
        assert not w.node_writes()
        intents = w.records(Kind.INTENT)
        assert len(intents) == len(IDLE)
        outcomes = w.records(Kind.OUTCOME)
        assert {r.outcome for r in outcomes} == {Outcome.SUPERSEDED.value}
        assert {r.intent_id for r in outcomes} == {r.id for r in intents}


async def test_a_crash_in_a_wave_of_lends_leaves_nothing_start_up_and_a_tick_do_not_end() -> None:
    async with world() as w:
        w.metrics.rps[POOL] = LOW
        # Lends in flight together when the run dies: several nodes may be caught mid-lend.
        crashing = Recorder(w.writer, crash_after=3)
        first = make_reconciler(w.box, crashing, w.informer, w.metrics, w.lead, w.audit)
        first.lend_concurrency = 4
        with pytest.raises(Crash):
            await first.tick()
        await w.caught_up()
        caught = {n for n in IDLE if state_of(w.store, n) == "lending"}
        assert caught

        results = await w.reconciler.start()
        assert {r.node for r in results} >= caught
        # A write the dead run had already sent can reach the server after start-up has looked
        # (as a dead process's request still queued at the API server does): a node it marks
        # lending then is ended by the next tick, which drives every node in flight.
        await w.tick()

        assert {state_of(w.store, n) for n in IDLE} <= {"serving", "lent"}
        assert await w.audit.unfinished_intents() == ()
        for name in IDLE:
            if state_of(w.store, name) == "serving":
                assert scheduling_of(w.store, name) == w.originals[name]


async def test_a_failed_audit_store_means_nothing_is_written_this_tick() -> None:
    async with world() as w:
        w.metrics.rps[POOL] = LOW
        w.audit.fail_next = OSError("disk full")
        report = await w.tick()
        assert report.error is not None
        assert "disk full" in report.error
        assert w.seen.audit_failures == ["tick"]
        assert not report.applied
        assert not w.node_writes()
        report = await w.tick()  # the store is back: the next tick does it
        assert len(report.steps) == len(IDLE)
        check_audit_order(w)


async def test_start_up_closes_open_intents_with_what_happened_and_audits_the_rollback() -> None:
    async with world() as w:
        w.metrics.rps[POOL] = LOW
        # A previous run: its intent is on record, it crashes after the first write of a lend.
        crashing = Recorder(w.writer, crash_after=1)
        first = make_reconciler(w.box, crashing, w.informer, w.metrics, w.lead, w.audit)
        first.lend_concurrency = 1  # one lend at a time: the crash leaves one node half-lent
        with pytest.raises(Crash):
            await first.tick()
        await w.caught_up()
        half = [n for n in IDLE if state_of(w.store, n) == "lending"]
        assert len(half) == 1
        pending = await w.audit.pending_intents()
        assert len(pending) == len(IDLE)  # committed before the crash, never closed

        results = await w.reconciler.start()
        assert [(r.node, r.outcome) for r in results] == [(half[0], Outcome.APPLIED)]
        assert state_of(w.store, half[0]) == "serving"
        assert scheduling_of(w.store, half[0]) == w.originals[half[0]]
        assert await w.audit.pending_intents() == ()
        closed = {r.intent_id: r for r in w.records(Kind.OUTCOME)}
        interrupted = next(i for i in pending if i.node == half[0])
        # The lend that reached the node is not "never carried out": it was interrupted, and a
        # recovery intent, committed before the rollback, took the node over.
        verdict = closed[interrupted.id]
        assert verdict.outcome == Outcome.INTERRUPTED.value
        recovery = next(r for r in w.records(Kind.INTENT) if r.origin == "recovery")
        assert verdict.detail == {"by": "replica-a", "term": 3, "recovered_by": recovery.id}
        assert (recovery.node, recovery.action, recovery.detail["recovers"]) == (
            half[0],
            "rollback",
            interrupted.id,
        )
        assert closed[recovery.id].outcome == Outcome.APPLIED.value
        others = [i for i in pending if i.node != half[0]]
        assert {closed[i.id].outcome for i in others} == {Outcome.SUPERSEDED.value}
        # The rollback's write names the recovery: the node's decision is its id.
        labels_and_decision = w.store.get(NODES, None, half[0])["metadata"]["annotations"]
        assert labels_and_decision[KEYS.decision] == recovery.id

        report = await w.tick()  # and the new run lends afresh
        assert sorted(a.node for a in report.steps) == sorted(IDLE)
        check_audit_order(w)


async def test_a_reclaim_interrupted_while_draining_is_finished_under_a_recovery_intent() -> None:
    async with world() as w:
        await w.tick()  # low demand: the idle nodes are lent
        add_training(w.store, len(IDLE))
        w.metrics.rps[POOL] = HIGH
        await w.caught_up()
        # A run that crashes right after its first write: the first reclaim has begun.
        crashing = Recorder(w.writer, crash_after=1)
        first = make_reconciler(w.box, crashing, w.informer, w.metrics, w.lead, w.audit)
        await first.start()
        with pytest.raises(Crash):
            await first.tick()
        await w.caught_up()
        # Reclaims run concurrently: the others in flight were cut off mid-way too.
        halves = sorted(n for n in IDLE if state_of(w.store, n) == "reclaiming")
        assert halves
        interrupted = {str(i.node): i for i in await w.audit.pending_intents() if i.node in halves}
        assert sorted(interrupted) == halves

        second = make_reconciler(w.box, w.writer, w.informer, w.metrics, w.lead, w.audit)
        results = await second.start()
        assert sorted((r.node, r.outcome) for r in results) == [
            (n, Outcome.IN_PROGRESS) for n in halves
        ]
        for _ in range(8):  # the borrowed pods drain under the recoveries, tick after tick
            await w.caught_up()
            if all(state_of(w.store, n) == "serving" for n in halves):
                break
            w.advance(30)
            await second.tick()
        for name in halves:
            assert scheduling_of(w.store, name) == w.originals[name]

    by_intent: dict[str, list[AuditRecord]] = {}
    for r in w.records(Kind.OUTCOME):
        by_intent.setdefault(str(r.intent_id), []).append(r)
    recoveries = {str(r.node): r for r in w.records(Kind.INTENT) if r.origin == "recovery"}
    assert sorted(recoveries) == halves
    for name, open_intent in interrupted.items():
        recovery = recoveries[name]
        assert [r.outcome for r in by_intent[open_intent.id]] == [Outcome.INTERRUPTED.value]
        assert by_intent[open_intent.id][0].detail["recovered_by"] == recovery.id
        assert (recovery.action, recovery.detail["recovers"]) == ("reclaim", open_intent.id)
        assert [r.outcome for r in by_intent[recovery.id]][-1] == Outcome.APPLIED.value
    check_audit_order(w)


async def test_the_controller_process_lends_on_its_first_tick_and_stops_cleanly() -> None:
    """``run_controller`` with the real informer and actuator: the informer lists, the first
    tick (start-up included) lends the idle nodes, our own writes wake it again (debounced),
    and a stop (what SIGTERM does) ends it with 0 after the step in flight."""
    async with emulated.running(seeded=True) as box:
        store = box.store
        add_replicas(store)
        informer = Informer(box.api, settings=WatchSettings(timeout_seconds=86_400))
        lead = Lead(box.clock, term=Term("replica-a", 1, box.clock()))
        kube = KubeWriter(client.CoreV1Api(box.api), RetryPolicy(sleep=no_sleep))
        audit = MemoryAuditStore()
        reconciler = make_reconciler(
            box, kube, informer, Demand({POOL: LOW}, box.clock), lead, audit
        )
        stop = asyncio.Event()
        reports: list[TickReport] = []
        woke = asyncio.Event()

        async def step() -> None:
            reports.append(await reconciler.tick())
            if len(reports) >= 2:
                woke.set()
                stop.set()

        controller = asyncio.create_task(
            run_controller(
                step,
                informer=informer,
                edges=reconciler.next_edge,
                debounce=timedelta(milliseconds=20),
                interval=timedelta(hours=1),
                stop=stop,
                signals=(),
            )
        )
        async with asyncio.timeout(5):
            await woke.wait()
            assert await controller == 0
        assert sorted(a.node for a in reports[0].steps) == sorted(IDLE)
        assert all(state_of(store, n) == "lent" for n in IDLE)
        assert not reports[1].steps  # woken by its own writes: nothing more to do
        assert informer.synced.is_set()


async def test_a_reclaim_past_its_deadline_is_reported_overdue_until_it_finishes() -> None:
    async with world() as w:
        await w.reconciler.start()
        w.metrics.rps[POOL] = LOW
        await w.tick()
        assert all(state_of(w.store, n) == "lent" for n in IDLE)
        assert w.seen.overdue[-1] == {POOL: 0}
        # A reclaim another leader began, whose deadline passed a minute ago, seen by a follower.
        w.lead.leading = False
        late = nodestate.format_time(w.box.clock() - timedelta(minutes=1))
        body = {
            "metadata": {
                "labels": {KEYS.state: "reclaiming"},
                "annotations": {KEYS.deadline: late},
            }
        }
        w.store.patch(
            NODES, None, IDLE[0], "application/merge-patch+json", json.dumps(body).encode()
        )
        await w.tick()
        assert w.seen.overdue[-1] == {POOL: 1}
        # Leading again (and demand back, so nothing is lent anew): the reclaim is driven to
        # its end and the count falls back to 0.
        w.lead.leading = True
        w.metrics.rps[POOL] = HIGH
        for _ in range(4):
            await w.tick()
            w.advance(30)
        assert state_of(w.store, IDLE[0]) == "serving"
        await w.tick()
        assert w.seen.overdue[-1] == {POOL: 0}


async def test_a_pool_with_an_slo_is_planned_with_what_its_history_covers() -> None:
    slo = model.Slo(max_breach_minutes=10)
    budgeted = replace(CONFIG, slo=slo)
    async with world(budgeted) as w:
        jumped = w.box.clock() - timedelta(days=2)

        def past(at: datetime) -> float:
            # LOW, and twice LOW for the ten minutes from two days ago.
            return 2 * LOW if timedelta(0) <= at - jumped < timedelta(minutes=10) else LOW

        w.metrics.past[POOL] = past
        await w.reconciler.start()
        first = await w.tick()
        w.advance(6 * 60)  # past the history's refresh: a new read, judged where the last ended
        later = await w.tick()

    covers = [r.snapshot.pools[POOL].cover for r in (first, later)]
    assert all(c is not None for c in covers)
    assert [[j.seen for j in c.jumps] for c in covers if c is not None] == [[2.0], [2.0]]


async def test_a_pool_without_an_slo_has_no_cover() -> None:
    async with world() as w:
        await w.reconciler.start()
        report = await w.tick()

    assert report.snapshot.pools[POOL].cover is None
