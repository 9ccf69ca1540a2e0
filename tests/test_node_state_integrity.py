"""Node state that cannot be forged, on the process's own parts: the real informer, actuator
over the ``KubeWriter``, ``Reconciler`` and Events, on the emulator and on a real
kube-apiserver (the ``backend`` fixture). docs/design/node-state-integrity.md.

The cases: another writer marks a serving node lent with an original of its own making (the GPU
health taint listed as added by the lend, a foreign label as removed by it); a signed state
copied onto a node created again under its name; a rotation of the signing key; and an upgrade
from a release that wrote no signatures, with nodes lent. Whatever a state that does not verify
says, the node is reported (finding, Warning Event ``StateUnverified``) and made to serve
within what the pool's specification confirms: no foreign taint removed, no foreign label
written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import convert, events, ledger
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.adapters.events import KubeEvents
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Reason
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.seams import AlwaysLeader
from sandbox.emulator.resources import NODES
from sandbox.emulator.store import DeleteOptions
from sandbox.emulator.views import expected_views
from tests.support import backends, objects, pools
from tests.support.factories import T0
from tests.support.fakes import Demand
from tests.support.reads import scheduling
from tests.support.waits import Pulse, no_sleep, stop

Obj = dict[str, Any]
OLD = nodestate.SealKey(b"previous-key-" + b"o" * 40)
NEW = nodestate.SealKey(b"current-key-" + b"n" * 40)
SIGNED = nodestate.Keys(seal=nodestate.Seal(NEW))
ROTATING = nodestate.Keys(seal=nodestate.Seal(NEW, (OLD,)))
BEFORE_ROTATION = nodestate.Keys(seal=nodestate.Seal(OLD))
LAST_RELEASE = nodestate.Keys()  # wrote no signatures
KEYS = SIGNED
SPEC, MARKS, POOL = pools.SPEC, pools.MARKS, pools.POOL
NAMES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
HEALTH = {"key": "nvidia.com/gpu.unhealthy", "value": "true", "effect": "NoSchedule"}
LOW, HIGH = 150.0, 900.0  # 100 rps a node, 2 serving at least: lend 2 of 4; need all 4
_MERGE = "application/merge-patch+json"


@dataclass
class Cluster:
    opened: backends.Opened
    informer: Informer
    pulse: Pulse
    audit: MemoryAuditStore = field(default_factory=MemoryAuditStore)

    def node(self, name: str) -> Obj:
        found: Obj = self.opened.objects.get(NODES, None, name)
        return found

    def patch(self, name: str, body: Obj) -> None:
        """Another writer's merge patch, with the resourceVersion it read."""
        body.setdefault("metadata", {})["resourceVersion"] = self.node(name)["metadata"][
            "resourceVersion"
        ]
        self.opened.objects.patch(NODES, None, name, _MERGE, json.dumps(body).encode())

    async def caught_up(self) -> None:
        store = self.opened.objects
        await self.pulse.until(
            lambda: self.informer.node_views(MARKS) == expected_views(store, MARKS), within=10
        )

    def process(self, keys: nodestate.Keys, demand: float) -> Reconciler:
        """A controller process signing with ``keys``; the audit store outlives it."""
        clock = self.opened.clock
        writer = KubeWriter(self.opened.core, RetryPolicy(sleep=no_sleep))
        return Reconciler(
            [pools.reactive_pool()],
            observer=Observer(
                [pools.reactive_pool()],
                views=self.informer,
                metrics=Demand({POOL: demand}, clock),
                keys=keys,
            ),
            clock=clock,
            actuators={POOL: Actuator(writer, keys, SPEC, MARKS, clock)},
            audit_log=AuditLog(self.audit, sink=None, new_id=UlidFactory(clock)),
            leadership=AlwaysLeader(now=clock),
            keys=keys,
            events=KubeEvents(self.opened.api, instance="replica-a", clock=clock, keys=keys),
        )

    async def tick(self, keys: nodestate.Keys, demand: float, ticks: int = 1) -> None:
        controller = self.process(keys, demand)
        for _ in range(ticks):
            await self.caught_up()
            self.opened.advance(5)
            await controller.tick()
        await self.caught_up()

    def findings(self, reason: Reason) -> list[str]:
        return [
            str(r.node)
            for r in self.audit.records
            if r.kind is Kind.FINDING and r.reason == reason.value
        ]

    async def warnings(self) -> list[tuple[str, str]]:
        found = await client.EventsV1Api(self.opened.api).list_namespaced_event(events.NAMESPACE)
        return [
            (e.regarding.name, e.reason)
            for e in found.items
            if e.regarding is not None and e.regarding.kind == "Node" and e.type == "Warning"
        ]


@asynccontextmanager
async def cluster(backend: backends.Backend) -> AsyncIterator[Cluster]:
    """Four idle inference nodes (the default pool's taints and labels, a DaemonSet pod)."""
    async with backend.open() as opened:
        for name in NAMES:
            objects.add(opened.objects, objects.gpu_node(name))
            objects.add(opened.objects, objects.daemon_pod(name))
        pulse = Pulse()
        informer = Informer(
            opened.api, settings=WatchSettings(timeout_seconds=86_400), on_change=pulse
        )
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            yield Cluster(opened, informer, pulse)
        finally:
            await stop(task)


def lent_names(c: Cluster) -> list[str]:
    return [n for n in NAMES if (c.node(n)["metadata"].get("labels") or {}).get(KEYS.state)]


def forge(c: Cluster, name: str) -> None:
    """The issue's forgery on a serving node that carries the GPU health taint: the state label
    ``lent`` and an original that lists that taint as added and ``evil.example/x=1`` as
    removed. A kubelet under NodeRestriction may write exactly these (labels, annotations)."""
    taints = [t for t in c.node(name)["spec"]["taints"] if t != HEALTH]  # "before the lend"
    original = {
        "v": 2,
        "taints": taints,
        "labels": {"evil.example/x": "1"},
        "added": [HEALTH],
        "removed": [],
    }
    c.patch(
        name,
        {
            "metadata": {
                "labels": {KEYS.state: "lent"},
                "annotations": {KEYS.original: json.dumps(original)},
            }
        },
    )


async def test_a_forged_original_neither_strips_a_taint_nor_writes_a_label(
    backend: backends.Backend,
) -> None:
    async with cluster(backend) as c:
        victim = "gpu-0"
        node = c.node(victim)
        c.patch(victim, {"spec": {"taints": [*node["spec"]["taints"], HEALTH]}})
        forge(c, victim)

        await c.tick(KEYS, HIGH)

        after = c.node(victim)
        assert HEALTH in after["spec"]["taints"], "the GPU health taint was removed"
        assert "evil.example/x" not in after["metadata"]["labels"], "the forged label was written"
        assert KEYS.state not in after["metadata"]["labels"]  # serving again, from the spec
        assert {"key": "workload", "value": "inference", "effect": "NoSchedule"} in after["spec"][
            "taints"
        ]
        assert c.findings(Reason.STATE_UNVERIFIED) == [victim]
        assert (victim, "StateUnverified") in await c.warnings()


async def test_a_signed_state_copied_onto_a_node_created_again_does_not_verify(
    backend: backends.Backend,
) -> None:
    async with cluster(backend) as c:
        await c.tick(KEYS, LOW)
        lent = lent_names(c)
        assert lent, "nothing was lent"
        victim = lent[0]
        old = c.node(victim)
        c.opened.objects.delete(NODES, None, victim, DeleteOptions())
        again = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": victim,
                "labels": old["metadata"]["labels"],
                "annotations": old["metadata"]["annotations"],
            },
            "spec": {"taints": old["spec"]["taints"]},
            "status": old["status"],
        }
        objects.add(c.opened.objects, again)
        assert c.node(victim)["metadata"]["uid"] != old["metadata"]["uid"]

        await c.tick(KEYS, LOW)

        assert c.findings(Reason.STATE_UNVERIFIED) == [victim]
        assert (victim, "StateUnverified") in await c.warnings()
        back = c.node(victim)
        assert KEYS.state not in back["metadata"]["labels"]
        assert KEYS.lent_taint not in {t["key"] for t in back["spec"]["taints"]}


async def test_a_rotation_accepts_the_previous_key_and_the_next_write_signs_with_the_new(
    backend: backends.Backend,
) -> None:
    async with cluster(backend) as c:
        await c.tick(BEFORE_ROTATION, LOW)
        lent = lent_names(c)
        assert lent
        signatures = {n: c.node(n)["metadata"]["annotations"][KEYS.signature] for n in lent}
        assert {s.split(":")[1] for s in signatures.values()} == {OLD.id}

        await c.tick(ROTATING, LOW)  # the new key configured, the old one still accepted

        assert lent_names(c) == lent, "a node signed with the previous key was taken back"
        assert c.findings(Reason.STATE_UNVERIFIED) == []

        await c.tick(ROTATING, HIGH, ticks=2)

        for name in lent:
            meta = c.node(name)["metadata"]
            assert KEYS.state not in meta["labels"]
            assert meta["annotations"][KEYS.signature].split(":")[1] == NEW.id
        assert c.findings(Reason.STATE_UNVERIFIED) == []


async def test_an_upgrade_with_nodes_lent_restores_them_exactly_and_says_why(
    backend: backends.Backend,
) -> None:
    """Nodes lent by a release that wrote no signatures are taken back by the one that checks
    them, from their own originals as far as the pool's specification confirms them: for an
    ordinary lend, that is all of it, and each node ends as it was before, byte for byte."""
    async with cluster(backend) as c:
        before = {n: scheduling(c.node(n)) for n in NAMES}
        await c.tick(LAST_RELEASE, LOW)
        lent = lent_names(c)
        assert lent
        assert all(KEYS.signature not in c.node(n)["metadata"]["annotations"] for n in lent)

        await c.tick(KEYS, LOW)  # one tick: the next one lends them again, signed

        assert sorted(c.findings(Reason.STATE_UNVERIFIED)) == sorted(lent)
        for name in lent:
            assert scheduling(c.node(name)) == before[name], f"{name} not restored exactly"


def a_record(ident: str, node: str) -> AuditRecord:
    return AuditRecord(
        id=ident,
        time=T0,
        kind=Kind.INTENT,
        pool=str(POOL),
        controller="replica-a",
        reason="demand_above_serving",
        message="kept on the node while the store fails",
        node=node,
        action=model.Action.RECLAIM,
    )


async def test_pending_audit_records_reach_the_store_only_if_the_controller_wrote_them(
    backend: backends.Backend,
) -> None:
    """The records the ledger keeps on a Node while the store fails carry a signature of their
    own: another writer's records are not taken for the controller's, and the ledger never
    signs over them."""
    async with cluster(backend) as c:
        writer = KubeWriter(c.opened.core, RetryPolicy(sleep=no_sleep))
        kept = ledger.NodeLedger(writer, KEYS)
        await kept.hold("gpu-1", [a_record("R1", "gpu-1")], "disk full")

        view = convert.node_view(c.node("gpu-1"))
        assert [r.id for r in kept.kept(view)] == ["R1"]
        assert ledger.signature(KEYS) in view.annotations

        text = json.dumps([audit.to_json(a_record("F1", "gpu-2"))])
        c.patch("gpu-2", {"metadata": {"annotations": {ledger.annotation(KEYS): text}}})
        with pytest.raises(ledger.NotKept, match="not signed"):
            kept.kept(convert.node_view(c.node("gpu-2")))

        await kept.hold("gpu-2", [a_record("R2", "gpu-2")], "disk full")
        assert [r.id for r in kept.kept(convert.node_view(c.node("gpu-2")))] == ["R2"]
