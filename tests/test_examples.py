"""The examples are one set: the controller's settings (examples/config.yaml, and the same pools
in examples/helm-values.yaml) select the nodes by the labels examples/pools.yaml writes on them,
and serve them with the taints it sets.

Each file is read by the loader that reads it in use: the settings by ``settings.load``, the
pools file by ``rebalancer pools apply``'s own (``commands.pools.load``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rebalancer import settings
from rebalancer.commands import pools
from rebalancer.core.nodepools import NodePool
from tests.support.processes import ROOT

EXAMPLES = ROOT / "examples"


def settings_of(name: str, tmp_path: Path) -> settings.Settings:
    """The settings an example gives the controller: config.yaml as it is, helm-values.yaml's
    ``config`` as the chart mounts it."""
    if name == "config.yaml":
        return settings.load(EXAMPLES / name, {})
    values = yaml.safe_load((EXAMPLES / name).read_text())
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(values["config"]))
    return settings.load(path, {})


def selected(pool: settings.PoolSettings, layout: tuple[NodePool, ...]) -> list[NodePool]:
    """The node pools whose written labels carry every label ``pool`` selects on."""
    return [p for p in layout if all(p.labels.get(k) == v for k, v in pool.node_selector.items())]


@pytest.mark.parametrize("name", ["config.yaml", "helm-values.yaml"])
def test_every_pool_of_the_settings_selects_labels_the_pools_file_writes(
    name: str, tmp_path: Path
) -> None:
    config = settings_of(name, tmp_path)
    layout = pools.load(EXAMPLES / "pools.yaml", config.keys()).pools
    assert config.pools
    for pool in config.pools:
        written = selected(pool, layout)
        assert len(written) == 1, f"{name}: pool {pool.name}: selected by {written}"
        # It serves with the taints the pools file sets, which lending takes off.
        assert {t.taint() for t in pool.serving_taints} == set(written[0].taints), pool.name


def test_the_chart_s_example_values_have_the_settings_example_s_pools(tmp_path: Path) -> None:
    chart = settings_of("helm-values.yaml", tmp_path).pools
    example = settings_of("config.yaml", tmp_path).pools
    assert [(p.name, p.node_selector) for p in chart] == [
        (p.name, p.node_selector) for p in example
    ]
