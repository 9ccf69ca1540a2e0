"""The leader gate: a ``NodeWriter`` (and a notice's ``EvictionRequests``) that lets writes
through only while this replica leads.

Where it sits: between the actuator and the Kubernetes writer, so that no code path can write
without holding the Lease. The check is made immediately before each write, on the clock the
elector uses, and ``may_write`` turns false at ``renew_deadline`` after the last renewal began,
before the lease can expire: a replica whose renewals hang stops writing before another can
take over (docs/design/leadership.md). Reads are never gated; a follower keeps its cache warm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from rebalancer.adapters.evictionrequests import EvictionRequests, RequestState, Target
from rebalancer.adapters.writer import NodeWriter, Obj, WriteError
from rebalancer.core.nodestate import NodeChange
from rebalancer.core.outcomes import WriteOutcome


class NotLeader(WriteError):
    """A write refused locally: this replica does not hold the lease now."""


class LeaderGatedWriter:
    def __init__(
        self,
        inner: NodeWriter,
        may_write: Callable[[datetime], bool],
        clock: Callable[[], datetime],
        identity: str,
    ) -> None:
        self.inner, self.may_write, self.clock, self.identity = inner, may_write, clock, identity

    def _check(self, target: str) -> None:
        if not self.may_write(self.clock()):
            raise NotLeader(target, 0, f"{self.identity} does not hold the lease: not written")

    async def get_node(self, name: str) -> Obj:
        return await self.inner.get_node(name)

    async def list_nodes(self, label_selector: str) -> list[Obj]:
        return await self.inner.list_nodes(label_selector)

    async def list_pods(self, node: str) -> list[Obj]:
        return await self.inner.list_pods(node)

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        self._check(f"node/{name}")
        return await self.inner.patch_node(name, change, resource_version)

    async def evict(self, namespace: str, name: str, uid: str) -> WriteOutcome:
        self._check(f"pod/{namespace}/{name}")
        return await self.inner.evict(namespace, name, uid)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        self._check(f"pod/{namespace}/{name}")
        return await self.inner.delete_pod(namespace, name, uid)

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        self._check(f"pod/{namespace}/{name}")
        return await self.inner.annotate_pod(namespace, name, uid, annotations)

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        self._check(f"pod/{namespace}/{name}")
        return await self.inner.set_pod_condition(namespace, name, uid, condition)


class LeaderGatedRequests:
    """The same gate on a reclaim notice's EvictionRequests (``adapters.evictionrequests``):
    filed, withdrawn or removed only while this replica leads; what is read is not gated."""

    def __init__(
        self,
        inner: EvictionRequests,
        may_write: Callable[[datetime], bool],
        clock: Callable[[], datetime],
        identity: str,
    ) -> None:
        self.inner, self.may_write, self.clock, self.identity = inner, may_write, clock, identity
        self.requester = inner.requester

    def _check(self, target: Target) -> None:
        if not self.may_write(self.clock()):
            where = f"evictionrequest/{target.namespace}/{target.name}"
            raise NotLeader(where, 0, f"{self.identity} does not hold the lease: not written")

    async def served(self) -> bool:
        return await self.inner.served()

    async def state(self, target: Target) -> RequestState | None:
        return await self.inner.state(target)

    async def request(self, target: Target) -> RequestState:
        self._check(target)
        return await self.inner.request(target)

    async def withdraw(self, target: Target) -> RequestState | None:
        self._check(target)
        return await self.inner.withdraw(target)

    async def remove(self, target: Target) -> bool:
        self._check(target)
        return await self.inner.remove(target)
