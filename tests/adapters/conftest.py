"""The adapters' emulator (``tests.support.emulated``): ``emulator`` serves the default GPU
cluster over real HTTP on a manual clock, and logs the requests it answered."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.emulated import Sandbox, running


@pytest.fixture
async def emulator() -> AsyncIterator[Sandbox]:
    async with running(seeded=True) as box:
        yield box
