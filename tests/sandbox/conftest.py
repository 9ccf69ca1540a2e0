"""A running emulator per test (``tests.support.emulated``): ``sandbox`` is empty,
``gpu_cluster`` the default cluster of 8 inference and 4 training GPU nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.emulated import Sandbox, running


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with running() as box:
        yield box


@pytest.fixture
async def gpu_cluster() -> AsyncIterator[Sandbox]:
    async with running(seeded=True) as box:
        yield box
