"""Two controllers with leader election against one server (the emulator, then a real
kube-apiserver): only one ever writes.

Both replicas run the whole write path (elector, leader gate, actuator, Kubernetes writer) and
both try to lend and reclaim the same nodes every second. Replica A leads until its renewals stop
(its elector is wedged, as when a partition or a hung request cuts it off) while its actuator
keeps trying to write: the gate must stop it at ``renew_deadline``, before B can take over when
the lease expires. Every write that reaches the server is recorded with its time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import convert
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.evictionrequests import RequestState, Target
from rebalancer.adapters.gate import LeaderGatedRequests, LeaderGatedWriter, NotLeader
from rebalancer.adapters.leadership import LeaderElector, Timings
from rebalancer.adapters.writer import KubeWriter
from rebalancer.core import model, nodestate, policy
from rebalancer.runtime import wiring
from sandbox.emulator.resources import NODES as NODES_RESOURCE
from tests.support.actuation import Recorder
from tests.support.backends import Backend, Opened

KEYS = nodestate.Keys()
TIMINGS = Timings(lease_duration=15, renew_deadline=10, retry_period=2)
MARKS = model.PodMarks(
    lend_taints=(model.Taint(KEYS.lent_taint, "NoSchedule", "training"),),
    serving_taints=(model.Taint("workload", "NoSchedule", "inference"),),
)
NODES = ("inference-0", "inference-1", "inference-2")


@dataclass
class Replica:
    identity: str
    elector: LeaderElector
    actuator: Actuator
    written: Recorder  # every write the server accepted from this replica, with its time
    refused: list[datetime] = field(default_factory=list)

    async def work(self, box: Opened, tick: int) -> None:
        """What a replica's reconcile loop would do: move one node along its cycle."""
        name = NODES[tick % len(NODES)]
        state = nodestate.read(convert.node_view(box.objects.get(NODES_RESOURCE, None, name)), KEYS)
        assert isinstance(state, nodestate.NodeState)
        try:
            if state.phase is nodestate.Phase.SERVING:
                result = await self.actuator.lend(name, f"{self.identity}-{tick}")
            elif state.phase is nodestate.Phase.LENT:
                deadline = box.clock() + timedelta(minutes=2)
                result = await self.actuator.reclaim(name, f"{self.identity}-{tick}", deadline)
            else:
                result = await self.actuator.progress(name)
        except NotLeader:
            self.refused.append(box.clock())
            return
        if "does not hold the lease" in result.message:
            self.refused.append(box.clock())


def replica(box: Opened, api: Any, identity: str) -> Replica:
    elector = LeaderElector(
        api,
        name="rebalancer",
        namespace="kube-system",
        identity=identity,
        timings=TIMINGS,
        clock=box.clock,
    )
    written = Recorder(KubeWriter(client.CoreV1Api(api)), clock=box.clock)
    gated = LeaderGatedWriter(written, elector.may_write, box.clock, identity)
    actuator = Actuator(gated, KEYS, policy.default_lend_spec(KEYS), MARKS, box.clock)
    return Replica(identity, elector, actuator, written)


async def test_two_replicas_never_write_at_the_same_time_even_when_the_leader_is_cut_off(
    backend: Backend,
) -> None:
    async with backend.open(seeded=True) as box, box.another_client() as other_api:
        a = replica(box, box.api, "replica-a")
        b = replica(box, other_api, "replica-b")
        wedged_at = box.clock() + timedelta(seconds=30)
        for tick in range(90):
            now = box.clock()
            if now < wedged_at:
                await a.elector.step()  # after this, A's renewals never happen again
            await b.elector.step()
            for r in (a, b):
                await r.work(box, tick)
            box.advance(1)

    by_a, by_b = a.written.times, b.written.times
    assert by_a, "the first leader wrote"
    assert by_b, "the second leader wrote after taking over"
    assert max(by_a) < min(by_b), "the two replicas' writes never interleave"
    # A stopped writing within renew_deadline of its last renewal (at most 2 s before wedging).
    assert max(by_a) < wedged_at + timedelta(seconds=TIMINGS.renew_deadline)
    # B wrote only once the lease had expired: lease_duration after A's last renewal.
    assert min(by_b) >= wedged_at - timedelta(seconds=TIMINGS.retry_period) + timedelta(
        seconds=TIMINGS.lease_duration
    )
    assert a.refused, "the cut-off leader's actuator kept trying and was refused locally"
    assert any(when < wedged_at for when in b.refused), "the follower was refused while A led"


@dataclass
class Told:
    """A ``NodeWriter`` that only notes which of the reclaim notice's pod writes reached it."""

    calls: list[str] = field(default_factory=list)

    async def get_node(self, name: str) -> Any:
        raise AssertionError("not asked here")

    async def list_nodes(self, label_selector: str) -> Any:
        raise AssertionError("not asked here")

    async def list_pods(self, node: str) -> Any:
        raise AssertionError("not asked here")

    async def patch_node(self, name: str, change: Any, resource_version: str) -> Any:
        raise AssertionError("not asked here")

    async def evict(self, namespace: str, name: str, uid: str) -> Any:
        raise AssertionError("not asked here")

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        raise AssertionError("not asked here")

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        self.calls.append(f"annotate {namespace}/{name} {uid} {dict(annotations)}")
        return True

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        self.calls.append(f"condition {namespace}/{name} {uid} {condition['type']}")
        return True


async def test_the_notices_pod_writes_pass_the_gate_only_while_leading() -> None:
    leading = [False]
    told = Told()
    gated = LeaderGatedWriter(told, lambda _: leading[0], datetime.now, "replica-a")
    notice = {"type": "rebalancer.io/ReclaimNotice", "status": "True"}
    with pytest.raises(NotLeader, match="pod/training/p"):
        await gated.annotate_pod("training", "p", "u", {"rebalancer.io/reclaim-id": "r"})
    with pytest.raises(NotLeader, match="pod/training/p"):
        await gated.set_pod_condition("training", "p", "u", notice)
    assert told.calls == []
    leading[0] = True
    assert await gated.annotate_pod("training", "p", "u", {"rebalancer.io/reclaim-id": "r"})
    assert await gated.set_pod_condition("training", "p", "u", notice)
    assert told.calls == [
        "annotate training/p u {'rebalancer.io/reclaim-id': 'r'}",
        "condition training/p u rebalancer.io/ReclaimNotice",
    ]


@dataclass
class Requests:
    """EvictionRequests that remember the calls made to them."""

    requester: str = "rebalancer.io/reclaim-notice"
    calls: list[str] = field(default_factory=list)

    async def served(self) -> bool:
        self.calls.append("served")
        return True

    async def state(self, target: Target) -> RequestState | None:
        self.calls.append("state")
        return None

    async def request(self, target: Target) -> RequestState:
        self.calls.append("request")
        raise AssertionError("not reached in these tests")

    async def withdraw(self, target: Target) -> RequestState | None:
        self.calls.append("withdraw")
        return None

    async def remove(self, target: Target) -> bool:
        self.calls.append("remove")
        return False


async def test_a_replica_that_does_not_lead_files_and_withdraws_no_eviction_request() -> None:
    inner = Requests()
    leads = [True]
    gated = LeaderGatedRequests(inner, lambda now: leads[0], wiring.utc_now, "replica-a")
    target = Target("training", "job-0", "uid-0")

    assert await gated.withdraw(target) is None
    leads[0] = False
    for call in (gated.request, gated.withdraw, gated.remove):
        with pytest.raises(NotLeader, match="replica-a does not hold the lease"):
            await call(target)
    assert await gated.served() is True
    assert await gated.state(target) is None
    assert inner.calls == ["withdraw", "served", "state"]
    assert gated.requester == inner.requester
