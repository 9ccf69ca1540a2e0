"""``rebalancer demo``: the real controller against the emulator on a replayed trace.

One short run (4 hours of the bundled Azure ``code`` and ``conv`` traces from 10:00 UTC, when
load is low and then rises, as fast as it runs) is shared by the tests below: it must lend at
low load, take nodes back as load rises, lend only for jobs that can use the GPU, never leave a
gang half-running, put every node back byte for byte, write demo.json and its picture, print a
short summary in lines of a terminal's width, and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rebalancer.adapters import registry
from sandbox import demo, refusals
from sandbox.sim import traces

ARGS = ["--hours", "4", "--start", "10", "--pace", "0"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("demo")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = demo.main([*ARGS, "--report", str(out)])
    doc = json.loads((out / "demo.json").read_text())
    doc["svg"] = (out / "day.svg").read_text()
    return code, text.getvalue(), doc


def _time(record: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(record["time"]).replace("Z", "+00:00"))


def test_defaults_are_the_documented_ones() -> None:
    opts = demo.parse([])
    assert opts.trace == demo.DEFAULT_TRACE
    assert opts.trace.is_file()
    assert (opts.service, opts.t4_service) == ("code", "conv")
    assert (opts.hours, opts.start, opts.speed) == (24.0, 0.0, 1)
    assert opts.strategy == registry.DEFAULT
    assert opts.report is None
    assert not opts.verbose
    assert not opts.keep
    assert opts.pace == 0  # quiet runs flat out; -v paces a day to a minute, to be watched
    assert demo.parse(["-v"]).pace == demo.DEFAULT_PACE
    assert demo.parse(["-v", "--pace", "600"]).pace == 600


def test_short_run_exits_zero_and_prints_its_summary(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    code, text, _ = short_run
    assert code == 0
    for label in (
        "GPU-hours lent",
        "GPU-hours used",
        "refused, no taker",
        "jobs preempted",
        "GPU-hours lost",
        "gangs half-running  0 ",
        "jobs on a wrong GPU 0 pods",
        "loans, reclaims",
        "breach minutes",
        "audit rows",
        "nodes restored      yes",
    ):
        assert label in text, label


def test_quiet_by_default_a_screen_of_lines_no_wider_than_a_terminal(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    """No decision, no kubectl hint for a cluster that is gone by the time it is read: the
    pools, a line per quarter of the replay, the summary, where the report went."""
    _, text, _ = short_run
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert max(map(len, lines)) <= refusals.WIDTH, max(lines, key=len)
    assert "kubectl" not in text.replace("--keep serves the cluster to kubectl", "")
    assert not any(" lend " in line for line in lines)
    summary = lines[lines.index("summary") :]
    assert len(summary) < 30, summary


def test_refusals_are_one_line_per_pool_and_reason_with_their_count(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    _, text, doc = short_run
    grouped = re.findall(r"^    (\w+) +(\d+) ticks, (\d+) nodes in all: (.+)$", text, re.MULTILINE)
    assert grouped, text
    for name, pool in doc["summary"]["pools"].items():
        mine = [(int(n), int(nodes)) for p, n, nodes, _ in grouped if p == name]
        assert sum(n for n, _ in mine) == pool["no_taker_refusals"], name
        assert sum(nodes for _, nodes in mine) == pool["no_taker_nodes"], name
    reasons = [(p, why.split(";")[0]) for p, _, _, why in grouped]
    assert len(reasons) == len(set(reasons))
    assert any("waiting: " in why and " hopper" in why for *_, why in grouped)
    assert "(hopper: gpu.family In hopper" in text


def test_verbose_prints_every_decision_in_a_line_each(tmp_path: Path) -> None:
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = demo.main(["--hours", "1", "--start", "10", "--pace", "0", "-v"])
    assert code == 0
    lines = text.getvalue().splitlines()
    assert any(re.match(r"05-10 10:0\d l20 +l20-\d +lend +\[strategy\]", x) for x in lines)
    refused = [x for x in lines if " no taker " in x]
    assert refused
    assert all(len(x) <= refusals.WIDTH for x in refused), refused
    assert any(" reclaim all " in x for x in lines)
    assert any(" restored " in x for x in lines)
    assert "kubectl" not in text.getvalue().replace("--keep serves the cluster to kubectl", "")


def test_the_picture_draws_the_series_of_demo_json(
    short_run: tuple[int, str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """day.svg parses as XML, and each pool's demand (in nodes' worth), serving and lent lines
    have a point per minute of demo.json's series, placed by one scale for the panel; a mark
    per minute the controller took nodes back."""
    _, _, doc = short_run
    root = ET.fromstring(doc["svg"])
    ns = {"svg": "http://www.w3.org/2000/svg"}
    for pool, series in doc["series"].items():
        assert series["step_seconds"] == 60
        expected = {
            "demand": [v / series["rps_per_node"] for v in series["demand_rps"]],
            "serving": series["serving"],
            "lent": series["lent"],
        }
        scale: set[tuple[float, float]] = set()
        for name, values in expected.items():
            lines = root.findall(f".//svg:polyline[@data-pool='{pool}'][@data-series='{name}']", ns)
            points = [
                tuple(map(float, p.split(",")))
                for line in lines
                for p in line.get("points", "").split()
            ]
            assert len(points) == len(values) == doc["summary"]["minutes"], (pool, name)
            xs = [x for x, _ in points]
            assert xs == sorted(xs)
            assert len(set(xs)) == len(xs)
            # y = top - k * value for one k > 0 and top across the panel's lines
            lo, hi = (
                min(range(len(values)), key=values.__getitem__),
                max(range(len(values)), key=values.__getitem__),
            )
            k = (points[lo][1] - points[hi][1]) / (values[hi] - values[lo])
            top = points[lo][1] + k * values[lo]
            for (_, y), v in zip(points, values, strict=True):
                assert y == pytest.approx(top - k * v, abs=0.02), (pool, name, v)
            scale.add((round(k, 2), round(top, 1)))
        assert len(scale) == 1, (pool, scale)
        marks = root.findall(f".//svg:line[@data-pool='{pool}'][@data-series='reclaims']", ns)
        drawn = {int(m.get("data-minute", -1)): int(m.get("data-nodes", 0)) for m in marks}
        assert drawn == {i: n for i, n in enumerate(series["reclaims"]) if n}
    assert sum(sum(s["reclaims"]) for s in doc["series"].values()) == doc["summary"]["reclaims"]


def test_lends_at_low_load_and_reclaims_as_load_rises(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    _, _, doc = short_run
    records = doc["audit"]
    intents = [r for r in records if r["kind"] == "intent"]
    lends = [r for r in intents if r["action"] == "lend"]
    taken = [r for r in intents if r["action"] == "reclaim" and r["origin"] != "operator"]
    assert lends, "nothing was lent at low load"
    assert taken, "nothing was taken back as load rose"
    assert min(map(_time, lends)) < min(map(_time, taken))
    # The load the controller saw: the trace's last half hour before each decision.
    trace = traces.load(demo.DEFAULT_TRACE, "code")

    def load_before(when: datetime) -> float:
        end = (when - trace.start) // timedelta(minutes=1)
        values = [v for v in trace.rps[max(0, end - 30) : end] if v is not None]
        return sum(values) / len(values)

    first_lend = min(map(_time, lends))
    first_take = min(map(_time, taken))
    assert load_before(first_lend) < load_before(first_take)
    # Every lend and reclaim intent was closed by an applied outcome on the same node.
    outcomes = {r["intent_id"]: r for r in records if r["kind"] == "outcome"}
    for intent in intents:
        assert intent["id"] in outcomes, intent
        assert outcomes[intent["id"]]["node"] == intent["node"]
    applied = [r for r in records if r["kind"] == "outcome" and r["outcome"] == "applied"]
    assert {r["intent_id"] for r in applied} >= {r["id"] for r in lends}
    # At the end the operator took back every node still lent, through the same audited path.
    operator = [r for r in intents if r["origin"] == "operator"]
    assert operator
    assert all(r["reason"] == "operator_reclaim_now" for r in operator)
    summary = doc["summary"]
    assert summary["loans"] == len(lends)
    assert summary["reclaims"] + summary["operator_reclaims"] == len(taken) + len(operator)
    assert summary["audit_rows"] == len(records)
    assert summary["lent_gpu_hours"] > 0


def test_every_node_ends_exactly_as_it_started(short_run: tuple[int, str, dict[str, Any]]) -> None:
    _, _, doc = short_run
    assert [k for k in doc if k != "svg"] == list(demo.REPORT_KEYS)
    assert doc["summary"]["restored"] is True
    nodes = doc["nodes"]
    assert len(nodes) == 16
    lent = {r["node"] for r in doc["audit"] if r["kind"] == "intent" and r["action"] == "lend"}
    assert lent <= set(nodes)
    for name, entry in nodes.items():
        assert set(entry) == {"start", "end", "same"}
        assert set(entry["start"]) == {"labels", "taints"}
        assert entry["same"] is True, name
        assert json.dumps(entry["start"]) == json.dumps(entry["end"]), name
    for name in demo.BUSY:  # nodes running inference are never lent
        assert name not in lent


def test_a_missing_trace_is_an_error_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--trace", str(tmp_path / "none.csv")]) == 2
    assert "cannot read the trace" in capsys.readouterr().err


def test_no_gang_is_ever_half_running_and_no_pod_runs_on_a_gpu_it_refuses(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    _, _, doc = short_run
    summary = doc["summary"]
    assert summary["checks"] >= summary["minutes"]  # once a minute, and during the take-back
    assert summary["gangs_half_running"] == 0, summary["half_running_sightings"]
    assert summary["half_running_sightings"] == []
    assert summary["pods_on_wrong_gpu"] == 0
    # Reclaims did preempt jobs, so the gang check had something to look at.
    assert summary["jobs_preempted"] > 0
    assert summary["lost_gpu_hours"] > 0
    gang = [r for r in doc["audit"] if r["kind"] == "intent" and r["reason"] == "gang_preempted"]
    assert gang, "no reclaim took a gang's other node back: the check saw no multi-node gang"


def test_what_is_lent_is_used_by_training(short_run: tuple[int, str, dict[str, Any]]) -> None:
    _, _, doc = short_run
    summary = doc["summary"]
    assert summary["lent_gpu_hours"] > 0
    assert summary["used_gpu_hours"] <= summary["lent_gpu_hours"]
    assert summary["used_share"] >= 0.9
    for name, pool in summary["pools"].items():
        assert pool["lent_gpu_hours"] > 0, name  # both pools lent
    assert sum(p["lent_gpu_hours"] for p in summary["pools"].values()) == pytest.approx(
        summary["lent_gpu_hours"], abs=1e-3
    )


def test_each_pool_lends_only_for_jobs_that_can_use_its_gpu_and_hopper_jobs_get_nothing(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    _, _, doc = short_run
    lends = [r for r in doc["audit"] if r["kind"] == "intent" and r["action"] == "lend"]
    takers: dict[str, set[str]] = {r["pool"]: set() for r in lends}
    for r in lends:
        assert "; for job training/" in r["message"], r
        takers[r["pool"]].add(r["message"].rsplit("/", 1)[1].rsplit("-", 1)[0])
    assert takers == {"l20": {"48gb"}, "t4": {"turing"}}
    summary = doc["summary"]
    assert summary["no_taker_refusals"] > 0
    assert summary["jobs_completed"].get("hopper", 0) == 0
    refused = [r for r in doc["audit"] if r["kind"] == "refusal" and r["reason"] == "no_taker"]
    assert refused
    assert any("nvidia.com/gpu.family In ['hopper']" in r["message"] for r in refused)


def test_the_summary_sets_the_notice_beside_no_notice_on_the_same_day(
    short_run: tuple[int, str, dict[str, Any]],
) -> None:
    """The simulator's model of the run's day: each pool with the settings' reclaim notice and
    without, lending to jobs of the kind its GPU runs."""
    _, text, doc = short_run
    notice = doc["summary"]["notice"]
    assert (notice["modelled"], notice["seconds"]) == ("simulator", 300)
    assert set(notice["pools"]) == {"l20", "t4"}
    for name, pool in notice["pools"].items():
        told, plain = pool["with"], pool["without"]
        assert plain["notices"] == plain["withdrawals"] == plain["held_gpu_hours"] == 0, name
        assert told["lent_gpu_hours"] > 0, name
        for figures in (told, plain):
            kept = figures["lent_gpu_hours"] * figures["goodput"]
            assert figures["kept_gpu_hours"] == pytest.approx(kept, abs=0.01), name
    l20 = notice["pools"]["l20"]
    assert l20["with"]["notices"] > 0
    assert l20["with"]["lost_answering_gpu_hours"] < l20["without"]["lost_answering_gpu_hours"]
    assert "reclaim notice      the simulator on the same day" in text
    for name in ("l20", "t4"):
        assert re.search(rf"^    {name} +with 5 min +\d+\.\d GPU-h lost", text, re.MULTILINE)
        assert re.search(rf"^    {name} +without +\d+\.\d GPU-h lost", text, re.MULTILINE)


async def test_keep_serves_the_cluster_to_kubectl_until_interrupted(tmp_path: Path) -> None:
    """With --keep the hints name a server that still answers after the summary, until the
    demo is interrupted; then the demo ends with its summary."""
    out = io.StringIO()
    opts = demo.parse(["--hours", "0.25", "--start", "10", "--keep", "--report", str(tmp_path)])
    task = asyncio.create_task(demo.run(opts, out))
    async with asyncio.timeout(120):
        while "kubectl: serving" not in out.getvalue():
            assert not task.done(), out.getvalue()
            await asyncio.sleep(0.1)
    text = out.getvalue()
    url = re.search(r"kubectl: serving (http://127\.0\.0\.1:\d+) until Ctrl-C", text)
    assert url is not None, text
    kubeconfig = re.search(r"kubectl --kubeconfig (\S+) get nodes", text)
    assert kubeconfig is not None
    assert url.group(1) in Path(kubeconfig.group(1)).read_text()
    assert text.index("kubectl --kubeconfig") < text.index("summary")
    async with aiohttp.ClientSession() as http, http.get(f"{url.group(1)}/api/v1/nodes") as r:
        assert r.status == 200
        assert len((await r.json())["items"]) == 16
    task.cancel()
    summary = await task
    assert summary.exit_code == 0
    assert summary.restored
