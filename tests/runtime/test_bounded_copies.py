"""An outside value copied into the audit log and ``explain`` is bounded: a 200 KB override value
on a node, through the Reconciler on the API emulator (the real informer, actuator and audit
log), makes records and answers of a few kilobytes (docs/design/bounded-copies.md).

Before the bound the ``bad_override`` record carried the value seven times (three in
``message``, three in ``inputs``, one in ``detail``): 1,434,927 bytes; ``explain`` answered
821,702 bytes for the pool. The state keys of a lent node made records of 410 KB to 616 KB."""

from __future__ import annotations

import json

import pytest

from rebalancer.core import audit, bounded
from rebalancer.core.audit import Kind
from rebalancer.runtime import explaining
from tests.support.objects import annotate
from tests.support.pools import IDLE, KEYS, POOL
from tests.support.reconciling import world

BIG = 200 * 1024  # bytes of the override value
RECORD_BOUND = 8 * 1024  # bytes of any audit record of the node, as JSON
ANSWER_BOUND = 64 * 1024  # bytes of explain's answer for the pool, as JSON


async def test_a_200_kb_override_value_is_copied_cut_once_into_each_record_and_answer() -> None:
    value = "Mon-Fri " + "x" * (BIG - len("Mon-Fri "))
    async with world() as w:
        node = IDLE[0]
        annotate(w.store, node, {KEYS.window: value})
        assert await w.reconciler.start() == ()
        await w.tick()

        rows = [audit.to_json(r) for r in w.audit.records if r.node == node]
        sizes = [len(json.dumps(row)) for row in rows]
        (finding,) = [
            r for r in rows if r["kind"] == Kind.FINDING and r["reason"] == "bad_override"
        ]
        assert max(sizes) <= RECORD_BOUND, sizes
        assert finding["detail"]["value"] == bounded.cut(value)
        text = json.dumps(finding)
        assert text.count(value[: bounded.KEPT]) == 1  # the value once, cut
        assert f"({BIG} bytes, sha256:" in finding["message"]

        decided = w.reconciler.last_decided
        assert decided is not None
        for answer in (
            explaining.answer(w.reconciler, *decided, pool=str(POOL)),
            explaining.answer(w.reconciler, *decided, node=node),
        ):
            assert len(json.dumps(answer)) <= ANSWER_BOUND
            assert json.dumps(answer).count(value[: bounded.KEPT]) <= 1


@pytest.mark.parametrize(
    "key",
    ["original", "since", "decision", "deadline", "lend", "reclaim", "paused", "override_until"],
)
async def test_any_annotation_of_the_controller_s_200_kb_long_on_a_lent_node_is_copied_cut(
    key: str,
) -> None:
    annotation = getattr(KEYS, key)
    value = "{" + "y" * (BIG - 1)
    async with world() as w:
        assert await w.reconciler.start() == ()
        await w.tick()  # low demand: the idle nodes are lent
        node = IDLE[0]
        annotate(w.store, node, {annotation: value})
        before = len(w.audit.records)
        await w.tick()

        rows = [audit.to_json(r) for r in w.audit.records[before:]]
        assert rows, "the tick wrote what it saw"
        sizes = [len(json.dumps(row)) for row in rows]
        assert max(sizes) <= RECORD_BOUND, sizes
        assert all(json.dumps(row).count(value[: bounded.KEPT]) <= 1 for row in rows)
        decided = w.reconciler.last_decided
        assert decided is not None
        answer = json.dumps(explaining.answer(w.reconciler, *decided, pool=str(POOL)))
        assert len(answer) <= ANSWER_BOUND
