"""Crash safety: the controller dies right after its k-th write, for every k; a fresh actuator's
``recover`` (then ``progress``) ends every transition with the node exactly as it was."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.core.nodestate import lent_taints
from rebalancer.core.outcomes import Outcome
from sandbox.emulator import cluster
from tests.support import objects
from tests.support.actuation import (
    KEYS,
    SPEC,
    Crash,
    Recorder,
    World,
    drive,
    restart_passes,
    world,
)
from tests.support.backends import Backend
from tests.support.objects import budget, gpu_node, training
from tests.support.reads import node_obj, pods_on, scheduling_of

NODE = "gpu-0"
MAX_WRITES = 40  # more than any scenario below makes


async def restart(w: World) -> tuple[Actuator, Recorder]:
    """A new controller process: nothing carried over but what is on the cluster."""
    rec = w.writer()
    act = w.actuator(rec)
    for result in await restart_passes(act, rec):
        await drive(act, result.node, result, w)
    return act, rec


def assert_settled(w: World, labels: str, taints: str) -> None:
    obj = node_obj(w.objects, NODE)
    assert scheduling_of(w.objects, NODE) == (labels, taints)  # order and timeAdded included
    assert KEYS.state not in obj["metadata"]["labels"]
    assert KEYS.original not in obj["metadata"].get("annotations", {})


@pytest.mark.parametrize("crash_after", range(1, 4))
async def test_a_lend_cut_after_any_write_is_rolled_back_or_lent_and_restores_exactly(
    backend: Backend,
    crash_after: int,
) -> None:
    async with world(NODE, backend=backend) as w:
        labels, taints = scheduling_of(w.objects, NODE)
        crashing = w.writer(crash_after)
        try:
            result = await w.actuator(crashing).lend(NODE, "audit-1")
        except Crash:
            pass
        else:
            assert result.outcome is Outcome.APPLIED
            assert len(crashing.writes) < crash_after  # the lend made fewer writes
        act, rec = await restart(w)
        phase = node_obj(w.objects, NODE)["metadata"]["labels"].get(KEYS.state)
        assert phase in (None, "lent")  # nothing left half done
        if phase == "lent":
            expected = lent_taints(convert.taints(gpu_node(NODE)), SPEC)
            assert convert.taints(node_obj(w.objects, NODE)) == expected
            result = await act.reclaim(NODE, "audit-2", w.now())
            await drive(act, NODE, result, w)
        assert_settled(w, labels, taints)
        assert rec.pod_targets == set()  # nothing but the daemon pod ran: nothing evicted
        assert "kube-system/gpu-exporter-gpu-0" in pods_on(w.objects, NODE)


async def reclaim_scenario(w: World, crash_after: int) -> tuple[Recorder, set[str]]:
    """A lent node running two jobs (one held by a budget), a DaemonSet pod and an inference pod
    that arrived directly; reclaimed by a controller that crashes after ``crash_after`` writes."""
    await w.actuator(w.writer()).lend(NODE, "audit-1")
    borrowed = training(w.objects, "job-a", 2, NODE) + training(w.objects, "job-b", 1, NODE, 5)
    budget(w.objects, "job-b", min_available=1)  # job-b's pod goes only at the deadline
    objects.add(w.objects, cluster.inference_pod(9, node_name=NODE))
    crashing = w.writer(crash_after)
    act = w.actuator(crashing)
    try:
        first = await act.reclaim(NODE, "audit-2", w.now() + timedelta(minutes=2))
        await drive(act, NODE, first, w)
    except Crash:
        pass
    return crashing, {f"training/{name}" for name in borrowed}


async def test_a_reclaim_cut_after_any_write_is_finished_by_recover_exactly(
    backend: Backend,
) -> None:
    crashed_at = []
    for crash_after in range(1, MAX_WRITES):
        async with world(NODE, backend=backend) as w:
            labels, taints = scheduling_of(w.objects, NODE)
            crashing, borrowed = await reclaim_scenario(w, crash_after)
            _, rec = await restart(w)
            assert_settled(w, labels, taints)
            # Only borrowed pods were ever evicted or deleted, before or after the crash.
            assert crashing.pod_targets | rec.pod_targets <= borrowed
            left = pods_on(w.objects, NODE)
            assert set(left) == {
                "kube-system/gpu-exporter-gpu-0",
                "inference/llm-serving-7d9f8c6b5-00009",
            }
            assert all("deletionTimestamp" not in p["metadata"] for p in left.values())
            if len(crashing.writes) < crash_after:  # the reclaim ended before the k-th write
                break
            crashed_at.append(crash_after)
    # begin_reclaim, evictions (some blocked and retried per pass), deletes, finish: all cut.
    assert len(crashed_at) >= 6, crashed_at
