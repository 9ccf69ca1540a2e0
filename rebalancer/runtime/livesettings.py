"""The settings file read again when its content changes, and what the running controller makes
of it (docs/design/live-settings.md).

Where it sits: ``runtime.wiring.Controller`` holds one ``SettingsWatch`` when it was started
from a file (``rebalancer run``). The loop runs ``SettingsWatch.run`` beside the informer: it
polls the file's digest every ``poll`` and rings when it changes, which runs the loop at once;
``Controller.tick`` asks ``check`` first thing, so a change is taken by the tick that follows
it whether or not the poll saw it, and never in the middle of one.

Why a digest, polled: the chart mounts the file from a ConfigMap, which the kubelet updates by
swapping a ``..data`` symlink; the file's path never changes and an inotify watch on it sees
nothing (and would be one more dependency). Reading the resolved content and hashing it sees
every swap, and costs a read of a few kilobytes every few seconds.

What is made of a change (``check``): the file is loaded as at start-up (``settings.load``,
with the command's own adjustments, e.g. ``--dry-run``); a file that does not load is refused
whole, every line saying the field and the value, and the running settings stay; one that
loads is split by ``settings.live.reload`` into what the next tick takes and what waits for a
restart. The ``Outcome`` says which, for the log, the Event and the metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from rebalancer.errors import ConfigError
from rebalancer.settings import InvalidSettings, Settings, live, load

POLL = timedelta(seconds=2)
APPLIED, RESTART_NEEDED, REFUSED, UNCHANGED = "applied", "restart_needed", "refused", "unchanged"


def as_loaded(settings: Settings) -> Settings:
    """The settings as the file and the environment give them: no command adjusts them."""
    return settings


@dataclass(frozen=True)
class SettingsSource:
    """Where the settings were read from and how the command adjusted them (``--dry-run``)."""

    path: Path
    adjust: Callable[[Settings], Settings] = as_loaded
    env: Mapping[str, str] | None = None  # None: os.environ, read again each time


def digest(path: Path) -> str | None:
    """The SHA-256 of the file's content, through any symlink; None while it cannot be read
    (between a ConfigMap's swaps, or removed): that is no change, the running settings stay."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class Outcome:
    """What one reading of a changed file came to: ``result`` (``applied``, ``restart_needed``,
    ``refused`` or ``unchanged``), the file's digest, a line for each change or problem, and the
    settings to run by from now (None: the running ones stay)."""

    result: str
    digest: str
    lines: tuple[str, ...]
    settings: Settings | None = None

    def summary(self) -> str:
        """One sentence for the log and the Event's note."""
        said = "; ".join(self.lines) or "no setting differs"
        head = {
            APPLIED: "settings reloaded",
            RESTART_NEEDED: "settings reloaded in part",
            REFUSED: "settings file refused, the running settings stay",
            UNCHANGED: "settings file changed, no setting did",
        }[self.result]
        return f"{head} (sha256 {self.digest[:12]}): {said}"


def judge(source: SettingsSource, running: Settings, seen: str) -> Outcome:
    """The file (whose digest is ``seen``) loaded and compared with ``running``."""
    try:
        loaded = source.adjust(load(source.path, source.env))
    except InvalidSettings as exc:
        return Outcome(REFUSED, seen, tuple(exc.lines))
    except ConfigError as exc:
        return Outcome(REFUSED, seen, (str(exc),))
    if not loaded.pools:
        return Outcome(REFUSED, seen, ("pools=[]: the settings name no pool",))
    reloaded = live.reload(running, loaded)
    lines = tuple(c.line() for c in (*reloaded.applied, *reloaded.held))
    return Outcome(reloaded.result, seen, lines, reloaded.settings)


@dataclass
class SettingsWatch:
    """The file's digest as last judged, and a bell the poll rings when it changes."""

    source: SettingsSource
    judged: str | None
    poll: timedelta = POLL
    rung: asyncio.Event = field(default_factory=asyncio.Event)
    why: str = "settings file changed"
    rang: str | None = None  # the digest the poll last rang for: once per change

    @classmethod
    def of(cls, source: SettingsSource, poll: timedelta = POLL) -> SettingsWatch:
        """A watch from the file as it is now: the settings the process started with."""
        return cls(source, digest(source.path), poll)

    def check(self, running: Settings) -> Outcome | None:
        """The changed file judged against ``running``; None when its content is what was last
        judged (or it cannot be read now)."""
        seen = digest(self.source.path)
        if seen is None or seen == self.judged:
            return None
        self.judged = seen
        return judge(self.source, running, seen)

    async def run(self) -> None:
        """Poll the digest for ever; ring once for each content that differs from the one last
        judged."""
        while True:
            await asyncio.sleep(self.poll.total_seconds())
            seen = digest(self.source.path)
            if seen is not None and seen not in (self.judged, self.rang):
                self.rang = seen
                self.rung.set()


class SettingsMetrics:
    """``rebalancer_settings_reloads_total{result}``, ``rebalancer_settings_hash_info{sha256}``
    (the file whose settings run) and ``rebalancer_settings_last_reload_timestamp_seconds``
    (when a reload last changed what runs), on the controller's registry."""

    def __init__(self, registry: CollectorRegistry, started: str | None) -> None:
        self.reloads = Counter(
            "rebalancer_settings_reloads",
            "Changes of the settings file read while running, by what came of them.",
            ["result"],
            registry=registry,
        )
        for result in (APPLIED, RESTART_NEEDED, REFUSED, UNCHANGED):
            self.reloads.labels(result)
        self.running = Gauge(
            "rebalancer_settings_hash_info",
            "1, naming the SHA-256 of the settings file the running settings were read from.",
            ["sha256"],
            registry=registry,
        )
        self.last = Gauge(
            "rebalancer_settings_last_reload_timestamp_seconds",
            "When a change of the settings file last changed the running settings (0: never).",
            registry=registry,
        )
        if started is not None:
            self.running.labels(started).set(1)

    def reloaded(self, outcome: Outcome, now: datetime) -> None:
        self.reloads.labels(outcome.result).inc()
        if outcome.settings is None:
            return
        self.running.clear()
        self.running.labels(outcome.digest).set(1)
        if outcome.result != UNCHANGED:
            self.last.set(now.timestamp())
