"""The ``REBALANCER_*`` environment variables, read as a mapping of settings.

Where it sits: ``load`` (rebalancer/settings/loader.py) lays what ``read_env`` returns over the
YAML file. pydantic-settings reads the variables, from a given mapping rather than os.environ,
so that tests and ``rebalancer check`` pass their own; a variable it cannot read is a line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from rebalancer import errors
from rebalancer.settings.controller import Settings

ENV_PREFIX = "REBALANCER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"  # the config file's path, when --config is not given


class _EnvShape(BaseSettings, Settings):
    """``Settings`` as pydantic-settings sees it, to read ``REBALANCER_*`` variables.

    Only its environment source is used (``_MappingEnvSource``); it is never instantiated.
    ``Settings`` itself is a plain model so that validating it reads nothing from the process.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, reading a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items()}


_COMPOUND = ("leader_election", "prometheus", "audit", "http", "alertmanager", "pools")
# What the kubelet sets in every container for each Service of its namespace (the Service's
# name, upper-cased, then _SERVICE_HOST, _SERVICE_PORT, _PORT_8443_TCP_ADDR, ...): a Service
# named rebalancer (the chart's, by default) makes variables that look like settings.
_SERVICE_LINK = re.compile(
    r"REBALANCER_(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?)"
)
_SERVICE_LINK_HINT = (
    " (the kubelet's variable for a Service whose name starts with rebalancer? set the pod's"
    " enableServiceLinks: false, as the chart does)"
)


def read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """``(settings, lines)``: the ``REBALANCER_*`` variables of ``environ`` as a mapping of
    settings, and a line for each that is unknown or unreadable. A block or list that is not
    JSON, or a value pydantic-settings cannot read, leaves the mapping empty."""
    fields = set(Settings.model_fields)
    lines: list[str] = []
    unreadable = False
    for name, value in sorted(environ.items()):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper == CONFIG_ENV:
            continue
        rest = upper[len(ENV_PREFIX) :]
        top = rest.split("__", 1)[0].lower()
        if top not in fields:
            lines.append(
                f"{upper}={errors.shown(value)}: unknown setting; known: "
                + ", ".join(ENV_PREFIX + f.upper() for f in Settings.model_fields)
                + (_SERVICE_LINK_HINT if _SERVICE_LINK.fullmatch(upper) else "")
            )
        elif top in _COMPOUND and "__" not in rest:
            try:
                json.loads(value)
            except ValueError as exc:
                lines.append(
                    f"{upper}={errors.shown(value)}: not JSON ({exc}); write this setting as JSON"
                )
                unreadable = True
    if unreadable:
        return {}, lines
    try:
        data = _MappingEnvSource(_EnvShape, environ)()
    except SettingsError as exc:
        cause = exc.__cause__
        lines.append(f"environment: {exc}" + (f" ({cause})" if cause else ""))
        return {}, lines
    return data, lines
