"""Alertmanager's webhook, received: the alerts that fire for each pool, held in memory.

Where it sits: ``POST /api/v1/alertmanager`` (``runtime.http``) hands the body to
``parse_notification``, then to ``AlertStore.receive``; a firing alert that matches a pool's
``wake_on`` selectors (``core.alerts``) is held for that pool and rings ``AlertStore.rung``,
which ``runtime.loop`` turns into a run of the reconcile step at once (a resolved one that
lets a pool go rings it too: the pool may lend again). The step's observe asks
``AlertStore.firing`` for each pool and puts the answer on the pool's snapshot, so the
planner's alert rule decides from a plain value (docs/design/alertmanager.md).

Why in memory: an alert is evidence about now, and Alertmanager sends it again (every
``repeat_interval`` while it fires, and once more resolved). A restart forgets what was held
and learns it again from the next notification; the metrics rules protect inference meanwhile.

How long an alert holds its pool: at most its own life. Until a ``resolved`` notification
for its fingerprint, its ``endsAt`` when the notification gives one (Alertmanager hides
``endsAt`` while an alert fires, sending ``0001-01-01T00:00:00Z``), ``max_age`` after its last
firing notification (a lost ``resolved`` cannot hold a pool for ever), or ``max_life`` after
its own ``startsAt``, whichever comes first. The last bound is what a notification posted
again cannot stretch: Alertmanager's re-sends of a firing alert and a replay of one of them
are the same bytes, but both carry the alert's ``startsAt``, which a replay cannot move. An
alert seen ended (resolved, or past its ``endsAt``) is remembered until then, so that a replay
of one of its firing notifications holds nothing (``ended`` in the receipt).

How often it wakes the loop: a notification rings ``rung`` only when it changes what is held
(a pool newly held by an alert, an alert let go); a re-send of what is held already changes
nothing the step must act on now. ``runtime.loop`` runs the step at once for at most one ring
per tick interval; the next scheduled tick reads the rest (docs/design/alertmanager.md).

The payload is Alertmanager's webhook version 4. It is checked at this boundary: a body over
``MAX_BODY`` bytes or nested deeper than ``MAX_DEPTH`` is refused before it is parsed, and a
body that is not a notification is refused as a ``BadPayload`` naming the first field that is
wrong and its value (cut: ``core.bounded``).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rebalancer.core import alerts, bounded
from rebalancer.core.model import Clock, FiringAlert, PoolName

log = logging.getLogger(__name__)

VERSION = "4"
MAX_PER_POOL = 1000  # alerts held per pool: a flood cannot grow the process without bound
MAX_ENDED = 10_000  # ended alerts remembered: a flood of resolved ones cannot either
MAX_BODY = 1024 * 1024  # bytes of a notification; Alertmanager's max_alerts keeps one far below
MAX_DEPTH = 64  # nesting of a notification's JSON; version 4 needs 4 (alerts[].labels)
_ZERO_YEAR = 1  # Go's zero time, 0001-01-01T00:00:00Z: no endsAt


# ---------------------------------------------------------------------------------------------
# The payload


class _Payload(BaseModel):
    # Fields as Alertmanager names them (aliases); fields it adds in a later release
    # (truncatedAlerts came so) are let through.
    model_config = ConfigDict(extra="allow", frozen=True)


class Alert(_Payload):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: AwareDatetime = Field(alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    # Alertmanager's are 16 hex digits; the bound keeps a key of the store, a log line and a
    # record's inputs short.
    fingerprint: str = Field(min_length=1, max_length=128)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def ends(self) -> datetime | None:
        return None if self.ends_at.year == _ZERO_YEAR else self.ends_at


class Notification(_Payload):
    version: str
    group_key: str = Field(alias="groupKey")
    status: Literal["firing", "resolved"]
    receiver: str
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    truncated_alerts: int = Field(default=0, ge=0, alias="truncatedAlerts")
    alerts: list[Alert]


@dataclass(frozen=True)
class BadPayload:
    """Why a body is not a version 4 notification: the field, its value, and why."""

    field: str
    value: str
    message: str
    error: str = "bad_payload"

    def body(self) -> dict[str, str]:
        return {
            "error": self.error,
            "field": self.field,
            "value": self.value,
            "message": self.message,
        }


def parse_notification(raw: bytes) -> Notification | BadPayload:
    """The notification in ``raw`` (a request body), or why it is not one."""
    if len(raw) > MAX_BODY:
        return too_large(len(raw))
    deep = depth(raw)
    if deep > MAX_DEPTH:  # json.loads recurses once a level: a deep body is a RecursionError
        return BadPayload(
            "(body)",
            bounded.cut(raw[:80].decode("utf-8", "replace"), 80),
            f"JSON nested {deep} levels deep: a notification is nested at most {MAX_DEPTH}",
            error="too_deep",
        )
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        return BadPayload("(body)", _shown(raw[:80].decode("utf-8", "replace")), f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return BadPayload("(body)", _shown(doc), "must be a JSON object (a webhook notification)")
    if "version" in doc and doc["version"] != VERSION:
        return BadPayload(
            "version",
            _shown(doc["version"]),
            f'only Alertmanager\'s webhook version "{VERSION}" is read here',
            error="unsupported_version",
        )
    try:
        return Notification.model_validate(doc)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = _path(first["loc"])
        value = "(absent)" if first["type"] == "missing" else _shown(first.get("input"))
        return BadPayload(where, value, first["msg"])


def too_large(size: int | None) -> BadPayload:
    """Why a body of ``size`` bytes is refused (None: sent in chunks, cut off once it was
    longer than ``MAX_BODY``)."""
    shown = f"more than {MAX_BODY} bytes" if size is None else f"{size} bytes"
    return BadPayload(
        "(body)",
        f"({shown})",
        f"{shown}: a notification is at most {MAX_BODY} bytes (Alertmanager's max_alerts in "
        "the webhook's configuration keeps one short)",
        error="body_too_large",
    )


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return bounded.cut(text)


# A JSON string (escapes included), and the brackets left once strings are taken out.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def depth(raw: bytes) -> int:
    """How deep the arrays and objects of the JSON text ``raw`` nest, counted without
    recursion (a body that is not JSON gets a count too; ``json.loads`` then says why)."""
    brackets = _BRACKETS.findall(_STRING.sub(b"", raw))
    steps = (1 if b in (b"[", b"{") else -1 for b in brackets)
    return max(itertools.accumulate(steps), default=0)


# ---------------------------------------------------------------------------------------------
# The store


@dataclass(frozen=True)
class Matched:
    pool: PoolName
    alert: FiringAlert


@dataclass(frozen=True)
class Receipt:
    """What one notification did: alerts now held per pool, fingerprints let go, and firing
    alerts whose life is over (seen ended, or past ``max_life``): a replay, held by nothing."""

    held: tuple[Matched, ...]
    resolved: tuple[str, ...]
    unmatched: int  # firing alerts no pool's selectors admit
    ended: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        return {
            "held": [
                {
                    "pool": str(m.pool),
                    "alertname": m.alert.name,
                    "fingerprint": m.alert.fingerprint,
                    "matcher": m.alert.matcher,
                    "until": m.alert.until.isoformat(),
                }
                for m in self.held
            ],
            "resolved": list(self.resolved),
            "unmatched": self.unmatched,
            "ended": list(self.ended),
        }


class AlertStore:
    """The firing alerts each pool is held to, and a bell the reconcile loop waits on.

    ``max_age``: how long after its last firing notification an alert holds its pool.
    ``max_life``: how long after its own ``startsAt`` it may hold it at most, however often it
    is posted."""

    def __init__(
        self,
        selectors: Mapping[PoolName, Sequence[alerts.Selector]],
        *,
        max_age: timedelta,
        clock: Clock,
        max_life: timedelta = timedelta(hours=12),
    ) -> None:
        self.selectors = {pool: tuple(s) for pool, s in selectors.items()}
        self.max_age, self.max_life, self.clock = max_age, max_life, clock
        self._held: dict[PoolName, dict[str, FiringAlert]] = {p: {} for p in self.selectors}
        # fingerprint -> the startsAt of its life seen ended: a firing notification of that
        # life (or an older one) is a replay. Kept until the life's max_life is over.
        self._ended: dict[str, datetime] = {}
        self.rung = asyncio.Event()  # set when what is held changes; the loop clears it
        self.why = ""

    def receive(self, notification: Notification) -> Receipt:
        now = self.clock()
        self._forget_ended(now)
        held: list[Matched] = []
        news: list[Matched] = []
        resolved: list[str] = []
        ended: list[str] = []
        unmatched = 0
        for alert in notification.alerts:
            if alert.status == "resolved" or (alert.ends is not None and alert.ends <= now):
                self._end(alert)
                if self._let_go(alert.fingerprint):
                    resolved.append(alert.fingerprint)
                continue
            if self._over(alert, now):
                ended.append(alert.fingerprint)
                continue
            found = self._hold(alert, now)
            held.extend(m for m, _ in found)
            news.extend(m for m, new in found if new)
            unmatched += not found
        for m in news:
            log.info(
                "alertmanager: alert %s (%s) fires for pool %s (%s): running the step now",
                m.alert.name,
                m.alert.fingerprint,
                m.pool,
                m.alert.matcher,
            )
        if ended:
            log.info(
                "alertmanager: %d firing alert(s) whose life is over ignored (%s): a replay, "
                "or a rule firing longer than max_life",
                len(ended),
                ", ".join(ended[:3]),
            )
        for fingerprint in resolved:
            log.info("alertmanager: alert %s resolved; it holds no pool now", fingerprint)
        # Only news rings: a re-send of an alert already held changes nothing the step must
        # act on now (its next run reads the later ``until``).
        if news:
            self.why = ", ".join(
                f"alert {m.alert.name} for pool {m.pool} ({m.alert.matcher})" for m in news[:3]
            )
            self.rung.set()
        elif resolved:  # a pool may lend again: sooner than the next tick
            self.why = f"alert {', '.join(resolved[:3])} resolved"
            self.rung.set()
        return Receipt(tuple(held), tuple(resolved), unmatched, tuple(ended))

    def firing(self, pool: PoolName, now: datetime) -> tuple[FiringAlert, ...]:
        """The alerts that hold ``pool`` at ``now``; those past their ``until`` are dropped."""
        mine = self._held.get(pool)
        if not mine:
            return ()
        for fingerprint in [f for f, a in mine.items() if a.until <= now]:
            del mine[fingerprint]
        return tuple(sorted(mine.values(), key=lambda a: (a.starts_at, a.fingerprint)))

    def _life_ends(self, alert: Alert, now: datetime) -> datetime:
        """The latest an alert may hold a pool: ``max_life`` after it started (a ``startsAt``
        ahead of this clock counts from now, so a skewed sender cannot lengthen it)."""
        return min(alert.starts_at, now) + self.max_life

    def _over(self, alert: Alert, now: datetime) -> bool:
        """Whether a firing notification speaks of a life that is over: seen ended here, or
        past ``max_life``."""
        seen_end = self._ended.get(alert.fingerprint)
        if seen_end is not None and alert.starts_at <= seen_end:
            return True
        return self._life_ends(alert, now) <= now

    def _hold(self, alert: Alert, now: datetime) -> list[tuple[Matched, bool]]:
        """The pools ``alert`` holds now, each with whether it held that pool before not."""
        found = []
        for pool, selectors in self.selectors.items():
            selector = alerts.first_match(selectors, alert.labels)
            if selector is None:
                continue
            until = min(now + self.max_age, self._life_ends(alert, now))
            if alert.ends is not None:
                until = min(until, alert.ends)
            value = FiringAlert(
                name=bounded.cut(alert.name),
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                matcher=str(selector),
                received=now,
                until=until,
            )
            mine = self._held[pool]
            before = mine.pop(alert.fingerprint, None)  # re-inserted: the newest is last
            mine[alert.fingerprint] = value
            if len(mine) > MAX_PER_POOL:  # the oldest notification goes; the pool stays held
                del mine[next(iter(mine))]
            found.append((Matched(pool, value), before is None or before.until <= now))
        return found

    def _end(self, alert: Alert) -> None:
        """Remember that the life of ``alert`` (its ``startsAt``) is over."""
        known = self._ended.pop(alert.fingerprint, None)
        self._ended[alert.fingerprint] = (
            alert.starts_at if known is None else max(known, alert.starts_at)
        )
        if len(self._ended) > MAX_ENDED:
            del self._ended[next(iter(self._ended))]

    def _forget_ended(self, now: datetime) -> None:
        """An ended life past its ``max_life`` needs no remembering: ``_over`` says so anyway."""
        for fingerprint in [f for f, s in self._ended.items() if s + self.max_life <= now]:
            del self._ended[fingerprint]

    def _let_go(self, fingerprint: str) -> bool:
        gone = False
        for mine in self._held.values():
            gone |= mine.pop(fingerprint, None) is not None
        return gone


# ---------------------------------------------------------------------------------------------
# The receiver: the store, who may post, and whether this replica acts on it


@dataclass
class Receiver:
    """What ``runtime.http`` serves ``POST /api/v1/alertmanager`` with.

    ``token``: when set, a notification must carry ``Authorization: Bearer <token>``.
    ``leading``: whether this replica acts. A follower keeps what it is sent (it may lead
    next) but answers 503, so Alertmanager retries, on a new connection that the Service may
    give the leader."""

    store: AlertStore
    token: str | None = None
    leading: Callable[[], bool] = field(default=lambda: True)

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.token.encode())
