"""What a restart makes of an intent a previous run left open: judged on the node it names."""

from __future__ import annotations

import dataclasses

import pytest

from rebalancer.core import model, recovery
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import Outcome
from tests.support.factories import (
    KEYS,
    T0,
    begin_reclaim,
    finish,
    lend,
    lending,
    rebuilt,
    serving,
)


def intent(action: str, ident: str) -> AuditRecord:
    return AuditRecord(
        id=ident,
        time=T0,
        kind=Kind.INTENT,
        pool="gpu",
        controller="rebalancer-a",
        reason="strategy",
        message="test",
        node="n",
        action=None if action is None else model.Action(action),
    )


LEND = intent("lend", "test-lend")  # the decision the factories write on a lend
RECLAIM = intent("reclaim", "test-reclaim")  # and on a reclaim


@pytest.mark.parametrize(
    ("record", "node", "result", "take_over"),
    [
        pytest.param(LEND, lend(serving("n")), Outcome.APPLIED, False, id="lend-done"),
        pytest.param(LEND, lending(serving("n")), Outcome.INTERRUPTED, True, id="lend-half"),
        pytest.param(LEND, finish(lending(serving("n"))), Outcome.REFUSED, False, id="lend-undone"),
        pytest.param(LEND, serving("n"), Outcome.SUPERSEDED, False, id="lend-never"),
        pytest.param(
            RECLAIM, begin_reclaim(lend(serving("n"))), Outcome.INTERRUPTED, True, id="reclaim-half"
        ),
        pytest.param(
            RECLAIM,
            finish(begin_reclaim(lend(serving("n")))),
            Outcome.APPLIED,
            False,
            id="reclaim-done",
        ),
        pytest.param(
            intent("rollback", "test-lend"),
            finish(lending(serving("n"))),
            Outcome.APPLIED,
            False,
            id="rollback-done",
        ),
        pytest.param(
            intent("rollback", "test-lend"),
            lending(serving("n")),
            Outcome.INTERRUPTED,
            True,
            id="rollback-half",
        ),
        # Lent under the lend's decision: the reclaim never reached the node.
        pytest.param(RECLAIM, lend(serving("n")), Outcome.SUPERSEDED, False, id="reclaim-never"),
    ],
)
def test_an_open_intent_is_closed_with_what_its_node_shows(
    record: AuditRecord, node: model.NodeView, result: Outcome, take_over: bool
) -> None:
    verdict = recovery.judge(record, node, KEYS)

    assert (verdict.result, verdict.take_over) == (result, take_over)


def test_an_intent_whose_node_is_gone_is_closed_as_gone() -> None:
    assert recovery.judge(LEND, None, KEYS).result is Outcome.GONE


def test_an_intent_whose_node_cannot_be_read_is_closed_as_failed_and_the_node_left_alone() -> None:
    node = lend(serving("n"))
    broken = rebuilt(node, annotations={**node.annotations, KEYS.original: "[]"})
    verdict = recovery.judge(LEND, broken, KEYS)

    assert (verdict.result, verdict.take_over) == (Outcome.FAILED, False)


def test_a_later_decision_on_the_node_means_the_intent_never_reached_it() -> None:
    node = lend(serving("n"))
    later = rebuilt(node, annotations={**node.annotations, KEYS.decision: "another"})

    assert recovery.judge(LEND, later, KEYS).result is Outcome.SUPERSEDED


@pytest.mark.parametrize(
    ("node", "action"),
    [
        (lending(serving("n")), recovery.ROLLBACK),
        (begin_reclaim(lend(serving("n"))), "reclaim"),
    ],
)
def test_a_recovery_rolls_a_lend_back_and_finishes_a_reclaim(
    node: model.NodeView, action: str
) -> None:
    assert recovery.recovery_action(node, KEYS) == action


def test_a_drain_that_had_begun_is_interrupted_not_superseded_when_the_node_moved_on() -> None:
    node = finish(begin_reclaim(lend(serving("n"))))
    moved = rebuilt(node, annotations={**node.annotations, KEYS.decision: "a-recovery"})

    assert recovery.judge(RECLAIM, moved, KEYS, begun=True).result is Outcome.INTERRUPTED
    assert recovery.judge(RECLAIM, moved, KEYS).result is Outcome.SUPERSEDED


def test_an_intent_for_a_node_that_was_replaced_under_its_name_is_gone() -> None:
    for_old = dataclasses.replace(RECLAIM, detail={"node_uid": "uid-old"})
    reclaiming = begin_reclaim(lend(serving("n")))
    replaced = dataclasses.replace(serving("n"), uid="uid-new")
    verdict = recovery.judge(for_old, replaced, KEYS, begun=True)
    assert (verdict.result, verdict.take_over) == (Outcome.GONE, False)
    assert verdict.message == "the node was replaced (uid uid-old, now uid-new)"
    # The same node (its UID as recorded) is judged as before.
    same = dataclasses.replace(reclaiming, uid="uid-old")
    assert recovery.judge(for_old, same, KEYS, begun=True).result is Outcome.INTERRUPTED


def test_a_removal_of_what_an_earlier_node_left_is_interrupted_and_looked_for_again() -> None:
    # It writes nothing to its node, so the node cannot tell how far it got; the next tick
    # finds the pods that are still there by their bind time.
    removal = dataclasses.replace(
        RECLAIM, detail={"node_uid": "uid-new", recovery.EARLIER_PODS: ["training/job-a-0"]}
    )
    node = dataclasses.replace(serving("n"), uid="uid-new")
    verdict = recovery.judge(removal, node, KEYS, begun=True)
    assert (verdict.result, verdict.take_over) == (Outcome.INTERRUPTED, False)
    assert "looked for again" in verdict.message
    assert recovery.judge(removal, None, KEYS).result is Outcome.GONE
