"""The chart's schema for ``config`` is the settings model's, and says what the loader says.

``rebalancer/schema.py`` generates it; here: the file in the chart is what it generates today
(a settings field added without regenerating fails), and on a table of values the schema and
the controller's loader agree, accepting or refusing each (the patterns for durations, windows,
taints and names are written beside the validators they stand for).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from rebalancer import schema, settings
from rebalancer.errors import ConfigError
from tests.support.chart import CHART, POOL

ROOT = CHART.parents[1]


def chart_schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def test_the_chart_schema_is_the_one_the_settings_generate() -> None:
    assert schema.chart_schema(chart_schema()) == chart_schema(), "run python -m rebalancer.schema"
    assert schema.main(["--check"]) == 0


def test_the_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = chart_schema()
    del stale["$defs"]["LimitSettings"]["properties"]["warmup"]
    path = tmp_path / "values.schema.json"
    path.write_text(json.dumps(stale))
    assert schema.main(["--check", "--file", str(path)]) == 1
    assert schema.main(["--file", str(path)]) == 0
    assert schema.main(["--check", "--file", str(path)]) == 0


def test_every_pool_field_is_in_the_schema() -> None:
    pool = chart_schema()["$defs"]["PoolSettings"]
    fields = settings.PoolSettings.model_fields  # as written: an alias, where a field has one
    assert set(pool["properties"]) == {f.alias or name for name, f in fields.items()}
    assert pool["additionalProperties"] is False


def schema_accepts(config: dict[str, Any]) -> bool:
    whole = chart_schema()
    validator = jsonschema.Draft7Validator(whole)
    return validator.is_valid({"config": config})


def loader_accepts(config: dict[str, Any], tmp_path: Path) -> bool:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        settings.load(path, env={})
    except ConfigError:
        return False
    return True


def pool(**fields: Any) -> dict[str, Any]:
    return {"pools": [{**POOL, **fields}]}


EXAMPLE = yaml.safe_load((ROOT / "examples" / "config.yaml").read_text())

AGREEMENT: list[tuple[str, dict[str, Any], bool]] = [
    ("one pool", pool(), True),
    ("the example's pools", {"pools": EXAMPLE["pools"], "prometheus": EXAMPLE["prometheus"]}, True),
    ("duration 90s", {**pool(), "tick_interval": "90s"}, True),
    ("duration 1h30m", {**pool(), "tick_interval": "1h30m"}, True),
    ("duration in seconds", {**pool(), "tick_interval": 45}, True),
    ("duration upper case", {**pool(), "tick_interval": "2M"}, True),
    ("duration in days", {**pool(), "tick_interval": "1d"}, False),
    ("duration in ms", {**pool(), "tick_interval": "500ms"}, False),
    ("duration word", {**pool(), "tick_interval": "soon"}, False),
    ("window of one span", pool(window="Mon-Fri 22:00-06:00"), True),
    ("window of two spans", pool(window="Sat,Sun 00:00-24:00 UTC; Mon 01:00-05:00"), True),
    ("window daily", pool(window="daily 01:00-05:00"), True),
    ("window wrapping the week", pool(window="Fri-Mon 22:00-6:00 Europe/Berlin"), True),
    ("window never", pool(window="NEVER"), True),
    ("window bad day", pool(window="Mon-Fry 22:00-06:00"), False),
    ("window bad hour", pool(window="Mon 25:00-06:00"), False),
    ("window without times", pool(window="Mon-Fri"), False),
    ("taint as text", pool(serving_taints=["workload=inference:NoSchedule"]), True),
    ("taint without value", pool(serving_taints=["dedicated:NoExecute"]), True),
    ("taint without effect", pool(serving_taints=["workload=inference"]), False),
    ("taint bad effect", pool(serving_taints=["a=b:Never"]), False),
    ("misspelt limit", pool(limits={"queue_limt": 5}), False),
    ("strategy by name", pool(strategy="forecast"), True),
    ("strategy params", pool(strategy={"name": "peak", "params": {"window_minutes": 30}}), True),
    ("misspelt strategy param", pool(strategy={"name": "peak", "params": {"window": 30}}), False),
    ("slo off", pool(slo="none"), True),
    ("slo null", pool(slo=None), True),
    ("slo minutes", pool(slo={"max_breach_minutes": 5, "window": "24h"}), True),
    ("slo both", pool(slo={"max_breach_minutes": 5, "availability": 0.999}), False),
    ("slo neither", pool(slo={"window": "24h"}), False),
    ("pool name upper case", pool(name="L20"), False),
    ("empty selector", pool(node_selector={}), False),
    ("log level lower case", {**pool(), "log_level": "debug"}, True),
    ("cluster name", {**pool(), "cluster_name": "prod-eu-1"}, True),
    ("cluster name upper case", {**pool(), "cluster_name": "Prod"}, False),
]


@pytest.mark.parametrize(
    ("config", "valid"), [(c, v) for _, c, v in AGREEMENT], ids=[n for n, _, _ in AGREEMENT]
)
def test_the_schema_and_the_loader_agree(
    config: dict[str, Any], valid: bool, tmp_path: Path
) -> None:
    assert loader_accepts(config, tmp_path) is valid
    assert schema_accepts(config) is valid


def test_the_schema_leaves_an_empty_pool_list_to_the_chart_s_template(tmp_path: Path) -> None:
    """Settings without a pool load (``check``, ``audit`` and ``reclaim`` need none). The
    schema binds ``helm lint`` too, which lints the chart's defaults (``pools: []``): it asks
    for the key, and the chart's template refuses an install naming no pool
    (tests/chart/test_chart.py), as the controller refuses to start without one."""
    assert loader_accepts({"pools": []}, tmp_path)
    assert schema_accepts({"pools": []})
    assert not schema_accepts({})
