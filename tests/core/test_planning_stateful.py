"""The planner tick after tick: a fake pool whose nodes go through lend and reclaim cycles.

The machine holds fake nodes that change only as the actuator would change them: a lend step is
``begin_lend`` and ``finish_lend`` applied at once, a reclaim step is ``begin_reclaim``, and a
later rule finishes each reclaim whose deadline has passed. In between, the clock moves (by
seconds or by months, across DST changes of the pool's window zone), demand changes or goes
missing, stale or not a number, operators pause the controller and set and clear overrides
(valid and garbage), inference pods land on serving nodes and training on lent ones, nodes turn
not ready, and a crash leaves a lend half done until the actuator rolls it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rebalancer.core import model, nodestate, overrides, windows
from rebalancer.core.model import Action, NodeName, Origin, PodRole
from rebalancer.core.policy import ALL_GUARDS, Guard, PoolPolicy
from tests.support.factories import (
    KEYS,
    LEND_SPEC,
    LENDS,
    POOL,
    SERVES,
    apply_step,
    borrowed_pods,
    count_in,
    inference_pod,
    lending,
    names,
    phase_of,
    planned,
    proposal,
    rebuilt,
    serving,
    state_of,
    unaccounted,
)

# Saturday before the US spring-forward change (8 March 2026) and three weeks before the EU one.
START = datetime(2026, 3, 7, 20, 0, tzinfo=UTC)
ZONED_WINDOWS = (
    "always",
    "daily 01:30-03:30 America/New_York",  # holds the skipped hour of the spring change
    "Mon-Fri 22:00-06:00 Europe/Berlin; Sat,Sun 00:00-24:00 Europe/Berlin",
    "Sat 23:00-02:30 America/New_York",
)
OVERRIDE_CHOICES: Mapping[str, tuple[str, ...]] = {
    KEYS.window: (*ZONED_WINDOWS, "never", "Mon-Fri 25:00-06:00", ""),
    KEYS.lend: ("never", "auto", "now", "whenever"),
    KEYS.reclaim: ("now", "later"),
    KEYS.paused: ("true", "false", "yes"),
    KEYS.override_until: ("+1h", "-1h", "soon"),
}
TAINTS_AND_LABELS = tuple[tuple[model.Taint, ...], dict[str, str]]


def zoned_window(text: str) -> windows.Window:
    window = windows.parse(text)
    assert isinstance(window, windows.Window)
    return window


def seconds(low: int, high: int) -> st.SearchStrategy[timedelta]:
    return st.integers(low, high).map(lambda s: timedelta(seconds=s))


POLICIES = st.builds(
    PoolPolicy,
    rps_per_node=st.sampled_from((5.0, 10.0, 25.0)),
    min_serving=st.integers(0, 2),
    headroom=st.sampled_from((0.0, 0.2, 0.5)),
    max_lent_fraction=st.sampled_from((0.5, 0.75, 1.0)),
    min_loan=seconds(0, 3600),
    cooldown=seconds(0, 1800),
    max_step_fraction=st.sampled_from((0.1, 0.25, 1.0)),
    reclaim_deadline=seconds(0, 300),
    window=st.sampled_from(ZONED_WINDOWS).map(zoned_window),
    zone=st.sampled_from(("UTC", "America/New_York")),
    lend_spec=st.just(LEND_SPEC),
    guards=st.sampled_from((ALL_GUARDS, frozenset())),  # as the controller, or a baseline
)
CLOCK_STEPS = seconds(1, 600) | seconds(600, 6 * 3600) | seconds(86400, 200 * 86400)
TARGETS = st.integers(-3, 10) | st.integers(-(10**9), 10**9)
PIPELINE = ("fresh", "fresh", "fresh", "late", "down")


class PlannerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.policy = PoolPolicy(rps_per_node=10.0)
        self.nodes: dict[NodeName, model.NodeView] = {}
        self.originals: dict[NodeName, TAINTS_AND_LABELS] = {}
        self.demand: float | None = 0.0
        self.sampled_at = START
        self.paused = False

    # -- set-up and helpers -------------------------------------------------------------------

    @initialize(policy=POLICIES, count=st.integers(3, 8))
    def build_pool(self, policy: PoolPolicy, count: int) -> None:
        self.policy = policy
        for name in names("n", count):
            node = serving(name)
            self.nodes[node.name] = node
            self.originals[node.name] = (node.taints, dict(node.labels))

    def pick(self, data: st.DataObject) -> model.NodeView:
        name = data.draw(st.sampled_from(sorted(self.nodes)), label="node")
        return self.nodes[name]

    def sample(self) -> model.Sample | None:
        return None if self.demand is None else model.Sample(self.demand, self.sampled_at)

    def usable_demand(self) -> float | None:
        """The demand the planner may read: a finite rate >= 0, else unknown."""
        if self.demand is None or not math.isfinite(self.demand) or self.demand < 0:
            return None
        return self.demand

    def in_phase(self, *phases: nodestate.Phase) -> list[model.NodeView]:
        return [n for n in self.nodes.values() if phase_of(n) in phases]

    # -- the world moves ----------------------------------------------------------------------

    @rule(step=CLOCK_STEPS)
    def advance_the_clock(self, step: timedelta) -> None:
        self.now += step

    @rule(rps=st.floats(0.0, 30.0) | st.floats(0.0, 500.0))
    def demand_changes(self, rps: float) -> None:
        self.demand, self.sampled_at = rps, self.now

    @rule()
    def demand_goes_missing(self) -> None:
        self.demand = None

    @rule(value=st.sampled_from((math.nan, math.inf, -1.0)))
    def the_metric_returns_something_that_is_not_a_rate(self, value: float) -> None:
        self.demand, self.sampled_at = value, self.now

    @rule(paused=st.booleans())
    def an_operator_pauses_or_resumes_everything(self, paused: bool) -> None:
        self.paused = paused

    @rule(age=seconds(0, 3600))
    def the_last_sample_is_old(self, age: timedelta) -> None:
        self.demand = self.demand if self.demand is not None else 0.0
        self.sampled_at = self.now - age

    @rule(data=st.data(), key=st.sampled_from(sorted(OVERRIDE_CHOICES)))
    def an_operator_sets_an_override(self, data: st.DataObject, key: str) -> None:
        node = self.pick(data)
        value = data.draw(st.sampled_from(OVERRIDE_CHOICES[key]), label="value")
        if value in ("+1h", "-1h"):
            sign = 1 if value == "+1h" else -1
            value = nodestate.format_time(self.now + sign * timedelta(hours=1))
        self.nodes[node.name] = rebuilt(node, annotations={**node.annotations, key: value})

    @rule(data=st.data())
    def an_operator_clears_the_overrides(self, data: st.DataObject) -> None:
        node = self.pick(data)
        ours = (KEYS.window, KEYS.lend, KEYS.reclaim, KEYS.paused, KEYS.override_until)
        kept = {k: v for k, v in node.annotations.items() if k not in ours}
        self.nodes[node.name] = rebuilt(node, annotations=kept)

    @precondition(lambda self: bool(self.in_phase(nodestate.Phase.SERVING)))
    @rule(data=st.data())
    def an_inference_pod_lands_on_a_serving_node(self, data: st.DataObject) -> None:
        candidates = sorted(n.name for n in self.in_phase(nodestate.Phase.SERVING))
        node = self.nodes[data.draw(st.sampled_from(candidates), label="node")]
        self.nodes[node.name] = rebuilt(node, pods=(*node.pods, inference_pod()))

    @rule(data=st.data())
    def inference_pods_leave_a_node(self, data: st.DataObject) -> None:
        node = self.pick(data)
        kept = tuple(p for p in node.pods if p.role is not PodRole.INFERENCE)
        self.nodes[node.name] = rebuilt(node, pods=kept)

    @precondition(lambda self: bool(self.in_phase(nodestate.Phase.LENT)))
    @rule(data=st.data(), jobs=st.lists(st.sampled_from(("j1", "j2", "j3")), max_size=3))
    def training_lands_on_a_lent_node(self, data: st.DataObject, jobs: list[str]) -> None:
        candidates = sorted(n.name for n in self.in_phase(nodestate.Phase.LENT))
        node = self.nodes[data.draw(st.sampled_from(candidates), label="node")]
        self.nodes[node.name] = rebuilt(node, pods=(*node.pods, *borrowed_pods(*jobs)))

    @rule(data=st.data(), ready=st.booleans())
    def a_node_changes_readiness(self, data: st.DataObject, ready: bool) -> None:
        node = self.pick(data)
        self.nodes[node.name] = rebuilt(node, ready=ready)

    @precondition(lambda self: bool(self.in_phase(nodestate.Phase.SERVING)))
    @rule(data=st.data())
    def a_crash_interrupts_a_lend(self, data: st.DataObject) -> None:
        candidates = sorted(n.name for n in self.in_phase(nodestate.Phase.SERVING))
        node = self.nodes[data.draw(st.sampled_from(candidates), label="node")]
        self.nodes[node.name] = lending(node, self.now, self.policy.lend_spec)

    @rule()
    def the_actuator_rolls_back_interrupted_lends(self) -> None:
        for node in self.in_phase(nodestate.Phase.LENDING):
            rolled_back = nodestate.finish(
                state_of(node), KEYS, self.now, taints=node.taints, spec=self.policy.lend_spec
            )
            self.nodes[node.name] = nodestate.apply(node, rolled_back)

    @rule()
    def reclaims_past_their_deadline_finish(self) -> None:
        for node in self.in_phase(nodestate.Phase.RECLAIMING):
            state = state_of(node)
            assert state.deadline is not None
            if state.deadline <= self.now:
                change = nodestate.finish(
                    state, KEYS, self.now, taints=node.taints, spec=self.policy.lend_spec
                )
                done = nodestate.apply(node, change)
                kept = tuple(p for p in node.pods if p.role is not PodRole.BORROWED)
                self.nodes[node.name] = rebuilt(done, pods=kept)

    # -- the planner ticks --------------------------------------------------------------------

    @rule(lend_target=TARGETS, elapsed=seconds(0, 300), pipeline=st.sampled_from(PIPELINE))
    def the_planner_ticks(self, lend_target: int, elapsed: timedelta, pipeline: str) -> None:
        """A tick some time after the last rule; the metrics pipeline took a new sample (fresh),
        took none since the last one (late), or lost the series (down)."""
        self.now += elapsed
        if pipeline == "fresh" and self.demand is not None:
            self.sampled_at = self.now
        elif pipeline == "down":
            self.demand = None
        result = self.plan(lend_target)
        self.nodes = self.checked_outcome(result)

    def plan(self, lend_target: int) -> model.PoolPlan:
        snapshot = model.Snapshot(
            now=self.now,
            pools={
                POOL: model.PoolSnapshot(nodes=tuple(self.nodes.values()), demand=self.sample())
            },
            paused=self.paused,
        )
        proposals = {POOL: proposal(lend_target)}
        return planned(snapshot, proposals, {POOL: self.policy}).pools[POOL]

    def checked_outcome(self, result: model.PoolPlan) -> dict[NodeName, model.NodeView]:
        """The pool once ``result`` is carried out, checked against properties (a) to (f)."""
        before = self.nodes
        if self.paused:  # only the reclaims that keep inference served still happen
            assert all(s.action is Action.RECLAIM for s in result.steps)
            assert {s.intent.origin for s in result.steps} <= {Origin.SAFETY, Origin.OPERATOR}
        # (e) no node in two steps; (d) every refusal reported.
        stepped = [s.node for s in result.steps]
        assert len(stepped) == len(set(stepped))
        assert unaccounted(result) == []
        lends = [s for s in result.steps if s.action is Action.LEND]
        # (b) only idle, ready, unpaused serving nodes are lent.
        for step in lends:
            node = before[step.node]
            assert phase_of(node) is nodestate.Phase.SERVING
            assert not any(p.role in (PodRole.INFERENCE, PodRole.OTHER) for p in node.pods)
            assert node.ready
            parsed = overrides.parse(node.annotations, KEYS, self.policy.zone)
            assert not parsed.overrides.active(self.now).paused
            # Overrides fail closed: a node with one that cannot be read is never lent.
            assert (
                parsed.problems == () or parsed.overrides.active(self.now) is not parsed.overrides
            )
        # (c) nothing is lent while demand is unknown or stale.
        rps = self.usable_demand()
        fresh = rps is not None and self.now - self.sampled_at <= self.policy.staleness
        if Guard.METRICS in self.policy.guards and not fresh:
            assert lends == []

        after = dict(before)
        for step in result.steps:
            after[step.node] = apply_step(before[step.node], step, self.now, self.policy)

        # (a) serving never drops below the minimum because of a plan.
        minimum = self.policy.min_serving
        assert count_in(after.values(), SERVES) >= minimum or (
            count_in(before.values(), SERVES) < minimum and not lends
        )
        # (f) what demand needs with headroom stays serving, unless lending only went down.
        if Guard.HEADROOM in self.policy.guards and rps is not None:
            limit = len(after) - self.policy.need(rps)
            lent_before, lent_after = (
                count_in(before.values(), LENDS),
                count_in(after.values(), LENDS),
            )
            assert lent_after <= max(limit, lent_before)
        return after

    # -- what must always hold ----------------------------------------------------------------

    @invariant()
    def a_plan_made_now_would_keep_the_safety_properties(self) -> None:
        """(a) to (f) after every rule, for the extreme targets, without carrying the plan out."""
        for lend_target in (-1, 0, len(self.nodes) // 2, 10**9):
            self.checked_outcome(self.plan(lend_target))

    @invariant()
    def a_lent_node_always_carries_a_readable_original(self) -> None:
        lent = (nodestate.Phase.LENDING, nodestate.Phase.LENT, nodestate.Phase.RECLAIMING)
        for node in self.in_phase(*lent):
            state = nodestate.read(node, KEYS)
            assert isinstance(state, nodestate.NodeState)
            assert state.original is not None

    @invariant()
    def a_node_that_came_back_looks_as_it_did_before_it_was_first_lent(self) -> None:
        for node in self.in_phase(nodestate.Phase.SERVING):
            assert (node.taints, dict(node.labels)) == self.originals[node.name]

    @invariant()
    def a_node_being_reclaimed_already_has_its_serving_taints_and_labels(self) -> None:
        for node in self.in_phase(nodestate.Phase.RECLAIMING):
            taints, labels = self.originals[node.name]
            assert node.taints == taints
            assert {k: v for k, v in node.labels.items() if k != KEYS.state} == labels

    @invariant()
    def every_node_state_stays_readable(self) -> None:
        assert all(phase_of(n) is not None for n in self.nodes.values())


PlannerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=100, deadline=None)
TestPlannerMachine = PlannerMachine.TestCase
