"""Node state that cannot be forged (docs/design/node-state-integrity.md): every write of the
keys the controller acts on carries an HMAC over the node's UID and their exact values; a state
that does not verify is never acted on as written, and its original counts only as far as the
pool's specification confirms it."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import model, nodestate, recovery, tick
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.nodestate import NodeState, Phase
from tests.support.factories import GPU_TAINT, INFERENCE_TAINT, LEND_SPEC, T0, serving

OLD = nodestate.SealKey(b"o" * 40)
NEW = nodestate.SealKey(b"n" * 40)
SEAL = nodestate.Seal(NEW)
KEYS = nodestate.Keys(seal=SEAL)
ROTATING = nodestate.Keys(seal=nodestate.Seal(NEW, (OLD,)))
BEFORE_ROTATION = nodestate.Keys(seal=nodestate.Seal(OLD))
UNSIGNED = nodestate.Keys()  # a release before signatures, or another writer
HEALTH = model.Taint(key="nvidia.com/gpu.unhealthy", value="true", effect="NoSchedule")
SPEC = dataclasses.replace(LEND_SPEC, serving_labels={"workload": "inference"})
DEADLINE = T0 + timedelta(minutes=2)


def node(name: str = "n", uid: str = "uid-1") -> model.NodeView:
    return dataclasses.replace(serving(name), uid=uid)


def written(
    view: model.NodeView, change: nodestate.NodeChange, keys: nodestate.Keys
) -> model.NodeView:
    """The node once ``change`` is written by a controller with ``keys``, as the actuator
    writes it: sealed."""
    return nodestate.apply(view, nodestate.seal(view, change, keys))


def lent(view: model.NodeView, keys: nodestate.Keys = KEYS) -> model.NodeView:
    begun = written(view, nodestate.begin_lend(view, SPEC, keys, T0, "D1"), keys)
    state = nodestate.read(begun, keys)
    assert isinstance(state, NodeState)
    return written(begun, nodestate.finish_lend(SPEC, state, keys, T0), keys)


def fresh(view: model.NodeView, **changes: Any) -> model.NodeView:
    """``view`` with ``changes`` and no cached read."""
    return dataclasses.replace(view, **changes)


def test_a_state_the_controller_wrote_verifies_and_reads_as_written() -> None:
    state = nodestate.read(lent(node()), KEYS)

    assert isinstance(state, NodeState)
    assert (state.phase, state.verified, state.drift) == (Phase.LENT, True, ())


def test_the_signature_names_its_version_and_key_id_and_never_the_key() -> None:
    signature = lent(node()).annotations[KEYS.signature]

    version, key_id, mac = signature.split(":")
    assert (version, key_id) == ("v1", NEW.id)
    assert len(mac) == 43  # 32 bytes, base64 without padding
    assert "n" * 40 not in repr(KEYS) + repr(NEW)


def test_the_forged_original_of_the_issue_is_unverified_and_reported() -> None:
    """Another writer marks a serving node lent, with an original that lists the GPU health
    taint as added by the lend and a foreign label as removed by it."""
    sick = node()
    sick = fresh(sick, taints=(*sick.taints, HEALTH))
    forged = {
        "v": 2,
        "taints": [t.to_doc() for t in sick.taints],
        "labels": {"evil.example/x": "1"},
        "added": [HEALTH.to_doc()],
        "removed": [],
    }
    view = fresh(
        sick,
        labels={**sick.labels, KEYS.state: "lent"},
        annotations={KEYS.original: json.dumps(forged)},
    )

    state = nodestate.read(view, KEYS)

    assert isinstance(state, NodeState)
    assert not state.verified
    assert state.drift[0].reason is model.Reason.STATE_UNVERIFIED
    assert "not signed" in state.drift[0].why
    # Counted as a node whose state cannot be read: away from serving, never driven as written.
    assert tick.phase(view, KEYS, SPEC.add_taints) is None
    change = nodestate.begin_restore_confirmed(view, state, SPEC, KEYS, T0, DEADLINE, "D2")
    assert change.taints is not None
    assert HEALTH in change.taints
    assert "evil.example/x" not in change.labels
    after = written(view, change, KEYS)
    assert HEALTH in after.taints
    assert "evil.example/x" not in after.labels
    again = nodestate.read(after, KEYS)
    assert isinstance(again, NodeState)
    assert again.verified
    assert again.phase is Phase.RECLAIMING


def test_a_signed_state_copied_onto_a_node_created_again_under_its_name_does_not_verify() -> None:
    first = lent(node(uid="uid-1"))
    copy = fresh(first, uid="uid-2")

    state = nodestate.read(copy, KEYS)

    assert isinstance(state, NodeState)
    assert not state.verified
    assert "uid-2" in state.drift[0].why


def test_a_state_signed_with_the_previous_key_verifies_during_a_rotation_and_not_after() -> None:
    before = lent(node(), BEFORE_ROTATION)

    during = nodestate.read(fresh(before), ROTATING)
    after = nodestate.read(fresh(before), KEYS)

    assert isinstance(during, NodeState)
    assert during.verified
    assert isinstance(after, NodeState)
    assert not after.verified
    assert "not one of the accepted keys" in after.drift[0].why


def test_the_next_write_after_a_rotation_signs_with_the_current_key() -> None:
    before = lent(node(), BEFORE_ROTATION)
    state = nodestate.read(fresh(before), ROTATING)
    assert isinstance(state, NodeState)

    change = nodestate.begin_reclaim(
        state, ROTATING, T0, DEADLINE, "D2", taints=before.taints, spec=SPEC
    )
    after = written(fresh(before), change, ROTATING)

    assert after.annotations[KEYS.signature].split(":")[1] == NEW.id
    assert isinstance(nodestate.read(fresh(after), KEYS), NodeState)
    verified = nodestate.read(fresh(after), KEYS)
    assert isinstance(verified, NodeState)
    assert verified.verified


def test_a_lent_node_whose_state_label_another_writer_removed_still_verifies() -> None:
    """The label alone gone: the rest is still the controller's (a drift of its own, read as
    lent from its own original: docs/design/other-writers.md); any other change is not."""
    view = lent(node())
    stripped = fresh(view, labels={k: v for k, v in view.labels.items() if k != KEYS.state})
    garbled = fresh(stripped, annotations={**stripped.annotations, KEYS.decision: "D9"})

    state = nodestate.read(stripped, KEYS)
    other = nodestate.read(garbled, KEYS)

    assert isinstance(state, NodeState)
    assert state.verified
    assert state.phase is Phase.LENT
    assert [d.reason for d in state.drift] == [model.Reason.STATE_LABEL_LOST]
    assert isinstance(other, NodeState)
    assert not other.verified


def test_a_serving_node_carries_nothing_to_check() -> None:
    """``since`` and ``decision`` stay after a reclaim; alone they steer nothing."""
    view = fresh(node(), annotations={KEYS.since: "2026-03-02T11:00:00Z", KEYS.decision: "X"})

    state = nodestate.read(view, KEYS)

    assert isinstance(state, NodeState)
    assert state.verified
    assert state.phase is Phase.SERVING


def test_an_unsigned_original_of_an_ordinary_lend_is_restored_byte_for_byte() -> None:
    """The upgrade: a node lent by a release before signatures is read by one that checks them.
    Its original is confirmed whole by the pool's specification, so the node ends as it was."""
    before = node()
    old = lent(before, UNSIGNED)  # no signature at all
    state = nodestate.read(fresh(old), KEYS)
    assert isinstance(state, NodeState)
    assert not state.verified

    change = nodestate.begin_restore_confirmed(old, state, SPEC, KEYS, T0, DEADLINE, "D2")
    back = written(fresh(old), change, KEYS)
    reclaiming = nodestate.read(fresh(back), KEYS)
    assert isinstance(reclaiming, NodeState)
    assert reclaiming.verified
    done = written(
        fresh(back),
        nodestate.finish(reclaiming, KEYS, T0, taints=back.taints, spec=SPEC),
        KEYS,
    )

    assert done.taints == before.taints
    assert {k: v for k, v in done.labels.items() if k != KEYS.state} == dict(before.labels)
    assert KEYS.state not in done.labels
    assert KEYS.original not in done.annotations


def test_a_write_never_signs_a_state_that_did_not_verify_unless_it_replaces_it() -> None:
    forged = fresh(node(), labels={**node().labels, KEYS.state: "reclaiming"}, annotations={
        KEYS.original: json.dumps({"v": 1, "taints": [], "labels": {}})
    })  # fmt: skip
    with pytest.raises(AssertionError, match="did not verify"):
        nodestate.seal(forged, nodestate.take_over(KEYS, "R1"), KEYS)


# ---------------------------------------------------------------------------------------------
# Properties

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
COVERED = ("state", "original", "since", "decision", "reclaim-deadline")


@settings(max_examples=200)
@given(
    values=st.fixed_dictionaries({k: st.none() | TEXT for k in COVERED}),
    uid=TEXT,
    which=st.sampled_from((*COVERED, "uid")),
    other=TEXT,
)
def test_a_signature_verifies_for_exactly_the_values_and_node_it_was_made_for(
    values: dict[str, str | None], uid: str, which: str, other: str
) -> None:
    labels = {} if values["state"] is None else {KEYS.state: values["state"]}
    annotations = {KEYS.prefix + k: v for k, v in values.items() if k != "state" and v is not None}
    message = nodestate.sealing.message(uid, KEYS, labels, annotations)
    signature = nodestate.signing.sign(SEAL, message)
    assert nodestate.signing.check(SEAL, message, signature) is None

    if which == "uid":
        if other == uid:
            return
        changed = nodestate.sealing.message(other, KEYS, labels, annotations)
    elif which == "state":
        if other == values["state"]:
            return
        changed = nodestate.sealing.message(uid, KEYS, {KEYS.state: other}, annotations)
    else:
        if annotations.get(KEYS.prefix + which) == other:
            return
        changed = nodestate.sealing.message(
            uid, KEYS, labels, {**annotations, KEYS.prefix + which: other}
        )
    assert nodestate.signing.check(SEAL, changed, signature) is not None
    assert nodestate.signing.check(nodestate.Seal(OLD), message, signature) is not None


TAINT = st.builds(
    model.Taint,
    key=st.sampled_from(
        ["workload", "nvidia.com/gpu.unhealthy", "example.com/x", "rebalancer.io/lent"]
    ),
    value=st.sampled_from([None, "true", "inference", "training"]),
    effect=st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
)
LABELS = st.dictionaries(
    st.sampled_from(["workload", "evil.example/x", "pool", "rebalancer-test/borrowed"]),
    st.none() | st.sampled_from(["1", "inference", "training"]),
    max_size=4,
)


@settings(max_examples=300)
@given(
    now=st.lists(TAINT, max_size=6, unique_by=nodestate.taint_key),
    recorded=st.lists(TAINT, max_size=6),
    added=st.none() | st.lists(TAINT, max_size=4),
    removed=st.lists(TAINT, max_size=4),
    labels=LABELS,
)
def test_a_forged_original_never_makes_a_restore_strip_a_foreign_taint_or_write_a_foreign_label(
    now: list[model.Taint],
    recorded: list[model.Taint],
    added: list[model.Taint] | None,
    removed: list[model.Taint],
    labels: dict[str, str | None],
) -> None:
    """The invariant: a restore of a state that did not verify removes no taint and writes no
    label that the pool's specification does not name."""
    original = nodestate.Original(
        taints=tuple(recorded),
        labels=labels,
        added=None if added is None else tuple(added),
        removed=None if added is None else tuple(nodestate.taint_key(t) for t in removed),
    )
    base = node()
    view = fresh(
        base,
        taints=tuple(now),
        labels={**base.labels, KEYS.state: "lent"},
        annotations={KEYS.original: nodestate.encode_original(original)},
    )
    state = nodestate.read(view, KEYS)
    assert isinstance(state, NodeState)
    assert not state.verified

    change = nodestate.begin_restore_confirmed(view, state, SPEC, KEYS, T0, DEADLINE, "D2")

    named = {nodestate.taint_key(t) for t in (*SPEC.add_taints, *SPEC.remove_taints)}
    assert change.taints is not None
    for taint in now:
        if nodestate.taint_key(taint) not in named and not taint.key.startswith(KEYS.prefix):
            assert taint in change.taints, f"{taint} was removed"
    for taint in change.taints:
        assert taint in now or taint in SPEC.remove_taints, f"{taint} was written"
    assert set(change.labels) <= {*SPEC.labels, KEYS.state}
    for key, value in change.labels.items():
        if key in SPEC.serving_labels:
            assert value == SPEC.serving_labels[key]
    assert GPU_TAINT not in now or GPU_TAINT in change.taints
    # Made to serve from the pool's specification: its serving taint is on, by key and effect.
    assert nodestate.taint_key(INFERENCE_TAINT) in {nodestate.taint_key(t) for t in change.taints}


def test_a_restart_concludes_nothing_from_a_state_that_does_not_verify() -> None:
    """An open intent whose node carries its id in an unsigned ``decision`` is not judged by
    it: anyone could have written that id."""
    view = lent(node())
    forged = fresh(view, annotations={**view.annotations, KEYS.decision: "X1"})
    intent = AuditRecord(
        id="X1",
        time=T0,
        kind=Kind.INTENT,
        pool="gpu",
        controller="rebalancer-a",
        reason="strategy",
        message="test",
        node="n",
        action=model.Action.RECLAIM,
    )

    verdict = recovery.judge(intent, forged, KEYS)

    assert verdict.result.value == "failed"
    assert not verdict.take_over


def test_a_forged_key_id_of_any_length_is_said_in_a_bounded_reason() -> None:
    forged = "v1:" + "k" * 200_000 + ":AAAA"

    why = nodestate.signing.check(nodestate.Seal(NEW), b"anything", forged)

    assert why is not None
    assert why.startswith("signed with key 'kkk")
    assert len(why) < 300
    assert "200000 bytes, sha256:" in why
