"""The reconcile loop: when it runs (pure functions), and a real AsyncIOScheduler with an interval
of an hour, so every run the tests see is the first one or one a wake-up asked for. Nothing
sleeps: the tests wait, bounded, on events the step sets."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime, timedelta

import pytest

from rebalancer.runtime.loop import (
    SETTLE,
    Edges,
    JsonFormatter,
    ReconcileLoop,
    debounced,
    edge_wake,
    serve,
)

T = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("now", "due", "expected"),
    [
        (T, None, T + 2 * S),  # nothing scheduled: run after the delay
        (T, T + HOUR, T + 2 * S),  # the interval run is far: wake early
        (T, T + S, T + S),  # a run is due sooner: it serves the wake-up
        (T + S, T + 2 * S, T + 2 * S),  # the burst's first wake-up set it: later ones keep it
        (T + 3 * S, T + 2 * S, T + 2 * S),  # overdue (running now): no second run is added
    ],
)
def test_debounced_keeps_the_earliest_run(
    now: datetime, due: datetime | None, expected: datetime
) -> None:
    assert debounced(now, due, 2 * S) == expected


def test_a_burst_of_wake_ups_as_a_pure_function_collapses_into_one_run_time() -> None:
    due: datetime | None = T + HOUR
    for i in range(50):  # fifty changes within a second
        due = debounced(T + timedelta(milliseconds=20 * i), due, 2 * S)
    assert due == T + 2 * S


@pytest.mark.parametrize(
    ("due", "edge", "expected"),
    [
        (T + HOUR, T + 10 * S, T + 10 * S + SETTLE),  # the edge comes first
        (T + 5 * S, T + 10 * S, None),  # the scheduled run comes first
        (T + HOUR, None, None),  # no window edge
        (None, T + 10 * S, T + 10 * S + SETTLE),
    ],
)
def test_edge_wake(due: datetime | None, edge: datetime | None, expected: datetime | None) -> None:
    assert edge_wake(due, edge) == expected


class Step:
    """A step that counts runs, tracks concurrency, and can be held open."""

    def __init__(self, held: bool = False) -> None:
        self.runs = 0
        self.active = 0
        self.max_active = 0
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.started = asyncio.Event()
        self.finished = asyncio.Event()
        self.done = 0

    async def __call__(self) -> None:
        self.runs += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.started.set()
        try:
            await self.release.wait()
        finally:
            self.active -= 1
            self.done += 1
            self.finished.set()

    async def until_done(self, n: int) -> None:
        async with asyncio.timeout(2):
            while self.done < n:
                self.finished.clear()
                await self.finished.wait()


def loop_for(step: Step, edges: Edges = lambda _now: None) -> ReconcileLoop:
    return ReconcileLoop(step, interval=HOUR, debounce=timedelta(milliseconds=10), edges=edges)


async def test_runs_never_overlap_and_wake_ups_during_a_run_become_one_more_run() -> None:
    step = Step(held=True)
    loop = loop_for(step)
    loop.start()
    try:
        async with asyncio.timeout(2):
            await step.started.wait()
        for _ in range(5):
            loop.wake("a change during the run")
        # Ask APScheduler itself for a second instance now: max_instances=1 refuses it.
        loop.scheduler.modify_job("reconcile", next_run_time=datetime.now(UTC))
        await asyncio.sleep(0.05)  # let the scheduler try (a bounded, short real wait)
        assert step.runs == 1
        step.release.set()
        await step.until_done(2)
        assert step.max_active == 1
        assert step.runs == 2  # five wake-ups during the run: one run after it
        due = loop.due()
        assert due is not None
        assert due > datetime.now(UTC) + timedelta(minutes=30)  # then the interval again
    finally:
        await loop.stop()


async def test_a_burst_of_wake_ups_collapses_into_one_run() -> None:
    step = Step()
    loop = loop_for(step)
    loop.start()
    try:
        await step.until_done(1)
        for i in range(20):
            loop.wake(f"node inference-{i % 4}: pod landed")
        await step.until_done(2)
        assert step.runs == 2
        due = loop.due()
        assert due is not None
        assert due > datetime.now(UTC) + timedelta(minutes=30)  # no third run is pending
    finally:
        await loop.stop()


async def test_a_window_edge_moves_the_next_run_to_just_after_it() -> None:
    step = Step()
    edge = datetime.now(UTC) + timedelta(minutes=10)
    seen: list[datetime] = []

    def edges(now: datetime) -> datetime | None:
        seen.append(now)
        return edge

    loop = loop_for(step, edges=edges)
    loop.start()
    try:
        await step.until_done(1)
        assert seen  # asked after the run
        assert loop.due() == edge + SETTLE
    finally:
        await loop.stop()


async def test_stopping_finishes_the_step_in_flight_then_releases_the_lease_and_exits_0() -> None:
    step = Step(held=True)
    loop = loop_for(step)
    stop = asyncio.Event()
    order: list[str] = []

    async def release() -> None:
        order.append(f"release after {step.done} finished step(s)")

    served = asyncio.create_task(serve(loop, release=release, stop=stop, signals=()))
    async with asyncio.timeout(2):
        await step.started.wait()
    stop.set()  # what SIGTERM does
    await asyncio.sleep(0)
    assert not served.done()  # waiting for the step in flight
    step.release.set()
    async with asyncio.timeout(2):
        assert await served == 0
    assert order == ["release after 1 finished step(s)"]
    assert step.runs == 1
    assert not loop.scheduler.running


async def test_a_failing_step_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0
    ran = asyncio.Event()

    async def failing() -> None:
        nonlocal calls
        calls += 1
        ran.set()
        raise RuntimeError("boom")

    loop = ReconcileLoop(failing, interval=HOUR, debounce=timedelta(milliseconds=10))
    loop.start()
    try:
        async with asyncio.timeout(2):
            await ran.wait()
        ran.clear()  # the run ended with the exception, before this task resumed
        loop.wake("again")
        async with asyncio.timeout(2):
            await ran.wait()
        assert calls == 2
    finally:
        await loop.stop()
    assert any("reconcile step failed" in r.getMessage() for r in caplog.records)


def test_json_log_lines_carry_time_level_logger_message_extras_and_exceptions() -> None:
    fmt = JsonFormatter()
    record = logging.LogRecord(
        "rebalancer.runtime", logging.INFO, __file__, 1, "lent %s", ("n1",), None
    )
    record.pool = "inference"
    doc = json.loads(fmt.format(record))
    assert doc["level"] == "info"
    assert doc["logger"] == "rebalancer.runtime"
    assert doc["message"] == "lent n1"
    assert doc["pool"] == "inference"
    assert doc["time"].startswith(datetime.fromtimestamp(record.created, UTC).strftime("%Y-"))
    try:
        raise ValueError("bad")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", (), sys.exc_info())
    line = fmt.format(failed)
    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exception"]


async def test_after_runs_once_each_step_has_ended_a_failing_one_too() -> None:
    seen: list[str] = []
    ran = asyncio.Event()

    async def step() -> None:
        seen.append("step")
        ran.set()
        if len(seen) == 1:
            raise RuntimeError("boom")

    loop = ReconcileLoop(
        step,
        interval=HOUR,
        debounce=timedelta(milliseconds=10),
        after=lambda: seen.append("after"),
    )
    loop.start()
    try:
        for _ in range(2):
            async with asyncio.timeout(2):
                await ran.wait()
            ran.clear()
            await asyncio.sleep(0)  # the run's own ending, past the step
            loop.wake("again")
        async with asyncio.timeout(2):
            while len(seen) < 5:
                await asyncio.sleep(0.001)
    finally:
        await loop.stop()
    assert seen[:4] == ["step", "after", "step", "after"]


async def test_a_failing_after_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    step = Step()

    def after() -> None:
        raise RuntimeError("boom")

    loop = ReconcileLoop(step, interval=HOUR, debounce=timedelta(milliseconds=10), after=after)
    loop.start()
    try:
        await step.until_done(1)
        await asyncio.sleep(0)
        loop.wake("again")
        await step.until_done(2)
    finally:
        await loop.stop()
    assert step.runs == 2
    assert any("the work after the reconcile step failed" in r.getMessage() for r in caplog.records)
