"""``Controller.open`` against the API emulator: the parts are connected as the runtime needs.

In-process (unlike ``tests/test_cli_run.py``, which runs the command): the controller is opened
from a settings file with leader election on, and its elector is stepped by hand, so what the
telemetry says is checked right after each change of leadership, with no tick in between.
"""

from __future__ import annotations

from pathlib import Path

from rebalancer import settings as settings_mod
from rebalancer.runtime import wiring
from tests.support.processes import setup

ME = "rebalancer-7c4b9-aaaaa"


async def test_the_leader_metric_follows_the_lease_as_the_elector_wins_and_releases_it(
    tmp_path: Path,
) -> None:
    async with setup(tmp_path, election=True) as box:
        config = settings_mod.load(box.config, env={})
        seams = wiring.Seams(kubeconfig=box.kubeconfig, name=ME, sink=None)
        async with wiring.Controller.open(config, seams) as c:
            assert c.elector is not None

            def leader() -> float | None:
                return c.telemetry.registry.get_sample_value("rebalancer_leader", {"identity": ME})

            assert leader() == 0.0  # a candidate says 0 from the start, before any tick
            assert await c.elector.step()
            assert leader() == 1.0  # as soon as the Lease names it: no tick has run
            assert await c.elector.release()
            assert leader() == 0.0
