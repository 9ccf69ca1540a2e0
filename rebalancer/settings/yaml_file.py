"""A YAML file read without a traceback: the settings file, and the pools file too.

Where it sits: ``load`` (rebalancer/settings/loader.py) reads the settings file with
``read_settings_file``; rebalancer/commands/pools.py reads a pools file with ``read_yaml``.
A file that cannot be read is ``Unreadable``, saying why in the words of an error line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rebalancer import errors


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why a YAML file could not be read: the words after its name in an error line."""

    why: str


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path`` (the settings file, a pools file), or ``Unreadable``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Unreadable("does not exist")
    except IsADirectoryError:
        return Unreadable("is a directory, not a file")
    except PermissionError:
        return Unreadable("cannot be read (permission denied)")
    except UnicodeDecodeError:
        return Unreadable("is not UTF-8 text")
    except OSError as exc:
        return Unreadable(f"cannot be read ({exc.strerror or exc})")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        return Unreadable(f"not valid YAML{where}: {problem}")


def read_settings_file(path: Path) -> dict[str, Any] | str:
    """The settings file as a mapping of settings, or the error line saying why it is not."""
    doc = read_yaml(path)
    if isinstance(doc, Unreadable):
        return f"config file {str(path)!r}: {doc.why}"
    if doc is None:
        return {}  # an empty file: every default
    if not isinstance(doc, dict):
        return (
            f"config file {str(path)!r}: must be a mapping of settings (key: value), "
            f"not a {_yaml_kind(doc)}"
        )
    bad_keys = [k for k in doc if not isinstance(k, str)]
    if bad_keys:
        name = errors.shown(bad_keys[0])
        return f"config file {str(path)!r}: setting names must be text, not {name}"
    return doc


def _yaml_kind(doc: object) -> str:
    if isinstance(doc, list):
        return "list"
    if isinstance(doc, str):
        return "string"
    return type(doc).__name__
