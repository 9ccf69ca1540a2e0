"""``rebalancer check``: offline on settings files, online against the API emulator over HTTP and
a real Prometheus scraping a vLLM-shaped exporter.

Offline, each broken file of ``BROKEN`` is refused (exit 1) with one line naming the field, and
the example settings pass (exit 0). Online, the check reads and never writes (the emulator's
request log holds no write) and says per pool what the cluster and Prometheus make of it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from rebalancer import cli
from sandbox.emulator import cluster
from sandbox.emulator.server import Request
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import run_cli, setup
from tests.support.prometheus import scraping
from tests.support.waits import until

ROOT = Path(__file__).resolve().parents[1]
POOL = """
  - name: l20
    node_selector: {gpu: l20}
    rps_per_node: 4
"""

# (what is wrong, the file's text, what the failing line starts with)
BROKEN: list[tuple[str, str, str]] = [
    ("no pool", "pools: []\n", "fail pools: none"),
    ("misspelt pool key", POOL + "    windw: always\n", "fail pools[0].windw: "),
    ("misspelt limit", POOL + "    limits: {queue_limt: 5}\n", "fail pools[0].limits.queue_limt"),
    ("bad window", POOL + "    window: Mon-Fry 22:00-06:00\n", "fail pools[0].window: "),
    ("bad zone", POOL + "    zone: Mars/Olympus\n", "fail pools[0].zone: "),
    ("bad duration", POOL + "    limits: {warmup: 5d}\n", "fail pools[0].limits.warmup: "),
    ("unknown strategy", POOL + "    strategy: guess\n", "fail pools[0].strategy"),
    (
        "unbalanced PromQL",
        POOL + '    metrics: {queue: {value: "sum(x{node=~\\"$nodes\\"}", sampled: "up"}}\n',
        "fail pools[0].metrics.queue.value: not PromQL: unclosed left parenthesis",
    ),
    (
        "PromQL that is not an expression",
        POOL + '    metrics: {history: "rate(x[$window]) by (pod)"}\n',
        "fail pools[0].metrics.history: not PromQL: ",
    ),
    ("prometheus not a URL", "prometheus: {url: prom:9090}\npools:" + POOL, "fail prometheus.url"),
]


@pytest.mark.parametrize(
    ("text", "says"), [(t, s) for _, t, s in BROKEN], ids=[n for n, _, _ in BROKEN]
)
def test_a_broken_file_is_one_line_naming_the_field_and_exit_1(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text if text.startswith(("pools:", "prometheus")) else "pools:" + text)
    assert cli.main(["check", "--config", str(path)]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith(says) for line in out.splitlines()), out


def test_the_example_settings_pass(capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "examples" / "config.yaml"
    assert cli.main(["check", "--config", str(example)]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [p["name"] for p in yaml.safe_load(example.read_text())["pools"]]
    assert lines == [f"ok   pools[{i}]: {n}: every query parses" for i, n in enumerate(names)]


def test_json_and_yaml_say_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("pools:" + POOL + "    window: Mon-Fry 22:00-06:00\n")
    assert cli.main(["check", "--config", str(path), "-o", "json"]) == 1
    as_json = json.loads(capsys.readouterr().out)
    assert cli.main(["check", "--config", str(path), "-o", "yaml"]) == 1
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    assert as_json["ok"] is False
    (finding,) = as_json["findings"]
    assert finding["level"] == "fail"
    assert finding["field"] == "pools[0].window"


async def test_online_says_what_the_cluster_and_prometheus_make_of_each_pool(
    tmp_path: Path,
) -> None:
    seen: list[Request] = []
    exporter = Exporter(
        pods={"serving/llm-0": "inference-0", "serving/llm-1": "inference-1"}, rps=150, waiting=2
    )
    async with (
        serve_exporter(exporter) as target,
        scraping(tmp_path / "prometheus", target) as prom,
        setup(tmp_path, on_request=seen.append) as box,
    ):
        config = yaml.safe_load(box.config.read_text())
        # A 1 s grid for the last sample: the series are seconds old (as in test_end_to_end).
        config["prometheus"] = {"url": prom, "lookback": "1m", "resolution": "1s"}
        missing = {"name": "missing", "node_selector": {"gpu-pool": "none"}, "rps_per_node": 1}
        config["pools"].append(missing)
        box.config.write_text(yaml.safe_dump(config))

        async def scraped() -> bool:
            return exporter.scrapes >= 4

        await until("Prometheus scrapes the exporter", scraped, None, within=30)
        seen.clear()

        args = ("--online", "--config", str(box.config), "--kubeconfig", str(box.kubeconfig))
        code, out, err = await run_cli("check", *args, within=60)
        assert code == 1, err  # the pool that selects nothing
        lines = out.splitlines()
        assert "ok   pools[0]: inference: every query parses" in lines
        assert (
            "ok   pools[0].node_selector: inference: 8 nodes, 8 serving, 0 lent or in flight"
        ) in lines
        # No pending pod tolerates the lent taint: the default pool lends only to takers.
        assert any(
            line.startswith("warn pools[0].lent_taints: inference: no pending pod tolerates ")
            for line in lines
        ), out
        demand = [line for line in lines if line.startswith("ok   pools[0].metrics: ")]
        assert len(demand) == 1, out
        assert " rps at " in demand[0]
        assert "queue 2" in demand[0]
        assert any(line.startswith("ok   pools[0]: inference: first tick: ") for line in lines)
        assert "fail pools[1].node_selector: missing: gpu-pool=none selects no node" in lines
        assert not any(line.startswith("fail pools[0].metrics.history") for line in lines), out
        assert all(r.method == "GET" for r in seen), [r for r in seen if r.method != "GET"]

        # A training job waiting for lent nodes is a taker; Prometheus gone is a failed query.
        cluster.add(box.store, cluster.training_pod("pretrain", 0))
        del config["pools"][1]
        config["prometheus"] = {"url": box.url.replace("http", "http", 1) + "/nothing-here"}
        box.config.write_text(yaml.safe_dump(config))
        code, out, _ = await run_cli("check", *args, within=60)
        assert code == 1
        lines = out.splitlines()
        assert any(
            line.startswith("ok   pools[0].lent_taints: inference: pending pods tolerate ")
            and "training/pretrain-0" in line
            for line in lines
        ), out
        assert any(line.startswith("fail pools[0].metrics.demand: ") for line in lines), out
        assert any(line.startswith("fail pools[0].metrics.history: ") for line in lines), out


def test_online_is_not_tried_when_the_file_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        textwrap.dedent("""
        prometheus: {url: "http://127.0.0.1:1"}
        pools: []
        """)
    )
    # No kubeconfig exists: were the cluster asked, the command would stop on that instead.
    args = ["check", "--online", "--config", str(path), "--kubeconfig", str(tmp_path / "none")]
    assert cli.main(args) == 1
    assert capsys.readouterr().out.startswith("fail pools: none")


def test_a_reader_that_goes_away_is_no_error(tmp_path: Path) -> None:
    """``rebalancer check ... | head -1``: the pipe closes early; no traceback, exit 0."""
    import subprocess
    import sys

    example = ROOT / "examples" / "config.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rebalancer", "check", "--config", str(example), "-o", "yaml"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # before the command writes a byte
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err
