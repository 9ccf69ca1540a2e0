"""``rebalancer gpu-labeler``: keep this node's ``nvidia.com/gpu.*`` labels in step with its GPUs.

Where it sits: the chart's DaemonSet runs it on every GPU node (docs/design/gpu-labels.md); the
passes are ``commands.gpu_labeler``'s. This module reads the flags into its options.
"""

from __future__ import annotations

import argparse
from typing import Any

from rebalancer.cli import common
from rebalancer.errors import ConfigError


def register(commands: Any) -> None:
    """`rebalancer gpu-labeler`: its flags and handler."""
    gpus = common.command_parser(
        commands,
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
    common.cluster_flags(gpus)
    common.global_flag(gpus, "verbose", help="log at DEBUG (default: INFO)")
    gpus.add_argument("--dry-run", action="store_true", help="log the changes, write nothing")
    gpus.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import os

    from rebalancer.commands import gpu_labeler
    from rebalancer.runtime import loop

    node = args.node or os.environ.get("NODE_NAME", "")
    if not node.strip():
        raise ConfigError(
            "--node: required (or set NODE_NAME, as the chart does from spec.nodeName)"
        )
    options = gpu_labeler.Options(
        node=node.strip(),
        interval=common.duration("--interval", args.interval),
        once=args.once,
        nvidia_smi=args.nvidia_smi,
        timeout=common.duration("--timeout", args.timeout),
        kubeconfig=args.kubeconfig,
        context=args.context,
        dry_run=args.dry_run,
    )
    loop.json_logging(logging.DEBUG if args.verbose else logging.INFO)
    return asyncio.run(gpu_labeler.main(options))
