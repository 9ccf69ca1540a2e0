"""A team's own strategy, found as the built-ins are: through the ``rebalancer.strategies`` entry
points. Nothing is installed: each test writes a distribution's metadata (a ``.dist-info``
directory) and its module into a temporary directory and puts that on ``sys.path``, which is
all importlib needs to see an installed distribution."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from rebalancer import settings
from rebalancer.adapters import registry
from strategies import adaptive

MODULE = """
from typing import ClassVar

from rebalancer.core import model, strategy


class Params(strategy.Params):
    keep: int = 1


class Surge:
    name: ClassVar[str] = "surge"
    reads_history: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def decide(self, pool: model.PoolView) -> model.Proposal:
        raise NotImplementedError


PLUGIN = strategy.Plugin(Params, Surge, "keep a fixed number of nodes")
NOT_A_PLUGIN = Surge
"""

Install = Callable[[Mapping[str, str]], str]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install({name: "MODULE:ATTR"})``: a distribution ``acme-strategies`` whose module
    (named after the test, so that no test sees another's import) declares those entry
    points; answers the module's name."""
    module = "acme_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)

    def install(points: Mapping[str, str]) -> str:
        (tmp_path / f"{module}.py").write_text(MODULE, encoding="utf-8")
        info = tmp_path / "acme_strategies-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: acme-strategies\nVersion: 1.0\n", encoding="utf-8"
        )
        lines = [f"{name} = {target.replace('MODULE', module)}" for name, target in points.items()]
        (info / "entry_points.txt").write_text(
            "[rebalancer.strategies]\n" + "\n".join(lines) + "\n", encoding="utf-8"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        return module

    yield install
    sys.modules.pop(module, None)


def load_pool(tmp_path: Path, strategy: object) -> settings.Settings:
    pool = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 10}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"pools": [{**pool, "strategy": strategy}]}), encoding="utf-8")
    return settings.load(path, {})


def test_a_third_party_strategy_is_found_and_imported_only_when_built(
    install: Install, tmp_path: Path
) -> None:
    module = install({"surge": "MODULE:PLUGIN"})
    assert "surge" in registry.names()
    assert {"adaptive", "forecast", "static"} <= set(registry.names())
    assert "surge" not in registry.built_in()
    assert module not in sys.modules  # listed, not imported

    loaded = load_pool(tmp_path, {"name": "surge", "params": {"keep": 3}})
    assert module in sys.modules
    built = loaded.pools[0].build_strategy()
    assert (type(built).__name__, built.name) == ("Surge", "surge")
    assert registry.params_type("surge").model_validate({"keep": 3}) == vars(built)["params"]


def test_a_third_party_strategys_parameters_are_validated_like_a_built_ins(
    install: Install,
) -> None:
    install({"surge": "MODULE:PLUGIN"})
    with pytest.raises(registry.ParameterError) as caught:
        registry.build("surge", {"keep": "many", "kept": 1})
    assert caught.value.problems == [
        "keep='many': Input should be a valid integer, unable to parse string as an integer",
        "kept=1: Extra inputs are not permitted",
    ]


def test_a_plugin_that_does_not_import_is_one_line_of_the_settings_error(
    install: Install, tmp_path: Path
) -> None:
    install({"broken": "acme_not_there:PLUGIN"})
    with pytest.raises(settings.InvalidSettings) as caught:
        load_pool(tmp_path, "broken")
    assert caught.value.lines == [
        "pools[0].strategy.name='broken': entry point broken = 'acme_not_there:PLUGIN' of "
        "acme-strategies does not load: ModuleNotFoundError: No module named 'acme_not_there'"
    ]


def test_an_entry_point_that_names_no_plugin_is_one_line_naming_it(install: Install) -> None:
    module = install({"odd": "MODULE:NOT_A_PLUGIN"})
    with pytest.raises(registry.ParameterError) as caught:
        registry.build("odd")
    assert str(caught.value) == (
        f"strategy 'odd': entry point odd = '{module}:NOT_A_PLUGIN' of acme-strategies "
        "is a type, not a rebalancer.core.strategy.Plugin"
    )


def test_a_built_in_name_cannot_be_taken_by_a_plugin(
    install: Install, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        install({"adaptive": "MODULE:PLUGIN"})
        built = registry.build("adaptive")
    assert isinstance(built, adaptive.Adaptive)
    assert [r.getMessage() for r in caplog.records] == [
        "strategy 'adaptive' of acme-strategies is not used: built-in strategies cannot be replaced"
    ]
    with pytest.raises(ValueError, match="'adaptive' is a built-in strategy"):
        registry.register("adaptive", adaptive.Params, adaptive.Adaptive)


def test_the_built_ins_are_the_projects_own_entry_points() -> None:
    assert registry.built_in() == [
        "adaptive", "cron", "forecast", "peak", "reactive", "static", "watermark", "window",
    ]  # fmt: skip
    assert registry.DEFAULT in registry.built_in()


def test_listing_strategies_imports_none_and_building_one_imports_only_its_module() -> None:
    script = (
        "import sys\n"
        "from rebalancer.adapters import registry\n"
        "registry.names()\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'strategies'], sys.modules\n"
        "registry.build('peak')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'strategies'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["['strategies',", "'strategies.peak']"]
