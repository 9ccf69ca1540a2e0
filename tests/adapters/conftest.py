"""The adapters' clusters: ``emulator`` serves the default GPU cluster on the API emulator over
real HTTP on a manual clock, and logs the requests it answered; ``seeded`` is the same cluster on
each ``backend`` (the emulator, then a real kube-apiserver); ``cluster`` is an empty one on each
backend, ``emulated`` an empty one on the emulator alone (for tests that inject faults)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.backends import EMULATOR, Backend, Opened
from tests.support.emulated import Sandbox, running


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
