"""The planner's alert rule: a matched Alertmanager alert that fires is pressure on its pool.

While one holds, the pool lends nothing (``alert_firing``), and lent nodes come back in waves
of the pool's per-tick step, counting those already on their way back, as the queue rule
steps; past its ``until`` it holds nothing. The audit record's inputs name the alert."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rebalancer.core import audit, explain, model
from rebalancer.core.model import Action, Origin, Reason
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.tick import PoolControls, plan_tick
from tests.support.factories import (
    KEYS,
    POOL,
    T0,
    begin_reclaim,
    demand,
    lend,
    lent_nodes,
    planned,
    policy,
    proposal,
    refusals,
    serving,
    serving_nodes,
    stepped,
    unaccounted,
)

MINUTE = timedelta(minutes=1)


def firing(
    name: str = "InferenceQueueHigh", until: datetime = T0 + 30 * MINUTE, fingerprint: str = "f1"
) -> model.FiringAlert:
    return model.FiringAlert(
        name=name,
        fingerprint=fingerprint,
        starts_at=T0 - 2 * MINUTE,
        matcher=f'{{alertname="{name}"}}',
        received=T0 - MINUTE,
        until=until,
    )


def snapshot(
    nodes: Sequence[model.NodeView], alerts: Sequence[model.FiringAlert]
) -> model.Snapshot:
    pool = model.PoolSnapshot(nodes=tuple(nodes), demand=demand(0.0), alerts=tuple(alerts))
    return model.Snapshot(now=T0, pools={POOL: pool})


def plan(
    nodes: Sequence[model.NodeView],
    alerts: Sequence[model.FiringAlert],
    target: int,
    pool_policy: PoolPolicy | None = None,
) -> model.PoolPlan:
    made = planned(
        snapshot(nodes, alerts), {POOL: proposal(target)}, {POOL: pool_policy or policy()}
    )
    result = made.pools[POOL]
    assert unaccounted(result) == []
    return result


def test_a_firing_alert_refuses_every_loan_the_strategy_asks_for() -> None:
    result = plan(serving_nodes(4), [firing()], target=2)

    assert result.steps == ()
    assert refusals(result) == {Reason.ALERT_FIRING: 2}
    (refusal,) = result.rejections
    assert refusal.message == (
        'no lending while alert InferenceQueueHigh ({alertname="InferenceQueueHigh"}) fires'
    )


def test_a_firing_alert_takes_lent_nodes_back_in_waves_of_the_per_tick_step() -> None:
    # 8 nodes, a quarter per tick: 2 come back at once, whatever the strategy wants.
    nodes = [*serving_nodes(4), *lent_nodes(4)]

    result = plan(nodes, [firing()], target=4, pool_policy=policy(max_step_fraction=0.25))

    assert [(s.node, s.reason, s.urgent, s.intent.origin) for s in result.steps] == [
        ("l-00", Reason.ALERT_FIRING, True, Origin.SAFETY),
        ("l-01", Reason.ALERT_FIRING, True, Origin.SAFETY),
    ]


def test_nodes_already_on_their_way_back_count_toward_the_wave() -> None:
    back = begin_reclaim(lend(serving("r"), T0 - 60 * MINUTE), T0 - MINUTE)
    nodes = [*serving_nodes(3), *lent_nodes(4), back]

    result = plan(nodes, [firing()], target=4, pool_policy=policy(max_step_fraction=0.25))

    assert stepped(result, Action.RECLAIM) == ["l-00"]


def test_an_alert_past_its_until_holds_nothing() -> None:
    result = plan(serving_nodes(4), [firing(until=T0)], target=2)

    assert len(stepped(result, Action.LEND)) == 2
    assert Reason.ALERT_FIRING not in refusals(result)


def test_a_firing_alert_reclaims_under_a_pause_but_not_under_a_freeze() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(2)]
    alerted = snapshot(nodes, [firing()])
    policies = {POOL: policy()}

    paused = planned(alerted, {}, policies, paused_pools=[POOL]).pools[POOL]
    frozen = planned(alerted, {}, policies, frozen_pools=[POOL]).pools[POOL]

    assert stepped(paused, Action.RECLAIM) == ["l-00", "l-01"]
    assert frozen.steps == ()
    assert refusals(frozen) == {Reason.FROZEN: 2}


def test_the_strategy_is_not_let_lend_again_what_the_alert_took_back() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(2)]

    result = plan(nodes, [firing()], target=4)

    assert stepped(result, Action.LEND) == []
    assert set(stepped(result, Action.RECLAIM)) == {"l-00", "l-01"}


def test_the_audit_record_names_the_alert_and_the_matcher_that_matched() -> None:
    nodes = [*serving_nodes(2), *lent_nodes(1)]
    alerted = snapshot(nodes, [firing(fingerprint="0c1e2a")])
    made = planned(alerted, {POOL: proposal(1)}, {POOL: policy()})
    ctx = audit.Context(controller="test", term=None, strategy="window")
    ids = iter(range(100))

    tick = audit.build_tick(made, alerted, ctx, lambda: f"r{next(ids)}", keys=KEYS)

    (intent,) = [r for r in tick.records if r.kind is audit.Kind.INTENT]
    assert intent.reason == Reason.ALERT_FIRING.value
    assert intent.inputs["alerts"] == [
        {
            "alertname": "InferenceQueueHigh",
            "fingerprint": "0c1e2a",
            "starts_at": "2026-03-02T11:58:00Z",
            "matcher": '{alertname="InferenceQueueHigh"}',
            "received": "2026-03-02T11:59:00Z",
            "until": "2026-03-02T12:30:00Z",
        }
    ]


def test_a_pool_without_alerts_has_no_alert_evidence() -> None:
    quiet = snapshot(serving_nodes(1), [])

    inputs = audit.pool_inputs(T0, quiet.pools[POOL], None, None)

    assert "alerts" not in inputs


def test_a_thousand_alerts_are_named_twenty_in_each_record_and_explain_and_counted_beyond() -> None:
    flood = [firing(fingerprint=f"{i:04x}") for i in range(1000)]
    alerted = snapshot([*serving_nodes(2), *lent_nodes(1)], flood)
    decision = plan_tick(alerted, {POOL: proposal(1)}, {POOL: PoolControls(policy())}, KEYS)

    inputs = audit.pool_inputs(T0, alerted.pools[POOL], None, None)
    doc = explain.pool(POOL, alerted, decision, policy(), KEYS)

    assert [a["fingerprint"] for a in inputs["alerts"]] == [f"{i:04x}" for i in range(20)]
    assert inputs["alerts_more"] == 980
    assert len(doc["alerts"]) == 20
    assert doc["alerts_more"] == 980
    assert "  and 980 more alerts firing" in explain.pool_lines(doc)
