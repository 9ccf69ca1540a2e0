"""The reconcile loop: an APScheduler 3.x interval job that runs the reconcile step, never two at
once, woken early by window edges and by wake-ups (debounced), and a clean shutdown.

- One job, ``max_instances=1`` and ``coalesce=True``: APScheduler never starts a second run while
  one is in flight, and runs missed while busy collapse into one. ``_run`` keeps its own flag too,
  and a wake-up that arrives during a run is not dropped: it becomes one run right after.
- ``wake`` moves the job's next run to
  ``now + debounce`` unless a run is due sooner already (``debounced``): a burst of changes (a
  drain's dozen pod events) collapses into one run at the first event plus the delay. After a run
  the interval starts again from it (the trigger counts from the last fire time).
- ``wake(why, at_once=True)`` skips the debounce: a matched Alertmanager alert
  (``runtime.alerts``, its ``rung`` event) says inference is short now, and Alertmanager has
  grouped the burst already (its ``group_wait``). A wake-up at once that arrives during a run
  makes the next run start as soon as that one ends. Alerts wake the loop at once at most once
  per tick interval (``alert_wake``): however many notifications arrive, the rest are read by
  the next scheduled run, at most one interval later, so posting cannot make the loop spin.
- After each run the next window edge (``edges(now)``, e.g. ``Reconciler.next_edge``) is
  compared with the next scheduled run (``edge_wake``); if it comes first the job is moved to
  just after the edge, so a window that closes is acted on at once, not up to an interval late.
- ``serve``: runs until SIGTERM/SIGINT (or a given event), then stops scheduling, lets the step
  in flight finish, releases the lease, and returns 0.

APScheduler reads the wall clock itself; the decisions about WHEN are pure functions here
(``debounced``, ``edge_wake``) so that tests check them without waiting on any clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from rebalancer.core.model import Clock

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[object]]
Edges = Callable[[datetime], datetime | None]

JOB_ID = "reconcile"
SETTLE = timedelta(seconds=1)  # run this long after a window edge, safely on its far side
# A wake-up "at once" still waits this long: APScheduler counts a run as running until its
# task's done callback, so a run moved to "now" from the end of a run would be skipped
# (max_instances) and the wake-up lost.
AT_ONCE = timedelta(milliseconds=10)


def _utc_now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# When to run: pure


def debounced(now: datetime, due: datetime | None, delay: timedelta) -> datetime:
    """When a wake-up at ``now`` makes the step run: ``now + delay``, unless a run is already
    due at or before that (then that run serves the wake-up too)."""
    wanted = now + delay
    return due if due is not None and due <= wanted else wanted


def alert_wake(now: datetime, last: datetime | None, interval: timedelta) -> bool:
    """Whether an alert that rings at ``now`` runs the step at once: only when no alert did
    within the last ``interval`` (``last``). Otherwise the run due within an interval of the
    last one reads it: at most one run a tick comes from alerts, whatever arrives."""
    return last is None or now - last >= interval


def edge_wake(
    due: datetime | None, edge: datetime | None, settle: timedelta = SETTLE
) -> datetime | None:
    """The earlier run time the edge asks for, or ``None`` when the scheduled run comes first."""
    if edge is None:
        return None
    wanted = edge + settle
    return wanted if due is None or wanted < due else None


# ---------------------------------------------------------------------------------------------


class ReconcileLoop:
    def __init__(
        self,
        step: Step,
        *,
        interval: timedelta = timedelta(seconds=30),
        debounce: timedelta = timedelta(seconds=2),
        edges: Edges = lambda _now: None,
        clock: Clock = _utc_now,
        scheduler: AsyncIOScheduler | None = None,
        after: Callable[[], object] = lambda: None,
    ) -> None:
        self.step, self.interval, self.debounce = step, interval, debounce
        self.after = after  # run once each step has ended, however it ended
        self.edges, self.clock = edges, clock
        self.scheduler = scheduler or AsyncIOScheduler(timezone=UTC)
        self.runs = 0
        self._running = False
        self._again = False  # a wake-up came during a run
        self._again_at_once = False  # ... and it asked for a run at once
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule the job (first run at once) and start the scheduler."""
        self.scheduler.add_job(
            self._run,
            IntervalTrigger(seconds=self.interval.total_seconds(), timezone=UTC),
            id=JOB_ID,
            name="reconcile",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,  # late is better than never
            next_run_time=self.clock(),
        )
        if not self.scheduler.running:
            self.scheduler.start()

    async def stop(self) -> None:
        """No new run starts; the one in flight finishes; then the scheduler shuts down."""
        self._stopping = True
        with contextlib.suppress(Exception):
            self.scheduler.remove_job(JOB_ID)
        await self._idle.wait()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    # -- wake-ups -----------------------------------------------------------------------------

    def due(self) -> datetime | None:
        job = self.scheduler.get_job(JOB_ID)
        when: datetime | None = None if job is None else job.next_run_time
        return when

    def wake(self, why: str = "", at_once: bool = False) -> None:
        """Run soon (debounced; ``at_once``: now). Safe to call from the informer's callbacks."""
        if self._stopping:
            return
        if self._running:
            self._again = True
            self._again_at_once |= at_once
            return
        due = self.due()
        if due is None:  # not started yet: the first run comes at once anyway
            return
        when = debounced(self.clock(), due, AT_ONCE if at_once else self.debounce)
        if when != due:
            log.debug("wake-up at %s: %s", when.isoformat(), why)
            self.scheduler.modify_job(JOB_ID, next_run_time=when)

    # -- the job ------------------------------------------------------------------------------

    async def _run(self) -> None:
        if self._running or self._stopping:  # belt and braces: max_instances=1 already
            return
        self._running, self._again, self._again_at_once = True, False, False
        self._idle.clear()
        try:
            self.runs += 1
            await self.step()
        except Exception:
            log.exception("reconcile step failed; the next run starts from the cluster again")
        finally:
            self._running = False
            self._idle.set()
        try:
            self.after()  # nothing awaits in between: no run starts before it ends
        except Exception:
            log.exception("the work after the reconcile step failed; the loop goes on")
        if self._stopping:
            return
        if self._again:
            at_once, self._again, self._again_at_once = self._again_at_once, False, False
            self.wake("changes during the last run", at_once=at_once)
            return
        edge = self.edges(self.clock())
        when = edge_wake(self.due(), edge)
        if when is not None:
            log.info("window edge at %s: next run moved to %s", edge, when.isoformat())
            self.scheduler.modify_job(JOB_ID, next_run_time=when)


# ---------------------------------------------------------------------------------------------
# The process: until a signal, then a clean exit


async def serve(
    loop: ReconcileLoop,
    *,
    release: Callable[[], Awaitable[object]] | None = None,
    stop: asyncio.Event | None = None,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
) -> int:
    """Run ``loop`` until one of ``signals`` (or ``stop`` is set); finish the step in flight,
    release the lease, return the exit status (0)."""
    stop = stop or asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in signals:
        running.add_signal_handler(sig, stop.set)
    try:
        loop.start()
        await stop.wait()
        log.info("stopping: finishing the step in flight")
    finally:
        for sig in signals:
            running.remove_signal_handler(sig)
        await loop.stop()
        if release is not None:
            try:
                await release()
            except Exception:
                log.exception("releasing the lease failed; it expires by itself")
    log.info("stopped")
    return 0


class Source(Protocol):
    """``adapters.informer.Informer``: runs for ever, says when it has listed and when a change
    that matters came in."""

    synced: asyncio.Event
    changed: asyncio.Event

    async def run(self) -> None: ...


class Bell(Protocol):
    """``runtime.alerts.AlertStore``: ``rung`` is set when a matched alert fires; ``why``
    names it."""

    rung: asyncio.Event
    why: str


class Watch(Protocol):
    """``runtime.livesettings.SettingsWatch``: ``run`` polls the settings file for ever and sets
    ``rung`` when its content changes."""

    rung: asyncio.Event
    why: str

    async def run(self) -> None: ...


class Candidate(Protocol):
    """``adapters.leadership.LeaderElector``: cancelling ``run`` releases the lease."""

    async def run(self) -> None: ...


async def run_controller(
    step: Step,
    *,
    informer: Source,
    elector: Candidate | None = None,
    edges: Edges = lambda _now: None,
    interval: timedelta = timedelta(seconds=30),
    debounce: timedelta = timedelta(seconds=2),
    stop: asyncio.Event | None = None,
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    alerts: Bell | None = None,
    settings: Watch | None = None,
    after_tick: Callable[[], object] = lambda: None,
) -> int:
    """The controller process: informer and election in the background; once the informer has
    listed, the loop (``step`` is ``Reconciler.tick``; the reconciler runs its start-up on the
    first tick of each stretch of leadership), run at once whenever ``alerts`` rings or the
    ``settings`` file changes (the tick reads it first: ``Controller.tick``), ``after_tick``
    run once each tick has ended (``runtime.collecting``). On a
    signal: the step in flight finishes, the election is cancelled (which releases the lease),
    the informer stops; 0 is returned."""
    background: list[asyncio.Task[None]] = [
        asyncio.create_task(informer.run(), name="informer"),
    ]
    campaign = asyncio.create_task(elector.run(), name="election") if elector else None
    loop = ReconcileLoop(step, interval=interval, debounce=debounce, edges=edges, after=after_tick)
    stop = stop or asyncio.Event()

    async def release() -> None:
        if campaign is not None:
            campaign.cancel()  # LeaderElector.run releases the lease on cancellation
            with contextlib.suppress(asyncio.CancelledError):
                await campaign

    running = asyncio.get_running_loop()
    for sig in signals:  # from the start: a signal while listing ends the process cleanly too
        running.add_signal_handler(sig, stop.set)
    try:
        await _synced_or_stopped(informer, stop)
        if stop.is_set():
            await release()
            return 0
        background.append(asyncio.create_task(_forward_changes(informer, loop), name="wake-ups"))
        if alerts is not None:
            background.append(
                asyncio.create_task(_forward_alerts(alerts, loop), name="alert-wake-ups")
            )
        if settings is not None:
            background.append(asyncio.create_task(settings.run(), name="settings-poll"))
            background.append(
                asyncio.create_task(_forward_settings(settings, loop), name="settings-wake-ups")
            )
        return await serve(loop, release=release, stop=stop, signals=())
    finally:
        for sig in signals:
            running.remove_signal_handler(sig)
        await release()
        await _cancel_all(background)


async def _synced_or_stopped(informer: Source, stop: asyncio.Event) -> None:
    """Return once the informer has listed or ``stop`` is set, whichever comes first."""
    synced = asyncio.create_task(informer.synced.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((synced, stopped), return_when=asyncio.FIRST_COMPLETED)
    synced.cancel()
    stopped.cancel()


async def _forward_changes(informer: Source, loop: ReconcileLoop) -> None:
    """Wake the loop (debounced) on every change the informer says matters."""
    while True:
        await informer.changed.wait()
        informer.changed.clear()
        loop.wake("informer change")


async def _forward_alerts(bell: Bell, loop: ReconcileLoop) -> None:
    """Run the loop at once when a matched alert fires, at most once per tick interval."""
    last: datetime | None = None
    while True:
        await bell.rung.wait()
        bell.rung.clear()
        now = loop.clock()
        if alert_wake(now, last, loop.interval):
            last = now
            loop.wake(f"alertmanager: {bell.why}", at_once=True)
        else:
            log.debug("alertmanager: %s; read by the next tick (one wake-up a tick)", bell.why)


async def _forward_settings(watch: Watch, loop: ReconcileLoop) -> None:
    """Run the loop at once when the settings file changes: a pause is taken by the next tick,
    not up to an interval later. The poll rings once per change, so this cannot spin."""
    while True:
        await watch.rung.wait()
        watch.rung.clear()
        loop.wake(watch.why, at_once=True)


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every task, then wait for each to finish."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------------------------------------
# Structured logs


_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, RFC 3339), level, logger, message, any ``extra``
    fields, and the exception text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


def json_logging(level: int = logging.INFO) -> None:
    """Send every log record to stderr as a JSON line."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # APScheduler says "Running job ..." and "... executed successfully" at INFO on every tick:
    # two lines a tick that tell nothing the reconcile step's own lines do not. Its warnings
    # (a run missed, or skipped because the last one still runs) still come through.
    logging.getLogger("apscheduler").setLevel(max(level, logging.WARNING))
