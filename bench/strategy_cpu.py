"""What the default strategy costs the controller: CPU per tick spent in strategies, and the
memory they keep, for many pools with two weeks of history each.

It plays the controller's pattern without the rest of the controller: every pool is asked once
per tick (``tick_interval``, 30 s), and every ``history_refresh`` (5 minutes) each pool's
history is read anew, as a new ``DemandHistory`` object whose start slides forward with its
end, the way ``runtime.reconcile`` hands Prometheus' answer to the strategy. Two ways to keep
what a strategy derived from the history, in the same run:

- ``incremental``: one strategy instance for every pool, all along (what the controller does);
- ``rebuild``: what is kept is dropped at every new history read, so every read replays the
  whole span again (what ``adaptive`` did before it went on from where the last read ended).

The pools' demand comes from the bundled traces (Azure ``code`` and ``conv``, ServeGen m-large,
m-mid, m-small), each pool a different trace, scale and phase, so that no two replay alike.

    .venv/bin/python bench/strategy_cpu.py [--pools 50] [--rebuild-pools 5] [--minutes 60]
        [--strategy adaptive]

It prints, per mode, the CPU seconds of the first tick (the start-up replay), then per tick
(mean and 95th percentile) and per pool and tick, the memory the strategy keeps per pool
(traced on two pools: the tracer slows what it watches), and the ratio of the two modes'
per-pool cost. The rebuild mode runs fewer pools (it is slow by
design); per-pool figures compare the two.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import traces

EXAMPLES = Path(__file__).parents[1] / "examples" / "traces"
MINUTE = timedelta(minutes=1)
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=14)
TICK = timedelta(seconds=30)
REFRESH = timedelta(minutes=5)
SOURCES = (
    ("azure_llm_2024_week_per_minute.csv", "code"),
    ("azure_llm_2024_week_per_minute.csv", "conv"),
    ("servegen_m-large.csv", None),
    ("servegen_m-mid.csv", None),
    ("servegen_m-small.csv", None),
)


@dataclass(frozen=True)
class Pool:
    name: model.PoolName
    values: list[float | None]  # per minute, 14 days plus the minutes the bench plays
    rps_per_node: float


def pools(count: int, minutes: int) -> list[Pool]:
    loaded = [traces.load(EXAMPLES / f, s) for f, s in SOURCES]
    need = int(SPAN / MINUTE) + minutes + 1
    out = []
    for i in range(count):
        trace = loaded[i % len(loaded)]
        phase = (i * 137) % trace.minutes
        scale = 1.0 + 0.1 * (i // len(loaded))
        values = [
            None if v is None else v * scale
            for v in (trace.rps[(phase + t) % trace.minutes] for t in range(need))
        ]
        peak = max(v for v in values if v is not None)
        out.append(Pool(model.PoolName(f"pool-{i:02d}"), values, peak / (0.9 * 16)))
    return out


def view(pool: Pool, history: model.DemandHistory, minute: int) -> model.PoolView:
    now = history.start + MINUTE * history.end_index
    last = pool.values[minute - 1]
    return model.PoolView(
        name=pool.name,
        now=now,
        size=16,
        lent=0,
        demand=None if last is None else model.Sample(last, now - timedelta(seconds=30)),
        queue=None,
        history=history,
        rps_per_node=pool.rps_per_node,
        min_serving=2,
        headroom=0.2,
        return_time=timedelta(minutes=7),
        zone="UTC",
    )


@dataclass(frozen=True)
class Figures:
    first: float  # CPU seconds of the first tick, every pool
    per_tick: list[float]  # CPU seconds of each later tick, every pool
    kept_bytes: int  # what the strategy keeps after the run, every pool


def play(
    chosen: list[Pool], minutes: int, strategy_name: str, rebuild: bool, traced: bool = False
) -> tuple[list[float], int]:
    """CPU seconds of every tick, and (``traced``) the bytes the strategy keeps at the end."""
    span = int(SPAN / MINUTE)
    if traced:
        gc.collect()
        tracemalloc.start()
    before = tracemalloc.take_snapshot() if traced else None
    strategy = registry.build(strategy_name, {})
    histories: dict[str, model.DemandHistory] = {}
    refresh_every = int(REFRESH / TICK)
    times: list[float] = []
    for tick in range(int(minutes * MINUTE / TICK) + 1):
        minute = span + int(tick * TICK / MINUTE)
        if tick % refresh_every == 0:
            if rebuild:
                strategy = registry.build(strategy_name, {})  # nothing kept from the last read
            for pool in chosen:
                first = minute - span
                histories[pool.name] = model.DemandHistory(
                    start=ORIGIN + MINUTE * first,
                    step=MINUTE,
                    values=pool.values[first:minute],
                    end_index=span,
                )
        began = time.process_time()
        for pool in chosen:
            strategy.decide(view(pool, histories[pool.name], minute))
        times.append(time.process_time() - began)
    kept = 0
    if before is not None:
        gc.collect()
        kept = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
        tracemalloc.stop()
    del strategy
    return times, kept


def measure(chosen: list[Pool], minutes: int, strategy_name: str, rebuild: bool) -> Figures:
    """CPU untraced over ``minutes``, every pool; memory traced (slower) over two history
    reads of the first two pools, scaled to every pool."""
    times, _ = play(chosen, minutes, strategy_name, rebuild)
    traced = chosen[:2]
    _, kept = play(traced, int(REFRESH / MINUTE) + 1, strategy_name, rebuild, traced=True)
    return Figures(times[0], times[1:], kept * len(chosen) // len(traced))


def show(mode: str, count: int, f: Figures) -> float:
    mean = statistics.fmean(f.per_tick)
    p95 = sorted(f.per_tick)[int(0.95 * (len(f.per_tick) - 1))]
    print(
        f"{mode:12} {count:5d} pools  first tick {f.first:7.2f} s  per tick mean {mean:7.4f} s "
        f"p95 {p95:7.4f} s  per pool and tick {mean / count * 1000:8.3f} ms  "
        f"kept {f.kept_bytes / count / 2**20:7.2f} MiB per pool"
    )
    return mean / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=50)
    parser.add_argument("--rebuild-pools", type=int, default=5)
    parser.add_argument("--minutes", type=int, default=60, help="controller minutes to play")
    parser.add_argument("--strategy", default="adaptive")
    args = parser.parse_args()
    every = pools(max(args.pools, args.rebuild_pools), args.minutes)
    print(
        f"strategy {args.strategy}: 14 days of history per pool, a tick every 30 s, a new "
        f"history read every 5 minutes, {args.minutes} minutes played"
    )
    chosen = every[: args.pools]
    incremental = show(
        "incremental", args.pools, measure(chosen, args.minutes, args.strategy, False)
    )
    if args.rebuild_pools:
        chosen = every[: args.rebuild_pools]
        rebuilt = measure(chosen, args.minutes, args.strategy, True)
        rebuild = show("rebuild", args.rebuild_pools, rebuilt)
        print(f"rebuild / incremental, CPU per pool and tick: {rebuild / incremental:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
