"""The Helm chart's schema for ``config``, generated from the settings model itself.

``charts/rebalancer/values.schema.json`` holds, under ``properties.config`` and ``$defs``, what
``Settings.model_json_schema()`` says, less the blocks the chart sets from its own values
(``leader_election``, ``audit``, ``http``). So a key the controller does not know, a window it
cannot read or a duration it would refuse is refused by ``helm install`` naming the path, not by
a crash loop after it. What a schema cannot say (a time zone's existence, a PromQL query's
syntax, a span that starts and ends at once) is left to ``rebalancer check`` and the loader.

    python -m rebalancer.schema            # rewrite the chart's schema from the settings
    python -m rebalancer.schema --check    # exit 1, naming the file, when the two differ

The rest of the file (the chart's own values: image, resources, monitoring...) is written by
hand; only ``properties.config`` and ``$defs`` are replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rebalancer.settings import Settings

CHART_SCHEMA = Path(__file__).resolve().parents[1] / "charts" / "rebalancer" / "values.schema.json"
CHART_OWNED = ("leader_election", "audit", "http")  # the chart sets these from its own values
_NOISE = ("title", "default")  # pydantic's titles repeat the key; defaults live in values.yaml


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config, defs)``: the schema of the chart's ``config`` value and the definitions its
    references name (``#/$defs/...``, at the root of the chart's schema)."""
    generated = _clean(Settings.model_json_schema(mode="validation"))
    defs = generated.pop("$defs")
    for key in CHART_OWNED:
        generated["properties"].pop(key)
        defs.pop(_model_name(key), None)
    defs = _referenced(generated, defs)  # the chart-owned blocks' own parts go with them
    # No minItems on pools: the schema binds helm lint too, which lints the chart's defaults
    # (pools: []); an install that names no pool is refused by the chart's template instead
    # (``fail``, which lint only reports), naming config.pools, as the controller would.
    generated["description"] = (
        "The controller's settings file (docs/configuration.md), without "
        f"{', '.join(CHART_OWNED)}, which the chart sets. Generated from the settings model "
        "by python -m rebalancer.schema."
    )
    generated["required"] = ["pools"]
    return generated, defs


def chart_schema(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the chart's schema) with its ``config`` and ``$defs`` generated anew."""
    config, defs = config_schema()
    updated = dict(current)
    updated["properties"] = {**current["properties"], "config": config}
    updated["$defs"] = defs
    return updated


def _referenced(root: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The ``defs`` that ``root`` names, directly or through another kept one, in their order."""
    kept: set[str] = set()
    todo = [root]
    while todo:
        text = json.dumps(todo.pop())
        for name, sub in defs.items():
            if name not in kept and f'"#/$defs/{name}"' in text:
                kept.add(name)
                todo.append(sub)
    return {name: sub for name, sub in defs.items() if name in kept}


def _model_name(key: str) -> str:
    return "".join(part.title() for part in key.split("_")) + "Settings"


def _clean(node: Any) -> Any:
    """``node`` without pydantic's annotations that do not belong in a values schema."""
    if isinstance(node, list):
        return [_clean(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _NOISE:
            continue
        if key in ("properties", "$defs"):  # names of settings or models, not keywords
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        else:
            out[key] = _clean(value)
    return out


def _text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebalancer.schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--file", type=Path, default=CHART_SCHEMA)
    args = parser.parse_args(argv)
    current = json.loads(args.file.read_text())
    wanted = _text(chart_schema(current))
    if args.check:
        if args.file.read_text() != wanted:
            print(
                f"{args.file}: differs from the settings model; run python -m rebalancer.schema",
                file=sys.stderr,
            )
            return 1
        return 0
    args.file.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
