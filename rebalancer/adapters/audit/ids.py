"""Audit record ids: ULID-like, 26 Crockford base32 characters, time first.

Where it sits: ``AuditLog`` makes one id per record it writes (``core.audit`` takes the factory as
a ``NewId``). Ids increase within a process, so readers that page on ``(time, id)`` get the
records of one tick, which share its time, back in the order they were written.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from rebalancer.core.model import Clock

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        out.append(_CROCKFORD[digit])
    return "".join(reversed(out))


class UlidFactory:
    """48 bits of milliseconds then 80 random bits; within one millisecond (or if the clock
    steps back) the previous id plus one, so ids sort in the order they were made."""

    def __init__(
        self,
        clock: Clock = lambda: datetime.now(UTC),
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._clock, self._random = clock, random
        self._last = (0, 0)
        self._lock = threading.Lock()

    def __call__(self) -> str:
        ms = int(self._clock().timestamp() * 1000)
        with self._lock:
            last_ms, last_rand = self._last
            if ms <= last_ms:
                ms, rand = last_ms, last_rand + 1
                if rand >= 1 << 80:
                    ms, rand = ms + 1, 0
            else:
                rand = int.from_bytes(self._random(10), "big")
            self._last = (ms, rand)
        return _encode(ms, 10) + _encode(rand, 16)
