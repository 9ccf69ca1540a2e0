"""Operator overrides: annotations parsed into Overrides and Problems; garbage never raises."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import nodestate, overrides, windows
from rebalancer.core.overrides import LendMode, Overrides, Parsed, Problem

KEYS = nodestate.Keys()
P = KEYS.prefix  # "rebalancer.io/"
# A Monday at noon UTC.
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def parse(annotations: Mapping[str, str], default_zone: str = "UTC") -> Parsed:
    return overrides.parse(annotations, KEYS, default_zone)


# ---------------------------------------------------------------------------------------------
# Good values


def test_a_node_without_overrides_has_the_defaults_and_no_problems() -> None:
    parsed = parse({"unrelated": "x", "other.io/lend": "now", P + "state": "lent"})
    assert parsed == Parsed(overrides.NONE, ())
    assert parsed.overrides == Overrides(
        window=None, lend=LendMode.AUTO, reclaim_now=False, paused=False, until=None
    )


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({P + "lend": "never"}, Overrides(lend=LendMode.NEVER), id="lend never"),
        pytest.param({P + "lend": "auto"}, Overrides(lend=LendMode.AUTO), id="lend auto"),
        pytest.param({P + "lend": "now"}, Overrides(lend=LendMode.NOW), id="lend now"),
        pytest.param({P + "lend": " NOW\n"}, Overrides(lend=LendMode.NOW), id="lend any case"),
        pytest.param({P + "reclaim": "now"}, Overrides(reclaim_now=True), id="reclaim now"),
        pytest.param({P + "reclaim": "Now "}, Overrides(reclaim_now=True), id="reclaim any case"),
        pytest.param({P + "paused": "true"}, Overrides(paused=True), id="paused"),
        pytest.param({P + "paused": "TRUE"}, Overrides(paused=True), id="paused any case"),
        pytest.param({P + "paused": "false"}, Overrides(paused=False), id="not paused"),
        pytest.param(
            {P + "override-until": "2026-03-02T18:00:00Z"},
            Overrides(until=datetime(2026, 3, 2, 18, tzinfo=UTC)),
            id="until in UTC",
        ),
        pytest.param(
            {P + "override-until": "2026-03-02T20:00:00+02:00"},
            Overrides(until=datetime(2026, 3, 2, 18, tzinfo=UTC)),
            id="until with an offset",
        ),
        pytest.param(
            {P + "lend": "never", P + "paused": "true", P + "override-until": "2026-03-03T00:00Z"},
            Overrides(lend=LendMode.NEVER, paused=True, until=datetime(2026, 3, 3, tzinfo=UTC)),
            id="several at once",
        ),
    ],
)
def test_good_values_are_parsed_without_problems(
    annotations: Mapping[str, str], expected: Overrides
) -> None:
    assert parse(annotations) == Parsed(expected, ())


def test_a_window_override_is_parsed_in_the_default_zone() -> None:
    parsed = parse({P + "window": "Mon 09:00-17:00"}, default_zone="Asia/Kolkata")
    assert parsed.problems == ()
    window = parsed.overrides.window
    assert isinstance(window, windows.Window)
    assert str(window) == "Mon 09:00-17:00"
    assert not window.is_open(datetime(2026, 3, 2, 3, 29, tzinfo=UTC))  # Mon 08:59 IST
    assert window.is_open(datetime(2026, 3, 2, 3, 30, tzinfo=UTC))  # Mon 09:00 IST


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("always", windows.ALWAYS, id="always"),
        pytest.param("never", windows.NEVER, id="never"),
    ],
)
def test_always_and_never_are_window_overrides_too(text: str, expected: windows.Window) -> None:
    assert parse({P + "window": text}) == Parsed(Overrides(window=expected), ())


# ---------------------------------------------------------------------------------------------
# Bad values: ignored, each reported as a Problem naming key, value and why


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        pytest.param("window", "Mon 25:00-26:00", "times are HH:MM", id="window: bad time"),
        pytest.param("window", "", "is empty", id="window: empty"),
        pytest.param("window", "Mon 10:00-12:00 Mars/Olympus", "unknown time zone", id="zone"),
        pytest.param("window", "Mon 10:00-12:00 America", "unknown time zone", id="zone dir"),
        pytest.param("lend", "sometimes", "must be never, auto or now", id="lend: a word"),
        pytest.param("lend", "", "must be never, auto or now", id="lend: empty"),
        pytest.param("lend", "true", "must be never, auto or now", id="lend: a boolean"),
        pytest.param("reclaim", "later", "must be now", id="reclaim: a word"),
        pytest.param("reclaim", "true", "must be now", id="reclaim: a boolean"),
        pytest.param("reclaim", "", "must be now", id="reclaim: empty"),
        pytest.param("paused", "yes", "must be true or false", id="paused: yes"),
        pytest.param("paused", "1", "must be true or false", id="paused: one"),
        pytest.param("paused", "", "must be true or false", id="paused: empty"),
    ],
)
def test_a_bad_value_is_ignored_and_reported(key: str, value: str, why: str) -> None:
    parsed = parse({P + key: value})
    assert parsed.overrides == overrides.NONE
    (problem,) = parsed.problems
    assert (problem.key, problem.value) == (P + key, value)
    assert why in problem.why
    assert str(problem).startswith(f"{P}{key}={value!r} is ignored: ")


def test_a_bad_value_leaves_the_good_ones_standing() -> None:
    parsed = parse({P + "lend": "never", P + "paused": "maybe", P + "window": "Mon"})
    assert parsed.overrides == Overrides(lend=LendMode.NEVER)
    assert sorted(p.key for p in parsed.problems) == [P + "paused", P + "window"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("tomorrow", "not an RFC 3339 time", id="a word"),
        pytest.param("", "not an RFC 3339 time", id="empty"),
        pytest.param("2026-03-02T18:00:00", "has no time zone", id="no zone"),
        pytest.param("2026-03-02", "has no time zone", id="a date"),
        pytest.param("2026-13-02T18:00:00Z", "not an RFC 3339 time", id="month 13"),
        pytest.param("9999-12-31T23:59:59-23:59", "out of the representable range", id="too late"),
        pytest.param("0001-01-01T00:00:00+01:00", "out of the representable range", id="too early"),
    ],
)
def test_an_unreadable_override_until_makes_all_overrides_ignored(value: str, why: str) -> None:
    parsed = parse(
        {
            P + "window": "never",
            P + "lend": "never",
            P + "reclaim": "now",
            P + "paused": "true",
            P + "override-until": value,
        }
    )
    assert parsed.overrides == overrides.NONE
    (problem,) = parsed.problems
    assert (problem.key, problem.value) == (P + "override-until", value)
    assert why in problem.why
    assert "the overrides on this node are ignored until it is fixed" in problem.why


def test_an_unreadable_override_until_still_reports_the_other_bad_values() -> None:
    parsed = parse({P + "lend": "soon", P + "override-until": "whenever"})
    assert parsed.overrides == overrides.NONE
    assert sorted(p.key for p in parsed.problems) == [P + "lend", P + "override-until"]


def test_reclaim_now_wins_over_lend_now_and_the_lend_is_reported() -> None:
    parsed = parse({P + "lend": "now", P + "reclaim": "now"})
    assert parsed.overrides == Overrides(lend=LendMode.AUTO, reclaim_now=True)
    assert parsed.problems == (
        Problem(P + "lend", "now", f"contradicts {P}reclaim=now, which wins"),
    )


@pytest.mark.parametrize(
    "lend",
    [pytest.param(LendMode.NEVER, id="never"), pytest.param(LendMode.AUTO, id="auto")],
)
def test_reclaim_now_agrees_with_any_lend_but_now(lend: LendMode) -> None:
    parsed = parse({P + "lend": lend.value, P + "reclaim": "now"})
    assert parsed == Parsed(Overrides(lend=lend, reclaim_now=True), ())


# ---------------------------------------------------------------------------------------------
# Expiry


UNTIL = datetime(2026, 3, 2, 18, 0, tzinfo=UTC)
SET = Overrides(lend=LendMode.NEVER, paused=True, until=UNTIL)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param(UNTIL - timedelta(hours=6), SET, id="hours before"),
        pytest.param(UNTIL - timedelta(microseconds=1), SET, id="just before"),
        pytest.param(UNTIL, overrides.NONE, id="at the expiry"),
        pytest.param(UNTIL + timedelta(days=30), overrides.NONE, id="long after"),
    ],
)
def test_every_override_lapses_at_override_until(now: datetime, expected: Overrides) -> None:
    parsed = parse(
        {P + "lend": "never", P + "paused": "true", P + "override-until": "2026-03-02T18:00:00Z"}
    )
    assert parsed.overrides == SET
    assert parsed.overrides.active(now) == expected


def test_overrides_without_an_expiry_never_lapse() -> None:
    parsed = parse({P + "reclaim": "now"})
    assert parsed.overrides.active(datetime(2099, 1, 1, tzinfo=UTC)) == Overrides(reclaim_now=True)


def test_an_expiry_in_the_past_parses_and_is_simply_inactive() -> None:
    parsed = parse({P + "lend": "now", P + "override-until": "2026-03-01T00:00:00Z"})
    assert parsed.problems == ()
    assert parsed.overrides.active(NOW) == overrides.NONE


# ---------------------------------------------------------------------------------------------
# Key prefix and caching


def test_a_custom_prefix_reads_only_its_own_keys() -> None:
    custom = nodestate.Keys(prefix="example.com/")
    annotations = {
        "example.com/lend": "never",
        "example.com/paused": "true",
        "rebalancer.io/reclaim": "now",
        "rebalancer.io/lend": "garbage",
    }
    assert overrides.parse(annotations, custom) == Parsed(
        Overrides(lend=LendMode.NEVER, paused=True), ()
    )
    assert overrides.parse(annotations, KEYS) == Parsed(
        Overrides(reclaim_now=True),
        (Problem(P + "lend", "garbage", "must be never, auto or now"),),
    )


def test_a_problem_under_a_custom_prefix_names_the_custom_key() -> None:
    custom = nodestate.Keys(prefix="example.com/")
    parsed = overrides.parse({"example.com/lend": "now", "example.com/reclaim": "now"}, custom)
    assert parsed.problems == (
        Problem("example.com/lend", "now", "contradicts example.com/reclaim=now, which wins"),
    )


def test_the_same_annotations_parse_to_the_same_value() -> None:
    first = parse({P + "lend": "never", "other": "1"})
    assert parse({"other": "2", P + "lend": "never"}) is first


def test_the_default_zone_is_part_of_the_cache_key() -> None:
    annotations = {P + "window": "Mon 09:00-17:00"}
    in_utc, in_kolkata = parse(annotations, "UTC"), parse(annotations, "Asia/Kolkata")
    monday_0330 = datetime(2026, 3, 2, 3, 30, tzinfo=UTC)
    assert in_utc.overrides.window is not None
    assert in_kolkata.overrides.window is not None
    assert not in_utc.overrides.window.is_open(monday_0330)
    assert in_kolkata.overrides.window.is_open(monday_0330)


# ---------------------------------------------------------------------------------------------
# Garbage never raises


_VALUE_FRAGMENTS = st.sampled_from(
    [
        "now", "never", "auto", "true", "false", "Mon-Fri", "22:00-06:00", "24:00", " ", ";",
        "Asia/Shanghai", "America", "Etc", "2026-03-02T18:00:00", "Z", "+01:00", "-23:59",
        "9999-12-31T23:59:59", "0001-01-01T00:00:00", "\x00",
    ]
)  # fmt: skip
_VALUES = st.one_of(
    st.text(),
    st.lists(st.one_of(_VALUE_FRAGMENTS, st.text(max_size=3)), max_size=6).map("".join),
)
# Well-formed times with any offset, often on the first or last representable day: those
# overflow once converted to UTC.
_WHEN = st.one_of(
    st.datetimes(),
    st.datetimes(max_value=datetime(1, 1, 1, 23, 59)),  # noqa: DTZ001  # st.datetimes bounds must be naive; _OFFSET adds the zone
    st.datetimes(min_value=datetime(9999, 12, 31)),  # noqa: DTZ001  # st.datetimes bounds must be naive; _OFFSET adds the zone
)
_OFFSET = st.timedeltas(
    min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
)
_TIMES = st.builds(
    lambda when, offset: when.replace(tzinfo=timezone(offset)).isoformat(), _WHEN, _OFFSET
)
_STRATEGIES = {
    "window": _VALUES,
    "lend": _VALUES,
    "reclaim": _VALUES,
    "paused": _VALUES,
    "override-until": st.one_of(_VALUES, _TIMES),
}


@settings(deadline=None, max_examples=300)
@given(
    values=st.fixed_dictionaries(
        {}, optional={P + key: values for key, values in _STRATEGIES.items()}
    ),
    zone=st.sampled_from(["UTC", "Asia/Kolkata", "No/Such_Zone", "America"]),
)
def test_parse_never_raises_on_any_annotation_text(values: dict[str, str], zone: str) -> None:
    parsed = parse(values, zone)
    assert isinstance(parsed, Parsed)
    assert isinstance(parsed.overrides, Overrides)
    for problem in parsed.problems:
        assert isinstance(problem, Problem)
        assert problem.value == values[problem.key]
        assert problem.why
    if any(p.key == P + "override-until" for p in parsed.problems):
        assert parsed.overrides == overrides.NONE
    assert not (parsed.overrides.reclaim_now and parsed.overrides.lend is LendMode.NOW)
