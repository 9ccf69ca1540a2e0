"""Fault injection: what an unreliable or overloaded API server does to a client.

``Faults`` says what to inject; a ``FaultInjector`` holds the current ``Faults`` and a seeded
random generator, so a test that sets ``write_error_rate=0.3, seed=7`` sees the same failures on
every run. Write faults (409 Conflict, 429 TooManyRequests with ``Retry-After``, 500
InternalError) replace the write entirely: nothing is stored, as when the real server refuses
before reaching etcd. Watch faults end the stream early (after N events or at random), the way a
load balancer or an apiserver restart drops a long-lived connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sandbox.emulator import status


@dataclass(frozen=True, slots=True)
class Faults:
    latency: float = 0.0  # seconds added to every request (wall clock)
    conflict_rate: float = 0.0  # share of writes answered 409 Conflict
    throttle_rate: float = 0.0  # share of writes answered 429 TooManyRequests
    error_rate: float = 0.0  # share of writes answered 500 InternalError
    retry_after: int = 1  # seconds advertised with an injected 429
    drop_watch_after: int | None = None  # end every watch stream after this many events
    drop_watch_rate: float = 0.0  # chance of ending a watch stream after each event
    seed: int = 0


NONE = Faults()


class FaultInjector:
    def __init__(self, faults: Faults = NONE) -> None:
        self.configure(faults)

    def configure(self, faults: Faults) -> None:
        self.faults = faults
        # One generator per kind of fault: watch streams draw in whatever order the event loop
        # serves them, which must not shift the sequence of write faults a test relies on.
        self._random = random.Random(faults.seed)
        self._drops = random.Random(f"{faults.seed}/watch")

    def write_fault(self, resource: str, group: str, name: str) -> status.ApiError | None:
        faults = self.faults
        if not (faults.conflict_rate or faults.throttle_rate or faults.error_rate):
            return None
        roll = self._random.random()
        if roll < faults.conflict_rate:
            return status.conflict(resource, group, name)
        roll -= faults.conflict_rate
        if roll < faults.throttle_rate:
            return status.too_many_requests(
                "Too many requests, please try again later.", faults.retry_after
            )
        roll -= faults.throttle_rate
        if roll < faults.error_rate:
            return status.internal_error("injected fault")
        return None

    def drop_watch(self, sent: int) -> bool:
        faults = self.faults
        if faults.drop_watch_after is not None and sent >= faults.drop_watch_after:
            return True
        return bool(faults.drop_watch_rate) and self._drops.random() < faults.drop_watch_rate
