"""``rebalancer completion bash|zsh|fish``: the shell's completion, generated from the parsers.

Where it sits: the parsers ``rebalancer.cli`` builds are the one description of the command
line; ``tree`` walks them (commands, their flags, each flag's choices, and whether it names a
file) and each shell's script is written from that tree, so a flag added to a command completes
without anything written here. The harness commands (``simulate``, ``sandbox``, ``demo``) keep
parsers of their own, built when they run; next to each command ``module:name`` of the entry
points, ``module:name_parser()`` builds that parser without running anything, and only the
script's generation imports it (``harness_parsers``), so their flags complete too.

bash is written in full; zsh runs the same functions through its ``bashcompinit``; fish is
written as its own ``complete`` lines.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rebalancer.cli import common

SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...]
    path: bool  # its value names a file
    help: str


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # the words after ``rebalancer``; () the top
    help: str
    options: tuple[Option, ...]
    commands: tuple[Command, ...]
    words: tuple[str, ...] = ()  # what its arguments may be, where it names them (choices)

    def walk(self) -> list[Command]:
        """This command and every command under it, parents first."""
        return [self, *(c for child in self.commands for c in child.walk())]


def register(commands: Any) -> None:
    """`rebalancer completion`: its argument and handler."""
    complete = common.command_parser(
        commands,
        "completion",
        help="print the shell's completion script: bash, zsh or fish",
        description="Print a completion script for the shell, generated from the commands' "
        "own parsers. bash: source <(rebalancer completion bash), e.g. in ~/.bashrc. zsh: the "
        "same with zsh, after compinit. fish: rebalancer completion fish > "
        "~/.config/fish/completions/rebalancer.fish.",
    )
    complete.add_argument("shell", choices=SHELLS, help="the shell")
    complete.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from rebalancer import cli

    print(script(args.shell, tree(cli.build_parser(), own=harness_parsers())), end="")
    return 0


def harness_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parsers the harness commands build when they run, built here without running them:
    ``module:name_parser()`` next to each entry point's ``module:name``. A command without one,
    or one that cannot be loaded, keeps its name alone."""
    from importlib.metadata import entry_points

    from rebalancer import cli

    found = {}
    for ep in entry_points(group=cli.COMMANDS):
        try:
            build = getattr(importlib.import_module(ep.module), f"{ep.attr}_parser", None)
            if callable(build):
                found[ep.name] = build()
        except Exception:  # its name still completes; running it will say what is wrong
            continue
    return found


def script(shell: str, top: Command) -> str:
    """The completion script of ``shell`` for the commands of ``top``."""
    if shell == "fish":
        return fish(top)
    if shell == "zsh":
        return zsh(top)
    return bash(top)


def tree(
    parser: argparse.ArgumentParser,
    path: tuple[str, ...] = (),
    help: str = "",
    own: Mapping[str, argparse.ArgumentParser] | None = None,
) -> Command:
    """What ``parser`` and the parsers under it take: their flags (those --help lists) and
    their commands; a command named in ``own`` is walked in the parser given there, its own,
    rather than in the name-only placeholder the top parser lists."""
    options: list[Option] = []
    children: list[Command] = []
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                said = (own or {}).get(name, sub)
                children.append(tree(said, (*path, name), helps.get(name, "")))
        elif not action.option_strings:
            words += [str(c) for c in action.choices or ()]
        elif action.help is not argparse.SUPPRESS:
            options.append(_option(action))
    return Command(path, help, tuple(options), tuple(children), tuple(words))


def _option(action: argparse.Action) -> Option:
    choices = tuple(str(c) for c in action.choices or ())
    path = action.type is Path
    return Option(
        tuple(action.option_strings), action.nargs != 0, choices, path, _line(action.help)
    )


def _line(text: str | None) -> str:
    """A help text as one line (argparse's ``%%`` as ``%``)."""
    return " ".join((text or "").replace("%%", "%").split())


# ---------------------------------------------------------------------------------------------
# bash (and zsh, through bashcompinit)

_BASH_MAIN = """\
_rebalancer() {
    local cur prev path w i valued values
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    path=""
    i=1
    # The command so far: each word that is one of its commands, past the flags and the values
    # of those that take one.
    while [ "$i" -lt "$COMP_CWORD" ]; do
        w="${COMP_WORDS[i]}"
        case "$w" in
        -*)
            valued=" $(_rebalancer_valued "$path") "
            if [[ "$valued" == *" $w "* ]]; then i=$((i + 1)); fi
            ;;
        *)
            if [[ " $(_rebalancer_commands "$path") " == *" $w "* ]]; then
                path="${path:+$path }$w"
            fi
            ;;
        esac
        i=$((i + 1))
    done
    valued=" $(_rebalancer_valued "$path") "
    if [[ "$prev" == -* && "$valued" == *" $prev "* ]]; then
        values="$(_rebalancer_values "$path" "$prev")"
        if [ "$values" = "@file" ]; then
            COMPREPLY=($(compgen -f -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$values" -- "$cur"))
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_rebalancer_flags "$path")" -- "$cur"))
    else
        values="$(_rebalancer_commands "$path") $(_rebalancer_words "$path")"
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
    fi
    return 0
}
complete -F _rebalancer rebalancer
"""


def bash(top: Command) -> str:
    """bash's script: a function per question (the commands, the flags, the flags that take
    a value, a flag's values) answered by a ``case`` over the command so far."""
    every = top.walk()
    values: list[tuple[str, str]] = []
    for c in every:
        for o in c.options:
            said = "@file" if o.path else " ".join(o.choices)
            if said:
                values += [(f"{' '.join(c.path)}|{flag}", said) for flag in o.flags]
    parts = [
        "# rebalancer's bash completion, generated by `rebalancer completion bash`.",
        _bash_case("_rebalancer_commands", [(c, [s.path[-1] for s in c.commands]) for c in every]),
        _bash_case("_rebalancer_words", [(c, list(c.words)) for c in every]),
        _bash_case(
            "_rebalancer_flags", [(c, [f for o in c.options for f in o.flags]) for c in every]
        ),
        _bash_case(
            "_rebalancer_valued",
            [(c, [f for o in c.options if o.takes_value for f in o.flags]) for c in every],
        ),
        '_rebalancer_values() {\n    case "$1|$2" in\n'
        + "".join(f'    "{key}") echo "{said}" ;;\n' for key, said in values)
        + "    esac\n}\n",
        _BASH_MAIN,
    ]
    return "\n".join(parts)


def _bash_case(name: str, rows: list[tuple[Command, list[str]]]) -> str:
    lines = [f"{name}() {{", '    case "$1" in']
    lines += [
        f'    "{" ".join(c.path)}") echo "{" ".join(words)}" ;;' for c, words in rows if words
    ]
    lines += ["    esac", "}", ""]
    return "\n".join(lines)


def zsh(top: Command) -> str:
    """zsh's script: bash's functions, run by zsh's own emulation of bash's completion."""
    return (
        "#compdef rebalancer\n"
        "# rebalancer's zsh completion, generated by `rebalancer completion zsh`: bash's\n"
        "# functions, through zsh's bashcompinit. Load it after compinit.\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(top).split("\n", 1)[1]
    )


# ---------------------------------------------------------------------------------------------
# fish


def fish(top: Command) -> str:
    """fish's script: a ``complete`` line per command and per flag, each under the condition
    that the words so far lead to its command."""
    lines = [
        "# rebalancer's fish completion, generated by `rebalancer completion fish`.",
        "complete -c rebalancer -f",
    ]
    for c in top.walk():
        below = _fish_condition(c, [s.path[-1] for s in c.commands])
        for s in c.commands:
            lines.append(
                f"complete -c rebalancer -n {_fish_quote(below)} -a {s.path[-1]} "
                f"-d {_fish_quote(s.help)}"
            )
        within = _fish_condition(c, [])
        if c.words:
            words = _fish_quote(" ".join(c.words))
            lines.append(f"complete -c rebalancer -n {_fish_quote(within)} -a {words}")
        lines += [_fish_option(o, within) for o in c.options]
    return "\n".join(lines) + "\n"


def _fish_condition(c: Command, children: list[str]) -> str:
    """True while the words so far lead to ``c`` (and, given ``children``, to none of them)."""
    if not c.path:
        return "__fish_use_subcommand" if children else "true"
    said = f"__fish_seen_subcommand_from {c.path[-1]}"
    if children:
        said += f"; and not __fish_seen_subcommand_from {' '.join(children)}"
    return said


def _fish_option(o: Option, condition: str) -> str:
    words = ["complete -c rebalancer", f"-n {_fish_quote(condition)}"]
    for flag in o.flags:
        if flag.startswith("--"):
            words.append(f"-l {flag[2:]}")
        else:
            words.append(f"-s {flag[1:]}")
    if o.path:
        words.append("-rF")
    elif o.choices:
        words.append(f"-xa {_fish_quote(' '.join(o.choices))}")
    elif o.takes_value:
        words.append("-x")
    words.append(f"-d {_fish_quote(o.help)}")
    return " ".join(words)


def _fish_quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"
