"""``rebalancer explain`` and ``rebalancer reclaim`` as processes on nodes another writer changed,
against the API emulator over HTTP: an original garbled, a state label removed, a lent node
relabelled out of the pool's selector (docs/design/other-writers.md).

Three nodes are lent by the real actuator first. Prometheus is pointed at a closed port, as in
``test_cli_explain``: demand is unknown, so nothing may be lent, yet each changed node is still
taken back (a safety reclaim of its own, whatever the metrics say).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from tests.support.processes import Setup, run_cli, setup

KEYS = Keys()
GARBLED, STRIPPED, MOVED = "inference-5", "inference-6", "inference-7"


async def node(box: Setup, name: str) -> tuple[Any, dict[str, str]]:
    """The node's taints and labels, as the server holds them."""
    read = await client.CoreV1Api(box.api).read_node(name)
    return read.to_dict()["spec"]["taints"], dict(read.metadata.labels)


async def patch(box: Setup, name: str, body: dict[str, Any]) -> None:
    await client.CoreV1Api(box.api).patch_node(name, body)


async def test_explain_and_reclaim_work_on_unreadable_unlabelled_and_orphaned_nodes(
    tmp_path: Path,
) -> None:
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={})
        (pool,) = wiring.pool_configs(config)
        writer = KubeWriter(client.CoreV1Api(box.api))
        actuator = Actuator(
            writer, wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now
        )
        before = {n: await node(box, n) for n in (GARBLED, STRIPPED, MOVED)}
        for name in before:
            assert (await actuator.lend(name, "test-lend")).outcome is Outcome.APPLIED
        await patch(box, GARBLED, {"metadata": {"annotations": {KEYS.original: "{garbled"}}})
        await patch(box, STRIPPED, {"metadata": {"labels": {KEYS.state: None}}})
        await patch(box, MOVED, {"metadata": {"labels": {"gpu-pool": "shared"}}})
        files = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))

        code, out, err = await run_cli("explain", GARBLED, *files, within=60)
        assert code == 0, err
        assert out.splitlines()[0] == (
            f"node {GARBLED} (pool inference): unreadable; next tick: reclaim (state_unreadable: "
            "its state cannot be read: it is taken back from the pool's specification, so that "
            "it serves again)"
        )
        code, out, err = await run_cli("explain", STRIPPED, *files, within=60)
        assert code == 0, err
        assert "next tick: reclaim (state_label_lost: " in out.splitlines()[0]
        code, out, err = await run_cli("explain", MOVED, *files, within=60)
        assert code == 0, err
        assert out.splitlines()[0].startswith(f"node {MOVED} (pool inference): lent since ")
        assert "next tick: reclaim (orphaned: " in out.splitlines()[0]

        code, out, err = await run_cli("reclaim", "--node", GARBLED, *files, within=60)
        assert code == 0, err
        assert f"{GARBLED} back" in out
        code, out, err = await run_cli("reclaim", "--all", *files, within=60)
        assert code == 0, err
        backs = [line.split()[:2] for line in out.splitlines() if line.split()[1:2] == ["back"]]
        assert sorted(backs) == [[STRIPPED, "back"], [MOVED, "back"]]
        code, out, err = await run_cli("reclaim", "--all", *files, within=60)
        assert (code, out) == (0, "no node is lent\n")
        assert "Traceback" not in err

        for name, (taints, labels) in before.items():
            now_taints, now_labels = await node(box, name)
            if name == MOVED:  # the other writer's relabel stays
                assert now_labels == {**labels, "gpu-pool": "shared"}
            else:
                assert now_labels == labels
            # From its own original byte for byte; the garbled one from the specification,
            # which here names the same serving taint.
            assert now_taints == taints
