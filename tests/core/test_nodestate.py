"""The node-state codec: reading what is on a Node, and transitions that restore it exactly."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rebalancer.core import bounded, model, nodestate
from rebalancer.core.model import Taint
from rebalancer.core.nodestate import NodeState, Original, Phase, StateError
from tests.support.factories import T0

KEYS = nodestate.Keys()
P = KEYS.prefix  # "rebalancer.io/"
# A Monday at noon UTC.
DECISION = "audit-0001"

INFERENCE = Taint(key="workload", value="inference", effect="NoSchedule")
LENT = Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule")
# Several taints in no particular order, with and without a value (and one with an empty value),
# one sharing its key with the removed taint but not its effect, one sharing the lent taint's key
# and effect with another value.
TAINTS = (
    Taint(key="zeta.example/maintenance", effect="NoExecute", value="soon"),
    INFERENCE,
    Taint(key="alpha", effect="PreferNoSchedule"),
    Taint(key="nvidia.com/gpu", effect="NoSchedule", value=""),
    Taint(key="workload", effect="NoExecute", value="inference"),
    Taint(key=KEYS.lent_taint, effect="NoSchedule", value="stale"),
)
LABELS: Mapping[str, str] = {
    "pool": "gpu",
    "workload": "inference",
    "serving.example/tier": "gold",
    "kept": "",
}
# Lending adds a label, changes one, removes one, and removes one the node does not have.
SPEC = nodestate.LendSpec(
    remove_taints=(Taint(key="workload", effect="NoSchedule"),),
    add_taints=(LENT, Taint(key="training.example/preemptible", effect="NoSchedule")),
    labels={
        "workload": "training",
        "borrowed.example/by": "team-a",
        "serving.example/tier": None,
        "never-there": None,
    },
)


def node(
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = TAINTS,
    annotations: Mapping[str, str] | None = None,
) -> model.NodeView:
    return model.NodeView(
        name=model.NodeName("gpu-0"),
        labels=dict(LABELS if labels is None else labels),
        taints=taints,
        annotations=dict(annotations or {}),
    )


def state_of(view: model.NodeView) -> NodeState:
    state = nodestate.read(view, KEYS)
    assert isinstance(state, NodeState), str(state)
    return state


def without_ours(labels: Mapping[str, str]) -> dict[str, str]:
    # serving_labels keeps the controller's own state label; pool selectors never use it.
    return {k: v for k, v in labels.items() if k != KEYS.state}


def original_text(
    taints: list[object] | None = None, labels: Mapping[str, object] | None = None
) -> str:
    return json.dumps({"v": 1, "taints": taints or [], "labels": labels or {}})


# ---------------------------------------------------------------------------------------------
# Keys


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param("rebalancer.io/", id="the default"),
        pytest.param("example.com/", id="another domain"),
        pytest.param("gpu-lending.team-a.example.co.uk/", id="a deep subdomain with dashes"),
        pytest.param("a/", id="one letter"),
        pytest.param("0x1/", id="digits"),
        pytest.param("a" * 253 + "/", id="253 characters"),
    ],
)
def test_keys_accept_a_dns_subdomain_and_a_slash(prefix: str) -> None:
    keys = nodestate.Keys(prefix=prefix)
    assert (keys.state, keys.original, keys.since, keys.decision) == (
        prefix + "state",
        prefix + "original",
        prefix + "since",
        prefix + "decision",
    )
    assert (keys.deadline, keys.lent_taint) == (prefix + "reclaim-deadline", prefix + "lent")
    assert (keys.window, keys.lend, keys.reclaim, keys.paused, keys.override_until) == (
        prefix + "window",
        prefix + "lend",
        prefix + "reclaim",
        prefix + "paused",
        prefix + "override-until",
    )


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param("", id="empty"),
        pytest.param("/", id="only a slash"),
        pytest.param("rebalancer.io", id="no slash"),
        pytest.param("rebalancer.io//", id="two slashes"),
        pytest.param("rebalancer.io/x/", id="a path"),
        pytest.param("Rebalancer.io/", id="capitals"),
        pytest.param("-rebalancer.io/", id="a leading dash"),
        pytest.param("rebalancer.io-/", id="a trailing dash"),
        pytest.param(".rebalancer.io/", id="a leading dot"),
        pytest.param("rebalancer.io./", id="a trailing dot"),
        pytest.param("rebalancer..io/", id="an empty label"),
        pytest.param("rebalancer.-io/", id="a label starting with a dash"),
        pytest.param("rebalancer-.io/", id="a label ending with a dash"),
        pytest.param("rebalancer io/", id="a space"),
        pytest.param("rebalancer_io/", id="an underscore"),
        pytest.param("rebalancer.io/\n", id="a trailing newline"),
        pytest.param("a" * 254 + "/", id="254 characters"),
    ],
)
def test_keys_reject_a_bad_prefix(prefix: str) -> None:
    with pytest.raises(ValueError, match="must be a DNS subdomain followed by '/'"):
        nodestate.Keys(prefix=prefix)


# ---------------------------------------------------------------------------------------------
# Reading good states


def test_an_untouched_node_is_serving() -> None:
    assert nodestate.read(node(), KEYS) == NodeState(phase=Phase.SERVING)


def test_a_returned_node_is_serving_and_keeps_since_and_decision() -> None:
    view = node(annotations={KEYS.since: "2026-03-02T12:00:00Z", KEYS.decision: DECISION})
    assert nodestate.read(view, KEYS) == NodeState(Phase.SERVING, since=T0, decision=DECISION)


ORIGINAL = Original(taints=TAINTS, labels={"workload": "inference", "borrowed.example/by": None})


@pytest.mark.parametrize(
    ("phase", "deadline"),
    [
        pytest.param(Phase.LENDING, None, id="lending"),
        pytest.param(Phase.LENT, None, id="lent"),
        pytest.param(Phase.RECLAIMING, T0 + timedelta(minutes=2), id="reclaiming"),
    ],
)
def test_a_node_in_each_phase_is_read_with_its_originals(
    phase: Phase, deadline: datetime | None
) -> None:
    annotations = {
        KEYS.original: nodestate.encode_original(ORIGINAL),
        KEYS.since: "2026-03-02T12:00:00Z",
        KEYS.decision: DECISION,
    }
    if deadline is not None:
        annotations[KEYS.deadline] = "2026-03-02T12:02:00Z"
    view = node(labels={**LABELS, KEYS.state: phase.value}, annotations=annotations)
    assert nodestate.read(view, KEYS) == NodeState(
        phase=phase, original=ORIGINAL, since=T0, decision=DECISION, deadline=deadline
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2026-03-02T12:00:00Z", T0, id="utc"),
        pytest.param("2026-03-02t12:00:00z", T0, id="lower-case t and z"),
        pytest.param("2026-03-02T13:00:00+01:00", T0, id="an offset"),
        pytest.param(" 2026-03-02T12:00:00.5Z ", T0 + timedelta(milliseconds=500), id="fraction"),
    ],
)
def test_times_are_read_as_rfc_3339_into_utc(text: str, expected: datetime) -> None:
    parsed = nodestate.parse_time(text)
    assert parsed == expected
    assert isinstance(parsed, datetime)
    assert parsed.tzinfo is UTC


def test_times_are_written_in_utc_to_the_second() -> None:
    from zoneinfo import ZoneInfo

    when = datetime(2026, 3, 2, 13, 0, 0, 999_999, tzinfo=ZoneInfo("Europe/Berlin"))
    assert nodestate.format_time(when) == "2026-03-02T12:00:00Z"
    assert nodestate.parse_time(nodestate.format_time(when)) == T0


# ---------------------------------------------------------------------------------------------
# Reading garbage: a StateError value naming the key and the value, never an exception


LENT_LABELS = {**LABELS, KEYS.state: "lent"}
GOOD_ORIGINAL = nodestate.encode_original(ORIGINAL)

GARBAGE = [
    # (labels, annotations, key at fault, the part of why that names the problem)
    pytest.param(
        {**LABELS, KEYS.state: "borrowed"}, {}, KEYS.state, "not one of", id="an unknown state"
    ),
    pytest.param({**LABELS, KEYS.state: "LENT"}, {}, KEYS.state, "not one of", id="capitals"),
    pytest.param({**LABELS, KEYS.state: ""}, {}, KEYS.state, "not one of", id="empty state"),
    pytest.param(
        {**LABELS, KEYS.state: "serving"},
        {},
        KEYS.state,
        "serving is written as no label",
        id="serving written out",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.since: "2026-03-02T12:00:00Z"},
        KEYS.state,
        f"no {KEYS.original} to restore from",
        id="lent without original",
    ),
    pytest.param(
        {**LABELS, KEYS.state: "lending"},
        {},
        KEYS.state,
        "to restore from",
        id="lending without original",
    ),
    pytest.param(
        {**LABELS, KEYS.state: "reclaiming"},
        {KEYS.deadline: "2026-03-02T12:02:00Z"},
        KEYS.state,
        "to restore from",
        id="reclaiming without original",
    ),
    pytest.param(LENT_LABELS, {KEYS.original: "taints!"}, KEYS.original, "not JSON", id="prose"),
    pytest.param(LENT_LABELS, {KEYS.original: "{"}, KEYS.original, "not JSON", id="cut JSON"),
    pytest.param(LENT_LABELS, {KEYS.original: ""}, KEYS.original, "not JSON", id="empty JSON"),
    pytest.param(
        LENT_LABELS, {KEYS.original: "1" * 5000}, KEYS.original, "not readable JSON", id="bigint"
    ),
    pytest.param(
        LENT_LABELS, {KEYS.original: "[" * 100_000}, KEYS.original, "not readable", id="nesting"
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: "[]"},
        KEYS.original,
        "not a version 1 or 2 record",
        id="a list",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: "null"},
        KEYS.original,
        "not a version 1 or 2 record",
        id="null",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 3, "taints": [], "labels": {}}'},
        KEYS.original,
        "not a version 1 or 2 record",
        id="version 3",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 2, "taints": [], "labels": {}}'},
        KEYS.original,
        "a version 2 record needs the lists 'added' and 'removed'",
        id="version 2 without what the lend did",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 2, "taints": [], "labels": {}, "added": [], "removed": [1]}'},
        KEYS.original,
        "removed taint 1 needs string 'key' and 'effect'",
        id="version 2 with a removed taint that is not one",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": "1", "taints": [], "labels": {}}'},
        KEYS.original,
        "not a version 1 or 2 record",
        id="version as a string",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"taints": [], "labels": {}}'},
        KEYS.original,
        "not a version 1 or 2 record",
        id="no version",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 1, "labels": {}}'},
        KEYS.original,
        "needs a list 'taints' and an object 'labels'",
        id="no taints",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 1, "taints": {}, "labels": {}}'},
        KEYS.original,
        "needs a list 'taints'",
        id="taints as an object",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: '{"v": 1, "taints": [], "labels": []}'},
        KEYS.original,
        "an object 'labels'",
        id="labels as a list",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text(["workload=inference:NoSchedule"])},
        KEYS.original,
        "taint 'workload=inference:NoSchedule' needs string 'key' and 'effect'",
        id="a taint as a string",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text([None])},
        KEYS.original,
        "taint None needs",
        id="a null taint",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text([{"key": "workload"}])},
        KEYS.original,
        "needs string 'key' and 'effect'",
        id="a taint without effect",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text([{"effect": "NoSchedule"}])},
        KEYS.original,
        "needs string 'key' and 'effect'",
        id="a taint without key",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text([{"key": 7, "effect": "NoSchedule"}])},
        KEYS.original,
        "needs string 'key' and 'effect'",
        id="a numeric taint key",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text([{"key": "a", "effect": "NoSchedule", "value": 3}])},
        KEYS.original,
        "optional string 'value'",
        id="a numeric taint value",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text(labels={"workload": 1})},
        KEYS.original,
        "label 'workload' must map to a string or null, not 1",
        id="a numeric label value",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: original_text(labels={"workload": ["inference"]})},
        KEYS.original,
        "label 'workload' must map to a string or null",
        id="a list label value",
    ),
    pytest.param(
        LABELS,
        {KEYS.original: "{}"},
        KEYS.original,
        "not a version 1 or 2 record",
        id="a serving node with a bad original",
    ),
]


# A time another writer garbled is unknown, not a reason to give the node up: its original can
# still be read (docs/design/other-writers.md).
GARBLED_TIMES = [
    pytest.param(
        LENT_LABELS,
        {KEYS.original: GOOD_ORIGINAL, KEYS.since: "yesterday"},
        KEYS.since,
        "not an RFC 3339 time",
        id="since is a word",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: GOOD_ORIGINAL, KEYS.since: "2026-03-02T12:00:00"},
        KEYS.since,
        "has no time zone",
        id="since without zone",
    ),
    pytest.param(
        LENT_LABELS,
        {KEYS.original: GOOD_ORIGINAL, KEYS.since: "9999-12-31T23:59:59-23:59"},
        KEYS.since,
        "out of the representable range",
        id="since past year 9999 in UTC",
    ),
    pytest.param(
        {**LABELS, KEYS.state: "reclaiming"},
        {KEYS.original: GOOD_ORIGINAL, KEYS.deadline: "in two minutes"},
        KEYS.deadline,
        "not an RFC 3339 time",
        id="deadline is prose",
    ),
    pytest.param(
        LABELS,
        {KEYS.since: "2026-02-30T00:00:00Z"},
        KEYS.since,
        "not an RFC 3339 time",
        id="a serving node with 30 February",
    ),
]


@pytest.mark.parametrize(("labels", "annotations", "key", "why"), GARBLED_TIMES)
def test_a_garbled_time_is_read_as_unknown_and_named_as_drift(
    labels: Mapping[str, str], annotations: Mapping[str, str], key: str, why: str
) -> None:
    state = nodestate.read(node(labels=labels, annotations=annotations), KEYS)
    assert isinstance(state, NodeState)
    assert (state.since if key == KEYS.since else state.deadline) is None
    (drift,) = state.drift
    assert (drift.reason, drift.key, drift.value) == (
        model.Reason.STATE_UNREADABLE,
        key,
        annotations[key],
    )
    assert why in drift.why
    assert state.original == (
        None if KEYS.original not in annotations else nodestate.decode_original(GOOD_ORIGINAL)
    )


@pytest.mark.parametrize(("labels", "annotations", "key", "why"), GARBAGE)
def test_garbage_is_a_state_error_naming_key_and_value(
    labels: Mapping[str, str], annotations: Mapping[str, str], key: str, why: str
) -> None:
    view = node(labels=labels, annotations=annotations)
    error = nodestate.read(view, KEYS)
    assert isinstance(error, StateError)
    assert error.key == key
    assert error.value == {**labels, **annotations}[key]
    assert why in error.why
    # The value in full on the error, quoted short (core.bounded) in what it says.
    assert str(error).startswith(f"{key}={bounded.quoted(error.value)}: ")


@settings(deadline=None)
@given(
    state=st.one_of(st.none(), st.sampled_from(["lending", "lent", "reclaiming"]), st.text()),
    values=st.fixed_dictionaries(
        {},
        optional={
            key: st.one_of(st.text(), st.just(GOOD_ORIGINAL), st.just("2026-03-02T12:00:00Z"))
            for key in (KEYS.original, KEYS.since, KEYS.deadline, KEYS.decision)
        },
    ),
)
def test_read_never_raises(state: str | None, values: dict[str, str]) -> None:
    labels = dict(LABELS) if state is None else {**LABELS, KEYS.state: state}
    result = nodestate.read(node(labels=labels, annotations=values), KEYS)
    assert isinstance(result, NodeState | StateError)


# ---------------------------------------------------------------------------------------------
# Transitions and round trips


def test_begin_lend_writes_the_originals_and_changes_no_taint_or_label_yet() -> None:
    start = node(annotations={KEYS.deadline: "2026-03-01T00:00:00Z"})
    change = nodestate.begin_lend(start, SPEC, KEYS, T0, DECISION)
    assert change.taints is None
    assert change.labels == {KEYS.state: "lending"}
    assert change.annotations == {
        KEYS.original: nodestate.encode_original(
            Original(
                taints=TAINTS,
                labels={
                    "workload": "inference",
                    "borrowed.example/by": None,
                    "serving.example/tier": "gold",
                    "never-there": None,
                },
                added=SPEC.add_taints,
                removed=(("workload", "NoSchedule"),),
            )
        ),
        KEYS.since: "2026-03-02T12:00:00Z",
        KEYS.decision: DECISION,
        KEYS.deadline: None,
    }


def test_a_full_lend_and_reclaim_restores_taints_and_labels_exactly() -> None:
    start = node()
    deadline = T0 + timedelta(hours=3, minutes=2)

    lending = nodestate.apply(start, nodestate.begin_lend(start, SPEC, KEYS, T0, DECISION))
    assert lending.taints == TAINTS
    assert lending.labels == {**LABELS, KEYS.state: "lending"}
    state = state_of(lending)
    assert state.phase is Phase.LENDING
    assert state.original is not None
    assert state.original.taints == TAINTS

    lent = nodestate.apply(lending, nodestate.finish_lend(SPEC, state, KEYS, T0))
    assert lent.taints == (
        Taint(key="zeta.example/maintenance", effect="NoExecute", value="soon"),
        Taint(key="alpha", effect="PreferNoSchedule"),
        Taint(key="nvidia.com/gpu", effect="NoSchedule", value=""),
        Taint(key="workload", effect="NoExecute", value="inference"),
        LENT,
        Taint(key="training.example/preemptible", effect="NoSchedule"),
    )
    assert lent.labels == {
        "pool": "gpu",
        "workload": "training",
        "kept": "",
        "borrowed.example/by": "team-a",
        KEYS.state: "lent",
    }
    assert without_ours(nodestate.serving_labels(lent, state_of(lent))) == LABELS

    later = T0 + timedelta(hours=3)
    reclaim = nodestate.begin_reclaim(
        state_of(lent), KEYS, later, deadline, "audit-0002", taints=lent.taints, spec=SPEC
    )
    reclaiming = nodestate.apply(lent, reclaim)
    assert reclaiming.taints == TAINTS
    assert reclaiming.labels == {**LABELS, KEYS.state: "reclaiming"}
    state = state_of(reclaiming)
    assert (state.phase, state.deadline, state.since) == (Phase.RECLAIMING, deadline, later)

    back = T0 + timedelta(hours=3, minutes=1)
    done = nodestate.finish(state, KEYS, back, taints=reclaiming.taints, spec=SPEC)
    served = nodestate.apply(reclaiming, done)
    assert served.taints == TAINTS
    assert served.labels == LABELS
    assert served.annotations == {KEYS.since: "2026-03-02T15:01:00Z", KEYS.decision: "audit-0002"}
    assert nodestate.read(served, KEYS) == NodeState(
        Phase.SERVING, since=back, decision="audit-0002"
    )


def test_a_lend_rolled_back_from_lending_restores_the_node_exactly() -> None:
    start = node(annotations={"unrelated": "kept"})
    lending = nodestate.apply(start, nodestate.begin_lend(start, SPEC, KEYS, T0, DECISION))
    back = nodestate.finish(state_of(lending), KEYS, T0, taints=lending.taints, spec=SPEC)
    rolled_back = nodestate.apply(lending, back)
    assert rolled_back.taints == TAINTS
    assert rolled_back.labels == LABELS
    assert rolled_back.annotations == {
        "unrelated": "kept",
        KEYS.since: "2026-03-02T12:00:00Z",
        KEYS.decision: DECISION,
    }
    assert state_of(rolled_back).phase is Phase.SERVING


def test_a_node_lent_twice_still_returns_to_its_first_originals() -> None:
    once = node()
    for hour in (0, 6):
        when = T0 + timedelta(hours=hour)
        once = nodestate.apply(once, nodestate.begin_lend(once, SPEC, KEYS, when, DECISION))
        once = nodestate.apply(once, nodestate.finish_lend(SPEC, state_of(once), KEYS, when))
        change = nodestate.begin_reclaim(
            state_of(once), KEYS, when, when, DECISION, taints=once.taints, spec=SPEC
        )
        once = nodestate.apply(once, change)
        done = nodestate.finish(state_of(once), KEYS, when, taints=once.taints, spec=SPEC)
        once = nodestate.apply(once, done)
    assert (once.taints, once.labels) == (TAINTS, LABELS)


@pytest.mark.parametrize(
    "original",
    [
        pytest.param(Original(taints=(), labels={}), id="nothing"),
        pytest.param(ORIGINAL, id="taints and labels"),
        pytest.param(
            Original(
                taints=(Taint("k", "NoSchedule", None), Taint("k", "NoSchedule", "")),
                labels={"é/ключ": "値", "gone": None},
            ),
            id="absent versus empty values and unicode",
        ),
    ],
)
def test_the_original_record_decodes_to_what_was_encoded(original: Original) -> None:
    assert nodestate.decode_original(nodestate.encode_original(original)) == original


def test_apply_deletes_keys_set_to_none_and_leaves_taints_alone_when_none() -> None:
    start = node(annotations={"a": "1", "b": "2"})
    change = nodestate.NodeChange(
        taints=None, labels={"pool": None, "new": "x"}, annotations={"a": None, "c": "3"}
    )
    changed = nodestate.apply(start, change)
    assert changed.taints == TAINTS
    assert changed.labels == {
        "workload": "inference",
        "serving.example/tier": "gold",
        "kept": "",
        "new": "x",
    }
    assert changed.annotations == {"b": "2", "c": "3"}


# ---------------------------------------------------------------------------------------------
# Property: any taints, any labels, any spec come back exactly


_TAINT_KEYS = st.sampled_from(["workload", "nvidia.com/gpu", "a", KEYS.lent_taint, "z/y"])
_EFFECTS = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])
_TAINT_VALUES = st.one_of(st.none(), st.just(""), st.text(max_size=8))
_TAINTS = st.builds(Taint, key=_TAINT_KEYS, effect=_EFFECTS, value=_TAINT_VALUES)
_LABEL_KEYS = st.one_of(st.sampled_from(["pool", "workload", "tier"]), st.text(min_size=1))
_LABELS = st.dictionaries(_LABEL_KEYS.filter(lambda k: k != KEYS.state), st.text(max_size=8))
_SPECS = st.builds(
    nodestate.LendSpec,
    remove_taints=st.lists(_TAINTS, max_size=3).map(tuple),
    add_taints=st.lists(_TAINTS, max_size=3).map(tuple),
    labels=st.dictionaries(
        _LABEL_KEYS.filter(lambda k: k != KEYS.state), st.one_of(st.none(), st.text(max_size=8))
    ),
)


@settings(deadline=None)
@given(
    taints=st.lists(_TAINTS, max_size=8).map(tuple),
    labels=_LABELS,
    spec=_SPECS,
    rollback=st.booleans(),
)
def test_any_node_comes_back_with_the_same_taints_and_labels(
    taints: tuple[Taint, ...],
    labels: dict[str, str],
    spec: nodestate.LendSpec,
    rollback: bool,
) -> None:
    start = node(labels=labels, taints=taints)
    current = nodestate.apply(start, nodestate.begin_lend(start, spec, KEYS, T0, DECISION))
    if not rollback:
        current = nodestate.apply(current, nodestate.finish_lend(spec, state_of(current), KEYS, T0))
        lent = state_of(current)
        assert lent.phase is Phase.LENT
        removed = {(t.key, t.effect) for t in spec.remove_taints} - {
            (t.key, t.effect) for t in spec.add_taints
        }
        assert not any((t.key, t.effect) in removed for t in current.taints)
        assert current.taints[len(current.taints) - len(spec.add_taints) :] == spec.add_taints
        assert without_ours(nodestate.serving_labels(current, lent)) == labels
        change = nodestate.begin_reclaim(
            lent, KEYS, T0, T0 + timedelta(minutes=2), DECISION, taints=current.taints, spec=spec
        )
        current = nodestate.apply(current, change)
        assert current.taints == taints
    done = nodestate.finish(state_of(current), KEYS, T0, taints=current.taints, spec=spec)
    current = nodestate.apply(current, done)
    assert current.taints == taints
    assert current.labels == labels
    assert state_of(current).phase is Phase.SERVING
    assert KEYS.original not in current.annotations
    assert KEYS.deadline not in current.annotations


# ---------------------------------------------------------------------------------------------
# Other writers: restore undoes what the lend changed, and keeps everything else as it is now

UNHEALTHY = Taint(key="nvidia.com/gpu.unhealthy", effect="NoSchedule", value="true")
UNREACHABLE = Taint(
    key="node.kubernetes.io/unreachable", effect="NoExecute", time_added="2026-03-02T13:00:00Z"
)
CORDON = Taint(
    key="node.kubernetes.io/unschedulable", effect="NoSchedule", time_added="2026-03-02T13:05:00Z"
)


def lent_node(
    start: model.NodeView | None = None, spec: nodestate.LendSpec = SPEC
) -> model.NodeView:
    start = start or node()
    lending = nodestate.apply(start, nodestate.begin_lend(start, spec, KEYS, T0, DECISION))
    return nodestate.apply(lending, nodestate.finish_lend(spec, state_of(lending), KEYS, T0))


def with_taints(view: model.NodeView, taints: tuple[Taint, ...]) -> model.NodeView:
    """``view`` once another writer has set its taints to ``taints``."""
    return model.NodeView(view.name, view.labels, taints, view.annotations)


def reclaimed(view: model.NodeView, spec: nodestate.LendSpec | None = SPEC) -> model.NodeView:
    later = T0 + timedelta(hours=1)
    change = nodestate.begin_reclaim(
        state_of(view), KEYS, later, later, DECISION, taints=view.taints, spec=spec
    )
    reclaiming = nodestate.apply(view, change)
    done = nodestate.finish(state_of(reclaiming), KEYS, later, taints=reclaiming.taints, spec=spec)
    return nodestate.apply(reclaiming, done)


def test_a_reclaim_keeps_the_taints_a_health_checker_and_the_node_lifecycle_added_while_lent() -> (
    None
):
    lent = lent_node()
    touched = with_taints(lent, (UNHEALTHY, *lent.taints, UNREACHABLE))
    back = reclaimed(touched)
    assert back.taints == (UNHEALTHY, *TAINTS, UNREACHABLE)
    restored = nodestate.restore(state_of(touched), touched.taints, SPEC, KEYS)
    assert restored.kept == (UNHEALTHY, UNREACHABLE)
    assert [str(t) for t in restored.kept] == [
        "nvidia.com/gpu.unhealthy=true:NoSchedule",
        "node.kubernetes.io/unreachable:NoExecute",
    ]


def test_a_cordon_made_while_lent_survives_the_reclaim() -> None:
    lent = lent_node()
    back = reclaimed(with_taints(lent, (*lent.taints, CORDON)))
    assert back.taints == (*TAINTS, CORDON)


def test_a_taint_another_writer_changed_or_removed_during_the_loan_stays_as_they_left_it() -> None:
    lent = lent_node()
    zeta, alpha = lent.taints[0], lent.taints[1]
    assert (zeta.key, alpha.key) == ("zeta.example/maintenance", "alpha")
    changed = Taint(zeta.key, zeta.effect, "now", "2026-03-02T14:00:00Z")
    back = reclaimed(with_taints(lent, (changed, *lent.taints[2:])))  # alpha removed
    assert back.taints == (changed, INFERENCE, *TAINTS[3:])
    state = state_of(with_taints(lent, (changed, *lent.taints[2:])))
    restored = nodestate.restore(state, (changed, *lent.taints[2:]), SPEC, KEYS)
    assert restored.left_removed == (alpha,)
    assert restored.kept == (changed,)


def test_another_writers_copy_of_a_taint_the_lend_removed_is_replaced_by_the_recorded_one() -> None:
    lent = lent_node()
    theirs = Taint("workload", "NoSchedule", "batch", "2026-03-02T14:00:00Z")
    back = reclaimed(with_taints(lent, (theirs, *lent.taints)))
    assert back.taints == TAINTS  # one taint per key and effect: the one the pool served under


def test_a_lend_rolled_back_keeps_a_taint_added_while_it_was_lending() -> None:
    start = node()
    lending = nodestate.apply(start, nodestate.begin_lend(start, SPEC, KEYS, T0, DECISION))
    touched = with_taints(lending, (*lending.taints, UNHEALTHY))
    change = nodestate.finish(state_of(touched), KEYS, T0, taints=touched.taints, spec=SPEC)
    assert nodestate.apply(touched, change).taints == (*TAINTS, UNHEALTHY)


def test_a_lend_records_what_it_did_so_a_pool_spec_changed_during_the_loan_still_restores() -> None:
    lent = lent_node()
    other_lent = Taint(KEYS.lent_taint, "NoSchedule", "batch")
    changed = nodestate.LendSpec(remove_taints=(), add_taints=(other_lent,), labels=SPEC.labels)
    assert reclaimed(lent, changed).taints == TAINTS
    assert reclaimed(lent, None).taints == TAINTS  # no pool selects it: its own record says


def test_a_version_1_record_is_restored_from_the_pools_lend_spec() -> None:
    lent = lent_node()
    state = state_of(lent)
    assert state.original is not None
    old = Original(taints=state.original.taints, labels=state.original.labels)
    assert json.loads(nodestate.encode_original(old))["v"] == 1
    written_by_an_older_release = model.NodeView(
        lent.name,
        lent.labels,
        (UNHEALTHY, *lent.taints),
        {**lent.annotations, KEYS.original: nodestate.encode_original(old)},
    )
    assert reclaimed(written_by_an_older_release).taints == (UNHEALTHY, *TAINTS)


def test_a_version_1_record_on_a_node_no_pool_selects_is_restored_from_what_the_node_shows() -> (
    None
):
    spec = nodestate.LendSpec(remove_taints=(INFERENCE,), add_taints=(LENT,))
    start = node(taints=(INFERENCE, UNHEALTHY))
    lent = lent_node(start, spec)
    state = state_of(lent)
    assert state.original is not None
    old = Original(taints=state.original.taints, labels=state.original.labels)
    v1 = model.NodeView(
        lent.name,
        lent.labels,
        lent.taints,
        {**lent.annotations, KEYS.original: nodestate.encode_original(old)},
    )
    assert reclaimed(v1, None).taints == (INFERENCE, UNHEALTHY)


def test_a_version_2_record_decodes_to_what_was_encoded() -> None:
    original = Original(
        taints=TAINTS,
        labels={"a": None, "b": "c"},
        added=(LENT,),
        removed=(("workload", "NoSchedule"),),
    )
    text = nodestate.encode_original(original)
    assert json.loads(text)["v"] == 2
    assert nodestate.decode_original(text) == original


_FOREIGN_KEYS = st.sampled_from(
    [
        "nvidia.com/gpu.unhealthy",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "workload",
        "a",
        KEYS.lent_taint,
    ]
)
_FOREIGN = st.builds(
    Taint,
    key=_FOREIGN_KEYS,
    effect=_EFFECTS,
    value=_TAINT_VALUES,
    time_added=st.one_of(st.none(), st.just("2026-03-02T13:00:00Z")),
)
_UNIQUE_TAINTS = st.lists(_TAINTS, max_size=6, unique_by=lambda t: (t.key, t.effect)).map(tuple)


@settings(deadline=None)
@given(
    taints=_UNIQUE_TAINTS,
    spec=_SPECS,
    added=st.lists(_FOREIGN, max_size=3),
    removed=st.sets(st.integers(0, 9), max_size=3),
    changed=st.dictionaries(st.integers(0, 9), _TAINT_VALUES, max_size=2),
    at=st.integers(0, 9),
    rollback=st.booleans(),
)
# Another writer takes ``a`` off and puts it back at the front: the taint the original placed
# after ``a`` must not go back before the one of ours the original placed first.
@example(
    taints=(
        Taint("workload", "NoSchedule"),
        Taint("workload", "NoExecute"),
        Taint("z/y", "PreferNoSchedule"),
        Taint("a", "PreferNoSchedule"),
        Taint("workload", "PreferNoSchedule"),
    ),
    spec=nodestate.LendSpec(
        remove_taints=(),
        add_taints=(Taint("workload", "PreferNoSchedule"), Taint("z/y", "PreferNoSchedule")),
        labels={},
    ),
    added=[Taint("a", "PreferNoSchedule")],
    removed={2},
    changed={},
    at=0,
    rollback=False,
)
def test_any_other_writers_taints_survive_the_restore_and_nothing_else_changes(
    taints: tuple[Taint, ...],
    spec: nodestate.LendSpec,
    added: list[Taint],
    removed: set[int],
    changed: dict[int, str | None],
    at: int,
    rollback: bool,
) -> None:
    start = node(taints=taints)
    current = nodestate.apply(start, nodestate.begin_lend(start, spec, KEYS, T0, DECISION))
    if not rollback:
        current = nodestate.apply(current, nodestate.finish_lend(spec, state_of(current), KEYS, T0))
    owned = {(t.key, t.effect) for t in (*spec.remove_taints, *spec.add_taints)}
    # Another writer edits the taints the lend does not own: changes some, removes some, adds
    # some (one taint per key and effect, as the API keeps them).
    now = list(current.taints)
    theirs = [i for i, t in enumerate(now) if (t.key, t.effect) not in owned]
    for i, value in changed.items():
        if i < len(theirs):
            old = now[theirs[i]]
            now[theirs[i]] = Taint(old.key, old.effect, value, "2026-03-02T14:00:00Z")
    gone = {now[theirs[i]] for i in removed if i < len(theirs)}
    now = [t for t in now if t not in gone]
    for taint in added:
        if (taint.key, taint.effect) not in owned | {(t.key, t.effect) for t in now}:
            now.insert(min(at, len(now)), taint)
    touched = with_taints(current, tuple(now))
    untouched = tuple(now) == current.taints

    done = nodestate.finish(state_of(touched), KEYS, T0, taints=touched.taints, spec=spec)
    back = nodestate.apply(touched, done).taints

    foreign = [t for t in now if (t.key, t.effect) not in owned]
    assert [t for t in back if (t.key, t.effect) not in owned] == foreign  # kept, in order
    assert [t for t in back if (t.key, t.effect) in owned] == [
        t for t in taints if (t.key, t.effect) in owned
    ]
    if untouched:
        assert back == taints
