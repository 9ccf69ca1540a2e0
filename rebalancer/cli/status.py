"""``rebalancer status``: each pool and each of its nodes in rows, as ``kubectl get`` prints.

Where it sits: an operator's look at what is lent, read from the Nodes (their state is there)
and the audit log (the error budgets), writing nothing (``common.reading``); the rows are
``core.status``'s. Why a command and not a status resource: ``core.status``.
"""

from __future__ import annotations

import argparse
from typing import Any

from rebalancer.cli import common


def register(commands: Any) -> None:
    """`rebalancer status`: its flags and handler."""
    p = common.command_parser(
        commands,
        "status",
        help="each pool and its nodes: serving, lent, noticed, paused, budget left",
        description="Read the cluster's nodes and each pool's error budget, and print a row per "
        "pool (nodes, serving, lending, lent, noticed, reclaiming, paused, budget left) and a "
        "row per node (its phase, for how long, its decision and overrides), writing nothing. "
        "The phases are on the Nodes: `kubectl get nodes -L rebalancer.io/state` shows them too.",
    )
    p.add_argument("--pool", help="only this pool")
    common.output_flag(p, "json or yaml: the pools' and the nodes' rows")
    p.add_argument(
        "--timeout", default="60s", help="how long to wait for the cluster's nodes and pods (60s)"
    )
    common.controller_flags(p)
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.commands import status
    from rebalancer.core import status as rows

    timeout = common.duration("--timeout", args.timeout)
    config = common.load_settings(args)

    async def go() -> int:
        async with common.reading(args, config, timeout) as controller:
            doc = await status.preview(controller.reconciler, pool=args.pool)
        common.print_document(doc, args.output, lambda: rows.lines(doc))
        return 0

    return asyncio.run(go())
