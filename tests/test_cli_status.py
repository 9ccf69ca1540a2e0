"""``rebalancer status``: a row per pool and per node, read back from what a running controller
left on the Nodes, and the command itself as a process (read-only, ``-o``, a bad ``--pool``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml
from kubernetes_asyncio import client

from rebalancer.commands import status
from rebalancer.core import status as rows
from rebalancer.core.nodestate import Keys
from rebalancer.runtime import wiring
from sandbox.emulator.server import Request
from tests.support.processes import Setup, run_cli, setup
from tests.support.ticking import controller

KEYS = Keys()


async def test_the_rows_say_what_the_controller_left_on_the_nodes(tmp_path: Path) -> None:
    async with controller(tmp_path, max_lent=0.5) as (_, _, c):
        report = await c.tick()
        lent = sorted(s.node for s in report.plan.steps)
        assert lent  # the tick lent some nodes
        await client.CoreV1Api(c.api).patch_node(
            "inference-7", {"metadata": {"annotations": {KEYS.lend: "never"}}}
        )
        await _caught_up(c, "inference-7")
        doc = await status.preview(c.reconciler, pool=None)
    (pool,) = doc["pools"]
    assert pool["pool"] == "inference"
    assert pool["nodes"] == 8
    assert pool["lent"] == len(lent)
    assert pool["serving"] == 8 - len(lent)
    assert (pool["paused"], pool["noticed"], pool["reclaiming"]) == (False, 0, 0)
    # The default slo's budget, none of it spent in a fresh audit log: all of it left.
    left = pool["budget_left_minutes"]
    assert left > 0
    assert pool["budget"].startswith(f"0 of {left} minute(s) spent in the last ")
    by_node = {r["node"]: r for r in doc["nodes"]}
    assert sorted(n for n, r in by_node.items() if r["phase"] == "lent") == lent
    assert all(by_node[n]["decision"] for n in lent)  # the decision the audit log has
    assert by_node["inference-7"]["overrides"] == ["lend=never"]
    text = rows.lines(doc)
    assert text[0].split() == [
        "POOL", "NODES", "SERVING", "LENDING", "LENT", "NOTICED", "RECLAIMING", "PAUSED",
        "BUDGET", "LEFT",
    ]  # fmt: skip
    assert text[1].split()[:8] == ["inference", "8", str(8 - len(lent)), "0", str(len(lent)),
                                   "0", "0", "no"]  # fmt: skip
    assert text[3].split() == ["NODE", "POOL", "PHASE", "FOR", "DECISION", "OVERRIDES"]
    assert [line.split()[0] for line in text[4:]] == sorted(by_node)


async def _caught_up(c: wiring.Controller, node: str) -> None:
    """Until the informer's cache holds the annotation just written."""
    for _ in range(100):
        views = c.reconciler.observer.members()
        if any(
            v.name == node and v.annotations.get(KEYS.lend) for vs in views.values() for v in vs
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the informer did not see {node}'s annotation")


async def status_cli(box: Setup, *args: str) -> tuple[int, str, str]:
    files = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))
    return await run_cli("status", *args, *files, within=60)


async def test_status_reads_and_never_writes(tmp_path: Path) -> None:
    seen: list[Request] = []
    async with setup(tmp_path, on_request=seen.append) as box:
        seen.clear()
        code, out, err = await status_cli(box)
        assert code == 0, err
        # The settings' Prometheus listens nowhere: one line for the pool, no query quoted.
        (unknown,) = (line for line in err.splitlines() if "Prometheus" in line)
        url = yaml.safe_load(box.config.read_text())["prometheus"]["url"]
        assert unknown == (
            f"pool inference: demand, queue, running, history unknown: cannot reach Prometheus "
            f"at {url} (ConnectionError); gave up after 1 attempts"
        )
        lines = out.splitlines()
        assert lines[0].startswith("POOL ")
        assert lines[1].split()[:8] == ["inference", "8", "8", "0", "0", "0", "0", "no"]
        assert len(lines) == 2 + 1 + 1 + 8  # two tables, a blank line between

        code, out, _ = await status_cli(box, "--pool", "inference", "-o", "json")
        assert code == 0
        doc = json.loads(out)
        assert [p["pool"] for p in doc["pools"]] == ["inference"]
        assert len(doc["nodes"]) == 8

        code, out, _ = await status_cli(box, "-o", "yaml")
        assert code == 0
        assert yaml.safe_load(out)["pools"][0]["serving"] == 8

        code, out, err = await status_cli(box, "--pool", "nowhere")
        assert (code, out) == (2, "")
        assert err.strip().splitlines()[-1] == (
            "rebalancer: --pool='nowhere': no configured pool has that name (inference)"
        )
    assert [(r.verb, r.resource) for r in seen if r.is_write] == []


def test_ages_read_as_kubectl_prints_them() -> None:
    assert [rows.age(s) for s in (0, 45, 60, 754, 3600, 12000, 86400, 187200)] == [
        "0s", "45s", "1m", "12m", "1h", "3h20m", "1d", "2d4h",
    ]  # fmt: skip
