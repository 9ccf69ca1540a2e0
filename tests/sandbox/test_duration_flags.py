"""``rebalancer demo`` and ``rebalancer sandbox`` take their duration flags as every flag takes
one (``90s``, ``5m``, ``2h``, with its unit); a bare number is refused, as everywhere.

Their own parsers read bare numbers; ``sandbox.cli.in_units`` turns the duration into that
number on the way in. Read back here through the demo's own parser, and, for the emulator
(which serves until interrupted), through its parser's refusal of the flag after it: a value it
could not read would be refused first.
"""

from __future__ import annotations

import pytest

from rebalancer import cli
from sandbox import cli as harness
from sandbox import demo

BARE = "a bare number has no unit; write a duration with its unit, such as 30s, 5m or 1h30m"


@pytest.mark.parametrize(
    ("argv", "hours", "start", "speed", "pace"),
    [
        (["--hours", "90m", "--start=2h", "--speed", "1h", "--pace", "1m"], 1.5, 2.0, 60, 60.0),
        (["--hours", "3h", "--start", "30m", "--speed", "5m", "--pace", "0"], 3.0, 0.5, 5, 0.0),
        (["--hour", "30m", "--spe", "2m", "--pace=90s"], 0.5, 0.0, 2, 90.0),  # abbreviated
    ],
)
def test_the_demo_reads_durations_in_the_unit_each_flag_names(
    argv: list[str], hours: float, start: float, speed: int, pace: float
) -> None:
    options = demo.parse(harness.in_units(argv, harness.DEMO_DURATIONS))
    assert (options.hours, options.start, options.speed, options.pace) == (
        hours,
        start,
        speed,
        pace,
    )


def test_values_of_other_flags_and_after_a_double_dash_are_left_alone() -> None:
    argv = ["--strategy", "5m", "--report", "2h", "--", "--hours", "5m"]
    assert harness.in_units(argv, harness.DEMO_DURATIONS) == argv


@pytest.mark.parametrize(
    ("command", "argv", "line"),
    [
        ("demo", ["--hours", "5x"], "--hours='5x': write a duration such as 90s, 15m or 2h"),
        ("demo", ["--hours", "3"], f"--hours='3': {BARE}"),
        ("demo", ["--pace=30"], f"--pace='30': {BARE}"),
        ("demo", ["--speed", "90s"], "--speed='90s': must be whole minutes"),
        (
            "sandbox",
            ["--schedule-every=2x"],
            "--schedule-every='2x': write a duration such as 90s, 15m or 2h",
        ),
        ("sandbox", ["--schedule-every", "0.5"], f"--schedule-every='0.5': {BARE}"),
    ],
)
def test_a_bad_duration_is_one_line_and_exit_status_two(
    capsys: pytest.CaptureFixture[str], command: str, argv: list[str], line: str
) -> None:
    assert cli.main([command, *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"rebalancer: {line}"]


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("sandbox", ["--schedule-every", "2m", "--seed", "x"]),
        ("sandbox", ["--schedule-every", "0.5s", "--seed", "x"]),
        ("demo", ["--hours", "90m", "--pace", "1m", "--speed", "1h", "--strategy", "x"]),
    ],
)
def test_a_duration_reaches_the_commands_own_parser_as_a_number_it_reads(
    capsys: pytest.CaptureFixture[str], command: str, argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main([command, *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    wrong = argv[-2]  # the last flag, given a value its parser refuses; nothing before it
    assert f"argument {wrong}" in err, err
    assert err.count("invalid") == 1, err
