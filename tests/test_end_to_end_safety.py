"""End to end: the safety promises kept by the controller PROCESS, on the wall clock.

Each test runs on the session's real control plane (tests/conftest.py: kube-apiserver and etcd,
kube-scheduler, kube-controller-manager, KWOK for kubelets) the pool of ``harness.on_plane``: 8
``gpu-pool=inference`` KWOK nodes at 10 rps each, two running an inference replica, and six
one-pod training Jobs waiting for GPUs, which the real scheduler places on lent nodes and the
real Job controller re-creates after a reclaim. The pool lends only to takers, as users get it.
A fake vLLM exporter and a real ``prometheus`` scraping it every second give the demand; the
controller is ``rebalancer run`` (as ``python -m tests.support.failing_strategy``, which is the
same command with one more strategy, ``always-raises``, registered). Durations are scaled to
seconds so that a stretch many times longer than every limit that matters (the drop hold, the
metrics grace, the cooldown) fits in a test: "an hour" of a real pool is here tens of ticks of
one second. Nothing here needs the emulator (no injected fault, no clock the test moves); the
suites that do stay on it (tests/test_kill9.py, tests/test_dry_run.py).

The demand query is the default one with a 4-second rate window instead of five minutes, so a
load set by the test shows in Prometheus within seconds and zero load reads exactly zero.

What each test shows (docs/design/safety-rules.md, docs/design/fault-isolation.md):

- demand that falls to exactly zero is held, then believed; when it returns every lent node is
  taken back and serves within the reclaim deadline;
- a strategy that raises on every call lends nothing, the safety reclaim still happens, and the
  failure is counted in ``/metrics`` and audited once;
- Prometheus stopped for less than the grace: no reclaim and no loan; for longer: every lent node
  is reclaimed after the grace, audited with when demand became unknown;
- an override that cannot be read keeps its node serving; ``reclaim=now`` left on a node takes
  it back once and keeps it serving;
- a pause still reclaims under demand pressure; a freeze does not, and says so in ``/metrics``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Reason
from tests.support.control_plane import ControlPlane
from tests.support.harness import IDLE, LOW, PEAK, POOL, Controller, Harness, on_plane
from tests.support.training_cluster import unschedulable
from tests.support.waits import until


def of(records: list[AuditRecord], kind: Kind, reason: Reason) -> list[AuditRecord]:
    return [r for r in records if r.kind is kind and r.reason == reason.value]


def reclaim_intents(records: list[AuditRecord]) -> list[AuditRecord]:
    return [r for r in records if r.kind is Kind.INTENT and r.action == "reclaim"]


# ---------------------------------------------------------------------------------------------


async def test_demand_at_zero_for_a_long_stretch_then_at_peak_takes_every_node_back(
    plane: ControlPlane,
    tmp_path: Path,
) -> None:
    async with on_plane(plane, tmp_path, rps=20.0) as h, h.controller(h.config()) as c:
        # 20 rps need 3 serving nodes (2.4 with headroom): 5 of the 6 idle ones are lent.
        await until("five nodes lent", lambda: _count_is(h, 5), c.proc, 25)
        h.exporter.set_load(0.0, 0)
        zero = time.monotonic()
        await h.wait_lent(c, set(IDLE), within=30)  # on the way down, the sixth goes too
        sixth_after = time.monotonic() - zero
        await asyncio.sleep(20)  # zero for many times the hold, the grace and the cooldown
        assert await h.lent() == set(IDLE), "nothing came back while demand was zero"
        h.exporter.set_load(PEAK, 0)
        rose = time.time()  # wall time: audit records carry it
        back = await h.wait_all_serving(c, within=30)

        # A node serves again before its borrowed pod has stopped (restored first, then
        # drained): each reclaim's outcome is written once its drain is done.
        async def reclaims_applied() -> bool:
            records = await h.records()
            done = {
                r.intent_id for r in records if r.kind is Kind.OUTCOME and r.outcome == "applied"
            }
            after = [r for r in reclaim_intents(records) if r.time.timestamp() >= rose - 1]
            return len(after) >= len(IDLE) and {r.id for r in after} <= done

        await until("every reclaim applied", reclaims_applied, c.proc, 20)
        records = await h.records()

    held = of(records, Kind.REFUSAL, Reason.DEMAND_DROP_HELD)
    assert held, "the fall to zero was held before it was believed"
    evidence = held[0].inputs["demand_held"]
    assert evidence["level"]["value"] > 0
    assert evidence["seen"]["value"] < evidence["level"]["value"]
    reclaims = [r for r in reclaim_intents(records) if r.time.timestamp() >= rose - 1]
    assert sorted(str(r.node) for r in reclaims) == IDLE
    assert {r.reason for r in reclaims} == {Reason.DEMAND_ABOVE_SERVING.value}
    closed = {r.intent_id for r in records if r.kind is Kind.OUTCOME and r.outcome == "applied"}
    assert {r.id for r in reclaims} <= closed
    # The reclaim deadline is 5 s; Prometheus needs a scrape or two to show the rise.
    assert back < 5 + 8, back
    print(
        f"\nzero demand: sixth node lent {sixth_after:.1f}s into the fall, all 6 back and serving "
        f"{back:.1f}s after the peak returned; {len(held)} held refusals, {len(reclaims)} "
        f"reclaim intents, {len(records)} audit rows"
    )


async def test_a_strategy_that_raises_lends_nothing_yet_the_safety_reclaim_happens(
    plane: ControlPlane,
    tmp_path: Path,
) -> None:
    async with on_plane(plane, tmp_path) as h:
        async with h.controller(h.config()) as c:
            await h.wait_lent(c, set(IDLE))
        lent_by_first = len(await h.records())
        async with h.controller(h.config(strategy="always-raises")) as c:
            await until("a failure counted", lambda: _failures(h, c), c.proc, 15)
            assert await h.metric(c, "rebalancer_pool_safety_only", pool=POOL) == 1.0
            h.exporter.set_load(PEAK, 0)
            back = await h.wait_all_serving(c, within=30)
            h.exporter.set_load(LOW, 0)
            # Low load again and a taker waiting (an evicted pod re-created by its Job and
            # unschedulable): a working strategy would lend within a tick or two.
            await until("a taker waits", lambda: _a_taker_waits(h), c.proc, 30)
            await asyncio.sleep(4)
            assert await h.lent() == set(), "no new loan without a working strategy"
            failures = await h.metric(
                c, "rebalancer_strategy_failures_total", pool=POOL, kind="raised"
            )
        records = (await h.records())[lent_by_first:]

    failed = of(records, Kind.FINDING, Reason.STRATEGY_FAILED)
    assert len(failed) == 1, "audited once for the whole episode"
    assert failed[0].detail["error"] == "ZeroDivisionError"
    assert [r for r in records if r.kind is Kind.INTENT and r.action == "lend"] == []
    reclaims = reclaim_intents(records)
    assert sorted(str(r.node) for r in reclaims) == IDLE
    assert {r.reason for r in reclaims} == {Reason.DEMAND_ABOVE_SERVING.value}
    assert failures is not None
    assert failures >= 10
    print(
        f"\nraising strategy: all 6 back {back:.1f}s after the peak, {failures:.0f} failed calls "
        f"counted, 1 audit record of the failure, 0 loans"
    )


async def _a_taker_waits(h: Harness) -> bool:
    return any(unschedulable(p) for p in await h.pods())


async def test_prometheus_down_for_less_than_the_grace_changes_nothing_and_longer_reclaims(
    plane: ControlPlane,
    tmp_path: Path,
) -> None:
    # A longer grace than the other tests: a Prometheus restart takes seconds of its own.
    limits = {"staleness": "5s", "stale_grace": "20s"}
    async with on_plane(plane, tmp_path) as h, h.controller(h.config(limits=limits)) as c:
        await h.wait_lent(c, set(IDLE))
        await h.prometheus.stop()
        await asyncio.sleep(8)  # with the restart, under staleness 5 s + grace 20 s
        assert await h.lent() == set(IDLE), "a short outage reclaims nothing"
        await h.prometheus.start()
        await until("demand known again", lambda: _fresh(h, c), c.proc, 20)
        await h.prometheus.stop()
        down = time.monotonic()
        await h.wait_all_serving(c, within=40)
        reclaimed_after = time.monotonic() - down
        records = await h.records()

    lost = [r for r in reclaim_intents(records) if r.reason == Reason.METRICS_LOST.value]
    assert sorted(str(r.node) for r in lost) == IDLE
    unknown = lost[0].inputs["demand_unknown"]["since"]
    assert unknown, "the record says since when demand was unknown"
    assert len(of(records, Kind.INTENT, Reason.METRICS_LOST)) == len(IDLE)
    assert 23 <= reclaimed_after <= 40, reclaimed_after
    stale = of(records, Kind.REFUSAL, Reason.METRICS_STALE) + of(
        records, Kind.SUMMARY, Reason.METRICS_STALE
    )
    assert [r for r in records if r.kind is Kind.INTENT and r.action == "lend"][-1].time < lost[
        0
    ].time
    print(
        f"\nprometheus down: 8s outage reclaimed nothing; a long one reclaimed all 6 "
        f"{reclaimed_after:.1f}s after it began (staleness 5s + grace 20s); "
        f"{len(stale)} metrics_stale records"
    )


async def test_unreadable_protective_overrides_keep_their_nodes_serving(
    plane: ControlPlane, tmp_path: Path
) -> None:
    protected = {
        "inference-2": {"rebalancer.io/lend": "no"},
        "inference-3": {"rebalancer.io/lend": "nevr"},
        "inference-4": {"rebalancer.io/lend": "never", "rebalancer.io/override-until": "tmrw"},
    }
    async with on_plane(plane, tmp_path) as h:
        for node, annotations in protected.items():
            await h.annotate(node, annotations)
        async with h.controller(h.config()) as c:
            await h.wait_lent(c, set(IDLE) - set(protected))
            await asyncio.sleep(8)  # many ticks: still not lent
            assert await h.lent() == set(IDLE) - set(protected)
        records = await h.records()

    found = {str(r.node) for r in of(records, Kind.FINDING, Reason.BAD_OVERRIDE)}
    assert found == set(protected)


async def test_reclaim_now_left_on_a_node_takes_it_back_once(
    plane: ControlPlane, tmp_path: Path
) -> None:
    async with on_plane(plane, tmp_path) as h, h.controller(h.config()) as c:
        await h.wait_lent(c, set(IDLE))
        await h.annotate("inference-5", {"rebalancer.io/reclaim": "now"})
        await h.wait_lent(c, set(IDLE) - {"inference-5"})
        await asyncio.sleep(15)  # fifteen ticks, seven cooldowns: never lent again
        assert await h.lent() == set(IDLE) - {"inference-5"}
        records = await h.records()

    mine = [r for r in records if r.kind is Kind.INTENT and r.node == "inference-5"]
    assert [(r.action, r.reason) for r in mine] == [
        ("lend", Reason.STRATEGY.value),
        ("reclaim", Reason.OPERATOR_RECLAIM_NOW.value),
    ]


async def test_a_pause_still_reclaims_under_pressure_and_a_freeze_does_not(
    plane: ControlPlane,
    tmp_path: Path,
) -> None:
    async with on_plane(plane, tmp_path) as h:
        async with h.controller(h.config()) as c:
            await h.wait_lent(c, set(IDLE))
        h.exporter.set_load(PEAK, 0)
        async with h.controller(h.config(frozen=True)) as c:
            await until("pressure reported", lambda: _pressure(h, c), c.proc, 20)
            await asyncio.sleep(4)
            assert await h.lent() == set(IDLE), "a freeze moves nothing"
        async with h.controller(h.config(paused=True)) as c:
            back = await h.wait_all_serving(c, within=30)
        records = await h.records()

    frozen = of(records, Kind.REFUSAL, Reason.FROZEN)
    assert frozen
    assert {r.origin for r in frozen} >= {"safety"}
    reclaims = reclaim_intents(records)
    assert sorted(str(r.node) for r in reclaims) == IDLE
    assert {r.reason for r in reclaims} == {Reason.DEMAND_ABOVE_SERVING.value}
    print(f"\npause: all 6 back {back:.1f}s after a paused controller started under pressure")


# ---------------------------------------------------------------------------------------------


async def _count_is(h: Harness, n: int) -> bool:
    return len(await h.lent()) == n


async def _failures(h: Harness, c: Controller) -> bool:
    value = await h.metric(c, "rebalancer_strategy_failures_total", pool=POOL, kind="raised")
    return value is not None and value >= 1


async def _pressure(h: Harness, c: Controller) -> bool:
    return await h.metric(c, "rebalancer_frozen_under_pressure", pool=POOL) == 1.0


async def _fresh(h: Harness, c: Controller) -> bool:
    age = await h.metric(c, "rebalancer_demand_sample_age_seconds", pool=POOL)
    return age is not None and age < 3
