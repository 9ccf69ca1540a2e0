"""Properties of the planner over generated pools: what holds whatever the pool looks like.

A generated pool mixes nodes in every phase (built with the codec), nodes whose state cannot be
read, idle and busy nodes, ready and not, operator overrides valid and garbage, a demand sample
that is fresh, stale, lost or missing, random policies and any strategy target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import model, nodestate, overrides
from rebalancer.core.model import Action, NodeName, Origin, PodRole
from rebalancer.core.policy import Guard, PoolPolicy
from tests.support.factories import (
    KEYS,
    LENDS,
    POOL,
    SERVES,
    T0,
    apply_plan,
    count_in,
    phase_of,
    planned,
    proposal,
    unaccounted,
)
from tests.support.generated import POLICIES, minutes, nodes


@dataclass(frozen=True)
class Scenario:
    now: datetime
    nodes: tuple[model.NodeView, ...]
    sample: model.Sample | None
    policy: PoolPolicy
    target: int | None

    queue: model.Sample | None = None
    read_failed: bool = False  # this tick's read gave nothing: ``sample`` is the last good one
    held: model.DropHeld | None = None

    def plan(self, paused: bool = False, frozen: bool = False) -> model.PoolPlan:
        pool = model.PoolSnapshot(
            nodes=self.nodes,
            demand=self.sample,
            queue=self.queue,
            demand_known=not self.read_failed,
            unknown_since=self.now - timedelta(minutes=3) if self.sample is None else None,
            held=self.held,
        )
        snapshot = model.Snapshot(now=self.now, pools={POOL: pool}, paused=paused, frozen=frozen)
        proposals = {} if self.target is None else {POOL: proposal(self.target)}
        return planned(snapshot, proposals, {POOL: self.policy}).pools[POOL]

    def demand(self) -> float | None:
        """The demand the planner may read: a finite rate >= 0, else unknown."""
        if self.sample is None or not math.isfinite(self.sample.value) or self.sample.value < 0:
            return None
        return self.sample.value

    def demand_known(self) -> bool:
        if self.sample is None or self.demand() is None or self.read_failed or self.held:
            return False
        return self.sample.age(self.now) <= self.policy.staleness

    def queue_building(self) -> bool:
        return (
            self.queue is not None
            and self.queue.age(self.now) <= self.policy.staleness
            and self.queue.value > self.policy.queue_limit
        )


SAMPLE_AGES = st.none() | minutes(0, 30)
RATES = (
    st.floats(0.0, 1000.0)
    | st.floats(1e-9, 1e9)
    | st.sampled_from((0.0, 1e300, math.nan, math.inf, -math.inf, -1.0, -0.0))
)
TARGETS = st.none() | st.integers(-5, 15) | st.integers(-(10**12), 10**12)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    now = T0 + draw(minutes(0, 14 * 24 * 60))
    count = draw(st.integers(0, 12))
    pool = tuple(draw(nodes(f"n-{i:02d}", now)) for i in range(count))
    age = draw(SAMPLE_AGES)
    sample = None if age is None else model.Sample(value=draw(RATES), at=now - age)
    queue_age = draw(SAMPLE_AGES)
    queue = None if queue_age is None else model.Sample(draw(st.floats(0, 50)), now - queue_age)
    held = None
    if sample is not None and draw(st.booleans()):
        seen = model.Sample(draw(RATES), sample.at)
        held = model.DropHeld(level=sample, seen=seen, since=now - draw(minutes(0, 10)))
    failed = draw(st.booleans())
    return Scenario(now, pool, sample, draw(POLICIES), draw(TARGETS), queue, failed, held)


# ---------------------------------------------------------------------------------------------
# Helpers


def readable(pool: Sequence[model.NodeView]) -> list[model.NodeView]:
    return [n for n in pool if phase_of(n) is not None]


def active_overrides(node: model.NodeView, scenario: Scenario) -> overrides.Overrides:
    parsed = overrides.parse(node.annotations, KEYS, scenario.policy.zone)
    return parsed.overrides.active(scenario.now)


def by_name(pool: Sequence[model.NodeView]) -> dict[NodeName, model.NodeView]:
    return {n.name: n for n in pool}


SETTINGS = settings(max_examples=100, deadline=None)


# ---------------------------------------------------------------------------------------------
# Properties


@SETTINGS
@given(scenarios())
def test_serving_never_drops_below_the_minimum_because_of_a_plan(scenario: Scenario) -> None:
    result = scenario.plan()
    after = apply_plan(scenario.nodes, result, scenario.now, scenario.policy)
    before_serving = count_in(scenario.nodes, SERVES)
    after_serving = count_in(after, SERVES)
    lends = any(s.action is Action.LEND for s in result.steps)

    minimum = scenario.policy.min_serving
    assert after_serving >= minimum or (before_serving < minimum and not lends)


@SETTINGS
@given(scenarios())
def test_only_idle_ready_unpaused_serving_nodes_are_lent(scenario: Scenario) -> None:
    result = scenario.plan()
    pool = by_name(scenario.nodes)

    for step in result.steps:
        if step.action is not Action.LEND:
            continue
        node = pool[step.node]
        assert phase_of(node) is nodestate.Phase.SERVING
        assert not any(p.role in (PodRole.INFERENCE, PodRole.OTHER) for p in node.pods)
        assert node.ready
        assert not active_overrides(node, scenario).paused


@SETTINGS
@given(scenarios())
def test_only_lent_unpaused_nodes_are_reclaimed_and_never_against_lend_now(
    scenario: Scenario,
) -> None:
    result = scenario.plan()
    pool = by_name(scenario.nodes)

    for step in result.steps:
        if step.action is Action.RECLAIM:
            node = pool[step.node]
            # A node whose state cannot be read is planned as lent (and taken back).
            assert phase_of(node) in (nodestate.Phase.LENT, None)
            assert not active_overrides(node, scenario).paused
            if step.intent.origin is Origin.STRATEGY:
                assert active_overrides(node, scenario).lend is not overrides.LendMode.NOW


@SETTINGS
@given(scenarios())
def test_nothing_is_lent_while_demand_is_unknown_or_stale(scenario: Scenario) -> None:
    result = scenario.plan()

    guards = scenario.policy.guards
    if {Guard.METRICS, Guard.DEMAND_DROP_HOLD} <= guards and not scenario.demand_known():
        assert [s for s in result.steps if s.action is Action.LEND] == []


@SETTINGS
@given(scenarios())
def test_nothing_is_lent_while_requests_queue_beyond_the_limit(scenario: Scenario) -> None:
    result = scenario.plan()

    if Guard.QUEUE_LIMIT in scenario.policy.guards and scenario.queue_building():
        assert [s for s in result.steps if s.action is Action.LEND] == []


@SETTINGS
@given(scenarios())
def test_every_refusal_is_reported(scenario: Scenario) -> None:
    result = scenario.plan()

    assert unaccounted(result) == []
    assert all(r.count > 0 for r in result.rejections)
    assert all(i.count > 0 for i in result.intents)


@SETTINGS
@given(scenarios())
def test_no_node_appears_in_two_steps(scenario: Scenario) -> None:
    names = [s.node for s in scenario.plan().steps]

    assert len(names) == len(set(names))


@SETTINGS
@given(scenarios())
def test_lending_leaves_what_demand_needs_with_headroom(scenario: Scenario) -> None:
    rps = scenario.demand()
    if Guard.HEADROOM not in scenario.policy.guards or rps is None:
        return
    result = scenario.plan()
    after = apply_plan(scenario.nodes, result, scenario.now, scenario.policy)
    before_lent, after_lent = count_in(scenario.nodes, LENDS), count_in(after, LENDS)

    limit = len(scenario.nodes) - scenario.policy.need(rps)
    assert after_lent <= limit or after_lent <= before_lent


@SETTINGS
@given(scenarios())
def test_nodes_whose_state_cannot_be_read_are_only_taken_back_and_always_reported(
    scenario: Scenario,
) -> None:
    result = scenario.plan()
    unreadable = {n.name for n in scenario.nodes if phase_of(n) is None}

    for step in result.steps:
        if step.node in unreadable:
            assert step.action is Action.RECLAIM
    if unreadable:
        assert [s for s in result.steps if s.action is Action.LEND] == []
    reported = {f.node for f in result.findings if f.reason is model.Reason.STATE_UNREADABLE}
    assert reported >= unreadable


@SETTINGS
@given(scenarios())
def test_a_global_freeze_changes_no_node_and_refuses_every_intent(scenario: Scenario) -> None:
    result = scenario.plan(frozen=True)

    assert result.steps == ()
    assert unaccounted(result) == []
    assert {r.reason for r in result.rejections} <= {model.Reason.FROZEN}


@SETTINGS
@given(scenarios())
def test_a_global_pause_lends_nothing_and_moves_only_to_keep_inference_served(
    scenario: Scenario,
) -> None:
    result = scenario.plan(paused=True)

    assert unaccounted(result) == []
    assert all(s.action is model.Action.RECLAIM for s in result.steps)
    assert {s.intent.origin for s in result.steps} <= {model.Origin.SAFETY, model.Origin.OPERATOR}
