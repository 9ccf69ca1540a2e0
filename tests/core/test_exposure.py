"""The cover of an error budget: the largest jump of demand within one loan's risk, judged on
the pool's own history (``core.exposure``)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from rebalancer.core import exposure, model

T0 = datetime(2026, 3, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
DAY = 24 * 60
FOUR = tuple(timedelta(minutes=m) for m in (10, 30, 60, 120))
SHAPE = exposure.Shape(risk=timedelta(minutes=8), floor=5.0, windows=FOUR, stretch=0.0)


def history(
    values: list[float | None], end: int | None = None, start: int = 0
) -> model.DemandHistory:
    """The minutes ``start`` to ``end`` of ``values``, as a history that starts at minute
    ``start``."""
    end = len(values) if end is None else end
    return model.DemandHistory(
        start=T0 + MINUTE * start, step=MINUTE, values=values[start:end], end_index=end - start
    )


def ratios(cover: model.Cover | None) -> dict[int, float]:
    assert cover is not None
    return {int(j.window / MINUTE): j.seen for j in cover.jumps}


def test_a_history_shorter_than_a_day_covers_nothing_yet() -> None:
    values: list[float | None] = [10.0] * (DAY - 10)

    assert exposure.Jumps(SHAPE).cover(history(values)) is None


def test_a_jump_within_a_loans_risk_sets_each_windows_ratio() -> None:
    # A day at 10 rps, then 30 rps for a minute at 12:00 of the second day, then 10 again.
    values: list[float | None] = [10.0] * (2 * DAY)
    values[DAY + 720] = 30.0

    cover = exposure.Jumps(SHAPE).cover(history(values))

    assert ratios(cover) == {10: 3.0, 30: 3.0, 60: 3.0, 120: 3.0}
    assert cover is not None
    found = cover.demand()
    assert found is not None
    # The 10-minute peak is 10 rps again: it covers 30 rps, as does every window past the jump.
    assert found[0] == pytest.approx(30.0)
    # Within 120 minutes of the jump the 120-minute window still holds it: 30 x 3.
    after = exposure.Jumps(SHAPE).cover(history(values, end=DAY + 780))
    assert after is not None
    found_after = after.demand()
    assert found_after is not None
    assert found_after[0] == pytest.approx(30.0)
    assert found_after[1] is after.jumps[0]
    assert [j.peak for j in after.jumps] == [10.0, 10.0, 30.0, 30.0]


def test_a_ramp_is_judged_at_the_minute_it_starts() -> None:
    # Up by 1 rps a minute for two hours after a day flat at 10 rps: every window's peak is the
    # newest minute, and the largest jump is the first: 8 minutes reach 18 over a peak of 10.
    values: list[float | None] = [10.0] * DAY
    values += [10.0 + i for i in range(1, 121)]

    found = ratios(exposure.Jumps(SHAPE).cover(history(values)))

    assert found == pytest.approx({10: 1.8, 30: 1.8, 60: 1.8, 120: 1.8})


def test_jumps_the_minimum_serving_nodes_carry_teach_nothing() -> None:
    values: list[float | None] = [1.0] * (2 * DAY)
    values[DAY] = 4.0  # four times the peak, yet below the floor of 5 rps

    assert set(ratios(exposure.Jumps(SHAPE).cover(history(values))).values()) == {1.0}


def test_a_stretch_of_zeros_is_no_level_to_jump_from() -> None:
    values: list[float | None] = [10.0] * (2 * DAY)
    values[DAY : DAY + 60] = [0.0] * 60  # an hour of exact zeros, then back to 10

    found = ratios(exposure.Jumps(SHAPE).cover(history(values)))

    # The return is judged against the level the service left: no jump at all.
    assert found == {10: 1.0, 30: 1.0, 60: 1.0, 120: 1.0}


def test_a_jump_after_zeros_is_judged_against_the_level_before_them() -> None:
    values: list[float | None] = [10.0] * (2 * DAY)
    values[DAY : DAY + 60] = [0.0] * 60
    values[DAY + 60 : DAY + 70] = [25.0] * 10  # back at two and a half times the level left

    found = ratios(exposure.Jumps(SHAPE).cover(history(values)))

    assert found == pytest.approx({10: 2.5, 30: 2.5, 60: 2.5, 120: 2.5})


def test_during_zeros_each_window_keeps_the_peak_of_the_traffic_it_left() -> None:
    values: list[float | None] = [10.0] * (2 * DAY)
    values[2 * DAY - 320 : 2 * DAY - 315] = [20.0] * 5  # five minutes at 20, then 10 for 75
    values[2 * DAY - 240 :] = [0.0] * 240  # then four hours of exact zeros

    cover = exposure.Jumps(SHAPE).cover(history(values))

    assert cover is not None
    # The last 10, 30 and 60 minutes with traffic were at 10; the last 120 held the 20.
    assert [j.peak for j in cover.jumps] == [10.0, 10.0, 10.0, 20.0]


def test_a_day_is_judged_from_the_first_traffic() -> None:
    values: list[float | None] = [0.0] * (2 * DAY)
    values[DAY + 60 :] = [10.0] * (DAY - 60)  # a service that starts in the second day

    assert exposure.Jumps(SHAPE).cover(history(values)) is None
    values += [10.0] * 120
    cover = exposure.Jumps(SHAPE).cover(history(values))
    assert cover is not None
    assert set(ratios(cover).values()) == {1.0}  # its start was no jump from a level


def test_a_jump_leaves_the_cover_once_it_is_older_than_the_span() -> None:
    shape = exposure.Shape(
        risk=timedelta(minutes=8), floor=5.0, windows=FOUR, span=timedelta(days=2)
    )
    values: list[float | None] = [10.0] * (4 * DAY)
    values[DAY] = 20.0

    assert ratios(exposure.Jumps(shape).cover(history(values, end=2 * DAY)))[10] == 2.0
    assert ratios(exposure.Jumps(shape).cover(history(values)))[10] == 1.0


def test_gaps_are_no_demand_and_no_jump() -> None:
    values: list[float | None] = [10.0] * (2 * DAY)
    values[DAY : DAY + 30] = [None] * 30

    assert set(ratios(exposure.Jumps(SHAPE).cover(history(values))).values()) == {1.0}


def noisy(days: int, seed: int) -> list[float | None]:
    rng = random.Random(seed)
    out: list[float | None] = []
    for t in range(days * DAY):
        level = 50 + 40 * math.sin(2 * math.pi * t / DAY)
        jump = rng.random() < 0.002
        out.append(None if rng.random() < 0.01 else level * (rng.uniform(1.5, 3) if jump else 1))
    return out


def test_one_minute_at_a_time_judges_as_the_whole_history_at_once() -> None:
    values = noisy(3, seed=1)
    stepped = exposure.Jumps(SHAPE)
    for end in range(DAY, len(values) + 1, 7):
        stepped.cover(history(values, end=end))

    assert stepped.cover(history(values)) == exposure.Jumps(SHAPE).cover(history(values))


def test_a_new_history_that_slides_forward_continues_where_the_last_ended() -> None:
    # The controller reads a new history every few minutes, its start moving with it.
    values = noisy(4, seed=2)
    shape = exposure.Shape(
        risk=timedelta(minutes=8), floor=5.0, windows=FOUR, span=timedelta(days=2)
    )
    sliding = exposure.Jumps(shape)
    for end in range(2 * DAY, len(values) + 1, 5):
        sliding.cover(
            history(values, end=end, start=end - int(2.5 * DAY) if end > 2.5 * DAY else 0)
        )

    fresh = exposure.Jumps(shape).cover(history(values))
    assert sliding.cover(history(values, start=len(values) - 3 * DAY)) == fresh


def test_a_step_back_in_time_judges_again_from_that_history() -> None:
    values = noisy(3, seed=3)
    jumps = exposure.Jumps(SHAPE)
    jumps.cover(history(values))

    earlier = history(values, end=2 * DAY)
    assert jumps.cover(earlier) == exposure.Jumps(SHAPE).cover(earlier)


def test_a_return_to_the_level_of_this_hour_on_the_last_days_is_covered() -> None:
    # Three days at 60 rps from 16:00 to 24:00 and 20 rps before; the fourth day stays at 20
    # until 16:00 (a holiday): the ratio says 1, the days before say 60.
    values: list[float | None] = []
    for _ in range(4):
        values += [20.0] * (16 * 60) + [60.0] * (8 * 60)
    end = 3 * DAY + 16 * 60 - 1

    cover = exposure.Jumps(SHAPE).cover(history(values, end=end))

    assert cover is not None
    assert cover.usual == 60.0
    found = cover.demand()
    assert found is not None
    assert found[0] == 60.0


def test_the_default_window_is_two_hours() -> None:
    assert (timedelta(minutes=120),) == exposure.WINDOWS


def test_the_cover_takes_the_largest_jump_a_tenth_larger_in_log_terms() -> None:
    values: list[float | None] = [10.0] * (2 * DAY)
    values[DAY + 720] = 30.0
    shape = exposure.Shape(risk=timedelta(minutes=8), floor=5.0)

    cover = exposure.Jumps(shape).cover(history(values))

    assert cover is not None
    (jump,) = cover.jumps
    assert jump.seen == 3.0
    assert jump.ratio == pytest.approx(3.0**1.1)


def weekdays_and_a_quiet_weekend(
    weeks: int, quiet: float, seed: int, growth: float = 1.0
) -> list[float | None]:
    """A diurnal service with some noise, ``growth`` times busier every week, whose Saturday and
    Sunday, and Monday until 08:00, run at ``quiet`` of the usual level: every Monday morning
    is a return of 1 / ``quiet``."""
    rng = random.Random(seed)
    out: list[float | None] = []
    for t in range(weeks * 7 * DAY):
        day, minute = divmod(t, DAY)
        level = 60 + 30 * math.sin(2 * math.pi * (minute - 6 * 60) / DAY)
        level *= rng.uniform(0.97, 1.03) * growth ** (t / (7 * DAY))
        weekend = day % 7 in (5, 6) or (day % 7 == 0 and day > 0 and minute < 8 * 60)
        out.append(level * quiet if weekend else level)
    return out


@pytest.mark.parametrize(("seed", "quiet", "growth"), [(0, 0.05, 1.0), (1, 0.3, 1.2)])
def test_in_hindsight_the_cover_rides_out_every_jump_of_its_span(
    seed: int, quiet: float, growth: float
) -> None:
    # What a cover promises: warm nodes carrying the larger of a minute's peak times the span's
    # largest jump and that minute's level on the last days would have ridden out every jump
    # the span holds (here a Monday morning's return from a quiet weekend among them). A rule
    # that leaves a jump out of the ratio must keep this.
    values = weekdays_and_a_quiet_weekend(weeks=2, quiet=quiet, seed=seed, growth=growth)
    shape = exposure.Shape(risk=timedelta(minutes=8), floor=5.0, span=timedelta(days=2))
    jumps = exposure.Jumps(shape)
    start = 6 * DAY  # Sunday to Tuesday: the span holds the Monday morning's return
    seen: list[tuple[float | None, float | None]] = []
    for end in range(start, start + 2 * DAY):
        cover = jumps.cover(history(values, end=end))
        assert cover is not None
        seen.append((cover.jumps[0].peak, cover.usual))
    final = jumps.cover(history(values, end=start + 2 * DAY))
    assert final is not None
    largest = final.jumps[0].seen
    for i, (peak, usual) in enumerate(seen[:-8]):
        coming = max(v for v in values[start + i : start + i + 8] if v is not None)
        if coming <= shape.floor or peak is None:
            continue
        assert max(peak * largest, usual or 0.0) >= coming - 1e-9, start + i


def test_a_return_the_last_days_carried_at_that_hour_still_sets_the_ratio() -> None:
    # Monday 07:50 of the second week returns to 8 times the weekend's level and stays there,
    # below what every weekday of the week before brought at that hour: the days alone would
    # have ridden it out, and it still sets the ratio. Left out, the cover rested on the
    # weekdays' jumps alone, and on a weekend twist of m-small a covered loan breached on the
    # Wednesday after (docs/design/budget.md, "What the rule gives up").
    values = weekdays_and_a_quiet_weekend(weeks=2, quiet=0.05, seed=5)
    values[7 * DAY + 470 : 8 * DAY] = [30.0] * (DAY - 470)
    shape = exposure.Shape(risk=timedelta(minutes=8), floor=5.0, stretch=0.0)

    cover = exposure.Jumps(shape).cover(history(values, end=8 * DAY))

    assert cover is not None
    assert cover.usual is not None
    assert cover.usual > 30.0
    assert cover.jumps[0].seen > 5
