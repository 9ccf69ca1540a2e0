"""``rebalancer completion bash|zsh|fish``: the scripts written from the parsers.

bash's is sourced by a real bash and asked as bash asks it on Tab (``COMP_WORDS``,
``COMP_CWORD``, the function ``complete`` registered); zsh's is bash's functions under
``bashcompinit``, parsed by bash (and by zsh where it is installed); fish's is checked line by
line (and by fish where it is installed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rebalancer import cli
from rebalancer.cli import completion

# Asks the completion function as bash does on Tab: the words so far, the last one being typed
# (empty after a space); prints what it offers, one a line.
ASK = """\
source "$1"
shift
complete -p rebalancer
COMP_WORDS=("$@")
COMP_CWORD=$(($# - 1))
COMPREPLY=()
_rebalancer
printf '%s\\n' "${COMPREPLY[@]}"
"""


def printed(capsys: pytest.CaptureFixture[str], shell: str) -> str:
    assert cli.main(["completion", shell]) == 0
    return capsys.readouterr().out


@pytest.fixture
def bash_script(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    path = tmp_path / "rebalancer.bash"
    path.write_text(printed(capsys, "bash"))
    return path


def offered(script: Path, *words: str) -> list[str]:
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", ASK, "ask", str(script), *words],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not done.stderr
    registered, *rest = done.stdout.splitlines()
    assert registered == "complete -F _rebalancer rebalancer"
    return [line for line in rest if line]


@pytest.mark.parametrize(
    ("words", "offers"),
    [
        (["rebalancer", "ch"], ["check"]),
        (["rebalancer", "--config", "c.yaml", "ch"], ["check"]),  # a global flag before it
        (["rebalancer", "-n", "ml", "run", "--d"], ["--dry-run"]),
        (["rebalancer", "check", "-o", ""], ["text", "json", "yaml"]),
        (["rebalancer", "capacity", "--output", "y"], ["yaml"]),
        (["rebalancer", "pools", ""], ["apply"]),
        (["rebalancer", "pools", "apply", "--dr"], ["--dry-run"]),
        (["rebalancer", "reclaim", "--n"], ["--node", "--namespace"]),
        (["rebalancer", "completion", ""], ["bash", "zsh", "fish"]),
        (["rebalancer", "audit", "--json"], []),  # the unlisted alias is not offered
        # the harness commands' own parsers, built without running them
        (
            ["rebalancer", "simulate", "--no"],
            ["--nodes", "--no-trade", "--notice", "--notice-compare"],
        ),
        (["rebalancer", "simulate", "--strategy", "stat"], ["static"]),
        (["rebalancer", "demo", "--sp"], ["--speed"]),
        (["rebalancer", "--config", "c.yaml", "demo", "--strategy", "adap"], ["adaptive"]),
        (["rebalancer", "sandbox", "--e"], ["--empty"]),
    ],
)
def test_bash_offers_what_the_parsers_take(
    bash_script: Path, words: list[str], offers: list[str]
) -> None:
    assert offered(bash_script, *words) == offers


def test_bash_offers_the_files_for_a_flag_that_names_one(bash_script: Path) -> None:
    prefix = str(bash_script)[:-3]
    assert offered(bash_script, "rebalancer", "pools", "apply", "-f", prefix) == [str(bash_script)]
    assert offered(bash_script, "rebalancer", "--config", prefix) == [str(bash_script)]
    assert offered(bash_script, "rebalancer", "simulate", "--trace", prefix) == [str(bash_script)]


def test_the_harness_parsers_are_built_without_running_the_harness() -> None:
    """What ``harness_parsers`` finds for each command is the parser the command itself parses
    with: the flags it reads, and the refusal of one it does not."""
    from sandbox import cli as harness
    from sandbox import demo

    parsers = completion.harness_parsers()
    assert {p.prog for p in parsers.values()} == {
        "rebalancer simulate",
        "rebalancer sandbox",
        "rebalancer demo",
    }
    assert parsers["demo"].parse_args(["--speed", "5"]).speed == demo.parse(["--speed", "5"]).speed
    with pytest.raises(SystemExit):
        parsers["simulate"].parse_args(["--out", "x", "--no-such-flag"])
    assert harness.simulate_parser().format_help() == parsers["simulate"].format_help()


def test_every_command_is_offered_with_its_flags(bash_script: Path) -> None:
    top = completion.tree(cli.build_parser(), own=completion.harness_parsers())
    assert {c.path[0] for c in top.commands} >= {"run", "check", "audit", "capacity", "simulate"}
    harnesses = {c.path[0]: c for c in top.commands if c.path[0] in ("simulate", "sandbox", "demo")}
    assert harnesses.keys() == {"simulate", "sandbox", "demo"}
    for command in harnesses.values():  # each with every flag of its own parser
        assert len(command.options) > 2, command.path  # more than -h/--help
    for command in top.walk()[1:]:
        if command.commands:
            continue
        typed = ["rebalancer", *command.path, "-"]
        flags = [f for o in command.options for f in o.flags]
        assert offered(bash_script, *typed) == flags, command.path


def test_zsh_is_bash_s_functions_under_bashcompinit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = printed(capsys, "zsh")
    head = text.splitlines()[:5]
    assert head[0] == "#compdef rebalancer"
    assert "autoload -U +X bashcompinit && bashcompinit" in head
    bash_text = printed(capsys, "bash")
    assert text.endswith(bash_text.split("\n", 1)[1])
    path = tmp_path / "_rebalancer"
    path.write_text(text)
    shells = [["bash", "-n"]] + ([["zsh", "-n"]] if shutil.which("zsh") else [])
    for shell in shells:
        done = subprocess.run([*shell, str(path)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


FISH_LINE = re.compile(
    r"complete -c rebalancer( -n '(?:[^'\\]|\\.)*')?( -s \w)?( -l [\w-]+)?( -a \S+| -a '[^']*')?"
    r"( -rF| -x| -xa '[^']*')?( -d '(?:[^'\\]|\\.)*')?|complete -c rebalancer -f"
)


def test_fish_is_one_complete_line_per_command_and_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = printed(capsys, "fish")
    lines = text.splitlines()[1:]
    for line in lines:
        assert FISH_LINE.fullmatch(line), line
    assert (
        "complete -c rebalancer -n '__fish_seen_subcommand_from pools; and not "
        "__fish_seen_subcommand_from apply' -a apply -d 'make every node\\'s labels and taints "
        "what its pool says'"
    ) in lines
    assert any(
        line.startswith(
            "complete -c rebalancer -n '__fish_seen_subcommand_from capacity' -s o -l output "
            "-xa 'text json yaml'"
        )
        for line in lines
    )
    assert any(  # a harness command's flag, from its own parser
        line.startswith(
            "complete -c rebalancer -n '__fish_seen_subcommand_from simulate' -l trace -rF"
        )
        for line in lines
    )
    if shutil.which("fish"):
        path = tmp_path / "rebalancer.fish"
        path.write_text(text)
        done = subprocess.run(["fish", "--no-execute", str(path)], capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
