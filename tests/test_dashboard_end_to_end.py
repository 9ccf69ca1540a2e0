"""Every panel of the dashboard, read from a real Prometheus that scraped a controller across
a restart, and the SQL panel from the PostgreSQL store that controller wrote.

The controller process runs on the emulator (``tests.support.harness``: 8 nodes of 10 rps, two
serving, a 1 s tick) with its audit store on PostgreSQL, and a second real Prometheus scrapes
its ``/metrics`` every second as a ServiceMonitor would (https, the target labels ``namespace``
and ``pod``). The controller lends the six idle nodes at low load and reclaims them when the
load rises, is stopped (SIGTERM), starts again and does it once more: twelve reclaims, six per
process, each process's series starting from zero.

Then every target of the rendered dashboard (with the PostgreSQL panel) runs as Grafana would
run it over the time range: a range query for a timeseries target, an instant query for a stat
or a table, with ``$__range`` the range, ``$__rate_interval`` four scrape intervals, every pool.
Each returns data and never NaN, but for a quantile: it has a point exactly where its count in
the window is above 0 (unguarded, it read NaN elsewhere), and so none at all for the pods'
answers here (no pod of the harness answers a notice), where its panel's noValue says why.
"Reclaims in range" is the twelve reclaims the audit store holds, the decision log lists every
intent of the store with its last outcome, and the SQL panel's query returns the store's
intents with their origin.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from rebalancer.adapters.audit import SqlAuditStore
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import BACK, Outcome
from tests.support import grafana
from tests.support.harness import IDLE, LOW, PEAK, POOL, Controller, Harness, harness
from tests.support.postgres import PostgresServer
from tests.support.prometheus import Scraping
from tests.support.waits import until

POSTGRES = {"audit": {"store": "postgresql", "postgresql": {"existingSecret": "audit-db"}}}
DASHBOARD = {"monitoring": {"dashboard": {"enabled": True}}, **POSTGRES}
# The controller's target as the chart's ServiceMonitor scrapes it, with the labels its
# Service's endpoints give every series.
SCRAPE = """scheme: https
tls_config: {insecure_skip_verify: true}
relabel_configs:
  - {target_label: namespace, replacement: rebalancer}
  - {target_label: pod, replacement: rebalancer-0}"""
RUNS = 2
# Grafana's variables as the test's panels have them: every cluster (a Prometheus that adds no
# cluster label), the release's namespace and job, the pool; four scrape intervals of 1 s.
VALUES = {
    "$cluster": ".*",
    "$namespace": "rebalancer",
    "$job": "rebalancer",
    "$pool": f"({POOL})",
    "$__rate_interval": "4s",
}


async def test_every_panel_reads_the_controller_across_a_restart(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    began = time.monotonic()
    database = await postgres_server.create_database(f"dash_{uuid.uuid4().hex[:12]}")
    async with harness(tmp_path) as h:
        h.audit_url = database
        config = h.config()
        port = json.loads(config.read_text())["http"]["port"]
        scrape = Scraping(tmp_path / "scrape", f"127.0.0.1:{port}", job="rebalancer", how=SCRAPE)
        await scrape.start()
        try:
            start, made = datetime.now(UTC), 0
            for _ in range(RUNS):
                h.exporter.set_load(LOW, 0)
                async with h.controller(config) as c:
                    made = await lend_and_reclaim(h, c, scrape.url, made)
            records = await h.records()
            end = datetime.now(UTC)
            async with aiohttp.ClientSession(scrape.url) as prom:
                results = await every_panel(prom, start, end)
                exact = await reclaims_at_the_last_scrape(prom, start, end)
        finally:
            await scrape.stop()
    rows = await sql_panel(database, start, end)

    for title, ref, values in results:
        print(f"\n{title} [{ref}]: {summary(values)}", end="")
    by_title = {(title, ref): values for title, ref, values in results}
    # every reclaim of both processes, the first of each included
    assert made == back(records) >= RUNS * len(IDLE)
    [reclaimed] = by_title[("Reclaims in range", "A")].values()
    print(f"\nReclaims in range: {reclaimed[-1]:g} at the end, {exact:g} at the last scrape")
    assert exact == made
    # At the end, after the last scrape, increase() extrapolates half a scrape interval on: a
    # fraction of the count per sample in the range (a few dozen here; hundreds on a dashboard).
    assert made <= reclaimed[-1] <= made * 1.1, reclaimed
    check_decision_log(by_title[("Decisions in range (decision log)", "A")], records)
    [lent] = by_title[("Nodes lent per pool", "A")].values()
    assert (max(lent), lent[-1]) == (len(IDLE), 0)
    assert len(by_title[("Leader", "A")]) == RUNS  # one identity per process, each leading
    for ref in "ABCD":  # failures, failing, spooled, overflows: all there, all 0
        assert {v for vs in by_title[("Audit store failures", ref)].values() for v in vs} == {0}
    intents = {r.id: r for r in records if r.kind is Kind.INTENT}
    shown = {row["id"]: row for row in rows if row["kind"] == "intent"}
    assert set(shown) == set(intents)
    assert {(row["origin"], row["pool"]) for row in shown.values()} == {
        (str(r.origin), POOL) for r in intents.values()
    }
    print(f"\nSQL panel: {len(rows)} rows, kinds {dict(Counter(r['kind'] for r in rows))}")
    print(f"{time.monotonic() - began:.1f}s in all")


def back(records: list[AuditRecord]) -> int:
    """The reclaims of the audit log after which the node served again."""
    last = last_outcomes(records)
    return sum(
        1
        for r in records
        if r.kind is Kind.INTENT and r.action == "reclaim" and last.get(r.id) in BACK
    )


def last_outcomes(records: list[AuditRecord]) -> dict[str, Outcome]:
    last: dict[str, Outcome] = {}
    for r in records:
        if r.kind is Kind.OUTCOME and r.intent_id is not None and r.outcome is not None:
            last[r.intent_id] = r.outcome
    return last


async def lend_and_reclaim(h: Harness, c: Controller, prometheus: str, before: int) -> int:
    """The six idle nodes lent at low load, all taken back at the peak; returns the reclaims
    made so far, once Prometheus has seen this process count its own (``before`` were the
    earlier processes') and nothing lent for two scrapes."""
    await h.wait_lent(c, set(IDLE))
    # Every lend scraped before the peak: a node's decision series is its latest decision, so a
    # reclaim within the same scrape interval would take its place before Prometheus saw it.
    applied = f'pool="{POOL}",action="lend",outcome="applied"'
    lends = f"rebalancer_decision_timestamp_seconds{{{applied}}}"

    async def lends_scraped() -> bool:
        async with aiohttp.ClientSession(prometheus) as prom:
            return len(await instant(prom, lends, datetime.now(UTC))) == len(IDLE)

    await until("every lend scraped", lends_scraped, c.proc, 15)
    h.exporter.set_load(PEAK, 0)
    await h.wait_all_serving(c)
    count = f'rebalancer_reclaim_duration_seconds_count{{pool="{POOL}"}}'
    # nothing lent for two scrapes or more: a panel's 1 s steps see it before the series ends
    lent = f'rebalancer_nodes_lent{{pool="{POOL}"}}[2500ms]'
    queries = (count, f"max_over_time({lent})", f"count_over_time({lent}) >= 2")
    seen: list[object] = []
    made = [before]  # the reclaims of the audit log when last looked

    async def scraped() -> bool:
        made[0] = back(await h.records())
        async with aiohttp.ClientSession(prometheus) as prom:
            now = datetime.now(UTC)
            counted, most, twice = [list((await instant(prom, q, now)).values()) for q in queries]
        seen[:] = [made[0], counted, most, twice]
        return counted == [[float(made[0] - before)]] and most == [[0.0]] and bool(twice)

    try:
        await until("the reclaims counted and scraped", scraped, c.proc, 15)
    except AssertionError as e:
        raise AssertionError(f"{e}: made, counted, most lent, scrapes: {seen}") from None
    return made[0]


async def reclaims_at_the_last_scrape(
    prom: aiohttp.ClientSession, start: datetime, end: datetime
) -> float:
    """ "Reclaims in range" evaluated at the last scrape, its range from ``start``: where
    ``increase()`` has nothing to extrapolate (the series starts at 0, and ends there)."""
    raw = f'rebalancer_reclaim_duration_seconds_count{{pool="{POOL}"}}'
    data = await api(prom, "/api/v1/query", query=f"{raw}[5m]", time=end.timestamp())
    [found] = data["result"]
    last = max(float(t) for t, _ in found["values"])
    [panel] = [
        p for p in grafana.dashboard(DASHBOARD)["panels"] if p["title"] == "Reclaims in range"
    ]
    seconds = f"{(last - start.timestamp()) * 1000:.0f}ms"
    expr = grafana.promql(panel["targets"][0]["expr"], {**VALUES, "$__range": seconds})
    [[value]] = (await instant(prom, expr, datetime.fromtimestamp(last, UTC))).values()
    return value


async def every_panel(
    prom: aiohttp.ClientSession, start: datetime, end: datetime
) -> list[tuple[str, str, dict[str, list[float]]]]:
    """Each target of the dashboard as Grafana runs it over ``start``..``end``: its title, its
    refId and its values by series. Fails on a target with no data, or a NaN, or a guarded
    target (a quantile) that is empty where its count is not 0 or drawn where it is."""
    seconds = math.ceil((end - start).total_seconds())
    values = {**VALUES, "$__range": f"{seconds}s"}
    found = []
    for panel, target in grafana.targets(grafana.dashboard(DASHBOARD)):
        if "expr" not in target:
            continue
        expr = grafana.promql(target["expr"], values)
        if target.get("instant"):
            got = await instant(prom, expr, end)
        else:
            got = await ranged(prom, expr, start, end)
        name = f"{panel['title']} [{target['refId']}]"
        assert all(not math.isnan(v) for vs in got.values() for v in vs), (name, got)
        if grafana.guard(expr) is not None:
            await drawn_where_counted(prom, expr, start, end, name)
        # empty only where it is guarded (then its count was 0 throughout) and says so
        assert got or (grafana.guard(expr) and grafana.no_value(panel)), f"no data: {name} {expr}"
        found.append((panel["title"], target["refId"], got))
    return found


async def drawn_where_counted(
    prom: aiohttp.ClientSession, expr: str, start: datetime, end: datetime, name: str
) -> None:
    """A guarded target has a point at each step where its count is above 0, and only there;
    without the guard, the steps where the count is 0 read NaN (what the panel drew before)."""
    count = grafana.guard(expr)
    assert count is not None
    shown, counted = await points(prom, expr, start, end), await points(prom, count, start, end)
    bare = await points(prom, grafana.unguarded(expr), start, end)
    for key, steps in counted.items():
        drawn = set(shown.get(key, {}))
        assert drawn == {t for t, v in steps.items() if v > 0}, (name, key, steps, drawn)
        was_nan = sum(1 for t, v in bare.get(key, {}).items() if math.isnan(v))
        print(f"\n{name} {key}: {len(drawn)} of {len(steps)} steps drawn; unguarded, {was_nan} NaN")
    assert set(shown) <= set(counted), (name, shown.keys(), counted.keys())


async def points(
    prom: aiohttp.ClientSession, expr: str, start: datetime, end: datetime
) -> dict[str, dict[float, float]]:
    """``expr``'s range query, each series' values by their time."""
    params = {"query": expr, "start": start.timestamp(), "end": end.timestamp(), "step": 1}
    data = await api(prom, "/api/v1/query_range", **params)
    return {
        series(r["metric"]): {float(t): float(v) for t, v in r["values"]} for r in data["result"]
    }


async def instant(prom: aiohttp.ClientSession, expr: str, at: datetime) -> dict[str, list[float]]:
    data = await api(prom, "/api/v1/query", query=expr, time=at.timestamp())
    return {series(r["metric"]): [float(r["value"][1])] for r in data["result"]}


async def ranged(
    prom: aiohttp.ClientSession, expr: str, start: datetime, end: datetime
) -> dict[str, list[float]]:
    params = {"query": expr, "start": start.timestamp(), "end": end.timestamp(), "step": 1}
    data = await api(prom, "/api/v1/query_range", **params)
    return {series(r["metric"]): [float(v) for _, v in r["values"]] for r in data["result"]}


async def api(prom: aiohttp.ClientSession, path: str, **params: object) -> Any:
    query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
    async with prom.get(f"{path}?{query}") as r:
        body = await r.json()
    assert body["status"] == "success", body
    return body["data"]


def series(labels: dict[str, str]) -> str:
    """A series by the labels a panel shows (the target's own left out)."""
    shown = {k: v for k, v in labels.items() if k not in ("job", "namespace", "pod", "instance")}
    return ",".join(f"{k}={v}" for k, v in sorted(shown.items()))


def summary(values: dict[str, list[float]]) -> str:
    """The last value of each series, for the test's report."""
    return "; ".join(f"{k or '-'} = {vs[-1]:g} ({len(vs)} pts)" for k, vs in sorted(values.items()))


def check_decision_log(rows: dict[str, list[float]], records: list[AuditRecord]) -> None:
    """The decision log's table: one row per intent of the store, at the intent's time (ms),
    with its pool, node, action, reason, origin and last outcome."""
    last = last_outcomes(records)
    expected = {}
    for r in records:
        if r.kind is Kind.INTENT and r.node is not None:
            labels = {
                "action": str(r.action),
                "id": r.id,
                "node": r.node,
                "origin": str(r.origin),
                "outcome": str(last.get(r.id, "pending")),
                "pool": r.pool,
                "reason": r.reason,
            }
            expected[series(labels)] = [r.time.timestamp() * 1000]
    assert rows.keys() == expected.keys()
    for key, [at] in rows.items():
        assert abs(at - expected[key][0]) < 1, key  # the store keeps microseconds


async def sql_panel(database: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """The PostgreSQL panel's query, as Grafana expands it, on the store the controller wrote."""
    [panel] = [p for p in grafana.dashboard(DASHBOARD)["panels"] if "rawSql" in p["targets"][0]]
    text = grafana.sql(panel["targets"][0]["rawSql"], start - timedelta(seconds=1), end, [POOL])
    store = await SqlAuditStore.open(database)
    try:
        async with store.engine.connect() as conn:
            result = await conn.exec_driver_sql(text)
            columns = list(result.keys())
            return [dict(zip(columns, row, strict=True)) for row in result.all()]
    finally:
        await store.close()
