"""``rebalancer simulate`` end to end: the files it writes, and one clear line per bad input;
the harness commands the ``rebalancer`` command finds through its entry points; and
``rebalancer audit --cluster`` on a store a fleet shares."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from rebalancer import cli
from rebalancer.adapters import registry

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """Two days of a simple day/night shape at 10-minute spacing."""
    lines = ["time,rps"]
    for step in range(2 * 144):
        hour = step * 10 // 60 % 24
        rps = 100 if 8 <= hour < 20 else 20
        lines.append(f"2025-01-0{1 + step // 144}T{hour:02d}:{step * 10 % 60:02d}:00Z,{rps}")
    path = tmp_path / "daynight.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_simulate_writes_summary_timelines_and_report_for_every_run(
    small_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code = cli.main(
        [
            "simulate",
            "--trace",
            str(small_trace),
            "--strategy",
            "forecast",
            "--strategy",
            "watermark",
            "--tz",
            "Europe/Berlin",
            "--slo",
            "none",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    runs = {"forecast", "watermark", "static", "cron", "reactive", "oracle"}
    assert set(summary["strategies"]) == runs
    for figures in summary["strategies"].values():
        assert set(figures) >= {
            "lent_node_hours",
            "oracle_node_hours",
            "harvest_ratio",
            "breach_minutes",
            "headroom_minutes",
            "reclaims",
            "loans",
            "short_loans",
        }
    assert summary["strategies"]["oracle"]["harvest_ratio"] == 1.0
    assert summary["pool"]["zone"] == "Europe/Berlin"
    assert summary["trace"]["minutes"] == 2 * 24 * 60
    for name in runs:
        with (out / f"timeline-{name}.csv").open() as handle:
            rows = list(csv.reader(handle))
        assert rows[0] == ["time", "demand_rps", "need", "serving", "lent", "returning", "queue"]
        assert len(rows) == 1 + 2 * 24 * 60
    assert "| forecast |" in (out / "report.md").read_text()
    check_drawn(out / "report.svg", summary, runs, grid=4 * 5)
    trade = summary["trade"]
    assert (trade["rule"], trade["measure"]) == ("peak", "breach_minutes")
    assert len(trade["grid"]) == 4 * 5
    grid = [(p["harvest_ratio"], p["breach_minutes"], p["frontier"]) for p in trade["grid"]]

    def dominated(h: float, b: int) -> bool:
        return any(beats(h2, b2, h, b) for h2, b2, _ in grid)

    assert [edge for _, _, edge in grid] == [not dominated(h, b) for h, b, _ in grid]
    assert set(trade["dominated_by"]) == {"forecast", "watermark"}  # the guarded runs
    for name, labels in trade["dominated_by"].items():
        f = summary["strategies"][name]
        beaten = [p["label"] for p in trade["grid"] if dominated_by(p, f)]
        assert sorted(labels) == sorted(beaten)
    assert "## The trade" in (out / "report.md").read_text()
    # No budget, no trade curve: the default runs once.
    assert (trade["budget"], trade["curve"]) == (None, None)
    assert "### The trade curve" not in (out / "report.md").read_text()
    assert not (out / "trade_curve.svg").exists()


def check_drawn(path: Path, summary: dict[str, Any], runs: set[str], grid: int) -> None:
    """report.svg: a timeline per run, titled with its figures, under the trade's grid."""
    drawn = ET.parse(path).getroot()
    titles = [t.text or "" for t in drawn.iter(f"{SVG}text") if t.get("font-weight") == "bold"]
    for name in runs:
        f = summary["strategies"][name]
        assert any(
            t.startswith(name) and f"harvest {f['harvest_ratio']:.3f}" in t for t in titles
        ), (name, titles)
    marks = [m for m in drawn.iter(f"{SVG}circle") if m.get("data-series") == "peak grid"]
    assert len(marks) == grid


def dominated_by(point: dict[str, float], figures: dict[str, float]) -> bool:
    h, b = point["harvest_ratio"], point["breach_minutes"]
    mine, breach = figures["harvest_ratio"], figures["breach_minutes"]
    return beats(h, b, mine, breach)


def beats(harvest: float, breach: float, their_harvest: float, their_breach: float) -> bool:
    """The rule of docs/design/robustness.md: 0.01 more harvest and no more breach minutes, or
    the same harvest (within 0.01) and fewer."""
    lead = round(harvest - their_harvest, 9)
    return (lead >= 0.01 and breach <= their_breach) or (lead > -0.01 and breach < their_breach)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--pool-size", "0"], "--pool-size=0: must be at least 1", id="pool-size"),
        pytest.param(["--tz", "Mars/Base"], "--tz='Mars/Base': not an IANA", id="zone"),
        pytest.param(
            ["--strategy", "forecast", "--params", "forecast={"],
            "--params 'forecast={': not JSON",
            id="json",
        ),
        pytest.param(
            ["--strategy", "forecast", "--params", 'forecast={"safety": -1}'],
            "strategy 'forecast': safety=-1: Input should be greater than or equal to 0",
            id="param-range",
        ),
        pytest.param(
            ["--strategy", "forecast", "--params", 'forecast={"saftey": 1}'],
            "strategy 'forecast': saftey=1: Extra inputs are not permitted",
            id="param-typo",
        ),
        pytest.param(
            ["--params", 'forecast={"safety": 0.3}'],
            "--params 'forecast={\"safety\": 0.3}': forecast is not run (adaptive); "
            "add --strategy forecast",
            id="params-of-a-strategy-not-run",
        ),
    ],
)
def test_simulate_refuses_bad_input_with_one_line_and_exit_status_two(
    small_trace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    code = cli.main(["simulate", "--trace", str(small_trace), "--out", str(tmp_path), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_simulate_names_the_file_and_line_of_a_bad_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,rps\n2025-01-01T00:00:00Z,fast\n")
    assert cli.main(["simulate", "--trace", str(bad), "--out", str(tmp_path)]) == 2
    assert f"{bad}: line 2: rps='fast' is not a number >= 0" in capsys.readouterr().err


def test_sandbox_options_reach_the_sandbox_own_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["sandbox", "--help"])
    assert caught.value.code == 0
    assert "usage: rebalancer sandbox" in capsys.readouterr().out


def test_demo_options_reach_the_demo_own_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["demo", "--help"])
    assert caught.value.code == 0
    assert "usage: rebalancer demo" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# The harnesses' commands arrive through entry points: the product never imports them


def test_the_harness_commands_are_listed_with_their_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--help"])
    assert caught.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # the wording, wherever argparse wraps it
    assert "replay a load trace through strategies, baselines and the oracle" in out
    assert "serve an emulated Kubernetes API" in out
    assert "run the controller on an emulated cluster" in out


def _only(*found: EntryPoint) -> Callable[..., tuple[EntryPoint, ...]]:
    return lambda **_: found


def test_without_the_harnesses_their_commands_are_unknown_and_say_where_they_come_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "entry_points", _only())  # only the controller's wheel installed
    with pytest.raises(SystemExit) as caught:
        cli.main(["simulate", "--trace", "t.csv", "--out", "out"])
    assert caught.value.code == 2
    assert "invalid choice: 'simulate'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "come with the rebalancer-sandbox distribution" in capsys.readouterr().out


def test_a_command_that_cannot_be_loaded_does_not_break_the_others(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = EntryPoint("broken", "no_such_module_here:main", cli.COMMANDS)
    monkeypatch.setattr(cli, "entry_points", _only(broken))
    with pytest.raises(SystemExit) as caught:
        cli.main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "broken" in out
    assert "(cannot be loaded: ModuleNotFoundError" in out
    assert "reclaim" in out


def test_simulate_with_an_slo_shows_the_strategies_a_budget_and_reports_what_they_spent(
    small_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    params = 'peak={"window_minutes": 10, "margin": 0, "spent_margin": 1}'
    argv = ["simulate", "--trace", str(small_trace), "--strategy", "peak", "--params", params]
    assert cli.main([*argv, "--slo", "10m", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["slo"] == {"max_breach_minutes": 10, "window_days": 7}
    spent = {n: f["budget_spent_minutes"] for n, f in summary["strategies"].items()}
    # Two days: the most any 7-day window spent is every breach minute of the run.
    assert spent == {n: f["breach_minutes"] for n, f in summary["strategies"].items()}
    assert spent["reactive"] > 0
    report = (out / "report.md").read_text()
    assert summary["budget"] == "10m per 7d (--slo)"
    assert "Error budget: 10m per 7d (--slo), the breach minutes any rolling window" in report
    assert "The dashed line in the plot is the budget: 10 minutes per 7 days" in report
    assert summary["trade"]["measure"] == "budget_spent_minutes"
    check_trade_curve(summary, report, out)
    plain = tmp_path / "plain"
    assert cli.main([*argv, "--slo", "none", "--no-trade", "--out", str(plain), "--quiet"]) == 0
    unbudgeted = json.loads((plain / "summary.json").read_text())
    assert (unbudgeted["slo"], unbudgeted["trade"]) == (None, None)
    assert unbudgeted["budget"] == "none (--slo none)"
    assert "## The trade" not in (plain / "report.md").read_text()
    assert not (plain / "trade_curve.svg").exists()


def check_trade_curve(summary: dict[str, Any], report: str, out: Path) -> None:
    """The chosen strategy run once per budget, 0, 5, 10, 30, 60 (10 is --slo's, whose run it
    is), each against the best grid point within the budget, chosen from the grid's worst
    windows."""
    trade = summary["trade"]
    assert trade["curve_strategy"] == "peak"
    curve = trade["curve"]
    assert [row["budget"] for row in curve] == [0, 5, 10, 30, 60]
    for row in curve:
        assert row["within"] == (row["default_worst_week"] <= row["budget"]), row
        fit = [p for p in trade["grid"] if p["budget_spent_minutes"] <= row["budget"]]
        if not fit:
            assert (row["best_label"], row["best_harvest"], row["ratio"]) == (None, None, None)
            continue
        most = max(p["harvest_ratio"] for p in fit)
        assert row["best_harvest"] == most
        assert row["best_label"] in [p["label"] for p in fit if p["harvest_ratio"] == most]
        if most > 0:
            assert row["ratio"] == round(row["default_harvest"] / most, 4)
    given = next(row for row in curve if row["budget"] == 10)
    peak = summary["strategies"]["peak"]
    assert given["default_harvest"] == peak["harvest_ratio"]
    assert given["default_worst_week"] == peak["budget_spent_minutes"]
    assert "### The trade curve" in report
    assert "| budget | peak harvest | worst 7 days | kept | best grid point within it |" in report
    shown = [line for line in report.splitlines() if line.startswith(("| 0 |", "| 60 |"))]
    assert len(shown) == 2
    drawn = ET.parse(out / "trade_curve.svg").getroot()
    line = next(p for p in drawn.iter(f"{SVG}circle") if p.get("data-series") == "peak")
    marked = {
        (float(m.get("data-x", "")), float(m.get("data-y", "")))
        for m in drawn.iter(f"{SVG}circle")
        if m.get("data-series") == line.get("data-series")
    }
    assert marked == {(row["budget"], row["default_harvest"]) for row in curve}


def test_simulate_adds_a_budget_off_the_trade_curve_to_it_and_runs_each_budget_once(
    small_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.sim import engine

    budgets: list[int] = []
    run = engine.run

    def counted(*args: Any, **kwargs: Any) -> engine.Run:
        if kwargs.get("slo") is not None:
            budgets.append(kwargs["slo"].max_breach_minutes)
        return run(*args, **kwargs)

    monkeypatch.setattr(engine, "run", counted)
    short = tmp_path / "short.csv"
    short.write_text("\n".join(small_trace.read_text().splitlines()[:61]) + "\n")  # ten hours
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(short), "--slo", "7m", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    assert sorted(budgets) == [0, 5, 7, 10, 30, 60]  # the grid and the baselines run without
    summary = json.loads((out / "summary.json").read_text())
    curve = summary["trade"]["curve"]
    assert summary["trade"]["curve_strategy"] == registry.DEFAULT
    assert [row["budget"] for row in curve] == [0, 5, 7, 10, 30, 60]
    given = curve[2]
    assert given["default_harvest"] == summary["strategies"][registry.DEFAULT]["harvest_ratio"]
    assert "| 7 |" in (out / "report.md").read_text()


@pytest.mark.parametrize("value", ["-1m", "10", "150%", "90s", "off", "None"])
def test_simulate_refuses_an_slo_that_is_neither_minutes_nor_an_availability(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    argv = ["simulate", "--trace", str(small_trace), f"--slo={value}", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rebalancer: --slo={value!r}: write the breach minutes per 7 days as a duration (10m), "
        "an availability in percent (99.9%) or none (no budget)"
    ]


def test_simulate_reads_an_slo_in_percent_as_the_settings_read_availability(
    small_trace: Path, tmp_path: Path
) -> None:
    argv = ["simulate", "--trace", str(small_trace), "--strategy", "watermark", "--no-trade"]
    assert cli.main([*argv, "--slo", "99.9%", "--out", str(tmp_path), "--quiet"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["slo"] == {"max_breach_minutes": 10, "window_days": 7}  # 10.08, rounded down


def test_simulate_with_a_training_queue_reports_what_training_made_of_the_loans(
    small_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(small_trace), "--no-trade", "--quiet"]
    assert cli.main([*argv, "--training-backlog", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training"]["backlog"] == 2
    assert summary["training"]["seed"] == 7
    for name, figures in summary["strategies"].items():
        t = figures["training"]
        assert t["used_gpu_hours"] <= t["lent_gpu_hours"], name
        assert t["gangs_half_running"] == 0, name
    assert summary["strategies"][registry.DEFAULT]["training"]["lent_gpu_hours"] > 0
    report = (out / "report.md").read_text()
    assert "## Training on lent nodes" in report
    assert "| strategy | GPU-h lent | GPU-h used | used | refused, no taker |" in report
    plain = tmp_path / "plain"
    assert cli.main([*argv, "--out", str(plain)]) == 0
    untrained = json.loads((plain / "summary.json").read_text())
    assert untrained["training"] is None
    assert "## Training on lent nodes" not in (plain / "report.md").read_text()


def test_simulate_refuses_a_training_queue_with_nothing_waiting(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(small_trace), "--training-backlog", "0"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 2
    assert "--training-backlog=0: must be at least 1 waiting job" in capsys.readouterr().err


def test_audit_shows_one_cluster_of_a_shared_store_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    from datetime import UTC, datetime

    from rebalancer.adapters.audit import SqlAuditStore
    from rebalancer.core.audit import AuditRecord, Kind

    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"

    async def seed() -> None:
        store = await SqlAuditStore.open(url)
        try:
            await store.append(
                [
                    AuditRecord(
                        id=f"01J{n:023d}",
                        time=datetime(2026, 3, 2, 12, n, tzinfo=UTC),
                        kind=Kind.SUMMARY,
                        cluster=cluster,
                        pool="l20",  # the same pool name in both clusters
                        controller=f"rebalancer-{cluster}",
                        reason="steady",
                        message=f"nothing to do in {cluster}",
                    )
                    for n, cluster in enumerate(["prod-eu", "prod-us", "prod-eu"])
                ]
            )
        finally:
            await store.close()

    asyncio.run(seed())
    config = tmp_path / "config.yaml"
    config.write_text(f"audit:\n  url: {url}\n")

    assert cli.main(["audit", "--json", "--cluster", "prod-eu", "--config", str(config)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"][-1], r["cluster"]) for r in rows] == [("2", "prod-eu"), ("0", "prod-eu")]

    assert cli.main(["audit", "--config", str(config)]) == 0  # every cluster, each one named
    table = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert table[0] == ["time", "cluster"]
    assert [cluster for _, cluster in table[1:]] == ["prod-eu", "prod-us", "prod-eu"]

    assert cli.main(["audit", "--cluster", "", "--config", str(config)]) == 2
    assert capsys.readouterr().err == "rebalancer: --cluster='': must not be empty\n"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gpu-labeler", "--node", "gpu-1", "--interval", "soon"], "--interval='soon': write a"),
        (["gpu-labeler", "--node", "gpu-1", "--timeout", "0s"], "--timeout='0s': must be"),
        (["gpu-labeler", "--node", " "], "--node: required (or set NODE_NAME"),
    ],
)
def test_gpu_labeler_flags_are_refused_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert says in err
