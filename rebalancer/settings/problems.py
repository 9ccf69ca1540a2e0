"""What is wrong with the settings, one line per problem: ``InvalidSettings``.

Where it sits: ``load`` (rebalancer/settings/loader.py) turns pydantic's validation errors into
lines here (``problem_lines``), each naming the field path, the value and why, e.g.
``pools[0].window='Mon-Fry 22:00-06:00': has days 'Mon-Fry'; write e.g. Mon-Fri, ...``, and
raises them all at once, so that an operator sees every problem in one go.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pydantic
from pydantic import BaseModel

from rebalancer import errors
from rebalancer.errors import ConfigError
from rebalancer.settings.controller import Settings


class InvalidSettings(ConfigError):
    """Every problem found in the settings, one line each (``lines``), the CLI prints them."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(settings)"


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model that holds the field at ``loc`` (for listing its known keys)."""
    current: Any = Settings
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _model_in(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _known(holder: type[BaseModel]) -> str:
    """The keys a settings block takes, as they are written (an alias, where a field has one)."""
    return ", ".join(field.alias or name for name, field in holder.model_fields.items())


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# Errors whose message names what is wrong itself: the block's value would repeat it, or (a
# token) must never be shown.
_SAID_WITHOUT_VALUE = (
    "timings",
    "capacity_missing",
    "tls_pair",
    "ports",
    "token_with_reviews",
    "prometheus_auth",
    "header",
    "sampled_missing",
)


def problem_lines(exc: pydantic.ValidationError) -> list[str]:
    lines: list[str] = []
    found = exc.errors(include_url=False)
    refused = {tuple(error["loc"]) for error in found}
    for error in found:
        loc = list(error["loc"])
        kind = error["type"]
        value = error.get("input")
        ctx = error.get("ctx") or {}
        if kind == "capacity_missing" and (*loc[:-1], "rps_per_node") in refused:
            continue  # rps_per_node was given, and its own line says what is wrong with it
        if kind == "strategy_params":
            base = _path(loc)
            lines.extend(f"{base}.params.{problem}" for problem in ctx.get("lines", ()))
            continue
        if kind == "templates":
            base = _path(loc)
            lines.extend(f"{base}.{problem}" for problem in ctx.get("lines", ()))
            continue
        path = _path(loc)
        given = errors.shown(value)
        if kind in _SAID_WITHOUT_VALUE:
            lines.append(f"{path}: {error['msg']}")
        elif kind == "missing":
            lines.append(f"{path}: is required")
        elif kind == "extra_forbidden":
            holder = _model_at(loc[:-1])
            known = _known(holder) if holder is not None else ""
            lines.append(
                f"{path}={given}: unknown setting" + (f"; known: {known}" if known else "")
            )
        elif kind == "model_type":
            lines.append(f"{path}={given}: must be a mapping of settings (key: value)")
        elif kind == "string_type" and isinstance(value, bool | int | float):
            lines.append(f"{path}={given}: must be text; quote it in YAML: '{json.dumps(value)}'")
        else:
            # Lists are kept as tuples (settings are immutable); a YAML user writes a list.
            msg = error["msg"].removeprefix("Value error, ").replace("valid tuple", "valid list")
            lines.append(f"{path}={given}: {msg}")
    return _dedupe(lines)


def _dedupe(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
