"""``rebalancer explain``: why a node is lent or not, and what the next tick would do to it.

Where it sits: an operator's question, answered by observing, deciding and planning once as the
loop does, writing nothing (``common.reading``). The answer is ``commands.explain``'s, the same
document ``GET /api/v1/explain`` gives; this module prints it.
"""

from __future__ import annotations

import argparse
from typing import Any

from rebalancer.cli import common
from rebalancer.errors import ConfigError


def register(commands: Any) -> None:
    """`rebalancer explain`: its flags and handler."""
    why = common.command_parser(
        commands,
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
    common.output_flag(why, "json or yaml: the document GET /api/v1/explain gives")
    why.add_argument(
        "--timeout", default="60s", help="how long to wait for the cluster's nodes and pods (60s)"
    )
    common.controller_flags(why)
    why.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.commands import explain
    from rebalancer.runtime.explaining import NotExplained

    timeout = common.duration("--timeout", args.timeout)
    config = common.load_settings(args)

    async def go() -> int:
        try:
            async with common.reading(args, config, timeout) as controller:
                doc = await explain.preview(
                    controller.reconciler,
                    node=args.node,
                    pool=args.pool,
                    interval=config.tick_interval,
                )
        except NotExplained as exc:
            raise ConfigError(str(exc)) from None
        common.print_document(doc, args.output, lambda: explain.lines(doc))
        return 0

    return asyncio.run(go())
