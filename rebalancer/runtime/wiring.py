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

The operator's ``reclaim`` (``operator_reclaim``) goes through the same audited path as a tick:
an intent record (origin ``operator``) committed first, the actuator's ``reclaim``, ``progress``
until the node serves again or the deadline has passed, and an outcome record.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import convert, kubeclient
from rebalancer.adapters.actuator import ActionResult, Actuator, Outcome
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


@dataclass(frozen=True)
class Reclaimed:
    node: str
    pool: str | None
    result: ActionResult | None  # the last actuator call; None: never called
    intent: AuditRecord | None
    message: str

    @property
    def ok(self) -> bool:
        """The node serves again (or already did)."""
        return self.result is not None and self.result.outcome in (Outcome.DONE, Outcome.NOTHING)


OPERATOR_MESSAGE = "operator: rebalancer reclaim"


async def lent_nodes(parts: Parts) -> list[str]:
    """Every node the controller has lent or is moving (any non-serving phase)."""
    k = parts.keys
    phases = ",".join(p.value for p in (Phase.LENDING, Phase.LENT, Phase.RECLAIMING))
    found = await parts.writer.list_nodes(f"{k.state} in ({phases})")
    return sorted(str((n.get("metadata") or {}).get("name", "")) for n in found)


async def operator_reclaim(
    parts: Parts,
    node: str,
    *,
    poll: float = 1.0,
    grace: timedelta = timedelta(seconds=30),
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> Reclaimed:
    """Take ``node`` back now: intent (origin operator), ``reclaim``, ``progress`` until done or
    past the deadline (plus ``grace`` for the deletions to land), outcome records.

    An outcome record is written for the first call, for every later pass that wrote something,
    and for the last pass, so a long drain does not write one row per poll."""
    try:
        raw = await parts.writer.get_node(node)
    except Exception as exc:
        return Reclaimed(node, None, None, None, f"cannot read the node: {exc}")
    view = convert.node_view(raw)
    pool = next((p for p in parts.pools if p.selects(view, parts.keys)), None)
    if pool is None:
        return Reclaimed(node, None, None, None, "no configured pool selects this node")
    now = parts.clock()
    intent = AuditRecord(
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
    await parts.audit_log.tick([intent])  # durable before any write
    actuator = parts.actuators[pool.name]
    deadline = now + pool.policy.reclaim_deadline
    result = await actuator.reclaim(node, intent.id, deadline)
    await parts.audit_log.outcome(intent, result, parts.clock())
    while result.outcome is Outcome.WAITING and parts.clock() < deadline + grace:
        await sleep(poll)
        result = await actuator.progress(node)
        final = result.outcome is not Outcome.WAITING or parts.clock() >= deadline + grace
        if result.applied or final:
            await parts.audit_log.outcome(intent, result, parts.clock())
    return Reclaimed(node, str(pool.name), result, intent, result.message)
