"""The harnesses' subcommands of ``rebalancer`` (the ``rebalancer.commands`` entry points).

Each is ``main(argv) -> int`` with its own parser; the first line of its docstring is its help in
``rebalancer --help``. Errors a person can fix are raised as ``RebalancerError`` and printed by
the ``rebalancer`` command as one line each, exit status 2.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rebalancer.errors import ConfigError
from strategies import registry

if TYPE_CHECKING:
    from rebalancer.core.model import Slo
    from sandbox.sim.engine import PoolModel
    from sandbox.sim.jobs import TrainingModel


def simulate(argv: Sequence[str]) -> int:
    """replay a load trace through strategies, baselines and the oracle"""
    from sandbox.sim import report, traces
    from sandbox.sim.simulate import simulate as replay

    sim = argparse.ArgumentParser(
        prog="rebalancer simulate",
        description="Replay a load trace minute by minute through the chosen strategies and "
        "the baselines static, cron, reactive and oracle; write summary.json, timelines, "
        "report.md and report.png to --out.",
    )
    sim.add_argument("--trace", required=True, type=Path, help="per-minute or time,rps CSV")
    sim.add_argument("--service", help="which service of a multi-service trace (e.g. code)")
    sim.add_argument(
        "--strategy",
        action="append",
        choices=registry.names(),
        help=f"strategy to run (repeatable; default {registry.DEFAULT})",
    )
    sim.add_argument(
        "--params",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="strategy parameters, e.g. forecast='{\"safety\": 0.15}' (repeatable)",
    )
    sim.add_argument("--pool-size", type=int, default=16, help="nodes in the pool (16)")
    sim.add_argument("--min-serving", type=int, default=2, help="nodes that always serve (2)")
    sim.add_argument("--headroom", type=float, default=0.2, help="share over demand (0.2)")
    sim.add_argument("--drain", type=float, default=120, help="seconds to drain a node (120)")
    sim.add_argument("--warmup", type=float, default=300, help="inference cold start s (300)")
    sim.add_argument("--tz", default="UTC", help="the pool's IANA time zone (UTC)")
    sim.add_argument(
        "--slo",
        type=int,
        metavar="MINUTES",
        help="an error budget: breach minutes per rolling 7 days the strategies may spend",
    )
    sim.add_argument(
        "--no-trade",
        dest="trade",
        action="store_false",
        help="skip the peak rule's grid (20 more runs) and the report's trade section",
    )
    sim.add_argument(
        "--training-backlog",
        type=int,
        metavar="N",
        help="lend only to a queue of preemptible training jobs that keeps N jobs waiting, "
        "and report what training made of the loans (off by default)",
    )
    sim.add_argument("--training-seed", type=int, default=7, help="the training queue's seed (7)")
    sim.add_argument("--out", required=True, type=Path, help="directory for the results")
    sim.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    args = sim.parse_args(argv)
    pool = _pool_model(args)
    slo = _slo(args.slo)
    training = _training(args.training_backlog, args.training_seed)
    trace = traces.load(args.trace, args.service)
    strategies = args.strategy or [registry.DEFAULT]
    summary = replay(
        trace,
        strategies,
        pool,
        args.out,
        params=_strategy_params(args.params),
        progress=not args.quiet,
        slo=slo,
        trade=args.trade,
        training=training,
    )
    if not args.quiet:
        print(report.markdown(summary))
        print(f"results in {args.out}/")
    return 0


def _slo(minutes: int | None) -> Slo | None:
    if minutes is None:
        return None
    if minutes < 0:
        raise ConfigError(f"--slo={minutes}: must be >= 0 breach minutes per 7 days")
    from rebalancer.core.model import Slo

    return Slo(minutes)


def _training(backlog: int | None, seed: int) -> TrainingModel | None:
    if backlog is None:
        return None
    if backlog < 1:
        raise ConfigError(f"--training-backlog={backlog}: must be at least 1 waiting job")
    from sandbox.sim.jobs import TrainingModel

    return TrainingModel(backlog=backlog, seed=seed)


def _pool_model(args: argparse.Namespace) -> PoolModel:
    problems = []
    if args.pool_size < 1:
        problems.append(f"--pool-size={args.pool_size}: must be at least 1")
    if not 0 <= args.min_serving <= args.pool_size:
        problems.append(f"--min-serving={args.min_serving}: must be between 0 and --pool-size")
    if args.headroom < 0:
        problems.append(f"--headroom={args.headroom}: must be >= 0")
    for flag in ("drain", "warmup"):
        if getattr(args, flag) < 0:
            problems.append(f"--{flag}={getattr(args, flag)}: must be >= 0 seconds")
    try:
        ZoneInfo(args.tz)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(f"--tz={args.tz!r}: not an IANA time zone such as Europe/Berlin")
    if problems:
        raise ConfigError("; ".join(problems))
    from sandbox.sim.engine import PoolModel

    return PoolModel(
        size=args.pool_size,
        min_serving=args.min_serving,
        headroom=args.headroom,
        drain=timedelta(seconds=args.drain),
        warmup=timedelta(seconds=args.warmup),
        zone=args.tz,
    )


def _strategy_params(items: list[str]) -> dict[str, dict[str, Any]]:
    params: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--params {item!r}: write it as NAME=JSON, e.g. forecast={{}}")
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--params {item!r}: not JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise ConfigError(f"--params {item!r}: the JSON must be an object")
        params[name] = value
    return params


def emulator(argv: Sequence[str]) -> int:
    """serve an emulated Kubernetes API with a small GPU cluster (sandbox --help)"""
    from sandbox.emulator import server

    return server.main(argv)


def demo(argv: Sequence[str]) -> int:
    """run the controller on an emulated cluster, replaying a real day (demo --help)"""
    from sandbox import demo

    return demo.main(argv)
