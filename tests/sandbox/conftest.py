"""A running emulator per test, driven through the real kubernetes-asyncio client over HTTP.

Each test gets its own ``Store`` on a ``ManualClock`` served on a free port of 127.0.0.1, and a
configured ``ApiClient`` with the typed APIs. Time moves only when a test advances the clock, so
no test waits on the wall clock; waiting for a watch event is bounded by ``next_event``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.faults import FaultInjector
from sandbox.emulator.server import serve
from sandbox.emulator.store import Store

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday at noon
NS = "inference"


@dataclass
class Sandbox:
    store: Store
    clock: ManualClock
    faults: FaultInjector
    url: str
    api: Any  # kubernetes_asyncio.client.ApiClient
    core: Any
    policy: Any
    coordination: Any
    events: Any

    def schedule(self) -> list[tuple[str, str, str]]:
        return self.store.schedule()


@asynccontextmanager
async def running(seeded: bool = False, **options: Any) -> AsyncIterator[Sandbox]:
    clock = ManualClock(T0)
    store = Store(clock, seed=1, **options)
    if seeded:
        cluster.seed(store)
    faults = FaultInjector()
    async with (
        serve(store, faults=faults) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield Sandbox(
            store=store,
            clock=clock,
            faults=faults,
            url=url,
            api=api,
            core=client.CoreV1Api(api),
            policy=client.PolicyV1Api(api),
            coordination=client.CoordinationV1Api(api),
            events=client.EventsV1Api(api),
        )


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with running() as box:
        yield box


@pytest.fixture
async def gpu_cluster() -> AsyncIterator[Sandbox]:
    """The default cluster: 8 inference and 4 training GPU nodes."""
    async with running(seeded=True) as box:
        yield box


def status_body(error: Any) -> dict[str, Any]:
    """The ``Status`` object of an ``ApiException``."""
    body: dict[str, Any] = json.loads(error.body)
    return body


async def raw(response: Any) -> Any:
    """The JSON of a response asked for with ``_preload_content=False``."""
    try:
        return json.loads(await response.read())
    finally:
        response.release()


async def next_event(stream: Any, within: float = 5.0) -> dict[str, Any]:
    """The next watch event; the bound only guards against a hung test."""
    event: dict[str, Any] = await asyncio.wait_for(stream.__anext__(), within)
    return event


async def no_more_events(stream: Any) -> bool:
    """Whether the stream ends (the server closed it) rather than yielding an event."""
    try:
        await next_event(stream)
    except StopAsyncIteration:
        return True
    return False


def pod(name: str, namespace: str = NS, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "nginx:1.27"}], **spec},
    }
    return body


def node(name: str, taints: list[dict[str, str]] | None = None, gpus: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu-pool": "inference"}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {
                "cpu": "8",
                "memory": "64Gi",
                "pods": "110",
                "nvidia.com/gpu": str(gpus),
            }
        },
    }
    return body
