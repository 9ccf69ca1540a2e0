"""A controller opened in-process on the API emulator from a settings file of one pool that
may lend (no demand at all), its informer running, ticked by hand: for the tests of what a
running controller does with its settings and of what ``rebalancer status`` reads back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from rebalancer import settings as settings_mod
from rebalancer.core.model import PoolName
from rebalancer.runtime import livesettings, wiring
from tests.support import fakes
from tests.support.processes import Setup, setup

ME = "rebalancer-7c4b9-aaaaa"
POOL = PoolName("inference")


def pool_text(max_lent: float, *, extra: str = "") -> str:
    """The one pool, lending to no taker in particular (so a tick lends when demand is low),
    at most ``max_lent`` of its nodes."""
    return f"""
pools:
  - name: inference
    node_selector: {{gpu-pool: inference}}
    inference_selector: {{app: llm-serving}}
    rps_per_node: 100
    strategy: reactive
    lend_only_to_takers: false
    limits: {{max_lent_fraction: {max_lent}, min_serving: 2}}
{extra}"""


def write(box: Setup, head: str, pools: str) -> None:
    box.config.write_text(head + pools, encoding="utf-8")


def seams(box: Setup) -> wiring.Seams:
    """The in-process controller's seams: no demand at all, no HTTP, the settings file watched."""
    return wiring.Seams(
        kubeconfig=box.kubeconfig,
        name=ME,
        sink=None,
        serve_http=False,
        metrics=fakes.Demand({POOL: 0.0}, clock=wiring.utc_now),
        settings_file=livesettings.SettingsSource(box.config, env={}),
    )


@contextlib.asynccontextmanager
async def controller(
    tmp_path: Path, max_lent: float
) -> AsyncIterator[tuple[Setup, str, wiring.Controller]]:
    """A controller started from a file naming the pool's ``max_lent``, with no demand at all
    (every node could be lent), its informer running; the file's head for the test to keep."""
    async with setup(tmp_path) as box:
        head = box.config.read_text(encoding="utf-8").split("pools:")[0]
        write(box, head, pool_text(max_lent))
        config = settings_mod.load(box.config, env={})
        async with wiring.Controller.open(config, seams(box)) as c:
            task = asyncio.create_task(c.informer.run())
            try:
                await asyncio.wait_for(c.informer.synced.wait(), 10)
                yield box, head, c
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
