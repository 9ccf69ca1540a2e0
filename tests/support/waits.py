"""Waiting without sleeping on the wall clock: for a condition, a watch event, a task's end.

``Pulse`` is the in-process wait: whatever may make a condition true (a request the emulator
answered, an informer change) pulses it, and ``until`` re-checks on each pulse, with a short
real bound in case a pulse came before the state moved. ``until`` (the function) is the wait on
another process, which cannot pulse: it polls, and fails as soon as that process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any


class Pulse:
    """Something happened that may make a waited-for condition true."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def __call__(self, *_: object) -> None:
        self._event.set()

    async def until(self, check: Callable[[], object], within: float = 5.0) -> None:
        async with asyncio.timeout(within):
            while not check():
                self._event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._event.wait(), 0.05)


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel a background task and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def counted(read: Callable[[], Awaitable[list[Any]]], n: int) -> bool:
    """Whether ``read()`` gives ``n`` things: a check for ``until``."""
    return len(await read()) == n


async def no_sleep(_: float) -> None:
    """An injected sleep (retry backoff) that does not wait on the wall clock."""


async def next_event(stream: Any, within: float = 5.0) -> dict[str, Any]:
    """The next event of a watch stream; the bound only guards against a hung test."""
    event: dict[str, Any] = await asyncio.wait_for(stream.__anext__(), within)
    return event


async def no_more_events(stream: Any) -> bool:
    """Whether the stream ends (the server closed it) rather than yielding an event."""
    try:
        await next_event(stream)
    except StopAsyncIteration:
        return True
    return False


async def until(
    what: str,
    check: Callable[[], Awaitable[bool]],
    proc: asyncio.subprocess.Process | None,
    within: float,
) -> float:
    """Poll ``check()`` every 0.2 s until it is true; returns the seconds it took. Fails if
    ``proc`` (the process being waited on, if one) exits first, or after ``within`` seconds."""
    began = time.monotonic()
    try:
        async with asyncio.timeout(within):
            while not await check():
                if proc is not None:
                    assert proc.returncode is None, f"the controller exited early while {what}"
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"not done in {within} s: {what}") from None
    return time.monotonic() - began


def wait(what: str, check: Callable[[], Any], within: float) -> float:
    """Poll ``check()`` every 0.05 s, blocking (for tests that drive a real node from plain
    threads and subprocesses); the wall-clock time it became true."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within}s: {what}"
        time.sleep(0.05)
    return time.time()
