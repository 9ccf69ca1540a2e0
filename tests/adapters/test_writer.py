"""The writer: what reaches the API server (a locked merge patch, evictions, zero-grace deletes)
and which failures it retries (transport, 5xx, 429 on non-eviction writes; never a 409)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from rebalancer.adapters.writer import (
    MERGE_PATCH,
    ApiFailure,
    Conflict,
    KubeWriter,
    RetryPolicy,
    merge_patch,
)
from rebalancer.core import model
from rebalancer.core.nodestate import NodeChange
from rebalancer.core.outcomes import WriteOutcome
from sandbox.emulator.resources import PODS
from tests.support.actuation import World, world
from tests.support.backends import Backend
from tests.support.objects import TAINTS, budget, training
from tests.support.reads import node_obj
from tests.support.waits import no_sleep

LENT = model.Taint("rebalancer.io/lent", "NoSchedule", "training")
AGED = model.Taint("example.com/aged", "NoExecute", "x", time_added="2026-03-01T08:00:00Z")


def change(*taints: model.Taint, **labels: str | None) -> NodeChange:
    return NodeChange(taints=taints, labels=labels, annotations={"example.com/note": None})


def test_the_merge_patch_carries_the_version_whole_taints_and_nulls_that_delete() -> None:
    body = merge_patch(change(AGED, LENT, old=None, new="1"), "42")
    assert body == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {"old": None, "new": "1"},
            "annotations": {"example.com/note": None},
        },
        "spec": {
            "taints": [
                {
                    "key": "example.com/aged",
                    "value": "x",
                    "effect": "NoExecute",
                    "timeAdded": "2026-03-01T08:00:00Z",
                },
                {"key": "rebalancer.io/lent", "value": "training", "effect": "NoSchedule"},
            ]
        },
    }


def test_a_change_without_taints_leaves_the_taints_out_of_the_patch() -> None:
    body = merge_patch(NodeChange(taints=None, labels={"a": "b"}, annotations={}), "7")
    assert body == {"metadata": {"resourceVersion": "7", "labels": {"a": "b"}}}


async def test_the_server_receives_a_merge_patch_that_replaces_the_taints_whole(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        seen: list[str] = []
        rest = w.opened.api.rest_client
        request = rest.request

        async def spy(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            # The last stop before the wire: the headers aiohttp sends.
            if method == "PATCH":
                seen.append(kwargs["headers"]["Content-Type"])
            return await request(method, url, *args, **kwargs)

        rest.request = spy
        writer = KubeWriter(w.opened.core)
        rv = node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"]
        out = await writer.patch_node("gpu-0", change(AGED, LENT, new="1"), rv)
        assert seen == [MERGE_PATCH]
        assert out["spec"]["taints"] == merge_patch(change(AGED, LENT), rv)["spec"]["taints"]
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"] == out["spec"]["taints"]
        assert out["metadata"]["labels"]["new"] == "1"
        assert out["metadata"]["resourceVersion"] != rv


async def test_a_stale_resource_version_is_a_conflict_and_changes_nothing(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        writer = KubeWriter(w.opened.core)
        rv = node_obj(w.objects, "gpu-0")["metadata"]["resourceVersion"]
        await writer.patch_node("gpu-0", change(LENT), rv)
        with pytest.raises(Conflict, match="409"):
            await writer.patch_node("gpu-0", change(), rv)
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"][0]["key"] == LENT.key
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"] != TAINTS


async def test_an_eviction_is_evicted_blocked_by_a_budget_or_gone(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        writer = KubeWriter(w.opened.core, RetryPolicy(sleep=no_sleep))
        free, held = (
            training(w.objects, "job-a", 1, "gpu-0"),
            training(w.objects, "job-b", 1, "gpu-0"),
        )
        budget(w.objects, "job-b", min_available=1)
        uid = {n: _uid(w, n) for n in free + held}
        assert await writer.evict("training", free[0], uid[free[0]]) is WriteOutcome.EVICTED
        assert await writer.evict("training", held[0], uid[held[0]]) is WriteOutcome.BLOCKED
        assert await writer.evict("training", "no-such-pod", "u") is WriteOutcome.GONE


async def test_a_delete_uses_grace_zero_and_a_second_one_finds_the_pod_gone(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        writer = KubeWriter(w.opened.core)
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        assert await writer.delete_pod("training", name, _uid(w, name)) is True
        assert await writer.delete_pod("training", name, "whatever") is False


async def test_a_delete_of_a_pod_recreated_under_the_same_name_is_a_conflict(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        writer = KubeWriter(w.opened.core)
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        with pytest.raises(Conflict):
            await writer.delete_pod("training", name, "uid-of-an-older-pod")


def _uid(w: World, name: str) -> str:
    uid: str = w.objects.get(PODS, "training", name)["metadata"]["uid"]
    return uid


# ---------------------------------------------------------------------------------------------
# Retries, against a scripted API


@dataclass
class Response:
    status: int
    body: dict[str, Any] = field(default_factory=dict)

    async def read(self) -> bytes:
        return json.dumps(self.body).encode()

    def release(self) -> None:
        pass


@dataclass
class Scripted:
    """A ``CoreV1Api`` stand-in answering each call with the next scripted status."""

    statuses: list[int | type[Exception]]
    calls: int = 0

    def _next(self) -> Response:
        answer = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        if not isinstance(answer, int):
            raise answer("connection reset")
        return Response(answer, {"metadata": {"name": "n"}, "message": f"status {answer}"})

    async def patch_node(self, *args: Any, **kwargs: Any) -> Response:
        assert kwargs["_content_type"] == MERGE_PATCH
        return self._next()

    async def create_namespaced_pod_eviction(self, *args: Any, **kwargs: Any) -> Response:
        return self._next()


@dataclass
class Sleeps:
    waits: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def scripted(*statuses: int | type[Exception]) -> tuple[KubeWriter, Scripted, Sleeps]:
    core, sleeps = Scripted(list(statuses)), Sleeps()
    return (
        KubeWriter(core, RetryPolicy(attempts=4, initial=0.2, maximum=2.0, sleep=sleeps)),
        core,
        sleeps,
    )


async def patch_n(writer: KubeWriter) -> Any:
    """The one node write these tests retry: a patch of node ``n`` at resourceVersion 1."""
    return await writer.patch_node("n", change(), "1")


@pytest.mark.parametrize(
    "statuses",
    [(500, 503, 200), (429, 200), (aiohttp.ClientConnectionError, 200), (TimeoutError, 200)],
)
async def test_transport_errors_5xx_and_throttling_are_retried_with_short_backoff(
    statuses: tuple[int | type[Exception], ...],
) -> None:
    writer, core, sleeps = scripted(*statuses)
    assert (await patch_n(writer))["metadata"]["name"] == "n"
    assert core.calls == len(statuses)
    assert len(sleeps.waits) == len(statuses) - 1
    assert all(0 <= s <= 2.0 for s in sleeps.waits)


async def test_a_conflict_is_never_retried() -> None:
    writer, core, sleeps = scripted(409, 200)
    with pytest.raises(Conflict):
        await patch_n(writer)
    assert (core.calls, sleeps.waits) == (1, [])


async def test_retries_are_bounded_and_end_in_an_api_failure() -> None:
    writer, core, sleeps = scripted(500)
    with pytest.raises(ApiFailure, match="500"):
        await patch_n(writer)
    assert core.calls == 4
    assert len(sleeps.waits) == 3


async def test_a_refusal_such_as_422_is_not_retried() -> None:
    writer, core, _ = scripted(422, 200)
    with pytest.raises(ApiFailure, match="422"):
        await patch_n(writer)
    assert core.calls == 1


async def test_a_429_on_an_eviction_is_a_budget_answer_not_retried() -> None:
    writer, core, sleeps = scripted(429, 201)
    assert await writer.evict("ns", "p", "u") is WriteOutcome.BLOCKED
    assert (core.calls, sleeps.waits) == (1, [])


async def test_a_500_on_an_eviction_is_retried() -> None:
    writer, core, _ = scripted(500, 201)
    assert await writer.evict("ns", "p", "u") is WriteOutcome.EVICTED
    assert core.calls == 2
