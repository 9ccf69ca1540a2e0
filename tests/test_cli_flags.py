"""The flags every ``rebalancer`` command spells as kubectl and helm do: the global flags
(``--config``, ``--kubeconfig``, ``--context``, ``-n/--namespace``) before or after the command,
``--version``, ``-o text|json|yaml`` on exactly the commands that print records, and
``rebalancer sandbox`` on a port already taken.

Each refusal is one line naming the flag and its value, exit status 2.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from rebalancer import cli
from rebalancer.cli import common, completion

SETTINGS = """\
leader_election: {lease_namespace: from-the-file}
pools:
  - name: l20
    node_selector: {gpu: l20}
    rps_per_node: 4
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(SETTINGS)
    return path


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_the_config_flag_is_read_before_the_command_as_after_it(
    config: Path, capsys: pytest.CaptureFixture[str], before: bool
) -> None:
    flags = ["--config", str(config)]
    argv = [*flags, "check", "-o", "json"] if before else ["check", "-o", "json", *flags]
    assert cli.main(argv) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_a_global_flag_after_the_command_wins_over_the_same_before_it(
    config: Path, tmp_path: Path
) -> None:
    args = cli.parse(["--config", str(tmp_path / "other.yaml"), "check", "--config", str(config)])
    assert args.config == config
    assert (args.kubeconfig, args.context, args.namespace) == (None, None, None)


@pytest.mark.parametrize(
    "flags", [["-n", "ml-serving"], ["--namespace=ml-serving"], ["-nml-serving"]]
)
@pytest.mark.parametrize("command", ["run", "reclaim"])
def test_the_namespace_flag_is_the_lease_namespace_over_the_settings(
    config: Path, flags: list[str], command: str
) -> None:
    which = ["--all"] if command == "reclaim" else []
    before = cli.parse([*flags, command, *which, "--config", str(config)])
    after = cli.parse([command, *which, "--config", str(config), *flags])
    for args in (before, after):
        assert common.load_settings(args).leader_election.lease_namespace == "ml-serving"
    unset = cli.parse([command, *which, "--config", str(config)])
    assert common.load_settings(unset).leader_election.lease_namespace == "from-the-file"


@pytest.mark.parametrize("argv", [["-v", "run"], ["run", "--verbose"], ["gpu-labeler", "-v"]])
def test_verbose_is_read_before_the_command_as_after_it(argv: list[str]) -> None:
    assert cli.parse(argv).verbose is True
    assert cli.parse([a for a in argv if not a.startswith("-")]).verbose is False


def test_a_namespace_that_is_not_a_name_is_one_line(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["-n", "ML_Serving", "run", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rebalancer: --namespace='ML_Serving': not a namespace name; write a DNS label such as "
        "rebalancer"
    ]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--kubeconfig", "kc", "audit"],
            "--kubeconfig=kc: rebalancer audit does not read it (the global flags it reads: "
            "--config)",
        ),
        (
            ["-n", "ml", "check"],
            "--namespace=ml: rebalancer check does not read it (the global flags it reads: "
            "--config, --kubeconfig, --context)",
        ),
        (
            ["--config", "c.yaml", "gpu-labeler"],
            "--config=c.yaml: rebalancer gpu-labeler does not read it (the global flags it "
            "reads: --kubeconfig, --context, --verbose)",
        ),
        (
            ["-v", "audit"],
            "--verbose: rebalancer audit does not read it (the global flags it reads: --config)",
        ),
        (
            ["--context", "prod", "completion", "bash"],
            "--context=prod: rebalancer completion does not read it (the global flags it reads: "
            "none)",
        ),
    ],
)
def test_a_global_flag_the_command_does_not_read_is_refused_in_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"rebalancer: {line}"]


def test_global_flags_before_a_harness_command_reach_its_own_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", "c.yaml", "simulate", "--trace", "t.csv", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    # simulate's own refusal of --config without --pool: it was handed the flag.
    assert capsys.readouterr().err.splitlines() == [
        "rebalancer: --config=c.yaml: name the pool to simulate with --pool"
    ]


@pytest.mark.parametrize(
    ("argv", "at"),
    [
        (["simulate"], 0),
        (["-n", "x", "-v", "--config=c.yaml", "-nx", "simulate", "--pool", "p"], 5),
        (["--context", "k", "--namespace=x", "sandbox"], 3),
        (["--version"], None),
        (["-n"], None),
    ],
)
def test_the_command_is_found_past_the_global_flags_and_their_values(
    argv: list[str], at: int | None
) -> None:
    assert cli.command_at(argv) == at


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["check", "--bogus"],
            "rebalancer: check: unrecognized arguments: --bogus; see 'rebalancer check --help'",
        ),
        (
            ["--config", "c.yaml", "status", "-o", "xml"],
            "rebalancer: status: argument -o/--output: invalid choice: 'xml' (choose from "
            "'text', 'json', 'yaml'); see 'rebalancer status --help'",
        ),
        (
            ["pools", "apply"],
            "rebalancer: pools apply: the following arguments are required: -f/--file; "
            "see 'rebalancer pools apply --help'",
        ),
    ],
    ids=["unknown-flag", "bad-choice", "missing-flag"],
)
def test_a_bad_argument_is_one_line_naming_the_command_and_its_help(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert capsys.readouterr() == ("", said + "\n")


def test_version_prints_the_installed_distribution_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"rebalancer {version('rebalancer')}\n"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_the_sandbox_on_a_port_in_use_says_so_in_one_line_and_exits_2(
    taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    argv = ["sandbox", "--port", str(taken_port), "--kubeconfig", str(kubeconfig), "--empty"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"rebalancer sandbox: port {taken_port} is in use (address already in use); pass --port"
    ]
    assert not kubeconfig.exists()


# The commands that print records or a document, and so take -o (docs/operations.md); the others
# run (run, gpu-labeler, sandbox, demo) or print a script (completion).
PRINT_RECORDS = {
    "audit",
    "explain",
    "status",
    "check",
    "capacity",
    "pools apply",
    "reclaim",
    "simulate",
}


def test_exactly_the_commands_that_print_records_take_o_text_json_yaml() -> None:
    top = completion.tree(cli.build_parser(), own=completion.harness_parsers())
    taking = {}
    for command in top.walk()[1:]:
        for option in command.options:
            if "-o" in option.flags:
                taking[" ".join(command.path)] = (option.flags, option.choices)
    assert taking == dict.fromkeys(PRINT_RECORDS, (("-o", "--output"), common.OUTPUTS))
