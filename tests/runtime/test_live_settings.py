"""The settings file changed under a running controller, on the API emulator
(docs/design/live-settings.md): the next tick runs by its live changes, a broken file is
refused (a log line, an Event on the controller's Pod, a metric) and the running settings go on
acting, a pause is taken by the very next tick, and a restart-only change is said and kept.

In-process, ticked by hand as the demo ticks it: each tick reads the file first
(``Controller.tick``), so the tick after a write is the one that must run by it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.core import clocks, model
from rebalancer.core.concurrency import LEND_CONCURRENCY
from rebalancer.core.model import Action
from rebalancer.runtime import collecting, livesettings, wiring
from rebalancer.runtime.reconcile import Reconfigured
from rebalancer.runtime.report import TickReport
from tests.support import pools, reconciling, ticking
from tests.support.processes import setup
from tests.support.ticking import controller, pool_text, write


def lends(report: TickReport) -> int:
    return sum(1 for s in report.plan.steps if s.action is Action.LEND)


def reloads(c: wiring.Controller, result: str) -> float | None:
    return c.telemetry.registry.get_sample_value(
        "rebalancer_settings_reloads_total", {"result": result}
    )


async def test_the_tick_after_the_file_changes_runs_by_the_new_pool_limits(tmp_path: Path) -> None:
    async with controller(tmp_path, max_lent=0.0) as (box, head, c):
        assert lends(await c.tick()) == 0  # nothing may be lent
        strategy = c.reconciler.pools[0].strategy
        write(box, head, pool_text(0.5))
        report = await c.tick()
        assert 0 < lends(report) <= 4  # half of the 8 nodes at most, from this very tick
        assert c.settings.pool("inference").limits.max_lent_fraction == 0.5
        assert c.reconciler.pools[0].strategy is strategy  # unchanged: its state is kept
        assert reloads(c, "applied") == 1.0
        digest = livesettings.digest(box.config)
        info = {"sha256": digest or ""}
        assert c.telemetry.registry.get_sample_value("rebalancer_settings_hash_info", info) == 1.0
        write(box, head, pool_text(0.5).replace("strategy: reactive", "strategy: peak"))
        await c.tick()
        assert c.reconciler.pools[0].strategy_name == "peak"  # changed: built anew
        assert reloads(c, "applied") == 2.0


async def test_a_broken_file_is_refused_and_the_running_settings_go_on_acting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with controller(tmp_path, max_lent=0.0) as (box, head, c):
        write(box, head, pool_text(0.5, extra="    window: Mon-Fry 22:00-06:00\n"))
        assert lends(await c.tick()) == 0  # the old limit still holds
        assert c.settings.pool("inference").limits.max_lent_fraction == 0.0
        assert reloads(c, "refused") == 1.0
        assert reloads(c, "applied") == 0.0
        assert "pools[0].window='Mon-Fry 22:00-06:00'" in caplog.text
        assert "settings file refused, the running settings stay" in caplog.text
        found = await client.EventsV1Api(c.api).list_namespaced_event("default")
        (event,) = [e for e in found.items if e.reason == "SettingsRefused"]
        assert (event.regarding.kind, event.regarding.name) == ("Pod", c.pod)
        assert event.type == "Warning"
        assert "Mon-Fry" in event.note
        # The same broken file is not judged again every tick; a fixed one is.
        assert lends(await c.tick()) == 0
        assert reloads(c, "refused") == 1.0
        write(box, head, pool_text(0.5))
        assert lends(await c.tick()) > 0


async def test_a_pause_is_taken_by_the_next_tick(tmp_path: Path) -> None:
    async with controller(tmp_path, max_lent=0.5) as (box, head, c):
        assert lends(await c.tick()) > 0
        write(box, "paused: true\n" + head, pool_text(0.5))
        report = await c.tick()
        assert report.snapshot.paused
        assert lends(report) == 0


async def test_a_restart_only_change_is_said_and_kept_while_the_rest_is_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with controller(tmp_path, max_lent=0.0) as (box, head, c):
        write(box, "cluster_name: prod-eu-1\n" + head, pool_text(0.5))
        assert lends(await c.tick()) > 0  # the pool's limit is taken
        assert c.settings.cluster_name == "default"  # the cluster's name is not
        assert c.telemetry.registry.get_sample_value(
            "rebalancer_cluster_info", {"cluster_name": "default"}
        )
        assert reloads(c, "restart_needed") == 1.0
        assert (
            "cluster_name='prod-eu-1' (was 'default'): needs a restart, the running value is "
            "kept until then" in caplog.text
        )


async def test_a_running_loop_takes_a_change_within_a_poll_not_an_interval(tmp_path: Path) -> None:
    """The loop as ``rebalancer run`` runs it, with a tick interval of a minute: the poll sees
    the file change and runs the loop at once, so the change is taken within about a poll."""
    async with setup(tmp_path) as box:
        head = box.config.read_text(encoding="utf-8").split("pools:")[0]
        head = head.replace("tick_interval: 2s", "tick_interval: 60s")
        write(box, head, pool_text(0.0))
        config = settings_mod.load(box.config, env={})
        async with wiring.Controller.open(config, ticking.seams(box)) as c:
            assert c.watch is not None
            c.watch.poll = timedelta(seconds=0.2)
            stop = asyncio.Event()
            running = asyncio.create_task(c.run(stop))
            while c.reconciler.last is None:  # the first tick, at once
                await asyncio.sleep(0.05)
            # While the loop runs, full collections wait for the end of a tick.
            assert (c.collections.due_after is not None) is collecting.GENERATIONAL
            loop = asyncio.get_running_loop()
            written = loop.time()
            write(box, "paused: true\n" + head, pool_text(0.0))
            while reloads(c, "applied") != 1.0:
                await asyncio.sleep(0.02)
                assert loop.time() - written < 5, "not taken within 5 s"
            took = loop.time() - written
            while c.reconciler.last is None or not c.reconciler.last.paused:
                await asyncio.sleep(0.02)
            paused = loop.time() - written
            stop.set()
            assert await running == 0
            assert c.collections.due_after is None
    print(f"file written -> applied {took:.2f}s, -> a paused tick {paused:.2f}s (poll 0.2s)")
    assert paused < 2


async def test_a_pool_reconfigured_has_its_cover_judged_by_its_new_shape() -> None:
    """What a pool's history covers is judged with its min_serving (jumps to what the nodes
    kept serving carry anyway do not count): a min_serving changed live is judged afresh,
    over the history the loop already holds."""
    budgeted = replace(reconciling.CONFIG, slo=model.Slo(max_breach_minutes=10))
    async with reconciling.world(budgeted) as w:
        jumped = w.box.clock() - timedelta(days=2)

        def past(at: datetime) -> float:
            # LOW, and twice LOW (a jump past 2 nodes' worth) for ten minutes two days ago.
            low = reconciling.LOW
            return 2 * low if timedelta(0) <= at - jumped < timedelta(minutes=10) else low

        w.metrics.past[pools.POOL] = past
        await w.reconciler.start()
        first = await w.tick()
        wider = replace(budgeted, policy=replace(budgeted.policy, min_serving=3))
        same = Reconfigured(
            actuators=w.reconciler.actuators,
            paused=False,
            frozen=False,
            clock_bound=clocks.DEFAULT_BOUND,
            strategy_timeout=timedelta(seconds=10),
            lend_concurrency=LEND_CONCURRENCY,
        )
        w.reconciler.reconfigure([wider], same)
        later = await w.tick()  # within the history's refresh: no new read

    covers = [r.snapshot.pools[pools.POOL].cover for r in (first, later)]
    # 3 serving nodes carry twice LOW: the jump no longer counts.
    assert [[j.seen for j in c.jumps] for c in covers if c is not None] == [[2.0], [1.0]]
