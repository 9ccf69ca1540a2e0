"""A dry run as a process, against a real Prometheus and the API emulator: it plans the lends a
run would make, audits each one once however many ticks pass, says "would" in its log and its
outcomes, shows its plan in ``/api/v1/explain``, and sends the cluster no write at all (the
emulator's request log)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rebalancer.core.audit import Kind
from rebalancer.core.outcomes import Outcome
from sandbox.emulator.server import Request
from tests.support.harness import LOW, POOL, Harness, harness
from tests.support.waits import until


async def would_apply(h: Harness) -> bool:
    return any(r.outcome is Outcome.WOULD_APPLY for r in await h.records())


async def test_a_dry_run_audits_each_step_once_and_writes_nothing(tmp_path: Path) -> None:
    seen: list[Request] = []
    async with harness(tmp_path, rps=LOW, on_request=seen.append) as h:
        async with h.controller(h.config(dry_run=True)) as c:
            await until("a step audited as would_apply", lambda: would_apply(h), c.proc, 30)
            first = await h.records()
            await asyncio.sleep(5)  # five more ticks of the same plan
            later = await h.records()
            url = f"{c.base}/api/v1/explain?pool={POOL}"
            async with c.session.get(url) as response:
                assert response.status == 200
                explained = await response.json()
        log = c.log.read_text()
        lent = await h.lent()

    intents = [r for r in later if r.kind is Kind.INTENT]
    outcomes = [r for r in later if r.kind is Kind.OUTCOME]
    assert intents, "the dry run planned lends"
    assert intents == [r for r in first if r.kind is Kind.INTENT]  # once, not every tick
    assert {r.outcome for r in outcomes} == {Outcome.WOULD_APPLY}
    assert all(r.message.startswith("would lend (lent): ") for r in outcomes)
    assert all(r.dry_run for r in intents + outcomes)
    assert {s["node"] for s in explained["steps"]} == {r.node for r in intents}
    assert "dry run, would plan: pool" in log
    assert lent == set()
    assert seen, "the emulator was asked"
    assert [(r.verb, r.resource) for r in seen if r.is_write] == []
