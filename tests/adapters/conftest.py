"""The adapters' clusters: ``emulator`` serves the default GPU cluster on the API emulator over
real HTTP on a manual clock, and logs the requests it answered; ``seeded`` is the same cluster on
each ``backend`` (the emulator, then a real kube-apiserver); ``cluster`` is an empty one on each
backend, ``emulated`` an empty one on the emulator alone (for tests that inject faults).

``prometheus`` is a real Prometheus over series backfilled from a trace
(tests/support/prometheus.py), one for the session: the metrics adapter's tests read it, and
those of how it is reached (test_metrics_access.py) put a proxy in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.backends import EMULATOR, Backend, Opened
from tests.support.emulated import Sandbox, running
from tests.support.prometheus import Server
from tests.support.prometheus import running as prometheus_running


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with prometheus_running(tmp_path_factory.mktemp("prometheus")) as server:
        yield server


@pytest.fixture
async def emulator() -> AsyncIterator[Sandbox]:
    async with running(seeded=True) as box:
        yield box


@pytest.fixture
async def seeded(backend: Backend) -> AsyncIterator[Opened]:
    async with backend.open(seeded=True) as opened:
        yield opened


@pytest.fixture
async def cluster(backend: Backend) -> AsyncIterator[Opened]:
    async with backend.open() as opened:
        yield opened


@pytest.fixture
async def emulated() -> AsyncIterator[Opened]:
    async with EMULATOR.open() as opened:
        yield opened
