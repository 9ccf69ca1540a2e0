"""Every actuator call's node transitions recorded as Kubernetes Events.

Where it sits: ``runtime.wiring`` puts each pool's ``adapters.actuator.Actuator`` inside a
``RecordingActuator`` over the controller's ``EventRecorder`` (``adapters.events.KubeEvents``,
or ``NoEvents`` in a dry run) before handing it to the reconciler. In the runtime rather than
beside ``adapters.events``: it joins two of the runtime's seams (``NodeActuator``,
``EventRecorder``), and adapters import nothing of the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rebalancer.core.outcomes import ActionResult
from rebalancer.runtime.seams import EventRecorder, NodeActuator


@dataclass
class RecordingActuator:
    """A ``NodeActuator`` that records each call's node transitions as Kubernetes Events.

    A decorator rather than calls in the reconciler, so that every path that moves a node (the
    reconcile loop, start-up recovery, ``rebalancer reclaim``) records the same Events."""

    inner: NodeActuator
    events: EventRecorder

    async def lend(self, node: str, decision: str) -> ActionResult:
        result = await self.inner.lend(node, decision)
        await self.events.action(result, decision)
        return result

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        result = await self.inner.reclaim(node, decision, deadline, uid=uid)
        await self.events.action(result, decision)
        return result

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        result = await self.inner.notice(node, decision, deadline, uid=uid)
        await self.events.action(result, decision)
        return result

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        result = await self.inner.withdraw(node, decision)
        await self.events.action(result, decision)
        return result

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        result = await self.inner.progress(node, decision, uid=uid, deadline=deadline)
        await self.events.action(result, decision)
        return result

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        result = await self.inner.remove_earlier(node, decision, deadline)
        await self.events.action(result, decision)
        return result
