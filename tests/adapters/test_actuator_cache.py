"""The actuator reads a node from the informer's cache before a step and asks the server again
only what the step's safety needs: the pods once a lend has marked the node, the pods a drain
evicts and the ones it leaves, and the node itself when a reclaim's cached read is behind.

The cache here is a snapshot of the server taken with the informer's own conversion, then left
behind on purpose: the cluster changes under it, as it does between a watch event and the next.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.core import model
from rebalancer.core.outcomes import Outcome, WriteKind
from sandbox.emulator import cluster
from tests.support import objects
from tests.support.actuation import KEYS, MARKS, SPEC, Recorder, World, world
from tests.support.backends import Backend
from tests.support.reads import node_obj, pods_on, state_of

Obj = dict[str, Any]


@dataclass
class Snapshot:
    """A ``NodeCache`` frozen at ``take``: what an informer held then."""

    views: dict[str, model.NodeView] = field(default_factory=dict)

    def take(self, w: World, name: str) -> None:
        pods = [convert.pod_view(p, MARKS) for p in pods_on(w.objects, name).values()]
        self.views[name] = convert.node_view(node_obj(w.objects, name), pods)

    def view(self, name: str, marks: model.PodMarks) -> model.NodeView | None:
        assert marks == MARKS
        return self.views.get(name)


@dataclass
class Reads(Recorder):
    """The recorder, counting the reads that reach the server too."""

    reads: Counter[str] = field(default_factory=Counter)

    async def get_node(self, name: str) -> Obj:
        self.reads["get_node"] += 1
        return await super().get_node(name)

    async def list_pods(self, node: str) -> list[Obj]:
        self.reads["list_pods"] += 1
        return await super().list_pods(node)


@dataclass
class Lab:
    w: World
    cache: Snapshot
    act: Actuator
    reads: Reads


@asynccontextmanager
async def lab(backend: Backend) -> AsyncIterator[Lab]:
    """Node gpu-0 and an actuator whose cache holds it as it is now."""
    async with world("gpu-0", backend=backend) as w:
        cache = Snapshot()
        cache.take(w, "gpu-0")
        reads = Reads(w.writer().inner)
        yield Lab(w, cache, Actuator(reads, KEYS, SPEC, MARKS, w.opened.clock, cache=cache), reads)


async def test_a_lend_from_the_cache_asks_the_server_only_for_the_pods_once_marked(
    backend: Backend,
) -> None:
    async with lab(backend) as x:
        lent = await x.act.lend("gpu-0", "audit-1")
        assert lent.outcome is Outcome.APPLIED
        assert [w.kind for w in lent.writes] == [WriteKind.BEGIN_LEND, WriteKind.FINISH_LEND]
        assert x.reads.reads == Counter(list_pods=1)
        assert state_of(x.w.objects, "gpu-0") == "lent"


async def test_a_pod_that_landed_behind_the_cache_rolls_the_lend_back(backend: Backend) -> None:
    async with lab(backend) as x:  # idle when the cache saw it
        objects.add(x.w.objects, cluster.inference_pod(3, node_name="gpu-0"))
        result = await x.act.lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.REFUSED
        assert "became busy" in result.message
        assert [w.kind for w in result.writes] == [WriteKind.BEGIN_LEND, WriteKind.FINISH]
        assert state_of(x.w.objects, "gpu-0") == "serving"


async def test_a_node_changed_behind_the_cache_is_not_lent_on_what_the_cache_says(
    backend: Backend,
) -> None:
    async with lab(backend) as x:
        objects.label(x.w.objects, "gpu-0", {"team": "search"})  # someone else's write
        before = node_obj(x.w.objects, "gpu-0")
        result = await x.act.lend("gpu-0", "audit-1")
        assert result.outcome is Outcome.CONFLICT
        assert result.writes == ()
        assert x.reads.writes == []
        assert node_obj(x.w.objects, "gpu-0") == before


async def test_a_reclaim_behind_the_cache_reads_the_node_again_and_goes_on_at_once(
    backend: Backend,
) -> None:
    async with lab(backend) as x:
        assert (await x.act.lend("gpu-0", "audit-1")).outcome is Outcome.APPLIED
        x.cache.take(x.w, "gpu-0")
        objects.annotate(x.w.objects, "gpu-0", {"example.com/owner": "search"})  # cache behind
        x.reads.reads.clear()
        back = await x.act.reclaim("gpu-0", "audit-2", x.w.now() + timedelta(minutes=5))
        assert back.outcome is Outcome.APPLIED
        assert [w.kind for w in back.writes] == [WriteKind.BEGIN_RECLAIM, WriteKind.FINISH]
        assert x.reads.reads == Counter(get_node=1, list_pods=1)
        assert state_of(x.w.objects, "gpu-0") == "serving"


async def test_a_drain_evicts_what_the_server_holds_not_what_the_cache_saw(
    backend: Backend,
) -> None:
    async with lab(backend) as x:
        await x.act.lend("gpu-0", "audit-1")
        x.cache.take(x.w, "gpu-0")  # lent, with no borrowed pod yet
        borrowed = objects.training(x.w.objects, "job-a", 2, "gpu-0")
        result = await x.act.reclaim("gpu-0", "audit-2", x.w.now() + timedelta(minutes=5))
        assert result.outcome is Outcome.IN_PROGRESS
        assert x.reads.pod_targets == {f"training/{name}" for name in borrowed}


async def test_a_drain_finished_behind_the_cache_reads_the_node_again_and_ends_at_once(
    backend: Backend,
) -> None:
    async with lab(backend) as x:
        await x.act.lend("gpu-0", "audit-1")  # the cache still says serving
        objects.training(x.w.objects, "job-a", 1, "gpu-0")
        x.reads.reads.clear()
        result = await x.act.reclaim("gpu-0", "audit-2", x.w.now() + timedelta(minutes=5))
        assert result.outcome is Outcome.IN_PROGRESS  # not "already serving": asked the server
        assert x.reads.reads["get_node"] == 1
        x.cache.take(x.w, "gpu-0")  # reclaiming, its pod terminating
        objects.annotate(x.w.objects, "gpu-0", {"example.com/owner": "search"})  # cache behind
        x.w.advance(61)  # the evicted pod's grace period ends
        x.reads.reads.clear()
        done = await x.act.progress("gpu-0")
        assert done.outcome is Outcome.APPLIED
        assert x.reads.reads["get_node"] == 1
        assert state_of(x.w.objects, "gpu-0") == "serving"
