"""``rebalancer explain`` as a process against the API emulator over HTTP: read-only (the
emulator's request log holds no write), one line per refusal of the command itself.

Prometheus is pointed at a closed port, as in ``test_cli_run``: demand is unknown, so nothing may
be lent, and an operator's ``lend=now`` is refused for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes_asyncio import client

from rebalancer.core.nodestate import Keys
from sandbox.emulator.server import Request
from tests.support.processes import Setup, run_cli, setup

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

        assert not box.audit_db.exists()  # no error budget to read: no store opened, or made
        code, out, err = await explain(box, "gpu-nowhere")
        assert (code, out) == (2, "")
        assert err.strip().splitlines()[-1] == (
            "rebalancer: node='gpu-nowhere': no configured pool selects it, or it does not exist "
            "(pools: inference)"
        )

    assert seen, "the emulator was asked"
    assert [(r.verb, r.resource) for r in seen if r.is_write] == []
