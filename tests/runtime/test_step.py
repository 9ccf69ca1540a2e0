"""The tick's pure step (``runtime.step``), asked questions as values: a memory and what a tick
saw in, the effects out. No cluster, no store, no clock: what holds here holds whatever the
shell then meets.

The pools are generated as the planner's properties generate them (nodes in every phase, built
with the codec; unreadable ones; operator overrides valid and garbage; any demand), each node
with a UID, plus a memory of drains, loans and removals in flight that may or may not match the
nodes seen now (a node deleted, or created again under its name).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Sequence
from datetime import timedelta
from itertools import count
from typing import ClassVar

from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import audit, model
from rebalancer.core.model import Action, NodeName, PodMarks
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.tick import Failure, lent_count
from rebalancer.runtime import budgets, effects, episodes, flight, memory, perception, step
from rebalancer.runtime.effects import (
    Carry,
    EndLoan,
    Progress,
    RemoveLeft,
    RollBack,
    Rules,
    Seen,
    Wave,
)
from rebalancer.runtime.memory import Drain, Loan, Memory, Removal
from rebalancer.runtime.seams import PoolConfig
from tests.support.factories import (
    INFERENCE_TAINT,
    KEYS,
    LEND_SPEC,
    POOL,
    T0,
    audit_record,
    policy,
    serving,
)
from tests.support.generated import POLICIES, minutes, nodes

TERM = ("me", 3)
MOSTLY = st.sampled_from((True, True, True, False))  # the tick that writes is the one to test
EPISODE_REASONS = {
    model.Reason.STRATEGY_FAILED,
    model.Reason.PLANNER_FAILED,
    model.Reason.RECOVERED,
}


class _Fixed:
    """A strategy the step never calls: its answer is part of what the tick saw."""

    name: ClassVar[str] = "fixed"
    reads_history: ClassVar[bool] = False

    def decide(self, view: model.PoolView) -> model.Proposal:
        raise AssertionError("the step asks no strategy")


def config(rules: PoolPolicy) -> PoolConfig:
    return PoolConfig(
        name=POOL,
        node_selector={"pool": "gpu"},
        policy=dataclasses.replace(rules, lend_spec=LEND_SPEC),
        marks=PodMarks(lend_taints=LEND_SPEC.add_taints, serving_taints=(INFERENCE_TAINT,)),
        strategy=_Fixed(),
        strategy_name="fixed",
    )


def ids() -> audit.NewId:
    numbers = count()
    return lambda: f"id-{next(numbers):04d}"


@st.composite
def ticks(draw: st.DrawFn) -> tuple[Memory, Seen, Rules]:
    """A memory and a tick: the pool as seen now, a strategy's answer, who leads."""
    now = T0 + draw(minutes(0, 14 * 24 * 60))
    size = draw(st.integers(0, 10))
    # A mixed pool (every phase, overrides valid and garbage, any policy) finds most of what can
    # go wrong; a quiet one (idle serving nodes, round numbers) is where lends are planned.
    quiet = draw(st.booleans())
    views = []
    for i in range(size):
        view = serving(f"n-{i:02d}") if quiet else draw(nodes(f"n-{i:02d}", now))
        views.append(dataclasses.replace(view, uid=f"uid-{i}-{draw(st.integers(0, 1))}"))
    rate = draw(st.floats(0, 30))
    sample = model.Sample(rate, now - timedelta(seconds=30)) if draw(MOSTLY) else None
    seen_pool = model.PoolSnapshot(tuple(views), demand=sample, demand_known=sample is not None)
    snapshot = model.Snapshot(now, {POOL: seen_pool})
    pool = config(policy() if quiet else draw(POLICIES))
    answer: object = (
        model.Proposal(draw(st.integers(0, 12)), "generated")
        if draw(st.booleans())
        else Failure.raised(RuntimeError("boom"))
    )
    leading = draw(MOSTLY)
    seen = Seen(snapshot, {POOL: answer}, "me", 3 if leading else None, leading, TERM)
    rules = Rules((pool,), KEYS, dry_run=not draw(MOSTLY), can_keep=draw(MOSTLY))
    return draw(memories(views, now)), seen, rules


@st.composite
def memories(draw: st.DrawFn, views: Sequence[model.NodeView], now: object) -> Memory:
    """What earlier ticks left: drains, loans and removals, of nodes seen now (under their UID
    or another) or of nodes gone."""
    names = [str(v.name) for v in views] + ["gone-0", "gone-1"]
    picked = st.sampled_from(names)
    uids = st.sampled_from(["uid-0-0", "uid-1-1", "old"])
    intent = audit_record(
        "r-1", T0, pool=str(POOL), node="x", action="reclaim", kind=audit.Kind.INTENT
    )
    draining = {
        NodeName(n): Drain(POOL, draw(uids), "d-1", None)
        for n in draw(st.lists(picked, max_size=3))
    }
    loans = {
        NodeName(n): Loan(POOL, model.NodeView(name=NodeName(n), labels={}, taints=(), uid="old"))
        for n in draw(st.lists(picked, max_size=3))
    }
    removing = {NodeName(n): Removal(POOL, intent, T0) for n in draw(st.lists(picked, max_size=2))}
    started = TERM if draw(MOSTLY) else None
    return Memory(started=started, draining=draining, loans=loans, removing=removing)


def carries(waves: Sequence[Wave]) -> list[Carry]:
    return [e for w in waves for e in w.items if isinstance(e, Carry)]


def drives(waves: Sequence[Wave], kind: type) -> list[NodeName]:
    out = []
    for wave in waves:
        for e in wave.items:
            if not isinstance(e, kind):
                continue
            if isinstance(e, EndLoan):
                out.append(e.view.name)
            elif isinstance(e, Progress | RollBack | RemoveLeft):
                out.append(e.node)
    return out


SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(ticks())
def test_a_follower_or_a_leader_not_started_writes_nothing(
    tick: tuple[Memory, Seen, Rules],
) -> None:
    before, seen, rules = tick
    after, out = step.step(before, seen, rules, ids())
    if seen.leading and before.started == TERM:
        assert out.batch is not None
        return
    assert out.batch is None
    assert out.taken is None
    assert out.refused is None
    assert not out.costs
    assert not out.catch_up
    # What is in flight stays as it was, to be driven by a tick that writes.
    assert (after.draining, after.loans, after.removing) == (
        before.draining,
        before.loans,
        before.removing,
    )


@SETTINGS
@given(ticks())
def test_every_intent_committed_is_carried_out_once_and_nothing_without_one(
    tick: tuple[Memory, Seen, Rules],
) -> None:
    before, seen, rules = tick
    _, out = step.step(before, seen, rules, ids())
    if out.batch is None:
        return
    assert out.taken is not None
    assert out.refused is not None
    committed = {r.id for r in out.batch.records}
    taken = carries(out.taken.waves)
    assert sorted(c.intent.id for c in taken) == sorted(r.id for r in out.batch.intents.values())
    assert {c.intent.id for c in taken} <= committed
    # While the store fails: only reclaims that keep inference, each kept on its node first; a
    # subset of what the taken branch carries out. Nothing at all in a dry run or with nowhere
    # to keep a record.
    refused = carries(out.refused.waves)
    assert all(c.keep_first and step.keeps_inference(c.step) for c in refused)
    assert {c.intent.id for c in refused} <= {c.intent.id for c in taken}
    if rules.dry_run or not rules.can_keep:
        assert not out.refused.waves
    # A drive that begins something commits its own intent first: none is in the tick's batch.
    for branch in (out.taken, out.refused):
        for wave in branch.waves:
            for e in wave.items:
                if isinstance(e, RollBack | EndLoan) or (isinstance(e, RemoveLeft) and e.new):
                    assert e.intent.id not in committed


@SETTINGS
@given(ticks())
def test_no_node_is_driven_twice_in_one_tick(tick: tuple[Memory, Seen, Rules]) -> None:
    before, seen, rules = tick
    _, out = step.step(before, seen, rules, ids())
    for branch in (out.taken, out.refused):
        if branch is None:
            continue
        stepped = {c.step.node for c in carries(branch.waves)}
        reclaimed = {c.step.node for c in carries(branch.waves) if c.step.action is Action.RECLAIM}
        passes = set(drives(branch.waves, Progress)) | set(drives(branch.waves, RollBack))
        vanished = {
            e.node for w in branch.waves for e in w.items if isinstance(e, Progress) and e.vanished
        }
        ends = set(drives(branch.waves, EndLoan))
        removals = drives(branch.waves, RemoveLeft)
        assert not stepped & (passes - vanished)
        assert not vanished & stepped
        assert not ends & vanished
        assert len(removals) == len(set(removals))
        assert not set(removals) & (reclaimed | passes | ends)


@SETTINGS
@given(ticks())
def test_one_lent_count_for_the_gauge_and_the_safety_only_proposal(
    tick: tuple[Memory, Seen, Rules],
) -> None:
    before, seen, rules = tick
    _, out = step.step(before, seen, rules, ids())
    (pool,) = rules.pools
    lent = lent_count(seen.snapshot.pools[POOL], KEYS, pool.lent_taints)
    assert out.noted.lent == {str(POOL): lent}
    if isinstance(seen.answers[POOL], Failure):
        assert out.decision.proposals[POOL].lend_target == lent
        assert out.noted.safety_only == {str(POOL): True}


def test_an_episode_is_audited_when_it_starts_and_when_it_ends_once_each() -> None:
    pool = config(policy())
    rules = Rules((pool,), KEYS)
    snapshot = model.Snapshot(T0, {POOL: model.PoolSnapshot(nodes=())})
    failing = Seen(snapshot, {POOL: Failure.raised(RuntimeError("x"))}, "me", 3, True, TERM)
    working = dataclasses.replace(failing, answers={POOL: model.Proposal(0, "fine")})
    memory_ = Memory(started=TERM)
    reasons = []
    for seen in (failing, failing, working, working):
        memory_, out = step.step(memory_, seen, rules, ids())
        assert out.batch is not None
        assert out.taken is not None
        reasons += [r.reason for r in out.batch.records if r.reason in EPISODE_REASONS]
        memory_ = out.taken.memory  # the store took the batch
    assert reasons == [model.Reason.STRATEGY_FAILED, model.Reason.RECOVERED]


def test_a_replaced_lent_node_has_its_loan_ended_and_nothing_else_begun_on_it_in_that_tick() -> (
    None
):
    """A lent node deleted and created again under its name, with a removal of what an earlier
    node left already under way there: the loan is ended under an intent of its own, and the
    removal waits for the next tick (the snapshot that shows the pods predates the end)."""
    pool = config(policy())
    rules = Rules((pool,), KEYS)
    old = dataclasses.replace(serving("n-00"), uid="uid-old")
    new = dataclasses.replace(serving("n-00"), uid="uid-new")
    intent = audit_record(
        "r-1", T0, pool=str(POOL), node="n-00", action="reclaim", kind=audit.Kind.INTENT
    )
    before = Memory(
        started=TERM,
        loans={NodeName("n-00"): Loan(POOL, old)},
        removing={NodeName("n-00"): Removal(POOL, intent, T0)},
    )
    snapshot = model.Snapshot(T0, {POOL: model.PoolSnapshot((new,), demand_known=False)})
    seen = Seen(snapshot, {POOL: model.Proposal(0, "hold")}, "me", 3, True, TERM)
    _, out = step.step(before, seen, rules, ids())
    assert out.taken is not None
    assert drives(out.taken.waves, EndLoan) == ["n-00"]
    assert drives(out.taken.waves, RemoveLeft) == []


def test_an_episode_the_store_did_not_take_is_audited_again_next_tick() -> None:
    pool = config(policy())
    rules = Rules((pool,), KEYS)
    snapshot = model.Snapshot(T0, {POOL: model.PoolSnapshot(nodes=())})
    failing = Seen(snapshot, {POOL: Failure.raised(RuntimeError("x"))}, "me", 3, True, TERM)
    memory_, out = step.step(Memory(started=TERM), failing, rules, ids())
    assert out.refused is not None
    memory_ = out.refused.memory  # the store failed the batch
    _, again = step.step(memory_, failing, rules, ids())
    assert again.batch is not None
    assert [r.reason for r in again.batch.records if r.reason in EPISODE_REASONS] == [
        model.Reason.STRATEGY_FAILED
    ]


PURE = (memory, step, effects, flight, episodes, budgets, perception)


def test_the_step_reads_no_clock_and_awaits_nothing() -> None:
    """The import-linter contract keeps I/O libraries out of these modules; this keeps out the
    two things an import does not show: an ``async def`` and a read of the wall clock."""
    for module in PURE:
        tree = ast.parse(inspect.getsource(module))
        found = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.AsyncFunctionDef | ast.Await)
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"now", "utcnow", "today", "time", "monotonic"}
            )
        ]
        assert not found, f"{module.__name__}: {[ast.dump(n)[:60] for n in found]}"
