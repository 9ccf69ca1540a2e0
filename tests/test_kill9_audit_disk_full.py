"""No record lost, on the process: ``rebalancer run`` with its audit store on a full disk takes
the lent nodes back for inference, another writer removes the records kept on the nodes, the
process is killed with SIGKILL, and the next one, with room on the disk, writes every intent to
the store, in order and under its id, and closes each (docs/design/audit-failure.md).

The cluster, Prometheus and the exporter are the process tests' harness
(``tests.support.harness``: the emulator, one pool of 8 nodes, 6 of them idle); the store is a
SQLite file on a 4 MiB tmpfs filled with a file of zeros once the nodes are lent (the suite runs
as root, as CI does). The other writer is a merge patch that removes
``rebalancer.io/audit-pending``, as a GitOps sync that owns the Node's annotations does.
"""

from __future__ import annotations

from pathlib import Path

from rebalancer.adapters import ledger
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.nodestate import Keys
from tests.support.audit_disk import fill, small_disk
from tests.support.harness import IDLE, LOW, PEAK, harness
from tests.support.processes import read_audit
from tests.support.waits import until

KEYS = Keys()
PENDING = ledger.annotation(KEYS)


async def test_a_killed_process_loses_no_reclaim_made_on_a_full_disk_whose_node_records_went(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        url = f"sqlite+aiosqlite:///{disk / 'audit.sqlite3'}"
        async with harness(tmp_path, rps=LOW) as h:
            config = h.config(audit={"url": url})
            c = await h.spawn(config)
            await h.wait_lent(c, set(IDLE))
            filler = fill(disk)
            h.exporter.set_load(PEAK, 0)  # demand needs every node

            kept: dict[str, AuditRecord] = {}

            async def all_kept() -> bool:
                nodes = await h.nodes()
                for name in IDLE:
                    meta = nodes[name]["metadata"]
                    found = ledger.pending(meta.get("annotations") or {}, KEYS)
                    intents = [r for r in found if r.kind is Kind.INTENT]
                    if intents:
                        kept[name] = intents[0]
                return set(kept) == set(IDLE)

            await until("the reclaims kept on the nodes", all_kept, c.proc, 30)
            assert {r.reason for r in kept.values()} == {"demand_above_serving"}
            # A GitOps sync removes what it does not own; then the process dies.
            for name in IDLE:
                await h.annotate(name, {PENDING: None})
            await h.kill(c)
            assert {r.id for r in await read_audit(url)}.isdisjoint(r.id for r in kept.values())

            filler.unlink()  # room on the disk again; a new process starts
            async with h.controller(config) as again:

                async def every_intent_closed() -> bool:
                    stored = await read_audit(url)
                    closed = {r.intent_id for r in stored if r.kind is Kind.OUTCOME}
                    return all(r.id in closed for r in kept.values())

                await until("every intent stored and closed", every_intent_closed, again.proc, 30)
            stored = await read_audit(url)

    order = [r.id for r in stored]
    intents = sorted(kept.values(), key=lambda r: (r.time, r.id))
    at = [order.index(r.id) for r in intents]
    assert at == sorted(at), "the intents are in the store in the order they were made"
    by_id = {r.id: r for r in stored}
    for intent in intents:
        assert by_id[intent.id].kind is Kind.INTENT
        assert by_id[intent.id].node == intent.node
        closing = [r for r in stored if r.intent_id == intent.id]
        assert all(order.index(r.id) > order.index(intent.id) for r in closing)
        assert any("controller restarted" in r.message for r in closing), closing
    ids = {r.id for r in intents}
    verdicts = sorted({str(r.outcome) for r in stored if r.intent_id in ids})
    print(
        f"\naudit disk full, records removed from the nodes, kill -9: {len(intents)} "
        f"demand_above_serving reclaims, all {len(intents)} intents in the store after the "
        f"restart, in the order made, closed as {verdicts}"
    )
