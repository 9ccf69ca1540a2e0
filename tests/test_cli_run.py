"""``rebalancer run``, ``reclaim`` and ``audit`` as processes, against the API emulator over HTTP.

The emulator is served in the test's event loop on the wall clock (the process under test reads
the wall clock too); the command runs as ``python -m rebalancer ...`` with a kubeconfig written by
``write_kubeconfig``, leader election off, Prometheus pointed at a closed port (metrics unknown:
nothing is lent) and the audit log in a temporary SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter
from rebalancer.cli import audit as audit_command
from rebalancer.core.nodestate import Phase
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from sandbox.emulator import cluster
from sandbox.emulator.store import Store
from tests.support.processes import config_text, node_state_keys, run_cli, setup, start

NODE = "inference-5"  # idle: no inference replica runs on it


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    # The API's certificate is self-signed: what is tested here is what it answers.
    connector = aiohttp.TCPConnector(ssl=False)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url, headers=headers) as response,
    ):
        return response.status, await response.json()


async def poll(
    url: str, within: float = 15.0, proc: asyncio.subprocess.Process | None = None
) -> Any:
    async with asyncio.timeout(within):
        while True:
            assert proc is None or proc.returncode is None, "the controller exited early"
            with contextlib.suppress(aiohttp.ClientError):
                status, body = await get(url)
                if status == 200:
                    return body
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("election", [False, True], ids=["no-election", "election"])
async def test_run_serves_healthz_and_stops_on_sigterm(tmp_path: Path, election: bool) -> None:
    async with setup(tmp_path, election) as box:
        proc = await start("run", "--config", str(box.config), "--kubeconfig", str(box.kubeconfig))
        try:
            base = f"https://127.0.0.1:{box.http_port}"
            probes = f"http://127.0.0.1:{box.health_port}"
            assert await poll(f"{probes}/healthz", proc=proc) == {"status": "ok"}
            ready = await poll(f"{probes}/readyz", proc=proc)
            assert ready["ready"] is True
            # At least one tick has been audited (a summary: metrics unknown, nothing lent).
            page = await poll(f"{base}/api/v1/decisions?kind=summary", proc=proc)
            async with asyncio.timeout(15):
                while not page["items"]:
                    await asyncio.sleep(0.2)
                    page = await poll(f"{base}/api/v1/decisions?kind=summary", proc=proc)
            # The loop's last tick, explained: the same document as rebalancer explain --json.
            explained = await poll(f"{base}/api/v1/explain?node={NODE}", proc=proc)
            assert (explained["node"], explained["phase"]) == (NODE, "serving")
            verdicts = {c["rule"]: c["verdict"] for c in explained["rules"]["checks"]}
            assert verdicts["metrics_stale"] == "refuses"  # Prometheus is not there
            assert (await get(f"{base}/api/v1/explain?node=nope"))[0] == 404
            assert (await get(f"{base}/api/v1/explain"))[0] == 400
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        if election:  # the lease was taken, then released on the way out
            lease = await client.CoordinationV1Api(box.api).read_namespaced_lease(
                "rebalancer", "default"
            )
            assert not lease.spec.holder_identity
        errors = err.decode()
        assert "Traceback" not in errors
        lines = [json.loads(line) for line in errors.splitlines() if line.strip()]
        assert lines
        assert all({"time", "level", "logger", "message"} <= set(d) for d in lines)
        assert any(d["message"] == "stopped" for d in lines)
        # The open API is said at start, loudly and exactly.
        (opened,) = [d for d in lines if "http.authentication is none" in d["message"]]
        assert opened["level"] == "warning"
        assert "post to /api/v1/alertmanager" in opened["message"]
        # Nothing from APScheduler at INFO (two lines a tick), and each metrics failure once.
        assert not [d for d in lines if d["logger"].startswith("apscheduler")]
        ticks = sum(1 for d in lines if d["message"].startswith("plan: pool inference"))
        failures = [d for d in lines if d["message"].startswith("pool inference: demand, queue")]
        assert 0 < len(failures) <= ticks
        # Metrics unknown: no node was lent.
        core = client.CoreV1Api(box.api)
        listed = await core.list_node(label_selector="rebalancer.io/state")
        assert listed.items == []
        assert out.decode().strip(), "the audit JSON lines go to stdout"


async def test_run_is_closed_by_default(tmp_path: Path) -> None:
    """The settings' default authentication on a cluster that knows no token (the emulator
    served without tokens answers every TokenReview "not authenticated"): no token and a
    token are both 401 on every route, and the probes answer on their own port all the same."""
    async with setup(tmp_path) as box:
        config = tmp_path / "closed.yaml"
        text = config_text(box.audit_db, box.http_port, health_port=box.health_port)
        config.write_text(text.replace("authentication: none", "authentication: kubernetes"))
        proc = await start("run", "--config", str(config), "--kubeconfig", str(box.kubeconfig))
        try:
            ready = await poll(f"http://127.0.0.1:{box.health_port}/readyz", proc=proc)
            assert ready["ready"] is True
            base = f"https://127.0.0.1:{box.http_port}"
            for path in ("/metrics", "/api/v1/decisions", "/api/v1/explain?node=x"):
                assert (await get(base + path))[0] == 401, path
                status, body = await get(base + path, {"Authorization": "Bearer some-token"})
                assert (status, body["error"]) == (401, "unauthorized"), path
                assert body["message"] == "invalid bearer token"  # the cluster's words
        finally:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                _, err = await proc.communicate()
        assert "some-token" not in err.decode()
        assert "http.authentication is none" not in err.decode()


async def test_bad_config_exits_2_one_line_per_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "tick_interval: -5s\n"
        "http: {port: 0}\n"
        "pools:\n"
        "  - {name: BAD, node_selector: {gpu-pool: inference}, rps_per_node: 1}\n",
        encoding="utf-8",
    )
    expected = []
    try:
        settings_mod.load(bad, env={})
    except settings_mod.InvalidSettings as exc:
        expected = exc.lines
    assert len(expected) == 3
    code, _out, err = await run_cli("run", "--config", str(bad))
    assert code == 2
    assert "Traceback" not in err
    assert err.splitlines() == [f"rebalancer: {line}" for line in expected]


async def test_reclaim_node_restores_it_and_audits(tmp_path: Path) -> None:
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={})
        (pool,) = wiring.pool_configs(config)
        core = client.CoreV1Api(box.api)
        writer = KubeWriter(core)
        before = await writer.get_node(NODE)
        actuator = Actuator(
            writer, wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now
        )
        lent = await actuator.lend(NODE, "test-lend")
        assert lent.outcome is Outcome.APPLIED, lent.message
        mid = await core.read_node(NODE)
        assert mid.metadata.labels[config.keys().state] == Phase.LENT.value

        code, out, err = await run_cli(
            "reclaim",
            "--node",
            NODE,
            "--config",
            str(box.config),
            "--kubeconfig",
            str(box.kubeconfig),
        )
        assert code == 0, err
        lines = out.splitlines()
        assert re.fullmatch(rf"{NODE} serving-tainted \d+\.\ds", lines[0]), out
        assert re.fullmatch(rf"{NODE} back \d+\.\ds \(reclaimed: serving again\)", lines[1]), out
        assert lines[2].startswith("1 node: 1 back, 0 not back; last serving taint "), out
        assert len(lines) == 3, out

        after = await writer.get_node(NODE)
        assert json.dumps(after["spec"], sort_keys=True) == json.dumps(
            before["spec"], sort_keys=True
        )
        assert after["metadata"]["labels"] == before["metadata"]["labels"]
        prefix = config.key_prefix
        kept = {
            k: v
            for k, v in (after["metadata"].get("annotations") or {}).items()
            if not k.startswith(prefix)
        }
        assert kept == (before["metadata"].get("annotations") or {})

        found = await client.EventsV1Api(box.api).list_namespaced_event("default")
        reasons = sorted(e.reason for e in found.items if e.regarding.name == NODE)
        assert reasons == ["Reclaiming", "Restored"]

        code, out, err = await run_cli("audit", "--json", "--config", str(box.config))
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        intents = [r for r in rows if r["kind"] == "intent"]
        outcomes = [r for r in rows if r["kind"] == "outcome"]
        assert len(intents) == 1, rows
        assert len(outcomes) == 1, rows
        (intent,), (outcome,) = intents, outcomes
        assert intent["origin"] == "operator"
        assert intent["action"] == "reclaim"
        assert intent["node"] == NODE
        assert intent["reason"] == "operator_reclaim_now"
        assert outcome["intent_id"] == intent["id"]
        assert outcome["outcome"] == "applied"

        code, table, err = await run_cli("audit", "--node", NODE, "--config", str(box.config))
        assert code == 0, err
        assert table.splitlines()[0].split() == list(audit_command.COLUMNS)
        assert len(table.splitlines()) == 3


async def test_reclaim_all_and_a_node_that_cannot_be_restored(tmp_path: Path) -> None:
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={})
        (pool,) = wiring.pool_configs(config)
        writer = KubeWriter(client.CoreV1Api(box.api))
        actuator = Actuator(
            writer, wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now
        )
        for node in ("inference-6", "inference-7"):
            assert (await actuator.lend(node, "test-lend")).outcome is Outcome.APPLIED
        args = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))

        code, out, err = await run_cli("reclaim", "--all", *args)
        assert code == 0, err
        assert sorted(line.split()[:2] for line in out.splitlines()[:4]) == [
            ["inference-6", "back"],
            ["inference-6", "serving-tainted"],
            ["inference-7", "back"],
            ["inference-7", "serving-tainted"],
        ]
        code, out, err = await run_cli("reclaim", "--all", *args)
        assert (code, out) == (0, "no node is lent\n")
        code, out, err = await run_cli("reclaim", "--all", "-o", "json", *args)
        assert (code, [json.loads(line) for line in out.splitlines()]) == (
            0,
            [
                {
                    "summary": {
                        "nodes": 0,
                        "back": 0,
                        "not_back": 0,
                        "exit": 0,
                        "line": "no node is lent",
                    }
                }
            ],
        )

        code, out, err = await run_cli("reclaim", "--node", "no-such-node", *args)
        assert code == 1
        lines = out.splitlines()
        assert re.fullmatch(r"no-such-node failed \d+\.\ds: cannot read the node: .*", lines[0])
        assert lines[1] == "1 node: 0 back, 1 not back; last serving taint -, last node back -"
        assert lines[2].startswith("not back: no-such-node: error: cannot read the node")
        assert lines[3] == "exit 1: 1 node(s) not back"
        assert "Traceback" not in err

        # -o yaml: the documents alone on stdout; the node's event on stderr
        code, out, err = await run_cli("reclaim", "--node", "no-such-node", "-o", "yaml", *args)
        node, summary = yaml.safe_load_all(out)
        assert code == 1
        assert (node["node"], node["back"], node["outcome"]) == ("no-such-node", False, "error")
        assert summary["summary"]["exit"] == 1
        said = r"no-such-node failed \d+\.\ds: cannot read the node: .*"
        assert [line for line in err.splitlines() if re.fullmatch(said, line)], err


def train_on(store: Store, node: str, pods: int, grace: int) -> None:
    """``pods`` training workers bound to ``node``, each taking ``grace`` s to terminate."""
    for index in range(pods):
        pod = cluster.training_pod(f"job-{node}", index, gpus=1, priority_class=None)
        pod["spec"]["nodeName"] = node
        pod["spec"]["terminationGracePeriodSeconds"] = grace
        cluster.add(store, pod)


async def test_reclaim_all_taints_every_node_before_any_drain_ends_then_drains_them_together(
    tmp_path: Path,
) -> None:
    lent = [f"inference-{i}" for i in range(2, 8)]
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={})
        (pool,) = wiring.pool_configs(config)
        writer = KubeWriter(client.CoreV1Api(box.api))
        actuator = Actuator(
            writer, wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now
        )
        for node in lent:
            assert (await actuator.lend(node, "test-lend")).outcome is Outcome.APPLIED
            train_on(box.store, node, pods=2, grace=3)  # evicted pods linger 3 s (wall clock)
        args = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))

        code, out, err = await run_cli("reclaim", "--all", "--concurrency", "4", *args)
        assert code == 0, err
        lines = out.splitlines()
        stages = [line.split()[1] for line in lines[:12]]
        assert stages == ["serving-tainted"] * 6 + ["back"] * 6, out
        assert sorted(line.split()[0] for line in lines[:6]) == lent
        for line in lines[6:12]:
            assert line.endswith(" (2 pods evicted)"), line
        # Together: each drain takes about 3 s; one after another they would take 18 s.
        last_back = max(float(line.split()[2].rstrip("s")) for line in lines[6:12])
        assert last_back < 12.0, out
        assert lines[12].startswith("6 nodes: 6 back, 0 not back; last serving taint "), out
        assert len(lines) == 13, out

        code, out, err = await run_cli(
            "audit", "--json", "--oldest-first", "--limit", "1000", *args[:2]
        )
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        intents = [r for r in rows if r["kind"] == "intent" and r["origin"] == "operator"]
        assert sorted(r["node"] for r in intents) == lent
        for intent in intents:
            outcomes = [r for r in rows if r.get("intent_id") == intent["id"]]
            calls = [r["detail"]["call"] for r in outcomes]
            assert calls == ["reclaim", "progress"], outcomes


async def test_reclaim_pool_brings_back_a_node_whose_since_is_garbled_with_the_others(
    tmp_path: Path,
) -> None:
    lent = ["inference-2", "inference-3", "inference-4"]
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={})
        (pool,) = wiring.pool_configs(config)
        core = client.CoreV1Api(box.api)
        actuator = Actuator(
            KubeWriter(core), wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now
        )
        for node in lent:
            assert (await actuator.lend(node, "test-lend")).outcome is Outcome.APPLIED
            train_on(box.store, node, pods=1, grace=1)
        # Another writer garbled a time of ours: the original still says what it served with.
        broken = {"metadata": {"annotations": {config.keys().since: "yesterday"}}}
        await core.patch_node("inference-3", broken)
        args = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))

        code, out, err = await run_cli("reclaim", "--pool", "inference", *args)
        assert code == 0, err
        assert "Traceback" not in err
        lines = out.splitlines()
        for node in lent:
            assert any(re.fullmatch(rf"{node} back .* \(1 pod evicted\)", ln) for ln in lines), out
        assert "3 nodes: 3 back, 0 not back; last serving taint " in out


async def test_a_config_with_no_pool_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("pools: []\n", encoding="utf-8")

    code, _out, err = await run_cli("run", "--config", str(empty))

    assert code == 2
    assert err.splitlines() == [
        "rebalancer: pools=[]: the settings name no pool, so the controller would have nothing "
        "to watch or lend; add one (docs/configuration.md)"
    ]


UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


async def test_an_audit_store_that_cannot_be_made_and_a_port_in_use_are_one_line_each(
    tmp_path: Path,
) -> None:
    """Each fails before the controller touches the cluster (none answers at that address)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG, encoding="utf-8")
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    pool = (
        f"node_state_keys: {node_state_keys(tmp_path)}\n"
        "pools: [{name: a, node_selector: {gpu-pool: a}, rps_per_node: 10}]\n"
    )
    no_dir = tmp_path / "no-dir.yaml"
    no_dir.write_text(
        f"audit: {{url: 'sqlite+aiosqlite:///{tmp_path}/a-file/audit.db'}}\n{pool}",
        encoding="utf-8",
    )
    taken = tmp_path / "taken.yaml"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken.write_text(
            f"audit: {{url: 'sqlite+aiosqlite:///{tmp_path}/audit.db'}}\n"
            f"http: {{host: 127.0.0.1, port: {port}}}\n{pool}",
            encoding="utf-8",
        )
        port_code, _, port_err = await run_cli(
            "run", "--config", str(taken), "--kubeconfig", str(kubeconfig)
        )
    dir_code, _, dir_err = await run_cli(
        "run", "--config", str(no_dir), "--kubeconfig", str(kubeconfig)
    )

    assert (dir_code, port_code) == (2, 2)
    assert len(dir_err.splitlines()) == 1
    assert dir_err.startswith("rebalancer: audit.url='sqlite+aiosqlite:///")
    assert "cannot open the audit store" in dir_err
    assert port_err.splitlines() == [
        f"rebalancer: http.host='127.0.0.1', http.port={port}: "
        f"error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
    ]


async def test_a_kubeconfig_that_is_not_one_is_one_line_naming_its_path(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"audit: {{url: 'sqlite+aiosqlite:///{tmp_path}/audit.db'}}\n"
        "pools: [{name: a, node_selector: {gpu-pool: a}, rps_per_node: 10}]\n",
        encoding="utf-8",
    )
    garbage = tmp_path / "garbage"
    garbage.write_bytes(bytes(range(128, 256)) * 4)
    no_clusters = tmp_path / "no-clusters"
    no_clusters.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\n", encoding="utf-8")
    text = tmp_path / "text"
    text.write_text("just some words\n", encoding="utf-8")
    missing = tmp_path / "missing"
    how = "give a file with clusters, users and contexts, as kubectl writes it"
    why = {
        garbage: f"not a kubeconfig (not UTF-8 text); {how}",
        no_clusters: f"not a kubeconfig (no list of clusters); {how}",
        text: f"not a kubeconfig (a YAML string, not a mapping); {how}",
        missing: "does not exist",
    }
    expected = {k: f"cannot configure the Kubernetes client from {k}: {w}" for k, w in why.items()}

    runs = await asyncio.gather(
        *(run_cli("run", "--config", str(config), "--kubeconfig", str(k)) for k in expected)
    )

    for (code, _out, err), line in zip(runs, expected.values(), strict=True):
        assert (code, err.splitlines()) == (2, [f"rebalancer: {line}"])


async def test_an_audit_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG, encoding="utf-8")
    config = tmp_path / "config.yaml"
    # Not even root may make a directory in /proc.
    url = "sqlite+aiosqlite:////proc/rebalancer-test/audit.db"
    config.write_text(
        f"audit: {{url: '{url}'}}\n"
        "pools: [{name: a, node_selector: {gpu-pool: a}, rps_per_node: 10}]\n",
        encoding="utf-8",
    )

    code, _out, err = await run_cli("run", "--config", str(config), "--kubeconfig", str(kubeconfig))

    assert code == 2
    assert err.splitlines() == [
        f"rebalancer: audit.url='{url}': cannot open the audit store: [Errno 2] No such file or "
        "directory: '/proc/rebalancer-test'"
    ]
