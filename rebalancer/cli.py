"""The ``rebalancer`` command. Each subcommand parses its arguments, then calls one function.

Errors a person can fix (a bad trace, an unknown strategy, a bad parameter) are printed as one
clear line each and exit with status 2; nothing prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from rebalancer import __version__, errors
from rebalancer.core import audit, model
from rebalancer.errors import ConfigError, RebalancerError
from rebalancer.settings import InvalidSettings, PositiveDuration, Settings
from strategies import registry

if TYPE_CHECKING:  # the runtime is imported by the commands that use it, not at start
    from rebalancer.adapters.audit import AuditQuery, AuditStore
    from rebalancer.core.nodepools import NodePlan
    from rebalancer.runtime.check import Finding
    from rebalancer.runtime.poolmanager import Report
    from rebalancer.runtime.takeback import Reclaimed, ReclaimEvent
    from rebalancer.runtime.wiring import Controller

EXIT_USAGE = 2


# More subcommands come from installed distributions through these entry points: each names a
# ``main(argv) -> int`` whose docstring's first line is its help. The project's harnesses
# (``rebalancer simulate``, ``sandbox``, ``demo``; the ``rebalancer-sandbox`` distribution in the
# source tree) arrive this way, so the controller's own package never imports them.
COMMANDS = "rebalancer.commands"
Command = Callable[[Sequence[str]], int]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = {ep.name: ep for ep in entry_points(group=COMMANDS)}
    if argv[:1] and argv[0] in plugins:
        # Its own parser: argparse here would swallow the command's options.
        command: Command = plugins[argv[0]].load()
        return _reported(lambda: command(argv[1:]))
    args = _parser(plugins).parse_args(argv)
    return _reported(lambda: args.handler(args))


def _reported(call: Callable[[], int]) -> int:
    """``call()``, with every error a person can fix printed as lines and exit status 2."""
    try:
        return call()
    except InvalidSettings as exc:
        for line in exc.lines:
            print(f"rebalancer: {line}", file=sys.stderr)
    except registry.ParameterError as exc:
        for problem in exc.problems:
            print(f"rebalancer: strategy {exc.strategy!r}: {problem}", file=sys.stderr)
    except RebalancerError as exc:
        print(f"rebalancer: {exc}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went (``rebalancer audit | head``): nothing more to say, to anyone. Python
        # would report the pipe again when it flushes stdout at exit; point it at nothing.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return EXIT_USAGE


def _parser(plugins: Mapping[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rebalancer",
        description="Lend idle inference GPU nodes to preemptible training, and take them back.",
        epilog="simulate, sandbox and demo come with the rebalancer-sandbox distribution "
        "(sandbox/ in the source tree; make demo and make test install it).",
    )
    parser.add_argument("--version", action="version", version=f"rebalancer {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    _controller_commands(commands)
    _pool_commands(commands)
    for name, ep in sorted(plugins.items()):  # listed for --help; main() hands them their argv
        commands.add_parser(name, help=_summary(ep))
    return parser


def _summary(ep: EntryPoint) -> str | None:
    """A command's help line; a command that cannot be loaded says so instead of breaking the
    other commands (``rebalancer run`` builds this parser too)."""
    try:
        doc = (ep.load().__doc__ or "").strip().splitlines()
    except Exception as exc:
        return f"(cannot be loaded: {type(exc).__name__}: {exc})"
    return doc[0] if doc else None


# ---------------------------------------------------------------------------------------------
# The controller: run, reclaim, audit


def _controller_commands(commands: Any) -> None:
    """The commands that read the settings: run, check, reclaim, explain, audit, capacity,
    gpu-labeler."""
    _run_command(commands)
    _check_command(commands)
    _reclaim_command(commands)
    _explain_command(commands)
    _audit_command(commands)
    _capacity_command(commands)
    _gpu_labeler_command(commands)


def _common(p: argparse.ArgumentParser, kube: bool = True) -> None:
    """The flags every controller command takes: the settings, and the cluster it reads."""
    p.add_argument(
        "--config", type=Path, help="settings file (default: $REBALANCER_CONFIG, else none)"
    )
    if kube:
        _cluster(p)


def _cluster(p: argparse.ArgumentParser) -> None:
    """The flags of a command that talks to a cluster, as kubectl spells them."""
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    p.add_argument("--context", help="kubeconfig context (default: its current one)")


OUTPUTS = ("text", "json", "yaml")


def _output(p: argparse.ArgumentParser, what: str) -> None:
    """``-o text|json|yaml``, as kubectl's ``-o``; ``--json`` stays as ``-o json``."""
    p.add_argument(
        "-o", "--output", choices=OUTPUTS, default="text", help=f"{what} (default: text)"
    )
    p.add_argument(
        "--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS
    )


def _documents(docs: Sequence[Mapping[str, Any]], output: str) -> list[str]:
    """``docs`` as ``-o json`` (one object a line) or ``-o yaml`` (one document each) prints
    them."""
    import json

    import yaml

    if output == "json":
        return [json.dumps(d) for d in docs]
    return [f"---\n{yaml.safe_dump(dict(d), sort_keys=False).rstrip()}" for d in docs]


def _run_command(commands: Any) -> None:
    """`rebalancer run`: its flags and handler."""
    run = commands.add_parser(
        "run",
        help="run the controller until SIGTERM",
        description="Run the controller: informer, leader election, reconcile loop and the "
        "HTTP server (metrics, probes, audit API), until SIGTERM or SIGINT.",
    )
    _common(run)
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="plan and audit (outcome would_apply), write nothing to the cluster: no node, pod, "
        "Event or Lease (the dry_run setting)",
    )
    run.set_defaults(handler=_run)


def _check_command(commands: Any) -> None:
    """`rebalancer check`: its flags and handler."""
    check = commands.add_parser(
        "check",
        help="is a settings file ready to deploy (--online: to this cluster)?",
        description="Offline: load the settings (every problem, one line each), ask for a "
        "pool, and parse every PromQL query as the controller fills it in. With --online, also "
        "per pool: the nodes its selector finds and whether they carry its serving taints, "
        "whether a pending pod tolerates its lent taints, each query asked of Prometheus, and "
        "what the first tick would do; nothing is written. One line per finding, LEVEL FIELD: "
        "MESSAGE. Exits 0 when nothing fails (warnings allowed), 1 when something does (a file "
        "that cannot be read too), 2 when the check could not run (a bad flag, a cluster that "
        "cannot be read).",
    )
    check.add_argument("--online", action="store_true", help="also ask the cluster and Prometheus")
    check.add_argument(
        "--timeout", default="60s", help="with --online: how long to wait for the cluster (60s)"
    )
    _output(check, "json or yaml: {ok, findings: [{level, field, message}]}")
    _common(check)
    check.set_defaults(handler=_check)


def _reclaim_command(commands: Any) -> None:
    """`rebalancer reclaim`: its flags and handler."""
    reclaim = commands.add_parser(
        "reclaim",
        help="take lent nodes back now (audited, origin operator)",
        description="Take loans back now through the audited path, all nodes at once: one intent "
        "record per node (origin operator) committed first, then every node's serving taints and "
        "labels restored (at most --concurrency at a time), then every drain driven to its end "
        "against one deadline, with outcome records. Exits 0 when every node serves again, 1 if "
        "any does not, 2 if nothing was done (bad flags or settings, intents not recorded).",
    )
    which = reclaim.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every node lent or in flight")
    which.add_argument(
        "--pool", action="append", metavar="NAME", help="every such node of this pool (repeatable)"
    )
    which.add_argument("--node", action="append", metavar="NAME", help="this node (repeatable)")
    reclaim.add_argument(
        "--concurrency",
        type=int,
        default=RECLAIM_CONCURRENCY,
        metavar="N",
        help=f"API calls in flight at once, 1 to {RECLAIM_MAX_CONCURRENCY} ({RECLAIM_CONCURRENCY})",
    )
    reclaim.add_argument(
        "--stop-controller",
        metavar="DEPLOYMENT",
        help="first scale the controller's Deployment (in leader_election.lease_namespace) to 0 "
        "and wait until none of its pods is left, so that nothing lends the nodes again (the "
        "chart's pre-delete hook)",
    )
    reclaim.add_argument(
        "--stop-timeout",
        default="5m",
        help="with --stop-controller: how long its pods may take to go (5m)",
    )
    reclaim.add_argument(
        "--log-records",
        action="store_true",
        help="also print each audit record as a JSON line on stdout, as rebalancer run does "
        "(a Job's log keeps them when its audit store is a scratch file)",
    )
    _common(reclaim)
    reclaim.set_defaults(handler=_reclaim)


def _explain_command(commands: Any) -> None:
    """`rebalancer explain`: its flags and handler."""
    why = commands.add_parser(
        "explain",
        help="why a node is lent or not, and what the next tick would do",
        description="Read the cluster and Prometheus, and observe, decide and plan once as the "
        "loop does, writing nothing: the node's phase and since when, its pods by role, its "
        "overrides (and why one is refused), the pool's demand sample and its age, the "
        "strategy's proposal and evidence, every rule on the node's next move, and what the "
        "next tick would do to it. With --pool, the pool's plan. Exits 2 for a node no pool "
        "selects.",
    )
    target = why.add_mutually_exclusive_group(required=True)
    target.add_argument("node", nargs="?", help="the node")
    target.add_argument("--pool", help="the pool instead of one node")
    _output(why, "json or yaml: the document GET /api/v1/explain gives")
    why.add_argument(
        "--timeout", default="60s", help="how long to wait for the cluster's nodes and pods (60s)"
    )
    _common(why)
    why.set_defaults(handler=_explain)


def _audit_command(commands: Any) -> None:
    """`rebalancer audit`: its flags and handler."""
    show = commands.add_parser(
        "audit",
        help="show audit records, newest first; --follow to watch new ones come",
        description="Read the audit store the settings name (audit.url, or "
        "REBALANCER_AUDIT__URL): the newest --limit records that match, newest first. With "
        "--follow, those oldest first, then each new record as it is committed, until Ctrl-C. "
        "A TIME is RFC 3339 (2026-03-02T12:00:00Z) or a time ago (30m, 2h, 7d, 1h30m).",
    )
    _common(show, kube=False)
    show.add_argument("--since", metavar="TIME", help="records at or after TIME")
    show.add_argument("--until", metavar="TIME", help="records before TIME")
    show.add_argument(
        "--cluster", help="only this cluster's records (a store shared by a fleet); default all"
    )
    show.add_argument("--pool", help="only this pool")
    show.add_argument("--node", help="only this node")
    show.add_argument("--action", help=f"only this action: {', '.join(model.Action)}")
    show.add_argument(
        "--kind",
        action="append",
        help=f"only this kind: {', '.join(audit.Kind)} (repeatable, or comma-separated)",
    )
    show.add_argument("--limit", type=int, default=100, help="at most this many records (100)")
    show.add_argument(
        "--oldest-first",
        action="store_true",
        help="the oldest --limit records (from --since on), oldest first",
    )
    show.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then print each new record as it is committed, until Ctrl-C",
    )
    show.add_argument(
        "--interval", default="2s", help="with --follow: time between reads of the store (2s)"
    )
    _output(show, "json: one object per line; yaml: one document per record")
    show.set_defaults(handler=_audit)


def _gpu_labeler_command(commands: Any) -> None:
    """`rebalancer gpu-labeler`: its flags and handler."""
    gpus = commands.add_parser(
        "gpu-labeler",
        help="keep this node's nvidia.com/gpu.* labels in step with its GPUs",
        description="Ask nvidia-smi what GPUs this node has and keep the node's "
        "nvidia.com/gpu.product, .memory (MiB), .count, .family, .compute.major/.minor and .mixed "
        "labels in step, patching only what changed; on a mixed node the weakest GPU speaks for "
        "it. An nvidia-smi error changes nothing. A node GPU Feature Discovery labels is left "
        "alone (docs/design/gpu-labels.md). Runs until SIGTERM, or one pass with --once (exit 1 "
        "when nvidia-smi could not be read).",
    )
    gpus.add_argument("--node", help="the node to label (default: $NODE_NAME)")
    gpus.add_argument("--interval", default="60s", help="time between passes (60s)")
    gpus.add_argument("--once", action="store_true", help="one pass, then exit")
    gpus.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH", help="(nvidia-smi)")
    gpus.add_argument("--timeout", default="10s", help="nvidia-smi's deadline (10s)")
    _cluster(gpus)
    gpus.add_argument("--dry-run", action="store_true", help="log the changes, write nothing")
    gpus.set_defaults(handler=_gpu_labeler)


def _capacity_command(commands: Any) -> None:
    """`rebalancer capacity`: its flags and handler (``runtime.capacity``)."""
    measure = commands.add_parser(
        "capacity",
        help="measure what one node of a pool serves when full, from its Prometheus history",
        description="Read the pool's history from its Prometheus, node by node and step by "
        "step: what each node served in the pool's unit (capacity.unit), and whether its queue "
        "stayed non-empty all through the step (full). Prints the --quantile of what full "
        "nodes served, the per_node to write, each node's own figure, and what the figure "
        "cannot know (docs/capacity.md). Reads Prometheus only. Exits 0 with a figure, 1 when "
        "no node was full (a lower bound only), 2 for bad flags or a failed read. A TIME is "
        "RFC 3339 (2026-03-02T12:00:00Z) or a time ago (7d, 36h).",
    )
    _common(measure, kube=False)
    measure.add_argument("--pool", required=True, help="the pool to measure")
    measure.add_argument("--since", default="7d", metavar="TIME", help="from TIME (7d)")
    measure.add_argument("--until", metavar="TIME", help="to TIME (now)")
    measure.add_argument(
        "--step", default="1m", help="a node is full or not per step, whole seconds (1m)"
    )
    measure.add_argument(
        "--quantile", type=float, default=0.9, help="of full node-steps' figures (0.9)"
    )
    measure.add_argument(
        "--nodes",
        metavar="A,B",
        help="these nodes (default: those kube_node_labels shows with the pool's labels)",
    )
    measure.add_argument("--json", action="store_true", help="one JSON document")

    def handler(args: argparse.Namespace) -> int:
        from rebalancer.runtime import capacity

        return capacity.command(args)

    measure.set_defaults(handler=handler)


def _settings(args: argparse.Namespace) -> Settings:
    from rebalancer import settings

    return settings.load(settings.config_path(args.config))


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from rebalancer.runtime import loop, wiring

    config = _settings(args)
    if args.dry_run:
        config = config.model_copy(update={"dry_run": True})
    if not config.pools:
        raise ConfigError(
            "pools=[]: the settings name no pool, so the controller would have nothing to "
            "watch or lend; add one (docs/configuration.md)"
        )
    loop.json_logging(getattr(logging, config.log_level))

    async def go() -> int:
        seams = wiring.Seams(kubeconfig=args.kubeconfig, context=args.context)
        async with wiring.Controller.open(config, seams) as controller:
            return await controller.run()

    return asyncio.run(go())


def _check(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.runtime import check

    timeout = _duration("--timeout", args.timeout)
    try:
        config = _settings(args)
    except InvalidSettings as exc:
        found = [check.Finding(check.Level.FAIL, *_split_line(line)) for line in exc.lines]
        return _findings(found, args.output)
    found = check.offline(config)
    if args.online and not any(f.level is check.Level.FAIL for f in found):

        async def go() -> list[check.Finding]:
            async with _reading(args, config, timeout) as controller:
                return await check.online(config, controller)

        found += asyncio.run(go())
    return _findings(found, args.output)


def _split_line(line: str) -> tuple[str, str]:
    """A settings problem, ``path=value: why``, as ``(path, value: why)``."""
    field, sep, rest = line.partition("=")
    return (field, rest) if sep and " " not in field else ("settings", line)


def _findings(found: Sequence[Finding], output: str) -> int:
    from rebalancer.runtime.check import Level

    failed = any(f.level is Level.FAIL for f in found)
    doc = {"ok": not failed, "findings": [f.doc() for f in found]}
    _print_document(doc, output, lambda: [str(f) for f in found])
    return 1 if failed else 0


def _print_document(doc: Mapping[str, Any], output: str, text: Callable[[], list[str]]) -> None:
    """One document as ``-o json`` or ``-o yaml`` prints it, or as ``text()``'s lines."""
    import json

    import yaml

    if output == "json":
        print(json.dumps(doc, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(dict(doc), sort_keys=False), end="")
    else:
        print("\n".join(text()))


def _explain(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.runtime import explain

    timeout = _duration("--timeout", args.timeout)
    config = _settings(args)

    async def go() -> int:
        async with _reading(args, config, timeout) as controller:
            snapshot, decision = await controller.reconciler.preview()
        try:
            doc = explain.answer(
                controller.reconciler, snapshot, decision, node=args.node, pool=args.pool
            )
        except explain.NotExplained as exc:
            raise ConfigError(str(exc)) from None
        _print_document(doc, args.output, lambda: explain.lines(doc))
        return 0

    return asyncio.run(go())


@contextlib.asynccontextmanager
async def _reading(
    args: argparse.Namespace, config: Settings, timeout: float
) -> AsyncIterator[Controller]:
    """The controller built to read the cluster and Prometheus once and write nothing (explain,
    check): the operator's role, the budgets' store (``_budget_store``, its note on stderr),
    the informer's first list done within ``timeout`` (a line naming ``--timeout`` if not)."""
    from rebalancer.runtime import wiring

    store, note = await _budget_store(config)
    if note is not None:
        print(f"rebalancer: {note}", file=sys.stderr)
    seams = wiring.Seams(
        kubeconfig=args.kubeconfig,
        context=args.context,
        sink=None,
        serve_http=False,
        audit_store=store,
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)  # handed in: wiring leaves it open
        controller = await stack.enter_async_context(
            wiring.Controller.open(config, seams, wiring.Role.OPERATOR)
        )
        listed = False
        try:
            async with controller.informed(timeout):
                listed = True
                yield controller
        except TimeoutError:
            if listed:  # the caller's own, not the list's
                raise
            raise ConfigError(
                f"--timeout={args.timeout}: the cluster's nodes and pods were not all listed in "
                "time"
            ) from None


async def _budget_store(config: Settings) -> tuple[AuditStore, str | None]:
    """The store ``explain`` reads the error budgets' minutes from (the only thing it reads the
    audit log for), and a note for stderr when it reads none that the controller would.

    Every pool has a budget unless its settings say ``slo: none`` (``settings.DEFAULT_SLO``), so
    "open the store when a pool has an slo" now means on nearly every explain. Decided:
    explain reads the store where there is one to read, and never needs one to answer.

    - No pool with a budget: nothing to read; an empty store, as before.
    - A SQLite file that does not exist (the default ``audit.url`` run away from the
      controller, or the chart's path on an operator's machine) is not made: opening it would
      create the file and its schema, a write explain does not make, and it would hold no
      minute. The budgets are read as unspent, and the note says so.
    - Otherwise the configured store, opened as ``rebalancer run`` opens it. One that cannot be
      opened (a database not reachable from here) is not a reason to refuse the explanation
      either: the budgets are read as unspent, and the note says why. A store a newer release
      migrated stays refused (``NewerSchema``), as for every command.
    """
    from rebalancer.adapters import audit as audit_store

    if not any(p.slo is not None for p in config.pools):
        return audit_store.MemoryAuditStore(), None
    unspent = "the error budgets are read as unspent"
    path = audit_store.sqlite_file(config.audit.url)
    if path is not None and not path.exists():
        note = f"audit.url names {path}, which does not exist here: {unspent}"
        return audit_store.MemoryAuditStore(), note
    try:
        return await audit_store.SqlAuditStore.open(config.audit.url), None
    except audit_store.NewerSchema:
        raise
    except audit_store.UnopenedStore as exc:
        return audit_store.MemoryAuditStore(), f"{exc}; {unspent}"


def _duration(flag: str, text: str) -> float:
    """A positive duration flag (``90s``, ``2m``) in seconds, or a one-line ConfigError."""
    import pydantic

    try:
        value = pydantic.TypeAdapter(PositiveDuration).validate_python(text)
    except pydantic.ValidationError as exc:
        why = exc.errors()[0]["msg"]
        raise ConfigError(f"{flag}={text!r}: {why}") from None
    return value.total_seconds()


def _gpu_labeler(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os

    from rebalancer.runtime import gpulabeler, loop

    node = args.node or os.environ.get("NODE_NAME", "")
    if not node.strip():
        raise ConfigError(
            "--node: required (or set NODE_NAME, as the chart does from spec.nodeName)"
        )
    options = gpulabeler.Options(
        node=node.strip(),
        interval=_duration("--interval", args.interval),
        once=args.once,
        nvidia_smi=args.nvidia_smi,
        timeout=_duration("--timeout", args.timeout),
        kubeconfig=args.kubeconfig,
        context=args.context,
        dry_run=args.dry_run,
    )
    loop.json_logging(logging.INFO)
    return asyncio.run(gpulabeler.main(options))


# Mirrors takeback.DEFAULT_CONCURRENCY and MAX_CONCURRENCY: the parser is built without importing
# the runtime (the Kubernetes client), which only the commands that talk to a cluster load.
RECLAIM_CONCURRENCY = 32
RECLAIM_MAX_CONCURRENCY = 64


def _reclaim(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.adapters import audit as audit_store
    from rebalancer.runtime import standdown, takeback, wiring

    if not 1 <= args.concurrency <= RECLAIM_MAX_CONCURRENCY:
        raise ConfigError(
            f"--concurrency={args.concurrency}: must be between 1 and {RECLAIM_MAX_CONCURRENCY}"
        )
    stop_timeout = _duration("--stop-timeout", args.stop_timeout)
    config = _settings(args)
    pools = list(dict.fromkeys(args.pool or ()))
    configured = [p.name for p in config.pools]
    for name in pools:
        if name not in configured:
            known = ", ".join(configured) or "none"
            raise ConfigError(f"--pool={name}: no configured pool has that name ({known})")

    async def go() -> int:
        sink = audit_store.stdout_sink if args.log_records else None
        seams = wiring.Seams(kubeconfig=args.kubeconfig, context=args.context, sink=sink)
        async with wiring.Controller.open(config, seams, wiring.Role.OPERATOR) as controller:
            if args.stop_controller:
                namespace = config.leader_election.lease_namespace
                try:
                    stopped = await standdown.stop_controller(
                        controller.api, namespace, args.stop_controller, stop_timeout
                    )
                except standdown.NotStopped as exc:
                    print(f"rebalancer: {exc}; nothing taken back", file=sys.stderr)
                    return EXIT_INCOMPLETE
                print(
                    f"deployment/{stopped.deployment} scaled to 0; its {stopped.pods} pod(s) "
                    f"gone in {stopped.waited:.1f}s",
                    flush=True,
                )
            if args.node:
                nodes, known = list(dict.fromkeys(args.node)), None
            else:
                known = await takeback.lent_nodes(controller, pools)
                nodes = list(known)
            if not nodes:
                print("no node is lent")
                return 0
            view = reclaim_view(nodes, sys.stdout, sys.stderr)
            try:
                done = await takeback.reclaim_wave(
                    controller,
                    nodes,
                    known=known,
                    concurrency=args.concurrency,
                    on_event=view.event,
                )
            finally:
                view.close()
        lines = reclaim_summary(done)
        for line in lines:
            print(line, flush=True)
        return 0 if all(d.ok for d in done) else 1

    return asyncio.run(go())


class ReclaimView(Protocol):
    def event(self, event: ReclaimEvent) -> None: ...

    def close(self) -> None: ...


def reclaim_view(nodes: Sequence[str], out: TextIO, err: TextIO) -> ReclaimView:
    """A live bar on stderr when it is a terminal, else one plain line per node event."""
    return ReclaimBar(nodes, err) if err.isatty() else ReclaimLines(out)


def _seconds(elapsed: timedelta) -> str:
    return f"{elapsed.total_seconds():.1f}s"


def reclaim_line(event: ReclaimEvent) -> str | None:
    """One node event as a line (``inference-3 back 12.1s (2 pods evicted)``); None for the
    passes that only say a drain goes on, which would be one line per node per second."""
    from rebalancer.runtime.takeback import Stage

    head = f"{event.node} {event.stage.value} {_seconds(event.elapsed)}"
    if event.stage is Stage.SERVING_TAINTED:
        return head
    if event.stage is Stage.BACK:
        pods = [f"{event.evicted} pod{'s' * (event.evicted != 1)} evicted"]
        if event.deleted:
            pods.append(f"{event.deleted} deleted at the deadline")
        return f"{head} ({', '.join(pods) if event.evicted or event.deleted else event.message})"
    if event.stage is Stage.DRAINING:
        return None
    return f"{head}: {event.message}"


@dataclass
class ReclaimLines:
    out: TextIO

    def event(self, event: ReclaimEvent) -> None:
        line = reclaim_line(event)
        if line is not None:
            print(line, file=self.out, flush=True)

    def close(self) -> None:
        pass


class ReclaimBar:
    """A bar of nodes back; its postfix says how many are serving-tainted and which node still
    draining has had the most pods evicted (the slowest, most likely), with its last word."""

    def __init__(self, nodes: Sequence[str], stream: TextIO) -> None:
        from tqdm import tqdm

        self._total = len(nodes)
        cols, rows = _shape(stream)
        # No rate and no ETA: the drains end together at their one deadline, not at a rate.
        self._bar = tqdm(
            total=len(nodes),
            desc="nodes back",
            bar_format="{desc}: {n_fmt}/{total_fmt} |{bar:16}| {elapsed}{postfix}",
            file=stream,
            ncols=cols,
            nrows=rows,
        )
        self._stream = stream
        self._tainted: set[str] = set()
        self._draining: dict[str, ReclaimEvent] = {}  # node -> its last event, while it drains

    def event(self, event: ReclaimEvent) -> None:
        from rebalancer.runtime.takeback import Stage

        if event.stage is Stage.SERVING_TAINTED:
            self._tainted.add(event.node)
            self._draining[event.node] = event
        elif event.stage is Stage.DRAINING:
            self._draining[event.node] = event
        else:
            self._draining.pop(event.node, None)
            if event.stage is Stage.BACK:
                self._bar.update(1)
            else:  # failures stay on the screen above the bar
                self._bar.write(reclaim_line(event) or "", file=self._stream)
        self._bar.set_postfix_str(self._postfix(), refresh=True)

    def _postfix(self) -> str:
        text = f"serving-tainted {len(self._tainted)}/{self._total}"
        if self._draining:
            slowest = max(self._draining.values(), key=lambda e: (e.evicted, e.node))
            text += f", slowest {slowest.node}: {slowest.message}"
        return text

    def close(self) -> None:
        self._bar.close()


def _shape(stream: TextIO) -> tuple[int | None, int | None]:
    """Columns and rows for tqdm: None (it asks the terminal) unless the terminal says it has
    no size, as a pseudo terminal given none does; tqdm would then draw nothing at all."""
    import os

    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):
        return None, None
    return (None if size.columns > 0 else 100), (None if size.lines > 0 else 24)


def reclaim_summary(done: Sequence[Reclaimed]) -> list[str]:
    """The end of ``rebalancer reclaim``: counts, the time to the last serving taint and to the
    last node back, then each node not back with its reason, and what the exit status means."""
    back = [d for d in done if d.ok]
    tainted = [d.tainted for d in done if d.tainted is not None]
    returned = [d.back for d in done if d.back is not None]
    last_taint = _seconds(max(tainted)) if tainted else "-"
    last_back = _seconds(max(returned)) if returned else "-"
    lines = [
        f"{len(done)} node{'s' * (len(done) != 1)}: {len(back)} back, {len(done) - len(back)} "
        f"not back; last serving taint {last_taint}, last node back {last_back}"
    ]
    for d in done:
        if not d.ok:
            outcome = d.result.outcome.value if d.result is not None else "error"
            lines.append(f"not back: {d.node}: {outcome}: {d.message}")
        lines.extend(f"audit: {d.node}: {why}" for why in d.audit_errors)
    if len(back) < len(done):
        lines.append(f"exit 1: {len(done) - len(back)} node(s) not back")
    return lines


COLUMNS = ("time", "cluster", "kind", "pool", "node", "action", "origin", "result", "message")


def _audit(args: argparse.Namespace) -> int:
    import asyncio
    from datetime import UTC, datetime

    from rebalancer.adapters import audit as audit_store
    from rebalancer.runtime import wiring

    config = _settings(args)
    query = audit_query(args, datetime.now(UTC))
    interval = _duration("--interval", args.interval)
    if args.follow and query.until is not None:
        raise ConfigError(f"--until={args.until!r}: --follow runs until Ctrl-C; leave one out")
    _audit_store_exists(config)
    view = AuditView(sys.stdout, args.output)

    async def go() -> int:
        store = await wiring.open_audit_store(config)
        try:
            if not args.follow:
                view.show((await store.query(query)).records)
                return 0
            tail = audit_store.Tail(query)
            view.show(await tail.first(store))
            while True:
                await asyncio.sleep(interval)
                view.show(await tail.more(store))
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:  # how --follow ends; asyncio.run has closed the store
        return 0


def audit_query(args: argparse.Namespace, now: datetime) -> AuditQuery:
    """The query ``rebalancer audit``'s flags ask for, read by the HTTP API's parser (the same
    values, the same checks); a bad flag is a ``ConfigError`` naming it and its value."""
    from dataclasses import replace

    from rebalancer.runtime import http

    given = {
        "since": args.since,
        "until": args.until,
        "cluster": args.cluster,
        "pool": args.pool,
        "node": args.node,
        "action": args.action,
    }
    params = {name: [value] for name, value in given.items() if value is not None}
    if args.kind:
        params["kind"] = args.kind
    try:
        query = http.parse_query(params, now)
    except http.BadParameter as exc:
        why = exc.message.replace("after since", "after --since")
        raise ConfigError(f"--{exc.parameter}={errors.shown(exc.value)}: {why}") from None
    if args.limit < 1:
        raise ConfigError(f"--limit={args.limit}: must be at least 1")
    return replace(query, limit=args.limit, newest_first=not args.oldest_first)


def _audit_store_exists(config: Settings) -> None:
    """Refuse to read a SQLite store that is not there: opening it would make an empty one, and
    an empty table would say "nothing happened" where the truth is "wrong file"."""
    from rebalancer import settings
    from rebalancer.adapters import audit as audit_store

    path = audit_store.sqlite_file(config.audit.url)
    if path is None or path.exists():
        return
    variable = f"{settings.ENV_PREFIX}AUDIT__URL"
    if "url" not in config.audit.model_fields_set:
        raise ConfigError(
            f"no audit store to read: audit.url is not set and the default, {path}, does not "
            f"exist here; set audit.url in the --config file or {variable} to the controller's"
        )
    raise ConfigError(
        f"audit.url names {path}, which does not exist: no audit store to read there; set "
        f"audit.url (or {variable}) to the controller's"
    )


@dataclass
class AuditView:
    """Records as a table (columns as wide as the first records need), JSON lines or YAML
    documents."""

    out: TextIO
    output: str = "text"
    widths: list[int] | None = None

    def show(self, records: Sequence[audit.AuditRecord]) -> None:
        import json

        from rebalancer.adapters.audit import json_line

        if self.output == "json":
            for record in records:
                print(json_line(record), file=self.out)
            self.out.flush()
            return
        if self.output == "yaml":
            docs = [json.loads(json_line(record)) for record in records]
            for text in _documents(docs, "yaml"):
                print(text, file=self.out)
            self.out.flush()
            return
        rows = [audit_row(r) for r in records]
        if self.widths is None:
            self.widths = [
                max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(COLUMNS)
            ]
            rows.insert(0, COLUMNS)
        for row in rows:
            line = "  ".join(v.ljust(w) for v, w in zip(row, self.widths, strict=True))
            print(line.rstrip(), file=self.out)
        self.out.flush()


def audit_row(r: audit.AuditRecord) -> tuple[str, ...]:
    return (
        r.time.isoformat(timespec="seconds"),
        r.cluster,
        r.kind.value,
        r.pool,
        r.node or "-",
        r.action or "-",
        r.origin or "-",
        r.outcome or r.reason,
        r.message,
    )


# ---------------------------------------------------------------------------------------------
# The node pools: pools apply


def _pool_commands(commands: Any) -> None:
    pools = commands.add_parser(
        "pools",
        help="assign nodes to pools: labels and taints by selector",
        description="Node pools as a file says: each pool selects nodes by labels and sets "
        "labels and taints on them (docs/operations.md, docs/design/pools.md).",
    )
    verbs = pools.add_subparsers(required=True, metavar="VERB")
    apply = verbs.add_parser(
        "apply",
        help="make every node's labels and taints what its pool says",
        description="List every node, plan each one against the pools file and write what "
        "differs, one merge patch per node locked to the version read (a 409 reads the node "
        "again). A node the controller has lent or is moving is never written. Prints a diff "
        "per node and a summary. Exits 0 when every node a pool selects is as its pool says, 1 "
        "when a node was refused or a write failed, 2 when nothing was done (a bad file or "
        "flag, a cluster that cannot be read, or a node that two pools select).",
    )
    apply.add_argument("-f", "--file", type=Path, required=True, help="the pools file (YAML)")
    apply.add_argument(
        "--dry-run", action="store_true", help="print what would change, write nothing"
    )
    _output(apply, "json or yaml: one object per node, then a summary")
    apply.add_argument(
        "--config",
        type=Path,
        help="the controller's settings file, for its key_prefix (default: $REBALANCER_CONFIG, "
        "else rebalancer.io/)",
    )
    _cluster(apply)
    apply.set_defaults(handler=_pools_apply)


EXIT_INCOMPLETE = 1


def _pools_apply(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.runtime import poolfile, poolmanager

    keys = _settings(args).keys()
    layout = poolfile.load(args.file, keys)

    async def go() -> poolmanager.Report:
        async with poolmanager.open_writer(args.kubeconfig, args.context) as writer:
            return await poolmanager.apply(writer, layout, keys, dry_run=args.dry_run)

    report = asyncio.run(go())
    if report.overlap:
        for line in overlap_lines(report):
            print(f"rebalancer: {line}", file=sys.stderr)
        return EXIT_USAGE
    lines = pools_lines(report) if args.output == "text" else pools_docs(report, args.output)
    for line in lines:
        print(line)
    return 0 if report.complete else EXIT_INCOMPLETE


def _node_pools(plan: NodePlan) -> str:
    return " and ".join(plan.pools)


def overlap_lines(report: Report) -> list[str]:
    """Why an apply wrote nothing: each node two pools select, then what to do."""
    lines = [
        f"node/{p.node}: matched by pools {_node_pools(p)}; a node belongs to one pool"
        for p in report.overlap
    ]
    count = len(report.overlap)
    lines.append(
        f"{count} node{'s' * (count != 1)} matched by more than one pool: nothing was written; "
        "make the pools' selectors disjoint"
    )
    return lines


def pools_lines(report: Report) -> list[str]:
    """A line per node that changed (or would), was refused, failed or is in no pool; then the
    summary. Nodes already as their pool says are only counted."""
    from rebalancer.core.nodepools import Verdict

    changed = "would change" if report.dry_run else "changed"
    lines = []
    for r in report.results:
        p = r.plan
        head = f"node/{p.node}: pool {_node_pools(p)}"
        diff = ", ".join(p.edits)
        if r.error:
            lines.append(f"failed {head}: {r.error} (to do: {diff})")
        elif p.verdict is Verdict.CHANGE:
            lines.append(f"{changed} {head}: {diff}")
        elif p.verdict is Verdict.REFUSED:
            lines.append(f"refused {head}: {p.refusal} ({p.detail}); not written")
        elif p.verdict is Verdict.UNMATCHED:
            lines.append(f"unmatched node/{p.node}: matched by no pool; not touched")
        elif p.verdict is Verdict.AMBIGUOUS:  # only after a 409's read: the node had changed
            lines.append(
                f"ambiguous node/{p.node}: matched by pools {_node_pools(p)} once it "
                "changed; not written"
            )
    lines.append(pools_summary(report))
    return lines


def pools_summary(report: Report) -> str:
    """``3 changed, 5 unchanged, 1 refused (lent), 2 matched by no pool``; a dry run says
    ``would change`` and that nothing was written."""
    from rebalancer.core.nodepools import Verdict
    from rebalancer.runtime import poolmanager

    results = report.results
    refused = [r.plan for r in results if r.plan.verdict is Verdict.REFUSED]
    why = ", ".join(
        reason if len(refused) == 1 else f"{n} {reason}"
        for reason, n in poolmanager.refusals(refused).items()
    )
    if report.dry_run:
        moving = sum(r.plan.verdict is Verdict.CHANGE for r in results)
        parts = [f"{moving} would change"]
    else:
        parts = [f"{sum(r.written for r in results)} changed"]
    parts.append(f"{sum(r.plan.verdict is Verdict.UNCHANGED for r in results)} unchanged")
    parts.append(f"{len(refused)} refused" + (f" ({why})" if why else ""))
    failed = len(report.failed)
    if failed:
        parts.append(f"{failed} failed")
    both = sum(r.plan.verdict is Verdict.AMBIGUOUS for r in results)
    if both:
        parts.append(f"{both} matched by more than one pool")
    parts.append(f"{sum(r.plan.verdict is Verdict.UNMATCHED for r in results)} matched by no pool")
    text = ", ".join(parts)
    return f"dry run: {text}; nothing written" if report.dry_run else text


def pools_docs(report: Report, output: str) -> list[str]:
    """One object per node (every node, unchanged ones too), then ``{"summary": ...}``, as
    ``-o json`` or ``-o yaml`` prints them."""
    docs: list[dict[str, Any]] = []
    for r in report.results:
        p = r.plan
        doc = {
            "node": p.node,
            "verdict": p.verdict.value,
            "pools": list(p.pools),
            "edits": p.edits,
            "written": r.written,
            "error": r.error or None,
            "refusal": p.refusal or None,
            "detail": p.detail or None,
        }
        docs.append(doc)
    summary = {
        "dry_run": report.dry_run,
        "complete": report.complete,
        "line": pools_summary(report),
    }
    docs.append({"summary": summary})
    return _documents(docs, output)


if __name__ == "__main__":
    sys.exit(main())
