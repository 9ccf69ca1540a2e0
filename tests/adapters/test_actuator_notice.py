"""A reclaim's notice through the actuator, on the emulator and on a real kube-apiserver: the
node stays lent and its pods are told; the reclaim begins when they have answered or their
time is up; a withdrawal leaves the node lent and the pods untold; a reclaim that cannot wait
cuts the notice short (docs/design/reclaim-notice.md)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from rebalancer.core.nodestate import format_time, parse_time
from rebalancer.core.outcomes import Outcome, WriteKind
from sandbox.emulator.resources import PODS
from tests.support.actuation import KEYS, world
from tests.support.backends import Backend, Objects
from tests.support.objects import TAINTS, training
from tests.support.reads import node_obj

Obj = dict[str, Any]
NS = "training"
GRACE = 60  # the training pods' terminationGracePeriodSeconds
CONDITION = KEYS.notice_condition


def pod(objects: Objects, name: str) -> Obj:
    return objects.get(PODS, NS, name)


def annotate(objects: Objects, name: str, notes: dict[str, str]) -> None:
    body = json.dumps({"metadata": {"annotations": notes}}).encode()
    objects.patch(PODS, NS, name, "application/merge-patch+json", body)


def condition(obj: Obj) -> dict[str, str] | None:
    return next(
        (c for c in obj.get("status", {}).get("conditions", []) if c["type"] == CONDITION), None
    )


async def test_a_notice_leaves_the_node_lent_and_tells_each_pod_once(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "lend-1")
        names = training(w.objects, "job-a", 2, "gpu-0")
        lent = node_obj(w.objects, "gpu-0")
        deadline = w.now() + timedelta(minutes=5)

        told = await act.notice("gpu-0", "notice-1", deadline)

        assert told.outcome is Outcome.IN_PROGRESS
        kinds = [x.kind for x in told.writes]
        assert kinds == [WriteKind.NOTICE] + [WriteKind.TELL, WriteKind.CONDITION] * 2
        node = node_obj(w.objects, "gpu-0")
        assert node["spec"]["taints"] == lent["spec"]["taints"]  # still lent: nothing moved
        assert node["metadata"]["labels"][KEYS.state] == "lent"
        assert node["metadata"]["annotations"][KEYS.deadline] == format_time(deadline)
        assert node["metadata"]["annotations"][KEYS.decision] == "notice-1"
        for name in names:
            obj = pod(w.objects, name)
            notes = obj["metadata"]["annotations"]
            assert notes[KEYS.deadline] == format_time(deadline)
            assert notes[KEYS.reclaim_id] == "notice-1"
            told_condition = condition(obj)
            assert told_condition is not None
            assert (told_condition["status"], told_condition["reason"]) == (
                "True",
                "ReclaimScheduled",
            )
            # the kubelet's conditions are still there
            assert {c["type"] for c in obj["status"]["conditions"]} >= {"Ready", CONDITION}
        begins = format_time(deadline - timedelta(seconds=GRACE))
        assert f"evictions begin at {begins}" in told.message

        again = await act.progress("gpu-0")

        assert again.outcome is Outcome.IN_PROGRESS
        assert again.writes == ()  # told once


async def test_the_reclaim_begins_once_every_pod_acknowledged_the_reclaim_id(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "lend-1")
        first, second = training(w.objects, "job-a", 2, "gpu-0")
        await act.notice("gpu-0", "notice-1", w.now() + timedelta(minutes=5))
        w.advance(30)
        saved = format_time(w.now())
        annotate(w.objects, first, {KEYS.reclaim_ack: "notice-1", KEYS.last_checkpoint: saved})
        annotate(w.objects, second, {KEYS.reclaim_ack: "another-reclaim"})  # not this one

        waiting = await act.progress("gpu-0")

        assert waiting.outcome is Outcome.IN_PROGRESS
        assert "2 pod(s) told, 1 answered" in waiting.message
        annotate(w.objects, second, {KEYS.reclaim_ack: "notice-1", KEYS.last_checkpoint: saved})
        w.advance(30)

        begun = await act.progress("gpu-0")

        kinds = [x.kind for x in begun.writes]
        assert kinds[:3] == [WriteKind.BEGIN_RECLAIM, WriteKind.EVICT, WriteKind.EVICT]
        assert node_obj(w.objects, "gpu-0")["spec"]["taints"] == TAINTS  # serving taints back
        assert begun.notice is not None
        assert (begun.notice.pods, begun.notice.answered) == (2, 2)
        assert begun.notice.lost_gpu_seconds == 0
        assert begun.notice.given_seconds >= 60
        assert begun.notice.answer_seconds == (30.0, 30.0)
        assert begun.notice.why == "every borrowed pod answered"


async def test_pods_that_never_answer_are_evicted_at_the_deadline_less_their_grace(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "lend-1")
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        saved = pod(w.objects, name)["metadata"]["creationTimestamp"]  # one GPU, saved then
        annotate(w.objects, name, {KEYS.last_checkpoint: saved})
        deadline = w.now() + timedelta(minutes=5)
        await act.notice("gpu-0", "notice-1", deadline)
        w.advance(300 - GRACE - 1)

        still = await act.progress("gpu-0")

        assert still.outcome is Outcome.IN_PROGRESS
        assert [x.kind for x in still.writes] == []
        w.advance(1)

        begun = await act.progress("gpu-0")

        assert [x.kind for x in begun.writes][:2] == [WriteKind.BEGIN_RECLAIM, WriteKind.EVICT]
        assert begun.notice is not None
        assert begun.notice.answered == 0
        since = parse_time(saved)
        assert isinstance(since, datetime)
        lost = (w.now() - since).total_seconds()
        # since its checkpoint: the notice's 240 s, less the seconds between the test's clock
        # starting and the pod's creation (a real server's whole seconds, its wall clock)
        assert begun.notice.lost_gpu_seconds == 1 * lost >= 300 - GRACE - 5
        assert begun.notice.why == f"the deadline less the pods' grace ({GRACE} s)"


async def test_a_withdrawn_notice_leaves_the_node_lent_and_its_pods_untold(
    backend: Backend,
) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "lend-1")
        (name,) = training(w.objects, "job-a", 1, "gpu-0")
        await act.notice("gpu-0", "notice-1", w.now() + timedelta(minutes=5))

        withdrawn = await act.withdraw("gpu-0", "withdraw-1")

        assert withdrawn.outcome is Outcome.APPLIED
        kinds = [x.kind for x in withdrawn.writes]
        assert kinds == [WriteKind.TELL, WriteKind.CONDITION, WriteKind.WITHDRAW]
        node = node_obj(w.objects, "gpu-0")
        assert KEYS.deadline not in node["metadata"]["annotations"]
        assert node["metadata"]["labels"][KEYS.state] == "lent"
        obj = pod(w.objects, name)
        assert KEYS.reclaim_id not in obj["metadata"].get("annotations", {})
        gone = condition(obj)
        assert gone is not None
        assert (gone["status"], gone["reason"]) == ("False", "ReclaimWithdrawn")
        assert (await act.progress("gpu-0")).outcome is Outcome.NOTHING
        assert (await act.withdraw("gpu-0", "withdraw-2")).outcome is Outcome.NOTHING


async def test_a_reclaim_that_cannot_wait_cuts_the_notice_short(backend: Backend) -> None:
    async with world("gpu-0", backend=backend) as w:
        act = w.actuator(w.writer())
        await act.lend("gpu-0", "lend-1")
        training(w.objects, "job-a", 1, "gpu-0")
        await act.notice("gpu-0", "notice-1", w.now() + timedelta(minutes=5))
        w.advance(20)

        cut = await act.reclaim("gpu-0", "urgent-1", w.now() + timedelta(minutes=2))

        assert [x.kind for x in cut.writes][:2] == [WriteKind.BEGIN_RECLAIM, WriteKind.EVICT]
        assert cut.notice is not None
        assert cut.notice.why == "notice notice-1 cut short"
        assert cut.notice.reclaim == "notice-1"
        assert cut.notice.given_seconds >= 20
