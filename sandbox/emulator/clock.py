"""The emulator's notion of time: a callable returning an aware UTC datetime.

Everything in the sandbox that depends on time (grace periods, watch timeouts, bookmarks, lease
ages in events) reads this one clock, so a test can replace it with a ``ManualClock`` and move
time forward instantly instead of sleeping. ``ManualClock.advance`` tells its listeners (the
store) at once, so the effects of time are visible before ``advance`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta


def wall_clock() -> datetime:
    return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("the clock's start must be timezone-aware")
        self._now = start.astimezone(UTC)
        self._listeners: list[Callable[[], None]] = []

    def __call__(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += timedelta(seconds=seconds)
        for listener in list(self._listeners):
            listener()

    def on_advance(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)


def rfc3339(when: datetime) -> str:
    """The API's ``metav1.Time`` form: seconds, UTC, ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(when: datetime) -> str:
    """The API's ``metav1.MicroTime`` form."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
