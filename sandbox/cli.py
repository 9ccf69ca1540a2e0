"""The harnesses' subcommands of ``rebalancer`` (the ``rebalancer.commands`` entry points).

Each is ``main(argv) -> int`` with its own parser; the first line of its docstring is its help in
``rebalancer --help``. Errors a person can fix are raised as ``RebalancerError`` and printed by
the ``rebalancer`` command as one line each, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rebalancer.errors import ConfigError
from strategies import registry

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

if TYPE_CHECKING:
    from rebalancer.core.model import Slo
    from sandbox.sim.engine import PoolModel
    from sandbox.sim.history import Source
    from sandbox.sim.jobs import TrainingModel
    from sandbox.sim.traces import Trace


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
    where = sim.add_mutually_exclusive_group(required=True)
    where.add_argument("--trace", type=Path, help="per-minute or time,rps CSV")
    where.add_argument(
        "--prometheus",
        metavar="URL",
        help="replay the demand --pool had, read from this Prometheus with the pool's own "
        "demand query (with --since, or --from and --to)",
    )
    sim.add_argument("--service", help="which service of a multi-service trace (e.g. code)")
    sim.add_argument(
        "--config",
        type=Path,
        help="with --prometheus: the controller's settings file (default: $REBALANCER_CONFIG, "
        "else none)",
    )
    sim.add_argument("--pool", help="with --prometheus: the configured pool to read")
    sim.add_argument("--since", metavar="DURATION", help="with --prometheus: e.g. 14d, 36h")
    sim.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="with --prometheus: RFC 3339, e.g. 2024-05-10T00:00:00Z",
    )
    sim.add_argument("--to", dest="end", metavar="TIME", help="with --from: RFC 3339")
    sim.add_argument(
        "--nodes",
        metavar="NAME,...",
        help="with --prometheus: the pool's nodes, for a query scoped to them ($scope); "
        "default: those kube_node_labels shows with the pool's node_selector",
    )
    sim.add_argument(
        "--hold",
        type=int,
        metavar="MINUTES",
        help="with --prometheus: carry the last value over a gap this long or shorter "
        "(default: the pool's staleness limit in whole minutes, 2)",
    )
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
    sim.add_argument(
        "--tz", help="the pool's IANA time zone (UTC; with --prometheus the pool's zone)"
    )
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
    if args.prometheus is None:
        given = [f for f in _HISTORY_FLAGS if getattr(args, f) is not None]
        if given:
            flag = {"start": "from", "end": "to"}.get(given[0], given[0])
            raise ConfigError(f"--{flag}: only with --prometheus (it reads the pool's history)")
    strategies = args.strategy or [registry.DEFAULT]
    params = _strategy_params(args.params, strategies)
    source = None if args.prometheus is None else _history_source(args)
    args.tz = args.tz or "UTC"
    pool = _pool_model(args)
    slo = _slo(args.slo)
    training = _training(args.training_backlog, args.training_seed)
    if source is None:
        trace = traces.load(args.trace, args.service)
    else:
        trace = _history_trace(source, args)
    summary = replay(
        trace,
        strategies,
        pool,
        args.out,
        params=params,
        progress=not args.quiet,
        slo=slo,
        trade=args.trade,
        training=training,
    )
    if not args.quiet:
        print(report.markdown(summary))
        print(f"results in {args.out}/")
    return 0


_HISTORY_FLAGS = ("config", "pool", "since", "start", "end", "nodes", "hold")


def _history_source(args: argparse.Namespace) -> Source:
    """The settings' Prometheus (at ``--prometheus``), the pool and its queries; sets ``--tz``
    and ``--hold`` from the pool where they are not given."""
    import pydantic

    from rebalancer import settings
    from rebalancer.core.model import PoolName
    from sandbox.sim.history import Source

    if args.service is not None:
        raise ConfigError(f"--service={args.service}: for --trace; --prometheus reads --pool")
    if args.pool is None:
        raise ConfigError(f"--prometheus={args.prometheus}: name the pool to read with --pool")
    config = settings.load(settings.config_path(args.config))
    try:
        pool = config.pool(args.pool)
    except KeyError:
        known = ", ".join(p.name for p in config.pools) or "none in the settings"
        raise ConfigError(
            f"--pool={args.pool}: no configured pool has that name ({known})"
        ) from None
    try:
        prometheus = settings.PrometheusSettings.model_validate(
            {**config.prometheus.model_dump(), "url": args.prometheus}
        )
    except pydantic.ValidationError as exc:
        why = exc.errors()[0]["msg"]
        raise ConfigError(f"--prometheus={args.prometheus!r}: {why}") from None
    if args.hold is None:
        args.hold = int(pool.limits.staleness // timedelta(minutes=1))
    elif args.hold < 0:
        raise ConfigError(f"--hold={args.hold}: must be >= 0 minutes")
    args.tz = args.tz or pool.zone
    nodes = None
    if args.nodes is not None:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
        bad = [n for n in nodes if not _NODE_NAME.fullmatch(n)]
        if bad or not nodes:
            raise ConfigError(f"--nodes={args.nodes!r}: write node names separated by commas")
    with_url = config.model_copy(update={"prometheus": prometheus})
    return Source(
        settings=with_url.metrics_settings(pool),
        pool=PoolName(pool.name),
        node_selector=dict(pool.node_selector),
        nodes=nodes,
    )


def _history_trace(source: Source, args: argparse.Namespace) -> Trace:
    from sandbox.sim import history

    first, until = history.window(args.since, args.start, args.end, datetime.now(UTC))
    read = history.load(source, first, until, args.hold, args.out)
    if not args.quiet:
        print("\n".join(history.summary(read)))
    return read.trace


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


def _strategy_params(items: list[str], strategies: Sequence[str]) -> dict[str, dict[str, Any]]:
    params: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--params {item!r}: write it as NAME=JSON, e.g. forecast={{}}")
        if name not in strategies:
            # Not silently dropped: ``--params forecast=...`` alone once tuned the default run,
            # and the default is adaptive now.
            raise ConfigError(
                f"--params {item!r}: {name} is not run ({', '.join(strategies)}); "
                f"add --strategy {name}"
            )
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
