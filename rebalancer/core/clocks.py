"""How far the clocks the controller depends on are from its own: measured, never assumed.

Where it sits: the adapters time their requests (``adapters.kubeclient.ClockProbe`` every API
server answer's ``Date`` header, ``adapters.metrics.Metrics.clock`` Prometheus' ``time()``)
and keep an ``Estimator`` of readings; each tick the runtime puts the estimates, as ``Clocks``,
into every ``PoolSnapshot``. The planner judges sample ages on Prometheus' clock
(``prometheus_now``), refuses to lend while a clock is past the bound (``problems``), and does
not trust a node's ``since`` in the future of the API server (``in_future``). Pure: readings,
times and the bound are arguments (docs/design/clocks.md).

Why: the controller is not the only clock. A sample's age is Prometheus' now minus its sample
time; a ``since`` written on a clock ahead of the API server holds another replica's cooldown
for as long as that clock is ahead. One reading of a clock over the network is a range, not a
point: the server read its clock somewhere between the request's send and its answer, and a
``Date`` header is cut to the second. So each reading is the middle of that range with half
its width as uncertainty, and the estimate is the median of the recent readings (one slow
answer, or a server that paused, does not move it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

RECENT = 15  # readings an estimate is the median of
MAX_AGE = timedelta(minutes=10)  # a reading older than this says nothing of the clock now
SECOND = timedelta(seconds=1)
MILLISECOND = timedelta(milliseconds=1)
DEFAULT_BOUND = timedelta(seconds=30)


class Against(StrEnum):
    """The clocks measured (the ``against`` label of ``rebalancer_clock_skew_seconds``)."""

    APISERVER = "apiserver"
    PROMETHEUS = "prometheus"


NAMES = {Against.APISERVER: "the API server's", Against.PROMETHEUS: "Prometheus'"}


@dataclass(frozen=True, slots=True)
class Reading:
    """One answer's clock: ``server`` as the server stated it, ``resolution`` the step it is
    stated in (a ``Date`` header: a second, truncated), ``sent`` and ``received`` on the
    controller's own clock."""

    sent: datetime
    received: datetime
    server: datetime
    resolution: timedelta = timedelta(0)
    # ``offset`` and ``uncertainty`` in seconds, worked out once: an estimate takes the
    # median of each over the recent readings, and the API server's now is estimated at
    # every write of a wave (the readings change with every answer).
    offset_s: float = field(init=False, repr=False, compare=False)
    uncertainty_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "offset_s", self.offset.total_seconds())
        object.__setattr__(self, "uncertainty_s", self.uncertainty.total_seconds())

    @property
    def offset(self) -> timedelta:
        """The server's clock minus the controller's: the middle of what the reading allows."""
        middle = self.sent + (self.received - self.sent) / 2
        return self.server + self.resolution / 2 - middle

    @property
    def uncertainty(self) -> timedelta:
        """Half the width of what the reading allows: half the round trip, half a step."""
        return abs(self.received - self.sent) / 2 + self.resolution / 2


@dataclass(frozen=True, slots=True)
class Skew:
    """A clock's estimated offset from the controller's (positive: it is ahead), within
    ``uncertainty``, from ``readings`` readings, the newest at ``at`` (controller's clock)."""

    against: Against
    offset: timedelta
    uncertainty: timedelta
    readings: int
    at: datetime

    @property
    def known(self) -> bool:
        """Whether the skew is measurably not zero (beyond the reading's uncertainty)."""
        return abs(self.offset) > self.uncertainty

    def beyond(self, bound: timedelta) -> bool:
        """Whether the clock is past ``bound`` for certain: the least the skew can be is."""
        return abs(self.offset) - self.uncertainty > bound

    def __str__(self) -> str:
        seconds = self.offset.total_seconds()
        way = "ahead of" if seconds > 0 else "behind"
        return (
            f"{NAMES[self.against]} clock is {abs(seconds):.1f}s "
            f"(±{self.uncertainty.total_seconds():.1f}s) {way} this controller's"
        )


@dataclass(frozen=True, slots=True)
class Estimator:
    """The recent readings of one clock, newest last."""

    against: Against
    readings: tuple[Reading, ...] = ()


def add(estimator: Estimator, reading: Reading) -> Estimator:
    """The estimator with ``reading``, keeping the ``RECENT`` newest; a reading whose answer
    came before it was sent (the controller's clock stepped back) is no reading."""
    if reading.received < reading.sent:
        return estimator
    kept = (*estimator.readings, reading)[-RECENT:]
    return Estimator(estimator.against, kept)


def estimate(estimator: Estimator, now: datetime, max_age: timedelta = MAX_AGE) -> Skew | None:
    """The median offset of the readings of the last ``max_age``, with the median uncertainty;
    None when there is none."""
    since, until = now - max_age, now + max_age
    recent = [r for r in estimator.readings if since <= r.received <= until]
    if not recent:
        return None
    offset = statistics.median([r.offset_s for r in recent])
    spread = statistics.median([r.uncertainty_s for r in recent])
    newest = max(r.received for r in recent)
    return Skew(
        estimator.against,
        timedelta(seconds=offset),
        timedelta(seconds=spread),
        len(recent),
        newest,
    )


@dataclass(frozen=True, slots=True)
class Clocks:
    """The clocks as one tick found them. ``correction`` is what the tick's ``now`` already
    added to the controller's own clock (the API server's skew, ``corrected``), so that a skew
    measured against the controller's own clock is told against ``now``. ``unmeasured``: the
    clocks that should have been measured and could not be (no reading lately)."""

    skews: tuple[Skew, ...] = ()
    unmeasured: frozenset[Against] = frozenset()
    bound: timedelta = DEFAULT_BOUND
    correction: timedelta = timedelta(0)

    def skew(self, against: Against) -> Skew | None:
        return next((s for s in self.skews if s.against is against), None)

    def problems(self) -> tuple[str, ...]:
        """Why no node may be lent on these clocks: a clock past the bound, or one that should
        be measured and cannot be. Empty when the clocks can be trusted."""
        out = [
            f"{s}, past the bound of {self.bound.total_seconds():g}s"
            for s in self.skews
            if s.beyond(self.bound)
        ]
        out += [f"{NAMES[a]} clock cannot be measured" for a in sorted(self.unmeasured)]
        return tuple(out)


NONE = Clocks()


def corrected(own: datetime, skew: Skew | None) -> datetime:
    """The API server's now from the controller's own clock: own plus the measured skew, where
    the skew is measurably not zero; own as it is otherwise."""
    if skew is None or not skew.known:
        return own
    return own + skew.offset


def prometheus_now(clocks: Clocks, now: datetime) -> datetime:
    """Prometheus' now for a tick at ``now``: the measured Prometheus skew; without one, the
    API server's clock (``now`` already is it, corrected), the best other judge there is."""
    skew = clocks.skew(Against.PROMETHEUS)
    if skew is None:
        return now
    return now - clocks.correction + skew.offset


def in_future(clocks: Clocks, now: datetime) -> Callable[[datetime], timedelta | None]:
    """How far a time written on a node is ahead of the API server's clock at ``now``, beyond
    what the measurement and the second the annotation is cut to allow; None when it is not.
    The clocks are read once, for all the nodes a tick judges."""
    server_now, slack = _server_now(clocks, now)

    def ahead(when: datetime) -> timedelta | None:
        by = when - server_now
        return by if by > slack else None

    return ahead


def future_bound(clocks: Clocks, now: datetime) -> datetime:
    """The latest time written on a node that ``in_future`` does not find ahead: a time after
    it is, one at it or before is not. For a scan of many nodes, a comparison each."""
    server_now, slack = _server_now(clocks, now)
    return server_now + slack


def _server_now(clocks: Clocks, now: datetime) -> tuple[datetime, timedelta]:
    """The API server's now for a tick at ``now``, and the slack a time past it is allowed."""
    skew = clocks.skew(Against.APISERVER)
    server_now = now if skew is None else now - clocks.correction + skew.offset
    return server_now, (skew.uncertainty if skew is not None else timedelta(0)) + SECOND


def doc(clocks: Clocks) -> dict[str, object]:
    """The clocks as the audit record's inputs and ``explain`` show them."""
    return {
        "bound_seconds": clocks.bound.total_seconds(),
        "skew": {
            str(s.against): {
                "offset_seconds": round(s.offset.total_seconds(), 3),
                "uncertainty_seconds": round(s.uncertainty.total_seconds(), 3),
                "readings": s.readings,
            }
            for s in clocks.skews
        },
        "unmeasured": sorted(str(a) for a in clocks.unmeasured),
        "problems": list(clocks.problems()),
    }
