"""The servers' presets and the capacity measurement against a real Prometheus.

The series (``tests/support/serving_series.py``): nodes whose capacity is known (12 requests a
second, 200 tokens each, 4 s each: 2,400 tokens a second and 48 sequences when full), under a
load that fills them for about 43 minutes, written in the metric names of vLLM, SGLang, TGI and
Triton. Each preset's demand query, in each unit it has, must read the load the model put
there, and ``rebalancer capacity`` must find the capacity the model gave, from the minutes the
model says the node was full and no others.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rebalancer import cli, settings
from rebalancer.adapters import metrics, presets
from rebalancer.commands import capacity
from rebalancer.core.model import NodeName, PoolName, Unit
from rebalancer.runtime import adapterconfig
from tests.support import prometheus
from tests.support.serving_series import (
    BASE,
    MINUTES,
    NODES,
    SECONDS,
    TOKENS,
    Node,
    at,
    openmetrics,
)

RPS, TOKENS_S, SEQUENCES = (
    Unit.REQUESTS_PER_SECOND,
    Unit.TOKENS_PER_SECOND,
    Unit.CONCURRENT_SEQUENCES,
)
FULL = {RPS: 12.0, TOKENS_S: 12.0 * TOKENS, SEQUENCES: 12.0 * SECONDS}  # one node, when full
BY_POOL = {n.pool: n for n in NODES if n.pool != "mixed"}
CALM_SCRAPE = 25 * 60 - 7  # a scrape in minute 24, the load at 6 a second since minute 0
SPAN = capacity.Span(BASE, BASE + (MINUTES - 1) * (at(60) - at(0)), at(60) - at(0))


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus-servers")
    store, _ = prometheus.backfill(workdir, openmetrics())
    with prometheus.serving(workdir, store) as (address, _proc, _cmd):
        yield address


def pool(
    name: str, unit: Unit, engine: str | None = None, per_node: float = 10
) -> settings.PoolSettings:
    engine = engine or BY_POOL[name].engine
    return settings.PoolSettings.model_validate(
        {
            "name": name,
            "node_selector": {"pool": name},
            "capacity": {"unit": unit, "per_node": per_node},
            "metrics": {"preset": engine},
        }
    )


def config(url: str, *pools: settings.PoolSettings) -> settings.Settings:
    return settings.Settings.model_validate(
        {"prometheus": {"url": url}, "pools": [p.model_dump() for p in pools]}
    )


CASES = [
    (engine, unit)
    for engine in presets.Engine
    for unit in Unit
    if unit in presets.preset(engine).readings
]


def test_every_preset_reads_every_unit_but_triton_tokens() -> None:
    assert len(CASES) == 11
    assert (presets.Engine.TRITON, TOKENS_S) not in CASES


@pytest.mark.parametrize(("engine", "unit"), CASES)
async def test_each_preset_reads_demand_in_its_unit_as_the_server_served_it(
    url: str, engine: presets.Engine, unit: Unit
) -> None:
    p = pool(engine.value, unit)
    node = BY_POOL[engine.value]
    m = metrics.Metrics(adapterconfig.metrics_settings(config(url, p), p))
    try:
        got = await m.read(PoolName(p.name), [NodeName(node.name)], now=at(CALM_SCRAPE + 7))
    finally:
        m.close()
    assert got.errors == ()
    assert got.demand is not None
    assert got.demand.at == at(CALM_SCRAPE)
    # 6 requests a second: 1,200 tokens a second, 24 in flight and none waiting.
    assert got.demand.value == pytest.approx(6 * FULL[unit] / 12, rel=1e-9)
    assert got.queue is not None
    assert got.queue.value == 0


@pytest.mark.parametrize(("engine", "unit"), CASES)
async def test_each_preset_s_history_is_the_demand_of_each_bucket_in_its_unit(
    url: str, engine: presets.Engine, unit: Unit
) -> None:
    p = pool(engine.value, unit)
    node = BY_POOL[engine.value]
    step = at(300) - at(0)
    m = metrics.Metrics(adapterconfig.metrics_settings(config(url, p), p))
    try:
        # Minutes 5 to 25: the calm 6 a second before the surge, in 5-minute buckets.
        got = await m.history(PoolName(p.name), [NodeName(node.name)], at(300), at(1500), step)
    finally:
        m.close()
    assert got.error is None
    assert list(got.history.values) == [pytest.approx(6 * FULL[unit] / 12, rel=1e-9)] * 4


@pytest.mark.parametrize("engine", list(presets.Engine))
async def test_each_preset_reads_the_queue_and_what_runs_while_the_node_is_full(
    url: str, engine: presets.Engine
) -> None:
    p = pool(engine.value, RPS)
    node = BY_POOL[engine.value]
    scrape = 50 * 60 + 8
    m = metrics.Metrics(adapterconfig.metrics_settings(config(url, p), p))
    try:
        got = await m.read(PoolName(p.name), [NodeName(node.name)], now=at(scrape + 7))
    finally:
        m.close()
    assert got.errors == ()
    assert got.queue is not None
    assert got.queue.value == node.waiting(scrape) > 0
    assert got.demand is not None
    assert got.demand.value == pytest.approx(12, rel=1e-9)  # served: a full node's rate
    if engine is presets.Engine.TRITON:
        assert got.running is None  # Triton has no gauge of what runs
    else:
        assert got.running is not None
        assert got.running.value == node.running(scrape) == 48


@pytest.mark.parametrize(("engine", "unit"), CASES)
async def test_the_capacity_measured_is_the_one_the_node_has_from_the_minutes_it_was_full(
    url: str, engine: presets.Engine, unit: Unit
) -> None:
    p = pool(engine.value, unit)
    node = BY_POOL[engine.value]
    found = await capacity.measure(config(url, p), p, SPAN)
    (figure,) = found.nodes
    assert figure.node == node.name
    # Exactly the minutes the model had requests waiting all through, and nothing else.
    assert found.full == figure.full == len(node.full_steps())
    assert 40 <= found.full <= 45
    assert found.per_node == pytest.approx(FULL[unit], rel=1e-9)
    # Every full minute served the node's capacity: not one calm minute was counted.
    low = await capacity.measure(config(url, p), p, SPAN, quantile=0.0)
    assert low.per_node == pytest.approx(FULL[unit], rel=1e-9)
    assert found.lower_bound is None


async def test_a_pool_never_full_gives_only_a_lower_bound(url: str) -> None:
    p = pool("calm", RPS)
    found = await capacity.measure(config(url, p), p, SPAN)
    assert found.per_node is None
    assert found.full == 0
    assert found.lower_bound == pytest.approx(7, rel=1e-9)  # the busiest minute's rate
    (first, *_) = found.limits()
    assert first.startswith("no node was full in any step")
    assert "only a lower bound" in first


async def test_nodes_of_different_capacity_in_one_pool_are_pointed_out(url: str) -> None:
    p = pool("mixed", RPS, engine="vllm")
    nodes = [NodeName("gpu-mixed-a"), NodeName("gpu-mixed-b")]
    found = await capacity.measure(config(url, p), p, SPAN, nodes=nodes)
    by_node = {n.node: n.per_node for n in found.nodes}
    assert by_node == {
        "gpu-mixed-a": pytest.approx(12, rel=1e-9),
        "gpu-mixed-b": pytest.approx(8, rel=1e-9),
    }
    assert found.spread is not None
    assert any(
        line.startswith("the nodes differ: gpu-mixed-a serves 12") for line in found.limits()
    )
    assert found.suggested == pytest.approx(8, rel=1e-9)  # the weakest node's, to write


def test_the_command_prints_the_figure_to_write_and_exits_0(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, url, pool("vllm", TOKENS_S, per_node=2000))
    code = cli.main([*command(path, "vllm"), "-o", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["per_node"] == pytest.approx(2400, rel=1e-9)
    assert out["unit"] == "tokens_per_second"
    assert out["configured"] == {"unit": "tokens_per_second", "per_node": 2000}
    assert out["full_steps"] == len(BY_POOL["vllm"].full_steps())
    # The nodes were found by the pool's labels in kube_node_labels.
    assert [n["node"] for n in out["nodes"]] == ["gpu-vllm"]
    assert cli.main(command(path, "vllm")) == 0
    text = capsys.readouterr().out
    assert "capacity per node: 2400 tokens/s (the 0.9 quantile of" in text
    assert "write: capacity: {unit: tokens_per_second, per_node: 2400}" in text
    # -o yaml is the same document; --json, as every command keeps it, is -o json.
    assert cli.main([*command(path, "vllm"), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == out
    assert cli.main([*command(path, "vllm"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == out


def test_the_command_says_a_lower_bound_and_exits_1_when_no_node_was_full(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, url, pool("calm", RPS))
    assert cli.main(command(path, "calm")) == 1
    text = capsys.readouterr().out
    assert "capacity per node: at least 7 rps: no node was full, a lower bound only" in text


def test_a_pool_the_command_does_not_know_is_one_line_exit_2(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, url, pool("calm", RPS))
    assert cli.main(command(path, "chat")) == 2
    assert capsys.readouterr().err == (
        "rebalancer: --pool=chat: no configured pool has that name (calm)\n"
    )


def write_config(tmp_path: Path, url: str, p: settings.PoolSettings) -> Path:
    doc = {
        "prometheus": {"url": url},
        "pools": [
            {
                "name": p.name,
                "node_selector": dict(p.node_selector),
                "capacity": {"unit": p.unit.value, "per_node": p.per_node},
                "metrics": {"preset": p.metrics.preset.value},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def command(path: Path, name: str) -> list[str]:
    until = SPAN.end.isoformat().replace("+00:00", "Z")
    since = SPAN.start.isoformat().replace("+00:00", "Z")
    return ["capacity", "--config", str(path), "--pool", name, "--since", since, "--until", until]


def test_the_model_fills_the_node_for_the_minutes_the_tests_count_on() -> None:
    """The series' own arithmetic, so that a change to it shows here and not as a puzzle."""
    node: Node = BY_POOL["vllm"]
    steps = node.full_steps()
    assert steps == list(range(steps[0], steps[0] + len(steps)))  # one unbroken stretch
    assert steps[0] == 30  # the first minute of the surge: a queue from its first second
    assert node.waiting(CALM_SCRAPE) == 0
    assert node.running(CALM_SCRAPE) == 6 * SECONDS
