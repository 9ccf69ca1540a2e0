"""The emulator for adapter tests: real HTTP, the real kubernetes-asyncio client, manual time.

``emulated()`` serves a seeded GPU cluster on a ``ManualClock`` from a ``RecordingStore`` (which
remembers every LIST and WATCH it is asked for, so a test can say how many lists an informer
made and from which resourceVersion it resumed). ``Pulse`` lets a test wait for a condition
without sleeping: whatever may make it true (a request reaching the store, an informer change)
pulses it, and a short real bound re-checks in case a pulse came before the state moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.faults import FaultInjector
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.server import serve
from sandbox.emulator.store import ListRequest, Page, Store, WatchRequest
from sandbox.emulator.watcher import Watcher

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday at noon


class Pulse:
    """Something happened that may make a waited-for condition true."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __call__(self, *_: object) -> None:
        self._event.set()

    async def until(self, check: Callable[[], bool], within: float = 5.0) -> None:
        async with asyncio.timeout(within):
            while not check():
                self._event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), 0.05)


class RecordingStore(Store):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lists: list[ListRequest] = []
        self.watches: list[WatchRequest] = []
        self.pulse = Pulse()

    def list_page(self, request: ListRequest) -> Page:
        self.lists.append(request)
        self.pulse()
        return super().list_page(request)

    def watch(self, request: WatchRequest) -> Watcher:
        self.watches.append(request)
        self.pulse()
        return super().watch(request)

    def lists_of(self, plural: str) -> int:
        return sum(1 for r in self.lists if r.scope.rt.plural == plural and not r.continue_token)

    def watches_of(self, plural: str) -> list[WatchRequest]:
        return [r for r in self.watches if r.scope.rt.plural == plural]

    def annotate(self, node: str, annotations: dict[str, str | None]) -> str:
        """Merge-patch a node's annotations; the new resourceVersion."""
        body = json.dumps({"metadata": {"annotations": annotations}}).encode()
        out = self.patch(NODES, None, node, "application/merge-patch+json", body)
        return str(out["metadata"]["resourceVersion"])

    def label(self, node: str, labels: dict[str, str | None]) -> str:
        body = json.dumps({"metadata": {"labels": labels}}).encode()
        out = self.patch(NODES, None, node, "application/merge-patch+json", body)
        return str(out["metadata"]["resourceVersion"])

    def finish(self, namespace: str, name: str) -> None:
        body = json.dumps({"status": {"phase": "Succeeded"}}).encode()
        self.patch(
            PODS, namespace, name, "application/merge-patch+json", body, subresource="status"
        )


@dataclass
class Emulator:
    store: RecordingStore
    clock: ManualClock
    faults: FaultInjector
    url: str
    api: Any  # kubernetes_asyncio.client.ApiClient


@contextlib.asynccontextmanager
async def emulated(**options: Any) -> AsyncIterator[Emulator]:
    clock = ManualClock(T0)
    store = RecordingStore(clock, seed=1, **options)
    cluster.seed(store)
    faults = FaultInjector()
    async with (
        serve(store, faults=faults) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield Emulator(store=store, clock=clock, faults=faults, url=url, api=api)


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    async with emulated() as box:
        yield box


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel a background task and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
