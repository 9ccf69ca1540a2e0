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

How long an alert holds its pool: until a ``resolved`` notification for its fingerprint, its
``endsAt`` when the notification gives one (Alertmanager hides ``endsAt`` while an alert fires,
sending ``0001-01-01T00:00:00Z``), or ``max_age`` after its last firing notification, whichever
comes first: a lost ``resolved`` cannot hold a pool for ever.

The payload is Alertmanager's webhook version 4. It is checked at this boundary: a body that is
not one is refused as a ``BadPayload`` naming the first field that is wrong and its value.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from rebalancer.core import alerts
from rebalancer.core.model import Clock, FiringAlert, PoolName

log = logging.getLogger(__name__)

VERSION = "4"
MAX_PER_POOL = 1000  # alerts held per pool: a flood cannot grow the process without bound
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
    fingerprint: str = Field(min_length=1)

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


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


# ---------------------------------------------------------------------------------------------
# The store


@dataclass(frozen=True)
class Matched:
    pool: PoolName
    alert: FiringAlert


@dataclass(frozen=True)
class Receipt:
    """What one notification did: alerts now held per pool, fingerprints let go."""

    held: tuple[Matched, ...]
    resolved: tuple[str, ...]
    unmatched: int  # firing alerts no pool's selectors admit

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
        }


class AlertStore:
    """The firing alerts each pool is held to, and a bell the reconcile loop waits on."""

    def __init__(
        self,
        selectors: Mapping[PoolName, Sequence[alerts.Selector]],
        *,
        max_age: timedelta,
        clock: Clock,
    ) -> None:
        self.selectors = {pool: tuple(s) for pool, s in selectors.items()}
        self.max_age, self.clock = max_age, clock
        self._held: dict[PoolName, dict[str, FiringAlert]] = {p: {} for p in self.selectors}
        self.rung = asyncio.Event()  # set by a firing matched alert; the loop clears it
        self.why = ""

    def receive(self, notification: Notification) -> Receipt:
        now = self.clock()
        held: list[Matched] = []
        resolved: list[str] = []
        unmatched = 0
        for alert in notification.alerts:
            if alert.status == "resolved" or (alert.ends is not None and alert.ends <= now):
                if self._let_go(alert.fingerprint):
                    resolved.append(alert.fingerprint)
                continue
            found = self._hold(alert, now)
            held.extend(found)
            unmatched += not found
        if held:
            self.why = ", ".join(
                f"alert {m.alert.name} for pool {m.pool} ({m.alert.matcher})" for m in held[:3]
            )
            for m in held:
                log.info(
                    "alertmanager: alert %s (%s) fires for pool %s (%s): running the step now",
                    m.alert.name,
                    m.alert.fingerprint,
                    m.pool,
                    m.alert.matcher,
                )
            self.rung.set()
        for fingerprint in resolved:
            log.info("alertmanager: alert %s resolved; it holds no pool now", fingerprint)
        if resolved and not held:  # a pool may lend again: sooner than the next tick
            self.why = f"alert {', '.join(resolved[:3])} resolved"
            self.rung.set()
        return Receipt(tuple(held), tuple(resolved), unmatched)

    def firing(self, pool: PoolName, now: datetime) -> tuple[FiringAlert, ...]:
        """The alerts that hold ``pool`` at ``now``; those past their ``until`` are dropped."""
        mine = self._held.get(pool)
        if not mine:
            return ()
        for fingerprint in [f for f, a in mine.items() if a.until <= now]:
            del mine[fingerprint]
        return tuple(sorted(mine.values(), key=lambda a: (a.starts_at, a.fingerprint)))

    def _hold(self, alert: Alert, now: datetime) -> list[Matched]:
        found = []
        for pool, selectors in self.selectors.items():
            selector = alerts.first_match(selectors, alert.labels)
            if selector is None:
                continue
            until = now + self.max_age
            if alert.ends is not None:
                until = min(until, alert.ends)
            value = FiringAlert(
                name=alert.name,
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                matcher=str(selector),
                received=now,
                until=until,
            )
            mine = self._held[pool]
            mine.pop(alert.fingerprint, None)  # re-inserted: the newest is last
            mine[alert.fingerprint] = value
            if len(mine) > MAX_PER_POOL:  # the oldest notification goes; the pool stays held
                del mine[next(iter(mine))]
            found.append(Matched(pool, value))
        return found

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
