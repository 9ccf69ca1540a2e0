"""The HTTP server over real HTTP on free loopback ports: metrics and the decisions API on the
TLS port (through a gate that lets the tests' token through), the probes on the plain one."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as PromSample

from rebalancer.adapters.audit import (
    AuditPage,
    AuditQuery,
    AuditStore,
    MemoryAuditStore,
    SqlAuditStore,
)
from rebalancer.core import audit, clocks, model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Action, NodeName, Origin, PoolName, Reason
from rebalancer.core.outcomes import Notice, Outcome
from rebalancer.runtime import http
from rebalancer.runtime.http import HttpServer, Readiness, readiness
from rebalancer.runtime.report import Happened, TickReport
from rebalancer.runtime.telemetry import Telemetry
from tests.support import gates
from tests.support.factories import T0, audit_record


def record(
    ident: str, minutes: int, *, pool: str = "l20", cluster: str = "eu", **rest: Any
) -> AuditRecord:
    return audit_record(ident, T0 + timedelta(minutes=minutes), pool=pool, cluster=cluster, **rest)


# Three records share minute 1 (one tick): they come back in id order. Two are another cluster's
# (a store a fleet shares).
RECORDS = (
    record("01A", 0, node="n1", kind=Kind.INTENT),
    record("01B", 1, node="n1", kind=Kind.OUTCOME),
    record("01C", 1, node="n2", action="reclaim", kind=Kind.INTENT, cluster="us"),
    record("01D", 1, pool="a100", node=None, action=None, kind=Kind.SUMMARY),
    record("01E", 2, node="n2", action="reclaim", kind=Kind.OUTCOME),
    record("01F", 3, pool="a100", node="t1", kind=Kind.REFUSAL, cluster="us"),
    record("01G", 4, node="n3", kind=Kind.FINDING, action=None),
    record("01H", 5, node="n1", action="reclaim", kind=Kind.INTENT),
    record("01J", 6, node="n1", action="reclaim", kind=Kind.OUTCOME),
)
ALL = [r.id for r in RECORDS]


@dataclass
class Flags:
    synced: bool = False
    election: bool = True
    holder: str = ""

    def __call__(self) -> Readiness:
        return readiness(self.synced, self.election, self.holder)


@asynccontextmanager
async def serve(
    store: AuditStore,
    telemetry: Telemetry | None = None,
    ready: Flags | None = None,
    query_timeout: float = 10.0,
) -> AsyncIterator[tuple[HttpServer, aiohttp.ClientSession]]:
    server = HttpServer(
        telemetry=telemetry or Telemetry(),
        store=store,
        ready=ready or Flags(synced=True, holder="rebalancer-0"),
        gate=gates.Grants.everything(),
        host="127.0.0.1",
        port=0,
        health_port=0,
        query_timeout=query_timeout,
    )
    async with server, gates.session(server.url) as session:
        yield server, session


@asynccontextmanager
async def probes(server: HttpServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of the probes' port: plain HTTP, no token (as the kubelet asks)."""
    async with aiohttp.ClientSession(base_url=server.health_url) as session:
        yield session


async def memory_store() -> MemoryAuditStore:
    store = MemoryAuditStore()
    await store.append(RECORDS)
    return store


async def get_json(
    session: aiohttp.ClientSession, path: str, params: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    async with session.get(path, params=params) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


async def all_pages(
    session: aiohttp.ClientSession, params: Mapping[str, str]
) -> tuple[list[str], int]:
    """Every id the query returns, following ``next``; and how many pages that took."""
    ids: list[str] = []
    cursor: str | None = None
    pages = 0
    limit = int(params.get("limit", "100"))
    while True:
        query = dict(params) if cursor is None else {**params, "cursor": cursor}
        status, body = await get_json(session, "/api/v1/decisions", query)
        assert status == 200, body
        assert len(body["items"]) <= limit
        ids += [item["id"] for item in body["items"]]
        pages += 1
        cursor = body["next"]
        if cursor is None:
            return ids, pages
        assert pages < 50


# ---------------------------------------------------------------------------------------------
# /metrics


def scrape_samples(text: str) -> dict[str, list[PromSample]]:
    """Samples by family name; also checks that every family has HELP and TYPE."""
    found: dict[str, list[PromSample]] = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, family.name
        found[family.name] = list(family.samples)
    return found


def value(samples: Sequence[PromSample], name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(hits) == 1, (name, labels, samples)
    return hits[0]


def plan() -> model.Plan:
    pool = PoolName("l20")
    lend = model.Intent(pool, Action.LEND, 2, Origin.STRATEGY, Reason.STRATEGY, "idle")
    reclaim = model.Intent(
        pool, Action.RECLAIM, 1, Origin.SAFETY, Reason.DEMAND_ABOVE_SERVING, "demand up"
    )
    steps = (
        model.Step(pool, NodeName("n1"), Action.LEND, Reason.STRATEGY, "lend", lend),
        model.Step(pool, NodeName("n2"), Action.LEND, Reason.STRATEGY, "lend", lend),
        model.Step(
            pool, NodeName("n3"), Action.RECLAIM, Reason.DEMAND_ABOVE_SERVING, "back", reclaim
        ),
    )
    refused = (model.Rejection(lend, Reason.COOLDOWN, "cooling down", 1),)
    return model.Plan(
        T0, {pool: model.PoolPlan(pool, (lend, reclaim), steps, refused, (), "summary")}
    )


def snapshot(now: datetime, demand: model.Sample | None) -> model.Snapshot:
    return model.Snapshot(
        now,
        {
            PoolName("l20"): model.PoolSnapshot(nodes=(), demand=demand),
            PoolName("a100"): model.PoolSnapshot(nodes=()),
        },
    )


def test_a_ticks_report_sets_what_it_noted_and_a_gauge_it_did_not_measure_stays() -> None:
    t = Telemetry()
    noted = Happened(
        leader=("rebalancer-0", True),
        lent={"l20": 3},
        audit_store=(True, 2),
        decided=(plan(),),
        strategy_failures=(("l20", "forecast", "timeout"),),
        reclaims=(("l20", T0, T0 + timedelta(seconds=42)),),
        spool_overflows=2,
    )
    snap = snapshot(T0, model.Sample(40.0, T0 - timedelta(seconds=30)))
    report = TickReport(T0, snap, {}, model.Plan(T0, {}), leading=True, happened=noted)
    t.record(report)
    # A tick that stopped early measured no gauge: each keeps its value; events only add.
    t.record(replace(report, happened=Happened(strategy_failures=(("l20", "forecast", "raised"),))))

    def value(name: str, **labels: str) -> float | None:
        return t.registry.get_sample_value(name, labels)

    assert value("rebalancer_leader", identity="rebalancer-0") == 1
    assert value("rebalancer_nodes_lent", pool="l20") == 3
    assert value("rebalancer_audit_store_failing") == 1
    assert value("rebalancer_audit_spooled_records") == 2
    assert value("rebalancer_audit_spool_overflows_total") == 2
    assert value("rebalancer_reclaim_duration_seconds_sum", pool="l20") == 42
    failures = "rebalancer_strategy_failures_total"
    assert value(failures, pool="l20", strategy="forecast", kind="timeout") == 1
    assert value(failures, pool="l20", strategy="forecast", kind="raised") == 1
    assert value("rebalancer_demand_sample_age_seconds", pool="l20") == 30
    steps = sum(
        s.value
        for f in t.registry.collect()
        if f.name == "rebalancer_decisions"
        for s in f.samples
        if s.name == "rebalancer_decisions_total"
    )
    assert steps == len(plan().steps) + len(plan().rejections)


async def test_metrics_expose_every_family_with_its_labels() -> None:
    t = Telemetry()
    t.count_decisions(plan())
    t.count_decisions(plan())
    t.set_lent({"l20": 3, "a100": 1})
    t.set_lent({"l20": 2})  # a100 went away: its series goes too
    t.set_overdue({"l20": 0, "a100": 1})
    t.set_overdue({"l20": 1})
    t.set_demand_ages(snapshot(T0, model.Sample(40.0, T0 - timedelta(seconds=30))))
    # A later tick with no sample, then one with NaN: the age keeps growing from the last good one.
    t.set_demand_ages(snapshot(T0 + timedelta(seconds=60), None))
    nan = model.Sample(math.nan, T0 + timedelta(seconds=100))
    t.set_demand_ages(snapshot(T0 + timedelta(seconds=120), nan))
    t.reclaim_done("l20", T0, T0 + timedelta(seconds=42))
    t.reclaim_done("l20", T0, T0 + timedelta(seconds=700))
    t.set_leader("rebalancer-0", leading=True)
    t.audit_failed("tick")
    t.audit_failed("tick")
    t.set_audit_store(True, 7)
    t.spool_overflowed()
    t.strategy_failed("l20", "forecast", "raised")
    t.strategy_failed("l20", "forecast", "raised")
    t.strategy_failed("l20", "forecast", "timeout")
    t.planner_failed("a100")
    t.set_safety_only({"l20": True, "a100": False})
    t.set_safety_only({"l20": True})  # a100 went away
    t.set_unreadable({"node": 0, "pod": 2})
    t.set_frozen_under_pressure({"l20": False, "a100": True})
    t.set_demand_held({"l20": True})
    t.borrowing_minute("l20")
    t.borrowing_minute("l20")
    # a notice of 280 s, one pod answering in 95 s, one evicted 100 s past its checkpoint with
    # 8 GPUs, one that never reported; then a reclaim that gave none
    t.noticed("l20", Notice("r-1", 280.0, 3, 1, (95.0,), 800.0, 1, "deadline"))
    t.noticed("l20", Notice("r-2", 0.0, 1, 0, (), 0.0, 1, "no notice"))
    week, day = timedelta(days=7), timedelta(days=1)
    t.set_budgets({"l20": model.ErrorBudget(10, week, 3), "a100": model.ErrorBudget(0, day, 0)})
    t.set_budgets({"l20": model.ErrorBudget(10, week, 4)})  # a100 lost its slo
    api = clocks.Skew(
        clocks.Against.APISERVER, timedelta(seconds=-600), timedelta(seconds=0.5), 3, T0
    )
    near = clocks.Skew(clocks.Against.PROMETHEUS, timedelta(seconds=0.2), timedelta(0), 3, T0)
    far = clocks.Skew(clocks.Against.PROMETHEUS, timedelta(seconds=-90), timedelta(0), 3, T0)
    t.set_clocks(
        {
            PoolName("l20"): clocks.Clocks((api, near)),
            PoolName("a100"): clocks.Clocks((api, far), bound=timedelta(minutes=15)),
        }
    )

    async with (
        serve(await memory_store(), telemetry=t) as (_, session),
        session.get("/metrics") as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        got = scrape_samples(await resp.text())

    assert set(got) == {
        "rebalancer_cluster_info",
        "rebalancer_nodes_lent",
        "rebalancer_decisions",
        "rebalancer_decision_timestamp_seconds",
        "rebalancer_reclaim_duration_seconds",
        "rebalancer_reclaim_notice_seconds",
        "rebalancer_reclaim_answer_seconds",
        "rebalancer_lost_work_gpu_seconds",
        "rebalancer_reclaim_unreported_pods",
        "rebalancer_demand_sample_age_seconds",
        "rebalancer_leader",
        "rebalancer_audit_store_failures",
        "rebalancer_audit_store_failing",
        "rebalancer_audit_spooled_records",
        "rebalancer_audit_spool_overflows",
        "rebalancer_reclaims_overdue",
        "rebalancer_strategy_failures",
        "rebalancer_planner_failures",
        "rebalancer_pool_safety_only",
        "rebalancer_objects_unreadable",
        "rebalancer_frozen_under_pressure",
        "rebalancer_demand_held",
        "rebalancer_borrowing_cost_minutes",
        "rebalancer_error_budget_allowed_minutes",
        "rebalancer_error_budget_spent_minutes",
        "rebalancer_node_drift",
        "rebalancer_clock_skew_seconds",
        "rebalancer_clock_skew_uncertainty_seconds",
        "rebalancer_clock_untrusted",
    }
    skew = {s.labels["against"]: s.value for s in got["rebalancer_clock_skew_seconds"]}
    assert skew == {"apiserver": -600.0, "prometheus": -90.0}  # the largest of the pools'
    untrusted = {
        (s.labels["pool"], s.labels["against"]): s.value for s in got["rebalancer_clock_untrusted"]
    }
    assert untrusted == {
        ("l20", "apiserver"): 1.0,
        ("l20", "prometheus"): 0.0,
        ("a100", "apiserver"): 0.0,  # within its pool's bound
        ("a100", "prometheus"): 0.0,
    }
    # The plan found nothing another writer changed: every kind of the pool reads 0.
    drift = got["rebalancer_node_drift"]
    assert {s.labels["kind"] for s in drift} >= {"state_unreadable", "orphaned"}
    assert {s.value for s in drift} == {0.0}
    lent = got["rebalancer_nodes_lent"]
    assert [(s.labels, s.value) for s in lent] == [({"pool": "l20"}, 2.0)]
    overdue = got["rebalancer_reclaims_overdue"]
    assert [(s.labels, s.value) for s in overdue] == [({"pool": "l20"}, 1.0)]

    decisions = [s for s in got["rebalancer_decisions"] if s.name.endswith("_total")]
    assert {
        (s.labels["pool"], s.labels["kind"], s.labels["action"], s.labels["reason"]): s.value
        for s in decisions
    } == {
        ("l20", "step", "lend", "strategy"): 4.0,
        ("l20", "step", "reclaim", "demand_above_serving"): 2.0,
        ("l20", "refusal", "lend", "cooldown"): 2.0,
    }

    reclaim = got["rebalancer_reclaim_duration_seconds"]
    name = "rebalancer_reclaim_duration_seconds"
    assert value(reclaim, f"{name}_count", pool="l20") == 2
    assert value(reclaim, f"{name}_sum", pool="l20") == 742
    assert value(reclaim, f"{name}_bucket", pool="l20", le="30.0") == 0
    assert value(reclaim, f"{name}_bucket", pool="l20", le="60.0") == 1
    assert value(reclaim, f"{name}_bucket", pool="l20", le="600.0") == 1
    assert value(reclaim, f"{name}_bucket", pool="l20", le="900.0") == 2
    assert value(reclaim, f"{name}_bucket", pool="l20", le="+Inf") == 2

    notice = got["rebalancer_reclaim_notice_seconds"]
    name = "rebalancer_reclaim_notice_seconds"
    assert value(notice, f"{name}_count", pool="l20") == 2
    assert value(notice, f"{name}_bucket", pool="l20", le="0.0") == 1
    assert value(notice, f"{name}_bucket", pool="l20", le="300.0") == 2
    answer = got["rebalancer_reclaim_answer_seconds"]
    assert value(answer, "rebalancer_reclaim_answer_seconds_sum", pool="l20") == 95
    lost = got["rebalancer_lost_work_gpu_seconds"]
    assert value(lost, "rebalancer_lost_work_gpu_seconds_total", pool="l20") == 800
    unreported = got["rebalancer_reclaim_unreported_pods"]
    assert value(unreported, "rebalancer_reclaim_unreported_pods_total", pool="l20") == 2

    age = got["rebalancer_demand_sample_age_seconds"]
    assert value(age, "rebalancer_demand_sample_age_seconds", pool="l20") == 150
    assert value(age, "rebalancer_demand_sample_age_seconds", pool="a100") == math.inf

    leader = got["rebalancer_leader"]
    assert [(s.labels, s.value) for s in leader] == [({"identity": "rebalancer-0"}, 1.0)]

    assert [s.value for s in got["rebalancer_audit_store_failing"]] == [1.0]
    assert [s.value for s in got["rebalancer_audit_spooled_records"]] == [7.0]
    overflows = got["rebalancer_audit_spool_overflows"]
    assert [s.value for s in overflows if s.name.endswith("_total")] == [1.0]

    failures = got["rebalancer_audit_store_failures"]
    total = "rebalancer_audit_store_failures_total"
    assert value(failures, total, operation="tick") == 2

    strategy = got["rebalancer_strategy_failures"]
    total = "rebalancer_strategy_failures_total"
    assert value(strategy, total, pool="l20", strategy="forecast", kind="raised") == 2
    assert value(strategy, total, pool="l20", strategy="forecast", kind="timeout") == 1
    planner = got["rebalancer_planner_failures"]
    assert value(planner, "rebalancer_planner_failures_total", pool="a100") == 1
    cost = got["rebalancer_borrowing_cost_minutes"]
    assert value(cost, "rebalancer_borrowing_cost_minutes_total", pool="l20") == 2
    budget = {
        name: [(s.labels, s.value) for s in got[f"rebalancer_error_budget_{name}_minutes"]]
        for name in ("allowed", "spent")
    }
    assert budget == {"allowed": [({"pool": "l20"}, 10.0)], "spent": [({"pool": "l20"}, 4.0)]}
    flags = {
        name: [(s.labels, s.value) for s in got[name]]
        for name in (
            "rebalancer_pool_safety_only",
            "rebalancer_frozen_under_pressure",
            "rebalancer_demand_held",
            "rebalancer_objects_unreadable",
        )
    }
    assert flags == {
        "rebalancer_pool_safety_only": [({"pool": "l20"}, 1.0)],
        "rebalancer_frozen_under_pressure": [({"pool": "l20"}, 0.0), ({"pool": "a100"}, 1.0)],
        "rebalancer_demand_held": [({"pool": "l20"}, 1.0)],
        "rebalancer_objects_unreadable": [({"kind": "node"}, 0.0), ({"kind": "pod"}, 2.0)],
    }


async def test_the_cluster_is_named_by_one_info_series_and_by_no_other_series() -> None:
    t = Telemetry(cluster="prod-eu-1")
    t.count_decisions(plan())
    t.set_lent({"l20": 1})
    t.set_leader("rebalancer-0", leading=True)
    async with (
        serve(await memory_store(), telemetry=t) as (_, session),
        session.get("/metrics") as resp,
    ):
        got = scrape_samples(await resp.text())
    info = got.pop("rebalancer_cluster_info")
    assert [(s.name, s.labels, s.value) for s in info] == [
        ("rebalancer_cluster_info", {"cluster_name": "prod-eu-1"}, 1.0)
    ]
    # Prometheus gives every series its cluster label (external or target label); one of ours
    # would clash with it
    labels = {key for samples in got.values() for s in samples for key in s.labels}
    assert labels.isdisjoint({"cluster", "cluster_name"}), labels
    assert (
        Telemetry().registry.get_sample_value(
            "rebalancer_cluster_info", {"cluster_name": "default"}
        )
        == 1.0
    )


async def test_metrics_speak_openmetrics_when_asked() -> None:
    t = Telemetry()
    t.audit_failed("outcome")
    async with serve(await memory_store(), telemetry=t) as (_, session):
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with session.get("/metrics", headers=accept) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text = await resp.text()
    assert text.endswith("# EOF\n")
    assert 'rebalancer_audit_store_failures_total{operation="outcome"} 1.0' in text


async def test_leader_gauge_follows_leadership_and_registries_are_separate() -> None:
    a, b = Telemetry(), Telemetry()
    a.set_leader("rebalancer-0", leading=True)
    a.set_leader("rebalancer-0", leading=False)
    async with (
        serve(await memory_store(), telemetry=a) as (_, session),
        session.get("/metrics") as resp,
    ):
        got = scrape_samples(await resp.text())
    assert value(got["rebalancer_leader"], "rebalancer_leader", identity="rebalancer-0") == 0
    assert b.registry.get_sample_value("rebalancer_leader", {"identity": "rebalancer-0"}) is None


async def test_every_counted_series_of_a_configured_pool_is_served_at_zero_from_the_start() -> None:
    """Before any event: what ``increase()`` needs to count the first one after a start."""
    t = Telemetry(pools={"l20": "forecast"})
    async with (
        serve(await memory_store(), telemetry=t) as (_, session),
        session.get("/metrics") as resp,
    ):
        got = scrape_samples(await resp.text())
    reclaims = got["rebalancer_reclaim_duration_seconds"]
    assert value(reclaims, "rebalancer_reclaim_duration_seconds_count", pool="l20") == 0
    failures = got["rebalancer_strategy_failures"]
    assert {s.labels["kind"] for s in failures} == {"raised", "invalid", "timeout"}
    assert {s.labels["strategy"] for s in failures} == {"forecast"}
    audit_ops = {s.labels["operation"] for s in got["rebalancer_audit_store_failures"]}
    assert audit_ops == {"tick", "outcome", "cost", "recover", "query"}
    decisions = [s for s in got["rebalancer_decisions"] if s.name.endswith("_total")]
    assert len(decisions) == 2 * 3 * len(Reason)  # kind x planned action x reason, one pool
    for name in (
        "rebalancer_planner_failures",
        "rebalancer_borrowing_cost_minutes",
        "rebalancer_lost_work_gpu_seconds",
        "rebalancer_reclaim_unreported_pods",
    ):
        assert [(s.labels, s.value) for s in got[name] if s.name.endswith("_total")] == [
            ({"pool": "l20"}, 0.0)
        ], name
    every = [s for family in got.values() for s in family]
    assert {s.value for s in every if s.name.endswith(("_total", "_count", "_bucket"))} == {0.0}


def decision(kind: Kind, node: str, ident: str, at: int, **more: Any) -> AuditRecord:
    return AuditRecord(
        id=ident,
        time=T0 + timedelta(seconds=at),
        kind=kind,
        pool="l20",
        controller="rebalancer-0",
        reason=Reason.OPERATOR_RECLAIM_NOW.value,
        message="",
        node=node,
        action=Action.RECLAIM,
        origin=Origin.OPERATOR,
        **more,
    )


def decision_log(t: Telemetry) -> dict[tuple[str, str, str], float]:
    """The decision series: (node, outcome, id) -> value."""
    [family] = [
        f for f in t.registry.collect() if f.name == "rebalancer_decision_timestamp_seconds"
    ]
    return {
        (s.labels["node"], s.labels["outcome"], s.labels["id"]): s.value for s in family.samples
    }


def test_the_decision_log_keeps_each_node_s_latest_decision_with_its_latest_outcome() -> None:
    t = Telemetry()
    t.audited(decision(Kind.INTENT, "n1", "A1", 0))
    t.audited(decision(Kind.INTENT, "n2", "A2", 1))
    assert decision_log(t) == {
        ("n1", "pending", "A1"): T0.timestamp(),
        ("n2", "pending", "A2"): T0.timestamp() + 1,
    }
    t.audited(decision(Kind.OUTCOME, "n1", "B1", 5, outcome=Outcome.IN_PROGRESS, intent_id="A1"))
    t.audited(decision(Kind.OUTCOME, "n1", "B2", 9, outcome=Outcome.APPLIED, intent_id="A1"))
    # the outcome moves the label; the value stays the decision's time
    assert decision_log(t)[("n1", "applied", "A1")] == T0.timestamp()
    assert len(decision_log(t)) == 2
    t.audited(decision(Kind.INTENT, "n1", "C1", 20))  # the node's next decision replaces it
    t.audited(decision(Kind.OUTCOME, "n1", "C2", 21, outcome=Outcome.FAILED, intent_id="A1"))
    assert set(decision_log(t)) == {("n1", "pending", "C1"), ("n2", "pending", "A2")}
    # an outcome of an intent made before a restart: at its own time; other kinds are not shown
    t.audited(decision(Kind.OUTCOME, "n3", "D2", 30, outcome=Outcome.APPLIED, intent_id="D1"))
    t.audited(audit_record("E1", T0))  # a refusal
    assert decision_log(t)[("n3", "applied", "D1")] == T0.timestamp() + 30
    assert len(decision_log(t)) == 3


# ---------------------------------------------------------------------------------------------
# Probes


async def test_healthz_answers() -> None:
    async with serve(await memory_store(), ready=Flags()) as (server, _), probes(server) as session:
        status, body = await get_json(session, "/healthz")
    assert (status, body) == (200, {"status": "ok"})


async def test_readyz_waits_for_caches_and_a_known_leader() -> None:
    flags = Flags()
    async with serve(await memory_store(), ready=flags) as (server, _), probes(server) as session:
        status, body = await get_json(session, "/readyz")
        assert status == 503
        assert body["ready"] is False
        assert "not synced" in body["reason"]

        flags.synced = True  # caches synced, but no lease holder read yet
        status, body = await get_json(session, "/readyz")
        assert status == 503
        assert "holder" in body["reason"]

        flags.holder = "rebalancer-1"  # someone else leads: a follower is ready
        status, body = await get_json(session, "/readyz")
        assert (status, body["ready"]) == (200, True)
        assert "rebalancer-1" in body["reason"]

        flags.election, flags.holder = False, ""  # no election: synced is enough
        status, body = await get_json(session, "/readyz")
        assert status == 200


# ---------------------------------------------------------------------------------------------
# /api/v1/decisions

QUERIES: list[tuple[dict[str, str], list[str]]] = [
    ({}, ALL),
    ({"order": "desc"}, ALL[::-1]),
    ({"pool": "l20"}, ["01A", "01B", "01C", "01E", "01G", "01H", "01J"]),
    ({"pool": "a100"}, ["01D", "01F"]),
    ({"node": "n1"}, ["01A", "01B", "01H", "01J"]),
    ({"node": "n1", "action": "reclaim"}, ["01H", "01J"]),
    ({"action": "lend"}, ["01A", "01B", "01F"]),
    ({"kind": "intent"}, ["01A", "01C", "01H"]),
    ({"kind": "intent,summary"}, ["01A", "01C", "01D", "01H"]),
    # since inclusive, until exclusive; any offset is read as the instant it names
    (
        {"since": "2026-03-02T12:01:00Z", "until": "2026-03-02T13:03:00+01:00"},
        ["01B", "01C", "01D", "01E"],
    ),
    ({"since": "2026-03-02T12:05:00.000Z"}, ["01H", "01J"]),
    ({"until": "2026-03-02T12:00:59.999999Z"}, ["01A"]),
    ({"pool": "nope"}, []),
    ({"cluster": "us"}, ["01C", "01F"]),
    ({"cluster": "eu", "pool": "a100"}, ["01D"]),
]


@pytest.mark.parametrize(("params", "expected"), QUERIES)
async def test_decisions_filter_and_page_in_order(
    params: dict[str, str], expected: list[str]
) -> None:
    async with serve(await memory_store()) as (_, session):
        assert (await all_pages(session, params))[0] == expected
        ids, pages = await all_pages(session, {**params, "limit": "2"})
        assert ids == expected
        assert pages == max(1, math.ceil(len(expected) / 2))


async def test_decisions_items_are_the_records_json() -> None:
    async with serve(await memory_store()) as (_, session):
        status, body = await get_json(session, "/api/v1/decisions", {"limit": "3"})
        assert status == 200
        assert body["items"] == [audit.to_json(r) for r in RECORDS[:3]]
        assert body["next"] == f"{RECORDS[2].time.isoformat()}|{RECORDS[2].id}"
        # the last page says there is nothing after it
        status, body = await get_json(session, "/api/v1/decisions", {"cursor": body["next"]})
        assert [i["id"] for i in body["items"]] == ALL[3:]
        assert body["next"] is None
        # the default page size is 100
        status, body = await get_json(session, "/api/v1/decisions")
        assert len(body["items"]) == len(RECORDS)


async def test_decisions_on_a_sqlite_store(tmp_path: Path) -> None:
    store = await SqlAuditStore.open(f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}")
    try:
        await store.append(RECORDS)
        async with serve(store) as (_, session):
            for params, expected in QUERIES:
                ids, _ = await all_pages(session, {**params, "limit": "2"})
                assert ids == expected, params
            _, body = await get_json(session, "/api/v1/decisions", {"node": "n2"})
        assert body["items"] == [audit.to_json(r) for r in RECORDS if r.node == "n2"]
    finally:
        await store.close()


BAD: list[tuple[str, str, str]] = [  # raw query string, the parameter named, its value
    ("since=yesterday", "since", "yesterday"),
    ("since=2026-03-02T12:00:00", "since", "2026-03-02T12:00:00"),  # no offset
    ("since=2026-03-02", "since", "2026-03-02"),
    ("since=2026-02-30T12:00:00Z", "since", "2026-02-30T12:00:00Z"),
    ("since=2x", "since", "2x"),
    ("since=2H", "since", "2H"),
    ("since=36501d", "since", "36501d"),  # more than 100 years ago
    ("since=1h&until=2h", "until", "2h"),
    ("until=2026-03-02T25:00:00Z", "until", "2026-03-02T25:00:00Z"),
    ("since=2026-03-02T12:00:00Z&until=2026-03-02T12:00:00Z", "until", "2026-03-02T12:00:00Z"),
    ("pool=", "pool", ""),
    ("cluster=", "cluster", ""),
    ("node=%20", "node", " "),
    ("action=borrow", "action", "borrow"),
    ("kind=decision", "kind", "decision"),
    ("kind=intent,", "kind", "intent,"),
    ("limit=0", "limit", "0"),
    ("limit=1001", "limit", "1001"),
    ("limit=ten", "limit", "ten"),
    ("limit=-5", "limit", "-5"),
    ("limit=99999999999999999999", "limit", "99999999999999999999"),
    ("cursor=abc", "cursor", "abc"),
    ("cursor=2026-03-02T12:00:00Z", "cursor", "2026-03-02T12:00:00Z"),
    ("cursor=notatime%7C01A", "cursor", "notatime|01A"),
    ("cursor=2026-03-02T12:00:00%7C01A", "cursor", "2026-03-02T12:00:00|01A"),  # naive
    ("cursor=2026-03-02T12:00:00%2B00:00%7C", "cursor", "2026-03-02T12:00:00+00:00|"),
    ("order=newest", "order", "newest"),
    ("pool=a&pool=b", "pool", "b"),
    ("pools=l20", "pools", "l20"),
]


@pytest.mark.parametrize(("query", "parameter", "given"), BAD)
async def test_a_bad_parameter_is_a_400_naming_it(query: str, parameter: str, given: str) -> None:
    async with (
        serve(await memory_store()) as (server, session),
        session.get(f"{server.url}/api/v1/decisions?{query}") as resp,
    ):
        assert resp.status == 400
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert body["error"] == "bad_parameter"
    assert body["parameter"] == parameter
    assert body["value"] == given
    assert body["message"]
    assert "Traceback" not in body["message"]


@pytest.mark.parametrize(
    ("params", "since", "until"),
    [
        ({"since": ["2h"]}, T0 - timedelta(hours=2), None),
        ({"since": ["7d"], "until": ["30m"]}, T0 - timedelta(days=7), T0 - timedelta(minutes=30)),
        ({"since": ["1h30m"]}, T0 - timedelta(minutes=90), None),
        ({"until": ["90s"]}, None, T0 - timedelta(seconds=90)),
        ({"since": ["0s"]}, T0, None),
        ({"since": ["2026-03-02T13:00:00+01:00"]}, T0, None),
    ],
)
def test_since_and_until_may_be_a_time_ago(
    params: dict[str, list[str]], since: datetime | None, until: datetime | None
) -> None:
    query = http.parse_query(params, T0)
    assert (query.since, query.until) == (since, until)


async def test_a_time_ago_counts_back_from_the_server_s_now() -> None:
    async with serve(await memory_store()) as (_, session):
        # The records are of 2026-03-02: long enough ago, and not 100 years.
        assert (await all_pages(session, {"since": "36500d"}))[0] == ALL
        assert (await all_pages(session, {"until": "1m"}))[0] == ALL
        assert (await all_pages(session, {"since": "1m"}))[0] == []


async def test_an_unencoded_plus_still_works() -> None:
    async with serve(await memory_store()) as (server, session):
        raw = "cursor=2026-03-02T12:01:00+00:00|01C"  # '+' arrives as a space
        async with session.get(f"{server.url}/api/v1/decisions?{raw}") as resp:
            assert resp.status == 200
            body = await resp.json()
    assert [i["id"] for i in body["items"]] == ALL[3:]
    async with serve(await memory_store()) as (server, session):
        raw = "since=2026-03-02T13:05:00+01:00"  # the same for an offset
        async with session.get(f"{server.url}/api/v1/decisions?{raw}") as resp:
            assert resp.status == 200
            body = await resp.json()
    assert [i["id"] for i in body["items"]] == ["01H", "01J"]


class BrokenStore(MemoryAuditStore):
    def __init__(self, error: Exception | None = None, delay: float = 0.0) -> None:
        super().__init__()
        self.error, self.delay = error, delay

    async def query(self, query: AuditQuery) -> AuditPage:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return await super().query(query)


async def test_a_store_failure_is_a_503_and_counted() -> None:
    t = Telemetry()
    secret = "postgresql+asyncpg://rebalancer:hunter2@db/audit"
    store = BrokenStore(ConnectionRefusedError(f"cannot reach {secret}"))
    async with (
        serve(store, telemetry=t) as (_, session),
        session.get("/api/v1/decisions", params={"pool": "l20"}) as resp,
    ):
        assert resp.status == 503
        assert resp.content_type == "application/json"
        text = await resp.text()
        body = await resp.json()
    assert body["error"] == "audit_store_unavailable"
    assert "ConnectionRefusedError" in body["message"]
    assert "hunter2" not in text
    assert "Traceback" not in text
    total = t.registry.get_sample_value(
        "rebalancer_audit_store_failures_total", {"operation": "query"}
    )
    assert total == 1


async def test_a_store_that_hangs_is_a_503() -> None:
    async with serve(BrokenStore(delay=5), query_timeout=0.05) as (_, session):
        status, body = await get_json(session, "/api/v1/decisions")
    assert status == 503
    assert "did not answer within 0.05 s" in body["message"]


async def test_the_ports_are_released_when_the_block_ends() -> None:
    async with serve(await memory_store()) as (server, session), probes(server) as plain:
        assert (await get_json(plain, "/healthz"))[0] == 200
        assert (await get_json(session, "/api/v1/decisions"))[0] == 200
        urls = (f"{server.health_url}/healthz", f"{server.url}/api/v1/decisions")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session:
        for url in urls:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(url)
