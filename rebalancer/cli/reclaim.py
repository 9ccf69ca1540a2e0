"""``rebalancer reclaim``: take lent nodes back now, through the audited path, all at once.

Where it sits: the runbook's answer to a controller that is down, and the chart's pre-delete
hook (``--stop-controller``). The wave, and standing the controller down first, are
``commands.reclaim``'s (``reclaim_wave``, ``stop_controller``); this module checks the flags,
picks the nodes, and shows the wave: a live bar on a terminal, one line per node event
otherwise, then a summary whose last line says what the exit status means.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from rebalancer.cli import common
from rebalancer.core.concurrency import RECLAIM_CONCURRENCY, RECLAIM_MAX_CONCURRENCY
from rebalancer.errors import ConfigError
from rebalancer.settings import Settings

if TYPE_CHECKING:  # the command's body and the runtime are imported by the handler
    from rebalancer.commands.reclaim import Reclaimed, ReclaimEvent
    from rebalancer.runtime.wiring import Controller


def register(commands: Any) -> None:
    """`rebalancer reclaim`: its flags and handler."""
    reclaim = common.command_parser(
        commands,
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
        help="first scale the controller's Deployment (in -n/--namespace, else "
        "leader_election.lease_namespace) to 0 "
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
    common.output_flag(
        reclaim,
        "json or yaml: one object per node, then a summary; each node event then goes to stderr",
    )
    common.controller_flags(reclaim)
    common.global_flag(reclaim, "namespace")
    reclaim.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Check the flags and the settings, then take the nodes back: stand the controller down if
    asked, pick the nodes, run the wave, print its summary."""
    import asyncio

    if not 1 <= args.concurrency <= RECLAIM_MAX_CONCURRENCY:
        raise ConfigError(
            f"--concurrency={args.concurrency}: must be between 1 and {RECLAIM_MAX_CONCURRENCY}"
        )
    if args.log_records and args.output != "text":
        raise ConfigError(
            f"--log-records: prints JSON lines on stdout, where -o {args.output} prints the "
            "nodes; give one of them"
        )
    stop_timeout = common.duration("--stop-timeout", args.stop_timeout)
    config = common.load_settings(args)
    pools = _configured_pools(args.pool or (), config)
    return asyncio.run(_take_back(args, config, pools, stop_timeout))


def _configured_pools(names: Sequence[str], config: Settings) -> list[str]:
    """``--pool`` once each, in order; a name no configured pool has is a ConfigError."""
    pools = list(dict.fromkeys(names))
    configured = [p.name for p in config.pools]
    for name in pools:
        if name not in configured:
            known = ", ".join(configured) or "none"
            raise ConfigError(f"--pool={name}: no configured pool has that name ({known})")
    return pools


async def _take_back(
    args: argparse.Namespace, config: Settings, pools: list[str], stop_timeout: float
) -> int:
    from rebalancer.adapters import audit as audit_store
    from rebalancer.commands.reclaim import lent_nodes, reclaim_wave
    from rebalancer.runtime import wiring

    sink = audit_store.stdout_sink if args.log_records else None
    seams = wiring.Seams(kubeconfig=args.kubeconfig, context=args.context, sink=sink)
    # With -o json or yaml, stdout has the documents alone: what is said on the way, stderr.
    said = sys.stdout if args.output == "text" else sys.stderr
    async with wiring.Controller.open(config, seams, wiring.Role.OPERATOR) as controller:
        if args.stop_controller:
            namespace = config.leader_election.lease_namespace
            stopping = (controller, namespace, args.stop_controller, stop_timeout)
            if not await _stand_down(*stopping, said):
                return common.EXIT_INCOMPLETE
        if args.node:
            nodes, known = list(dict.fromkeys(args.node)), None
        else:
            known = await lent_nodes(controller, pools)
            nodes = list(known)
        done: list[Reclaimed] = []
        if nodes:
            view = reclaim_view(nodes, said, sys.stderr)
            try:
                done = await reclaim_wave(
                    controller,
                    nodes,
                    known=known,
                    concurrency=args.concurrency,
                    on_event=view.event,
                )
            finally:
                view.close()
    printed = reclaim_summary(done) if args.output == "text" else reclaim_docs(done, args.output)
    for line in printed:
        print(line, flush=True)
    return 0 if all(d.ok for d in done) else 1


async def _stand_down(
    controller: Controller, namespace: str, deployment: str, timeout: float, out: TextIO
) -> bool:
    """Scale the controller's Deployment to 0 and wait for its pods to go, saying so; False
    (with a line on stderr) when they did not, and then nothing is taken back."""
    from rebalancer.commands.reclaim import NotStopped, stop_controller

    try:
        stopped = await stop_controller(controller.api, namespace, deployment, timeout)
    except NotStopped as exc:
        print(f"rebalancer: {exc}; nothing taken back", file=sys.stderr)
        return False
    print(
        f"deployment/{stopped.deployment} scaled to 0; its {stopped.pods} pod(s) "
        f"gone in {stopped.waited:.1f}s",
        file=out,
        flush=True,
    )
    return True


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
    from rebalancer.commands.reclaim import Stage

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
        from rebalancer.commands.reclaim import Stage

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
    if not done:
        return ["no node is lent"]
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


def reclaim_docs(done: Sequence[Reclaimed], output: str) -> list[str]:
    """One object per node taken back (its outcome, seconds to its serving taint and to serving
    again, pods evicted and deleted, audit records not stored), then ``{"summary": ...}`` with
    the counts, the exit status and the summary's first line, as ``-o json`` or ``-o yaml``
    prints them."""
    docs: list[dict[str, Any]] = [
        {
            "node": d.node,
            "pool": d.pool,
            "back": d.ok,
            "outcome": d.result.outcome.value if d.result is not None else "error",
            "message": d.message,
            "intent": d.intent.id if d.intent is not None else None,
            "serving_tainted_seconds": _in_seconds(d.tainted),
            "back_seconds": _in_seconds(d.back),
            "evicted": d.evicted,
            "deleted": d.deleted,
            "audit_errors": list(d.audit_errors),
        }
        for d in done
    ]
    back = sum(d.ok for d in done)
    summary = {
        "nodes": len(done),
        "back": back,
        "not_back": len(done) - back,
        "exit": 0 if back == len(done) else 1,
        "line": reclaim_summary(done)[0],
    }
    return common.documents([*docs, {"summary": summary}], output)


def _in_seconds(elapsed: timedelta | None) -> float | None:
    return None if elapsed is None else round(elapsed.total_seconds(), 3)
