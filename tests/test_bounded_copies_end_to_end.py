"""A 200 KB override value on a node, against the controller PROCESS (the API emulator, a real
Prometheus, the SQLite audit store): what the process writes to its audit store and answers on
``/api/v1/decisions`` and ``/api/v1/explain`` stays bounded (docs/design/bounded-copies.md).
Before the bound, every ``bad_override`` row copied the value seven times, about 1.4 MB a row."""

from __future__ import annotations

import json
from pathlib import Path

from rebalancer.core import audit, bounded
from rebalancer.core.audit import Kind
from rebalancer.core.model import Reason
from tests.support.harness import INFERENCE, POOL, Harness, harness
from tests.support.waits import until

BIG = 200 * 1024
RECORD_BOUND = 8 * 1024  # bytes of one audit row, as JSON
ANSWER_BOUND = 64 * 1024  # bytes of an HTTP answer about the pool


async def refused(h: Harness) -> bool:
    return any(
        r.kind is Kind.FINDING and r.reason == Reason.BAD_OVERRIDE.value for r in await h.records()
    )


async def test_a_200_kb_override_value_leaves_every_row_and_answer_of_the_process_bounded(
    tmp_path: Path,
) -> None:
    value = "Mon-Fri " + "x" * (BIG - len("Mon-Fri "))
    async with harness(tmp_path) as h:
        await h.annotate(INFERENCE[-1], {"rebalancer.io/window": value})
        async with h.controller(h.config()) as c:
            await until("the override refused", lambda: refused(h), c.proc, 30)
            answers = {}
            for path in (
                f"/api/v1/explain?pool={POOL}",
                f"/api/v1/explain?node={INFERENCE[-1]}",
                "/api/v1/decisions?kind=finding&limit=1000",
            ):
                async with c.session.get(c.base + path) as r:
                    assert r.status == 200, await r.text()
                    answers[path] = await r.read()
        rows = [json.dumps(audit.to_json(r)) for r in await h.records()]

    assert max(len(row) for row in rows) <= RECORD_BOUND
    assert all(row.count(value[: bounded.KEPT]) <= 1 for row in rows)
    for path, body in answers.items():
        assert len(body) <= ANSWER_BOUND, (path, len(body))
