"""The value types of the settings: durations, time zones, names, and the base of every block.

Where it sits: at the bottom of ``rebalancer.settings``; every block of the pool's and the
controller's schema is made of these. Each type says in its own JSON schema what it accepts, so
that the chart's schema (rebalancer/schema.py) refuses at install what the loader would at start.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pydantic
from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

NAME_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS label
NAME = re.compile(NAME_PATTERN.strip("^$"))
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def _to_duration(value: object) -> object:
    """``90s``, ``15m``, ``1h30m``, ``0`` or a number of seconds; anything else is refused."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        match = _DURATION.fullmatch(text)
        if text in ("0", "0.0"):
            seconds = 0.0
        elif text and match and any(match.groups()):
            hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
            seconds = hours * 3600 + minutes * 60 + secs
        else:
            try:
                seconds = float(text)  # a bare number from an environment variable
            except ValueError:
                raise PydanticCustomError(
                    "duration", "write a duration such as 90s, 15m or 2h"
                ) from None
    else:
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    if not math.isfinite(seconds):
        raise PydanticCustomError("duration", "write a duration such as 90s, 15m or 2h")
    if seconds < 0:
        raise PydanticCustomError("duration", "must not be negative")
    if seconds > _LONGEST:  # a time plus it must still be a time: no setting needs more
        raise PydanticCustomError("duration", "must be at most 100 years")
    return timedelta(seconds=seconds)


_LONGEST = 100 * 365 * 24 * 3600.0


# What the chart's values schema says of a duration (rebalancer/schema.py): what
# ``_to_duration`` accepts, so that Helm refuses at install what the controller would at start.
# Go's regular expressions (Helm's) have no look-ahead: each unit starts its own alternative.
_NUMBER = r"\d+(\.\d+)?"
_H, _M, _S = (f"{_NUMBER}[{u}{u.upper()}]" for u in "hms")
_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {
            "type": "string",
            "pattern": (rf"^\s*({_NUMBER}|{_H}({_M})?({_S})?|{_M}({_S})?|{_S})\s*$"),
        },
    ],
    "description": "a duration: 90s, 15m, 1h30m, or a number of seconds",
}

Duration = Annotated[
    timedelta,
    pydantic.BeforeValidator(_to_duration),
    pydantic.WithJsonSchema(_DURATION_SCHEMA),
]


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise PydanticCustomError("duration", "must be longer than 0s")
    return value


PositiveDuration = Annotated[Duration, pydantic.AfterValidator(_positive)]


def _whole_seconds(value: timedelta) -> timedelta:
    if value <= timedelta(0) or value.total_seconds() != int(value.total_seconds()):
        raise PydanticCustomError("duration", "must be a whole number of seconds > 0")
    return value


WholeSeconds = Annotated[Duration, pydantic.AfterValidator(_whole_seconds)]


def _check_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a directory of the zone database ("America") is not a zone.
        raise PydanticCustomError(
            "zone", "unknown time zone; use an IANA name such as Asia/Shanghai or UTC"
        ) from None
    return value


Zone = Annotated[
    str,
    pydantic.AfterValidator(_check_zone),
    pydantic.WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$",
            "description": "an IANA time zone, e.g. Europe/Berlin or UTC",
        }
    ),
]


class SettingsBlock(BaseModel):
    """Every settings block: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
