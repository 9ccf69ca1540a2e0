"""``rebalancer explain`` as a process against the API emulator over HTTP: read-only (the
emulator's request log holds no write), one line per refusal of the command itself.

Prometheus is pointed at a closed port, as in ``test_cli_run``: demand is unknown, so nothing may
be lent, and an operator's ``lend=now`` is refused for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from rebalancer import settings
from rebalancer.adapters.audit import MemoryAuditStore, SqlAuditStore
from rebalancer.cli import common
from rebalancer.core.nodestate import Keys
from sandbox.emulator.server import Request
from tests.support.processes import Setup, free_port, run_cli, setup

KEYS = Keys()


async def explain(box: Setup, *args: str) -> tuple[int, str, str]:
    files = ("--config", str(box.config), "--kubeconfig", str(box.kubeconfig))
    return await run_cli("explain", *args, *files, within=60)


async def annotate(box: Setup, node: str, **values: str) -> None:
    body = {"metadata": {"annotations": {getattr(KEYS, k): v for k, v in values.items()}}}
    await client.CoreV1Api(box.api).patch_node(node, body)


async def test_explain_reads_and_never_writes(tmp_path: Path) -> None:
    seen: list[Request] = []
    async with setup(tmp_path, on_request=seen.append) as box:
        await annotate(box, "inference-6", lend="now")
        await annotate(box, "inference-7", paused="yes")
        seen.clear()

        code, out, err = await explain(box, "inference-5")
        assert code == 0, err
        # The pool has the default error budget, and the audit store it would be read from does
        # not exist: explain does not make it, and says so.
        assert (
            f"rebalancer: audit.url names {box.audit_db}, which does not exist here: the error "
            "budgets are read as unspent"
        ) in err.splitlines()
        lines = out.splitlines()
        assert lines[0].startswith(
            "node inference-5 (pool inference): serving; next tick: nothing, it stays serving: "
        )
        assert "  pods: none; Ready" in lines
        assert "  demand: unknown (no sample)" in lines
        assert any(line.startswith("    refuses  metrics_stale: ") for line in lines)

        code, out, _ = await explain(box, "inference-6")
        assert code == 0
        assert out.splitlines()[0].startswith(
            "node inference-6 (pool inference): serving; next tick: operator lend refused "
            "(metrics_stale: no lending while demand is unknown"
        )

        code, out, _ = await explain(box, "inference-7", "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["override_problems"] == [
            f"{KEYS.paused}='yes' is ignored: must be true or false"
        ]
        assert doc["rules"]["checks"][1] == {
            "rule": "bad_override",
            "verdict": "refuses",
            "note": "with an override that cannot be read",
        }

        code, out, _ = await explain(box, "--pool", "inference")
        assert code == 0
        assert out.splitlines()[0].startswith("pool inference: 8 serving; need unknown;")

        assert not box.audit_db.exists()  # no store to read the budget from: none made
        code, out, err = await explain(box, "gpu-nowhere")
        assert (code, out) == (2, "")
        assert err.strip().splitlines()[-1] == (
            "rebalancer: node='gpu-nowhere': no configured pool selects it, or it does not exist "
            "(pools: inference)"
        )

    assert seen, "the emulator was asked"
    assert [(r.verb, r.resource) for r in seen if r.is_write] == []


# ---------------------------------------------------------------------------------------------
# Where explain reads the error budgets' minutes from (``cli.common.budget_store``)


def configured(url: str, slo: object = "absent") -> settings.Settings:
    pool = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 10}
    if slo != "absent":
        pool["slo"] = slo
    return settings.Settings.model_validate({"audit": {"url": url}, "pools": [pool]})


async def test_explain_reads_no_store_when_no_pool_has_a_budget(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite3"
    store, note = await common.budget_store(configured(f"sqlite+aiosqlite:///{db}", "none"))
    assert (type(store), note) == (MemoryAuditStore, None)
    assert not db.exists()


async def test_explain_makes_no_store_to_read_a_default_budget_from(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite3"
    store, note = await common.budget_store(configured(f"sqlite+aiosqlite:///{db}"))
    assert isinstance(store, MemoryAuditStore)
    assert note == (
        f"audit.url names {db}, which does not exist here: the error budgets are read as unspent"
    )
    assert not db.exists()


async def test_explain_reads_the_budgets_from_a_store_that_is_there(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.sqlite3'}"
    await (await SqlAuditStore.open(url)).close()
    store, note = await common.budget_store(configured(url))
    try:
        assert (type(store), note) == (SqlAuditStore, None)
    finally:
        await store.close()


@pytest.mark.parametrize("slo", [{"max_breach_minutes": 30}, "absent"])
async def test_explain_answers_without_the_budgets_when_the_store_cannot_be_opened(
    slo: object,
) -> None:
    url = f"postgresql+asyncpg://rebalancer@127.0.0.1:{free_port()}/audit"  # nothing listens
    store, note = await common.budget_store(configured(url, slo))
    assert isinstance(store, MemoryAuditStore)
    assert note is not None
    assert note.startswith("audit.url='postgresql+asyncpg://rebalancer@127.0.0.1:")
    assert ": cannot open the audit store: " in note
    assert note.endswith("; the error budgets are read as unspent")
