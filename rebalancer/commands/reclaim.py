"""The body of ``rebalancer reclaim``: take lent nodes back now, all at once.

Where it sits: ``rebalancer.cli.reclaim`` checks the flags, shows the wave and prints its summary;
this module stands the controller down first when asked (``stop_controller``), lists the nodes
not finished with (``lent_nodes``) and runs the wave (``reclaim_wave``).

The wave goes through the Reconciler's own path: the nodes are planned as steps
(``core.tick.operator_reclaims``, origin operator), their intents built like a tick's and
committed in one batch before the first write, and each step carried out by
``shell.Shell.carry``, which writes its outcome record; then passes of ``progress`` drive the
drains until each node serves again or the one deadline has passed.

When the audit store cannot take the intents (a full disk, a database gone), the wave goes on
as the controller's tick does (docs/design/audit-failure.md): each intent is first recorded on
its node (``adapters.ledger``), in a Warning Event and on stdout; a node that cannot carry it
is not touched. At the end, outcomes the store still refuses are added to their nodes too, and
each node's report says where its records are; the controller writes them to the store once
it takes writes again.

Why a wave and not one node after another: the runbook's fix for a controller that is down is
``rebalancer reclaim --all``, and inference needs every serving taint back at once, not node N
after the drains of the N-1 before it. So every node gets its first call (the serving taints and
labels restored, then the evictions asked for) before any node is waited on; then one pass after
another drives every drain still under way, all against the same deadline. Passes rather than a
task per node: one sleep per pass, so a test on a manual clock moves time once per pass and the
deadline means the same thing for every node.

Why the controller is stood down first in the chart's pre-delete hook (``--stop-controller``):
``helm uninstall`` runs the hook while the controller still runs. Taking the loans back first
would race it: the controller, seeing idle nodes and pending training again, could lend them
once more between the reclaim and its own deletion. So the hook first scales the controller's
Deployment to 0 and waits until no pod of it is left (a pod on its way out finishes the step in
flight and releases its lease, ``rebalancer run``'s SIGTERM), and only then takes every loan
back. Scaled to 0, nothing lends again; if the reclaim then fails, the uninstall stops with the
controller down and every node's state on the node, for the runbook (docs/upgrade-uninstall.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.adapters import convert
from rebalancer.adapters import ledger as ledgers
from rebalancer.core import audit, model, nodestate
from rebalancer.core.audit import AuditRecord
from rebalancer.core.concurrency import RECLAIM_CONCURRENCY, RECLAIM_MAX_CONCURRENCY
from rebalancer.core.model import NodeView, PoolName
from rebalancer.core.outcomes import BACK, ActionResult, Outcome, WriteKind, WriteOutcome
from rebalancer.errors import RebalancerError
from rebalancer.runtime import membership
from rebalancer.runtime.effects import Carry
from rebalancer.runtime.seams import NodeActuator, PoolConfig

if TYPE_CHECKING:
    from rebalancer.runtime.wiring import Controller


class Stage(StrEnum):
    """What one node's reclaim has come to, as the wave reports it."""

    SERVING_TAINTED = "serving-tainted"  # serving taints and labels back; the drain is under way
    DRAINING = "draining"  # a later pass: borrowed pods are still on the node
    BACK = "back"  # the node serves again (or already did)
    FAILED = "failed"  # not read, no pool, refused, 409, gone, or the API kept failing
    NOT_BACK = "not-back"  # still draining when the deadline and the grace had passed


@dataclass(frozen=True)
class ReclaimEvent:
    node: str
    stage: Stage
    elapsed: timedelta  # since the wave started
    message: str
    evicted: int = 0  # distinct borrowed pods evicted so far
    deleted: int = 0  # distinct borrowed pods deleted past the deadline so far


@dataclass(frozen=True)
class Reclaimed:
    node: str
    pool: str | None
    result: ActionResult | None  # the last actuator call; None: never called
    intent: AuditRecord | None
    message: str
    # Since the wave started. ``tainted``: when the reclaim call that restored the serving taints
    # returned (their write is its first, so they were there a little earlier); ``back``: when
    # the node served again. None: not (yet) reached.
    tainted: timedelta | None = None
    back: timedelta | None = None
    evicted: int = 0
    deleted: int = 0
    audit_errors: tuple[str, ...] = ()  # outcome records the store did not take

    @property
    def ok(self) -> bool:
        """The node serves again (or already did)."""
        return self.result is not None and self.result.outcome in BACK


class IntentsNotRecorded(RebalancerError):
    """The audit store did not take the wave's intents: nothing was written to any node."""


OPERATOR_MESSAGE = "operator: rebalancer reclaim"
_SERVING = BACK | {Outcome.IN_PROGRESS}  # after any of these the serving taints are in place


async def lent_nodes(
    controller: Controller, pools: Collection[str] = ()
) -> dict[str, dict[str, Any]]:
    """Every node the controller has not finished with, by name in name order, as listed: the
    wave needs no second read of them. That is every node that carries our keys (the state
    label, ``original``, a lent taint: ``nodestate.carries_ours``), whether a pool selects it
    or not, so a node whose state label another writer removed, or that no pool selects now,
    is taken back too. With ``pools``, only the nodes one of those pools selects or adopts."""
    k = controller.keys
    lent = tuple(t for p in controller.pools for t in p.lend_spec.add_taints)
    found = await controller.writer.list_nodes("")  # a label selector cannot find them all
    chosen = [p for p in controller.pools if str(p.name) in pools]
    by_name: dict[str, dict[str, Any]] = {}
    for raw in found:
        view = convert.node_view(raw)
        if not nodestate.carries_ours(view, k, lent):
            continue
        if chosen and _pool_of(controller.pools, view, k) not in chosen:
            continue
        by_name[str((raw.get("metadata") or {}).get("name", ""))] = raw
    return dict(sorted(by_name.items()))


def _pool_of(
    pools: Sequence[PoolConfig], view: NodeView, keys: nodestate.Keys
) -> PoolConfig | None:
    """The pool that drives the node: the first that selects it, else the one that adopts it
    because it carries our keys (``membership.adopter``); None when neither."""
    pool = next((p for p in pools if p.selects(view, keys)), None)
    return pool if pool is not None else membership.adopter(pools, view, keys)


@dataclass
class _Node:
    """One node of a wave while it runs."""

    name: str
    pool: PoolConfig
    actuator: NodeActuator
    step: model.Step
    intent: AuditRecord
    deadline: datetime
    result: ActionResult | None = None
    tainted: timedelta | None = None
    back: timedelta | None = None
    evicted: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    audit_errors: list[str] = field(default_factory=list)
    final: bool = False

    def count(self, result: ActionResult) -> None:
        for w in result.writes:
            if w.kind is WriteKind.EVICT and w.outcome is WriteOutcome.EVICTED:
                self.evicted.add(w.target)
            elif w.kind is WriteKind.DELETE and w.outcome is WriteOutcome.APPLIED:
                self.deleted.add(w.target)

    def done(self) -> Reclaimed:
        assert self.result is not None
        return Reclaimed(
            self.name,
            str(self.pool.name),
            self.result,
            self.intent,
            self.result.message,
            self.tainted,
            self.back,
            len(self.evicted),
            len(self.deleted),
            tuple(self.audit_errors),
        )


async def reclaim_wave(
    controller: Controller,
    nodes: Sequence[str],
    *,
    known: Mapping[str, dict[str, Any]] | None = None,
    concurrency: int = RECLAIM_CONCURRENCY,
    poll: float = 1.0,
    grace: timedelta = timedelta(seconds=30),
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    on_event: Callable[[ReclaimEvent], None] | None = None,
) -> list[Reclaimed]:
    """Take ``nodes`` back now, all at once; one ``Reclaimed`` per node, in the order given.

    1. Each node is read (``known`` holds nodes already listed, which are not read again) and its
       pool found (an orphan's is the pool that adopts it, ``membership.adopter``); a node that
       cannot be read, or that no pool selects and carries none of our keys, is reported and
       left out.
    2. One intent per node (origin operator), all committed in one batch before the first write.
       If the store refuses them, each is recorded on its node instead (a node that cannot carry
       it is left out); with nowhere to record them (no ledger), ``IntentsNotRecorded`` and
       nothing is written.
    3. Every node's ``reclaim`` (serving taints and labels restored, then the evictions asked
       for), at most ``concurrency`` at once, against one deadline: the wave's start plus the
       pool's ``reclaim_deadline``. Only when every node has had it does any wait begin.
    4. Passes of ``progress`` over every node still draining (at most ``concurrency`` at once),
       ``poll`` seconds apart, until each serves again or its deadline plus ``grace`` (for the
       deletions after it) has passed.
    An outcome record is written for the first call, for every later pass that wrote something,
    and for the last, so a long drain does not write one row per poll. A node whose call fails
    is reported and the others go on; an outcome the store does not take is reported on its node
    (the write it describes is done) and the wave goes on.
    """
    if not 1 <= concurrency <= RECLAIM_MAX_CONCURRENCY:
        raise ValueError(
            f"concurrency={concurrency}: must be between 1 and {RECLAIM_MAX_CONCURRENCY}"
        )
    wave = _Wave(controller, asyncio.Semaphore(concurrency), controller.clock(), grace, on_event)
    names = list(dict.fromkeys(nodes))
    moving = await wave.prepare(names, dict(known or {}))
    await asyncio.gather(*(wave.first(n) for n in moving))
    while draining := [n for n in moving if not n.final]:
        await sleep(poll)
        await asyncio.gather(*(wave.again(n) for n in draining))
    await wave.settle_records(moving)
    done = {n.name: n.done() for n in moving}
    return [wave.lost[n] if n in wave.lost else done[n] for n in names]


@dataclass
class _Wave:
    controller: Controller
    limit: asyncio.Semaphore  # API calls in flight at once
    start: datetime
    grace: timedelta
    on_event: Callable[[ReclaimEvent], None] | None
    lost: dict[str, Reclaimed] = field(default_factory=dict)  # never called: not read, no pool
    unaudited: str | None = None  # why the store refused the intents (kept on the nodes)
    tick: audit.Tick = field(default_factory=lambda: audit.Tick((), {}))  # the wave's intents

    def since(self) -> timedelta:
        return self.controller.clock() - self.start

    def tell(self, event: ReclaimEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def prepare(self, names: list[str], seen: dict[str, dict[str, Any]]) -> list[_Node]:
        """Read what is not known yet, find each node's pool, commit every intent at once."""
        controller = self.controller

        async def read(name: str) -> None:
            async with self.limit:
                try:
                    seen[name] = await controller.writer.get_node(name)
                except Exception as exc:  # one node's failure is reported on that node only
                    self.lost[name] = Reclaimed(
                        name, None, None, None, f"cannot read the node: {exc}"
                    )

        await asyncio.gather(*(read(n) for n in names if n not in seen))
        members: dict[PoolName, list[NodeView]] = {}
        pools: dict[str, PoolConfig] = {}
        for name in names:
            if name in self.lost:
                continue
            view = convert.node_view(seen[name])
            pool = _pool_of(controller.pools, view, controller.keys)
            if pool is None:
                why = "no configured pool selects this node, and it carries none of our keys"
                self.lost[name] = Reclaimed(name, None, None, None, why)
                continue
            members.setdefault(pool.name, []).append(view)
            pools[name] = pool
        for name in names:
            if name in self.lost:
                self.tell(ReclaimEvent(name, Stage.FAILED, self.since(), self.lost[name].message))
        if not members:
            return []
        plan, self.tick = controller.reconciler.operator_plan(members, OPERATOR_MESSAGE)
        shell = controller.reconciler.shell()
        try:  # durable before any write
            await shell.audit_log.tick(self.tick.records)
        except Exception as exc:
            if shell.ledger is None:
                raise IntentsNotRecorded(
                    f"audit store: the intents were not recorded, no node was touched: {exc}"
                ) from exc
            self.unaudited = shell.audit_log.failing or str(exc)
        by_node = {str(s.node): s for s in plan.steps}
        if self.unaudited is not None:
            for name in list(by_node):
                if not await shell.keep(name, self.tick.intent_for(by_node[name])):
                    why = (
                        f"the audit store fails ({self.unaudited}) and the intent could not be "
                        "recorded on the node: not touched"
                    )
                    self.lost[name] = Reclaimed(name, str(pools[name].name), None, None, why)
                    self.tell(ReclaimEvent(name, Stage.FAILED, self.since(), why))
                    del by_node[name]
        moving = []
        for name in (n for n in names if n in by_node):
            pool, step = pools[name], by_node[name]
            deadline = self.start + pool.policy.reclaim_deadline  # one start for every node
            actuator = shell.actuators[pool.name]
            moving.append(_Node(name, pool, actuator, step, self.tick.intent_for(step), deadline))
        return moving

    async def first(self, node: _Node) -> None:
        """The node's step through ``shell.Shell.carry``: the reclaim and its outcome."""
        async with self.limit:
            try:
                shell = self.controller.reconciler.shell()
                carry = Carry(node.step, self.tick.intent_for(node.step))
                applied = await shell.carry(carry, self.start)
            except Exception as exc:  # this node alone fails; the wave goes on
                result = _unexpected(node.name, model.Action.RECLAIM, exc)
                await self.record(node, result)
            else:
                assert applied.result is not None  # an operator's command is always leading
                result = applied.result
                if applied.outcome is None:
                    node.audit_errors.append(
                        f"outcome of {result.action} not recorded: the audit store failed"
                    )
        self.settle(node, result)

    async def again(self, node: _Node) -> None:
        async with self.limit:
            try:
                result = await node.actuator.progress(node.name)
            except Exception as exc:
                result = _unexpected(node.name, model.Action.PROGRESS, exc)
        self.settle(node, result)
        if result.applied or node.final:
            await self.record(node, result)

    async def record(self, node: _Node, result: ActionResult) -> None:
        trail = self.controller.reconciler.audit_log
        try:
            await trail.outcome(node.intent, result, self.controller.clock())
        except Exception as exc:  # the write it describes is done: the wave goes on
            node.audit_errors.append(f"outcome of {result.action} not recorded: {exc}")

    async def settle_records(self, moving: Sequence[_Node]) -> None:
        """Before the command ends (and its memory with it): the records the store refused go
        to the store if it takes them now, else onto their nodes, and each node says where."""
        reconciler = self.controller.reconciler
        trail, ledger = reconciler.audit_log, reconciler.ledger
        if not trail.spool or ledger is None:
            return
        with contextlib.suppress(Exception):
            await trail.flush()
        if not trail.spool:
            return
        why = trail.failing or self.unaudited or "unknown"
        for node in moving:
            mine = [r for r in trail.spool if r.node == node.name]
            if not mine:
                continue
            # Kept on the node beside its intent; the stale "outcome not recorded" lines go.
            node.audit_errors = [e for e in node.audit_errors if "not recorded" not in e]
            try:
                await ledger.hold(node.name, mine, why)
                node.audit_errors.append(
                    f"the audit store fails ({why}): {len(mine)} record(s) of intent "
                    f"{node.intent.id} are kept on the node (annotation "
                    f"{ledgers.annotation(self.controller.keys)}), in its Events and on stdout; "
                    "the controller writes them to the store once it takes writes"
                )
            except Exception as exc:
                node.audit_errors.append(
                    f"the audit store fails ({why}) and {len(mine)} record(s) could not be "
                    f"added to the node ({exc}); they are on stdout only"
                )

    def settle(self, node: _Node, result: ActionResult) -> None:
        """What ``result`` says about ``node``: counts, times, whether it is final; the events."""
        node.result = result
        node.count(result)
        at = self.since()
        counts = {"evicted": len(node.evicted), "deleted": len(node.deleted)}
        restored = any(w.kind is WriteKind.BEGIN_RECLAIM for w in result.applied)
        if node.tainted is None and (result.outcome in _SERVING or restored):
            node.tainted = at
            self.tell(ReclaimEvent(node.name, Stage.SERVING_TAINTED, at, result.message, **counts))
        past = self.controller.clock() >= node.deadline + self.grace
        node.final = result.outcome is not Outcome.IN_PROGRESS or past
        if result.outcome in BACK:
            node.back = at
            self.tell(ReclaimEvent(node.name, Stage.BACK, at, result.message, **counts))
        elif result.outcome is Outcome.IN_PROGRESS:
            stage = Stage.NOT_BACK if past else Stage.DRAINING
            self.tell(ReclaimEvent(node.name, stage, at, result.message, **counts))
        else:
            why = f"{result.outcome.value}: {result.message}"
            self.tell(ReclaimEvent(node.name, Stage.FAILED, at, why, **counts))


def _unexpected(node: str, action: model.Action, exc: Exception) -> ActionResult:
    """The actuator turns the writer's errors into results; anything else it lets through
    becomes a failed result for this node alone, so the rest of the wave goes on."""
    return ActionResult(node, action, Outcome.FAILED, f"unexpected error: {exc!r}")


# ---------------------------------------------------------------------------------------------
# Standing the controller down first (``--stop-controller``)


class NotStopped(RebalancerError):
    """The controller's Deployment could not be scaled down, or its pods outlived the wait."""


@dataclass(frozen=True, slots=True)
class Stopped:
    deployment: str
    namespace: str
    waited: float  # seconds until no pod of it was left
    pods: int  # how many there were when it was scaled down


async def stop_controller(
    api: Any,
    namespace: str,
    deployment: str,
    timeout: float,
    *,
    poll: float = 1.0,
) -> Stopped:
    """Scale ``namespace/deployment`` to 0 and wait until none of its pods is left."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    where = f"deployment/{deployment} in namespace {namespace}"
    try:
        found = await apps.read_namespaced_deployment(deployment, namespace)
        await apps.patch_namespaced_deployment_scale(
            deployment, namespace, {"spec": {"replicas": 0}}
        )
    except ApiException as exc:
        raise NotStopped(f"{where}: not scaled to 0: {exc.status} {exc.reason}") from None
    selector = ",".join(f"{k}={v}" for k, v in (found.spec.selector.match_labels or {}).items())
    if not selector:
        raise NotStopped(f"{where}: its selector has no matchLabels to find its pods by")
    began = time.monotonic()
    first: int | None = None
    while True:
        pods = await core.list_namespaced_pod(namespace, label_selector=selector)
        left = len(pods.items)
        first = left if first is None else first
        if left == 0:
            return Stopped(deployment, namespace, time.monotonic() - began, first)
        if time.monotonic() - began >= timeout:
            names = ", ".join(p.metadata.name for p in pods.items)
            raise NotStopped(f"{where}: scaled to 0, but {left} pod(s) still run: {names}")
        await asyncio.sleep(poll)
