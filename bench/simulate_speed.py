"""How fast the simulator replays a week: the figures the project promises.

Goals: a week at one-minute steps for a 16-node pool in under 3 s, for a 1,000-node pool in
under 30 s, with the default strategy through the full planner. The ``static`` baseline runs
the same loop with a strategy that does nothing, so the ratio shows what the strategy and the
transitions cost over the loop itself.

    .venv/bin/python bench/simulate_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rebalancer.adapters import registry
from sandbox.sim import engine, traces

TRACE = Path(__file__).parents[1] / "examples" / "traces" / "azure_llm_2024_week_per_minute.csv"
GOALS = {16: 3.0, 1000: 30.0}


def seconds(trace: traces.Trace, name: str, size: int, baseline: bool) -> tuple[float, int]:
    pool = engine.PoolModel(size=size, zone="America/Los_Angeles")
    started = time.perf_counter()
    run = engine.run(trace, registry.build(name), pool, baseline=baseline)
    elapsed = time.perf_counter() - started
    return elapsed, run.figures.loans + run.figures.reclaims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median counts")
    args = parser.parse_args()
    trace = traces.load(TRACE, "code")
    print(f"trace {trace.name}: {trace.minutes} minutes; median of {args.repeat} runs")
    print(f"{'nodes':>6} {'strategy':>10} {'seconds':>8} {'goal':>6} {'vs static':>9} {'steps':>6}")
    for size, goal in GOALS.items():
        base = statistics.median(
            seconds(trace, "static", size, baseline=True)[0] for _ in range(args.repeat)
        )
        timed = [seconds(trace, registry.DEFAULT, size, baseline=False) for _ in range(args.repeat)]
        median = statistics.median(t for t, _ in timed)
        verdict = "ok" if median < goal else "MISSED"
        print(
            f"{size:>6} {'static':>10} {base:>8.2f} {'':>6} {'1.00x':>9} {0:>6}\n"
            f"{size:>6} {registry.DEFAULT:>10} {median:>8.2f} {goal:>5.0f}s {median / base:>8.2f}x "
            f"{timed[0][1]:>6}  {verdict}"
        )


if __name__ == "__main__":
    main()
