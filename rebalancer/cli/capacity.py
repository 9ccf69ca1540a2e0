"""``rebalancer capacity``: what one node of a pool serves when full, from Prometheus history.

Where it sits: before sizing a pool's ``capacity.per_node`` (docs/capacity.md). The measuring
and printing are ``commands.capacity``'s; this module only declares the flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from rebalancer.cli import common


def register(commands: Any) -> None:
    """`rebalancer capacity`: its flags and handler (``commands.capacity``)."""
    measure = common.command_parser(
        commands,
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
    common.controller_flags(measure, kube=False)
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
    common.output_flag(measure, "json or yaml: one document")
    measure.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from rebalancer.commands import capacity

    return capacity.command(args)
