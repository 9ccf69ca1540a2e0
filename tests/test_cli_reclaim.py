"""``rebalancer reclaim`` in process, without a cluster: its flags, its lines and its live bar.

The bad flags fail before anything is opened (one line on stderr, exit 2). The views are fed
``ReclaimEvent`` values as the wave would send them: plain lines when stderr is not a terminal,
a tqdm bar (on a stream that says it is a terminal) when it is. ``-o json|yaml`` prints the
wave's nodes as documents (``tests/test_cli_run.py`` runs it on the emulator).
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest

from rebalancer import cli
from rebalancer.cli import common
from rebalancer.cli import reclaim as reclaim_command
from rebalancer.commands.reclaim import Reclaimed, ReclaimEvent, Stage
from rebalancer.core.model import Action
from rebalancer.core.outcomes import ActionResult, Outcome
from tests.support.processes import config_text


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def ev(
    node: str, stage: Stage, seconds: float, message: str = "", evicted: int = 0
) -> ReclaimEvent:
    return ReclaimEvent(node, stage, timedelta(seconds=seconds), message, evicted=evicted)


@pytest.mark.parametrize("value", ["0", "65", "-3"])
def test_a_concurrency_outside_1_to_64_is_one_line_and_exit_2(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["reclaim", "--all", "--concurrency", value]) == common.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"rebalancer: --concurrency={value}: must be between 1 and 64\n"


def test_an_unknown_pool_is_one_line_naming_the_configured_ones_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tmp_path / "audit.sqlite3", 8080), encoding="utf-8")
    code = cli.main(["reclaim", "--pool", "inference", "--pool", "nope", "--config", str(config)])
    assert code == common.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "rebalancer: --pool=nope: no configured pool has that name (inference)\n"
    assert not (tmp_path / "audit.sqlite3").exists()  # nothing was opened


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_log_records_with_json_or_yaml_is_one_line_and_exit_2(
    output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both would print on stdout: the audit records' JSON lines would be read as nodes."""
    assert cli.main(["reclaim", "--all", "--log-records", "-o", output]) == common.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"rebalancer: --log-records: prints JSON lines on stdout, where -o {output} prints the "
        "nodes; give one of them\n"
    )


def test_json_is_one_object_per_node_then_the_summary() -> None:
    back = ActionResult("inference-3", Action.RECLAIM, Outcome.APPLIED, "serving")
    done = [
        Reclaimed(
            "inference-3",
            "l20",
            back,
            None,
            "serving",
            timedelta(seconds=0.5),
            timedelta(seconds=12.25),
            evicted=2,
        ),
        Reclaimed("gone-1", None, None, None, "cannot read the node: 404"),
    ]
    node, failed, summary = map(json.loads, reclaim_command.reclaim_docs(done, "json"))
    assert node == {
        "node": "inference-3",
        "pool": "l20",
        "back": True,
        "outcome": "applied",
        "message": "serving",
        "intent": None,
        "serving_tainted_seconds": 0.5,
        "back_seconds": 12.25,
        "evicted": 2,
        "deleted": 0,
        "audit_errors": [],
    }
    assert (failed["back"], failed["outcome"], failed["back_seconds"]) == (False, "error", None)
    assert summary == {
        "summary": {
            "nodes": 2,
            "back": 1,
            "not_back": 1,
            "exit": 1,
            "line": reclaim_command.reclaim_summary(done)[0],
        }
    }
    [only] = reclaim_command.reclaim_docs([], "yaml")  # nothing lent: the summary alone
    assert only.splitlines()[1:3] == ["summary:", "  nodes: 0"]
    assert "line: no node is lent" in only


def test_plain_lines_say_each_node_event_once_and_leave_the_drain_passes_out() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = reclaim_command.reclaim_view(["inference-3", "inference-4"], out, err)
    assert isinstance(view, reclaim_command.ReclaimLines)
    for event in (
        ev("inference-3", Stage.SERVING_TAINTED, 0.4, "2 borrowed pod(s) left"),
        ev("inference-3", Stage.DRAINING, 1.4, "2 borrowed pod(s) left", evicted=2),
        ev("inference-4", Stage.FAILED, 0.5, "refused: unreadable state"),
        ev("inference-3", Stage.BACK, 12.1, "reclaimed: serving again", evicted=2),
    ):
        view.event(event)
    view.close()
    assert out.getvalue().splitlines() == [
        "inference-3 serving-tainted 0.4s",
        "inference-4 failed 0.5s: refused: unreadable state",
        "inference-3 back 12.1s (2 pods evicted)",
    ]
    assert err.getvalue() == ""


def test_pods_deleted_at_the_deadline_are_said_beside_the_evicted_ones() -> None:
    event = ReclaimEvent(
        "inference-2", Stage.BACK, timedelta(seconds=121), "reclaimed", evicted=1, deleted=1
    )
    assert (
        reclaim_command.reclaim_line(event)
        == "inference-2 back 121.0s (1 pod evicted, 1 deleted at the deadline)"
    )
    waiting = ev("inference-2", Stage.NOT_BACK, 150, "1 borrowed pod(s) left, 1 blocked")
    assert (
        reclaim_command.reclaim_line(waiting)
        == "inference-2 not-back 150.0s: 1 borrowed pod(s) left, 1 blocked"
    )


def test_on_a_terminal_a_bar_counts_nodes_back_and_names_the_slowest_drain() -> None:
    out, err = io.StringIO(), Terminal()
    view = reclaim_command.reclaim_view(["inference-3", "inference-4", "inference-5"], out, err)
    assert isinstance(view, reclaim_command.ReclaimBar)
    view.event(ev("inference-3", Stage.SERVING_TAINTED, 0.3, "1 borrowed pod(s) left"))
    view.event(ev("inference-4", Stage.SERVING_TAINTED, 0.4, "3 borrowed pod(s) left"))
    view.event(ev("inference-4", Stage.DRAINING, 1.4, "3 borrowed pod(s) left", evicted=3))
    view.event(ev("inference-3", Stage.DRAINING, 1.4, "1 borrowed pod(s) left", evicted=1))
    drawn = err.getvalue()
    assert "serving-tainted 2/3, slowest inference-4: 3 borrowed pod(s) left" in drawn
    view.event(ev("inference-5", Stage.FAILED, 0.5, "refused: unreadable state"))
    view.event(ev("inference-3", Stage.BACK, 5.0, "reclaimed", evicted=1))
    view.close()
    drawn = err.getvalue()
    assert "inference-5 failed 0.5s: refused: unreadable state\n" in drawn  # above the bar
    assert "nodes back: 1/3 |" in drawn
    assert out.getvalue() == ""  # the summary, printed after, is the only thing on stdout
