"""The ``rebalancer`` command. Each subcommand parses its arguments, then calls one function.

Errors a person can fix (a bad trace, an unknown strategy, a bad parameter) are printed as one
clear line each and exit with status 2; nothing prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rebalancer import __version__
from rebalancer.errors import ConfigError, RebalancerError
from rebalancer.sim import engine, report, simulate, traces
from strategies import registry

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sandbox"]:
        # The sandbox has its own parser; argparse would swallow its options here.
        from rebalancer.sandbox import server

        return server.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except registry.ParameterError as exc:
        for problem in exc.problems:
            print(f"rebalancer: strategy {exc.strategy!r}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except RebalancerError as exc:
        print(f"rebalancer: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rebalancer",
        description="Lend idle inference GPU nodes to preemptible training, and take them back.",
    )
    parser.add_argument("--version", action="version", version=f"rebalancer {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    sim = commands.add_parser(
        "simulate",
        help="replay a load trace through strategies, baselines and the oracle",
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
    sim.add_argument("--out", required=True, type=Path, help="directory for the results")
    sim.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    sim.set_defaults(handler=_simulate)

    # Listed for --help only: main() hands `sandbox ...` to the sandbox's own parser.
    commands.add_parser(
        "sandbox",
        help="serve an emulated Kubernetes API with a small GPU cluster (sandbox --help)",
    )
    return parser


def _simulate(args: argparse.Namespace) -> int:
    pool = _pool_model(args)
    trace = traces.load(args.trace, args.service)
    strategies = args.strategy or [registry.DEFAULT]
    summary = simulate.simulate(
        trace,
        strategies,
        pool,
        args.out,
        params=_strategy_params(args.params),
        progress=not args.quiet,
    )
    if not args.quiet:
        print(report.markdown(summary))
        print(f"results in {args.out}/")
    return 0


def _pool_model(args: argparse.Namespace) -> engine.PoolModel:
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
    return engine.PoolModel(
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


if __name__ == "__main__":
    sys.exit(main())
