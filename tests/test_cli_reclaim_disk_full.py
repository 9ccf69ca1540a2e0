"""``rebalancer reclaim`` as a process, its audit store on a file system with no room left: the
runbook's fallback for a controller that cannot record still gives inference its nodes back,
each record kept on its node first (docs/design/audit-failure.md; that the controller then
writes what the nodes keep to the store, once it has room, is tests/runtime/test_audit_failure.py).

The store is a SQLite file on a 4 MiB tmpfs mounted for the test (the suite runs as root, as CI
does) and filled with a file of zeros once the store exists, as a full volume is. The cluster is
the API emulator over HTTP, with two nodes lent by the real actuator first.
"""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.adapters import ledger
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import SqlAuditStore
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from tests.support.audit_disk import fill, small_disk
from tests.support.processes import config_text, free_port, run_cli, setup

KEYS = Keys()
LENT = ("inference-5", "inference-6")


async def test_reclaim_with_the_audit_disk_full_takes_the_nodes_back_recorded_on_them(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        url = f"sqlite+aiosqlite:///{disk / 'audit.sqlite3'}"
        await (await SqlAuditStore.open(url)).close()  # the controller made it long ago
        async with setup(tmp_path) as box:
            config_path = tmp_path / "full.yaml"
            config_path.write_text(config_text(disk / "audit.sqlite3", free_port()))
            config = settings_mod.load(config_path, env={})
            (pool,) = wiring.pool_configs(config)
            writer = KubeWriter(client.CoreV1Api(box.api))
            actuator = Actuator(writer, KEYS, pool.lend_spec, pool.marks, wiring.utc_now)
            for name in LENT:
                assert (await actuator.lend(name, "test-lend")).outcome is Outcome.APPLIED
            filler = fill(disk)

            files = ("--config", str(config_path), "--kubeconfig", str(box.kubeconfig))
            code, out, err = await run_cli("reclaim", "--node", LENT[0], "--node", LENT[1], *files)

            assert code == 0, err
            assert "Traceback" not in err
            # One line says the store cannot be opened, and where the records are instead.
            assert "cannot open the audit store: disk I/O error; each record is kept on its " in err
            assert "(annotation rebalancer.io/audit-pending)" in out
            for name in LENT:
                node = await client.CoreV1Api(box.api).read_node(name)
                assert KEYS.state not in (node.metadata.labels or {})  # serving again
                kept = json.loads(node.metadata.annotations[ledger.annotation(KEYS)])
                assert kept[0]["kind"] == "intent"
                assert kept[0]["action"] == "reclaim"
                assert kept[0]["id"] == node.metadata.annotations[KEYS.decision]
                assert kept[-1]["outcome"] == "applied"
            filler.unlink()
