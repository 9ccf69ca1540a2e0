"""``rebalancer simulate``'s duration and time flags: written as the settings and ``rebalancer
audit`` write them.

A DURATION (``--drain``, ``--warmup``) is read as every flag reads one: ``90s``, ``5m``, ``2h``,
``1h30m``, with its unit; a bare number, which the settings read as seconds and ``--hold`` once
read as minutes, is refused. ``--since`` is a TIME as ``rebalancer audit --since``
reads it: an RFC 3339 time or a time ago, each run here against the audit command's own reading.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from rebalancer import cli
from rebalancer.cli import audit as audit_command
from rebalancer.errors import ConfigError
from rebalancer.settings import PoolSettings
from sandbox.sim import history

TRACE = Path(__file__).parents[2] / "examples" / "traces" / "servegen_m-small.csv"
NOW = datetime(2024, 5, 20, 10, 30, 42, tzinfo=UTC)
POOL = {"name": "p", "node_selector": {"pool": "p"}, "rps_per_node": 1}  # slo left out


@pytest.fixture(scope="module")
def half_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "small-12h.csv"
    path.write_text("\n".join(TRACE.read_text().splitlines()[:73]) + "\n")
    return path


@pytest.mark.parametrize(
    ("drain", "warmup", "seconds"),
    [
        ("90s", "5m", (90, 300)),
        ("2m", "1h", (120, 3600)),
        ("2m30s", "1m30s", (150, 90)),
        ("0", "0.5m", (0, 30)),
    ],
)
def test_drain_and_warmup_take_durations_with_their_unit(
    half_day: Path, tmp_path: Path, drain: str, warmup: str, seconds: tuple[int, int]
) -> None:
    argv = ["simulate", "--trace", str(half_day), "--drain", drain, "--warmup", warmup]
    assert cli.main([*argv, "--no-trade", "--quiet", "--out", str(tmp_path)]) == 0
    pool = json.loads((tmp_path / "summary.json").read_text())["pool"]
    assert (pool["drain_seconds"], pool["warmup_seconds"]) == seconds
    assert (pool["from"]["drain"], pool["from"]["warmup"]) == ("flag", "flag")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--warmup", "5x", "--warmup='5x': write a duration such as 90s, 15m or 2h"),
        (
            "--drain",
            "150",
            (
                "--drain='150': a bare number has no unit; write a duration with its unit, "
                "such as 30s, 5m or 1h30m"
            ),
        ),
        ("--warmup", "2d", "--warmup='2d': write a duration such as 90s, 15m or 2h"),
    ],
)
def test_a_bad_duration_is_one_line_naming_the_flag(
    half_day: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    value: str,
    message: str,
) -> None:
    argv = ["simulate", "--trace", str(half_day), flag, value, "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"rebalancer: {message}"]


def audit_since(text: str) -> datetime | str:
    """What ``rebalancer audit --since TEXT`` reads (its own function), or its error line."""
    args = argparse.Namespace(
        since=text,
        until=None,
        cluster=None,
        pool=None,
        node=None,
        action=None,
        kind=None,
        limit=100,
        oldest_first=False,
    )
    try:
        since = audit_command.audit_query(args, NOW).since
    except ConfigError as exc:
        return str(exc)
    assert since is not None
    return since


def simulate_since(text: str) -> datetime | str:
    try:
        first, until = history.window(text, None, None, NOW)
    except ConfigError as exc:
        return str(exc)
    assert until == datetime(2024, 5, 20, 10, 30, tzinfo=UTC)  # now, down to the minute
    return first


@pytest.mark.parametrize(
    "text",
    [
        "14d",  # the old spellings: a duration up to now
        "36h",
        "1d12h",
        "90m",
        "2h30m15s",
        "2024-05-20T08:00:00Z",  # a time, as audit takes it
        "2024-05-20T10:00:00+02:00",
        "2024-05-19t23:59:59.999z",
    ],
)
def test_since_reads_what_audit_since_reads(text: str) -> None:
    audit = audit_since(text)
    assert isinstance(audit, datetime), audit
    assert simulate_since(text) == audit.replace(second=0, microsecond=0)


@pytest.mark.parametrize(
    "text", ["yesterday", "14x", "2024-05-20T08:00:00", "2024-05-20", "-2h", "1h2d", ""]
)
def test_since_refuses_what_audit_since_refuses_in_the_same_words(text: str) -> None:
    audit = audit_since(text)
    assert isinstance(audit, str), audit
    assert simulate_since(text) == audit


def test_since_a_time_reads_from_it_up_to_now() -> None:
    first, until = history.window("2024-05-20T08:00:30Z", None, None, NOW)
    assert (first, until) == (
        datetime(2024, 5, 20, 8, 0, tzinfo=UTC),
        datetime(2024, 5, 20, 10, 30, tzinfo=UTC),
    )
    assert until - history.window("1d", None, None, NOW)[0] == timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2024-05-20T10:30:00Z", "--since='2024-05-20T10:30:00Z': must be at least 2 minutes ago"),
        ("2024-06-01T00:00:00Z", "--since='2024-06-01T00:00:00Z': must be at least 2 minutes ago"),
        ("401d", "--since='401d': must be at most 400d ago"),
    ],
)
def test_since_too_near_or_too_far_is_refused(text: str, message: str) -> None:
    assert simulate_since(text) == message


def test_json_and_yaml_print_the_summary_as_summary_json_holds_it(
    half_day: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """stdout has the document alone, --quiet or not; where the results are is on stderr."""
    argv = ["simulate", "--trace", str(half_day), "--no-trade", "--out", str(tmp_path)]
    assert cli.main([*argv, "-o", "json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    written = json.loads((tmp_path / "summary.json").read_text())
    assert (json.loads(out), err) == (written, "")
    assert cli.main([*argv, "-o", "yaml"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out) == json.loads((tmp_path / "summary.json").read_text())
    assert err.splitlines()[-1] == f"results in {tmp_path}/"


@pytest.mark.parametrize(
    ("flags", "slo", "said"),
    [
        ((), "default", "(the pool's default)"),
        (("--slo", "30m"), {"max_breach_minutes": 30, "window_days": 7}, "30m per 7d (--slo)"),
        (("--slo", "none"), None, "none (--slo none)"),
    ],
)
def test_without_slo_the_run_has_the_budget_the_controller_gives_every_pool(
    half_day: Path, tmp_path: Path, flags: tuple[str, ...], slo: object, said: str
) -> None:
    """No ``--slo`` models what the controller does: the budget of a pool whose settings leave
    ``slo`` out; ``--slo none`` turns it off. The summary and the report say which ran."""
    argv = ["simulate", "--trace", str(half_day), "--strategy", "peak", "--no-trade", *flags]
    assert cli.main([*argv, "--quiet", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    if slo == "default":
        default = PoolSettings.model_validate(POOL).slo
        assert default is not None
        budget = default.slo()
        slo = {"max_breach_minutes": budget.max_breach_minutes, "window_days": 7}
        said = f"{budget.max_breach_minutes}m per 7d {said}"
    assert (summary["slo"], summary["budget"]) == (slo, said)
    assert summary["pool"]["from"]["slo"] == ("default" if not flags else "flag")
    assert f"Error budget: {said}" in (tmp_path / "report.md").read_text()
    spent = "budget_spent_minutes" in summary["strategies"]["peak"]
    assert spent == (slo is not None)
