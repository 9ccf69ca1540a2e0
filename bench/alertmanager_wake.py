"""How soon an Alertmanager notification takes a lent node back, against a 60 s tick.

What it measures: the controller (``wiring.Controller.open`` and ``Controller.run``, the
process's own code: the informer, the loop, the HTTP server, the SQLite audit store) runs
against the API emulator served over HTTP in this process, with one pool of 8 inference nodes,
6 of them lent, a steady low demand (a constant metrics source: the alert is the only thing
that says inference is short) and a tick interval of 60 s. Each repetition fires an alert that
matches the pool's ``wake_on`` and times, to the first reclaim write the emulator took (a PATCH
of a node answered 2xx that sets its state label to ``reclaiming``):

- from the webhook: when the notification reached the controller's endpoint;
- from the alert: when it was posted to a real Alertmanager (``/api/v2/alerts``, one alert per
  group, ``group_wait: 0s``) whose receiver is the controller's endpoint, when Debian's
  ``prometheus-alertmanager`` is installed (``--direct``: the bench posts the documented
  payload to the controller itself, and only the first figure is measured).

Between repetitions the alert is resolved (a resolved notification to the controller, and the
alert ended in Alertmanager) and the pool lends its 6 nodes again, at the next scheduled tick:
alerts run the step early at most once per tick interval, so each repetition after the first
waits for that tick before its alert, and a run takes about a minute a repetition. The webhook
carries a bearer token, as the chart's receiver does. With Alertmanager a small proxy in this
process notes when each notification arrives and passes it on unchanged.

    .venv/bin/python bench/alertmanager_wake.py              # 20 repetitions, ~20 min
    .venv/bin/python bench/alertmanager_wake.py --direct --repetitions 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.core.model import (
    DemandHistory,
    HistoryResult,
    NodeName,
    PoolMetrics,
    PoolName,
    Sample,
)
from rebalancer.runtime import wiring
from sandbox.emulator import cluster
from sandbox.emulator.server import Request, serve
from sandbox.emulator.store import Store

POOL = "inference"
STATE = "rebalancer.io/state"
TOKEN = "bench-token"
TICK = timedelta(seconds=60)
LENT = 6  # 8 nodes, min_serving 2
GOAL = 1.0  # seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SteadyDemand:
    """A metrics source that always reads 5 rps and an empty queue, sampled now."""

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        at = now or datetime.now(UTC)
        return PoolMetrics(pool=pool, demand=Sample(5.0, at), queue=Sample(0.0, at))

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        return HistoryResult(DemandHistory.empty(until))


class Writes:
    """The emulator's request log, reduced to the moment of the first reclaim write."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.seen = asyncio.Event()

    def arm(self) -> None:
        self.first = None
        self.seen.clear()

    def __call__(self, request: Request) -> None:
        body = request.response or {}
        labels = body.get("metadata", {}).get("labels", {}) if isinstance(body, dict) else {}
        if (
            request.method == "PATCH"
            and request.resource == "nodes"
            and 200 <= request.status < 300
            and labels.get(STATE) == "reclaiming"
            and self.first is None
        ):
            self.first = time.perf_counter()
            self.seen.set()


def settings(tmp: Path, port: int) -> settings_mod.Settings:
    doc: dict[str, Any] = {
        "tick_interval": f"{TICK.total_seconds():g}s",
        "leader_election": {"enabled": False},
        "audit": {"url": f"sqlite+aiosqlite:///{tmp / 'audit.sqlite3'}"},
        # The emulator reviews no token here: the receiver's own shared token, behind an open
        # port (what is measured is the wake, not the review: bench/http_auth.py has that).
        "http": {
            "host": "127.0.0.1",
            "port": port,
            "health_port": free_port(),
            "authentication": "none",
        },
        "alertmanager": {"token": TOKEN},
        "log_level": "WARNING",
        "pools": [
            {
                "name": POOL,
                "node_selector": {"gpu-pool": "inference"},
                "rps_per_node": 10,
                "lend_only_to_takers": False,
                "strategy": {"name": "window", "params": {"window": "always", "lead_minutes": 0}},
                "limits": {
                    "min_serving": 2,
                    "max_step_fraction": 1.0,
                    "cooldown": "0s",
                    "warmup": "0s",
                    "reclaim_deadline": "5s",
                },
                "wake_on": [{"matchers": ['alertname="InferenceQueueHigh"', 'service="llm"']}],
            }
        ],
    }
    path = tmp / "config.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return settings_mod.load(path, env={})


def payload(rep: int, status: str, starts: datetime) -> dict[str, Any]:
    """Alertmanager's webhook version 4, as it sends one alert of a group of one."""
    labels = {"alertname": "InferenceQueueHigh", "service": "llm", "rep": str(rep)}
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="InferenceQueueHigh", rep="{rep}", service="llm"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "rebalancer",
        "groupLabels": labels,
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": {},
                "startsAt": starts.isoformat(),
                "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else _now().isoformat(),
                "generatorURL": "",
                "fingerprint": f"{rep:016x}",
            }
        ],
    }


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------------------------------
# A real Alertmanager, and the proxy that notes when its notifications arrive


class Proxy:
    def __init__(self, target: str, session: aiohttp.ClientSession) -> None:
        self.target, self.session = target, session
        self.arrived: dict[str, float] = {}  # rep label -> when its firing notification came

    async def handle(self, request: web.Request) -> web.Response:
        arrived = time.perf_counter()
        body = await request.read()
        doc = json.loads(body)
        if doc.get("status") == "firing":
            for a in doc.get("alerts", []):
                self.arrived.setdefault(a["labels"].get("rep", ""), arrived)
        headers = {"Content-Type": "application/json"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        async with self.session.post(self.target, data=body, headers=headers) as r:
            return web.Response(status=r.status, body=await r.read())


@contextlib.asynccontextmanager
async def proxy(target: str, session: aiohttp.ClientSession) -> AsyncIterator[tuple[Proxy, str]]:
    p = Proxy(target, session)
    app = web.Application()
    app.router.add_post("/api/v1/alertmanager", p.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield p, f"http://127.0.0.1:{port}/api/v1/alertmanager"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def alertmanager(
    binary: str, tmp: Path, webhook: str, session: aiohttp.ClientSession
) -> AsyncIterator[str]:
    config = {
        "route": {
            "receiver": "rebalancer",
            "group_by": ["..."],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1m",
        },
        "receivers": [
            {
                "name": "rebalancer",
                "webhook_configs": [
                    {
                        "url": webhook,
                        "send_resolved": True,
                        "http_config": {"authorization": {"type": "Bearer", "credentials": TOKEN}},
                    }
                ],
            }
        ],
    }
    path = tmp / "alertmanager.yml"
    path.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    log = (tmp / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={path}",
            f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(20):
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/-/ready") as r:
                        if r.status == 200:
                            break
                assert proc.poll() is None, (tmp / "alertmanager.log").read_text()
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


# ---------------------------------------------------------------------------------------------


async def lent_count(core: Any) -> int:
    nodes = (await core.list_node(label_selector="gpu-pool=inference")).items
    return sum(1 for n in nodes if (n.metadata.labels or {}).get(STATE) == "lent")


@dataclass
class Run:
    """One controller, its endpoint, and (optionally) Alertmanager in front of it."""

    session: aiohttp.ClientSession
    writes: Writes
    endpoint: str
    alertmanager: str | None = None
    relay: Proxy | None = None
    from_webhook: list[float] = field(default_factory=list)
    from_alert: list[float] = field(default_factory=list)

    async def first_write(self) -> float:
        async with asyncio.timeout(30):
            await self.writes.seen.wait()
        assert self.writes.first is not None
        return self.writes.first

    async def through_alertmanager(self, rep: int, starts: datetime) -> None:
        assert self.alertmanager is not None
        assert self.relay is not None
        labels = {"alertname": "InferenceQueueHigh", "service": "llm", "rep": str(rep)}
        alert = {"labels": labels, "startsAt": starts.isoformat()}
        posted = time.perf_counter()
        async with self.session.post(self.alertmanager + "/api/v2/alerts", json=[alert]) as r:
            assert r.status == 200, await r.text()
        written = await self.first_write()
        self.from_alert.append(written - posted)
        self.from_webhook.append(written - self.relay.arrived[str(rep)])
        ended = {**alert, "endsAt": _now().isoformat()}
        async with self.session.post(self.alertmanager + "/api/v2/alerts", json=[ended]) as r:
            assert r.status == 200, await r.text()

    async def direct(self, rep: int, starts: datetime) -> None:
        posted = time.perf_counter()
        await self.post(payload(rep, "firing", starts))
        self.from_webhook.append(await self.first_write() - posted)

    async def post(self, doc: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with self.session.post(self.endpoint, data=json.dumps(doc), headers=headers) as r:
            assert r.status == 200, await r.text()


async def repeat(run: Run, core: Any, repetitions: int) -> None:
    for rep in range(repetitions):
        async with asyncio.timeout(90):
            while await lent_count(core) != LENT:
                await asyncio.sleep(0.05)
        run.writes.arm()
        starts = _now()
        if run.alertmanager is not None:
            await run.through_alertmanager(rep, starts)
        else:
            await run.direct(rep, starts)
        await run.post(payload(rep, "resolved", starts))  # the pool lends again


async def bench(repetitions: int, direct: bool) -> None:
    found = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    binary = None if direct else found
    if not direct and binary is None:
        print("prometheus-alertmanager is not installed: posting the webhook directly")
    writes = Writes()
    store = Store(seed=1)
    cluster.seed(store)
    port = free_port()
    endpoint = f"https://127.0.0.1:{port}/api/v1/alertmanager"  # self-signed: not verified
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        async with (
            serve(store, on_request=writes) as url,
            client.ApiClient(client.Configuration(host=url)) as api,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session,
            wiring.Controller.open(
                settings(tmp, port), wiring.Seams(api=api, metrics=SteadyDemand(), sink=None)
            ) as controller,
            contextlib.AsyncExitStack() as stack,
        ):
            run = Run(session, writes, endpoint)
            if binary is not None:
                run.relay, hook = await stack.enter_async_context(proxy(endpoint, session))
                run.alertmanager = await stack.enter_async_context(
                    alertmanager(binary, tmp, hook, session)
                )
            stop = asyncio.Event()
            running = asyncio.create_task(controller.run(stop))
            try:
                await repeat(run, client.CoreV1Api(api), repetitions)
            finally:
                stop.set()
                await running
    report(run.from_webhook, run.from_alert, repetitions)


def report(from_webhook: list[float], from_alert: list[float], repetitions: int) -> None:
    print(f"alertmanager wake: {repetitions} repetitions, 6 lent nodes of 8, API emulator")
    print(f"  poll interval (tick_interval):       {TICK.total_seconds():8.1f} s")
    for label, values in (
        ("webhook -> first reclaim write", from_webhook),
        ("alert posted to Alertmanager -> write", from_alert),
    ):
        if values:
            print(
                f"  {label:37s} median {statistics.median(values) * 1000:7.1f} ms, "
                f"max {max(values) * 1000:7.1f} ms"
            )
    worst = max(from_webhook + from_alert)
    verdict = "meets" if worst <= GOAL else "MISSES"
    print(f"  goal: every reclaim write within {GOAL:g} s: {verdict} (worst {worst:.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument(
        "--direct", action="store_true", help="post the webhook itself, without Alertmanager"
    )
    args = parser.parse_args()
    asyncio.run(bench(args.repetitions, args.direct))


if __name__ == "__main__":
    main()
