"""``rebalancer explain`` and the running loop answer alike where the loop's demand history and a
fresh one differ: a real Prometheus holds the pool's demand, backfilled, with a jump in the
minutes after the loop last read its history, and a fall after it. The loop holds that fall
(``drop_hold``) and keeps its history for a few minutes; explain, a fresh process, believed the
fall at once and read the history to the minute, and said "lend 6" while the loop lent none.
Now explain recalls the belief from the samples of the last ``drop_hold`` and reads the
history on the loop's grid (``observing.history_end``), so both read the same inputs at the
same ``now``, and each answer says how old they are.

Both controllers are the ones the commands build (``Controller.open``: the loop's role, and the
operator's that ``rebalancer explain`` opens), on one emulated cluster and one manual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rebalancer import settings as settings_mod
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.adapters.metrics import Metrics
from rebalancer.commands import explain
from rebalancer.core import explain as words
from rebalancer.core.model import NodeName, PoolName
from rebalancer.runtime import adapterconfig, wiring
from rebalancer.runtime.observing import history_end
from rebalancer.runtime.poolmetrics import PoolMetricsRouter
from rebalancer.runtime.seams import HistorySettings
from tests.support import emulated, prometheus
from tests.support.factories import T0
from tests.support.processes import node_state_keys

POOL = PoolName("inference")
MINUTE = timedelta(minutes=1)
LOW, HIGH = 50.0, 700.0
JUMP = (T0 + MINUTE, T0 + 2 * MINUTE)  # the minutes the loop's history does not hold yet
ASKED = T0 + timedelta(minutes=4, seconds=30)


def series() -> str:
    """The pool's demand a minute at a time, from half an hour before ``T0``: LOW, but HIGH in
    the minutes of ``JUMP``."""
    lines = ["# TYPE demand_rps gauge"]
    for k in range(-30, 10):
        at = T0 + k * MINUTE
        value = HIGH if at in JUMP else LOW
        lines.append(f'demand_rps{{pool="inference"}} {value} {at.timestamp():.0f}')
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("demand")
    store, _ = prometheus.backfill(workdir, series())
    with prometheus.serving(workdir, store) as (address, _, _):
        yield address


def configured(url: str, home: Path) -> settings_mod.Settings:
    """One pool of the emulated cluster's 8 inference nodes, its demand and history from the
    gauge, planned by ``peak`` over the last 5 minutes with no margin."""
    demand = 'sum(demand_rps{pool="$pool"})'
    doc: dict[str, Any] = {
        "node_state_keys": str(node_state_keys(home)),
        "leader_election": {"enabled": False},
        "prometheus": {"url": url},
        "pools": [
            {
                "name": "inference",
                "node_selector": {"gpu-pool": "inference"},
                "inference_selector": {"app": "llm-serving"},
                "rps_per_node": 100,
                "lend_only_to_takers": False,
                "slo": "none",
                "strategy": {"name": "peak", "params": {"window_minutes": 5, "margin": 0}},
                "metrics": {
                    "demand": {"value": demand, "sampled": 'timestamp(demand_rps{pool="$pool"})'},
                    "history": demand,
                },
            }
        ],
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return settings_mod.load(path, env={})


def seams(config: settings_mod.Settings, box: emulated.Sandbox, name: str) -> wiring.Seams:
    """Prometheus read on the emulator's clock, not measured against it (its own runs on the
    wall clock, years after the series)."""
    metrics = Metrics(adapterconfig.metrics_settings(config, config.pool(POOL)), clock=box.clock)
    return wiring.Seams(
        api=box.api,
        clock=box.clock,
        metrics=PoolMetricsRouter({POOL: metrics}),
        audit_store=MemoryAuditStore(),
        sink=None,
        name=name,
        serve_http=False,
    )


@contextlib.asynccontextmanager
async def reading(
    config: settings_mod.Settings, box: emulated.Sandbox, name: str
) -> AsyncIterator[wiring.Controller]:
    """The controller ``rebalancer explain`` opens: the operator's, its informer listed."""
    seamed = seams(config, box, name)
    async with wiring.Controller.open(config, seamed, wiring.Role.OPERATOR) as c, c.informed(10):
        yield c


async def test_explain_and_the_loop_agree_where_a_fresh_reading_would_not(
    url: str, tmp_path: Path
) -> None:
    config = configured(url, tmp_path)
    async with emulated.running(seeded=True) as box:
        async with wiring.Controller.open(config, seams(config, box, "loop")) as loop:
            task = asyncio.create_task(loop.informer.run())
            await asyncio.wait_for(loop.informer.synced.wait(), 10)
            while box.clock() < ASKED:  # a tick every tick_interval (30 s), as the loop runs
                box.clock.advance(30)
                await loop.tick()
            served = loop._explain(None, str(POOL))  # GET /api/v1/explain?pool=inference
            task.cancel()
        async with reading(config, box, "explain") as c:
            asked = await explain.preview(c.reconciler, node=None, pool=str(POOL))
        async with reading(config, box, "before") as c:
            snapshot, decision = await c.reconciler.preview()  # no belief recalled
        fresh = await _fresh_peak(config, box)

    assert served is not None
    assert box.clock() == ASKED
    # The loop saw the jump at 12:01 and holds the fall that followed it (drop_hold): it plans
    # with 700 rps, keeps 9 of 8 nodes, lends none.
    assert served["demand"]["held"] is not None
    assert served["proposal"]["lend_target"] == 0
    # explain reads the same: the belief recalled from the last drop_hold of samples, and the
    # history on the same 5-minute grid.
    assert asked["proposal"] == served["proposal"]
    assert asked["demand"]["held"]["seen"] == served["demand"]["held"]["seen"] == LOW
    assert [s["text"] for s in asked["steps"]] == [s["text"] for s in served["steps"]]
    assert asked["history"] == served["history"]
    assert served["history"]["until"] == "2026-03-02T12:00:00Z"
    assert served["history"]["age_seconds"] == 270.0
    # Read fresh, as explain read before: the fall believed ("target 6"), and a history to the
    # minute that holds the jump the loop's does not hold yet.
    assert decision.proposals[POOL].lend_target == 6
    assert snapshot.pools[POOL].held is None
    assert fresh == HIGH
    # Each answer says whose reading it is, and how old its inputs are.
    assert (served["read"]["by"], asked["read"]["by"]) == ("loop", "explain")
    said = words.pool_lines(asked)
    assert "  inputs: read now, as the loop reads them at 2026-03-02T12:04:30Z" in said
    history = "  history: 8d of 1m steps (31 points) up to 2026-03-02T12:00:00Z, its newest point"
    assert f"{history} 4m old" in said
    demand = "  demand: 700 rps sampled 30s ago, needs 9 nodes of 100 rps; a fall to 50 rps is held"
    assert demand in said
    assert "  inputs: the loop's last tick, at 2026-03-02T12:04:30Z (0s before this answer)" in (
        words.pool_lines(served)
    )


async def _fresh_peak(config: settings_mod.Settings, box: emulated.Sandbox) -> float:
    """The peak over the strategy's 5 minutes of a history read at ``ASKED`` up to its minute,
    as the loop's first read would have ended before the grid."""
    metrics = Metrics(adapterconfig.metrics_settings(config, config.pool(POOL)), clock=box.clock)
    try:
        until = ASKED.replace(second=0)
        nodes = [NodeName(f"inference-{i}") for i in range(8)]
        got = await metrics.history(POOL, nodes, until - timedelta(hours=1), until, MINUTE)
    finally:
        metrics.close()
    return max(got.history.window(ASKED - timedelta(minutes=5), ASKED))


def test_the_history_ends_on_the_grid_whenever_it_is_read() -> None:
    settings = HistorySettings()  # a 5-minute grid
    ends = {history_end(T0 + timedelta(seconds=s), settings) for s in (0, 1, 150, 299)}
    assert ends == {T0}
    assert history_end(T0 + timedelta(minutes=5), settings) == T0 + timedelta(minutes=5)
