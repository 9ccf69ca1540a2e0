"""``make check-config``: the controller's settings file that Helm values files hold under
``config:`` (the chart renders that block into the settings file), written to stdout so that
``rebalancer check`` reads it as the controller would. A file that cannot be read gets one line.

Several files are merged in order as ``helm install -f A -f B`` merges them: a later file's
mapping keys win, recursively; a list or a scalar replaces the earlier value whole; ``null``
removes the key. So an overlay (``examples/prometheus/*.yaml``) is checked with the values it
is laid over: ``python -m tools.settings_of values.yaml examples/prometheus/thanos.yaml``.

Run from a checkout: ``python -m tools.settings_of VALUES [VALUES...] > config.yaml``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


def values_of(path: Path) -> dict[str, Any]:
    """One values file's mapping (empty for an empty file); ValueError says why not."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: {str(error).splitlines()[0]}") from error
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a mapping of values")
    return document


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base`` as Helm lays a later ``-f`` file: mappings merge key by key,
    anything else replaces, and ``null`` removes the key."""
    result = dict(base)
    for key, value in over.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def settings_of(*values: Path) -> str:
    """The ``config:`` block of the values files ``values`` merged in order, as YAML;
    ValueError says why not."""
    document: dict[str, Any] = {}
    for path in values:
        document = merged(document, values_of(path))
    if not isinstance(document.get("config"), dict):
        named = " ".join(str(path) for path in values)
        raise ValueError(f"{named}: no config: block (the chart's values hold the settings there)")
    return str(yaml.safe_dump(document["config"], sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if not given:
        print("usage: python -m tools.settings_of VALUES [VALUES...]", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(settings_of(*(Path(name) for name in given)))
    except ValueError as refused:
        print(f"check-config: VALUES={refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
