"""``load``: the settings from the defaults, the YAML file and the environment, in that order.

Where it sits: ``rebalancer run`` (and every command that reads settings) calls
``load(config_path(args.config))`` once at start-up. Every problem found on the way is a line
of one ``InvalidSettings``; nothing here lets a traceback through for bad input.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

from rebalancer import errors
from rebalancer.settings.controller import Settings
from rebalancer.settings.environment import CONFIG_ENV, read_env
from rebalancer.settings.problems import InvalidSettings, problem_lines
from rebalancer.settings.yaml_file import read_settings_file


def config_path(arg: Path | None, env: Mapping[str, str] | None = None) -> Path | None:
    """The config file: ``--config`` if given, else ``REBALANCER_CONFIG``, else none."""
    if arg is not None:
        return arg
    environ = os.environ if env is None else env
    value = environ.get(CONFIG_ENV, "").strip()
    return Path(value) if value else None


def load(path: Path | None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``path`` (None: defaults only) with ``env`` over it (None: os.environ).

    ``path`` is taken as given: the CLI resolves ``--config`` / ``REBALANCER_CONFIG`` with
    ``config_path``. Raises ``InvalidSettings`` (a ``ConfigError``) with one line per problem
    (``exc.lines``), and nothing else, for bad input.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    lines: list[str] = []
    data: dict[str, Any] = {}
    if path is not None:
        file_data = read_settings_file(path)
        if isinstance(file_data, str):
            lines.append(file_data)
        else:
            data = file_data
    env_data, env_lines = read_env(environ)
    lines.extend(env_lines)
    merged = _merge(data, env_data)
    lines.extend(_duplicate_pools(merged.get("pools")))
    settings: Settings | None = None
    try:
        settings = Settings.model_validate(merged)
    except pydantic.ValidationError as exc:
        lines.extend(problem_lines(exc))
    if lines or settings is None:
        raise InvalidSettings(lines)
    return settings


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``; mappings merge key by key, anything else (lists too) replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _duplicate_pools(pools: object) -> list[str]:
    if not isinstance(pools, list | tuple):
        return []
    first: dict[str, int] = {}
    lines = []
    for index, pool in enumerate(pools):
        name = pool.get("name") if isinstance(pool, Mapping) else None
        if not isinstance(name, str):
            continue
        if name in first:
            lines.append(
                f"pools[{index}].name={errors.shown(name)}: duplicate pool name; "
                f"pools[{first[name]}] has it already"
            )
        else:
            first[name] = index
    return lines
