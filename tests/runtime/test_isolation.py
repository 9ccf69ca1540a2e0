"""One pool's failure is that pool's only: the Reconciler with two pools and in-memory fakes.

A strategy that raises, answers garbage or overruns its time, a planner that raises, and an
object the informer cannot read: each leaves the other pool planned as usual and its own pool
under the safety rules (docs/design/fault-isolation.md). The fakes (``tests.support.fakes``) are
plain objects passed in; a tick here touches no network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from rebalancer.adapters import registry
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore
from rebalancer.core import model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import NodeView, PodMarks, PoolName, Reason
from rebalancer.core.outcomes import ActionResult, Outcome
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import AlwaysLeader, KeptCopy, NodeLedger, PoolConfig
from sandbox.emulator.clock import ManualClock
from tests.support.factories import KEYS, LEND_SPEC, T0, begin_reclaim, lend, serving
from tests.support.fakes import Calls, Demand, Scripted, Views
from tests.support.observers import Seen

A, B = PoolName("a"), PoolName("b")
MARKS = PodMarks(lend_taints=LEND_SPEC.add_taints, serving_taints=LEND_SPEC.remove_taints)
POLICY = PoolPolicy(
    rps_per_node=10.0, min_serving=1, headroom=0.0, cooldown=timedelta(0), max_step_fraction=1.0
)


def node(pool: PoolName, i: int, lent: bool = False) -> model.NodeView:
    view = serving(f"{pool}-{i}")
    view = dataclasses.replace(view, labels={**view.labels, "pool": str(pool)})
    return lend(view, T0 - timedelta(hours=1)) if lent else view


class BrokenPlanning(PoolPolicy):
    """A policy whose arithmetic raises: stands in for a bug inside the planner."""

    def need(self, rps: float) -> int:
        raise ArithmeticError("need() is broken")


def pool(name: PoolName, strategy: Any, policy: PoolPolicy = POLICY) -> PoolConfig:
    return PoolConfig(
        name=name,
        node_selector={"pool": str(name)},
        policy=policy,
        marks=MARKS,
        strategy=strategy,
        strategy_name=getattr(strategy, "name", "scripted"),
    )


@dataclass
class World:
    reconciler: Reconciler
    views: Views
    demand: Demand
    calls: dict[PoolName, Calls]
    store: MemoryAuditStore
    seen: Seen

    async def tick(self) -> TickReport:
        return self.seen.record(await self.reconciler.tick())

    def findings(self, reason: Reason) -> list[Any]:
        return [r for r in self.store.records if r.kind is Kind.FINDING and r.reason == reason]


async def world(
    strategy_a: Any,
    *,
    lent_a: int = 0,
    policy_a: PoolPolicy = POLICY,
    demand_a: float = 5.0,
    timeout: timedelta = timedelta(seconds=10),
    ledger: NodeLedger | None = None,
) -> World:
    nodes = [node(A, i, lent=i < lent_a) for i in range(4)] + [node(B, i) for i in range(4)]
    views = Views(nodes)
    clock = ManualClock(T0)
    demand = Demand({A: demand_a, B: 5.0}, clock)
    calls = {A: Calls(), B: Calls()}
    store = MemoryAuditStore()
    seen = Seen()
    reconciler = Reconciler(
        [pool(A, strategy_a, policy_a), pool(B, registry.build("reactive"))],
        observer=Observer(
            [pool(A, strategy_a, policy_a), pool(B, registry.build("reactive"))],
            views=views,
            metrics=demand,
            keys=KEYS,
        ),
        clock=clock,
        actuators=calls,
        audit_log=AuditLog(store, sink=None),
        leadership=AlwaysLeader(now=clock),
        keys=KEYS,
        strategy_timeout=timeout,
        ledger=ledger,
    )
    await reconciler.start()  # what the first tick of a leader does before it plans
    return World(reconciler, views, demand, calls, store, seen)


# ---------------------------------------------------------------------------------------------


async def test_a_strategy_that_raises_leaves_the_other_pool_planned_as_usual() -> None:
    w = await world(Scripted(ZeroDivisionError("float division by zero")))

    report = await w.tick()

    assert w.calls[A].of("lend") == []  # safety only: no new loans
    assert len(w.calls[B].of("lend")) == 3  # 5 rps need one node of four: three lent
    assert report.proposals[A].reason.startswith("safety only: the strategy failed (raised")
    assert w.seen.strategy_failures == [("a", "scripted", "raised")]
    assert w.seen.safety_only[-1] == {"a": True, "b": False}


async def test_a_failing_strategy_still_lets_the_safety_rules_take_nodes_back() -> None:
    w = await world(Scripted(RuntimeError("boom")), lent_a=3, demand_a=35.0)

    await w.tick()

    # 35 rps need 4 nodes at 10 rps; one serves: the three lent ones come back at once.
    assert sorted(w.calls[A].of("reclaim")) == ["a-0", "a-1", "a-2"]


async def test_a_failure_is_audited_once_per_episode_and_its_end_once() -> None:
    strategy = Scripted(ZeroDivisionError("float division by zero"))
    w = await world(strategy)

    for _ in range(5):
        await w.tick()
    strategy.answer = model.Proposal(0, "works again")
    await w.tick()
    await w.tick()

    [failed] = w.findings(Reason.STRATEGY_FAILED)
    assert failed.pool == "a"
    assert failed.detail["kind"] == "raised"
    assert failed.detail["error"] == "ZeroDivisionError"
    assert failed.detail["failure"] == "ZeroDivisionError: float division by zero"
    [recovered] = w.findings(Reason.RECOVERED)
    assert recovered.detail["since"] == failed.detail["since"]
    assert len(w.seen.strategy_failures) == 5  # counted every tick, audited once
    assert w.seen.safety_only[-1] == {"a": False, "b": False}


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (model.Proposal(-1, "negative"), "lend_target -1 is outside 0..4"),
        (model.Proposal(99, "too many"), "lend_target 99 is outside 0..4"),
        (model.Proposal(math.nan, "nan"), "lend_target nan is not a whole number"),  # type: ignore[arg-type]  # a float where an int belongs, as a buggy strategy could answer
        (model.Proposal(True, "bool"), "lend_target True is not a whole number"),
        ("lend three", "answered str, not a Proposal"),
    ],
)
async def test_a_strategy_that_answers_garbage_is_planned_safety_only(
    answer: object, why: str
) -> None:
    w = await world(Scripted(answer))

    report = await w.tick()

    assert w.calls[A].of("lend") == []
    assert why in report.proposals[A].reason
    assert w.seen.strategy_failures == [("a", "scripted", "invalid")]
    assert len(w.calls[B].of("lend")) == 3


async def test_a_strategy_that_overruns_is_not_called_again_until_it_returns() -> None:
    gate = threading.Event()
    strategy = Scripted(gate=gate)
    w = await world(strategy, timeout=timedelta(milliseconds=50))

    try:
        first = await w.tick()
        assert len(w.calls[B].of("lend")) == 3
        second = await w.tick()
        assert strategy.calls == 1  # the stuck call is not piled on
        assert "no answer within" in first.proposals[A].reason
        assert "still running" in second.proposals[A].reason
    finally:
        gate.set()
    await w.reconciler.strategies.running[A]  # let the released call finish before the next tick
    strategy.gate = None

    third = await w.tick()
    assert third.proposals[A].reason == "lend everything"
    assert [k for _, _, k in w.seen.strategy_failures] == ["timeout", "timeout"]


async def test_a_planner_failure_in_one_pool_leaves_the_other_pool_planned() -> None:
    broken = BrokenPlanning(**{f.name: getattr(POLICY, f.name) for f in dataclasses.fields(POLICY)})
    w = await world(Scripted(), policy_a=broken)

    report = await w.tick()
    assert len(w.calls[B].of("lend")) == 3
    await w.tick()

    assert w.calls[A].of("lend") == []
    assert "the planner failed" in report.plan.pools[A].summary
    assert w.seen.planner_failures == ["a", "a"]
    assert len(w.findings(Reason.PLANNER_FAILED)) == 1


async def test_an_unreadable_object_is_counted_and_the_rest_is_planned() -> None:
    w = await world(Scripted())
    w.views.broken = {"pod/a-3/ns/bad": "ValueError: invalid literal for int()"}

    await w.tick()

    assert w.seen.unreadable[-1] == {"node": 0, "pod": 1}
    assert len(w.calls[A].of("lend")) == 3


@dataclass
class SlowReclaims(Calls):
    """Reclaims that take their time, counting how many run at once and their deadlines."""

    running: int = 0
    most: int = 0
    deadlines: list[datetime] = field(default_factory=list)

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        self.running += 1
        self.most = max(self.most, self.running)
        self.deadlines.append(deadline)
        await asyncio.sleep(0)  # the API calls of one reclaim: others get their turn
        await asyncio.sleep(0)
        self.running -= 1
        return await super().reclaim(node, decision, deadline)


async def test_a_reclaim_wave_runs_its_reclaims_together_against_one_deadline() -> None:
    w = await world(Scripted(RuntimeError("boom")), lent_a=3, demand_a=35.0)
    slow = SlowReclaims()
    w.reconciler.actuators = {A: slow, B: w.calls[B]}

    await w.tick()

    assert sorted(slow.of("reclaim")) == ["a-0", "a-1", "a-2"]
    assert slow.most == 3  # all at once, not one after another
    assert len(set(slow.deadlines)) == 1  # counted from the same start


@dataclass
class SlowDrains(Calls):
    """Drain passes that take their time, counting how many run at once."""

    running: int = 0
    most: int = 0
    passes: list[str] = field(default_factory=list)

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        self.running += 1
        self.most = max(self.most, self.running)
        self.passes.append(node)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.running -= 1
        return ActionResult(node, model.Action.PROGRESS, Outcome.IN_PROGRESS, "draining")


async def test_the_drains_of_a_wave_are_driven_together() -> None:
    w = await world(Scripted(), demand_a=5.0)
    draining = [begin_reclaim(node(A, i, lent=True), T0) for i in range(3)]
    w.views.nodes = [*draining, node(A, 3), *(node(B, i) for i in range(4))]
    slow = SlowDrains()
    w.reconciler.actuators = {A: slow, B: w.calls[B]}

    await w.tick()

    assert sorted(slow.passes) == ["a-0", "a-1", "a-2"]
    assert slow.most == 3


class Legacy:
    """A strategy written before strategies said whether they read the demand history."""

    name = "legacy"

    def decide(self, pool: model.PoolView) -> model.Proposal:
        return model.Proposal(0, "legacy")


def test_a_strategy_that_does_not_say_whether_it_reads_history_gets_none() -> None:
    legacy = pool(PoolName("a"), Legacy())
    assert not legacy.needs_history
    assert pool(PoolName("b"), registry.build("forecast")).needs_history
    assert pool(PoolName("c"), registry.build("watermark")).needs_history
    assert not pool(PoolName("d"), registry.build("window")).needs_history


# ---------------------------------------------------------------------------------------------
# A step, a pass or a record that raises is that one's failure only, said once as what it is.


@dataclass
class OneReclaimRaises(Calls):
    """A wave of reclaims of which one raises while the others are still in flight."""

    raising: str = "a-0"
    in_flight: asyncio.Event = field(default_factory=asyncio.Event)
    raised: asyncio.Event = field(default_factory=asyncio.Event)

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        if node == self.raising:
            await self.in_flight.wait()
            self.raised.set()
            raise RuntimeError("a bug in the actuator")
        self.in_flight.set()
        await self.raised.wait()  # in flight when the other raises
        return await super().reclaim(node, decision, deadline)


async def test_a_step_that_raises_is_closed_as_failed_and_the_rest_of_its_wave_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = await world(Scripted(RuntimeError("boom")), lent_a=3, demand_a=35.0)
    raising = OneReclaimRaises()
    w.reconciler.actuators = {A: raising, B: w.calls[B]}

    report = await w.tick()

    assert sorted(a.node for a in report.steps if a.node.startswith("a-")) == ["a-0", "a-1", "a-2"]
    assert sorted(raising.of("reclaim")) == ["a-1", "a-2"]
    outcomes = {r.node: r for r in w.store.records if r.kind is Kind.OUTCOME and r.pool == A}
    assert {n: o.outcome for n, o in outcomes.items()} == {
        "a-0": Outcome.FAILED,
        "a-1": Outcome.APPLIED,
        "a-2": Outcome.APPLIED,
    }
    assert outcomes["a-0"].message == "the actuator raised RuntimeError: a bug in the actuator"
    assert await w.store.pending_intents() == (), "no intent is left open"
    said = [
        r for r in caplog.records if r.exc_info and "a bug in the actuator" in str(r.exc_info[1])
    ]
    assert len(said) == 1, "said once"
    assert said[0].getMessage().startswith("reclaim a-0 of pool a under ")


@dataclass
class DrainsThatRaise(Calls):
    """Drain passes that raise, each its own error."""

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        await asyncio.sleep(0)  # the others have begun
        raise LookupError(f"a bug while draining {node}")


async def test_every_pass_that_raises_is_logged_once_with_its_node_and_the_tick_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = await world(Scripted(), demand_a=5.0)
    draining = [begin_reclaim(node(A, i, lent=True), T0) for i in range(3)]
    w.views.nodes = [*draining, node(A, 3), *(node(B, i) for i in range(4))]
    w.reconciler.actuators = {A: DrainsThatRaise(), B: w.calls[B]}

    report = await w.tick()

    assert report.leading
    said = sorted(
        (r.getMessage(), str(r.exc_info[1]))
        for r in caplog.records
        if r.exc_info and isinstance(r.exc_info[1], LookupError)
    )
    assert said == [
        (f"progress a-{i} of pool a raised; the others go on", f"a bug while draining a-{i}")
        for i in range(3)
    ]


async def test_a_bug_on_the_way_to_the_store_is_not_taken_for_a_failing_store() -> None:
    w = await world(Scripted(RuntimeError("boom")), lent_a=3, demand_a=35.0)
    w.store.fail_next = KeyError("a bug on the way to the store")

    with pytest.raises(KeyError, match="a bug on the way to the store"):
        await w.tick()

    assert w.reconciler.audit_log.failing is None
    assert w.calls[A].of("reclaim") == [], "nothing carried out as if the store failed"
    # The store's own failure still is one: the safety reclaims are told why nothing is stored.
    w.store.fail_next = OSError("disk full")
    report = await w.tick()
    assert report.error == "audit store failed: OSError: disk full"
    assert w.reconciler.audit_log.failing == "OSError: disk full"


class OutcomesThatRaise(MemoryAuditStore):
    """A store whose writes of outcomes meet a bug on the way (a record it cannot encode)."""

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        if any(r.kind is Kind.OUTCOME for r in batch):
            raise TypeError("an outcome this store cannot encode")
        await super().append(batch)


async def test_an_outcome_lost_to_a_bug_is_logged_as_a_bug_not_as_a_full_spool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = await world(Scripted(RuntimeError("boom")), lent_a=1, demand_a=35.0)
    store = OutcomesThatRaise()
    w.reconciler.audit_log = AuditLog(store, sink=None)

    report = await w.tick()

    assert "a-0" in [a.node for a in report.steps]
    assert [a.outcome for a in report.steps] == [None] * len(report.steps)
    assert w.reconciler.audit_log.failing is None
    assert w.reconciler.audit_log.spool == [], "a bug's record is not kept as the store's"
    said = [r for r in caplog.records if isinstance(r.exc_info and r.exc_info[1], TypeError)]
    assert [r.getMessage() for r in said] == [
        "audit: an outcome is not recorded: a bug, not the store failing"
    ] * len(report.steps)
    assert not any("spool is full" in r.getMessage() for r in caplog.records)


class Ledger:
    """Records kept on nodes, in memory: a node that always takes them, and no Events."""

    def __init__(self) -> None:
        self.on: dict[str, list[AuditRecord]] = {}

    async def hold(self, node: str, records: Sequence[AuditRecord], why: str) -> None:
        self.on.setdefault(node, []).extend(records)

    async def release(self, node: str, ids: Iterable[str]) -> None:
        gone = set(ids)
        self.on[node] = [r for r in self.on.get(node, []) if r.id not in gone]

    def kept(self, view: NodeView) -> tuple[AuditRecord, ...]:
        return tuple(self.on.get(view.name, ()))

    async def copies(self, views: Iterable[NodeView]) -> Sequence[KeptCopy]:
        return ()

    async def retell(self, record: AuditRecord, why: str, node: str | None = None) -> bool:
        return True


class PoisonedStore(MemoryAuditStore):
    """A store whose disk is full while ``full``, and that meets a bug of ours on the way
    whenever a batch holds one of ``poison``."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False
        self.poison: set[str] = set()

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        if self.full:
            raise OSError("disk full")
        if any(r.id in self.poison for r in batch):
            raise TypeError("a record this store cannot encode")
        await super().append(batch)


async def test_a_bug_while_catching_up_on_kept_records_is_logged_once_and_the_records_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept = Ledger()
    w = await world(Scripted(RuntimeError("boom")), lent_a=3, demand_a=35.0, ledger=kept)
    store = PoisonedStore()
    w.reconciler.audit_log = AuditLog(store, sink=None)
    store.full = True
    await w.tick()  # the safety reclaims' records wait in the spool and on their nodes
    spooled = [r.id for r in w.reconciler.audit_log.spool]
    assert spooled
    store.full, store.poison = False, set(spooled)
    caplog.clear()

    for _ in range(2):  # the tick's own write meets the bug too, and it goes up as it is
        with pytest.raises(TypeError, match="cannot encode"):
            await w.tick()

    bugs = [r for r in caplog.records if isinstance(r.exc_info and r.exc_info[1], TypeError)]
    assert [r.getMessage() for r in bugs if r.name.endswith("recovering")] == [
        "writing the records kept on nodes and in Events failed: a bug"
    ], "catching up says it once, with its traceback, instead of swallowing it"
    assert {r.id for r in w.reconciler.audit_log.spool} >= set(spooled), "nothing dropped"
    on_nodes = {r.id for rs in kept.on.values() for r in rs}
    assert on_nodes, "the nodes keep what the store has not taken"
    assert on_nodes <= set(spooled)


class UnreadableStore(MemoryAuditStore):
    """A store that takes writes and cannot answer a read (its server dropped the query)."""

    async def get(self, record_id: str) -> AuditRecord | None:
        raise OSError("connection reset while reading")


async def test_a_drain_whose_intent_cannot_be_read_says_so_once_even_when_its_node_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = await world(Scripted(), demand_a=5.0)
    draining = [
        dataclasses.replace(begin_reclaim(node(A, i, lent=True), T0), uid=f"uid-{i}")
        for i in range(2)
    ]
    w.views.nodes = [*draining, node(A, 2), node(A, 3), *(node(B, i) for i in range(4))]
    waiting = SlowDrains()  # every pass says the drain goes on
    w.reconciler.actuators = {A: waiting, B: w.calls[B]}
    await w.tick()
    w.reconciler.audit_log = AuditLog(UnreadableStore(), sink=None)
    w.views.nodes = [draining[1], node(A, 2), node(A, 3), *(node(B, i) for i in range(4))]
    caplog.clear()

    await w.tick()  # a-0 is gone: its drain is looked at once more, under its own UID

    assert "a-0" in waiting.passes[2:]
    said = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert sorted(said) == [
        "node a-0 of pool a: intent test-reclaim not read, the audit store fails "
        "(OSError: connection reset while reading): this pass is not recorded",
        "node a-1: intent test-reclaim not read, the audit store fails "
        "(OSError: connection reset while reading): this pass is not recorded",
    ]
