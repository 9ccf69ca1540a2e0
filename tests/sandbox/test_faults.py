"""Fault injection: refused writes from a seeded generator, dropped watch streams, latency."""

from __future__ import annotations

from collections import Counter

from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiException

from sandbox.emulator.faults import Faults
from tests.support.emulated import Sandbox
from tests.support.objects import NS, pod
from tests.support.reads import status_body
from tests.support.waits import next_event, no_more_events


async def _outcomes(sandbox: Sandbox, faults: Faults, writes: int) -> list[int]:
    sandbox.faults.configure(faults)
    codes = []
    for index in range(writes):
        try:
            await sandbox.core.create_namespaced_pod(NS, pod(f"web-{index}"))
            codes.append(201)
        except ApiException as error:
            codes.append(error.status)
    sandbox.faults.configure(Faults())
    return codes


async def test_injected_write_failures_follow_the_seed_and_store_nothing(
    sandbox: Sandbox,
) -> None:
    faults = Faults(conflict_rate=0.2, throttle_rate=0.2, error_rate=0.2, seed=7)
    codes = await _outcomes(sandbox, faults, 40)
    counts = Counter(codes)
    assert set(counts) == {201, 409, 429, 500}
    stored = await sandbox.core.list_namespaced_pod(NS)
    assert len(stored.items) == counts[201]
    for item in stored.items:
        await sandbox.core.delete_namespaced_pod(item.metadata.name, NS)
    again = await _outcomes(sandbox, faults, 40)
    assert again == codes


async def test_an_injected_429_says_when_to_retry(sandbox: Sandbox) -> None:
    sandbox.faults.configure(Faults(throttle_rate=1.0, retry_after=3))
    try:
        await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    except ApiException as error:
        caught = error
    assert caught.status == 429
    assert caught.headers is not None
    assert caught.headers["Retry-After"] == "3"
    assert status_body(caught)["details"]["retryAfterSeconds"] == 3


async def test_reads_are_never_refused(sandbox: Sandbox) -> None:
    sandbox.faults.configure(Faults(error_rate=1.0))
    listed = await sandbox.core.list_namespaced_pod(NS)
    assert listed.items == []


async def test_a_watch_stream_is_dropped_after_n_events_and_resumes_without_gaps(
    sandbox: Sandbox,
) -> None:
    for index in range(3):
        await sandbox.core.create_namespaced_pod(NS, pod(f"web-{index}"))
    sandbox.faults.configure(Faults(drop_watch_after=2))
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=3600)
        seen = [(await next_event(stream))["object"].metadata.name for _ in range(2)]
        assert await no_more_events(stream)
        last = w.resource_version
    sandbox.faults.configure(Faults())
    async with watch.Watch() as w:
        resumed = w.stream(
            sandbox.core.list_namespaced_pod, NS, resource_version=last, timeout_seconds=3600
        )
        seen.append((await next_event(resumed))["object"].metadata.name)
    assert seen == ["web-0", "web-1", "web-2"]


async def test_a_watch_stream_can_be_dropped_at_random(sandbox: Sandbox) -> None:
    for index in range(2):
        await sandbox.core.create_namespaced_pod(NS, pod(f"web-{index}"))
    sandbox.faults.configure(Faults(drop_watch_rate=1.0))
    async with watch.Watch() as w:
        stream = w.stream(sandbox.core.list_namespaced_pod, NS, timeout_seconds=3600)
        await next_event(stream)
        assert await no_more_events(stream)


async def test_latency_slows_answers_but_changes_nothing(sandbox: Sandbox) -> None:
    sandbox.faults.configure(Faults(latency=0.01))
    created = await sandbox.core.create_namespaced_pod(NS, pod("web-0"))
    assert created.metadata.name == "web-0"
