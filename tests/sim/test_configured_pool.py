"""``rebalancer simulate --config F --pool P``: a configured pool simulated with its own settings.

Real runs of the command on two days of the bundled ServeGen ``m-mid`` trace (its day 0 starts
at 2025-01-06 00:00 in Asia/Shanghai), read back from ``summary.json``, the timelines and
``report.md``. What must hold: the pool's ``rps_per_node`` replaces the calibration, its limits,
lending window, zone, strategy with its parameters and slo are the ones the runs had, a flag
given changes only its own value, the report says where the size and the capacity came from,
and a pool that does not exist is one line naming the configured ones.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from rebalancer import cli
from rebalancer.core.model import Slo
from rebalancer.settings import PoolSettings
from sandbox.sim import configured

ROOT = Path(__file__).parents[2]
TRACE = ROOT / "examples" / "traces" / "servegen_m-mid.csv"
SHANGHAI = ZoneInfo("Asia/Shanghai")
CONFIG = """\
pools:
  - name: l20-chat
    node_selector: {gpu: l20}
    zone: Asia/Shanghai
    window: daily 22:00-08:00
    rps_per_node: 200
    strategy: {name: forecast, params: {safety: 0.3}}
    limits:
      min_serving: 3
      headroom: 0.3
      max_lent_fraction: 0.5
      reclaim_deadline: 3m
      warmup: 4m
      cooldown: 20m
    slo: {max_breach_minutes: 30}
  - name: t4-embed
    node_selector: {gpu: t4}
    rps_per_node: 150
    slo: none
"""


def head(rows: int, path: Path) -> Path:
    """The bundled trace's header and first ``rows`` rows (10 minutes each)."""
    path.write_text("\n".join(TRACE.read_text().splitlines()[: rows + 1]) + "\n")
    return path


@pytest.fixture(scope="module")
def two_days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return head(2 * 144, tmp_path_factory.mktemp("trace") / "mid-2d.csv")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("settings") / "config.yaml"
    path.write_text(CONFIG)
    return path


def simulate(*argv: str) -> int:
    return cli.main(["simulate", *argv])


def run(out: Path, *argv: str) -> Path:
    assert simulate(*argv, "--no-trade", "--quiet", "--out", str(out)) == 0
    return out


@pytest.fixture(scope="module")
def own(two_days: Path, config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pool simulated with its own settings."""
    out = tmp_path_factory.mktemp("own")
    return run(out, "--trace", str(two_days), "--config", str(config), "--pool", "l20-chat")


@pytest.fixture(scope="module")
def calibrated(two_days: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same trace with no settings: the simulator's generic pool."""
    return run(tmp_path_factory.mktemp("calibrated"), "--trace", str(two_days))


def summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text()))


def timeline(out: Path, name: str) -> list[tuple[datetime, int]]:
    """(time, lent) per minute of one run."""
    with (out / f"timeline-{name}.csv").open() as handle:
        return [
            (datetime.fromisoformat(row["time"]), int(row["lent"]))
            for row in csv.DictReader(handle)
        ]


def lent_outside(out: Path, name: str, zone: ZoneInfo, opens: int, closes: int) -> int:
    """Minutes of a run with a node lent outside a daily window ``opens:00-closes:00``."""
    return sum(
        1
        for when, lent in timeline(out, name)
        if lent and closes <= when.astimezone(zone).hour < opens
    )


def test_the_pool_is_simulated_with_its_own_capacity_not_one_calibrated_from_the_peak(
    own: Path, calibrated: Path
) -> None:
    mine, generic = summary(own)["pool"], summary(calibrated)["pool"]
    peak = summary(own)["trace"]["peak_rps"]
    assert (mine["rps_per_node"], mine["from"]["rps_per_node"]) == (200, "settings")
    assert mine["peak_share"] == round(peak / (200 * 16), 4)
    assert mine["peak_nodes"] == 14  # 2130.2 rps x 1.3 headroom / 200
    assert generic["rps_per_node"] == round(peak / (0.9 * 16), 6)
    assert (generic["peak_share"], generic["from"]["rps_per_node"]) == (0.9, "calibrated")


def test_the_pools_limits_zone_strategy_and_slo_are_the_runs(own: Path) -> None:
    found = summary(own)
    pool = found["pool"]
    assert (pool["name"], pool["size"], pool["from"]["size"]) == ("l20-chat", 16, "default")
    assert (pool["min_serving"], pool["headroom"]) == (3, 0.3)
    assert (pool["drain_seconds"], pool["warmup_seconds"]) == (180, 240)
    assert (pool["zone"], pool["window"]) == ("Asia/Shanghai", "daily 22:00-08:00")
    assert pool["limits"]["max_lent_fraction"] == 0.5
    assert pool["limits"]["cooldown_seconds"] == 20 * 60
    assert set(pool["from"].values()) == {"settings", "default"}
    assert set(found["strategies"]) == {"forecast", "static", "cron", "reactive", "oracle"}
    assert found["params"] == {"forecast": {"safety": 0.3}}
    assert found["slo"] == {"max_breach_minutes": 30, "window_days": 7}


def test_nothing_is_lent_outside_the_pools_window_in_its_zone(own: Path, calibrated: Path) -> None:
    for name in summary(own)["strategies"]:
        assert lent_outside(own, name, SHANGHAI, 22, 8) == 0, name
        if name != "static":  # lends nothing, ever
            assert any(lent for _, lent in timeline(own, name)), name
    # Without the settings the pool lends at any hour: the check above can tell.
    assert lent_outside(calibrated, "reactive", SHANGHAI, 22, 8) > 0


def test_the_strategy_lends_at_most_the_pools_max_lent_fraction(own: Path) -> None:
    assert max(lent for _, lent in timeline(own, "forecast")) <= 8  # half of 16
    # The oracle runs without that guard and lends more: the limit was what held forecast.
    assert max(lent for _, lent in timeline(own, "oracle")) > 8


def test_the_oracle_lends_within_the_window_too_so_it_stays_the_bound(own: Path) -> None:
    oracle = summary(own)["strategies"]["oracle"]
    assert oracle["lent_node_hours"] == oracle["oracle_node_hours"]
    assert oracle["harvest_ratio"] == 1.0


def test_the_report_says_where_the_size_and_the_capacity_came_from(
    own: Path, calibrated: Path
) -> None:
    mine = (own / "report.md").read_text()
    assert "Pool `l20-chat` of `" in mine
    assert (
        "16 nodes (the simulator's default: the settings select a pool's nodes but never count "
        "them; `--pool-size` sets it)"
    ) in mine
    assert "200.000 rps per node (its `rps_per_node`; the peak minute needs 67% of the pool)" in (
        mine
    )
    assert "lending window `daily 22:00-08:00`, time zone Asia/Shanghai" in mine
    assert 'strategy forecast {"safety": 0.3} (the pool\'s)' in mine
    assert "Error budget: 30m per 7d (the pool's settings)" in mine
    assert "The pool lends only to takers (`lend_only_to_takers`)" in mine
    generic = (calibrated / "report.md").read_text()
    assert "16 nodes (the simulator's default; `--pool-size` sets it)" in generic
    assert "calibrated so that the peak minute needs 90% of the pool" in generic
    assert "lends at any hour, time zone UTC" in generic


def test_flags_change_only_their_own_value_and_the_report_names_them(
    two_days: Path, config: Path, tmp_path: Path
) -> None:
    out = run(
        tmp_path,
        "--trace", str(two_days), "--config", str(config), "--pool", "l20-chat",
        "--pool-size", "20", "--headroom", "0.1", "--warmup", "5m", "--tz", "Europe/Berlin",
        "--gpus-per-node", "4",
    )  # fmt: skip
    pool = summary(out)["pool"]
    assert (pool["size"], pool["headroom"], pool["warmup_seconds"]) == (20, 0.1, 300)
    assert (pool["zone"], pool["gpus_per_node"]) == ("Europe/Berlin", 4)
    assert (pool["min_serving"], pool["rps_per_node"]) == (3, 200)  # still the settings'
    flagged = {name for name, origin in pool["from"].items() if origin == "flag"}
    assert flagged == {"size", "headroom", "warmup", "zone", "gpus_per_node"}
    # The window is the pool's, read in the zone the run has.
    berlin = ZoneInfo("Europe/Berlin")
    assert lent_outside(out, "forecast", berlin, 22, 8) == 0
    assert lent_outside(out, "forecast", SHANGHAI, 22, 8) > 0
    report = (out / "report.md").read_text()
    named = "`--gpus-per-node`, `--headroom`, `--pool-size`, `--tz`, `--warmup`"
    assert f"Given by flags instead of the settings: {named}." in report
    assert "20 nodes (`--pool-size`)" in report


def test_a_pool_without_a_budget_or_a_window_is_simulated_so(
    two_days: Path, config: Path, tmp_path: Path
) -> None:
    out = run(tmp_path, "--trace", str(two_days), "--config", str(config), "--pool", "t4-embed")
    found = summary(out)
    assert found["slo"] is None  # slo: none
    assert found["pool"]["from"]["slo"] == "settings"
    assert set(found["strategies"]) >= {"adaptive"}  # the default strategy, the pool's
    assert found["pool"]["from"]["strategy"] == "settings"
    assert (found["pool"]["window"], found["pool"]["zone"]) == ("always", "UTC")
    assert found["pool"]["rps_per_node"] == 150


def test_gpu_hours_are_tabled_per_night_in_the_pools_zone(own: Path) -> None:
    found = summary(own)
    nights = found["nights"]
    assert (nights["zone"], nights["gpus_per_node"]) == ("Asia/Shanghai", 8)
    rows = nights["rows"]
    # 00:00 on the 6th to 00:00 on the 8th, Shanghai time: half a night, a night, half a night.
    assert [r["evening"] for r in rows] == ["2025-01-05", "2025-01-06", "2025-01-07"]
    assert [r["covered_minutes"] for r in rows] == [720, 1440, 720]
    assert rows[1]["start"] == "2025-01-06T04:00:00Z"  # 12:00 in Shanghai
    for name, figures in found["strategies"].items():
        total = sum(r["gpu_hours"][name] for r in rows)
        assert total == pytest.approx(figures["lent_node_hours"] * 8, abs=0.01), name
    assert rows[1]["gpu_hours"]["forecast"] > 0
    report = (own / "report.md").read_text()
    assert "## GPU-hours lent per night" in report
    assert "Each night runs from 12:00 to 12:00 in Asia/Shanghai" in report
    assert "| night | hours | forecast | static | cron | reactive | oracle |" in report
    monday = rows[1]["gpu_hours"]["forecast"]
    assert f"| Mon 2025-01-06 | 24.0 | {monday:.1f} | 0.0 |" in report


def test_the_report_explains_each_figure_in_a_sentence(
    config: Path, tmp_path: Path, own: Path
) -> None:
    short = head(72, tmp_path / "mid-12h.csv")  # half a day: the trade's 25 more runs are quick
    out = tmp_path / "out"
    argv = ["--trace", str(short), "--config", str(config), "--pool", "l20-chat"]
    assert simulate(*argv, "--quiet", "--out", str(out)) == 0
    report = (out / "report.md").read_text()
    assert summary(out)["trade"]["curve"]  # the pool's slo: the trade curve ran
    for figure in (
        "harvest",
        "breach min",
        "headroom min",
        "reclaims",
        "loans, short loans",
        "dominated",
        "trade curve",
    ):
        [line] = [x for x in report.splitlines() if x.startswith(f"- **{figure}**: ")]
        assert line.endswith("."), line
        assert ". " not in line, line  # one sentence
    plain = (own / "report.md").read_text()  # --no-trade: nothing dominates, no curve
    assert "- **harvest**: " in plain
    assert "- **dominated**" not in plain
    assert "- **trade curve**" not in plain


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert simulate(*argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_pool_that_does_not_exist_is_one_line_naming_the_configured_ones(
    two_days: Path, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(
        capsys,
        "--trace", str(two_days), "--config", str(config), "--pool", "chat",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert line == "rebalancer: --pool=chat: no configured pool has that name (l20-chat, t4-embed)"
    assert not (tmp_path / "summary.json").exists()


def test_settings_without_a_pool_named_are_refused(
    two_days: Path, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(capsys, "--trace", str(two_days), "--config", str(config), "--out", "x")
    assert line == f"rebalancer: --config={config}: name the pool to simulate with --pool"


def test_more_nodes_always_serving_than_the_pool_simulated_is_refused(
    two_days: Path, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(
        capsys,
        "--trace", str(two_days), "--config", str(config), "--pool", "l20-chat",
        "--pool-size", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert line == (
        "rebalancer: pool l20-chat: limits.min_serving=3: more nodes always serving than the 2 "
        "simulated (--pool-size); give --pool-size"
    )


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("8", "**The trace's peak (2130.22 rps) needs 11 nodes and the pool has 8**: every run "
         "breaches at the peak."),
        ("13", "The trace's peak (2130.22 rps) needs 14 nodes with its headroom and the pool has "
         "13: there, even with nothing lent, every run has headroom minutes (not breach "
         "minutes)."),
    ],
)  # fmt: skip
def test_a_pool_too_small_for_the_traces_peak_is_said_to_be(
    two_days: Path, config: Path, tmp_path: Path, size: str, said: str
) -> None:
    argv = ["--trace", str(two_days), "--config", str(config), "--pool", "l20-chat"]
    out = run(tmp_path, *argv, "--pool-size", size, "--strategy", "static")
    assert said in (out / "report.md").read_text()
    static = summary(out)["strategies"]["static"]  # lends nothing: what the pool alone does
    assert (static["breach_minutes"] > 0) == (size == "8")
    assert static["headroom_minutes"] > 0


def test_a_pool_sized_in_tokens_is_not_replayed_from_a_trace_of_requests(
    two_days: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "pools:\n"
        "  - name: chat\n"
        "    node_selector: {gpu: l20}\n"
        "    capacity: {unit: tokens_per_second, per_node: 2400}\n"
    )
    line = refusal(
        capsys,
        "--trace", str(two_days), "--config", str(config), "--pool", "chat",
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert line == (
        "rebalancer: --pool=chat: its capacity is in tokens_per_second and --trace replays "
        "requests per second; replay its own history with --prometheus, or give a pool sized "
        "in requests_per_second"
    )


@pytest.mark.parametrize(
    ("slo", "given", "minutes", "origin"),
    [
        ({}, configured.Given(), "default", configured.Origin.DEFAULT),
        ({"slo": None}, configured.Given(), "default", configured.Origin.DEFAULT),  # as if left out
        ({"slo": {"availability": 0.999}}, configured.Given(), 10, configured.Origin.SETTINGS),
        ({"slo": {"max_breach_minutes": 30}}, configured.Given(), 30, configured.Origin.SETTINGS),
        ({"slo": "none"}, configured.Given(), None, configured.Origin.SETTINGS),
        ({}, configured.Given(slo_off=True), None, configured.Origin.FLAG),
        ({"slo": "none"}, configured.Given(slo=Slo(5)), 5, configured.Origin.FLAG),
    ],
)
def test_the_budget_is_the_flag_s_else_the_pool_s_else_the_one_every_pool_has(
    slo: dict[str, Any], given: configured.Given, minutes: int | str | None, origin: str
) -> None:
    """A pool whose settings leave ``slo`` out has the controller's default budget, in the
    simulation as in the controller; the simulator reads it from the settings' own field."""
    pool = PoolSettings.model_validate(
        {"name": "p", "node_selector": {"gpu": "l20"}, "rps_per_node": 100, **slo}
    )
    modelled = configured.model_of(given, pool)
    if minutes == "default":
        assert pool.slo is not None
        assert modelled.slo == pool.slo.slo()
    else:
        assert (None if modelled.slo is None else modelled.slo.max_breach_minutes) == minutes
    assert modelled.provenance.origins["slo"] == origin
    every_pool_s = PoolSettings.model_validate(
        {"name": "q", "node_selector": {"gpu": "l20"}, "rps_per_node": 100}
    ).slo
    assert every_pool_s is not None
    assert configured.model_of(configured.Given()).slo == every_pool_s.slo()
