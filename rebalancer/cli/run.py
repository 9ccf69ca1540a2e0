"""``rebalancer run``: the controller itself, until SIGTERM.

Where it sits: the command the chart's Deployment runs. The settings are loaded and checked
here; the controller is assembled by ``runtime.wiring`` (the one composition root) and runs
there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rebalancer.cli import common
from rebalancer.errors import ConfigError
from rebalancer.settings import Settings


def register(commands: Any) -> None:
    """`rebalancer run`: its flags and handler."""
    run = common.command_parser(
        commands,
        "run",
        help="run the controller until SIGTERM",
        description="Run the controller: informer, leader election, reconcile loop and the "
        "HTTP server (metrics, probes, audit API), until SIGTERM or SIGINT.",
    )
    common.controller_flags(run)
    common.global_flag(run, "namespace")
    common.global_flag(run, "verbose")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="plan and audit (outcome would_apply), write nothing to the cluster: no node, pod, "
        "Event or Lease (the dry_run setting)",
    )
    run.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from rebalancer import settings
    from rebalancer.runtime import livesettings, loop, wiring

    path = settings.config_path(args.config)
    adjust = adjusted(args)
    config = adjust(settings.load(path))
    if not config.pools:
        raise ConfigError(
            "pools=[]: the settings name no pool, so the controller would have nothing to "
            "watch or lend; add one (docs/configuration.md)"
        )
    loop.json_logging(logging.DEBUG if args.verbose else getattr(logging, config.log_level))

    async def go() -> int:
        # The file is read again when it changes, with the same adjustments
        # (docs/design/live-settings.md).
        source = None if path is None else livesettings.SettingsSource(path, adjust)
        seams = wiring.Seams(kubeconfig=args.kubeconfig, context=args.context, settings_file=source)
        async with wiring.Controller.open(config, seams) as controller:
            return await controller.run()

    return asyncio.run(go())


def adjusted(args: argparse.Namespace) -> Callable[[Settings], Settings]:
    """The command line over whatever the file says, at start and at every reload of it:
    ``-n/--namespace`` (``common.flags_over_settings``) and ``--dry-run``."""
    flags = common.flags_over_settings(args)
    if not args.dry_run:
        return flags
    return lambda config: flags(config).model_copy(update={"dry_run": True})
