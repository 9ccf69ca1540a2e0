"""One strategy with one parameter set over every bundled trace: the figures that matter.

For strategy authors: a change that helps one trace and hurts another shows at once. Each line
is one trace (16 nodes, peak at 90 % of the pool, docs/evaluation.md), with the oracle's reclaims
for comparison.

    .venv/bin/python bench/strategy_sweep.py [STRATEGY] ['{"param": value}']
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from rebalancer.adapters import registry
from sandbox.sim import engine, traces

EXAMPLES = Path(__file__).parents[1] / "examples" / "traces"
# (file, service, pool time zone): the Azure services are American, ServeGen's clock is Chinese.
TRACES = [
    ("azure_llm_2024_week_per_minute.csv", "code", "America/Los_Angeles"),
    ("azure_llm_2024_week_per_minute.csv", "conv", "America/Los_Angeles"),
    ("servegen_m-large.csv", None, "Asia/Shanghai"),
    ("servegen_m-mid.csv", None, "Asia/Shanghai"),
    ("servegen_m-small.csv", None, "Asia/Shanghai"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategy", nargs="?", default=registry.DEFAULT, choices=registry.names())
    parser.add_argument("params", nargs="?", default="{}", help="parameters as a JSON object")
    args = parser.parse_args()
    params = json.loads(args.params)
    for file, service, zone in TRACES:
        trace = traces.load(EXAMPLES / file, service)
        pool = engine.PoolModel(zone=zone)
        started = time.perf_counter()
        run = engine.run(trace, registry.build(args.strategy, params), pool)
        seconds = time.perf_counter() - started
        plan = engine.oracle_plan(engine.needs(trace, pool, pool.calibrate(trace)), pool)
        oracle_reclaims = sum(max(0, a - b) for a, b in itertools.pairwise(plan))
        f = run.figures
        print(
            f"{trace.name:38} harvest {f.harvest_ratio:.3f} breach {f.breach_minutes:4d} "
            f"headroom {f.headroom_minutes:4d} reclaims {f.reclaims:4d} (oracle {oracle_reclaims}) "
            f"loans {f.loans:4d} short {f.short_loans:3d}  {seconds:.2f} s"
        )


if __name__ == "__main__":
    main()
