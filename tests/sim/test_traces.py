"""Reading load traces: both formats, gaps, and a clear error for every kind of bad line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rebalancer.errors import TraceError
from sandbox.sim import traces

EXAMPLES = Path(__file__).parents[2] / "examples" / "traces"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_the_bundled_azure_week_reads_as_one_value_per_minute_for_each_service() -> None:
    code = traces.load(EXAMPLES / "azure_llm_2024_week_per_minute.csv", "code")
    assert code.minutes == 7 * 24 * 60
    assert code.start == datetime(2024, 5, 10, tzinfo=UTC)
    assert code.rps[0] == pytest.approx(1537 / 60)  # the first row of the file
    assert sum(v or 0 for v in code.rps) * 60 == pytest.approx(16_803_695)  # published total


def test_a_time_rps_trace_holds_each_value_until_the_next_row(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "time,rps\n2025-01-01T00:00:00Z,1.5\n2025-01-01T00:10:00Z,3\n2025-01-01T00:20:00Z,2\n",
    )
    trace = traces.load(path)
    assert trace.native_step == timedelta(minutes=10)
    assert trace.rps == [1.5] * 10 + [3.0] * 10 + [2.0] * 10


def test_a_missing_row_in_a_time_rps_trace_is_a_gap_not_zero(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "time,rps\n2025-01-01T00:00:00Z,1\n2025-01-01T00:10:00Z,2\n"
        "2025-01-01T00:30:00Z,4\n2025-01-01T00:40:00Z,5\n",
    )
    trace = traces.load(path)
    assert trace.rps[20:30] == [None] * 10
    assert trace.gap_minutes == 10
    assert trace.rps[30] == 4.0


def test_the_bundled_servegen_traces_have_gaps_only_where_the_release_does() -> None:
    mid = traces.load(EXAMPLES / "servegen_m-mid.csv")
    assert mid.minutes == 14 * 24 * 60
    assert mid.gap_minutes == 84 * 10  # the 84 all-zero windows of m-mid


@pytest.mark.parametrize(
    ("text", "service", "message"),
    [
        pytest.param("", None, "empty file", id="empty"),
        pytest.param("a,b\n1,2\n", None, "unknown header 'a,b'", id="unknown-header"),
        pytest.param(
            "time,rps\n2025-01-01T00:00:00Z,1\n2025-01-01 00:01,2\n",
            None,
            "line 3: time='2025-01-01 00:01' is not an RFC 3339 time in UTC",
            id="time-without-zone",
        ),
        pytest.param(
            "time,rps\n2025-01-01T00:00:00Z,1\n2025-01-01T00:01:00Z,-2\n",
            None,
            "line 3: rps='-2' is not a number >= 0",
            id="negative-rate",
        ),
        pytest.param(
            "time,rps\n2025-01-01T00:00:00Z,1\n2025-01-01T00:01:00Z,nan\n",
            None,
            "line 3: rps='nan' is not a number >= 0",
            id="nan-rate",
        ),
        pytest.param(
            "time,rps\n2025-01-01T00:01:00Z,1\n2025-01-01T00:02:00Z,1\n2025-01-01T00:00:00Z,1\n",
            None,
            "line 4: time 2025-01-01T00:00:00Z is not after the row before it",
            id="out-of-order",
        ),
        pytest.param(
            "time,rps\n2025-01-01T00:00:00Z,1\n2025-01-01T00:00:30Z,1\n",
            None,
            "the spacing must be whole minutes",
            id="sub-minute-spacing",
        ),
        pytest.param(
            "time,rps\n2025-01-01T00:00:00Z\n2025-01-01T00:01:00Z,1\n",
            None,
            "line 2: has 1 fields, needs 2",
            id="short-row",
        ),
        pytest.param(
            "minute_start_utc,service,requests\n2024-05-10T00:00:00Z,code,1\n"
            "2024-05-10T00:00:00Z,conv,2\n",
            None,
            "holds services code, conv; pick one with --service",
            id="service-needed",
        ),
        pytest.param(
            "minute_start_utc,service,requests\n2024-05-10T00:00:00Z,code,1\n",
            "chat",
            "no service 'chat'; it holds code",
            id="unknown-service",
        ),
        pytest.param(
            "minute_start_utc,service,requests\n2024-05-10T00:00:00Z,code,many\n",
            None,
            "line 2: requests='many' is not a number >= 0",
            id="bad-count",
        ),
        pytest.param(
            "time,rps\n2024-05-10T00:00:00Z,1.7e308\n",
            None,
            "line 2: rps='1.7e308' is above 1e+12, no load a pool serves",
            id="absurd-rate",
        ),
    ],
)
def test_a_bad_trace_is_refused_with_the_line_and_field(
    tmp_path: Path, text: str, service: str | None, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError) as caught:
        traces.load(path, service)
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_a_missing_file_is_refused_without_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        traces.load(tmp_path / "nope.csv")


def test_a_binary_file_is_refused_as_not_text(tmp_path: Path) -> None:
    path = tmp_path / "blob.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not a text CSV file"):
        traces.load(path)
