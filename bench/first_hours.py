"""How much a trace's demand rises within one loan's worst case, over its first hours: whether
a jumpy service can be told from a smooth one before its first episode (docs/design/budget.md,
"Whether the history shows the first episode coming").

At each minute the top of the next ``--ahead`` minutes (8: one loan's worst case) is compared
with the top of the last ``--window`` minutes (10: the shortest rung of ``adaptive``'s ladder).
Over the minutes where it rose, the table gives the median rise, its 90th percentile and the
largest, over the first hours of each of the robustness suite's scenarios named.

    .venv/bin/python bench/first_hours.py --scenarios code,conv,m-large,small --hours 6,20
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import robustness
import tables


def rises(rps: Sequence[float | None], minutes: int, window: int, ahead: int) -> list[float]:
    """Each rise (as a fraction) of the next ``ahead`` minutes' top over the last ``window``
    minutes' top, for the minutes before ``minutes`` where both are known and it rose."""
    out = []
    for t in range(window, minutes - ahead):
        before = [x for x in rps[t - window : t] if x]
        after = [x for x in rps[t : t + ahead] if x is not None]
        if before and after and max(after) > max(before):
            out.append(max(after) / max(before) - 1)
    return out


def summary(found: list[float]) -> str:
    if not found:
        return "no rise"
    ordered = sorted(found)
    p90 = ordered[min(len(ordered) - 1, math.floor(0.9 * len(ordered)))]
    return f"{statistics.median(ordered):.1%} / {p90:.1%} / {ordered[-1]:.1%}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="code,conv,m-large,small")
    parser.add_argument("--hours", default="6,20", help="comma-separated")
    parser.add_argument("--window", type=int, default=10, help="minutes")
    parser.add_argument("--ahead", type=int, default=8, help="minutes")
    args = parser.parse_args(argv)
    hours = [int(h) for h in args.hours.split(",")]
    chosen = {s.name: s for s in robustness.scenarios()}
    rows = [["scenario", *(f"first {h} h: median / p90 / largest rise" for h in hours)]]
    for name in args.scenarios.split(","):
        rps = chosen[name].trace.rps
        rows.append([name, *(summary(rises(rps, h * 60, args.window, args.ahead)) for h in hours)])
    print(tables.aligned(rows))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
