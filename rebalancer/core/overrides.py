"""Operator overrides: the annotations people put on a Node to steer it (docs/operations.md).

| key                           | values                                                      |
|-------------------------------|-------------------------------------------------------------|
| ``<prefix>window``            | a window (see ``windows``) that replaces the pool's         |
| ``<prefix>lend``              | ``never``, ``auto`` (default) or ``now``                    |
| ``<prefix>reclaim``           | ``now``                                                     |
| ``<prefix>paused``            | ``true`` or ``false``                                       |
| ``<prefix>override-until``    | RFC 3339 time; every override above expires then            |

Validated on every read. A bad value never raises: it is ignored (the default applies) and
comes back as a ``Problem`` naming the key, the value and why, which the runtime turns into an
Event on the node and an audit record. Parsing is cached per annotation set, because nodes are
re-read every tick and rarely change; not for a value over ``CACHED_LENGTH`` characters, which
no valid override has, so that the cache cannot grow with what others write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import lru_cache

from rebalancer.core import bounded, nodestate, windows


class LendMode(StrEnum):
    NEVER = "never"
    AUTO = "auto"
    NOW = "now"


@dataclass(frozen=True, slots=True)
class Overrides:
    window: windows.Window | None = None
    lend: LendMode = LendMode.AUTO
    reclaim_now: bool = False
    paused: bool = False
    until: datetime | None = None

    def active(self, now: datetime) -> Overrides:
        """These overrides as they stand at ``now``: all of them lapse at ``until``."""
        if self.until is not None and now >= self.until:
            return NONE
        return self


NONE = Overrides()


@dataclass(frozen=True, slots=True)
class Problem:
    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={bounded.quoted(self.value)} is ignored: {self.why}"


@dataclass(frozen=True, slots=True)
class Parsed:
    overrides: Overrides
    problems: tuple[Problem, ...]


def parse(
    annotations: Mapping[str, str], keys: nodestate.Keys, default_zone: str = "UTC"
) -> Parsed:
    relevant = tuple(
        sorted(
            (k, annotations[k])
            for k in (keys.window, keys.lend, keys.reclaim, keys.paused, keys.override_until)
            if k in annotations
        )
    )
    if not relevant:
        return _EMPTY
    if any(len(value) > CACHED_LENGTH for _, value in relevant):
        # Not kept: a cache of 4096 entries of 256 KiB values, each change of an annotation
        # a new one, would hold a gigabyte. No valid override is this long.
        return _parse(relevant, keys, default_zone)
    return parse_cached(relevant, keys, default_zone)


_EMPTY = Parsed(NONE, ())
CACHED_LENGTH = 1024  # characters of an override value whose parse is cached


def _parse(
    relevant: tuple[tuple[str, str], ...], keys: nodestate.Keys, default_zone: str
) -> Parsed:
    values = dict(relevant)
    problems: list[Problem] = []
    window = None
    lend = LendMode.AUTO
    reclaim_now = False
    paused = False
    until = None

    if keys.window in values:
        parsed = windows.parse(values[keys.window], default_zone)
        if isinstance(parsed, windows.WindowError):
            problems.append(Problem(keys.window, values[keys.window], parsed.why))
        else:
            window = parsed
    if keys.lend in values:
        raw = values[keys.lend].strip().lower()
        try:
            lend = LendMode(raw)
        except ValueError:
            problems.append(Problem(keys.lend, values[keys.lend], "must be never, auto or now"))
    if keys.reclaim in values:
        raw = values[keys.reclaim].strip().lower()
        if raw == "now":
            reclaim_now = True
        else:
            problems.append(Problem(keys.reclaim, values[keys.reclaim], "must be now"))
    if keys.paused in values:
        raw = values[keys.paused].strip().lower()
        if raw in ("true", "false"):
            paused = raw == "true"
        else:
            problems.append(Problem(keys.paused, values[keys.paused], "must be true or false"))
    if keys.override_until in values:
        when = nodestate.parse_time(values[keys.override_until])
        if isinstance(when, str):
            # Without a readable expiry the overrides could linger forever: ignore them all.
            problems.append(
                Problem(
                    keys.override_until,
                    values[keys.override_until],
                    when + "; the overrides on this node are ignored until it is fixed",
                )
            )
            return Parsed(NONE, tuple(problems))
        until = when
    if reclaim_now and lend is LendMode.NOW:
        # Inference first: the reclaim stands, the contradicting lend is ignored.
        problems.append(
            Problem(keys.lend, values[keys.lend], f"contradicts {keys.reclaim}=now, which wins")
        )
        lend = LendMode.AUTO
    overrides = Overrides(
        window=window, lend=lend, reclaim_now=reclaim_now, paused=paused, until=until
    )
    return Parsed(overrides, tuple(problems))


parse_cached = lru_cache(maxsize=4096)(_parse)
