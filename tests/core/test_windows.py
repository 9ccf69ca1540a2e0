"""Lending windows: syntax, weekday sets, overnight spans, and DST in both directions.

Every instant in the tables is written in UTC; the comment beside it gives the wall time in the
window's zone. 2026 dates used: Mon 2 March (a plain week), Sun 8 March and Sun 1 November
(America/New_York changes), Sun 29 March and Sun 25 October (Europe/Berlin changes), Sun 5 April
and Sun 4 October (Australia/Adelaide changes, a half-hour zone).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import windows
from rebalancer.core.windows import Window, WindowError


def at(text: str) -> datetime:
    """A UTC instant written as ``2026-03-29T01:00``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def window(text: str, default_zone: str = "UTC") -> Window:
    parsed = windows.parse(text, default_zone)
    assert isinstance(parsed, Window), str(parsed)
    return parsed


# ---------------------------------------------------------------------------------------------
# Syntax


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        pytest.param("Mon", {0}, id="one day"),
        pytest.param("Mon-Fri", {0, 1, 2, 3, 4}, id="a range"),
        pytest.param("Sat,Sun", {5, 6}, id="a list"),
        pytest.param("Fri-Mon", {4, 5, 6, 0}, id="a range wrapping over the week's end"),
        pytest.param("Sun-Mon", {6, 0}, id="the shortest wrapping range"),
        pytest.param("Tue-Mon", {0, 1, 2, 3, 4, 5, 6}, id="a wrapping range of the whole week"),
        pytest.param("Wed-Wed", {2}, id="a range of one day"),
        pytest.param("Mon,Wed-Thu,Sat", {0, 2, 3, 5}, id="a list of days and ranges"),
        pytest.param("Mon-Wed,Tue-Thu", {0, 1, 2, 3}, id="overlapping ranges"),
        pytest.param("mon-FRI", {0, 1, 2, 3, 4}, id="any letter case"),
        pytest.param("daily", {0, 1, 2, 3, 4, 5, 6}, id="daily"),
        pytest.param("*", {0, 1, 2, 3, 4, 5, 6}, id="a star"),
    ],
)
def test_weekday_sets_are_parsed_with_wrapping_ranges(days: str, expected: set[int]) -> None:
    (span,) = window(f"{days} 10:00-11:00 UTC").spans
    assert span.days == frozenset(expected)


@pytest.mark.parametrize(
    ("times", "start", "end"),
    [
        pytest.param("09:00-17:00", 9 * 60, 17 * 60, id="a daytime span"),
        pytest.param("22:00-06:00", 22 * 60, 6 * 60, id="an overnight span"),
        pytest.param("00:00-24:00", 0, 1440, id="a whole day"),
        pytest.param("12:00-24:00", 720, 1440, id="to the end of the day"),
        pytest.param("12:00-00:00", 720, 1440, id="to midnight, which is the end of the day"),
        pytest.param("7:05-9:30", 7 * 60 + 5, 9 * 60 + 30, id="single-digit hours"),
        pytest.param("23:59-00:01", 1439, 1, id="two minutes over midnight"),
    ],
)
def test_time_ranges_are_minutes_after_local_midnight(times: str, start: int, end: int) -> None:
    (span,) = window(f"Mon {times} UTC").spans
    assert (span.start, span.end) == (start, end)


def test_several_spans_each_keep_their_own_zone() -> None:
    parsed = window("Mon-Fri 22:00-06:00 Asia/Shanghai; Sat,Sun 00:00-24:00 Europe/Berlin")
    assert [str(span.zone) for span in parsed.spans] == ["Asia/Shanghai", "Europe/Berlin"]


@pytest.mark.parametrize(
    ("text", "default_zone", "zone"),
    [
        pytest.param("Mon 09:00-17:00", "UTC", "UTC", id="no zone and the default default"),
        pytest.param("Mon 09:00-17:00", "Asia/Kolkata", "Asia/Kolkata", id="no zone"),
        pytest.param(
            "Mon 09:00-17:00 Europe/Berlin", "Asia/Kolkata", "Europe/Berlin", id="a zone given"
        ),
    ],
)
def test_a_span_without_a_zone_takes_the_default_zone(
    text: str, default_zone: str, zone: str
) -> None:
    (span,) = window(text, default_zone).spans
    assert str(span.zone) == zone


def test_whitespace_is_normalised_in_the_window_text() -> None:
    parsed = window("  Mon-Fri \t 22:00-06:00   Asia/Shanghai ;Sat,Sun  00:00-24:00 Asia/Shanghai ")
    assert str(parsed) == "Mon-Fri 22:00-06:00 Asia/Shanghai ;Sat,Sun 00:00-24:00 Asia/Shanghai"
    assert len(parsed.spans) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("always", windows.ALWAYS, id="always"),
        pytest.param("  ALWAYS ", windows.ALWAYS, id="always in capitals with spaces"),
        pytest.param("never", windows.NEVER, id="never"),
        pytest.param("Never", windows.NEVER, id="never capitalised"),
    ],
)
def test_always_and_never_are_windows_too(text: str, expected: Window) -> None:
    assert windows.parse(text) is expected


@pytest.mark.parametrize(
    "now",
    [
        pytest.param(at("2026-03-02T12:00"), id="a plain monday"),
        pytest.param(at("2026-03-29T01:00"), id="berlin springs forward"),
        pytest.param(at("2026-11-01T06:00"), id="new york falls back"),
    ],
)
def test_always_is_open_and_never_is_closed_without_any_edge(now: datetime) -> None:
    assert windows.ALWAYS.is_open(now)
    assert not windows.NEVER.is_open(now)
    assert windows.ALWAYS.next_edge(now) is None
    assert windows.NEVER.next_edge(now) is None


# ---------------------------------------------------------------------------------------------
# Parse errors: each one a value whose ``why`` names the problem


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("", "is empty", id="empty"),
        pytest.param("  \t ", "is empty", id="only whitespace"),
        pytest.param("Mon-Fro 10:00-12:00", "has days 'Mon-Fro'", id="a misspelt day"),
        pytest.param("Mo 10:00-12:00", "has days 'Mo'", id="a day too short"),
        pytest.param("Mon-Wed-Fri 10:00-12:00", "has days", id="a range of three days"),
        pytest.param("Mon,,Tue 10:00-12:00", "has days", id="an empty list item"),
        pytest.param("Mon- 10:00-12:00", "has days", id="a range without an end"),
        pytest.param("weekdays 10:00-12:00", "has days", id="a word that is no day"),
        pytest.param("Mon 25:00-26:00", "times are HH:MM from 00:00 to 24:00", id="hour 25"),
        pytest.param("Mon 12:60-13:00", "times are HH:MM from 00:00 to 24:00", id="minute 60"),
        pytest.param("Mon 1200-1300", "times are HH:MM from 00:00 to 24:00", id="no colon"),
        pytest.param("Mon 24:30-01:00", "times are HH:MM from 00:00 to 24:00", id="past 24:00"),
        pytest.param("Mon 9:5-10:00", "times are HH:MM from 00:00 to 24:00", id="one digit min"),
        pytest.param("Mon 10:00", "write it as HH:MM-HH:MM", id="one time only"),
        pytest.param("Mon 10:00-11:00-12:00", "write it as HH:MM-HH:MM", id="three times"),
        pytest.param("Mon 10:00-10:00", "starts and ends at the same time", id="start is end"),
        pytest.param("Mon 00:00-00:00", "starts and ends at the same time", id="midnight twice"),
        pytest.param("Mon 24:00-06:00", "starts at 24:00", id="24:00 as the start"),
        pytest.param("Mon 24:00-24:00", "starts at 24:00", id="24:00 as start and end"),
        pytest.param("Mon 10:00-12:00 Mars/Olympus", "unknown time zone 'Mars/Olympus'", id="zone"),
        pytest.param("Mon 10:00-12:00 America", "unknown time zone", id="a zone directory"),
        pytest.param("Mon 10:00-12:00 Etc", "unknown time zone", id="another zone directory"),
        pytest.param("Mon 10:00-12:00 zone.tab", "unknown time zone", id="a zone database file"),
        pytest.param("Mon 10:00-12:00 ../UTC", "unknown time zone", id="a relative path"),
        pytest.param("Mon 10:00-12:00 /UTC", "unknown time zone", id="an absolute path"),
        pytest.param("Mon 10:00-12:00 UTC extra", "needs days, a time range", id="4 fields"),
        pytest.param("Mon", "needs days, a time range", id="one field"),
        pytest.param("Mon 10:00-12:00 UTC;", "'' needs days", id="a trailing semicolon"),
        pytest.param("always; Mon 10:00-12:00", "'always' needs days", id="always in a list"),
    ],
)
def test_every_parse_error_is_a_value_naming_the_problem(text: str, why: str) -> None:
    parsed = windows.parse(text)
    assert isinstance(parsed, WindowError)
    assert parsed.text == text
    assert why in parsed.why
    assert str(parsed).startswith(f"window {text!r}: ")


def test_an_error_in_a_later_span_names_that_span() -> None:
    parsed = windows.parse("Mon 10:00-12:00 UTC; Tue 25:00-26:00 UTC")
    assert isinstance(parsed, WindowError)
    assert parsed.why.startswith("'Tue 25:00-26:00 UTC' has time range '25:00-26:00'")


def test_an_unknown_default_zone_is_an_error_of_the_span_without_a_zone() -> None:
    parsed = windows.parse("Mon 10:00-12:00", default_zone="Nowhere/Special")
    assert isinstance(parsed, WindowError)
    assert "unknown time zone 'Nowhere/Special'" in parsed.why


def _field(*examples: str) -> st.SearchStrategy[str]:
    """One field of a span: mostly a telling example, sometimes a few random characters."""
    return st.one_of(st.sampled_from(examples), st.sampled_from(examples), st.text(max_size=6))


# Spans shaped like the real thing, so that every field's checks are reached with garbage.
_SPAN_TEXT = st.tuples(
    _field("Mon", "Fri-Mon", "Sat,Sun", "daily", "Mo"),
    _field("22:00-06:00", "00:00-24:00", "00:00-00:00", "24:00-01:00", "25:00-26:00"),
    _field("", "UTC", "Europe/Berlin", "America", "Etc", "zone.tab", "../UTC", "/UTC", "a\x00b"),
).map(" ".join)
_WINDOW_TEXT = st.one_of(
    st.text(),
    st.lists(_SPAN_TEXT, min_size=1, max_size=3).map("; ".join),
)


@settings(deadline=None, max_examples=300)
@given(text=_WINDOW_TEXT, default_zone=_field("UTC", "Asia/Kolkata", "America", "No/Where"))
def test_parse_never_raises_on_any_text(text: str, default_zone: str) -> None:
    parsed = windows.parse(text, default_zone)
    assert isinstance(parsed, Window | WindowError)
    if isinstance(parsed, Window):
        now = at("2026-03-29T01:00")
        assert isinstance(parsed.is_open(now), bool)
        parsed.next_edge(now)


# ---------------------------------------------------------------------------------------------
# is_open: (window, UTC instant, open?) with the local time in a comment


SHANGHAI = "Mon-Fri 22:00-06:00 Asia/Shanghai; Sat,Sun 00:00-24:00 Asia/Shanghai"  # UTC+8

OPEN_CASES = [
    # Asia/Shanghai, no DST: weeknights and whole weekend days.
    (SHANGHAI, "2026-03-02T13:59", False),  # Mon 21:59
    (SHANGHAI, "2026-03-02T14:00", True),  # Mon 22:00
    (SHANGHAI, "2026-03-02T21:59", True),  # Tue 05:59, Monday's night
    (SHANGHAI, "2026-03-02T22:00", False),  # Tue 06:00
    (SHANGHAI, "2026-03-03T04:00", False),  # Tue 12:00
    (SHANGHAI, "2026-03-06T14:00", True),  # Fri 22:00
    (SHANGHAI, "2026-03-06T19:00", True),  # Sat 03:00, Friday's night and Saturday at once
    (SHANGHAI, "2026-03-07T04:00", True),  # Sat 12:00
    (SHANGHAI, "2026-03-08T15:59", True),  # Sun 23:59
    (SHANGHAI, "2026-03-08T16:00", False),  # Mon 00:00: Sunday ends, no night before Monday
    (SHANGHAI, "2026-03-08T21:00", False),  # Mon 05:00
    # A wrapping weekday range and an overnight span over the week's end.
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-05T12:00", False),  # Thu 12:00
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-06T12:00", True),  # Fri 12:00
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-08T16:59", True),  # Sun 16:59
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-09T12:00", True),  # Mon 12:00
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-09T17:00", False),  # Mon 17:00
    ("Fri-Mon 09:00-17:00 UTC", "2026-03-10T12:00", False),  # Tue 12:00
    ("Sun 22:00-06:00 UTC", "2026-03-09T03:00", True),  # Mon 03:00, Sunday's night
    ("Sun 22:00-06:00 UTC", "2026-03-08T03:00", False),  # Sun 03:00, Saturday had no night
    ("Mon 12:00-00:00 UTC", "2026-03-02T23:59", True),  # Mon 23:59
    ("Mon 12:00-00:00 UTC", "2026-03-03T00:00", False),  # Tue 00:00
    # Europe/Berlin springs forward on Sun 29 March at 01:00 UTC: 02:00 CET -> 03:00 CEST.
    ("Sun 02:30-04:00 Europe/Berlin", "2026-03-29T00:59:59", False),  # 01:59:59 CET
    ("Sun 02:30-04:00 Europe/Berlin", "2026-03-29T01:00", True),  # 03:00 CEST: 02:30 is skipped
    ("Sun 02:30-04:00 Europe/Berlin", "2026-03-29T01:59", True),  # 03:59 CEST
    ("Sun 02:30-04:00 Europe/Berlin", "2026-03-29T02:00", False),  # 04:00 CEST
    ("Sat 22:00-02:30 Europe/Berlin", "2026-03-28T20:59", False),  # Sat 21:59 CET
    ("Sat 22:00-02:30 Europe/Berlin", "2026-03-28T21:00", True),  # Sat 22:00 CET
    ("Sat 22:00-02:30 Europe/Berlin", "2026-03-29T00:59:59", True),  # Sun 01:59:59 CET
    ("Sat 22:00-02:30 Europe/Berlin", "2026-03-29T01:00", False),  # 03:00 CEST: ends at the jump
    ("Sun 01:00-03:00 Europe/Berlin", "2026-03-29T00:00", True),  # 01:00 CET
    ("Sun 01:00-03:00 Europe/Berlin", "2026-03-29T01:00", False),  # 03:00 CEST: one real hour
    ("Sun 02:15-02:45 Europe/Berlin", "2026-03-29T00:59", False),  # 01:59 CET
    ("Sun 02:15-02:45 Europe/Berlin", "2026-03-29T01:00", False),  # 03:00 CEST: span is empty
    ("Sun 02:15-02:45 Europe/Berlin", "2026-04-05T00:30", True),  # a week on, 02:30 CEST
    ("Sun 00:00-24:00 Europe/Berlin", "2026-03-28T22:59", False),  # Sat 23:59 CET
    ("Sun 00:00-24:00 Europe/Berlin", "2026-03-28T23:00", True),  # Sun 00:00 CET
    ("Sun 00:00-24:00 Europe/Berlin", "2026-03-29T21:59", True),  # Sun 23:59 CEST, a 23 h day
    ("Sun 00:00-24:00 Europe/Berlin", "2026-03-29T22:00", False),  # Mon 00:00 CEST
    # Europe/Berlin falls back on Sun 25 October at 01:00 UTC: 03:00 CEST -> 02:00 CET, so
    # 02:00-03:00 happens twice; a wall time in it means its first (CEST) occurrence.
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-24T22:00", True),  # Sun 00:00 CEST
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-25T00:29", True),  # 02:29 CEST
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-25T00:30", False),  # 02:30 CEST, first time
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-25T01:00", False),  # 02:00 CET, repeated
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-25T01:15", False),  # 02:15 CET: does not reopen
    ("Sun 00:00-02:30 Europe/Berlin", "2026-10-25T01:45", False),  # 02:45 CET
    ("Sun 02:30-04:00 Europe/Berlin", "2026-10-25T00:29", False),  # 02:29 CEST
    ("Sun 02:30-04:00 Europe/Berlin", "2026-10-25T00:30", True),  # 02:30 CEST, first time
    ("Sun 02:30-04:00 Europe/Berlin", "2026-10-25T01:15", True),  # 02:15 CET, inside the span
    ("Sun 02:30-04:00 Europe/Berlin", "2026-10-25T02:59", True),  # 03:59 CET
    ("Sun 02:30-04:00 Europe/Berlin", "2026-10-25T03:00", False),  # 04:00 CET
    ("Sun 00:00-24:00 Europe/Berlin", "2026-10-24T21:59", False),  # Sat 23:59 CEST
    ("Sun 00:00-24:00 Europe/Berlin", "2026-10-24T22:00", True),  # Sun 00:00 CEST
    ("Sun 00:00-24:00 Europe/Berlin", "2026-10-25T22:59", True),  # Sun 23:59 CET, a 25 h day
    ("Sun 00:00-24:00 Europe/Berlin", "2026-10-25T23:00", False),  # Mon 00:00 CET
    # America/New_York springs forward on Sun 8 March at 07:00 UTC: 02:00 EST -> 03:00 EDT.
    ("Sun 02:30-03:30 America/New_York", "2026-03-08T06:59", False),  # 01:59 EST
    ("Sun 02:30-03:30 America/New_York", "2026-03-08T07:00", True),  # 03:00 EDT: 02:30 skipped
    ("Sun 02:30-03:30 America/New_York", "2026-03-08T07:29", True),  # 03:29 EDT
    ("Sun 02:30-03:30 America/New_York", "2026-03-08T07:30", False),  # 03:30 EDT
    ("Sat 23:00-02:00 America/New_York", "2026-03-08T04:00", True),  # Sat 23:00 EST
    ("Sat 23:00-02:00 America/New_York", "2026-03-08T06:59", True),  # Sun 01:59 EST
    ("Sat 23:00-02:00 America/New_York", "2026-03-08T07:00", False),  # 03:00 EDT
    ("Sun 02:10-02:40 America/New_York", "2026-03-08T07:00", False),  # 03:00 EDT: span is empty
    ("Sun 02:10-02:40 America/New_York", "2026-03-15T06:10", True),  # a week on, 02:10 EDT
    # America/New_York falls back on Sun 1 November at 06:00 UTC: 02:00 EDT -> 01:00 EST.
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T02:00", True),  # Sat 22:00 EDT
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T05:29", True),  # Sun 01:29 EDT
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T05:30", False),  # 01:30 EDT, first time
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T06:00", False),  # 01:00 EST, repeated
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T06:29", False),  # 01:29 EST: not reopened
    ("Sat 22:00-01:30 America/New_York", "2026-11-01T06:30", False),  # 01:30 EST
    ("Sun 01:30-03:00 America/New_York", "2026-11-01T05:29", False),  # 01:29 EDT
    ("Sun 01:30-03:00 America/New_York", "2026-11-01T05:30", True),  # 01:30 EDT, first time
    ("Sun 01:30-03:00 America/New_York", "2026-11-01T06:15", True),  # 01:15 EST, inside
    ("Sun 01:30-03:00 America/New_York", "2026-11-01T07:59", True),  # 02:59 EST
    ("Sun 01:30-03:00 America/New_York", "2026-11-01T08:00", False),  # 03:00 EST
    # Australia/Adelaide (UTC+9:30, DST +10:30) falls back on Sun 5 April at 16:30 UTC on the
    # 4th (03:00 ACDT -> 02:00 ACST) and springs forward on Sun 4 October at 16:30 UTC on the 3rd
    # (02:00 ACST -> 03:00 ACDT).
    ("Sun 00:00-02:30 Australia/Adelaide", "2026-04-04T13:29", False),  # Sat 23:59 ACDT
    ("Sun 00:00-02:30 Australia/Adelaide", "2026-04-04T13:30", True),  # Sun 00:00 ACDT
    ("Sun 00:00-02:30 Australia/Adelaide", "2026-04-04T15:59", True),  # 02:29 ACDT
    ("Sun 00:00-02:30 Australia/Adelaide", "2026-04-04T16:00", False),  # 02:30 ACDT, first time
    ("Sun 00:00-02:30 Australia/Adelaide", "2026-04-04T16:45", False),  # 02:15 ACST, repeated
    ("Sun 02:30-04:00 Australia/Adelaide", "2026-10-03T16:29", False),  # 01:59 ACST
    ("Sun 02:30-04:00 Australia/Adelaide", "2026-10-03T16:30", True),  # 03:00 ACDT, 02:30 skipped
    ("Sun 02:30-04:00 Australia/Adelaide", "2026-10-03T17:29", True),  # 03:59 ACDT
    ("Sun 02:30-04:00 Australia/Adelaide", "2026-10-03T17:30", False),  # 04:00 ACDT
    ("Mon-Fri 09:00-17:00 Australia/Adelaide", "2026-05-31T23:29", False),  # Mon 08:59 ACST
    ("Mon-Fri 09:00-17:00 Australia/Adelaide", "2026-05-31T23:30", True),  # Mon 09:00 ACST
    ("Mon-Fri 09:00-17:00 Australia/Adelaide", "2026-06-01T07:29", True),  # Mon 16:59 ACST
    ("Mon-Fri 09:00-17:00 Australia/Adelaide", "2026-06-01T07:30", False),  # Mon 17:00 ACST
    # Asia/Kolkata, UTC+5:30 all year.
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-02T16:29", False),  # Mon 21:59
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-02T16:30", True),  # Mon 22:00
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-03T00:29", True),  # Tue 05:59
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-03T00:30", False),  # Tue 06:00
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-07T00:29", True),  # Sat 05:59, Friday's night
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-07T16:30", False),  # Sat 22:00
    ("Mon-Fri 22:00-06:00 Asia/Kolkata", "2026-03-01T16:30", False),  # Sun 22:00
]


@pytest.mark.parametrize(
    ("text", "instant", "expected"),
    [pytest.param(*case, id=f"{case[0]} @ {case[1]}Z") for case in OPEN_CASES],
)
def test_is_open_follows_wall_clock_spans_across_dst(
    text: str, instant: str, expected: bool
) -> None:
    assert window(text).is_open(at(instant)) is expected


@pytest.mark.parametrize(
    ("default_zone", "instant", "expected"),
    [
        pytest.param("UTC", "2026-03-02T03:30", False, id="utc: Mon 03:30"),
        pytest.param("UTC", "2026-03-02T09:00", True, id="utc: Mon 09:00"),
        pytest.param("Asia/Kolkata", "2026-03-02T03:29", False, id="kolkata: Mon 08:59"),
        pytest.param("Asia/Kolkata", "2026-03-02T03:30", True, id="kolkata: Mon 09:00"),
        pytest.param("Asia/Kolkata", "2026-03-02T11:30", False, id="kolkata: Mon 17:00"),
    ],
)
def test_a_span_without_a_zone_is_read_in_the_default_zone(
    default_zone: str, instant: str, expected: bool
) -> None:
    assert window("Mon 09:00-17:00", default_zone).is_open(at(instant)) is expected


def test_a_span_ending_at_a_repeated_time_ends_at_its_first_occurrence() -> None:
    # New York, Sun 1 November: 01:00-02:00 happens twice (05:00-06:00Z EDT, 06:00-07:00Z EST).
    ends_at_0130 = window("Sat 22:00-01:30 America/New_York")
    repeated_hour = [at("2026-11-01T06:00") + timedelta(minutes=m) for m in range(60)]
    assert not any(ends_at_0130.is_open(instant) for instant in repeated_hour)
    assert ends_at_0130.next_edge(at("2026-11-01T05:00")) == at("2026-11-01T05:30")


def test_a_span_starting_at_a_skipped_time_starts_at_the_change_itself() -> None:
    # Berlin, Sun 29 March: 02:00-03:00 CET never happens; the clocks jump at 01:00Z.
    starts_at_0230 = window("Sun 02:30-04:00 Europe/Berlin")
    assert starts_at_0230.next_edge(at("2026-03-29T00:00")) == at("2026-03-29T01:00")
    assert starts_at_0230.is_open(at("2026-03-29T01:00"))
    assert not starts_at_0230.is_open(at("2026-03-29T01:00") - timedelta(seconds=1))


# ---------------------------------------------------------------------------------------------
# next_edge


@pytest.mark.parametrize(
    ("text", "now", "edge"),
    [
        # Shanghai, UTC+8.
        pytest.param(SHANGHAI, "2026-03-02T12:00", "2026-03-02T14:00", id="Mon 20:00 -> 22:00"),
        pytest.param(
            SHANGHAI, "2026-03-02T14:00", "2026-03-02T22:00", id="at an opening -> the close"
        ),
        pytest.param(
            SHANGHAI, "2026-03-06T19:00", "2026-03-08T16:00", id="Sat 03:00 -> end of Sunday"
        ),
        pytest.param(SHANGHAI, "2026-03-08T16:00", "2026-03-09T14:00", id="Mon 00:00 -> Mon 22:00"),
        # One weekday: the next edge can be a whole week away.
        pytest.param(
            "Sun 10:00-11:00 UTC", "2026-03-02T00:00", "2026-03-08T10:00", id="six days ahead"
        ),
        pytest.param(
            "Mon 10:00-11:00 UTC", "2026-03-02T11:00", "2026-03-09T10:00", id="seven days ahead"
        ),
        pytest.param(
            "Mon 10:00-11:00 UTC", "2026-03-02T10:30", "2026-03-02T11:00", id="inside -> close"
        ),
        # DST: skipped times open and close at the change, repeated ones at the first occurrence.
        pytest.param(
            "Sun 02:30-04:00 Europe/Berlin",
            "2026-03-29T00:00",  # 01:00 CET
            "2026-03-29T01:00",  # 03:00 CEST, the jump
            id="berlin spring: open at the jump",
        ),
        pytest.param(
            "Sun 02:30-04:00 Europe/Berlin",
            "2026-03-29T01:00",  # 03:00 CEST
            "2026-03-29T02:00",  # 04:00 CEST
            id="berlin spring: close an hour later",
        ),
        pytest.param(
            "Sun 00:00-02:30 Europe/Berlin",
            "2026-10-25T00:00",  # 02:00 CEST
            "2026-10-25T00:30",  # 02:30 CEST, first time
            id="berlin fall: close at the first 02:30",
        ),
        pytest.param(
            "Sun 00:00-02:30 Europe/Berlin",
            "2026-10-25T00:30",  # 02:30 CEST
            "2026-10-31T23:00",  # Sun 1 November 00:00 CET
            id="berlin fall: nothing in the repeated hour",
        ),
        pytest.param(
            "Sat 22:00-01:30 America/New_York",
            "2026-11-01T05:30",  # 01:30 EDT
            "2026-11-08T03:00",  # Sat 7 November 22:00 EST
            id="new york fall: nothing in the repeated hour",
        ),
        pytest.param(
            "Sat 23:00-02:00 America/New_York",
            "2026-03-08T05:00",  # Sun 00:00 EST
            "2026-03-08T07:00",  # 03:00 EDT, the jump
            id="new york spring: close at the jump",
        ),
        pytest.param(
            "Mon-Fri 22:00-06:00 Asia/Kolkata",
            "2026-03-02T12:00",  # Mon 17:30
            "2026-03-02T16:30",  # Mon 22:00
            id="kolkata: half-hour offset",
        ),
    ],
)
def test_next_edge_is_the_next_opening_or_closing(text: str, now: str, edge: str) -> None:
    assert window(text).next_edge(at(now)) == at(edge)


@pytest.mark.parametrize(
    ("text", "now", "edge"),
    [
        pytest.param(
            "Sat 00:00-24:00 UTC; Sun 00:00-24:00 UTC",
            "2026-03-07T12:00",  # Sat 12:00
            "2026-03-09T00:00",  # Mon 00:00, not Sun 00:00 where one span hands over
            id="touching spans",
        ),
        pytest.param(
            "Fri 22:00-06:00 UTC; Sat 00:00-24:00 UTC",
            "2026-03-06T23:00",  # Fri 23:00
            "2026-03-08T00:00",  # Sun 00:00, not Sat 00:00 or Sat 06:00
            id="overlapping spans",
        ),
        pytest.param(
            "Sun 02:10-02:40 America/New_York",
            "2026-03-08T06:00",  # 01:00 EST, before the spring jump empties the span
            "2026-03-15T06:10",  # a week on, 02:10 EDT
            id="a span emptied by a DST jump",
        ),
    ],
)
def test_next_edge_skips_instants_at_which_nothing_changes(text: str, now: str, edge: str) -> None:
    assert window(text).next_edge(at(now)) == at(edge)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("daily 00:00-24:00 UTC", id="every whole day"),
        pytest.param("Mon-Fri 00:00-24:00 Asia/Shanghai; Sat,Sun 00:00-24:00 Asia/Shanghai"),
        pytest.param("daily 00:00-24:00 Europe/Berlin", id="every whole day across DST"),
    ],
)
def test_a_window_open_all_week_has_no_next_edge(text: str) -> None:
    for now in (at("2026-03-02T12:00"), at("2026-03-28T23:30"), at("2026-10-24T23:30")):
        assert window(text).is_open(now)
        assert window(text).next_edge(now) is None


_EDGE_WINDOWS = [
    SHANGHAI,
    "Fri-Mon 09:00-17:00 UTC",
    "Sun 02:30-04:00 Europe/Berlin; Sat 22:00-01:30 America/New_York",
    "Sun 00:00-02:30 Europe/Berlin; Sun 01:30-03:00 America/New_York",
    "daily 02:30-02:15 Australia/Adelaide",
    "Mon-Fri 22:00-06:00 Asia/Kolkata",
]


@settings(deadline=None)
@given(
    text=st.sampled_from(_EDGE_WINDOWS),
    now=st.datetimes(
        min_value=datetime(2026, 1, 1),  # noqa: DTZ001  # st.datetimes refuses aware bounds; timezones= sets UTC
        max_value=datetime(2026, 12, 31),  # noqa: DTZ001  # st.datetimes refuses aware bounds; timezones= sets UTC
        timezones=st.just(UTC),
    ),
)
def test_the_window_changes_at_its_next_edge_and_not_before(text: str, now: datetime) -> None:
    parsed = window(text)
    edge = parsed.next_edge(now)
    assert edge is not None
    assert now < edge <= now + timedelta(days=8)
    opened = parsed.is_open(now)
    for instant in (now + (edge - now) / 2, edge - timedelta(microseconds=1)):
        assert parsed.is_open(instant) is opened
    assert parsed.is_open(edge) is not opened
