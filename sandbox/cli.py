"""The harnesses' subcommands of ``rebalancer`` (the ``rebalancer.commands`` entry points).

Each is ``main(argv) -> int`` with its own parser; the first line of its docstring is its help in
``rebalancer --help``. Next to each, ``<name>_parser()`` builds that parser without running
anything: ``rebalancer completion`` reads the flags from it. Errors a person can fix are raised
as ``RebalancerError`` and printed by the ``rebalancer`` command as one line each, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rebalancer.adapters import registry
from rebalancer.cli import common
from rebalancer.errors import ConfigError

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

if TYPE_CHECKING:
    from rebalancer.core.model import Slo
    from rebalancer.settings import PoolSettings, Settings
    from sandbox.sim import configured
    from sandbox.sim.history import Source
    from sandbox.sim.jobs import TrainingModel
    from sandbox.sim.traces import Trace


def simulate(argv: Sequence[str]) -> int:
    """replay a load trace through strategies, baselines and the oracle"""
    from sandbox.sim.simulate import simulate as replay

    args = simulate_parser().parse_args(argv)
    _history_flags_need_prometheus(args)
    params = _strategy_params(args.params)
    flags = _given(args, {name: value for name, (_, value) in params.items()})
    hold = None if args.hold is None else _hold(args.hold)
    if args.prometheus is not None and args.service is not None:
        raise ConfigError(f"--service={args.service}: for --trace; --prometheus reads --pool")
    found = _configured_pool(args)
    _trace_in_the_pool_s_unit(args, found)
    modelled = _modelled(flags, found, params, args.config)
    if args.notice_compare and not modelled.pool.notice:
        raise ConfigError(
            f"--notice-compare: pool {modelled.provenance.pool} gives no reclaim notice "
            "(limits.reclaim_notice); give --notice"
        )
    training = _training(args.training_backlog, args.training_seed, modelled.pool.gpus_per_node)
    summary = replay(
        _trace(args, found, hold),
        modelled.strategies,
        modelled.pool,
        args.out,
        params=modelled.params,
        progress=not args.quiet,
        slo=modelled.slo,
        trade=args.trade,
        training=training,
        provenance=modelled.provenance,
        compare_notice=args.notice_compare,
    )
    _print_summary(summary, args)
    return 0


def _print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    """The run's summary: as the report's table (not with --quiet), or, with -o json or yaml,
    as summary.json holds it (with --quiet too: it is the command's output, not its progress),
    the directory then named on stderr."""
    from sandbox.sim import report

    where = f"results in {args.out}/"
    if args.output == "text":
        if not args.quiet:
            print(f"{report.markdown(summary)}\n{where}")
        return
    common.print_document(json.loads(json.dumps(summary)), args.output, lambda: [])
    if not args.quiet:
        print(where, file=sys.stderr)


def simulate_parser() -> argparse.ArgumentParser:
    """``rebalancer simulate``'s parser."""
    sim = argparse.ArgumentParser(
        prog="rebalancer simulate",
        description="Replay a load trace minute by minute through the chosen strategies and "
        "the baselines static, cron, reactive and oracle; write summary.json, timelines, "
        "report.md and report.svg to --out. With --pool, the pool is the configured one: its "
        "rps_per_node, limits, window, zone, strategy and slo; flags given change one of them. "
        "A DURATION is 90s, 5m, 2h or 1h30m, with its unit (a bare number is refused); a TIME "
        "is RFC 3339 (2024-05-10T00:00:00Z) or a time ago (14d, 36h), as rebalancer audit "
        "reads it.",
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
        help="the controller's settings file, with --pool (default: $REBALANCER_CONFIG, else none)",
    )
    _where_flags(sim)
    _model_flags(sim)
    _run_flags(sim)
    sim.add_argument("--out", required=True, type=Path, help="directory for the results")
    sim.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    common.output_flag(sim, "json or yaml: the summary, as summary.json holds it")
    return sim


def _where_flags(sim: argparse.ArgumentParser) -> None:
    """The configured pool, and the window of its history to read."""
    sim.add_argument(
        "--pool",
        help="simulate this configured pool with its own settings (with --prometheus: the "
        "pool whose history to read)",
    )
    sim.add_argument(
        "--since",
        metavar="TIME",
        help="with --prometheus: read from TIME up to now, e.g. 14d, 36h or 2024-05-10T00:00:00Z",
    )
    sim.add_argument(
        "--from",
        dest="start",
        metavar="RFC3339",
        help="with --prometheus: a time with its offset, e.g. 2024-05-10T00:00:00Z",
    )
    sim.add_argument("--to", dest="end", metavar="RFC3339", help="with --from: a time")
    sim.add_argument(
        "--nodes",
        metavar="NAME,...",
        help="with --prometheus: the pool's nodes, for a query scoped to them ($scope); "
        "default: those kube_node_labels shows with the pool's node_selector",
    )
    sim.add_argument(
        "--hold",
        metavar="DURATION",
        help="with --prometheus: carry the last value over a gap this long or shorter, whole "
        "minutes (default: the pool's staleness limit, 2m)",
    )


def _model_flags(sim: argparse.ArgumentParser) -> None:
    """The strategies, and the pool as the flags change it."""
    sim.add_argument(
        "--strategy",
        action="append",
        choices=registry.names(),
        help=f"strategy to run (repeatable; default: the pool's, else {registry.DEFAULT})",
    )
    sim.add_argument(
        "--params",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="strategy parameters, e.g. forecast='{\"safety\": 0.15}' (repeatable; default: "
        "the pool's for its strategy)",
    )
    sim.add_argument(
        "--pool-size",
        type=int,
        metavar="N",
        help="nodes in the pool (16; the settings select nodes but never count them)",
    )
    sim.add_argument(
        "--min-serving", type=int, help="nodes that always serve (the pool's limits, else 2)"
    )
    sim.add_argument(
        "--headroom", type=float, help="share over demand (the pool's limits, else 0.2)"
    )
    sim.add_argument(
        "--drain",
        metavar="DURATION",
        help="time to drain a node (the pool's reclaim_deadline, else 2m)",
    )
    sim.add_argument(
        "--warmup",
        metavar="DURATION",
        help="inference cold start (the pool's warmup, else 5m)",
    )
    sim.add_argument(
        "--tz", help="the pool's IANA time zone (the pool's zone, else UTC): window, cron, plots"
    )
    sim.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="GPUs a node lends, for GPU-hours (8)",
    )


def _run_flags(sim: argparse.ArgumentParser) -> None:
    """The budget, the trade, the training queue and the notice."""
    sim.add_argument(
        "--slo",
        metavar="DURATION|PERCENT|none",
        help="the error budget the strategies may spend per rolling 7 days: breach minutes as a "
        "duration (10m) or an availability (99.9%%); none: no budget (default: the pool's slo, "
        "the controller's default budget unless the pool's settings say otherwise)",
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
    sim.add_argument(
        "--notice",
        metavar="DURATION|off",
        help="how far ahead a strategy's reclaim tells the jobs on the node (the pool's "
        "limits.reclaim_notice, else the controller's default, 5m; off: evicted at once)",
    )
    sim.add_argument(
        "--notice-compare",
        action="store_true",
        help="run every strategy, baseline and the oracle again without the notice, and set "
        "what training lost and kept, the harvest and the breaches side by side",
    )


_HISTORY_FLAGS = ("since", "start", "end", "nodes", "hold")


def _history_flags_need_prometheus(args: argparse.Namespace) -> None:
    if args.prometheus is not None:
        return
    given = [f for f in _HISTORY_FLAGS if getattr(args, f) is not None]
    if given:
        flag = {"start": "from", "end": "to"}.get(given[0], given[0])
        raise ConfigError(f"--{flag}: only with --prometheus (it reads the pool's history)")


def _trace_in_the_pool_s_unit(
    args: argparse.Namespace, found: tuple[Settings, PoolSettings] | None
) -> None:
    """A trace file counts requests per second; a pool counted in another unit would compare
    the trace's requests with its tokens or sequences per node. ``--prometheus`` reads the
    pool's own demand query, in its unit."""
    from rebalancer.core.model import Unit

    if args.trace is None or found is None or found[1].unit is Unit.REQUESTS_PER_SECOND:
        return
    pool = found[1]
    raise ConfigError(
        f"--pool={pool.name}: its capacity is in {pool.unit.value} and --trace replays requests "
        "per second; replay its own history with --prometheus, or give a pool sized in "
        "requests_per_second"
    )


def _modelled(
    flags: configured.Given,
    found: tuple[Settings, PoolSettings] | None,
    params: dict[str, tuple[str, dict[str, Any]]],
    config: Path | None,
) -> configured.Modelled:
    """The pool to simulate (``configured.model_of``), refused if what the flags and the
    settings make together does not hold."""
    from sandbox.sim import configured

    if found is None:
        modelled = configured.model_of(flags)
    else:
        modelled = configured.model_of(flags, found[1], _shown_path(config))
    for name, (item, _) in params.items():
        if name not in modelled.strategies:
            # Not silently dropped: ``--params forecast=...`` alone once tuned the default run,
            # and the default is adaptive now.
            raise ConfigError(
                f"--params {item!r}: {name} is not run ({', '.join(modelled.strategies)}); "
                f"add --strategy {name}"
            )
    _check_model(modelled)
    return modelled


def _trace(
    args: argparse.Namespace, found: tuple[Settings, PoolSettings] | None, hold: int | None
) -> Trace:
    """The trace to replay: ``--trace``'s file, or the pool's history in ``--prometheus``."""
    from sandbox.sim import traces

    if args.prometheus is None:
        return traces.load(args.trace, args.service)
    assert found is not None, "--prometheus without --pool is refused before"
    config, pool = found
    if hold is None:
        hold = int(pool.limits.staleness // timedelta(minutes=1))
    return _history_trace(_history_source(args, config, pool), args, hold)


def _configured_pool(args: argparse.Namespace) -> tuple[Settings, PoolSettings] | None:
    """The settings (``--config``, else ``$REBALANCER_CONFIG``) and the pool ``--pool`` names,
    loaded as ``rebalancer run`` loads them; None without ``--pool``."""
    from rebalancer import settings

    if args.pool is None:
        if args.prometheus is not None:
            raise ConfigError(f"--prometheus={args.prometheus}: name the pool to read with --pool")
        if args.config is not None:
            raise ConfigError(f"--config={args.config}: name the pool to simulate with --pool")
        return None
    config = settings.load(settings.config_path(args.config))
    try:
        return config, config.pool(args.pool)
    except KeyError:
        known = ", ".join(p.name for p in config.pools) or "none in the settings"
        raise ConfigError(
            f"--pool={args.pool}: no configured pool has that name ({known})"
        ) from None


def _shown_path(given: Path | None) -> str | None:
    """The settings file as the report names it: as given, else as the environment names it."""
    from rebalancer import settings

    path = settings.config_path(given)
    return None if path is None else str(path)


def _history_source(args: argparse.Namespace, config: Settings, pool: PoolSettings) -> Source:
    """The settings' Prometheus (at ``--prometheus``), the pool and its queries."""
    import pydantic

    from rebalancer import settings
    from rebalancer.core.model import PoolName
    from rebalancer.runtime import adapterconfig
    from sandbox.sim.history import Source

    try:
        prometheus = settings.PrometheusSettings.model_validate(
            {**config.prometheus.model_dump(), "url": args.prometheus}
        )
    except pydantic.ValidationError as exc:
        why = exc.errors()[0]["msg"]
        raise ConfigError(f"--prometheus={args.prometheus!r}: {why}") from None
    nodes = None
    if args.nodes is not None:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
        bad = [n for n in nodes if not _NODE_NAME.fullmatch(n)]
        if bad or not nodes:
            raise ConfigError(f"--nodes={args.nodes!r}: write node names separated by commas")
    with_url = config.model_copy(update={"prometheus": prometheus})
    return Source(
        settings=adapterconfig.metrics_settings(with_url, pool),
        pool=PoolName(pool.name),
        node_selector=dict(pool.node_selector),
        nodes=nodes,
    )


def _history_trace(source: Source, args: argparse.Namespace, hold: int) -> Trace:
    from sandbox.sim import history

    first, until = history.window(args.since, args.start, args.end, datetime.now(UTC))
    read = history.load(source, first, until, hold, args.out)
    if not args.quiet:  # with -o json or yaml, stdout has the summary alone
        out = sys.stdout if args.output == "text" else sys.stderr
        print("\n".join(history.summary(read)), file=out)
    return read.trace


def _given(args: argparse.Namespace, params: dict[str, dict[str, Any]]) -> configured.Given:
    """The pool's flags, checked one by one (every problem at once); None where not given."""
    from sandbox.sim import configured

    problems = []
    if args.pool_size is not None and args.pool_size < 1:
        problems.append(f"--pool-size={args.pool_size}: must be at least 1")
    if args.min_serving is not None and args.min_serving < 0:
        problems.append(f"--min-serving={args.min_serving}: must be between 0 and --pool-size")
    if args.headroom is not None and not args.headroom >= 0:
        problems.append(f"--headroom={args.headroom}: must be >= 0")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        problems.append(f"--gpus-per-node={args.gpus_per_node}: must be at least 1")
    spans: dict[str, timedelta | None] = {}
    for flag in ("drain", "warmup"):
        text = getattr(args, flag)
        try:
            spans[flag] = None if text is None else duration(f"--{flag}", text)
        except ConfigError as exc:
            problems.append(str(exc))
    if args.tz is not None:
        try:
            ZoneInfo(args.tz)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            problems.append(f"--tz={args.tz!r}: not an IANA time zone such as Europe/Berlin")
    notice = None
    if args.notice is not None:
        try:
            notice = _notice(args.notice)
        except ConfigError as exc:
            problems.append(str(exc))
    if args.notice_compare and notice == timedelta(0):
        problems.append("--notice-compare: compares a notice with none; --notice=off gives none")
    if problems:
        raise ConfigError("; ".join(problems))
    return configured.Given(
        size=args.pool_size,
        min_serving=args.min_serving,
        headroom=args.headroom,
        drain=spans["drain"],
        warmup=spans["warmup"],
        zone=args.tz,
        gpus_per_node=args.gpus_per_node,
        strategies=tuple(dict.fromkeys(args.strategy or ())),
        params=params,
        slo=_slo(args.slo),
        slo_off=_slo_off(args.slo),
        notice=notice,
    )


def _notice(text: str) -> timedelta:
    """``--notice``: a DURATION, or ``off`` (none: evicted at once)."""
    if text.strip().lower() in ("off", "none"):
        return timedelta(0)
    span = duration("--notice", text)
    if span < timedelta(0):
        raise ConfigError(f"--notice={text!r}: must be a duration >= 0, or off")
    return span


def _check_model(modelled: configured.Modelled) -> None:
    """What the flags and the settings make together: no more nodes always serving than the
    pool has, whichever of them said so."""
    from sandbox.sim import configured

    pool, origins = modelled.pool, modelled.provenance.origins
    if pool.min_serving <= pool.size:
        return
    if origins["min_serving"] is configured.Origin.FLAG:
        said = f"--min-serving={pool.min_serving}"
    else:
        said = f"pool {modelled.provenance.pool}: limits.min_serving={pool.min_serving}"
    size = "--pool-size" if origins["size"] is configured.Origin.FLAG else "the default size"
    raise ConfigError(
        f"{said}: more nodes always serving than the {pool.size} simulated ({size}); "
        "give --pool-size"
    )


def _hold(text: str) -> int:
    """``--hold`` in whole minutes, the trace's step, from a DURATION."""
    span = duration("--hold", text)
    if span % timedelta(minutes=1):
        raise ConfigError(f"--hold={text!r}: must be whole minutes, the trace's step")
    return span // timedelta(minutes=1)


def duration(flag: str, text: str) -> timedelta:
    """A duration flag as every ``rebalancer`` flag reads one (``settings.flag_duration``:
    ``90s``, ``5m``, ``1h30m``, ``0``; a bare number refused), or a one-line ``ConfigError``."""
    from rebalancer import settings

    return settings.flag_duration(flag, text, positive=False)


def _slo_off(text: str | None) -> bool:
    """``--slo none``: no budget, as a pool's ``slo: none`` says it."""
    from rebalancer.settings import SLO_OFF

    return text is not None and text.strip() == SLO_OFF


def _slo(text: str | None) -> Slo | None:
    """``--slo``, as a pool's ``slo`` says it, over its 7 days: a DURATION of breach minutes
    (``10m``: max_breach_minutes 10) or an availability in percent (``99.9%``); None when not
    given, or ``none`` (``_slo_off``)."""
    if text is None or _slo_off(text):
        return None
    import pydantic

    from rebalancer.settings import SloSettings

    stripped = text.strip()
    try:
        if stripped.endswith("%"):
            budget = SloSettings(availability=float(stripped[:-1]) / 100)
        else:
            span = duration("--slo", stripped)
            if span % timedelta(minutes=1):
                raise ValueError
            budget = SloSettings(max_breach_minutes=span // timedelta(minutes=1))
    except (ValueError, ConfigError, pydantic.ValidationError):
        raise ConfigError(
            f"--slo={text!r}: write the breach minutes per 7 days as a duration (10m), an "
            "availability in percent (99.9%) or none (no budget)"
        ) from None
    return budget.slo()


def _training(backlog: int | None, seed: int, gpus_per_node: int) -> TrainingModel | None:
    if backlog is None:
        return None
    if backlog < 1:
        raise ConfigError(f"--training-backlog={backlog}: must be at least 1 waiting job")
    from sandbox.sim.jobs import TrainingModel

    return TrainingModel(backlog=backlog, seed=seed, gpus_per_node=gpus_per_node)


def _strategy_params(items: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """``--params NAME=JSON`` by name: the item as given (for an error line) and its object."""
    params: dict[str, tuple[str, dict[str, Any]]] = {}
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
        params[name] = (item, value)
    return params


def emulator(argv: Sequence[str]) -> int:
    """serve an emulated Kubernetes API with a small GPU cluster (sandbox --help)"""
    from sandbox.emulator import server

    return server.main(in_units(argv, SANDBOX_DURATIONS))


def emulator_parser() -> argparse.ArgumentParser:
    """``rebalancer sandbox``'s parser (the emulator is imported only when it is asked for)."""
    from sandbox.emulator import server

    return server.parser()


def demo(argv: Sequence[str]) -> int:
    """run the controller on an emulated cluster, replaying a real day (demo --help)"""
    from sandbox import demo

    return demo.main(in_units(argv, DEMO_DURATIONS))


def demo_parser() -> argparse.ArgumentParser:
    """``rebalancer demo``'s parser (the demo is imported only when it is asked for)."""
    from sandbox import demo

    return demo.parser()


@dataclass(frozen=True)
class Unit:
    """The unit a flag's own parser reads a bare number in."""

    name: str
    size: timedelta
    whole: bool = False  # the parser reads an integer


SECONDS = Unit("seconds", timedelta(seconds=1))
HOURS = Unit("hours", timedelta(hours=1))
WHOLE_MINUTES = Unit("minutes", timedelta(minutes=1), whole=True)

# The demo's and the emulator's own parsers read these flags as bare numbers in the unit each
# names. Their parsers stay theirs: the DURATION given (``90m``) is turned into that bare number
# on its way in, so that every harness command takes durations as every other flag does; a bare
# number given is refused, as everywhere (``--hours 1.5`` would be the one flag that read one).
DEMO_DURATIONS = {"--hours": HOURS, "--start": HOURS, "--speed": WHOLE_MINUTES, "--pace": SECONDS}
SANDBOX_DURATIONS = {"--schedule-every": SECONDS}


def in_units(argv: Sequence[str], flags: Mapping[str, Unit]) -> list[str]:
    """``argv`` with each of ``flags``' values given as a DURATION written as the bare number
    its parser reads. A flag may be abbreviated as argparse allows; whatever argparse would
    refuse (an ambiguous prefix) it still refuses."""
    out: list[str] = []
    pending: str | None = None
    for i, token in enumerate(argv):
        if pending is not None:
            out.append(_bare(pending, token, flags[pending]))
            pending = None
            continue
        if token == "--":
            return [*out, *argv[i:]]
        name, eq, value = token.partition("=")
        flag = _flag_named(name, flags)
        if flag is None:
            out.append(token)
        elif eq:
            out.append(f"{name}={_bare(flag, value, flags[flag])}")
        else:
            out.append(token)
            pending = flag
    return out


def _flag_named(name: str, flags: Mapping[str, Unit]) -> str | None:
    if name in flags:
        return name
    if not name.startswith("--") or len(name) < 3:
        return None
    found = [flag for flag in flags if flag.startswith(name)]
    return found[0] if len(found) == 1 else None


def _bare(flag: str, text: str, unit: Unit) -> str:
    """``text``, a DURATION (a bare number is refused, as by every flag), as the bare number
    of ``unit`` the command's own parser reads."""
    value = duration(flag, text) / unit.size
    if not unit.whole:
        return repr(value)
    if value != int(value):
        raise ConfigError(f"{flag}={text!r}: must be whole {unit.name}")
    return str(int(value))
