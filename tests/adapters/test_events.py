"""Kubernetes Events for node transitions and refused overrides, on the emulator and on a real
kube-apiserver."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import events
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.events import KubeEvents
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core import model
from rebalancer.core.nodestate import Keys
from rebalancer.core.outcomes import ActionResult, Outcome
from rebalancer.core.policy import default_lend_spec
from sandbox.emulator.resources import NODES
from tests.support.backends import Opened
from tests.support.factories import T0

KEYS = Keys()
SPEC = default_lend_spec(KEYS)
MARKS = model.PodMarks(
    lend_taints=SPEC.add_taints,
    serving_taints=SPEC.remove_taints,
    inference_selector={"app": "llm-serving"},
)
NODE = "inference-5"  # idle


async def listed(box: Opened) -> list[Any]:
    """The Events about Nodes in ``default``, in the order they were created.

    A real kube-apiserver writes Events of its own there (its ClusterIP repair loop reports on
    the ``kubernetes`` Service whenever it runs), and those are not this controller's.
    """
    found = await client.EventsV1Api(box.api).list_namespaced_event(events.NAMESPACE)
    about_nodes = [e for e in found.items if e.regarding is not None and e.regarding.kind == "Node"]
    return sorted(about_nodes, key=lambda e: int(e.metadata.resource_version))


def recorder(box: Opened) -> KubeEvents:
    return KubeEvents(box.api, instance="replica-a", clock=box.clock)


async def test_lend_reclaim_restored_events(seeded: Opened) -> None:
    box = seeded
    actuator = Actuator(KubeWriter(client.CoreV1Api(box.api)), KEYS, SPEC, MARKS, box.clock)
    rec = recorder(box)
    lent = await actuator.lend(NODE, "D1")
    assert lent.outcome is Outcome.APPLIED
    await rec.action(lent, "D1")
    back = await actuator.reclaim(NODE, "D2", box.clock() + timedelta(minutes=2))
    assert back.outcome is Outcome.APPLIED
    await rec.action(back, "D2")

    items = await listed(box)
    assert [e.reason for e in items] == [events.LENT, events.RECLAIMING, events.RESTORED]
    for e in items:
        assert e.type == "Normal"
        assert e.metadata.namespace == "default"
        assert (e.regarding.kind, e.regarding.name, e.regarding.api_version) == (
            "Node",
            NODE,
            "v1",
        )
        assert e.reporting_controller == events.CONTROLLER
        assert e.reporting_instance == "replica-a"
    assert [e.action for e in items] == ["Lend", "Reclaim", "Reclaim"]
    assert "(decision D1)" in items[0].note
    assert "(decision D2)" in items[2].note
    assert "serves inference again" in items[2].note
    assert rec.failures == 0


async def test_nothing_recorded_for_refusals_and_dry_run(seeded: Opened) -> None:
    rec = recorder(seeded)
    await rec.action(
        ActionResult(NODE, model.Action.LEND, Outcome.REFUSED, "node is lent, not serving")
    )
    await rec.action(
        ActionResult(NODE, model.Action.RECLAIM, Outcome.NOTHING, "node is already serving")
    )
    dry = Actuator(KubeWriter(client.CoreV1Api(seeded.api)), KEYS, SPEC, MARKS, seeded.clock, True)
    planned = await dry.lend(NODE, "D3")
    assert planned.dry_run
    await rec.action(planned)
    assert await listed(seeded) == []


def plan_with(*findings: model.Finding) -> model.Plan:
    pool = model.PoolName("inference")
    pool_plan = model.PoolPlan(pool, (), (), (), tuple(findings), "")
    return model.Plan(now=T0, pools={pool: pool_plan})


async def test_refused_override_recorded_once_per_bad_value(seeded: Opened) -> None:
    rec = recorder(seeded)
    bad = model.Finding(
        model.NodeName(NODE),
        KEYS.prefix + "lend",
        "sometimes",
        model.Reason.BAD_OVERRIDE,
        f"{KEYS.prefix}lend='sometimes' is ignored: must be never, auto or now",
    )
    for _ in range(5):  # five ticks see the same bad value
        await rec.findings(plan_with(bad))
    items = await listed(seeded)
    assert len(items) == 1
    (event,) = items
    assert event.type == "Warning"
    assert event.reason == events.OVERRIDE_REFUSED
    assert event.regarding.name == NODE
    assert event.regarding.kind == "Node"
    # The finding's message names the key and quotes the value: the note copies it once.
    assert event.note == (
        f"annotation refused: {KEYS.prefix}lend='sometimes' is ignored: must be never, auto or now"
    )
    # Another bad value for the same key is a new problem: one more Event, once.
    worse = model.Finding(
        model.NodeName(NODE), KEYS.prefix + "lend", "maybe", model.Reason.BAD_OVERRIDE, "bad"
    )
    for _ in range(3):
        await rec.findings(plan_with(bad, worse))
    assert len(await listed(seeded)) == 2


async def test_a_failed_create_is_tried_again(seeded: Opened) -> None:
    rec = KubeEvents(seeded.api, instance="", clock=seeded.clock)  # invalid: no instance
    bad = model.Finding(
        model.NodeName(NODE), KEYS.prefix + "paused", "yes", model.Reason.BAD_OVERRIDE, "bad"
    )
    await rec.findings(plan_with(bad))
    assert rec.failures == 1
    assert await listed(seeded) == []
    rec.instance = "replica-a"
    await rec.findings(plan_with(bad))
    await rec.findings(plan_with(bad))
    assert len(await listed(seeded)) == 1


async def test_events_are_named_by_node_and_a_stamp_that_never_repeats(seeded: Opened) -> None:
    rec = KubeEvents(seeded.api, instance="replica-a", clock=seeded.clock, stamps=lambda: 255)
    findings = [
        model.Finding(model.NodeName(NODE), KEYS.prefix + "lend", v, model.Reason.BAD_OVERRIDE, "")
        for v in ("a", "b")
    ]
    await rec.findings(plan_with(*findings))  # one instant, one stamp: still two names
    assert [e.metadata.name for e in await listed(seeded)] == [f"{NODE}.ff", f"{NODE}.100"]
    assert rec.failures == 0
    assert events.event_name("n" * 253, 255) == "n" * 250 + ".ff"  # a name stays <= 253


async def test_every_event_names_the_cluster_in_an_annotation_under_the_key_prefix(
    seeded: Opened,
) -> None:
    keys = Keys(prefix="gpu.example.com/")
    rec = KubeEvents(
        seeded.api, instance="replica-a", clock=seeded.clock, cluster="prod-eu-1", keys=keys
    )
    bad = model.Finding(
        model.NodeName(NODE), keys.prefix + "lend", "sometimes", model.Reason.BAD_OVERRIDE, "bad"
    )
    await rec.findings(plan_with(bad))
    unnamed = recorder(seeded)  # a controller left without a cluster_name
    await unnamed.findings(plan_with(bad))

    named, default = await listed(seeded)
    assert named.metadata.annotations == {"gpu.example.com/cluster": "prod-eu-1"}
    assert default.metadata.annotations == {"rebalancer.io/cluster": "default"}
    # the rest is as it was: the replica reports, and the note is for the cluster's own readers
    assert (named.reporting_instance, named.note) == (default.reporting_instance, default.note)


def plan_refusing(*rejections: model.Rejection) -> model.Plan:
    pool = model.PoolName("inference")
    pool_plan = model.PoolPlan(pool, (), (), tuple(rejections), (), "")
    return model.Plan(now=T0, pools={pool: pool_plan})


async def test_a_refused_lend_now_is_an_event_on_the_node_while_it_lasts(seeded: Opened) -> None:
    rec = recorder(seeded)
    asked = model.Intent(
        model.PoolName("inference"),
        model.Action.LEND,
        1,
        model.Origin.OPERATOR,
        model.Reason.OPERATOR_LEND_NOW,
        "an operator asked to lend this node now",
        node=model.NodeName(NODE),
    )
    refused = model.Rejection(
        asked, model.Reason.MIN_SERVING, "2 must serve", 1, model.NodeName(NODE)
    )
    pool_wide = model.Rejection(
        dataclasses.replace(asked, origin=model.Origin.STRATEGY, node=None),
        model.Reason.HEADROOM,
        "demand needs 4 of 8 nodes",
        2,
    )
    for _ in range(3):  # three ticks refuse it: one Event
        await rec.findings(plan_refusing(refused, pool_wide))
    await rec.findings(plan_refusing())  # granted, or the annotation taken off
    await rec.findings(plan_refusing(refused))  # asked again, refused again: a new Event
    items = await listed(seeded)
    assert [(e.type, e.reason, e.action, e.regarding.name) for e in items] == [
        ("Warning", events.REQUEST_REFUSED, "Refuse", NODE)
    ] * 2
    assert items[0].note == (
        "lend asked by an operator (operator_lend_now) refused for now: min_serving: 2 must serve"
    )


async def test_a_restore_that_kept_other_writers_taints_names_them_in_its_events(
    seeded: Opened,
) -> None:
    actuator = Actuator(KubeWriter(client.CoreV1Api(seeded.api)), KEYS, SPEC, MARKS, seeded.clock)
    rec = recorder(seeded)
    await actuator.lend(NODE, "D1")
    node = seeded.objects.get(NODES, None, NODE)
    unhealthy = {"key": "nvidia.com/gpu.unhealthy", "value": "true", "effect": "NoSchedule"}
    body = json.dumps({"spec": {"taints": [*node["spec"]["taints"], unhealthy]}}).encode()
    seeded.objects.patch(NODES, None, NODE, "application/merge-patch+json", body)
    back = await actuator.reclaim(NODE, "D2", seeded.clock() + timedelta(minutes=2))
    await rec.action(back, "D2")
    reclaiming, restored = await listed(seeded)
    kept = "kept taints other writers own: nvidia.com/gpu.unhealthy=true:NoSchedule"
    assert (reclaiming.reason, restored.reason) == (events.RECLAIMING, events.RESTORED)
    assert kept in reclaiming.note
    assert restored.note == f"restored: the node serves inference again; {kept} (decision D2)"


def held(*pods: str) -> ActionResult:
    return ActionResult(
        NODE, model.Action.PROGRESS, Outcome.IN_PROGRESS, "1 pod(s) of the loan left", held=pods
    )


async def test_a_drain_a_finalizer_holds_is_one_warning_per_change(seeded: Opened) -> None:
    rec = recorder(seeded)
    pod = "training/job-a-0 (example.com/checkpoint)"
    for _ in range(4):  # four passes find the same pod held by the same finalizer
        await rec.action(held(pod), "D2")
    await rec.action(held(pod, "training/job-a-1 (example.com/checkpoint)"), "D2")  # another
    await rec.action(held(), "D2")  # let go (before the deadline, or the pods went)
    await rec.action(held(pod), "D2")  # held again: told again
    items = await listed(seeded)
    assert [(e.type, e.reason, e.action) for e in items] == [
        ("Warning", events.DRAIN_BLOCKED, "Reclaim")
    ] * 3
    assert items[0].note == (
        "reclaim past its deadline held by finalizers nobody removes: "
        f"{pod}; the node stays reclaiming (counted away) (decision D2)"
    )


def test_a_checkpoint_not_believed_is_reported_not_called_a_refused_override() -> None:
    """It is a pod's word on its own work, not an operator's request: nothing was refused."""
    finding = model.Finding(
        model.NodeName("n"),
        "rebalancer.io/last-checkpoint-time",
        "soon",
        model.Reason.CHECKPOINT_NOT_BELIEVED,
        "pod ns/p: rebalancer.io/last-checkpoint-time='soon' is not believed: ...",
    )
    event = events.finding_event(finding)
    assert (event.type, event.reason, event.action) == (
        "Warning",
        "CheckpointNotBelieved",
        "Report",
    )
    assert event.note == finding.message
