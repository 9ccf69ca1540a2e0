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
from rebalancer.settings import InvalidSettings, Settings
from rebalancer.sim import engine, report, simulate, traces
from strategies import registry

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The sandbox and the demo have parsers of their own; argparse would swallow their options.
    if argv[:1] == ["sandbox"]:
        from rebalancer.sandbox import server

        return server.main(argv[1:])
    if argv[:1] == ["demo"]:
        from rebalancer import demo

        return demo.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.handler(args)
    except InvalidSettings as exc:
        for line in exc.lines:
            print(f"rebalancer: {line}", file=sys.stderr)
        return EXIT_USAGE
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

    _controller_commands(commands)

    # Listed for --help only: main() hands these to their own parsers.
    commands.add_parser(
        "sandbox",
        help="serve an emulated Kubernetes API with a small GPU cluster (sandbox --help)",
    )
    commands.add_parser(
        "demo",
        help="run the controller on an emulated cluster, replaying a real day (demo --help)",
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


# ---------------------------------------------------------------------------------------------
# The controller: run, reclaim, audit


def _controller_commands(commands: Any) -> None:
    def common(p: argparse.ArgumentParser, kube: bool = True) -> None:
        p.add_argument(
            "--config", type=Path, help="settings file (default: $REBALANCER_CONFIG, else none)"
        )
        if kube:
            p.add_argument(
                "--kubeconfig",
                type=Path,
                help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
            )

    run = commands.add_parser(
        "run",
        help="run the controller until SIGTERM",
        description="Run the controller: informer, leader election, reconcile loop and the "
        "HTTP server (metrics, probes, audit API), until SIGTERM or SIGINT.",
    )
    common(run)
    run.set_defaults(handler=_run)

    reclaim = commands.add_parser(
        "reclaim",
        help="take lent nodes back now (audited, origin operator)",
        description="Take loans back now through the audited path: an intent record (origin "
        "operator), the actuator's reclaim, progress until the node serves again or the "
        "deadline has passed, an outcome record. Exits 1 if a node could not be restored.",
    )
    which = reclaim.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every node lent or in flight")
    which.add_argument("--node", action="append", metavar="NAME", help="this node (repeatable)")
    common(reclaim)
    reclaim.set_defaults(handler=_reclaim)

    show = commands.add_parser(
        "audit",
        help="show audit records",
        description="Read the audit store named by the settings (audit.url), oldest first.",
    )
    common(show, kube=False)
    show.add_argument("--since", help="RFC 3339 time, e.g. 2026-03-02T12:00:00Z")
    show.add_argument("--pool", help="only this pool")
    show.add_argument("--node", help="only this node")
    show.add_argument("--action", choices=("lend", "reclaim"), help="only this action")
    show.add_argument("--limit", type=int, default=100, help="at most this many records (100)")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.set_defaults(handler=_audit)


def _settings(args: argparse.Namespace) -> Settings:
    from rebalancer import settings

    return settings.load(settings.config_path(args.config))


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from rebalancer.runtime import loop, wiring

    config = _settings(args)
    loop.json_logging(getattr(logging, config.log_level))

    async def go() -> int:
        async with wiring.Controller.open(config, args.kubeconfig) as controller:
            return await controller.run()

    return asyncio.run(go())


def _reclaim(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.runtime import wiring

    config = _settings(args)

    async def go() -> int:
        failed = 0
        async with wiring.Parts.open(config, args.kubeconfig) as parts:
            nodes = await wiring.lent_nodes(parts) if args.all else list(args.node)
            if not nodes:
                print("no node is lent")
            for node in nodes:
                done = await wiring.operator_reclaim(parts, node)
                outcome = done.result.outcome.value if done.result is not None else "error"
                intent = done.intent.id if done.intent is not None else "-"
                print(f"{node}\t{outcome}\t{done.message}\t(intent {intent})", flush=True)
                failed += not done.ok
        return 1 if failed else 0

    return asyncio.run(go())


COLUMNS = ("time", "kind", "pool", "node", "action", "origin", "result", "message")


def _audit(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.adapters.audit import AuditQuery, json_line
    from rebalancer.runtime import http, wiring

    config = _settings(args)
    since = None
    if args.since is not None:
        try:
            since = http.parse_time("--since", args.since)
        except http.BadParameter as exc:
            raise ConfigError(str(exc)) from None
    if args.limit < 1:
        raise ConfigError(f"--limit={args.limit}: must be at least 1")
    query = AuditQuery(
        since=since, pool=args.pool, node=args.node, action=args.action, limit=args.limit
    )

    async def go() -> int:
        store = await wiring.open_audit_store(config)
        try:
            page = await store.query(query)
        finally:
            await store.close()
        if args.json:
            for record in page.records:
                print(json_line(record))
            return 0
        rows = [
            (
                r.time.isoformat(timespec="seconds"),
                r.kind.value,
                r.pool,
                r.node or "-",
                r.action or "-",
                r.origin or "-",
                r.outcome or r.reason,
                r.message,
            )
            for r in page.records
        ]
        widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(COLUMNS)]
        for row in [COLUMNS, *rows]:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        return 0

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
