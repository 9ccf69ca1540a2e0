"""The actuator's test kit: a node set up to show a restore that is not exact, a writer that
records (and can crash), and ``drive``, which runs progress passes on the emulator's clock.

``world(*nodes)`` serves an empty emulator holding only ``nodes``, each an inference node with
``objects.TAINTS`` (several taints in a deliberate order, one with ``timeAdded``) and a DaemonSet
pod; ``World.actuator`` is the real ``Actuator`` with ``SPEC`` and ``MARKS``, over the real
``KubeWriter`` wrapped in a ``Recorder``. The tests of the actuator, its crash safety, its
faults, the writer and the leader gate build on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter, NodeWriter, RetryPolicy
from rebalancer.core import model
from rebalancer.core.nodestate import Keys, LendSpec, NodeChange
from rebalancer.core.outcomes import ActionResult, Outcome, WriteKind, WriteOutcome
from tests.support import backends, emulated, objects
from tests.support.waits import no_sleep

Obj = dict[str, Any]
KEYS = Keys()
LEND = model.Taint(KEYS.lent_taint, "NoSchedule", "training")
SERVE = model.Taint("workload", "NoSchedule", "inference")
SPEC = LendSpec(
    remove_taints=(SERVE,),
    add_taints=(LEND,),
    labels={"gpu-pool": "training", "example.com/lent-to": "training"},
)
MARKS = model.PodMarks(
    lend_taints=(LEND,), serving_taints=(SERVE,), inference_selector={"app": "llm-serving"}
)
# The edges of the state machine (nodestate), by the state label before and after a write:
# anything else, such as lending -> lending, would be a transition applied twice.
EDGES = {
    ("serving", "lending"),
    ("lending", "lent"),
    ("lending", "serving"),  # a rolled-back lend
    ("lent", "reclaiming"),
    ("reclaiming", "serving"),
}
# The state label each kind of state write leaves on the node.
STATE_OF_WRITE = {
    WriteKind.BEGIN_LEND: "lending",
    WriteKind.FINISH_LEND: "lent",
    WriteKind.BEGIN_RECLAIM: "reclaiming",
    WriteKind.FINISH: "serving",
}


class Crash(BaseException):
    """The controller process dies here (raised by ``Recorder`` after its k-th write). Not an
    ``Exception``, as ``SystemExit`` is not: nothing in the process handles it as a failure
    it lives through (a step that raises an ``Exception`` is closed as failed, and the rest
    of its wave goes on); it ends the tick and everything in flight, as a death would."""


@dataclass
class Forwarding:
    """A ``NodeWriter`` that hands every call to ``inner``: a test's writer overrides only the
    calls it watches or meddles with."""

    inner: NodeWriter

    async def get_node(self, name: str) -> Obj:
        return await self.inner.get_node(name)

    async def list_nodes(self, label_selector: str) -> list[Obj]:
        return await self.inner.list_nodes(label_selector)

    async def list_pods(self, node: str) -> list[Obj]:
        return await self.inner.list_pods(node)

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        return await self.inner.patch_node(name, change, resource_version)

    async def evict(self, namespace: str, name: str, uid: str) -> WriteOutcome:
        return await self.inner.evict(namespace, name, uid)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        return await self.inner.delete_pod(namespace, name, uid)

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        return await self.inner.annotate_pod(namespace, name, uid, annotations)

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        return await self.inner.set_pod_condition(namespace, name, uid, condition)


@dataclass
class Recorder(Forwarding):
    """A ``NodeWriter`` that logs every write the actuator makes, and can crash after the k-th.

    ``states`` holds, per node, the state label each applied node patch wrote (``"serving"`` for
    its removal): the transitions as the cluster saw them.
    """

    crash_after: int | None = None
    clock: Callable[[], datetime] | None = None  # when given, ``times`` has each write's time
    writes: list[tuple[str, str]] = field(default_factory=list)  # (kind, target)
    states: dict[str, list[str]] = field(default_factory=dict)
    times: list[datetime] = field(default_factory=list)

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Obj:
        out = await self.inner.patch_node(name, change, resource_version)
        if KEYS.state in change.labels:
            self.states.setdefault(name, []).append(change.labels[KEYS.state] or "serving")
        self._wrote("patch", f"node/{name}")
        return out

    async def evict(self, namespace: str, name: str, uid: str) -> WriteOutcome:
        out = await self.inner.evict(namespace, name, uid)
        self._wrote("evict", f"{namespace}/{name}")
        return out

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        out = await self.inner.delete_pod(namespace, name, uid)
        self._wrote("delete", f"{namespace}/{name}")
        return out

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        out = await self.inner.annotate_pod(namespace, name, uid, annotations)
        self._wrote("annotate", f"{namespace}/{name}")
        return out

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        out = await self.inner.set_pod_condition(namespace, name, uid, condition)
        self._wrote("condition", f"{namespace}/{name}")
        return out

    def _wrote(self, kind: str, target: str) -> None:
        self.writes.append((kind, target))
        if self.clock is not None:
            self.times.append(self.clock())
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            raise Crash(f"crashed after write {len(self.writes)}: {kind} {target}")

    @property
    def pod_targets(self) -> set[str]:
        return {target for kind, target in self.writes if kind in ("evict", "delete")}


@dataclass
class World:
    opened: backends.Opened

    @property
    def objects(self) -> backends.Objects:
        """The cluster behind the controller's back (the emulator's store, or the real server)."""
        objects: backends.Objects = self.opened.objects
        return objects

    @property
    def box(self) -> emulated.Sandbox:
        """The emulator itself (faults, its request log): emulator-only tests."""
        if self.opened.box is None:
            raise TypeError("this test needs the emulator")
        return self.opened.box

    def writer(self, crash_after: int | None = None) -> Recorder:
        # On the actuator's clock, as the controller wires it: a condition's time is comparable.
        inner = KubeWriter(self.opened.core, RetryPolicy(sleep=no_sleep), clock=self.opened.clock)
        return Recorder(inner, crash_after)

    def actuator(self, writer: NodeWriter, dry_run: bool = False) -> Actuator:
        return Actuator(writer, KEYS, SPEC, MARKS, self.opened.clock, dry_run=dry_run)

    def now(self) -> datetime:
        return self.opened.clock()

    def advance(self, seconds: float) -> None:
        self.opened.advance(seconds)

    def add_node(self, name: str) -> None:
        objects.add(self.objects, objects.gpu_node(name))
        objects.add(self.objects, objects.daemon_pod(name))


@asynccontextmanager
async def world(*nodes: str, backend: backends.Backend = backends.EMULATOR) -> AsyncIterator[World]:
    """A cluster holding only ``nodes`` on ``backend`` (the emulator unless told)."""
    async with backend.open() as opened:
        made = World(opened)
        for name in nodes:
            made.add_node(name)
        yield made


async def drive(
    act: Actuator, node: str, first: ActionResult, w: World, step: float = 30.0
) -> ActionResult:
    """Progress passes, the clock moving ``step`` seconds between them, until nothing waits."""
    result = first
    for _ in range(40):
        if result.outcome not in (Outcome.IN_PROGRESS, Outcome.CONFLICT, Outcome.FAILED):
            return result
        w.advance(step)
        result = await act.progress(node)
    raise AssertionError(f"{node} did not settle: {result}")


async def restart_passes(actuator: Actuator, writer: NodeWriter) -> list[ActionResult]:
    """What a restarted controller's recovery does to the nodes, without its audit records: one
    ``progress`` pass on every node left ``lending`` (rolled back) or ``reclaiming`` (driven
    on), in name order. The controller does this through ``Reconciler``'s recovery, audited."""
    nodes = await writer.list_nodes(f"{KEYS.state} in (lending,reclaiming)")
    names = sorted(str((n.get("metadata") or {}).get("name", "")) for n in nodes)
    return [await actuator.progress(name) for name in names]
