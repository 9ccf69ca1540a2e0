"""A real Prometheus holding weeks of pool demand, for ``rebalancer simulate --prometheus``.

Made from the bundled Azure LLM week (CC-BY-4.0): each service's requests per minute become a
gauge ``demand_rps{pool=<service>}`` of requests / 60, one sample per minute at the minute's
start + 30 s (as a scrape would land), backfilled with ``promtool tsdb create-blocks-from
openmetrics``. The pools' demand queries in ``config`` read that gauge, so what the simulator
reads back is the trace's own values, exactly: a replay of it must give the CSV's figures.

| pool | series | minutes |
|---|---|---|
| code | ``demand_rps{pool="code"}`` | the whole ``code`` week, no gap |
| conv | ``demand_rps{pool="conv"}`` | the ``conv`` week less the minutes in ``CONV_MISSING`` |
| (code's nodes) | ``kube_node_labels{node, label_rebalancer_io_pool="code"}`` | the whole week |

``CONV_MISSING`` holds one gap of each kind: short ones a hold bridges, an outage, an outage
across a day boundary (where the read changes chunk), and minutes missing at both ends.
"""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support import prometheus

TRACE = Path(__file__).parents[2] / "examples" / "traces" / "azure_llm_2024_week_per_minute.csv"
WEEK = 7 * 24 * 60
OFFSET = timedelta(seconds=30)
CODE_NODES = ("gpu-code-0", "gpu-code-1")


def _runs(*spans: tuple[int, int]) -> frozenset[int]:
    return frozenset(i for first, length in spans for i in range(first, first + length))


# Minute indices from the conv week's start: 5 missing at the start, one missed scrape, two in
# a row, a 30-minute outage, a 3-minute outage over the end of day 2, 10 missing at the end.
CONV_MISSING = _runs((0, 5), (100, 1), (500, 2), (1000, 30), (2879, 3), (WEEK - 10, 10))


@dataclass(frozen=True)
class Series:
    start: datetime  # the first minute of the week
    rps: list[float]  # requests / 60, minute by minute
    missing: frozenset[int]  # minute indices with no sample in Prometheus

    def minute(self, i: int) -> datetime:
        return self.start + timedelta(minutes=i)


def week(service: str, missing: frozenset[int] = frozenset()) -> Series:
    start: datetime | None = None
    rps: list[float] = []
    with TRACE.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["service"] != service:
                continue
            when = datetime.fromisoformat(row["minute_start_utc"]).astimezone(UTC)
            start = start or when
            assert when == start + timedelta(minutes=len(rps)), "the bundled week has a gap"
            rps.append(int(row["requests"]) / 60.0)
    assert start is not None
    assert len(rps) == WEEK
    return Series(start, rps, missing)


def openmetrics(pools: dict[str, Series]) -> str:
    lines = ["# TYPE demand_rps gauge"]
    for pool, series in pools.items():
        for i, value in enumerate(series.rps):
            if i not in series.missing:
                ts = (series.minute(i) + OFFSET).timestamp()
                lines.append(f'demand_rps{{pool="{pool}"}} {value!r} {ts:.0f}')
    lines.append("# TYPE kube_node_labels gauge")
    code = pools["code"]
    for node in CODE_NODES:
        for i in range(0, WEEK, 5):
            ts = (code.minute(i) + OFFSET).timestamp()
            labels = f'node="{node}",label_rebalancer_io_pool="code"'
            lines.append(f"kube_node_labels{{{labels}}} 1 {ts:.0f}")
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def config(path: Path) -> Path:
    """The controller's settings with the three pools these tests read."""

    def pool(name: str, value: str, sampled: str, label: str) -> str:
        return (
            f"  - name: {name}\n"
            f"    node_selector: {{rebalancer.io/pool: {label}}}\n"
            "    rps_per_node: 7\n"
            "    zone: America/Los_Angeles\n"
            "    metrics:\n"
            f"      demand: {{value: '{value}', sampled: '{sampled}'}}\n"
        )

    gauge = 'sum(demand_rps{pool="$pool"})'
    stamp = 'timestamp(demand_rps{pool="$pool"})'
    code = 'sum(demand_rps{pool="code"})'
    # Scoped to the pool's nodes: empty unless $nodes names one of code's nodes.
    scoped = f'{code} and on () count(kube_node_labels{{node=~"$nodes"}}) > 0'
    path.write_text(
        "pools:\n"
        + pool("code", gauge, stamp, "code")
        + pool("conv", gauge, stamp, "conv")
        + pool("scoped", scoped, 'timestamp(demand_rps{pool="code"})', "code")
    )
    return path


@contextlib.contextmanager
def serving(workdir: Path, pools: dict[str, Series]) -> Iterator[str]:
    """A Prometheus serving ``pools`` (backfilled); yields its URL, stops it on exit."""
    store, _ = prometheus.backfill(workdir, openmetrics(pools))
    with prometheus.serving(workdir, store) as (url, _, _):
        yield url
