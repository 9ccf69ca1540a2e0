"""The requester's pure parts: its name, its request, and what it reads back from an
EvictionRequest and its Eviction (the documents as kube-apiserver 1.37.2 answered them;
tests/kubeapi/test_eviction_requests.py asks the server itself)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rebalancer.adapters import evictionrequests as er
from rebalancer.errors import ConfigError

UID = "5c1ff32b-7ce2-4a40-8d26-119c92ddc549"
TARGET = er.Target("training", "worker-0", UID)
NOW = datetime(2026, 12, 6, 16, 12, 46, tzinfo=UTC)
CHECKPOINTER = "trainer.example.com/checkpointer"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def request_doc(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = er.request_body(er.requester_name("rebalancer.io/"), TARGET)
    doc["metadata"]["generation"] = generation
    doc["status"] = status or {}
    return doc


def eviction_doc(uid: str, states: list[tuple[str, int, str]], reports: list[Any]) -> Any:
    return {
        "spec": {"target": {"pod": {"name": "worker-0", "uid": uid}}},
        "status": {
            "targetResponders": [{"name": n, "priority": p, "state": s} for n, p, s in states],
            "responders": reports,
        },
    }


def test_the_requester_is_named_under_the_key_prefix() -> None:
    assert er.requester_name("rebalancer.io/") == "rebalancer.io/reclaim-notice"
    assert er.requester_name("gpu.example.com/") == "gpu.example.com/reclaim-notice"


@pytest.mark.parametrize("prefix", ["k8s.io/", "x.k8s.io/", "kubernetes.io/", "a.kubernetes.io/"])
def test_a_reserved_domain_is_refused_in_one_line_naming_it(prefix: str) -> None:
    with pytest.raises(ConfigError, match="are reserved") as raised:
        er.requester_name(prefix)
    assert "\n" not in str(raised.value)
    assert repr(prefix + er.REQUESTER_KEY) in str(raised.value)


def test_a_prefix_too_long_to_name_a_request_after_is_refused() -> None:
    longest = "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 10 + "/"
    with pytest.raises(ConfigError, match="more than an object name's 253"):
        er.requester_name(longest)
    fits = "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 9 + "/"
    name = er.request_name(er.requester_name(fits), UID)
    assert len(name) == 253
    assert DNS_SUBDOMAIN.fullmatch(name)


def test_a_request_is_named_for_its_pod_and_the_name_is_one_the_server_takes() -> None:
    body = er.request_body("rebalancer.io/reclaim-notice", TARGET)
    name = body["metadata"]["name"]
    assert name == f"rebalancer.io.reclaim-notice.{UID}"
    assert DNS_SUBDOMAIN.fullmatch(name)
    assert body["spec"] == {
        "target": {"pod": {"name": "worker-0", "uid": UID}},
        "requester": "rebalancer.io/reclaim-notice",
        "intent": "Eviction",
    }
    assert er.request_name("a.io/Odd_Key.v2", UID) == f"a.io.odd-key-v2.{UID}"
    assert DNS_SUBDOMAIN.fullmatch(er.request_name("a.io/Odd_Key.v2", UID))
    assert er.intent_patch(er.Intent.WITHDRAWN) == {"spec": {"intent": "Withdrawn"}}


def test_a_request_nobody_handles_reads_as_unhandled_and_unanswered() -> None:
    state = er.state_of(TARGET, request_doc())
    assert (state.intent, state.generation, state.observed_generation) == (
        er.Intent.EVICTION,
        1,
        None,
    )
    assert not state.handled
    assert not state.answered()
    assert state.expected_by(NOW) is None


def test_handled_means_the_controller_saw_this_generation() -> None:
    assert er.state_of(TARGET, request_doc(3, {"observedGeneration": 3})).handled
    assert not er.state_of(TARGET, request_doc(3, {"observedGeneration": 2})).handled


def test_the_responders_of_the_pod_s_eviction_are_read_highest_priority_first() -> None:
    report = {
        "name": CHECKPOINTER,
        "startTime": "2026-12-06T16:12:46Z",
        "heartbeatTime": "2026-12-06T16:12:46Z",
        "expectedCompletionTime": "2026-12-06T16:22:46Z",
        "message": "saving step 1200",
    }
    mine = eviction_doc(
        UID,
        [(er.DEFAULT_EVICTOR, 100, "Inactive"), (CHECKPOINTER, 10000, "Active")],
        [report, {"name": er.DEFAULT_EVICTOR}],
    )
    other = eviction_doc("00000000-0000-0000-0000-000000000000", [("x.io/y", 5000, "Active")], [])
    state = er.state_of(TARGET, request_doc(1, {"observedGeneration": 1}), [other, mine])
    assert [(r.name, r.priority, r.state) for r in state.responders] == [
        (CHECKPOINTER, 10000, "Active"),
        (er.DEFAULT_EVICTOR, 100, "Inactive"),
    ]
    active = state.active()
    assert active is not None
    assert (active.heartbeat, active.message) == (NOW, "saving step 1200")
    assert state.expected_by(NOW) == NOW + timedelta(minutes=10)
    # Silent past the API's heartbeat deadline: its estimate no longer counts.
    assert state.expected_by(NOW + er.HEARTBEAT_DEADLINE + timedelta(seconds=1)) is None
    assert not state.answered()
    # No controller has seen the request: what an Eviction says counts for nothing.
    assert er.state_of(TARGET, request_doc(), [mine]).expected_by(NOW) is None


@pytest.mark.parametrize(
    ("states", "conditions", "answered"),
    [
        ([(CHECKPOINTER, "Completed"), (er.DEFAULT_EVICTOR, "Active")], [], True),
        ([(CHECKPOINTER, "Interrupted"), (er.DEFAULT_EVICTOR, "Active")], [], True),
        ([(CHECKPOINTER, "Active"), (er.DEFAULT_EVICTOR, "Inactive")], [], False),
        ([(er.DEFAULT_EVICTOR, "Active")], [], True),  # the pod declared no responder
        ([(CHECKPOINTER, "Active"), (er.DEFAULT_EVICTOR, "Inactive")], ["TargetEvicted"], True),
        ([(CHECKPOINTER, "Active"), (er.DEFAULT_EVICTOR, "Inactive")], ["Failed"], True),
    ],
)
def test_answered_once_only_the_default_evictor_is_left_or_the_eviction_ended(
    states: list[tuple[str, str]], conditions: list[str], answered: bool
) -> None:
    priorities = {CHECKPOINTER: 10000, er.DEFAULT_EVICTOR: 100}
    eviction = eviction_doc(UID, [(n, priorities[n], s) for n, s in states], [])
    status: dict[str, Any] = {
        "observedGeneration": 1,
        "conditions": [{"type": c, "status": "True", "reason": "r"} for c in conditions],
    }
    assert er.state_of(TARGET, request_doc(1, status), [eviction]).answered() is answered
    # The same Eviction counts for nothing while no controller has seen the request.
    del status["observedGeneration"]
    assert not er.state_of(TARGET, request_doc(1, status), [eviction]).answered()


def test_a_withdrawn_request_reads_withdrawn() -> None:
    doc = request_doc(2)
    doc["spec"]["intent"] = "Withdrawn"
    assert er.state_of(TARGET, doc).intent is er.Intent.WITHDRAWN


def test_a_404_of_the_group_is_told_from_a_404_of_an_object() -> None:
    # kube-apiserver's answers: plain text for a path nothing serves, a Status naming the object.
    assert er._group_missing({"message": "404 page not found\n"})
    named = {"reason": "NotFound", "details": {"name": "x", "group": er.GROUP}}
    assert not er._group_missing(named)
