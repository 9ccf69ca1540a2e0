"""The clocks the controller depends on, measured over the wire: the API server's by the
``Date`` header of every answer (``kubeclient.ClockProbe``), on the emulator and on a real
kube-apiserver; Prometheus' by ``time()`` (``Metrics.measure_skew``), on a real Prometheus.

The controller's clock is set off from the server's by a known amount (90 s behind, 10 min
ahead) and the measured skew must find it, within its stated uncertainty (the real server's
clock runs on while the test's stands, hence a few seconds of slack there)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters.kubeclient import ClockProbe
from rebalancer.adapters.metrics import Metrics, Settings
from rebalancer.core import clocks
from rebalancer.core.model import Clock
from tests.support.backends import Opened
from tests.support.processes import free_port
from tests.support.prometheus import Server, running

SLACK = timedelta(seconds=5)  # the real servers' clocks move while the test's stand still


def wall() -> datetime:
    return datetime.now(UTC)


def off(base: Clock, seconds: float) -> Clock:
    return lambda: base() + timedelta(seconds=seconds)


def near(skew: clocks.Skew | None, seconds: float, slack: timedelta = timedelta(0)) -> bool:
    assert skew is not None
    return abs(skew.offset - timedelta(seconds=seconds)) <= skew.uncertainty + slack


@pytest.mark.parametrize("seconds", [90.0, -600.0])
async def test_every_answer_of_the_api_server_is_a_reading_of_its_clock(
    cluster: Opened, seconds: float
) -> None:
    # The controller's clock is the server's minus ``seconds``: the server is that far ahead.
    server_clock = cluster.clock if cluster.backend == "emulator" else wall
    probe = ClockProbe(off(server_clock, -seconds))
    probe.watch(cluster.api)
    await client.CoreV1Api(cluster.api).list_node()
    assert len(probe.estimator.readings) == 1
    skew = probe.skew()
    assert skew is not None
    assert near(skew, seconds, SLACK)
    # The Date header is cut to the second: half of one, plus half the round trip.
    assert timedelta(seconds=0.5) <= skew.uncertainty < timedelta(seconds=1.5)
    assert skew.beyond(clocks.DEFAULT_BOUND)
    # The corrected clock is the server's.
    assert abs(probe.now() - server_clock()) <= skew.uncertainty + SLACK


async def test_a_refusal_is_a_reading_too(cluster: Opened) -> None:
    server_clock = cluster.clock if cluster.backend == "emulator" else wall
    probe = ClockProbe(off(server_clock, -90))
    probe.watch(cluster.api)
    with pytest.raises(client.ApiException):
        await client.CoreV1Api(cluster.api).read_node("no-such-node")
    assert near(probe.skew(), 90, SLACK)


async def test_a_probe_asks_the_server_only_when_no_answer_came_lately(emulated: Opened) -> None:
    probe = ClockProbe(off(emulated.clock, 90), fresh=timedelta(seconds=5))
    probe.watch(emulated.api)
    before = len(emulated.requests.seen)
    assert await probe.measure_skew() is not None  # nothing yet: it asks /version
    assert [r.path for r in emulated.requests.seen[before:]] == ["/version/"]
    await client.CoreV1Api(emulated.api).list_node()
    count = len(emulated.requests.seen)
    assert near(await probe.measure_skew(), -90)  # the list's answer is fresh: no request
    assert len(emulated.requests.seen) == count
    emulated.clock.advance(6)
    await probe.measure_skew()
    assert [r.path for r in emulated.requests.seen[count:]] == ["/version/"]
    assert len(probe.estimator.readings) == 3


def test_a_date_that_is_not_one_is_no_reading() -> None:
    probe = ClockProbe(wall)
    for text in (None, "", "yesterday", "Wed, 01 Jan 2020 00:00:00"):  # the last: no zone
        probe.observe(wall(), wall(), text)
    assert probe.estimator.readings == ()
    assert probe.skew() is None
    assert probe.now() <= wall()


def test_answers_of_one_second_share_their_date_and_a_bad_one_between_is_no_reading() -> None:
    probe = ClockProbe(wall)
    first, second = "Wed, 01 Jan 2020 00:00:00 GMT", "Wed, 01 Jan 2020 00:00:01 +0100"
    for text in (first, "yesterday", first, second, "", "Wed, 01 Jan 2020 00:00:02", first):
        probe.observe(wall(), wall(), text)
    at = datetime(2020, 1, 1, tzinfo=UTC)
    assert [r.server for r in probe.estimator.readings] == [
        at,
        at,
        at - timedelta(minutes=59, seconds=59),
        at,
    ]
    assert all(r.server.tzinfo is UTC for r in probe.estimator.readings)


# -- Prometheus -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("prometheus-clock")) as server:
        yield server


@pytest.mark.parametrize("seconds", [0.0, 90.0, -600.0])
async def test_prometheus_clock_is_read_from_time_to_the_millisecond(
    prometheus: Server, seconds: float
) -> None:
    metrics = Metrics(Settings(url=prometheus.url), clock=off(wall, -seconds))
    try:
        skew = await metrics.measure_skew()
    finally:
        metrics.close()
    assert skew is not None
    assert near(skew, seconds, timedelta(milliseconds=2))
    assert skew.uncertainty < timedelta(seconds=0.5)
    assert skew.beyond(clocks.DEFAULT_BOUND) is (abs(seconds) > 30)


async def test_prometheus_unreachable_is_no_reading_and_the_last_estimate_stands(
    tmp_path: Path,
) -> None:
    down = Metrics(Settings(url=f"http://127.0.0.1:{free_port()}", timeout=1.0), clock=wall)
    try:
        assert await down.measure_skew() is None
    finally:
        down.close()
    with running(tmp_path) as server:
        metrics = Metrics(Settings(url=server.url, timeout=1.0, attempts=1), clock=off(wall, -90))
        assert near(await metrics.measure_skew(), 90, timedelta(milliseconds=2))
    try:  # Prometheus is gone: no new reading, and the one it gave stands
        assert near(await metrics.measure_skew(), 90, timedelta(milliseconds=2))
        assert len(metrics.estimator.readings) == 1
    finally:
        metrics.close()
