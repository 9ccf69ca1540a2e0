"""The whole controller built from ``Settings``: every adapter opened, and closed, in one place.

Where it sits: ``rebalancer run`` opens a ``Controller`` (``async with Controller.open(...)``)
and calls ``run()``; ``rebalancer reclaim`` opens only the parts it needs (``Parts.open``) and
``rebalancer audit`` only the store (``open_audit_store``). Nothing here decides anything: it
builds the values the settings describe and hands them to the runtime (docs/design/runtime.md).

What is built:
- one Kubernetes ``ApiClient`` (``adapters.kubeclient``: an explicit kubeconfig, else the
  in-cluster service account, else the default kubeconfig);
- the informer over every node (each pool selects its nodes from the cache);
- per pool a ``PoolConfig`` and an ``Actuator``; the actuator's writer is
  ``LeaderGatedWriter(KubeWriter)`` with leader election on, the bare ``KubeWriter`` with it off;
- per pool a Prometheus ``Metrics`` with the pool's queries, behind ``PoolMetricsRouter``;
- the audit store from its URL and the ``AuditLog`` over it;
- ``Telemetry``, the HTTP server, the ``LeaderElector`` (or ``AlwaysLeader``) and the
  ``Reconciler``; ``Controller.run`` is ``runtime.loop.run_controller``.

The operator's ``reclaim`` (``reclaim_wave``; ``operator_reclaim`` for one node) goes through the
same audited path as a tick: intent records (origin ``operator``) committed first, in one batch,
then every node's ``reclaim`` (serving taints back everywhere before any node is waited on), then
``progress`` on all the drains at once until each node serves again or the one deadline has
passed, and outcome records.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import convert, kubeclient
from rebalancer.adapters.actuator import (
    ActionResult,
    Actuator,
    Outcome,
    WriteKind,
    WriteOutcome,
)
from rebalancer.adapters.audit import AuditLog, Sink, SqlAuditStore, stdout_sink
from rebalancer.adapters.events import EventRecorder, KubeEvents
from rebalancer.adapters.gate import LeaderGatedWriter
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.leadership import LeaderElector
from rebalancer.adapters.metrics import HistoryResult, Metrics, PoolMetrics
from rebalancer.adapters.writer import KubeWriter, NodeWriter
from rebalancer.core import audit, model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import NodeName, PoolName
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.errors import RebalancerError
from rebalancer.runtime import http
from rebalancer.runtime.loop import run_controller
from rebalancer.runtime.reconcile import (
    AlwaysLeader,
    Leadership,
    NodeActuator,
    PoolConfig,
    Reconciler,
)
from rebalancer.runtime.telemetry import Telemetry
from rebalancer.settings import Settings

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def identity() -> str:
    """This replica's name: ``POD_NAME`` (the chart sets it from the downward API), else the
    host name and process id."""
    pod = os.environ.get("POD_NAME", "").strip()
    return pod or f"{socket.gethostname()}-{os.getpid()}"


# ---------------------------------------------------------------------------------------------
# Pure builders


def pool_configs(settings: Settings) -> tuple[PoolConfig, ...]:
    keys = settings.keys()
    return tuple(
        PoolConfig(
            name=PoolName(p.name),
            node_selector=dict(p.node_selector),
            policy=p.policy(keys),
            rules=p.pod_rules(keys),
            strategy=p.build_strategy(),
            strategy_name=p.strategy.name,
            strategy_params=dict(p.strategy.params),
            paused=p.paused,
            frozen=p.frozen,
        )
        for p in settings.pools
    )


def actuators(
    pools: Sequence[PoolConfig],
    writer: NodeWriter,
    keys: Keys,
    clock: Clock,
    dry_run: bool = False,
) -> dict[PoolName, Actuator]:
    return {
        p.name: Actuator(writer, keys, p.lend_spec, p.rules, clock, dry_run=dry_run) for p in pools
    }


@dataclass
class PoolMetricsRouter:
    """``MetricsSource`` over one ``Metrics`` per pool (each pool has its own queries)."""

    by_pool: Mapping[PoolName, Metrics]

    async def read(
        self, pool: PoolName, nodes: Iterable[NodeName], now: datetime | None = None
    ) -> PoolMetrics:
        return await self.by_pool[pool].read(pool, nodes, now)

    async def history(
        self,
        pool: PoolName,
        nodes: Iterable[NodeName],
        since: datetime,
        until: datetime,
        step: timedelta,
    ) -> HistoryResult:
        return await self.by_pool[pool].history(pool, nodes, since, until, step)

    def close(self) -> None:
        for m in self.by_pool.values():
            m.close()


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

    async def reclaim(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        result = await self.inner.reclaim(node, decision, deadline)
        await self.events.action(result, decision)
        return result

    async def progress(self, node: str, decision: str | None = None) -> ActionResult:
        result = await self.inner.progress(node, decision)
        await self.events.action(result, decision)
        return result


async def open_audit_store(settings: Settings) -> SqlAuditStore:
    return await SqlAuditStore.open(settings.audit.url)


# ---------------------------------------------------------------------------------------------
# The parts a one-shot command needs: API client, writer, actuators, audit log


@dataclass
class Parts:
    settings: Settings
    api: Any  # kubernetes_asyncio.client.ApiClient
    keys: Keys
    pools: tuple[PoolConfig, ...]
    writer: NodeWriter
    actuators: Mapping[PoolName, NodeActuator]
    store: SqlAuditStore
    audit_log: AuditLog
    identity: str
    clock: Clock = field(default=utc_now)

    @staticmethod
    @asynccontextmanager
    async def open(
        settings: Settings,
        kubeconfig: Path | None = None,
        *,
        sink: Sink | None = None,
        name: str | None = None,
        clock: Clock = utc_now,
    ) -> AsyncIterator[Parts]:
        """Ungated writer: an operator's command is not the controller and holds no lease;
        every node write still carries the resourceVersion it read (a race is a 409)."""
        async with AsyncExitStack() as stack:
            api = await stack.enter_async_context(kubeclient.api_client(kubeconfig))
            store = await open_audit_store(settings)
            stack.push_async_callback(store.close)
            keys = settings.keys()
            pools = pool_configs(settings)
            writer = KubeWriter(client.CoreV1Api(api))
            me = name or identity()
            recorder = KubeEvents(api, instance=me, clock=clock)
            acts = actuators(pools, writer, keys, clock, settings.dry_run)
            yield Parts(
                settings=settings,
                api=api,
                keys=keys,
                pools=pools,
                writer=writer,
                actuators={n: RecordingActuator(a, recorder) for n, a in acts.items()},
                store=store,
                audit_log=AuditLog(store, sink=sink),
                identity=me,
                clock=clock,
            )


# ---------------------------------------------------------------------------------------------
# The controller


@dataclass
class Controller:
    settings: Settings
    api: Any
    informer: Informer
    pools: tuple[PoolConfig, ...]
    actuators: Mapping[PoolName, Actuator]
    metrics: PoolMetricsRouter
    store: SqlAuditStore
    audit_log: AuditLog
    telemetry: Telemetry
    server: http.HttpServer
    elector: LeaderElector | None
    leadership: Leadership
    events: KubeEvents
    reconciler: Reconciler

    @staticmethod
    @asynccontextmanager
    async def open(
        settings: Settings,
        kubeconfig: Path | None = None,
        *,
        name: str | None = None,
        sink: Sink | None = stdout_sink,
        clock: Clock = utc_now,
    ) -> AsyncIterator[Controller]:
        """Everything built and the HTTP server serving; all of it closed when the block ends."""
        me = name or identity()
        async with AsyncExitStack() as stack:
            api = await stack.enter_async_context(kubeclient.api_client(kubeconfig))
            keys = settings.keys()
            pools = pool_configs(settings)
            informer = Informer(api, prefix=settings.key_prefix)
            le = settings.leader_election
            kube = KubeWriter(client.CoreV1Api(api))
            telemetry = Telemetry()
            elector: LeaderElector | None = None
            leadership: Leadership
            writer: NodeWriter
            if le.enabled:
                # The gauge follows the Lease as the elector sees it change (set after the write
                # that won it, cleared before the release write), not the next tick.
                elector = LeaderElector(
                    api,
                    name=le.lease_name,
                    namespace=le.lease_namespace,
                    identity=me,
                    timings=settings.timings(),
                    on_started=lambda _term: telemetry.observe_leader(me, True),
                    on_stopped=lambda _term, _why: telemetry.observe_leader(me, False),
                )
                leadership = elector
                writer = LeaderGatedWriter(kube, elector.may_write, elector.now, me)
            else:
                leadership = AlwaysLeader(identity=me, now=clock)
                writer = kube
            # From the start, not from the first tick: a follower (or a candidate that has not
            # won yet) says 0 as soon as it serves /metrics.
            telemetry.observe_leader(me, leadership.may_write(leadership.now()))
            metrics = PoolMetricsRouter(
                {PoolName(p.name): Metrics(settings.metrics_settings(p)) for p in settings.pools}
            )
            stack.callback(metrics.close)
            store = await open_audit_store(settings)
            stack.push_async_callback(store.close)
            audit_log = AuditLog(store, sink=sink)
            acts = actuators(pools, writer, keys, clock, settings.dry_run)
            recorder = KubeEvents(api, instance=me, clock=clock)
            recorded = {name: RecordingActuator(a, recorder) for name, a in acts.items()}
            reconciler = Reconciler(
                pools,
                events=recorder,
                views=informer,
                metrics=metrics,
                clock=clock,
                actuators=recorded,
                audit_log=audit_log,
                leadership=leadership,
                keys=keys,
                paused=lambda: settings.paused,
                frozen=lambda: settings.frozen,
                dry_run=settings.dry_run,
                observer=telemetry,
                strategy_timeout=settings.strategy_timeout,
            )

            def ready() -> http.Readiness:
                holder = elector.holder if elector is not None else ""
                return http.readiness(informer.synced.is_set(), elector is not None, holder)

            server = http.HttpServer(
                telemetry=telemetry,
                store=store,
                ready=ready,
                host=settings.http.host,
                port=settings.http.port,
            )
            await stack.enter_async_context(server)
            yield Controller(
                settings=settings,
                api=api,
                informer=informer,
                pools=pools,
                actuators=acts,
                metrics=metrics,
                store=store,
                audit_log=audit_log,
                telemetry=telemetry,
                server=server,
                elector=elector,
                leadership=leadership,
                events=recorder,
                reconciler=reconciler,
            )

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Until SIGTERM/SIGINT (or ``stop``): the informer, the election and the loop."""
        return await run_controller(
            self.reconciler.tick,
            informer=self.informer,
            elector=self.elector,
            edges=self.reconciler.next_edge,
            interval=self.settings.tick_interval,
            stop=stop,
        )


# ---------------------------------------------------------------------------------------------
# The operator's reclaim
#
# Why a wave and not one node after another: the runbook's fix for a controller that is down is
# ``rebalancer reclaim --all``, and inference needs every serving taint back at once, not node N
# after the drains of the N-1 before it. So every node gets its first call (the serving taints and
# labels restored, then the evictions asked for) before any node is waited on; then one pass after
# another drives every drain still under way, all against the same deadline. Passes rather than a
# task per node: one sleep per pass, so a test on a manual clock moves time once per pass and the
# deadline means the same thing for every node.


DEFAULT_CONCURRENCY = 32  # a wave of 50 nodes gets its serving taints in about 2 s (bench)
MAX_CONCURRENCY = 64


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
        return self.result is not None and self.result.outcome in (Outcome.DONE, Outcome.NOTHING)


class IntentsNotRecorded(RebalancerError):
    """The audit store did not take the wave's intents: nothing was written to any node."""


OPERATOR_MESSAGE = "operator: rebalancer reclaim"
_BACK = (Outcome.DONE, Outcome.NOTHING)
_SERVING = (*_BACK, Outcome.WAITING)  # after any of these the serving taints are in place


async def lent_nodes(parts: Parts, pools: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """Every node the controller has lent or is moving (any non-serving phase), by name in name
    order, as listed: the wave needs no second read of them. With ``pools``, only the nodes one
    of those pools selects."""
    k = parts.keys
    phases = ",".join(p.value for p in (Phase.LENDING, Phase.LENT, Phase.RECLAIMING))
    found = await parts.writer.list_nodes(f"{k.state} in ({phases})")
    chosen = [p for p in parts.pools if str(p.name) in pools]
    by_name: dict[str, dict[str, Any]] = {}
    for raw in found:
        if chosen and not any(p.selects(convert.node_view(raw), k) for p in chosen):
            continue
        by_name[str((raw.get("metadata") or {}).get("name", ""))] = raw
    return dict(sorted(by_name.items()))


async def operator_reclaim(
    parts: Parts,
    node: str,
    *,
    poll: float = 1.0,
    grace: timedelta = timedelta(seconds=30),
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> Reclaimed:
    """Take ``node`` back now: ``reclaim_wave`` over one node."""
    (done,) = await reclaim_wave(parts, [node], concurrency=1, poll=poll, grace=grace, sleep=sleep)
    return done


@dataclass
class _Node:
    """One node of a wave while it runs."""

    name: str
    pool: PoolConfig
    actuator: NodeActuator
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
    parts: Parts,
    nodes: Sequence[str],
    *,
    known: Mapping[str, dict[str, Any]] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    poll: float = 1.0,
    grace: timedelta = timedelta(seconds=30),
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    on_event: Callable[[ReclaimEvent], None] | None = None,
) -> list[Reclaimed]:
    """Take ``nodes`` back now, all at once; one ``Reclaimed`` per node, in the order given.

    1. Each node is read (``known`` holds nodes already listed, which are not read again) and its
       pool found; a node that cannot be read or that no pool selects is reported and left out.
    2. One intent per node (origin operator), all committed in one batch before the first write;
       if the store refuses them, ``IntentsNotRecorded`` and nothing is written.
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
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency={concurrency}: must be between 1 and {MAX_CONCURRENCY}")
    wave = _Wave(parts, asyncio.Semaphore(concurrency), parts.clock(), grace, on_event)
    names = list(dict.fromkeys(nodes))
    moving = await wave.prepare(names, dict(known or {}))
    await asyncio.gather(*(wave.first(n) for n in moving))
    while draining := [n for n in moving if not n.final]:
        await sleep(poll)
        await asyncio.gather(*(wave.again(n) for n in draining))
    done = {n.name: n.done() for n in moving}
    return [wave.lost[n] if n in wave.lost else done[n] for n in names]


@dataclass
class _Wave:
    parts: Parts
    limit: asyncio.Semaphore  # API calls in flight at once
    start: datetime
    grace: timedelta
    on_event: Callable[[ReclaimEvent], None] | None
    lost: dict[str, Reclaimed] = field(default_factory=dict)  # never called: not read, no pool

    def since(self) -> timedelta:
        return self.parts.clock() - self.start

    def tell(self, event: ReclaimEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    async def prepare(self, names: list[str], seen: dict[str, dict[str, Any]]) -> list[_Node]:
        """Read what is not known yet, find each node's pool, commit every intent at once."""
        parts = self.parts

        async def read(name: str) -> None:
            async with self.limit:
                try:
                    seen[name] = await parts.writer.get_node(name)
                except Exception as exc:  # one node's failure is reported on that node only
                    self.lost[name] = Reclaimed(
                        name, None, None, None, f"cannot read the node: {exc}"
                    )

        await asyncio.gather(*(read(n) for n in names if n not in seen))
        moving: list[_Node] = []
        for name in names:
            if name in self.lost:
                continue
            view = convert.node_view(seen[name])
            pool = next((p for p in parts.pools if p.selects(view, parts.keys)), None)
            if pool is None:
                why = "no configured pool selects this node"
                self.lost[name] = Reclaimed(name, None, None, None, why)
                continue
            intent = operator_intent(parts, pool, view, parts.clock())
            deadline = self.start + pool.policy.reclaim_deadline  # one start for every node
            moving.append(_Node(name, pool, parts.actuators[pool.name], intent, deadline))
        for name in names:
            if name in self.lost:
                self.tell(ReclaimEvent(name, Stage.FAILED, self.since(), self.lost[name].message))
        if moving:
            try:
                await parts.audit_log.tick([n.intent for n in moving])  # durable before any write
            except Exception as exc:
                raise IntentsNotRecorded(
                    f"audit store: the intents were not recorded, no node was touched: {exc}"
                ) from exc
        return moving

    async def first(self, node: _Node) -> None:
        async with self.limit:
            call = node.actuator.reclaim(node.name, node.intent.id, node.deadline)
            result = await _guarded(node.name, "reclaim", call)
        self.settle(node, result)
        await self.record(node, result)

    async def again(self, node: _Node) -> None:
        async with self.limit:
            result = await _guarded(node.name, "progress", node.actuator.progress(node.name))
        self.settle(node, result)
        if result.applied or node.final:
            await self.record(node, result)

    async def record(self, node: _Node, result: ActionResult) -> None:
        try:
            await self.parts.audit_log.outcome(node.intent, result, self.parts.clock())
        except Exception as exc:  # the write it describes is done: the wave goes on
            node.audit_errors.append(f"outcome of {result.action} not recorded: {exc}")

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
        past = self.parts.clock() >= node.deadline + self.grace
        node.final = result.outcome is not Outcome.WAITING or past
        if result.outcome in _BACK:
            node.back = at
            self.tell(ReclaimEvent(node.name, Stage.BACK, at, result.message, **counts))
        elif result.outcome is Outcome.WAITING:
            stage = Stage.NOT_BACK if past else Stage.DRAINING
            self.tell(ReclaimEvent(node.name, stage, at, result.message, **counts))
        else:
            why = f"{result.outcome.value}: {result.message}"
            self.tell(ReclaimEvent(node.name, Stage.FAILED, at, why, **counts))


async def _guarded(node: str, action: str, call: Awaitable[ActionResult]) -> ActionResult:
    """The actuator turns the writer's errors into results; anything else it lets through
    becomes a failed result for this node alone, so the rest of the wave goes on."""
    try:
        return await call
    except Exception as exc:
        return ActionResult(node, action, Outcome.FAILED, f"unexpected error: {exc!r}")


def operator_intent(
    parts: Parts, pool: PoolConfig, view: model.NodeView, now: datetime
) -> AuditRecord:
    """The intent of an operator's reclaim of one node, as ``rebalancer reclaim`` records it."""
    node = str(view.name)
    return AuditRecord(
        id=parts.audit_log.new_id(),
        time=now,
        kind=Kind.INTENT,
        pool=str(pool.name),
        controller=parts.identity,
        reason=model.Reason.OPERATOR_RECLAIM_NOW.value,
        message=OPERATOR_MESSAGE,
        node=node,
        action=model.Action.RECLAIM.value,
        origin=model.Origin.OPERATOR.value,
        strategy=pool.strategy_name,
        params=audit.jsonable(dict(pool.strategy_params)),
        before=audit.node_doc(view),
        dry_run=parts.settings.dry_run,
        detail={
            "urgent": True,
            "intent": {
                "action": model.Action.RECLAIM.value,
                "count": 1,
                "origin": model.Origin.OPERATOR.value,
                "reason": model.Reason.OPERATOR_RECLAIM_NOW.value,
                "message": OPERATOR_MESSAGE,
                "node": node,
            },
        },
    )
