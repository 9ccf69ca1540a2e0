"""The Prometheus adapter against a real Prometheus holding series backfilled from a real trace.

The data (see ``tests/support/prometheus.py``): pool ``code`` (two vLLM pods on two nodes),
pool ``conv`` (one pod whose vLLM series stop early: a stale series), pool ``idle`` (a pod but no
vLLM series). Expected values are computed here by hand from the generated counters and gauges.

The default demand query's cases (section "Demand when pods come and go") run on a second
Prometheus with series made here: pods scraped every 15 s serving a known rate, steady, all
replaced by a rollout, recreated under their own name, restarted. Each is read with the default
query and with the old ``rate()`` alone, which a rollout shows reading a fraction of the load.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rebalancer.adapters.metrics import Metrics, Settings, node_regex, render
from rebalancer.adapters.promql import DCGM_GPU_BUSY, VLLM_DEMAND, MetricQuery, Queries
from rebalancer.core.model import NodeName, PoolName, Sample
from tests.support.processes import free_port
from tests.support.prometheus import (
    CONV_LAST,
    MINUTES,
    START,
    Data,
    Server,
    gather_pools,
    require,
    scrape_time,
)

CODE = PoolName("code")
CONV = PoolName("conv")
IDLE = PoolName("idle")
NODES = {
    CODE: [NodeName("gpu-code-0"), NodeName("gpu-code-1")],
    CONV: [NodeName("gpu-conv-0")],
    IDLE: [NodeName("gpu-idle-0")],
}


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


async def test_a_history_longer_than_one_request_may_ask_for_is_fetched_in_pieces(
    prometheus: Server,
) -> None:
    # 11,520 one-second buckets: Prometheus refuses more than 11,000 points in one request, so
    # the default week-and-a-day at one-minute steps would be refused whole.
    history = (
        "sum(rate(vllm:request_success_total[5m]) * on (namespace, pod) group_left (node) $scope)"
    )
    m = Metrics(Settings(url=prometheus.url, queries=Queries(history=history)))
    step = timedelta(seconds=1)
    try:
        whole = await m.history(CODE, NODES[CODE], START, START + 11_520 * step, step)
        around = await m.history(
            CODE, NODES[CODE], START + 9_990 * step, START + 10_010 * step, step
        )
    finally:
        m.close()
    assert whole.error is None
    assert len(whole.history.values) == whole.history.end_index == 11_520
    assert around.error is None
    # Across the seam between the two requests, the same values as one request gives.
    assert list(whole.history.values[9_990:10_010]) == list(around.history.values)
    assert all(v is not None for v in around.history.values)


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
        ("demand", f"the value is {shown!r}, not a finite number >= 0")
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


async def test_a_server_not_reached_is_named_without_the_password_its_url_carries() -> None:
    port = closed_port()
    m = Metrics(Settings(url=f"http://reader:s3cret@127.0.0.1:{port}/prom", attempts=1))
    try:
        got = await m.read(CODE, NODES[CODE], now=scrape_time(100))
    finally:
        m.close()
    reasons = {e.reason for e in got.errors}
    assert reasons == {
        f"cannot reach Prometheus at http://127.0.0.1:{port}/prom (ConnectionError); "
        "gave up after 1 attempts"
    }


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
        assert e.reason == (
            f"cannot reach Prometheus at {settings.url} (ConnectionError); gave up after 3 attempts"
        )
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
        f"timed out at {settings.url} (ReadTimeout); gave up after 2 attempts"
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

    def do_POST(self) -> None:  # the adapter's default: the query in a form body
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

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


# ---------------------------------------------------------------------------------------------
# Demand when pods come and go: a second Prometheus, series every 15 s


YOUNG_BASE = datetime(2024, 5, 20, 12, 0, tzinfo=UTC)
SCRAPE = 15  # s: how often these pods are scraped (a common ServiceMonitor interval)
LENGTH = 72 * 60  # s of series from YOUNG_BASE
AT = 3608  # s: the evaluation time of most checks, a scrape of the pods at offset 8 s
REPLACED = AT - 60  # s: the old pods stop, the new ones start counting from 0
TOLERANCE = 0.10  # the demand read may be this far (relative) from the rate really served
# A backfill cannot hold Prometheus' staleness markers (the NaN it writes when a target goes
# away or a scrape fails; instant selectors stop seeing the series from there on), so this
# Prometheus looks back 20 s, just over one scrape interval, instead of 5 minutes: a series that
# stops is gone 20 s later, as a marked one would be. A live series never notices.
LOOKBACK = "20s"
# The default demand query before young series were handled: what the tests below show it read.
OLD_DEMAND = MetricQuery(
    value=(
        "sum(rate(vllm:request_success_total[5m]) * on (namespace, pod) group_left (node) $scope)"
    ),
    sampled=VLLM_DEMAND.sampled,
)
OLD_HISTORY = (
    "sum(rate(vllm:request_success_total[$window]) * on (namespace, pod) group_left (node) $scope)"
)


@dataclass(frozen=True)
class Pod:
    """A vLLM pod serving ``rps`` requests a second while it runs, exactly (no noise)."""

    name: str
    node: str
    instance: str  # the scrape target: a pod recreated under its own name gets a new one
    rps: float
    offset: int  # s past each 15 s boundary at which it is scraped (targets are spread)
    start: int = 0  # s: vLLM starts serving, its counter at 0
    stop: int = LENGTH  # s: no scrape after this
    restart: float | None = None  # s: its container restarts, the counter starts again at 0
    listed: int = 0  # s: kube_pod_info from here (the pod exists before vLLM serves)

    def scrapes(self) -> list[int]:
        return [t for t in range(self.offset, LENGTH, SCRAPE) if self.start <= t <= self.stop]

    def count(self, t: int) -> int:
        since = self.restart if self.restart is not None and self.restart <= t else self.start
        return int(self.rps * (t - since))


STEADY, ROLLOUT, RECREATED, RESTARTED = (
    PoolName(p) for p in ("steady", "rollout", "recreated", "restarted")
)
PODS: dict[PoolName, list[Pod]] = {
    STEADY: [
        Pod("steady-a", "gpu-steady-0", "10.1.0.1:8000", 12, 3),
        Pod("steady-b", "gpu-steady-1", "10.1.0.2:8000", 8, 8),
    ],
    # A Deployment rollout of every pod at once: new names, same nodes, same load.
    ROLLOUT: [
        Pod("vllm-old-a", "gpu-rollout-0", "10.1.1.1:8000", 12, 3, stop=REPLACED),
        Pod("vllm-old-b", "gpu-rollout-1", "10.1.1.2:8000", 8, 8, stop=REPLACED),
        Pod("vllm-new-a", "gpu-rollout-0", "10.1.1.3:8000", 12, 3, REPLACED, listed=AT - 300),
        Pod("vllm-new-b", "gpu-rollout-1", "10.1.1.4:8000", 8, 8, REPLACED, listed=AT - 300),
    ],
    # A StatefulSet pod recreated under its own name: the old and the new series join the same
    # kube_pod_info, so only staleness can tell the old one's rate() tail from a serving pod.
    RECREATED: [
        Pod("vllm-0", "gpu-recreated-0", "10.1.2.1:8000", 12, 3, stop=REPLACED),
        Pod("vllm-0", "gpu-recreated-0", "10.1.2.9:8000", 12, 8, REPLACED),
    ],
    # A container restart: same pod, same series, the counter back to 0 between two scrapes.
    RESTARTED: [
        Pod("vllm-r-a", "gpu-restarted-0", "10.1.3.1:8000", 12, 3, restart=AT - 132.5),
        Pod("vllm-r-b", "gpu-restarted-1", "10.1.3.2:8000", 8, 8),
    ],
}
SERVED = {pool: sum(p.rps for p in pods if p.stop == LENGTH) for pool, pods in PODS.items()}


def young_at(t: float) -> datetime:
    return YOUNG_BASE + timedelta(seconds=t)


def young_series() -> str:
    """The pods above as OpenMetrics: their counters, and kube_pod_info scraped every 15 s."""
    base = int(YOUNG_BASE.timestamp())
    lines = ["# TYPE vllm:request_success counter"]
    for p in (p for pods in PODS.values() for p in pods):
        labels = f'namespace="infer",pod="{p.name}",instance="{p.instance}",finished_reason="stop"'
        lines += [
            f"vllm:request_success_total{{{labels}}} {p.count(t)} {base + t}" for t in p.scrapes()
        ]
    listed: dict[tuple[str, str], tuple[int, int]] = {}  # (pod, node) -> while listed
    for p in (p for pods in PODS.values() for p in pods):
        since, until = listed.get((p.name, p.node), (p.listed, p.stop))
        listed[(p.name, p.node)] = (min(since, p.listed), max(until, p.stop))
    lines.append("# TYPE kube_pod_info gauge")
    for (pod, node), (since, until) in listed.items():
        labels = f'namespace="infer",pod="{pod}",node="{node}"'
        lines += [
            f"kube_pod_info{{{labels}}} 1 {base + t}"
            for t in range(1, LENGTH, SCRAPE)
            if since <= t <= until
        ]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def serving(workdir: Path, series: str, *flags: str) -> Iterator[str]:
    """Backfill ``series`` (OpenMetrics) and serve it; yields the URL. Stopped on exit.

    Ready when Prometheus logs that it is (read from its stderr as it comes), not after a sleep.
    """
    promtool, prometheus = require("promtool"), require("prometheus")
    source, store = workdir / "series.om", workdir / "data"
    source.write_text(series)
    cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(store)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
    config = workdir / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={store}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr = proc.stderr
    assert stderr is not None
    logged: list[str] = []
    ready = threading.Event()

    def read_log() -> None:
        for line in stderr:
            logged.append(line)
            if "Server is ready to receive web requests" in line:
                ready.set()
        ready.set()  # it exited: the check below tells ready from gone

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        if not ready.wait(20) or not any("Server is ready" in line for line in logged):
            pytest.fail("prometheus did not become ready:\n" + "".join(logged[-20:]), pytrace=False)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        stderr.close()


@pytest.fixture(scope="session")
def young(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus-young")
    with serving(workdir, young_series(), f"--query.lookback-delta={LOOKBACK}") as url:
        yield url


async def demand(url: str, pool: PoolName, at: int, query: MetricQuery) -> float:
    """The pool's demand as ``Metrics.read`` gives it when the newest scrape is ``at``."""
    m = Metrics(Settings(url=url, queries=Queries(demand=query, running=None)))
    nodes = sorted({NodeName(p.node) for p in PODS[pool]})
    try:
        # The adapter finds the newest sample on a 15 s grid: 9 s after a scrape at offset 8 s
        # is the next grid point plus 2 s, and the scrape it finds is ``at``.
        got = await m.read(pool, nodes, now=young_at(at + 9))
    finally:
        m.close()
    assert got.errors == ()
    assert got.demand is not None
    assert got.demand.at == young_at(at)
    return got.demand.value


async def test_a_steady_pool_reads_the_rate_it_serves_with_the_new_query_as_with_the_old(
    young: str,
) -> None:
    for query in (VLLM_DEMAND, OLD_DEMAND):
        assert await demand(young, STEADY, AT, query) == pytest.approx(20, rel=TOLERANCE)


@pytest.mark.parametrize("age", [60, 120, 240])
async def test_a_rollout_of_every_pod_reads_the_load_served_where_the_old_query_read_a_fraction(
    young: str, age: int
) -> None:
    at = REPLACED + age
    assert SERVED[ROLLOUT] == 20
    assert await demand(young, ROLLOUT, at, VLLM_DEMAND) == pytest.approx(20, rel=TOLERANCE)
    # The old pods are out of scope (their kube_pod_info is gone), and rate() divides the new
    # pods' `age` seconds of increase by the whole 300 s: about age/300 of the load.
    old = await demand(young, ROLLOUT, at, OLD_DEMAND)
    assert old < (1 - TOLERANCE) * 20
    assert old <= 20 * (age + SCRAPE) / 300


async def test_a_pod_recreated_under_its_own_name_is_counted_once(young: str) -> None:
    # The old series stopped a minute ago; its rate() tail, ~80 % of the pod's load, would be
    # counted next to the new series' slope if series without a sample now were not dropped.
    assert SERVED[RECREATED] == 12
    for query in (VLLM_DEMAND, OLD_DEMAND):
        assert await demand(young, RECREATED, AT, query) == pytest.approx(12, rel=TOLERANCE)


async def test_a_counter_reset_by_a_container_restart_reads_the_rate_served(young: str) -> None:
    # rate() counts the increase after a reset from 0; what is lost is the requests between the
    # last scrape before the restart and the restart (7.5 s of one pod's load in 300 s).
    assert SERVED[RESTARTED] == 20
    for query in (VLLM_DEMAND, OLD_DEMAND):
        assert await demand(young, RESTARTED, AT, query) == pytest.approx(20, rel=TOLERANCE)


async def test_history_across_a_rollout_is_the_rate_served_in_every_bucket(young: str) -> None:
    step = timedelta(minutes=5)
    since = young_at(50 * 60)
    nodes = sorted({NodeName(p.node) for p in PODS[ROLLOUT]})
    read: dict[str, list[float | None]] = {}
    for name, history in (("new", Queries().history), ("old", OLD_HISTORY)):
        m = Metrics(Settings(url=young, queries=Queries(history=history)))
        try:
            got = await m.history(ROLLOUT, nodes, since, since + timedelta(minutes=20), step)
        finally:
            m.close()
        assert got.error is None
        read[name] = list(got.history.values)
    assert read["new"] == [pytest.approx(20, rel=TOLERANCE)] * 4
    # The bucket ending at minute 60 ends 52 s after the rollout: the old query read a fraction.
    assert REPLACED < 60 * 60 < REPLACED + 60
    old = read["old"][1]
    assert old is not None
    assert old < (1 - TOLERANCE) * 20
