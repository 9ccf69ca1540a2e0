"""``make check-config``: the controller's settings file that a Helm values file holds under
``config:`` (the chart renders that block into the settings file), written to stdout so that
``rebalancer check`` reads it as the controller would. A file that cannot be read gets one line.

Run from a checkout: ``python -m tools.settings_of VALUES > config.yaml``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import yaml


def settings_of(values: Path) -> str:
    """The ``config:`` block of the values file ``values``, as YAML; ValueError says why not."""
    try:
        document = yaml.safe_load(values.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{values}: {str(error).splitlines()[0]}") from error
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise ValueError(f"{values}: no config: block (the chart's values hold the settings there)")
    return str(yaml.safe_dump(document["config"], sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if len(given) != 1:
        print("usage: python -m tools.settings_of VALUES", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(settings_of(Path(given[0])))
    except ValueError as refused:
        print(f"check-config: VALUES={refused}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
