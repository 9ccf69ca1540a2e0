"""A real Prometheus, two ways: backfilled with a real trace (the metrics adapter's tests), or
scraping a live target every second (the end-to-end tests).

``backfill`` writes OpenMetrics text made from the bundled Azure LLM trace (CC-BY-4.0) and turns
it into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``; ``running`` starts
``prometheus`` on that data directory on a free port of 127.0.0.1 and stops it afterwards. The
series keep the trace's own times (May 2024), so tests query at those times; retention is 10y so
Prometheus keeps the blocks.

What is generated (one scrape per minute, at the minute's start + 30 s, minutes ``k = 0..n-1``
from ``START``):

| pool | node | pod (namespace ``infer``) | series |
|---|---|---|---|
| code | gpu-code-0 | code-a | trace ``code``, ceil(requests/2) per minute |
| code | gpu-code-1 | code-b | trace ``code``, floor(requests/2) per minute |
| conv | gpu-conv-0 | conv-a | trace ``conv``; its vLLM series STOP after minute ``CONV_LAST`` |
| idle | gpu-idle-0 | batch-x | kube_pod_info only: no vLLM series at all |

``vllm:request_success_total`` at scrape ``k`` counts the pod's requests of minutes ``0..k``;
``vllm:num_requests_waiting`` at scrape ``k`` is that minute's requests // 50;
``DCGM_FI_DEV_GPU_UTIL{Hostname=node}`` is min(100, requests // 10) of the node's pod.

``Scraping`` is Debian's ``prometheus`` scraping one target (``exporter.Exporter``) every second,
on one port and one data directory, that a test can ``stop`` (connection refused, as an outage
looks) and ``start`` again; ``scraping(workdir, target)`` runs one for a block and yields its URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import shutil
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from rebalancer.adapters.metrics import Metrics
from rebalancer.core.model import NodeName, PoolMetrics, PoolName
from tests.support.processes import free_port

TRACE = Path(__file__).parents[2] / "examples" / "traces" / "azure_llm_2024_week_per_minute.csv"
START = datetime(2024, 5, 13, 12, 0, tzinfo=UTC)
MINUTES = 180
CONV_LAST = 159  # conv-a's vLLM series end with the scrape of minute 159 (14:39:30)
OFFSET = timedelta(seconds=30)  # scrape k happens at START + k minutes + 30 s

PODS = {  # pod -> (node, service, share)
    "code-a": ("gpu-code-0", "code", "ceil"),
    "code-b": ("gpu-code-1", "code", "floor"),
    "conv-a": ("gpu-conv-0", "conv", "all"),
    "batch-x": ("gpu-idle-0", "", "none"),
}


def scrape_time(k: int) -> datetime:
    return START + timedelta(minutes=k) + OFFSET


def trace_minutes() -> dict[str, list[int]]:
    """Requests per minute of each service for minutes 0..MINUTES-1 from START."""
    out = {"code": [0] * MINUTES, "conv": [0] * MINUTES}
    with TRACE.open(newline="") as f:
        for row in csv.DictReader(f):
            when = datetime.fromisoformat(row["minute_start_utc"].replace("Z", "+00:00"))
            k = int((when - START).total_seconds() // 60)
            if 0 <= k < MINUTES and row["service"] in out:
                out[row["service"]][k] = int(row["requests"])
    for service, values in out.items():
        assert all(v > 0 for v in values), f"trace {service} has a gap in the test window"
    return out


@dataclass(frozen=True)
class Data:
    requests: dict[str, list[int]]  # pod -> its requests per minute
    counter: dict[str, list[int]]  # pod -> vllm:request_success_total at scrape k
    waiting: dict[str, list[int]]  # pod -> vllm:num_requests_waiting at scrape k
    last: dict[str, int]  # pod -> index of its last vLLM scrape


def generate() -> Data:
    minutes = trace_minutes()
    requests: dict[str, list[int]] = {}
    for pod, (_node, service, share) in PODS.items():
        if share == "none":
            continue
        src = minutes[service]
        if share == "ceil":
            requests[pod] = [(v + 1) // 2 for v in src]
        elif share == "floor":
            requests[pod] = [v // 2 for v in src]
        else:
            requests[pod] = list(src)
    counter = {}
    for pod, reqs in requests.items():
        total, cum = 0, []
        for v in reqs:
            total += v
            cum.append(total)
        counter[pod] = cum
    waiting = {pod: [v // 50 for v in reqs] for pod, reqs in requests.items()}
    last = {pod: (CONV_LAST if pod == "conv-a" else MINUTES - 1) for pod in requests}
    return Data(requests, counter, waiting, last)


def openmetrics(data: Data) -> str:
    lines: list[str] = []

    def family(
        name: str, kind: str, sample: str, series: dict[str, list[tuple[int, float]]]
    ) -> None:
        lines.append(f"# TYPE {name} {kind}")
        for labels, points in series.items():
            for k, v in points:
                ts = int(scrape_time(k).timestamp())
                lines.append(f"{sample}{{{labels}}} {v:g} {ts}")

    def labels(pod: str) -> str:
        return f'namespace="infer",pod="{pod}"'

    family(
        "vllm:request_success",
        "counter",
        "vllm:request_success_total",
        {
            labels(p): [(k, data.counter[p][k]) for k in range(data.last[p] + 1)]
            for p in data.counter
        },
    )
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "vllm:num_requests_waiting",
        {
            labels(p): [(k, data.waiting[p][k]) for k in range(data.last[p] + 1)]
            for p in data.waiting
        },
    )
    family(
        "kube_pod_info",
        "gauge",
        "kube_pod_info",
        {
            f'{labels(p)},node="{node}",uid="uid-{p}"': [(k, 1) for k in range(MINUTES)]
            for p, (node, _s, _h) in PODS.items()
        },
    )
    family(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "DCGM_FI_DEV_GPU_UTIL",
        {
            f'Hostname="{PODS[p][0]}",gpu="0"': [
                (k, min(100, data.requests[p][k] // 10)) for k in range(data.last[p] + 1)
            ]
            for p in ("code-a", "code-b")
        },
    )
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"`{binary}` is not installed: the metrics adapter tests need a real Prometheus "
            "(Debian: apt-get install prometheus)",
            pytrace=False,
        )
    return path


def backfill(workdir: Path, text: str) -> tuple[Path, list[str]]:
    """Write ``text`` (OpenMetrics) and make TSDB blocks of it; returns the data dir and the
    command."""
    promtool = require("promtool")
    source = workdir / "series.om"
    source.write_text(text)
    store = workdir / "data"
    store.mkdir()
    cmd = [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(store)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
    return store, cmd


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen[bytes]
    command: list[str]
    backfill: list[str]
    data: Data


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[Server]:
    """A Prometheus serving the backfilled series; stopped (and waited for) on exit."""
    data = generate()
    store, backfill_cmd = backfill(workdir, openmetrics(data))
    with serving(workdir, store) as (url, proc, cmd):
        yield Server(url, proc, cmd, backfill_cmd, data)


async def gather_pools(
    metrics: Metrics, pools: Mapping[PoolName, Iterable[NodeName]], now: datetime | None = None
) -> dict[PoolName, PoolMetrics]:
    """``metrics.read`` for every pool of the backfilled series at once."""
    names = list(pools)
    reads: list[Awaitable[PoolMetrics]] = [metrics.read(p, pools[p], now) for p in names]
    return dict(zip(names, await asyncio.gather(*reads), strict=True))


@contextlib.contextmanager
def serving(
    workdir: Path,
    store: Path,
    flags: Iterable[str] = (),
    opener: urllib.request.OpenerDirector | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes], list[str]]]:
    """A Prometheus over the TSDB in ``store``, scraping nothing, keeping ten years; yields its
    URL, its process and its command once it is ready, and stops it (waited for) on exit.

    ``flags`` are more of its flags; with ``--web.config.file`` it serves TLS (its URL is then
    ``https://``) and readiness is asked through ``opener``, which shows what it demands."""
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    port = free_port()
    cmd = [
        require("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={store}",
        "--storage.tsdb.retention.time=10y",
        f"--web.listen-address=127.0.0.1:{port}",
        *flags,
    ]
    log_path = workdir / "prometheus.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"{'https' if opener is not None else 'http'}://127.0.0.1:{port}"
    ask = opener.open if opener is not None else urllib.request.urlopen
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                tail = log_path.read_text()[-2000:]
                pytest.fail(f"prometheus exited ({proc.returncode}):\n{tail}", pytrace=False)
            with (
                contextlib.suppress(OSError),
                ask(f"{url}/-/ready", timeout=1) as r,
            ):
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail("prometheus did not become ready in 30 s", pytrace=False)
            time.sleep(0.1)
        yield url, proc, cmd
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# ---------------------------------------------------------------------------------------------
# Scraping a live target


async def _ready(url: str, proc: asyncio.subprocess.Process, log: Path, within: float) -> None:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + within
        while True:
            if proc.returncode is not None:
                pytest.fail(f"prometheus exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/-/ready") as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready in {within} s:\n{log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)


@dataclass
class Scraping:
    """A real Prometheus scraping ``target`` every second, on one port and one data directory,
    that a test can ``stop`` (connection refused, as an outage looks) and ``start`` again."""

    workdir: Path
    target: str
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None
    job: str = "vllm"
    how: str = ""  # more of the scrape job's settings, YAML lines (scheme, authorization...)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        binary = require("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: {self.job}\n    static_configs: [{{targets: ['{self.target}']}}]\n"
            + "".join(f"    {line}\n" for line in self.how.splitlines()),
            encoding="utf-8",
        )
        log = self.workdir / "prometheus.log"
        with log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        await _ready(self.url, self.proc, log, within=20)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def scraping(workdir: Path, target: str) -> AsyncIterator[str]:
    """A real Prometheus scraping ``target`` every second; yields its URL, stops it on exit."""
    server = Scraping(workdir, target)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
