"""``rebalancer simulate --prometheus``: a pool's own demand history, read from a real Prometheus
backfilled from the bundled Azure week (``tests.support.demand_history``), replayed as a trace.

What must hold: the read in day-long chunks returns every minute Prometheus has and invents
none; gaps are held or reported as the docs say; the trace written beside the report reads back
as the minutes replayed; a week read from Prometheus gives the figures of the same week from its
CSV; and every bad flag is one line, exit status 2.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rebalancer import cli, settings
from rebalancer.adapters import metrics
from rebalancer.core.model import PoolName
from rebalancer.runtime import adapterconfig
from sandbox.sim import history, traces
from tests.support import demand_history
from tests.support.demand_history import CONV_MISSING, Series
from tests.support.processes import free_port

MINUTE = timedelta(minutes=1)


@pytest.fixture(scope="module")
def weeks() -> dict[str, Series]:
    return {
        "code": demand_history.week("code"),
        "conv": demand_history.week("conv", CONV_MISSING),
    }


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, weeks: dict[str, Series]) -> Iterator[str]:
    with demand_history.serving(tmp_path_factory.mktemp("history"), weeks) as url:
        yield url


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demand_history.config(tmp_path_factory.mktemp("settings") / "config.yaml")


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def simulate(*argv: str) -> int:
    return cli.main(["simulate", *argv])


# -- the gap policy, pure ---------------------------------------------------------------------

T0 = datetime(2024, 5, 12, tzinfo=UTC)


def test_a_gap_no_longer_than_the_hold_takes_the_value_before_it() -> None:
    filled = history.fill(T0, [1.0, None, None, 4.0], hold=2)
    assert filled.rps == [1.0, 1.0, 1.0, 4.0]
    assert filled.gaps == [history.Gap(T0 + MINUTE, 2, history.GapKind.HELD)]


def test_a_gap_longer_than_the_hold_stays_without_a_sample_and_is_never_zero() -> None:
    filled = history.fill(T0, [1.0, None, None, None, 5.0], hold=2)
    assert filled.rps == [1.0, None, None, None, 5.0]
    assert filled.gaps == [history.Gap(T0 + MINUTE, 3, history.GapKind.OUTAGE)]


def test_minutes_before_the_first_sample_and_after_the_last_are_cut_off_and_reported() -> None:
    filled = history.fill(T0, [None, None, 2.0, 3.0, None], hold=5)
    assert filled.start == T0 + 2 * MINUTE
    assert filled.rps == [2.0, 3.0]
    assert [(g.start, g.minutes, g.kind) for g in filled.gaps] == [
        (T0, 2, history.GapKind.EDGE),
        (T0 + 4 * MINUTE, 1, history.GapKind.EDGE),
    ]


def test_with_a_hold_of_zero_every_gap_is_an_outage() -> None:
    filled = history.fill(T0, [1.0, None, 3.0], hold=0)
    assert filled.rps == [1.0, None, 3.0]
    assert filled.gaps[0].kind == history.GapKind.OUTAGE


@pytest.mark.parametrize(
    ("since", "span"),
    [("14d", timedelta(days=14)), ("36h", timedelta(hours=36)), ("1d12h", timedelta(hours=36))],
)
def test_since_counts_back_from_now_rounded_down_to_the_minute(since: str, span: timedelta) -> None:
    now = datetime(2024, 5, 20, 10, 30, 42, tzinfo=UTC)
    first, until = history.window(since, None, None, now)
    assert until == datetime(2024, 5, 20, 10, 30, tzinfo=UTC)
    assert until - first == span


# -- against a real Prometheus ----------------------------------------------------------------


async def test_the_chunked_read_returns_every_minute_prometheus_has_and_invents_none(
    prometheus: str, config: Path, weeks: dict[str, Series]
) -> None:
    conv = weeks["conv"]
    pool = settings.load(config, env={}).pool("conv")
    adapter = metrics.Metrics(
        metrics.Settings(url=prometheus, queries=adapterconfig.metric_queries(pool.metrics))
    )
    try:
        read = await history.read_range(
            adapter,
            PoolName("conv"),
            "demand",
            adapter.settings.queries.demand,
            [],
            conv.start,
            conv.start + demand_history.WEEK * MINUTE,
            chunk=timedelta(hours=5),  # not a divisor of a day: chunk ends fall anywhere
        )
    finally:
        adapter.close()
    assert read.error is None
    expected = [None if i in CONV_MISSING else v for i, v in enumerate(conv.rps)]
    # Exact: a missing minute is None although Prometheus' lookback would carry the one before.
    assert read.values == expected
    assert read.requests == 2 * -(-demand_history.WEEK // 300)


async def test_a_query_for_one_pool_reads_only_that_pool(
    prometheus: str, config: Path, weeks: dict[str, Series]
) -> None:
    code = weeks["code"]
    pool = settings.load(config, env={}).pool("code")
    adapter = metrics.Metrics(
        metrics.Settings(url=prometheus, queries=adapterconfig.metric_queries(pool.metrics))
    )
    try:
        read = await history.read_range(
            adapter,
            PoolName("code"),
            "demand",
            adapter.settings.queries.demand,
            [],
            code.start,
            code.start + 90 * MINUTE,
        )
    finally:
        adapter.close()
    assert read.values == code.rps[:90]
    assert read.requests == 2


def test_gaps_are_held_or_reported_with_their_times_and_the_trace_is_written(
    prometheus: str,
    config: Path,
    weeks: dict[str, Series],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conv = weeks["conv"]
    start, end = conv.start, conv.start + 3 * 24 * 60 * MINUTE
    code = simulate(
        "--prometheus", prometheus, "--config", str(config), "--pool", "conv",
        "--from", rfc3339(start), "--to", rfc3339(end), "--no-trade", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"gap {rfc3339(start)} to {rfc3339(conv.minute(5))} (5 min): no sample: outside" in out
    assert "gap 2024-05-12T01:40:00Z to 2024-05-12T01:41:00Z (1 min): held" in out
    assert "gap 2024-05-12T08:20:00Z to 2024-05-12T08:22:00Z (2 min): held" in out
    assert "gap 2024-05-12T16:40:00Z to 2024-05-12T17:10:00Z (30 min): no sample: replayed" in out
    assert "gap 2024-05-13T23:59:00Z to 2024-05-14T00:02:00Z (3 min): no sample: replayed" in out

    record = json.loads((tmp_path / "history.json").read_text())
    assert [(g["start"], g["minutes"], g["kind"]) for g in record["gaps"]] == [
        ("2024-05-12T00:00:00Z", 5, "edge"),
        ("2024-05-12T01:40:00Z", 1, "held"),
        ("2024-05-12T08:20:00Z", 2, "held"),
        ("2024-05-12T16:40:00Z", 30, "outage"),
        ("2024-05-13T23:59:00Z", 3, "outage"),
    ]
    assert record["hold_minutes"] == 2  # the pool's staleness limit
    assert record["requests"] == 2 * 3
    assert record["query"] == 'sum(demand_rps{pool="conv"})'

    with (tmp_path / "trace-conv.csv").open(newline="") as f:
        rows = {row["time"]: float(row["rps"]) for row in csv.DictReader(f)}
    assert rows[rfc3339(conv.minute(5))] == conv.rps[5]  # exactly, not rounded
    assert rows[rfc3339(conv.minute(100))] == conv.rps[99]  # held
    assert rows[rfc3339(conv.minute(501))] == conv.rps[499]  # held, second minute
    assert not any(rfc3339(conv.minute(i)) in rows for i in range(1000, 1030))  # outage
    assert rfc3339(conv.minute(4)) not in rows

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trace"]["gap_minutes"] == 33
    assert summary["trace"]["minutes"] == 3 * 24 * 60 - 5
    assert summary["pool"]["zone"] == "America/Los_Angeles"  # the pool's own zone


@pytest.mark.parametrize(
    ("hold", "kinds"),
    [
        ("1m", ["edge", "held", "outage"]),  # a DURATION: one minute, so 2 are an outage
        ("2m", ["edge", "held", "held"]),
        ("120s", ["edge", "held", "held"]),
    ],
)
def test_hold_takes_a_duration_or_a_bare_number_of_minutes(
    prometheus: str,
    config: Path,
    weeks: dict[str, Series],
    tmp_path: Path,
    hold: str,
    kinds: list[str],
) -> None:
    conv = weeks["conv"]
    assert simulate(
        "--prometheus", prometheus, "--config", str(config), "--pool", "conv",
        "--from", rfc3339(conv.start), "--to", rfc3339(conv.minute(12 * 60)), "--hold", hold,
        "--no-trade", "--quiet", "--out", str(tmp_path),
    ) == 0  # fmt: skip
    record = json.loads((tmp_path / "history.json").read_text())
    assert record["hold_minutes"] == int(kinds.count("held") == 2) + 1
    # The gaps of the first 12 hours: 5 minutes before the first sample, 1 at 01:40, 2 at 08:20.
    assert [(g["minutes"], g["kind"]) for g in record["gaps"]] == list(
        zip([5, 1, 2], kinds, strict=True)
    )


@pytest.mark.slow
def test_a_week_from_prometheus_gives_the_figures_of_the_same_week_from_its_csv(
    prometheus: str, config: Path, tmp_path: Path
) -> None:
    # The pool's own settings for both: its rps_per_node, limits, zone, strategy, slo.
    common = ["--config", str(config), "--pool", "code", "--no-trade", "--quiet"]
    from_csv, from_prometheus = tmp_path / "csv", tmp_path / "prom"
    assert (
        simulate(
            "--trace",
            str(demand_history.TRACE),
            "--service",
            "code",
            *common,
            "--out",
            str(from_csv),
        )
        == 0
    )
    assert simulate(
        "--prometheus", prometheus,
        "--from", "2024-05-10T00:00:00Z", "--to", "2024-05-17T00:00:00Z",
        *common, "--out", str(from_prometheus),
    ) == 0  # fmt: skip

    csv_run = json.loads((from_csv / "summary.json").read_text())
    prom_run = json.loads((from_prometheus / "summary.json").read_text())
    assert prom_run["strategies"] == csv_run["strategies"]
    assert prom_run["pool"] == csv_run["pool"]
    # The pool's capacity, not one calibrated from the week's peak (6.81 rps).
    assert prom_run["pool"]["rps_per_node"] == 7
    assert prom_run["pool"]["from"]["rps_per_node"] == "settings"
    assert prom_run["pool"]["zone"] == "America/Los_Angeles"
    assert prom_run["slo"] == {"max_breach_minutes": 10, "window_days": 7}  # the default slo
    for field in ("start", "end", "minutes", "gap_minutes", "peak_rps"):
        assert prom_run["trace"][field] == csv_run["trace"][field]
    # The trace written beside the report is the CSV's week, minute for minute; that a written
    # trace replays as the run it came from is shown on a shorter span (the test below).
    written, week = (
        traces.load(from_prometheus / "trace-code.csv"),
        traces.load(demand_history.TRACE, "code"),
    )
    assert (written.start, written.native_step) == (week.start, week.native_step)
    assert written.rps == week.rps


def test_the_trace_written_beside_the_report_replays_as_the_run_it_came_from(
    prometheus: str, config: Path, weeks: dict[str, Series], tmp_path: Path
) -> None:
    # Up to 18:00 of conv's first day: a late first sample, two held gaps and an outage.
    conv = weeks["conv"]
    common = ["--config", str(config), "--pool", "conv", "--no-trade", "--quiet"]
    from_prometheus, again = tmp_path / "prom", tmp_path / "again"
    assert simulate(
        "--prometheus", prometheus,
        "--from", rfc3339(conv.start), "--to", rfc3339(conv.minute(18 * 60)),
        *common, "--out", str(from_prometheus),
    ) == 0  # fmt: skip
    written = from_prometheus / "trace-conv.csv"
    assert simulate("--trace", str(written), *common, "--out", str(again)) == 0

    prom_run = json.loads((from_prometheus / "summary.json").read_text())
    assert prom_run["trace"]["gap_minutes"] == 30  # the outage, replayed as no sample
    # The same run, file name and all.
    assert json.loads((again / "summary.json").read_text()) == prom_run


def test_a_query_scoped_to_the_pools_nodes_finds_them_by_the_pools_labels(
    prometheus: str, config: Path, weeks: dict[str, Series], tmp_path: Path
) -> None:
    code = weeks["code"]
    assert simulate(
        "--prometheus", prometheus, "--config", str(config), "--pool", "scoped",
        "--from", rfc3339(code.start), "--to", rfc3339(code.minute(120)),
        "--no-trade", "--quiet", "--out", str(tmp_path),
    ) == 0  # fmt: skip
    record = json.loads((tmp_path / "history.json").read_text())
    assert record["nodes"] == list(demand_history.CODE_NODES)
    assert traces.load(tmp_path / "trace-scoped.csv").rps == code.rps[:120]


# -- one line, exit status 2 ------------------------------------------------------------------


def history_argv(url: str, config: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--prometheus", url, "--config", str(config), "--pool", "code",
        "--from", "2024-05-10T00:00:00Z", "--to", "2024-05-10T02:00:00Z",
        "--no-trade", "--quiet", "--out", str(tmp_path), *extra,
    ]  # fmt: skip


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert simulate(*argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_a_bad_url_is_refused_naming_the_flag(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(capsys, history_argv("prometheus:9090", config, tmp_path))
    assert line.startswith("rebalancer: --prometheus='prometheus:9090': write an http://")


def test_an_unreachable_prometheus_is_one_line_after_the_retries(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = refusal(capsys, history_argv(url, config, tmp_path))
    assert line.startswith(f"rebalancer: --prometheus={url}: pool code: demand unknown: ")
    assert "cannot reach Prometheus" in line
    assert "gave up after 3 attempts" in line


def test_an_unknown_pool_is_refused_naming_the_configured_ones(
    prometheus: str, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = history_argv(prometheus, config, tmp_path)
    argv[argv.index("code")] = "chat"
    line = refusal(capsys, argv)
    assert line == "rebalancer: --pool=chat: no configured pool has that name (code, conv, scoped)"


def test_a_span_with_no_sample_is_refused_not_replayed_as_zero_demand(
    prometheus: str, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = history_argv(prometheus, config, tmp_path)
    argv[argv.index("2024-05-10T00:00:00Z")] = "2024-04-01T00:00:00Z"
    argv[argv.index("2024-05-10T02:00:00Z")] = "2024-04-02T00:00:00Z"
    line = refusal(capsys, argv)
    assert line.startswith(f"rebalancer: --pool=code: no demand sample in {prometheus} between ")
    assert 'sum(demand_rps{pool="code"})' in line
    assert not (tmp_path / "summary.json").exists()


def test_a_scoped_query_with_no_labelled_node_asks_for_nodes(
    prometheus: str, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = history_argv(prometheus, config, tmp_path)
    argv[argv.index("code")] = "scoped"
    argv[argv.index("2024-05-10T00:00:00Z")] = "2024-04-01T00:00:00Z"
    argv[argv.index("2024-05-10T02:00:00Z")] = "2024-04-02T00:00:00Z"
    line = refusal(capsys, argv)
    assert "kube_node_labels shows no node labelled rebalancer.io/pool=code" in line
    assert line.endswith("name them with --nodes")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--since", "14x"], "--since='14x': must be an RFC 3339 date-time with an offset"),
        (["--since", "1m"], "--since='1m': must be at least 2 minutes ago"),
        (["--since", "2030-01-01T00:00:00Z"], "--since='2030-01-01T00:00:00Z': must be at least"),
        (["--since", "2020-01-01T00:00:00Z"], "--since='2020-01-01T00:00:00Z': must be at most"),
        (["--hold", "90s"], "--hold='90s': must be whole minutes"),
        (["--hold", "2x"], "--hold='2x': write a duration such as 90s, 15m or 2h"),
        (
            ["--hold", "2"],
            (
                "--hold='2': a bare number has no unit; write a duration with its unit, "
                "such as 30s, 5m or 1h30m"
            ),
        ),
        (["--nodes", "a b"], "--nodes='a b': write node names separated by commas"),
        (["--service", "code"], "--service=code: for --trace; --prometheus reads --pool"),
    ],
)
def test_bad_history_flags_are_one_line_naming_the_flag_and_value(
    prometheus: str,
    config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    argv = history_argv(prometheus, config, tmp_path, *extra)
    if extra[0] == "--since":
        for flag in ("--from", "--to"):
            del argv[argv.index(flag) : argv.index(flag) + 2]
    line = refusal(capsys, argv)
    assert line.startswith(f"rebalancer: {message}")


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (("2024-05-10T00:00:00Z", "yesterday"), "--from='yesterday': not an RFC 3339 time"),
        (("2024-05-10T02:00:00Z", "2024-05-10T02:00:00"), "--to='2024-05-10T02:00:00': not an"),
        (("2024-05-10T02:00:00Z", "2024-05-09T00:00:00Z"), "--to='2024-05-09T00:00:00Z': must be"),
        (("code", None), "--prometheus=URL: name the pool to read with --pool"),
    ],
)
def test_bad_times_and_a_missing_pool_are_one_line(
    config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    replace: tuple[str, str | None],
    message: str,
) -> None:
    argv = history_argv("http://127.0.0.1:9", config, tmp_path)
    old, new = replace
    at = argv.index(old)
    if new is None:
        del argv[at - 1 : at + 1]
    else:
        argv[at] = new
    line = refusal(capsys, argv)
    assert line.startswith("rebalancer: " + message.replace("URL", "http://127.0.0.1:9"))


def test_history_flags_without_prometheus_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = demand_history.TRACE
    argv = ["--trace", str(trace), "--service", "code", "--since", "14d", "--out", str(tmp_path)]
    line = refusal(capsys, argv)
    assert line == "rebalancer: --since: only with --prometheus (it reads the pool's history)"
