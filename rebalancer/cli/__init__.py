"""The ``rebalancer`` command. Each subcommand parses its arguments, then calls one function.

Errors a person can fix (a bad trace, an unknown strategy, a bad parameter) are printed as one
clear line each and exit with status 2; nothing prints a traceback for bad input.

Where things are: ``main`` builds the parser and dispatches; each command has its module, with
``register`` (its parser) and ``handle`` (what it does) and its own output: ``run``, ``check``,
``status``, ``reclaim``, ``explain``, ``audit``, ``capacity``, ``gpu_labeler``, ``pools``,
``completion``. What several of them use (their common flags, the settings, documents, the
controller that only reads) is in ``common``. Starting the command builds every parser and
nothing more: each handler imports the runtime (the Kubernetes client) it needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import NoReturn

from rebalancer import __version__
from rebalancer.adapters import registry
from rebalancer.cli import (
    audit,
    capacity,
    check,
    common,
    completion,
    explain,
    gpu_labeler,
    pools,
    reclaim,
    run,
    status,
)
from rebalancer.errors import RebalancerError
from rebalancer.settings import InvalidSettings

# More subcommands come from installed distributions through these entry points: each names a
# ``main(argv) -> int`` whose docstring's first line is its help. The project's harnesses
# (``rebalancer simulate``, ``sandbox``, ``demo``; the ``rebalancer-sandbox`` distribution in the
# source tree) arrive this way, so the controller's own package never imports them.
COMMANDS = "rebalancer.commands"
Command = Callable[[Sequence[str]], int]

# The commands of this package, in the order --help lists them: the controller's (they read the
# settings), then the node pools', then the shell's completion.
BUILT_IN = (run, check, status, reclaim, explain, audit, capacity, gpu_labeler, pools, completion)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = {ep.name: ep for ep in entry_points(group=COMMANDS)}
    at = command_at(argv)
    if at is not None and argv[at] in plugins:
        # Its own parser: argparse here would swallow the command's options. The global flags
        # given before it are handed on after it, as its parser reads them.
        command: Command = plugins[argv[at]].load()
        return _reported(lambda: command([*argv[:at], *argv[at + 1 :]]))
    return _reported(lambda: (args := parse(argv, plugins)).handler(args))


def parse(
    argv: Sequence[str], plugins: Mapping[str, EntryPoint] | None = None
) -> argparse.Namespace:
    """A built-in command's arguments, each global flag read wherever it was given (a flag
    given after the command wins over the same given before it) or its default; a global
    flag the command does not read is a ConfigError."""
    args, extra = _parser(plugins or {}).parse_known_args(argv)
    if extra:  # argparse would say it as the top parser's, with the whole usage
        _refuse(
            getattr(args, common.PROG, "rebalancer"), f"unrecognized arguments: {' '.join(extra)}"
        )
    return common.settle(args)


class _Parser(argparse.ArgumentParser):
    """argparse's, whose errors are one line naming the command, the argument and where the
    command's help is, instead of the usage of the whole command line."""

    def error(self, message: str) -> NoReturn:
        _refuse(self.prog, message)


def _refuse(prog: str, message: str) -> NoReturn:
    """Exit 2 with ``message`` about the command ``prog`` (``rebalancer check``) on one line."""
    command = prog.removeprefix("rebalancer").strip()
    where = f"{command}: " if command else ""
    print(f"rebalancer: {where}{message}; see '{prog} --help'", file=sys.stderr)
    raise SystemExit(common.EXIT_USAGE)


def command_at(argv: Sequence[str]) -> int | None:
    """Where the command is in ``argv``: the first word that is neither a global flag nor its
    value (``--config x check``: 2); None when there is none before another flag."""
    valued = {
        flag
        for name, flags in common.GLOBAL_FLAGS.items()
        if name not in common.SWITCHES
        for flag in flags
    }
    switches = {flag for name in common.SWITCHES for flag in common.GLOBAL_FLAGS[name]}
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if not token.startswith("-"):
            return i
        if token in valued:  # its value is the next word
            i += 2
        elif name in valued or token in switches or (token.startswith("-n") and len(token) > 2):
            i += 1  # --config=x, -nx, -v
        else:
            return None  # --help, --version: the top parser's own
    return None


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
    return common.EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    """The whole command line's parser, the harness commands' names included (``completion``
    walks it)."""
    return _parser({ep.name: ep for ep in entry_points(group=COMMANDS)})


def _parser(plugins: Mapping[str, EntryPoint]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rebalancer",
        description="Lend idle inference GPU nodes to preemptible training, and take them back.",
        epilog="simulate, sandbox and demo come with the rebalancer-sandbox distribution "
        "(sandbox/ in the source tree; make demo and make test install it).",
    )
    parser.add_argument("--version", action="version", version=f"rebalancer {__version__}")
    for name in common.GLOBAL_DEFAULTS:  # also after the command, where it reads them
        common.global_flag(parser, name)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for module in BUILT_IN:
        module.register(commands)
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
