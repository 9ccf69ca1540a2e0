"""``rebalancer check``: is a settings file ready to deploy, and (``--online``) to this cluster?

Where it sits: before a deploy, by hand or in CI. The checks themselves are
``commands.check``'s; this module turns settings that do not load into findings too, and prints
them as lines or one document.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rebalancer.cli import common
from rebalancer.settings import InvalidSettings

if TYPE_CHECKING:  # the command's body is imported by the handler, not at start
    from rebalancer.commands.check import Finding


def register(commands: Any) -> None:
    """`rebalancer check`: its flags and handler."""
    check = common.command_parser(
        commands,
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
    common.output_flag(check, "json or yaml: {ok, findings: [{level, field, message}]}")
    common.controller_flags(check)
    check.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import asyncio

    from rebalancer.commands import check

    timeout = common.duration("--timeout", args.timeout)
    try:
        config = common.load_settings(args)
    except InvalidSettings as exc:
        found = [check.Finding(check.Level.FAIL, *_split_line(line)) for line in exc.lines]
        return _findings(found, args.output)
    found = check.offline(config)
    if args.online and not any(f.level is check.Level.FAIL for f in found):

        async def go() -> list[check.Finding]:
            async with common.reading(args, config, timeout) as controller:
                return await check.online(config, controller)

        found += asyncio.run(go())
    return _findings(found, args.output)


def _split_line(line: str) -> tuple[str, str]:
    """A settings problem, ``path=value: why``, as ``(path, value: why)``."""
    field, sep, rest = line.partition("=")
    return (field, rest) if sep and " " not in field else ("settings", line)


def _findings(found: Sequence[Finding], output: str) -> int:
    from rebalancer.commands.check import Level

    failed = any(f.level is Level.FAIL for f in found)
    doc = {"ok": not failed, "findings": [f.doc() for f in found]}
    common.print_document(doc, output, lambda: [str(f) for f in found])
    return 1 if failed else 0
