"""Reading a node another writer changed (docs/design/other-writers.md): a node with our
``original`` or a pool's lent taint is never read as serving, and a node whose original cannot be
read is restored from its pool's specification, keeping what others put on it."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer.core import model, nodestate
from rebalancer.core.nodestate import NodeState, Phase, StateError
from tests.support.factories import GPU_TAINT, INFERENCE_TAINT, KEYS, LEND_SPEC, T0, lend, serving

LENT_TAINTS = LEND_SPEC.add_taints
HEALTH = model.Taint(key="nvidia.com/gpu.unhealthy", value="true", effect="NoSchedule")
UNREACHABLE = model.Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")
SPEC = dataclasses.replace(LEND_SPEC, serving_labels={"workload": "inference"})


def test_a_lent_node_that_lost_its_state_label_reads_as_lent_from_its_own_original() -> None:
    node = lend(serving("n"))
    stripped = dataclasses.replace(
        node, labels={k: v for k, v in node.labels.items() if k != KEYS.state}
    )

    state = nodestate.read(stripped, KEYS)

    assert isinstance(state, NodeState)
    assert state.phase is Phase.LENT
    before = nodestate.read(node, KEYS)
    assert isinstance(before, NodeState)
    assert state.original == before.original
    assert [d.reason for d in state.drift] == [model.Reason.STATE_LABEL_LOST]


def test_a_node_with_a_lent_taint_and_no_original_cannot_be_read_in_its_pool() -> None:
    node = serving("n")
    marked = dataclasses.replace(node, taints=(*node.taints, *LENT_TAINTS))

    assert nodestate.read(marked, KEYS) == NodeState(Phase.SERVING)
    error = nodestate.read_in_pool(marked, KEYS, LENT_TAINTS)
    assert isinstance(error, StateError)
    assert error.key == KEYS.lent_taint
    assert nodestate.carries_ours(marked, KEYS)
    assert not nodestate.carries_ours(node, KEYS, LENT_TAINTS)


def test_a_restore_from_the_specification_keeps_other_writers_taints_and_serves_again() -> None:
    lent = lend(serving("n"))
    broken = dataclasses.replace(
        lent,
        taints=(HEALTH, *lent.taints, UNREACHABLE),
        annotations={**lent.annotations, KEYS.original: "{garbled"},
    )
    assert isinstance(nodestate.read(broken, KEYS), StateError)
    deadline = T0 + timedelta(minutes=2)

    change = nodestate.begin_restore_from_spec(broken, SPEC, KEYS, T0, deadline, "d-1")
    after = nodestate.apply(broken, change)

    assert after.taints == (HEALTH, GPU_TAINT, UNREACHABLE, INFERENCE_TAINT)
    assert after.labels["workload"] == "inference"
    assert "rebalancer-test/borrowed" not in after.labels
    state = nodestate.read(after, KEYS)
    assert isinstance(state, NodeState)
    assert (state.phase, state.decision, state.drift) == (Phase.RECLAIMING, "d-1", ())
    # The drain's finish then writes back what the rebuilt original holds.
    done = nodestate.apply(after, nodestate.finish(state, KEYS, T0, taints=after.taints, spec=SPEC))
    assert done.taints == (HEALTH, GPU_TAINT, UNREACHABLE, INFERENCE_TAINT)
    assert nodestate.read(done, KEYS) == NodeState(Phase.SERVING, since=T0, decision="d-1")


OTHER_LABELS = st.dictionaries(
    st.sampled_from(["workload", "pool", "nvidia.com/gpu.product", "rebalancer-test/borrowed"]),
    st.text(min_size=1, max_size=8),
    max_size=3,
)


@settings(deadline=None)
@given(
    phase=st.sampled_from([nodestate.Phase.LENDING, nodestate.Phase.LENT, None]),
    drop_label=st.booleans(),
    relabel=OTHER_LABELS,
    foreign=st.lists(st.sampled_from([HEALTH, UNREACHABLE]), max_size=2, unique=True),
)
def test_a_node_with_our_original_is_never_read_as_serving_whatever_others_write(
    phase: nodestate.Phase | None,
    drop_label: bool,
    relabel: dict[str, str],
    foreign: list[model.Taint],
) -> None:
    node = lend(serving("n"))
    labels = {**node.labels, **relabel}
    if drop_label:
        labels.pop(KEYS.state)
    elif phase is not None:
        labels[KEYS.state] = phase.value
    changed = dataclasses.replace(node, labels=labels, taints=(*foreign, *node.taints))

    state = nodestate.read_in_pool(changed, KEYS, LENT_TAINTS)

    assert isinstance(state, NodeState)
    assert state.phase is not Phase.SERVING
    before = nodestate.read(node, KEYS)
    assert isinstance(before, NodeState)
    assert state.original == before.original
