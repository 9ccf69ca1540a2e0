"""Lending only to takers, proved on the controller's process: with the informer watching the
pods that wait for a node, a pool lends a node only to a pending job that would run on it once
lent, a gang's nodes together, and never one a job's affinity refuses (``core.takers``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rebalancer.core.audit import Kind
from rebalancer.core.model import Reason
from sandbox.emulator import cluster
from tests.support import objects
from tests.support.harness import Harness, harness
from tests.support.waits import until

TAKERS = {"lend_only_to_takers": True}


def waiting_pod(job: str, index: int, **expressions: list[str]) -> dict[str, Any]:
    """A preemptible training pod of ``job`` that only an inference node may take, and only
    one whose labels are in ``expressions`` (label: allowed values)."""
    pod = cluster.training_pod(job, index, priority_class=None)
    required = [{"key": "gpu-pool", "operator": "In", "values": ["inference"]}]
    required += [{"key": k, "operator": "In", "values": v} for k, v in expressions.items()]
    terms = [{"matchExpressions": required}]
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": terms
    }
    return pod


async def test_a_pool_lends_only_what_a_waiting_job_would_run_on(tmp_path: Path) -> None:
    async with harness(tmp_path, waiting=0) as h, h.controller(h.config(pool=TAKERS)) as c:
        # A job that needs an H100 waits; the pool's nodes are L20s: nothing is lent for it.
        h100 = {"nvidia.com/gpu.product": ["NVIDIA-H100-80GB-HBM3"]}
        objects.add(h.store, waiting_pod("fp8", 0, **h100))

        async def refused() -> bool:
            found = [r for r in await h.records() if r.reason == Reason.NO_TAKER.value]
            return any("node affinity" in (r.message or "") for r in found)

        await until("a refusal for want of a taker", refused, c.proc, 20)
        assert await h.lent() == set()

        # A gang of two that L20s suit: two nodes, lent together, for that job.
        for index in (0, 1):
            objects.add(h.store, waiting_pod("pair", index))
        await until("two nodes lent", lambda: _lent_count_is(h, 2), c.proc, 20)
        await asyncio.sleep(3)  # a few ticks more: nothing else waits that a node would take
        lent = await h.lent()
        records = await h.records()

    assert len(lent) == 2
    lends = [r for r in records if r.kind is Kind.INTENT and r.action == "lend"]
    assert sorted(str(r.node) for r in lends) == sorted(lent)
    assert all("for job training/pair" in (r.message or "") for r in lends)


async def _lent_count_is(h: Harness, n: int) -> bool:
    return len(await h.lent()) == n
