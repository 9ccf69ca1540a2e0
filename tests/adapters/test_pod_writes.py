"""The reclaim notice's writes to a borrowed pod (docs/design/reclaim-notice.md): its annotations
and the controller's one condition, on both servers. What they must never do is touch what is
not theirs (the pod's other annotations, the kubelet's conditions) or write to a pod re-created
under the name of the one the controller judged."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rebalancer.adapters.writer import (
    ApiFailure,
    Conflict,
    KubeWriter,
    RetryPolicy,
    annotations_patch,
    condition_patch,
    pod_condition,
)
from sandbox.emulator.resources import PODS
from sandbox.emulator.store import DeleteOptions
from tests.support.actuation import World, world
from tests.support.backends import Backend
from tests.support.objects import training
from tests.support.waits import no_sleep

Obj = dict[str, Any]
NS = "training"
DEADLINE, RECLAIM_ID = "rebalancer.io/reclaim-deadline", "rebalancer.io/reclaim-id"
NOTICE = "rebalancer.io/ReclaimNotice"
MERGE = "application/merge-patch+json"
AT = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)


def scheduled(message: str = "reclaim r-1 at 2026-12-04T09:35:00Z") -> dict[str, str]:
    return {"type": NOTICE, "status": "True", "reason": "ReclaimScheduled", "message": message}


WITHDRAWN = {"type": NOTICE, "status": "False", "reason": "ReclaimWithdrawn", "message": "r-1"}


# ---------------------------------------------------------------------------------------------
# The bodies


def test_the_annotations_patch_names_the_uid_and_deletes_with_null() -> None:
    body = annotations_patch("u-1", {DEADLINE: "2026-12-04T09:35:00Z", RECLAIM_ID: None})
    assert body == {
        "metadata": {
            "uid": "u-1",
            "annotations": {DEADLINE: "2026-12-04T09:35:00Z", RECLAIM_ID: None},
        }
    }


def test_a_new_condition_begins_now() -> None:
    body = condition_patch("u-1", scheduled(), None, AT)
    assert body == {
        "metadata": {"uid": "u-1"},
        "status": {"conditions": [{**scheduled(), "lastTransitionTime": "2026-12-04T09:30:00Z"}]},
    }


def test_a_condition_whose_status_stays_keeps_its_transition_time() -> None:
    previous = {**scheduled("old"), "lastTransitionTime": "2026-12-04T09:00:00Z"}
    (sent,) = condition_patch("u-1", scheduled("new"), previous, AT)["status"]["conditions"]
    assert sent == {**scheduled("new"), "lastTransitionTime": "2026-12-04T09:00:00Z"}


def test_a_condition_whose_status_changes_moves_its_transition_time() -> None:
    previous = {**scheduled(), "lastTransitionTime": "2026-12-04T09:00:00Z"}
    (sent,) = condition_patch("u-1", WITHDRAWN, previous, AT)["status"]["conditions"]
    assert sent == {**WITHDRAWN, "lastTransitionTime": "2026-12-04T09:30:00Z"}


def test_a_previous_condition_without_a_transition_time_gets_one() -> None:
    """As the server stores one sent without it: ``null``."""
    previous = {**scheduled(), "lastTransitionTime": None}
    (sent,) = condition_patch("u-1", scheduled(), previous, AT)["status"]["conditions"]
    assert sent["lastTransitionTime"] == "2026-12-04T09:30:00Z"


def test_the_callers_transition_time_is_not_the_one_sent() -> None:
    given = {**scheduled(), "lastTransitionTime": "1999-01-01T00:00:00Z"}
    (sent,) = condition_patch("u-1", given, None, AT)["status"]["conditions"]
    assert sent["lastTransitionTime"] == "2026-12-04T09:30:00Z"


@pytest.mark.parametrize("condition", [{"status": "True"}, {"type": NOTICE}, {"type": ""}])
def test_a_condition_needs_a_type_and_a_status(condition: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="a type and a status"):
        condition_patch("u-1", condition, None, AT)


def test_a_pods_condition_is_found_by_type() -> None:
    ready = {"type": "Ready", "status": "True"}
    pod = {"status": {"conditions": [ready, {"type": NOTICE, "status": "False"}]}}
    assert pod_condition(pod, "Ready") == ready
    assert pod_condition(pod, "PodScheduled") is None
    assert pod_condition({"status": {}}, "Ready") is None


# ---------------------------------------------------------------------------------------------
# On the servers


def writer_of(w: World) -> KubeWriter:
    return KubeWriter(w.opened.core, RetryPolicy(sleep=no_sleep), clock=w.now)


def stored(w: World, name: str) -> Obj:
    pod: Obj = w.objects.get(PODS, NS, name)
    return pod


def annotations_of(w: World, name: str) -> dict[str, str]:
    return dict(stored(w, name)["metadata"].get("annotations") or {})


def conditions(w: World, name: str) -> dict[str, Obj]:
    """The pod's conditions by type, without the ``null`` members kube-apiserver echoes (an
    unset ``lastProbeTime``) and the emulator omits."""
    found = stored(w, name)["status"].get("conditions") or []
    return {c["type"]: {k: v for k, v in c.items() if v is not None} for c in found}


def annotate_as_someone_else(w: World, name: str, values: dict[str, str]) -> None:
    body = json.dumps({"metadata": {"annotations": values}}).encode()
    w.objects.patch(PODS, NS, name, MERGE, body)


def recreate(w: World, name: str) -> str:
    """The pod deleted and another made under its name; the new one's uid."""
    w.objects.delete(PODS, NS, name, DeleteOptions(grace_period=0))
    (again,) = training(w.objects, name.rsplit("-", 1)[0], 1, "gpu-0")
    assert again == name
    uid: str = stored(w, name)["metadata"]["uid"]
    return uid


async def test_our_annotations_are_set_and_removed_and_no_other_is_touched(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        theirs = {"example.com/owner": "ml-team", "rebalancer.io/last-checkpoint-time": "x"}
        annotate_as_someone_else(w, name, theirs)
        before = annotations_of(w, name)
        uid, writer = stored(w, name)["metadata"]["uid"], writer_of(w)

        ours = {DEADLINE: "2026-12-04T09:35:00Z", RECLAIM_ID: "r-1"}
        assert await writer.annotate_pod(NS, name, uid, ours) is True
        assert annotations_of(w, name) == {**before, **ours}

        assert await writer.annotate_pod(NS, name, uid, {DEADLINE: None, RECLAIM_ID: None})
        assert annotations_of(w, name) == before
        assert theirs.items() <= before.items()


async def test_our_condition_is_set_by_type_and_the_kubelets_stay(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        kubelets = conditions(w, name)
        assert kubelets["Ready"]["status"] == "True"  # the kubelet has written its own
        uid, writer = stored(w, name)["metadata"]["uid"], writer_of(w)
        began = w.now().strftime("%Y-%m-%dT%H:%M:%SZ")

        assert await writer.set_pod_condition(NS, name, uid, scheduled()) is True
        after = conditions(w, name)
        assert after.pop(NOTICE) == {**scheduled(), "lastTransitionTime": began}
        assert after == kubelets


async def test_the_transition_time_moves_only_when_the_status_changes(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        uid, writer = stored(w, name)["metadata"]["uid"], writer_of(w)
        began = w.now()
        assert await writer.set_pod_condition(NS, name, uid, scheduled("first"))

        w.advance(60)
        assert await writer.set_pod_condition(NS, name, uid, scheduled("second"))
        notice = conditions(w, name)[NOTICE]
        assert (notice["message"], notice["lastTransitionTime"]) == (
            "second",
            began.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )

        w.advance(60)
        assert await writer.set_pod_condition(NS, name, uid, WITHDRAWN)
        notice = conditions(w, name)[NOTICE]
        withdrawn_at = (began + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert notice == {**WITHDRAWN, "lastTransitionTime": withdrawn_at}
        assert conditions(w, name)["Ready"]["status"] == "True"


async def test_a_pod_recreated_under_the_name_is_not_written(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        judged, writer = stored(w, name)["metadata"]["uid"], writer_of(w)
        now = recreate(w, name)
        assert now != judged
        before = stored(w, name)

        assert await writer.annotate_pod(NS, name, judged, {RECLAIM_ID: "r-1"}) is False
        assert await writer.set_pod_condition(NS, name, judged, scheduled()) is False
        after = stored(w, name)
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert RECLAIM_ID not in (after["metadata"].get("annotations") or {})
        assert NOTICE not in conditions(w, name)
        # The pod it is now is written by its own uid.
        assert await writer.annotate_pod(NS, name, now, {RECLAIM_ID: "r-2"}) is True


async def test_a_pod_that_is_gone_is_not_written(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        writer = writer_of(w)
        assert await writer.annotate_pod(NS, "no-such-pod", "u", {RECLAIM_ID: "r-1"}) is False
        assert await writer.set_pod_condition(NS, "no-such-pod", "u", scheduled()) is False


async def test_a_pod_that_refuses_an_annotation_raises(backend: Backend) -> None:
    """A 422 on anything but the uid is the controller's mistake, not a pod gone."""
    async with world("gpu-0", backend=backend) as w:
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        uid, writer = stored(w, name)["metadata"]["uid"], writer_of(w)
        with pytest.raises(ApiFailure, match="422"):
            await writer.annotate_pod(NS, name, uid, {"not a key!": "x"})
        with pytest.raises(ApiFailure, match="422"):
            await writer.set_pod_condition(NS, name, uid, {"type": "not a type!", "status": "True"})


# ---------------------------------------------------------------------------------------------
# Answers the servers above do not give at will: a scripted API


@dataclass
class Response:
    status: int
    body: Obj

    async def read(self) -> bytes:
        return json.dumps(self.body).encode()

    def release(self) -> None:
        pass


UID_REFUSED = {
    "kind": "Status",
    "code": 422,
    "reason": "Invalid",
    "message": 'Pod "p" is invalid: metadata.uid: Invalid value: "u": field is immutable',
    "details": {
        "name": "p",
        "kind": "Pod",
        "causes": [
            {"reason": "FieldValueInvalid", "message": "field is immutable", "field": f}
            for f in ("metadata.uid", "metadata.uid")
        ],
    },
}


@dataclass
class Scripted:
    """A ``CoreV1Api`` stand-in: the pod ``p`` with uid ``u`` is listed, and each patch is
    answered with the next scripted status (and body)."""

    answers: list[tuple[int, Obj]]
    patches: list[tuple[str, Obj, str]] = field(default_factory=list)

    async def list_namespaced_pod(self, namespace: str, **_: Any) -> Response:
        return Response(200, {"items": [{"metadata": {"name": "p", "uid": "u"}, "status": {}}]})

    async def patch_namespaced_pod(self, name: str, namespace: str, body: Obj, **kw: Any) -> Any:
        return self._next("pod", body, kw["_content_type"])

    async def patch_namespaced_pod_status(
        self, name: str, namespace: str, body: Obj, **kw: Any
    ) -> Any:
        return self._next("status", body, kw["_content_type"])

    def _next(self, where: str, body: Obj, content_type: str) -> Response:
        self.patches.append((where, body, content_type))
        code, doc = self.answers[min(len(self.patches), len(self.answers)) - 1]
        return Response(code, doc)


def scripted(*answers: tuple[int, Obj]) -> tuple[KubeWriter, Scripted]:
    core = Scripted(list(answers))
    return KubeWriter(core, RetryPolicy(sleep=no_sleep), clock=lambda: AT), core


async def test_the_bodies_sent_are_the_builders_with_their_patch_types() -> None:
    writer, core = scripted((200, {}))
    assert await writer.annotate_pod("ns", "p", "u", {RECLAIM_ID: "r-1"})
    assert await writer.set_pod_condition("ns", "p", "u", scheduled())
    assert core.patches == [
        ("pod", annotations_patch("u", {RECLAIM_ID: "r-1"}), MERGE),
        (
            "status",
            condition_patch("u", scheduled(), None, AT),
            "application/strategic-merge-patch+json",
        ),
    ]


async def test_a_pod_recreated_between_the_read_and_the_patch_is_not_written() -> None:
    """The list found uid ``u``; the patch meets another pod, and the server refuses the uid."""
    writer, _ = scripted((422, UID_REFUSED))
    assert await writer.set_pod_condition("ns", "p", "u", scheduled()) is False
    assert await writer.annotate_pod("ns", "p", "u", {RECLAIM_ID: "r-1"}) is False


async def test_a_pod_listed_with_another_uid_is_not_patched() -> None:
    writer, core = scripted((200, {}))
    assert await writer.set_pod_condition("ns", "p", "not-u", scheduled()) is False
    assert core.patches == []


async def test_a_pod_write_is_retried_on_5xx_and_a_conflict_is_raised() -> None:
    writer, core = scripted((500, {}), (503, {}), (200, {}))
    assert await writer.annotate_pod("ns", "p", "u", {RECLAIM_ID: "r-1"}) is True
    assert len(core.patches) == 3
    writer, core = scripted((409, {"message": "the object has been modified"}), (200, {}))
    with pytest.raises(Conflict):
        await writer.set_pod_condition("ns", "p", "u", scheduled())
    assert len(core.patches) == 1


async def test_a_422_on_another_field_is_raised() -> None:
    other = json.loads(json.dumps(UID_REFUSED).replace("metadata.uid", "metadata.annotations"))
    writer, _ = scripted((422, other))
    with pytest.raises(ApiFailure, match="422"):
        await writer.annotate_pod("ns", "p", "u", {RECLAIM_ID: "r-1"})
