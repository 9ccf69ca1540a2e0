"""Durations as the command line's flags take them: one syntax for every flag of every command.

Where it sits: beside ``values``, whose ``Duration`` the settings file and the environment read.
A flag is read the way kubectl and helm read theirs, a Go duration with its unit (``30s``,
``5m``, ``1h30m``; ``0`` alone needs none). A bare number is refused, where the settings read
it as seconds: the flags once read it as seconds in one place (``--drain``) and as minutes in
another (``--hold``), and a value that means either cannot be told apart from the typing.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pydantic

from rebalancer.errors import ConfigError
from rebalancer.settings.values import Duration

ACCEPTED = "a duration with its unit, such as 30s, 5m or 1h30m"
_BARE = re.compile(r"\s*[-+]?(\d+(\.\d*)?|\.\d+)\s*")
_READ = pydantic.TypeAdapter(Duration)


def flag_duration(flag: str, text: str, *, positive: bool = True) -> timedelta:
    """``text``, the value of ``flag``, as a duration; a bare number (but ``0`` where zero is
    allowed), a duration of no unit known, or zero where it must be longer is a ``ConfigError``
    of one line naming the flag, the value and what it takes."""
    if _BARE.fullmatch(text) and (positive or float(text) != 0):
        raise ConfigError(f"{flag}={text!r}: a bare number has no unit; write {ACCEPTED}")
    try:
        value = _READ.validate_python(text)
    except pydantic.ValidationError as exc:
        why = exc.errors()[0]["msg"]
        raise ConfigError(f"{flag}={text!r}: {why}") from None
    if positive and value <= timedelta(0):
        raise ConfigError(f"{flag}={text!r}: must be longer than 0s")
    return value
