"""How fast the simulator replays a week: the figures the project promises.

Goals: a week of the Azure ``code`` trace at one-minute steps for a 16-node pool in under 3 s,
for a 1,000-node pool in under 30 s, with the default strategy through the full planner; and
``rebalancer simulate`` as the Makefile runs it on that week (the default strategy, the
baselines and the oracle, report and plots; ``--no-trade``) in under 3 s of CPU on one core.
The ``static`` baseline runs the same loop with a strategy that does nothing, so the ratio shows
what the strategy and the transitions cost over the loop itself.

Every measurement is a process of its own (``--one CASE``), so that an import or a cache warmed
by one case is not counted in another, and so that another commit's code can be measured by the
same script: ``--against REV`` checks REV out into a temporary ``git worktree`` and times the
same cases there, interleaved with this tree's (the machine's load then falls on both alike),
and prints both and their ratio. The engine cases are timed in CPU seconds of the process and in
wall seconds; the command case in CPU seconds of the child (user and system), the goal's measure.

    .venv/bin/python bench/simulate_speed.py [--repeat N] [--against REV] [--cases 16,cmd]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

ROOT = Path(__file__).resolve().parents[1]
TRACE = Path("examples") / "traces" / "azure_llm_2024_week_per_minute.csv"
SERVICE, ZONE = "code", "America/Los_Angeles"


class Timing(TypedDict):
    cpu: float
    wall: float
    digest: str  # of what the run computed


@dataclass(frozen=True)
class Case:
    """One thing timed: an engine run of ``strategy`` on ``size`` nodes, or the command."""

    key: str
    label: str
    goal: float | None  # seconds; None: shown for the ratio only


CASES = (
    Case("16-static", "16 nodes, static", None),
    Case("16", "16 nodes, default", 3.0),
    Case("cmd", "rebalancer simulate (CPU)", 3.0),
    Case("1000-static", "1,000 nodes, static", None),
    Case("1000", "1,000 nodes, default", 30.0),
)


def one(key: str, root: Path) -> Timing:
    """Time case ``key`` with the code this process imports (the tree ``root``); a digest of
    what the run computed is returned too, so that two trees that disagree are seen to."""
    if key == "cmd":
        return _command(root)
    from rebalancer.adapters import registry
    from sandbox.sim import engine, traces

    size, _, static = key.partition("-")
    trace = traces.load(root / TRACE, SERVICE)
    pool = engine.PoolModel(size=int(size), zone=ZONE)
    name = "static" if static else registry.DEFAULT
    cpu, wall = time.process_time(), time.perf_counter()
    run = engine.run(trace, registry.build(name), pool, baseline=bool(static))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    digest = hashlib.sha256(repr((run.timeline, run.figures)).encode()).hexdigest()
    return {"cpu": cpu, "wall": wall, "digest": digest[:12]}


def _command(root: Path) -> Timing:
    """``rebalancer simulate`` as the Makefile runs it (without the trade's grid), in a child
    process: its CPU seconds, user and system, from the children's resource usage."""
    with tempfile.TemporaryDirectory(prefix="simspeed-") as out:
        argv = [sys.executable, "-m", "rebalancer.cli", "simulate", "--trace", str(TRACE)]
        argv += ["--service", SERVICE, "--tz", ZONE, "--out", out, "--quiet", "--no-trade"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        subprocess.run(argv, check=True, cwd=root, env=_env(root))
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        written = [*sorted(Path(out).glob("timeline-*.csv")), Path(out) / "summary.json"]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in written)).hexdigest()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, "digest": digest[:12]}


def _env(root: Path) -> dict[str, str]:
    """This process's environment with ``root``'s code first on the path."""
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'sandbox'}"}


def measure(key: str, root: Path) -> Timing:
    """Case ``key`` timed in a process of its own, with ``root``'s code."""
    argv = [sys.executable, __file__, "--one", key, "--root", str(root)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=_env(root))
    figures: Timing = json.loads(done.stdout.splitlines()[-1])
    return figures


@contextmanager
def checked_out(rev: str) -> Iterator[Path]:
    """``rev`` checked out into a temporary worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="simspeed-against-") as parent:
        where = Path(parent) / "tree"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(where), rev], check=True, capture_output=True)
        try:
            yield where
        finally:
            subprocess.run([*git, "remove", "--force", str(where)], check=True)


def _median(runs: Sequence[Timing], measure_: Literal["cpu", "wall"]) -> float:
    return statistics.median(r[measure_] for r in runs)


def table(
    cases: Sequence[Case], trees: dict[str, dict[str, list[Timing]]], head: bool = True
) -> str:
    """The medians per case and tree (CPU and wall seconds), the goal, and the ratio of this
    tree's CPU to the other's; ``head``: under a line that names the columns."""
    names = list(trees)
    title = f"{'case':<28}" + "".join(f"{n + ' cpu':>16}{n + ' wall':>16}" for n in names)
    lines = [title + (f"{'ratio':>8}" if len(names) > 1 else "") + f"{'goal':>7}"][: int(head)]
    for case in cases:
        row = f"{case.label:<28}"
        for name in names:
            runs = trees[name][case.key]
            row += f"{_median(runs, 'cpu'):>16.2f}{_median(runs, 'wall'):>16.2f}"
        if len(names) > 1:
            mine, other = (_median(trees[n][case.key], "cpu") for n in names)
            row += f"{mine / other:>7.2f}x"
        if case.goal is not None:
            met = _median(trees[names[0]][case.key], "cpu") < case.goal
            row += f"{case.goal:>6.0f}s {'ok' if met else 'MISSED'}"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median counts")
    parser.add_argument("--against", metavar="REV", help="time REV's code too, side by side")
    parser.add_argument("--cases", default=",".join(c.key for c in CASES), help="which cases")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Stopped, it still removes the worktree it added (``checked_out``'s ``finally``).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if args.one:
        print(json.dumps(one(args.one, args.root)))
        return
    wanted = args.cases.split(",")
    cases = [c for c in CASES if c.key in wanted]
    load = os.getloadavg()
    print(f"{SERVICE} week; median of {args.repeat}; load average {load[0]:.2f} {load[2]:.2f}")
    with _trees(args.against) as roots:
        trees: dict[str, dict[str, list[Timing]]] = {n: {} for n in roots}
        for case in cases:
            for _ in range(args.repeat):
                for name, root in roots.items():  # interleaved: the load falls on both alike
                    trees[name].setdefault(case.key, []).append(measure(case.key, root))
            print(f"{table([case], trees, head=False)}  ({_agree(case, trees)})", flush=True)
    print(table(cases, trees))
    print(f"load average after {os.getloadavg()[0]:.2f}")


def _agree(case: Case, trees: dict[str, dict[str, list[Timing]]]) -> str:
    """Each tree's digest of what ``case`` computed (the timelines and figures; the command's
    timelines and summary), to see that the trees agree minute for minute."""
    return "digest " + ", ".join(f"{n} {runs[case.key][0]['digest']}" for n, runs in trees.items())


@contextmanager
def _trees(against: str | None) -> Iterator[dict[str, Path]]:
    """This tree, and ``against`` checked out, if given."""
    if against is None:
        yield {"this": ROOT}
        return
    with checked_out(against) as other:
        yield {"this": ROOT, against: other}


if __name__ == "__main__":
    main()
