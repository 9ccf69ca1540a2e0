"""The Prometheus adapter against a real Prometheus holding series backfilled from a real trace.

The data (see ``tests/adapters/prometheus.py``): pool ``code`` (two vLLM pods on two nodes),
pool ``conv`` (one pod whose vLLM series stop early: a stale series), pool ``idle`` (a pod but no
vLLM series). Expected values are computed here by hand from the generated counters and gauges.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from rebalancer.adapters.metrics import (
    DCGM_GPU_BUSY,
    MetricQuery,
    Metrics,
    Queries,
    Settings,
    gather_pools,
    node_regex,
    render,
)
from rebalancer.core.model import NodeName, PoolName, Sample
from tests.adapters.prometheus import CONV_LAST, MINUTES, START, Data, Server, running, scrape_time

CODE = PoolName("code")
CONV = PoolName("conv")
IDLE = PoolName("idle")
NODES = {
    CODE: [NodeName("gpu-code-0"), NodeName("gpu-code-1")],
    CONV: [NodeName("gpu-conv-0")],
    IDLE: [NodeName("gpu-idle-0")],
}


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("prometheus")) as server:
        yield server


@pytest.fixture(scope="session")
def major(prometheus: Server) -> int:
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/status/buildinfo", timeout=5) as r:
        version: str = json.load(r)["data"]["version"]
    return int(version.split(".", maxsplit=1)[0])


@pytest.fixture
def metrics(prometheus: Server) -> Iterator[Metrics]:
    m = Metrics(Settings(url=prometheus.url, timeout=5.0))
    yield m
    m.close()


def rate_at_scrape(data: Data, pod: str, k: int, major: int) -> float:
    """``rate(counter[5m])`` evaluated exactly at scrape ``k`` (one sample a minute).

    Prometheus 2 selects ``[t-5m, t]`` (six samples, no extrapolation); Prometheus 3 selects
    ``(t-5m, t]`` (five samples; the 60 s to the window's start is under 1.1 x the interval, so it
    extrapolates to the full 300 s, which is the same as dividing the 4-minute increase by 240).
    """
    c = data.counter[pod]
    return (c[k] - c[k - 5]) / 300 if major < 3 else (c[k] - c[k - 4]) / 240


def test_pool_scoping_builds_an_anchored_escaped_alternation() -> None:
    assert node_regex(["b.example", "a", "a"]) == "a|b\\\\.example"
    q = render("sum(x * on (namespace, pod) $scope) # $pool", "p", ["n1"], Queries().scope)
    assert q == (
        'sum(x * on (namespace, pod) max by (namespace, pod, node) (kube_pod_info{node=~"n1"})) # p'
    )
    with pytest.raises(ValueError, match="not a node name"):
        node_regex(['evil"})or vector(1)'])


async def test_demand_and_queue_carry_the_sample_time_and_match_the_trace(
    metrics: Metrics, prometheus: Server, major: int
) -> None:
    data = prometheus.data
    k = 120
    now = scrape_time(k) + timedelta(seconds=20)
    got = await metrics.read(CODE, NODES[CODE], now=now)

    assert got.errors == ()
    assert got.demand is not None
    assert got.queue is not None
    # The time is the scrape time of the last sample, not the query time.
    assert got.demand.at == scrape_time(k)
    assert got.queue.at == scrape_time(k)
    expected = sum(rate_at_scrape(data, pod, k, major) for pod in ("code-a", "code-b"))
    assert got.demand.value == pytest.approx(expected, rel=1e-9)
    # About 1,500 requests a minute in the trace: ~25 rps. A sanity check on the arithmetic.
    assert 5 < got.demand.value < 100
    assert got.queue.value == data.waiting["code-a"][k] + data.waiting["code-b"][k]
    assert got.running is None  # no vllm:num_requests_running series: unknown, not zero


async def test_pool_scoping_only_counts_pods_on_the_pools_nodes(
    metrics: Metrics, prometheus: Server, major: int
) -> None:
    k = 100
    now = scrape_time(k)
    one = await metrics.read(CODE, [NodeName("gpu-code-1")], now=now)
    assert one.demand == Sample(rate_at_scrape(prometheus.data, "code-b", k, major), now)
    both = await gather_pools(metrics, NODES, now=now)
    conv = both[CONV].demand
    assert conv is not None
    assert conv.value == pytest.approx(rate_at_scrape(prometheus.data, "conv-a", k, major))


async def test_a_pool_with_no_series_is_unknown_never_zero(metrics: Metrics) -> None:
    now = scrape_time(100)
    idle = await metrics.read(IDLE, NODES[IDLE], now=now)  # a pod, but no vLLM series
    assert (idle.demand, idle.queue, idle.running, idle.errors) == (None, None, None, ())
    nowhere = await metrics.read(PoolName("x"), [NodeName("no-such-node")], now=now)
    assert (nowhere.demand, nowhere.queue, nowhere.errors) == (None, None, ())
    empty = await metrics.read(PoolName("x"), [], now=now)
    assert (empty.demand, empty.queue) == (None, None)
    # Prometheus' own clock (2026): the May 2024 series are far outside the lookback.
    today = await metrics.read(CODE, NODES[CODE])
    assert (today.demand, today.queue, today.errors) == (None, None, ())


async def test_a_stale_series_comes_back_with_its_old_time(
    metrics: Metrics, prometheus: Server, major: int
) -> None:
    data = prometheus.data
    now = scrape_time(CONV_LAST) + timedelta(minutes=8)
    got = await metrics.read(CONV, NODES[CONV], now=now)
    assert got.errors == ()
    assert got.demand is not None
    assert got.queue is not None
    # The last sample, as it was when it was scraped: the planner sees it is 8 minutes old.
    assert got.demand.at == scrape_time(CONV_LAST)
    assert got.demand.age(now) == timedelta(minutes=8)
    assert got.demand.value == pytest.approx(rate_at_scrape(data, "conv-a", CONV_LAST, major))
    assert got.queue == Sample(data.waiting["conv-a"][CONV_LAST], scrape_time(CONV_LAST))

    # Past the lookback (10 min by default, plus the 5 min Prometheus looks back): nothing.
    later = await metrics.read(CONV, NODES[CONV], now=now + timedelta(minutes=8))
    assert (later.demand, later.queue, later.errors) == (None, None, ())


async def test_per_node_gpu_busy(prometheus: Server) -> None:
    data = prometheus.data
    k = 60
    settings = Settings(url=prometheus.url, queries=Queries(gpu_busy=DCGM_GPU_BUSY))
    m = Metrics(settings)
    try:
        got = await m.read(CODE, NODES[CODE], now=scrape_time(k) + timedelta(seconds=5))
    finally:
        m.close()
    assert got.errors == ()
    assert dict(got.gpu_busy) == {
        "gpu-code-0": Sample(min(100, data.requests["code-a"][k] // 10), scrape_time(k)),
        "gpu-code-1": Sample(min(100, data.requests["code-b"][k] // 10), scrape_time(k)),
    }


async def test_history_is_the_rate_per_bucket_with_gaps_as_none(
    metrics: Metrics, prometheus: Server
) -> None:
    data = prometheus.data
    step = timedelta(minutes=5)
    since = START + timedelta(minutes=60)
    got = await metrics.history(CODE, NODES[CODE], since, since + timedelta(hours=1), step)
    assert got.error is None
    h = got.history
    assert (h.start, h.step, h.end_index, len(h.values)) == (since, step, 12, 12)
    for i, v in enumerate(h.values):
        # Bucket i ends at minute j; the window [t-5m, t] holds the scrapes of minutes j-5..j-1
        # (at :30), so no sample sits on a boundary and Prometheus 2 and 3 agree: the 4-minute
        # increase, extrapolated by 30 s at each end to 300 s, over 300 s, i.e. over 240 s.
        j = 60 + 5 * (i + 1)
        want = sum(
            (data.counter[p][j - 1] - data.counter[p][j - 5]) / 240 for p in ("code-a", "code-b")
        )
        assert v == pytest.approx(want, rel=1e-9)

    # conv's series stop after minute CONV_LAST (159): later buckets are gaps, never zeros.
    since = START + timedelta(minutes=150)
    conv = await metrics.history(CONV, NODES[CONV], since, START + timedelta(minutes=MINUTES), step)
    assert conv.error is None
    assert [v is None for v in conv.history.values] == [False, False, True, True, True, True]
    assert conv.history.window(since, since + timedelta(hours=1)) == list(conv.history.values[:2])


async def test_a_bad_query_is_an_error_value_naming_pool_query_and_reason(
    prometheus: Server,
) -> None:
    broken = MetricQuery(value="sum(rate(", sampled="timestamp(up) and on () $scope(")
    settings = Settings(url=prometheus.url, queries=Queries(demand=broken, running=None))
    m = Metrics(settings)
    try:
        started = time.monotonic()
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
        elapsed = time.monotonic() - started
    finally:
        m.close()
    assert got.demand is None
    assert got.queue is not None  # one broken query does not take the others down
    assert len(got.errors) == 1
    err = got.errors[0]
    assert (err.pool, err.metric) == ("code", "demand")
    assert "timestamp(up)" in err.query
    assert "HTTP 400" in err.reason
    assert "parse error" in err.reason
    assert "gave up" not in err.reason  # a refusal is not retried
    assert "pool code: demand unknown: Prometheus answered HTTP 400" in str(err)
    assert elapsed < 2


@pytest.mark.parametrize(("suffix", "shown"), [(" / 0", "+Inf"), (" * 0 / 0", "NaN")])
async def test_nan_and_inf_are_unknown_never_zero(
    prometheus: Server, suffix: str, shown: str
) -> None:
    queue = Queries().queue
    weird = MetricQuery(value=f"({queue.value}){suffix}", sampled=queue.sampled)
    m = Metrics(Settings(url=prometheus.url, queries=Queries(demand=weird, running=None)))
    try:
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
    finally:
        m.close()
    assert got.demand is None
    assert got.queue is not None
    assert [(e.metric, e.reason) for e in got.errors] == [
        ("demand", f"the value is {shown}, not a finite number >= 0")
    ]


async def test_a_scalar_answer_is_an_error_not_a_traceback(prometheus: Server) -> None:
    queue = Queries().queue
    odd = MetricQuery(value="scalar(vector(1))", sampled=queue.sampled)
    m = Metrics(Settings(url=prometheus.url, queries=Queries(queue=odd, running=None)))
    try:
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
    finally:
        m.close()
    assert got.demand is not None
    assert got.queue is None
    assert len(got.errors) == 1
    assert got.errors[0].metric == "queue"
    at = int(scrape_time(100).timestamp())  # the value is evaluated at the last sample's time
    assert got.errors[0].reason == (
        f"unexpected answer (not an instant or range vector): [{at}, '1']"
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_an_outage_is_unknown_with_a_clear_error_and_bounded_retries() -> None:
    settings = Settings(url=f"http://127.0.0.1:{closed_port()}", timeout=1.0, backoff=0.05)
    m = Metrics(settings)
    try:
        started = time.monotonic()
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
        elapsed = time.monotonic() - started
        hist = await m.history(
            CODE, NODES[CODE], START, START + timedelta(hours=1), timedelta(minutes=5)
        )
    finally:
        m.close()
    assert (got.demand, got.queue, got.running) == (None, None, None)
    assert {e.metric for e in got.errors} == {"demand", "queue", "running"}
    for e in got.errors:
        assert e.pool == "code"
        assert e.reason == "cannot reach Prometheus (ConnectionError); gave up after 3 attempts"
    assert elapsed < 2
    assert hist.error is not None
    assert "cannot reach Prometheus" in hist.error.reason
    assert all(v is None for v in hist.history.values)
    assert hist.history.end_index == 0


async def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as listener:  # accepts connections (backlog) and never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        settings = Settings(
            url=f"http://127.0.0.1:{port}",
            timeout=0.5,
            attempts=2,
            backoff=0.05,
            queries=Queries(running=None),
        )
        m = Metrics(settings)
        try:
            started = time.monotonic()
            got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
            elapsed = time.monotonic() - started
        finally:
            m.close()
    assert (got.demand, got.queue) == (None, None)
    assert [e.reason for e in got.errors] == [
        "timed out (ReadTimeout); gave up after 2 attempts"
    ] * 2
    # Two attempts of 0.5 s each and a short backoff; demand and queue run concurrently.
    assert 1.0 <= elapsed < 3.0


class _Counting(http.server.BaseHTTPRequestHandler):
    status = 503
    hits = 0
    lock = threading.Lock()

    def do_GET(self) -> None:
        with self.lock:
            type(self).hits += 1
        body = b'{"status":"error","errorType":"unavailable","error":"overloaded"}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[tuple[str, type[_Counting]]]:
    handler = type("Handler", (_Counting,), {"hits": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("status", "requests", "reason"),
    [
        (503, 3, "Prometheus answered HTTP 503: overloaded; gave up after 3 attempts"),
        (422, 1, "Prometheus answered HTTP 422: overloaded"),
    ],
)
async def test_retries_5xx_a_bounded_number_of_times_and_4xx_never(
    fake: tuple[str, type[_Counting]], status: int, requests: int, reason: str
) -> None:
    url, handler = fake
    handler.status = status
    settings = Settings(url=url, backoff=0.01, queries=Queries(running=None))
    m = Metrics(replace(settings, queries=replace(settings.queries, queue=settings.queries.demand)))
    try:
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
    finally:
        m.close()
    assert got.demand is None
    assert [e.reason for e in got.errors] == [reason, reason]
    # Two queries (demand, and queue made the same), each tried `requests` times and no more:
    # the library's own urllib3 retries are off, or a 503 would be tried 4 times per attempt.
    assert handler.hits == 2 * requests


def test_backfill_left_a_data_directory(prometheus: Server) -> None:
    """The fixture's commands, for the record: promtool made blocks, Prometheus serves them."""
    assert prometheus.backfill[1:4] == ["tsdb", "create-blocks-from", "openmetrics"]
    assert "--storage.tsdb.retention.time=10y" in prometheus.command
    assert any(
        p.is_dir() and p.name.startswith("01") for p in Path(prometheus.backfill[-1]).iterdir()
    )
