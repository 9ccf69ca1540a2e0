"""``core.explain``: one node in each phase and under each rule that moves or holds it, through
``core.tick.plan_tick`` as the loop plans, and the first line an operator reads for each.

The table is the contract: a change to a rule's wording or to what the planner decides shows here
as the one line that changed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import timedelta

import pytest

from rebalancer.core import audit, explain, model, windows
from rebalancer.core.tick import PoolControls, plan_tick
from tests.support.factories import (
    KEYS,
    POOL,
    T0,
    begin_reclaim,
    borrowed_pod,
    demand,
    inference_pod,
    lend,
    lending,
    policy,
    proposal,
    returned,
    serving,
    with_overrides,
)

HOUR = timedelta(hours=1)
NIGHT = windows.parse("Mon-Sun 22:00-06:00 UTC")
assert isinstance(NIGHT, windows.Window)


@dataclasses.dataclass(frozen=True)
class Case:
    nodes: Sequence[model.NodeView]  # the pool; the first node is the one explained
    target: int  # what the strategy proposes
    rps: float | None = 5.0  # one node's worth is 10 rps
    age: timedelta = timedelta(seconds=30)
    queue: float | None = None
    frozen: bool = False
    changes: dict[str, object] = dataclasses.field(default_factory=dict)  # to the policy
    alerts: tuple[model.FiringAlert, ...] = ()
    history: model.DemandHistory | None = None


def explained(case: Case) -> dict[str, object]:
    pool_policy = policy(**case.changes)
    sample = None if case.rps is None else demand(case.rps, case.age)
    queue = None if case.queue is None else demand(case.queue)
    seen = model.PoolSnapshot(
        nodes=tuple(case.nodes),
        demand=sample,
        queue=queue,
        alerts=case.alerts,
        history=case.history,
    )
    if case.rps is None:
        seen = dataclasses.replace(seen, demand_known=False, unknown_since=T0 - case.age)
    snapshot = model.Snapshot(now=T0, pools={POOL: seen})
    controls = PoolControls(pool_policy, frozen=case.frozen)
    decision = plan_tick(snapshot, {POOL: proposal(case.target)}, {POOL: controls}, KEYS)
    name = case.nodes[0].name
    doc = explain.node(name, POOL, snapshot, decision, pool_policy, KEYS, frozen=case.frozen)
    json.dumps(doc)  # what the CLI and the HTTP API print: plain JSON
    return doc


def with_label(node: model.NodeView, key: str, value: str) -> model.NodeView:
    return dataclasses.replace(node, labels={**node.labels, key: value})


def others(count: int, prefix: str = "s") -> list[model.NodeView]:
    return [serving(f"{prefix}-{i}") for i in range(count)]


LENT_AT = T0 - HOUR
QUEUE_HIGH = model.FiringAlert(
    name="InferenceQueueHigh",
    fingerprint="3f2a",
    starts_at=T0 - timedelta(minutes=2),
    matcher='{alertname="InferenceQueueHigh"}',
    received=T0 - timedelta(minutes=1),
    until=T0 + HOUR,
)
TOO_SOON = T0 - timedelta(minutes=5)

CASES = {
    "serving, lent by the strategy": (
        Case([serving("n"), *others(3)], target=1),
        "node n (pool gpu): serving; next tick: lend (strategy: test wants 1 lent)",
    ),
    "serving, not idle": (
        Case([serving("n", pods=[inference_pod()]), serving("s-0")], target=2, rps=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: not_idle refuses "
        "(running inference or other pods)",
    ),
    "serving, NotReady": (
        Case([serving("n", ready=False), serving("s-0")], target=2, rps=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: not_ready refuses "
        "(not ready)",
    ),
    "serving, lend=never": (
        Case([with_overrides(serving("n"), lend="never"), serving("s-0")], target=2, rps=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: lend_never refuses "
        "(marked lend=never)",
    ),
    "serving, paused by an operator": (
        Case([with_overrides(serving("n"), paused="true"), serving("s-0")], target=2, rps=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: node_paused refuses "
        "(paused)",
    ),
    "serving, an override that cannot be read": (
        Case([with_overrides(serving("n"), lend="sometimes"), serving("s-0")], target=2, rps=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: bad_override refuses "
        "(with an override that cannot be read)",
    ),
    "serving, outside its own window": (
        Case(
            [with_overrides(serving("n"), window="Mon-Sun 22:00-06:00 UTC"), serving("s-0")],
            2,
            rps=0,
        ),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: outside_window "
        "refuses (outside their window)",
    ),
    "serving, in cooldown": (
        Case(
            [returned("n", T0 - 2 * HOUR, T0 - timedelta(minutes=10)), serving("s-0")],
            target=2,
            rps=0,
            changes={"cooldown": timedelta(minutes=30)},
        ),
        "node n (pool gpu): serving since 2026-03-02T11:50:00Z (10m ago); next tick: nothing, "
        "it stays serving: cooldown refuses (in cooldown after a reclaim)",
    ),
    "serving, lend=now with no room": (
        Case([with_overrides(serving("n"), lend="now")], target=0, rps=0),
        "node n (pool gpu): serving; next tick: operator lend refused (min_serving: 1 must serve)",
    ),
    "serving, lend=now on a frozen pool": (
        Case([with_overrides(serving("n"), lend="now"), *others(2)], target=0, frozen=True),
        "node n (pool gpu): serving; next tick: operator lend refused (frozen: the pool is "
        "frozen: nothing moves, not even safety reclaims)",
    ),
    "serving, headroom": (
        Case([serving("n"), *others(3)], target=3, rps=35),
        "node n (pool gpu): serving; next tick: not chosen: the strategy lend of 3 had 3 "
        "refused (headroom: demand needs 4 of 4 nodes with 0% headroom)",
    ),
    "serving, the strategy wants nothing lent": (
        Case([serving("n"), *others(3)], target=0),
        "node n (pool gpu): serving; next tick: nothing, it stays serving: the strategy wants "
        "0 lent, 0 are",
    ),
    "serving, demand unknown": (
        Case([serving("n"), *others(3)], target=1, rps=None),
        "node n (pool gpu): serving; next tick: not chosen: the strategy lend of 1 had 1 "
        "refused (metrics_stale: no lending while demand is unknown (demand unknown now; 30s "
        "since the start, with no sample))",
    ),
    "serving, requests queueing": (
        Case([serving("n"), *others(3)], target=1, queue=500, changes={"queue_limit": 50}),
        "node n (pool gpu): serving; next tick: not chosen: the strategy lend of 1 had 1 "
        "refused (queue_building: 500 requests wait (limit 50): serving is short already)",
    ),
    "serving, not chosen under the per-tick limit": (
        Case([serving("s-9"), *others(4)], target=4, changes={"max_step_fraction": 0.2}),
        "node s-9 (pool gpu): serving; next tick: not chosen: the strategy lend of 4 had 3 "
        "refused (rate_limit: at most 1 strategy changes per tick)",
    ),
    "lending": (
        Case([lending(serving("n"), LENT_AT), *others(2)], target=1),
        "node n (pool gpu): lending since 2026-03-02T11:00:00Z (1h00m ago); next tick: "
        "nothing, it stays lending: lending: in flight; the next tick carries it on (a lend in "
        "flight is rolled back) before any rule applies to it",
    ),
    "lent, kept": (
        Case([lend(serving("n"), LENT_AT), *others(2)], target=1),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: nothing, "
        "it stays lent: the strategy wants 1 lent, 1 are",
    ),
    "lent, taken back by the strategy": (
        Case([lend(serving("n"), LENT_AT), *others(2)], target=0),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        "(strategy: test wants 0 lent)",
    ),
    "lent, for less than min_loan": (
        Case(
            [lend(serving("n"), TOO_SOON), *others(2)],
            target=0,
            changes={"min_loan": timedelta(minutes=30)},
        ),
        "node n (pool gpu): lent since 2026-03-02T11:55:00Z (5m ago); next tick: left out of "
        "the strategy reclaim of 1: min_loan_time",
    ),
    "lent, demand above serving": (
        Case([lend(serving("n"), LENT_AT), serving("s-0")], target=1, rps=15),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        "(demand_above_serving: demand needs 2 serving nodes, 1 serve or are returning)",
    ),
    "lent, outside the pool's window": (
        Case([lend(serving("n"), LENT_AT), *others(2)], target=1, changes={"window": NIGHT}),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        "(window_closed: window Mon-Sun 22:00-06:00 UTC)",
    ),
    "lent, reclaim=now": (
        Case([with_overrides(lend(serving("n"), LENT_AT), reclaim="now"), *others(2)], 1),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        "(operator_reclaim_now: an operator asked for it)",
    ),
    "lent, demand unknown past the grace period": (
        Case([lend(serving("n"), LENT_AT), *others(2)], target=1, rps=None, age=HOUR),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        "(metrics_lost: demand is unknown (demand unknown 3600s since the start, with no "
        "sample, past the grace period): inference comes first)",
    ),
    "lent, paused, while demand needs it": (
        Case(
            [with_overrides(lend(serving("n"), LENT_AT), paused="true"), serving("s-0")],
            target=1,
            rps=15,
        ),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: left out "
        "of the safety reclaim of 1: node_paused",
    ),
    "lent, an Alertmanager alert fires": (
        Case([lend(serving("n"), LENT_AT), *others(2)], target=1, alerts=(QUEUE_HIGH,)),
        "node n (pool gpu): lent since 2026-03-02T11:00:00Z (1h00m ago); next tick: reclaim "
        '(alert_firing: alert InferenceQueueHigh ({alertname="InferenceQueueHigh"}) fires: 3 '
        "nodes come back at a time, 0 are on their way back)",
    ),
    "reclaiming": (
        Case([begin_reclaim(lend(serving("n"), LENT_AT), TOO_SOON), *others(2)], target=0),
        "node n (pool gpu): reclaiming since 2026-03-02T11:55:00Z (5m ago); next tick: "
        "nothing, it stays reclaiming: reclaiming: in flight; the next tick carries it on (a "
        "lend in flight is rolled back) before any rule applies to it",
    ),
    "a state that cannot be read": (
        Case([with_label(serving("n"), KEYS.state, "borrowed"), *others(2)], target=0),
        "node n (pool gpu): unreadable; next tick: reclaim (state_unreadable: its state cannot "
        "be read: it is taken back from the pool's specification, so that it serves again)",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_first_line_says_the_phase_and_what_the_next_tick_does(name: str) -> None:
    case, first = CASES[name]
    assert explain.node_lines(explained(case))[0] == first


def test_every_rule_on_a_lend_is_listed_with_its_verdict() -> None:
    doc = explained(CASES["serving, not idle"][0])
    rules = doc["rules"]
    assert isinstance(rules, dict)
    verdicts = {c["rule"]: c["verdict"] for c in rules["checks"]}
    assert verdicts == {
        "bad_state": "allows",
        "bad_override": "allows",
        "node_paused": "allows",
        "lend_never": "allows",
        "operator_reclaim_now": "allows",
        "not_ready": "allows",
        "not_idle": "refuses",
        "outside_window": "allows",
        "cooldown": "allows",
        "warming": "allows",
        "min_serving": "allows",
        "rate_limit": "allows",
    }
    assert doc["pods"] == {"inference": ["ns/llm-0"], "borrowed": [], "daemon": [], "other": []}


def test_lend_now_skips_the_strategy_only_rules_and_a_bad_override_is_named() -> None:
    node = with_overrides(serving("n"), lend="now", window=str(NIGHT))
    doc = explained(Case([node, *others(2)], target=0))
    rules = doc["rules"]
    assert isinstance(rules, dict)
    skipped = [c["rule"] for c in rules["checks"] if c["verdict"] == "skipped"]
    assert skipped == ["outside_window", "cooldown", "warming"]
    assert doc["next"] == [
        {
            "what": "lend",
            "node": "n",
            "reason": "operator_lend_now",
            "origin": "operator",
            "message": "an operator asked to lend this node now",
            "text": "lend (operator_lend_now: an operator asked to lend this node now)",
        }
    ]
    bad = explained(Case([with_overrides(serving("n"), paused="yes"), *others(2)], target=0))
    assert bad["override_problems"] == [f"{KEYS.paused}='yes' is ignored: must be true or false"]


def test_the_pool_view_lists_steps_refusals_and_each_nodes_reason() -> None:
    nodes = [serving("busy", pods=[inference_pod()]), serving("idle"), serving("s-0")]
    seen = model.PoolSnapshot(nodes=tuple(nodes), demand=demand(0))
    snapshot = model.Snapshot(now=T0, pools={POOL: seen})
    controls = PoolControls(policy(min_serving=0))
    decision = plan_tick(snapshot, {POOL: proposal(3)}, {POOL: controls}, KEYS)
    doc = explain.pool(POOL, snapshot, decision, controls.policy, KEYS)
    assert [s["node"] for s in doc["steps"]] == ["idle", "s-0"]
    (refused,) = [r for r in doc["refusals"] if r["excluded"]["nodes"]]
    assert refused["excluded"] == {"nodes": {"busy": "not_idle"}, "more": 0}
    assert explain.pool_lines(doc)[0].startswith("pool gpu: 3 serving")


def test_a_firing_alert_is_shown_with_the_selector_it_matched() -> None:
    doc = explained(CASES["lent, an Alertmanager alert fires"][0])
    assert doc["alerts"] == [
        {
            "name": "InferenceQueueHigh",
            "fingerprint": "3f2a",
            "starts_at": "2026-03-02T11:58:00Z",
            "matcher": '{alertname="InferenceQueueHigh"}',
            "until": "2026-03-02T13:00:00Z",
        }
    ]
    assert (
        '  alert firing: InferenceQueueHigh (matched {alertname="InferenceQueueHigh"}), holds '
        "until 2026-03-02T13:00:00Z"
    ) in explain.node_lines(doc)


def test_a_sample_that_is_no_rate_is_shown_as_text() -> None:
    doc = explained(Case([serving("n"), *others(2)], target=0, rps=float("nan")))
    sample = doc["demand"]
    assert isinstance(sample, dict)
    assert sample["value"] == "nan"
    assert sample["unit"] == "requests_per_second"
    assert "not a figure in rps" in "\n".join(explain.node_lines(doc))
    json.dumps(doc, allow_nan=False)


def test_demand_is_shown_in_the_pools_unit_with_what_a_node_serves() -> None:
    tokens = {"unit": model.Unit.TOKENS_PER_SECOND, "rps_per_node": 2400.0}
    doc = explained(Case([serving("n"), *others(2)], target=0, rps=5000.0, changes=tokens))
    sample = doc["demand"]
    assert isinstance(sample, dict)
    assert (sample["unit"], sample["value"], sample["per_node"]) == (
        "tokens_per_second",
        5000.0,
        2400.0,
    )
    assert (
        "  demand: 5000 tokens/s sampled 30s ago, needs 3 nodes of 2400 tokens/s"
        in explain.node_lines(doc)
    )


def history_line(history: model.DemandHistory) -> str:
    doc = explained(Case([serving("n"), *others(2)], target=0, history=history))
    (line,) = (line for line in explain.node_lines(doc) if line.startswith("  history:"))
    return line


def test_a_history_with_no_points_says_how_far_back_it_was_searched_not_an_age() -> None:
    # Prometheus unreachable: the read ends where it started, 8 days ago, and holds nothing.
    week = model.DemandHistory(
        start=T0 - timedelta(days=8), step=timedelta(minutes=1), values=(None,) * 3, end_index=3
    )
    assert history_line(week) == "  history: no points in the last 8d (Prometheus unreachable?)"


def test_a_history_gives_the_age_of_its_newest_point_not_of_its_end() -> None:
    # 20 one-minute steps up to T0 - 4m; the last 6 are gaps, so its newest point is 10m old.
    start = T0 - timedelta(minutes=24)
    values = (*([5.0] * 14), *([None] * 6))
    history = model.DemandHistory(
        start=start, step=timedelta(minutes=1), values=values, end_index=20
    )
    assert history_line(history) == (
        "  history: 20m of 1m steps (14 points) up to 2026-03-02T11:56:00Z, "
        "its newest point 10m old"
    )


def test_the_audit_record_of_a_refusal_names_each_node_left_out_and_why() -> None:
    nodes = [
        serving("busy", pods=[inference_pod()]),
        with_overrides(serving("kept"), lend="never"),
        serving("idle"),
    ]
    seen = model.PoolSnapshot(nodes=tuple(nodes), demand=demand(0))
    snapshot = model.Snapshot(now=T0, pools={POOL: seen})
    controls = PoolControls(policy(min_serving=0))
    decision = plan_tick(snapshot, {POOL: proposal(3)}, {POOL: controls}, KEYS)
    ctx = audit.Context(controller="test", term=None, strategy="test")
    ids = iter(range(100))
    tick = audit.build_tick(decision.plan, snapshot, ctx, lambda: f"r{next(ids)}", keys=KEYS)
    (refusal,) = [r for r in tick.records if r.kind is audit.Kind.REFUSAL]
    assert (refusal.reason, refusal.count) == ("not_idle", 2)
    assert refusal.detail["excluded"] == {
        "nodes": {"busy": "not_idle", "kept": "lend_never"},
        "more": 0,
    }


def test_a_borrowed_pod_an_earlier_node_of_the_name_left_is_named_with_what_becomes_of_it() -> None:
    left = dataclasses.replace(borrowed_pod("job-a"), bound=T0 - HOUR)
    fresh = dataclasses.replace(borrowed_pod("job-b"), bound=T0)
    node = dataclasses.replace(serving("n", pods=[left, fresh]), uid="u2", created=T0 - HOUR / 2)
    doc = explained(Case([node, *others(2)], target=3))
    assert doc["left_by_earlier_node"] == ["ns/job-a-worker-0"]
    assert (
        "  left by an earlier node of its name: ns/job-a-worker-0; each tick evicts them "
        "(deletes them past the pool's reclaim deadline) until gone"
    ) in explain.node_lines(doc)
    assert explained(Case([serving("n"), *others(2)], target=3))["left_by_earlier_node"] == []
