"""The composition root: the whole controller built from ``Settings`` plus the seams a caller
injects, every adapter opened, and closed, in one place.

Where it sits: ``rebalancer run`` opens a ``Controller`` (``async with Controller.open(...)``) and
calls ``run()``; ``rebalancer reclaim`` opens the same controller in the operator's role (no
lease, no HTTP server) and runs ``commands.reclaim``'s wave with its reconciler; the demo opens
it with the emulator's client, a manual clock and a replayed trace as seams and ticks its
reconciler. ``rebalancer audit`` opens only the store (``open_audit_store``). Nothing here
decides anything: it builds the values the settings describe and hands them to the runtime
(docs/design/runtime.md); the parts it puts together live in modules of their own.

What is built:
- one Kubernetes ``ApiClient`` (``adapters.kubeclient``: an explicit kubeconfig, else the
  in-cluster service account, else the default kubeconfig), unless one is handed in;
- the informer over every node (each pool selects its nodes from the cache, and each actuator
  reads a node from it before a step: ``adapters.actuator`` says what it asks the server again);
- per pool a ``PoolConfig`` and an ``Actuator``; the actuator's writer is
  ``LeaderGatedWriter(KubeWriter)`` with leader election on, the bare ``KubeWriter`` with it off
  or for an operator's command; every actuator records its transitions as Events
  (``runtime.recording``);
- per pool a Prometheus ``Metrics`` with the pool's queries, behind ``PoolMetricsRouter``
  (``runtime.poolmetrics``), unless a metrics source is handed in; the adapters' configuration
  (the metrics settings and queries, the election's timings) from ``runtime.adapterconfig``;
- the audit store from its URL (unless handed in) and the ``AuditLog`` over it;
- the cluster's name (``cluster_name``) on what leaves the controller: the audit log (which
  also reads back only that cluster's records), ``Telemetry`` and the Events;
- ``Telemetry``, the HTTP server, the ``LeaderElector`` (or ``AlwaysLeader``) and the
  ``Reconciler``; ``Controller.run`` is ``runtime.loop.run_controller``;
- the ``AlertStore`` of the pools' ``wake_on`` selectors: the reconciler reads it, the HTTP
  server's Alertmanager receiver fills it, and the loop runs at once when it rings.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import (
    AsyncIterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import kubeauth, kubeclient, leadership, sealkeys
from rebalancer.adapters.actuator import Actuator, NoCache, NodeCache
from rebalancer.adapters.audit import (
    AuditLog,
    AuditStore,
    NewerSchema,
    Sink,
    SqlAuditStore,
    UnopenedStore,
    UnreachableStore,
    stdout_sink,
)
from rebalancer.adapters.events import KubeEvents, NodeEvent
from rebalancer.adapters.evictionrequests import (
    EvictionRequests,
    KubeEvictionRequests,
    requester_name,
)
from rebalancer.adapters.gate import LeaderGatedRequests, LeaderGatedWriter
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.leadership import LeaderElector
from rebalancer.adapters.ledger import NodeLedger
from rebalancer.adapters.metrics import Metrics
from rebalancer.adapters.writer import KubeWriter, NodeWriter
from rebalancer.core.audit import NewId
from rebalancer.core.model import Clock, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.runtime import adapterconfig, collecting, explaining, http, livesettings, tls
from rebalancer.runtime import alerts as alerting
from rebalancer.runtime.loop import run_controller
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.poolmetrics import PoolMetricsRouter
from rebalancer.runtime.reconcile import Reconciler, Reconfigured
from rebalancer.runtime.recording import RecordingActuator
from rebalancer.runtime.report import TickReport
from rebalancer.runtime.seams import (
    AlwaysLeader,
    EventRecorder,
    Leadership,
    MetricsSource,
    NoEvents,
    PoolConfig,
)
from rebalancer.runtime.telemetry import Telemetry
from rebalancer.settings import Settings

log = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


def pod_name(environ: Mapping[str, str] = os.environ) -> str:
    """This replica's pod: ``POD_NAME`` (the chart sets it from the downward API), else the
    host name and process id."""
    pod = environ.get("POD_NAME", "").strip()
    return pod or f"{socket.gethostname()}-{os.getpid()}"


def identity(environ: Mapping[str, str] = os.environ) -> str:
    """This process's identity, the Lease holder's and the audit records': its pod's name and
    a suffix of its own (``leadership.process_identity``), so that two processes started with
    the same ``POD_NAME`` are two candidates, never one holder twice (docs/design/leadership.md).
    Called once per process, by ``Controller.open``."""
    return leadership.process_identity(pod_name(environ))


# ---------------------------------------------------------------------------------------------
# Pure builders


def pool_configs(settings: Settings) -> tuple[PoolConfig, ...]:
    keys = settings.keys()
    return tuple(
        PoolConfig(
            name=PoolName(p.name),
            node_selector=dict(p.node_selector),
            policy=p.policy(keys),
            marks=p.pod_marks(keys),
            strategy=p.build_strategy(),
            strategy_name=p.strategy.name,
            strategy_params=dict(p.strategy.params),
            paused=p.paused,
            frozen=p.frozen,
            slo=None if p.slo is None else p.slo.slo(),
        )
        for p in settings.pools
    )


def kept_strategies(
    running: Sequence[PoolConfig], new: Sequence[PoolConfig]
) -> tuple[PoolConfig, ...]:
    """``new``, each pool whose strategy and parameters did not change keeping its running
    strategy: a strategy may keep state from one call to the next, and a reload that changes
    a pool's limits (or another pool) is no reason to start it afresh."""
    before = {p.name: p for p in running}
    return tuple(_kept(before.get(pool.name), pool) for pool in new)


def _kept(old: PoolConfig | None, pool: PoolConfig) -> PoolConfig:
    if old is None or _strategy_of(old) != _strategy_of(pool):
        return pool
    return dataclasses.replace(pool, strategy=old.strategy)


def _strategy_of(pool: PoolConfig) -> tuple[str, dict[str, Any]]:
    return pool.strategy_name, dict(pool.strategy_params)


def signed_keys(settings: Settings, warn: bool = True) -> Keys:
    """The settings' keys with the seal read from ``node_state_keys`` (``adapters.sealkeys``):
    every reader and writer of node state takes it from here. ``warn``: say that no directory
    is configured (the controller's role; noise on an operator's command)."""
    directory = settings.node_state_keys
    seal = sealkeys.load(None if directory is None else Path(directory), warn)
    return dataclasses.replace(settings.keys(), seal=seal)


def actuators(
    pools: Sequence[PoolConfig],
    writer: NodeWriter,
    keys: Keys,
    server_clock: Clock,
    dry_run: bool = False,
    cache: NodeCache | None = None,
    requests: EvictionRequests | None = None,
) -> dict[PoolName, Actuator]:
    """Each pool's actuator, telling time on the API server's clock."""
    return {
        p.name: Actuator(
            writer,
            keys,
            p.lend_spec,
            p.marks,
            server_clock,
            dry_run,
            cache,
            drain=p.policy.reclaim_deadline,
            requests=requests,
        )
        for p in pools
    }


def _reconciler(
    settings: Settings,
    role: Role,
    pools: Sequence[PoolConfig],
    *,
    keys: Keys,
    writer: NodeWriter,
    informer: Informer,
    metrics: MetricsSource,
    server_clock: Clock,
    audit_log: AuditLog,
    leadership: Leadership,
    events: EventRecorder,
    alerts: alerting.AlertStore,
    apiserver_clock: kubeclient.ClockProbe,
    prometheus_clock: PoolMetricsRouter | None,
    requests: EvictionRequests | None = None,
) -> Reconciler:
    """The reconcile step of ``Controller.open``, from what it built: each pool's actuator
    (its Events recorded, reading the informer's cache when this is the controller, filing a
    notice's EvictionRequests where the cluster serves them), the settings' limits and
    switches, and where a record goes while the audit store fails."""
    observer = Observer(
        pools,
        keys=keys,
        views=informer,
        metrics=metrics,
        paused=settings.paused,
        frozen=settings.frozen,
        alerts=alerts,
        apiserver_clock=apiserver_clock,
        prometheus_clock=prometheus_clock,
        clock_bound=settings.clock_skew_bound,
    )
    cache = informer if role is Role.CONTROLLER else NoCache()
    made = actuators(pools, writer, keys, server_clock, settings.dry_run, cache, requests)
    return Reconciler(
        pools,
        observer=observer,
        events=events,
        clock=server_clock,
        actuators={name: RecordingActuator(a, events) for name, a in made.items()},
        audit_log=audit_log,
        leadership=leadership,
        keys=keys,
        dry_run=settings.dry_run,
        strategy_timeout=settings.strategy_timeout,
        lend_concurrency=settings.lend_concurrency,
        # Where a record goes while the audit store fails (docs/design/audit-failure.md);
        # a dry run writes nothing, so it has none.
        ledger=None
        if settings.dry_run
        else NodeLedger(writer, keys, events if isinstance(events, KubeEvents) else None),
    )


def _eviction_requests(api: Any, keys: Keys, leadership: Leadership, me: str) -> EvictionRequests:
    """A notice's EvictionRequests, filed under the key prefix, written only while leading."""
    requests = KubeEvictionRequests(api, requester_name(keys.prefix))
    return LeaderGatedRequests(requests, leadership.may_write, leadership.now, me)


def _informer(settings: Settings, role: Role, api: Any) -> Informer:
    """The cache of nodes and pods; frozen once synced for the controller (its views are
    shared), and watching pending pods only when a pool lends only to takers (Kueue's
    Workloads too when ``takers.kueue_workloads`` is on; the settings refuse it on alone)."""
    return Informer(
        api,
        prefix=settings.key_prefix,
        freeze_after_sync=role is Role.CONTROLLER,
        watch_pending=any(p.lend_only_to_takers for p in settings.pools),
        watch_workloads=settings.takers.kueue_workloads,
    )


def _alert_store(settings: Settings, server_clock: Clock) -> alerting.AlertStore:
    """Where the Alertmanager receiver holds each pool's firing alerts (on the API server's
    clock, as the alerts are held against the tick's now)."""
    return alerting.AlertStore(
        {PoolName(p.name): p.alert_selectors() for p in settings.pools},
        max_age=settings.alertmanager.max_age,
        max_life=settings.alertmanager.max_life,
        clock=server_clock,
    )


def _events(
    settings: Settings, api: Any, me: str, server_clock: Clock, keys: Keys
) -> EventRecorder:
    """Events on the nodes (their times on the API server's clock); none in a dry run (an
    Event is a write)."""
    if settings.dry_run:
        return NoEvents()
    return KubeEvents(
        api, instance=me, clock=server_clock, cluster=settings.cluster_name, keys=keys
    )


async def open_audit_store(settings: Settings) -> SqlAuditStore:
    return await SqlAuditStore.open(settings.audit.url)


async def _store_for(settings: Settings, role: Role) -> AuditStore:
    """The audit store; for an operator's command, one that cannot be opened is worked around
    (``UnreachableStore``: every record kept on its node) rather than refused, since taking
    nodes back is what the command is for. A store a newer release migrated stays refused:
    run the release that reads it."""
    try:
        return await open_audit_store(settings)
    except NewerSchema:
        raise
    except UnopenedStore as exc:
        if role is not Role.OPERATOR:
            raise
        log.warning("%s; each record is kept on its node until the store takes it", exc)
        return UnreachableStore(exc)


# ---------------------------------------------------------------------------------------------
# The composition root


class Role(StrEnum):
    """What the built controller is for."""

    CONTROLLER = "controller"  # ``rebalancer run`` and the demo: informer, election, HTTP, loop
    # ``rebalancer reclaim``: an operator's command is not the controller and holds no lease, so
    # its writer is not gated (every node write still carries the resourceVersion it read, so a
    # race is a 409); no HTTP server, no informer running.
    OPERATOR = "operator"


@dataclass(frozen=True)
class Seams:
    """What a caller hands the composition root instead of letting it build the real thing."""

    kubeconfig: Path | None = None  # when ``api`` is None: else in-cluster, else the default
    context: str | None = None  # the kubeconfig's context (None: its current one)
    api: Any = None  # a kubernetes_asyncio ApiClient, owned by the caller
    clock: Clock = utc_now
    metrics: MetricsSource | None = None  # None: Prometheus, with each pool's queries
    audit_store: AuditStore | None = None  # None: ``settings.audit.url``; given: caller closes it
    new_id: NewId | None = None  # audit record ids (None: ULIDs on the wall clock)
    sink: Sink | None = stdout_sink  # where each stored audit record is also written as JSON
    name: str | None = None  # this process's identity (None: ``identity()``, from POD_NAME)
    serve_http: bool = True  # the HTTP API (/metrics, the audit API) and the probes' port
    # The file the settings were read from, read again when it changes (``runtime.livesettings``;
    # the controller's role only). None: the settings are fixed for the process's life.
    settings_file: livesettings.SettingsSource | None = None


@dataclass
class Controller:
    """Every part of one controller, connected; ``Controller.open`` builds it from settings."""

    settings: Settings
    role: Role
    identity: str
    clock: Clock  # the API server's: what node writes and the tick's now are told on
    api: Any
    keys: Keys
    pools: tuple[PoolConfig, ...]
    writer: NodeWriter  # what the actuators write through (leader-gated when elected)
    informer: Informer
    metrics: MetricsSource
    store: AuditStore
    audit_log: AuditLog
    telemetry: Telemetry
    events: EventRecorder
    elector: LeaderElector | None
    leadership: Leadership
    reconciler: Reconciler
    server: http.HttpServer | None = None
    alerts: alerting.AlertStore | None = None
    requests: EvictionRequests | None = None  # a notice's EvictionRequests, for new actuators
    watch: livesettings.SettingsWatch | None = None  # the settings file, when read again
    settings_metrics: livesettings.SettingsMetrics | None = None
    # The full collections, run between ticks while ``run`` runs (``runtime.collecting``).
    collections: collecting.FullCollections = dataclasses.field(
        default_factory=collecting.FullCollections
    )

    @property
    def pod(self) -> str:
        """The pod this process runs in, as its identity names it (``leadership.pod_of``)."""
        return leadership.pod_of(self.identity)

    @staticmethod
    @asynccontextmanager
    async def open(
        settings: Settings, seams: Seams | None = None, role: Role = Role.CONTROLLER
    ) -> AsyncIterator[Controller]:
        """Everything built (and the HTTP server serving); all of it closed when the block
        ends, except what ``seams`` handed in."""
        seams = seams or Seams()
        me, own_clock = seams.name or identity(), seams.clock
        async with AsyncExitStack() as stack:
            api = await _api_for(seams, stack)
            # Every time the controller writes on a node or compares with one is told on the
            # API server's clock (docs/design/clocks.md); the lease keeps the controller's own.
            probe = kubeclient.ClockProbe(own_clock)
            probe.watch(api)
            server_clock: Clock = probe.now
            telemetry = _telemetry(settings)
            elector, leadership, writer = _leadership(
                settings, role, api, me, own_clock, telemetry, server_clock
            )
            # A follower (or a candidate not yet won) says 0 from the start, not its first tick.
            telemetry.set_leader(me, leadership.may_write(leadership.now()))
            prometheus: PoolMetricsRouter | None = None  # whose clocks are read, when built here
            metrics = seams.metrics
            if metrics is None:
                metrics = prometheus = _prometheus(settings, stack, own_clock)
            store = await _audit_store_for(settings, seams, role, stack)
            audit_log = _audit_log(settings, seams, store, telemetry)
            keys = signed_keys(settings, warn=role is Role.CONTROLLER)
            pools = pool_configs(settings)
            alert_store = _alert_store(settings, server_clock)
            events = _events(settings, api, me, server_clock, keys)
            informer = _informer(settings, role, api)
            requests = _eviction_requests(api, keys, leadership, me)
            reconciler = _reconciler(
                settings,
                role,
                pools,
                keys=keys,
                writer=writer,
                informer=informer,
                metrics=metrics,
                server_clock=server_clock,
                audit_log=audit_log,
                leadership=leadership,
                events=events,
                alerts=alert_store,
                apiserver_clock=probe,
                prometheus_clock=prometheus,
                requests=requests,
            )
            built = Controller(
                settings, role, me, server_clock, api, keys, pools, writer, informer, metrics,
                store, audit_log, telemetry, events, elector, leadership, reconciler,
            )  # fmt: skip
            built.alerts, built.requests = alert_store, requests
            built._watch(seams.settings_file)
            if role is Role.CONTROLLER and seams.serve_http:
                built.server = await stack.enter_async_context(built._http())
            yield built

    def _http(self) -> http.HttpServer:
        def ready() -> http.Readiness:
            holder = self.elector.holder if self.elector is not None else ""
            failing = self.audit_log.failing if self.reconciler.ledger is not None else None
            return http.readiness(
                self.informer.synced.is_set(), self.elector is not None, holder, failing
            )

        token = self.settings.alertmanager.token
        receiver = None
        if self.alerts is not None:
            receiver = alerting.Receiver(
                self.alerts,
                token=None if token is None else token.get_secret_value(),
                leading=lambda: self.leadership.may_write(self.leadership.now()),
            )
        web = self.settings.http
        return http.HttpServer(
            telemetry=self.telemetry,
            store=self.store,
            ready=ready,
            gate=_gate(self.settings, self.api),
            host=web.host,
            port=web.port,
            health_port=web.health_port,
            tls=tls.context(web.tls.cert_file, web.tls.key_file),
            alertmanager_audience=web.alertmanager_audience,
            alerts=receiver,
            explain=self._explain,
        )

    def _explain(self, node: str | None, pool: str | None) -> dict[str, Any] | None:
        """``GET /api/v1/explain``: from the loop's last tick; None before the first."""
        decided = self.reconciler.last_decided
        if decided is None:
            return None
        return explaining.answer(
            self.reconciler, *decided, node=node, pool=pool, answered=self.clock()
        )

    @asynccontextmanager
    async def informed(self, timeout: float) -> AsyncIterator[None]:
        """The informer running, its first list done within ``timeout`` (``TimeoutError``
        otherwise), for a command that reads the cluster once (explain, check); stopped when
        the block ends."""
        task = asyncio.create_task(self.informer.run())
        try:
            await asyncio.wait_for(self.informer.synced.wait(), timeout)
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _watch(self, source: livesettings.SettingsSource | None) -> None:
        """The settings file watched from now, for the controller that runs the loop."""
        if source is None or self.role is not Role.CONTROLLER:
            return
        self.watch = livesettings.SettingsWatch.of(source)
        self.settings_metrics = livesettings.SettingsMetrics(
            self.telemetry.registry, self.watch.judged
        )

    async def reload_settings(self) -> livesettings.Outcome | None:
        """The settings file read again if its content changed, and what runs from the next
        tick on: its live changes taken, the rest kept and said (``runtime.livesettings``).
        Said in the log, by an Event on this replica's Pod and by the metrics."""
        if self.watch is None:
            return None
        outcome = self.watch.check(self.settings)
        if outcome is None:
            return None
        if outcome.settings is not None:
            self._run_by(outcome.settings)
        if self.settings_metrics is not None:
            self.settings_metrics.reloaded(outcome, self.clock())
        await self._say(outcome)
        return outcome

    def _run_by(self, settings: Settings) -> None:
        """The reconciler reconfigured for ``settings`` (restart-only fields as they run)."""
        pools = kept_strategies(self.pools, pool_configs(settings))
        cache = self.informer if self.role is Role.CONTROLLER else NoCache()
        made = actuators(
            pools, self.writer, self.keys, self.clock, settings.dry_run, cache, self.requests
        )
        changed = Reconfigured(
            actuators={name: RecordingActuator(a, self.events) for name, a in made.items()},
            paused=settings.paused,
            frozen=settings.frozen,
            clock_bound=settings.clock_skew_bound,
            strategy_timeout=settings.strategy_timeout,
            lend_concurrency=settings.lend_concurrency,
        )
        self.reconciler.reconfigure(pools, changed)
        self.settings, self.pools = settings, pools
        # A strategy changed live has its series at zero too, as one configured at start.
        self.telemetry.prepare({p.name: p.strategy.name for p in settings.pools})
        logging.getLogger().setLevel(settings.log_level)

    async def _say(self, outcome: livesettings.Outcome) -> None:
        """The outcome in the log (a warning unless all of it was taken) and as an Event on
        this replica's Pod: each replica reads its own copy of the file, so each says what it
        made of it where ``kubectl describe pod`` shows it."""
        refused = outcome.result in (livesettings.REFUSED, livesettings.RESTART_NEEDED)
        log.log(logging.WARNING if refused else logging.INFO, "%s", outcome.summary())
        if isinstance(self.events, KubeEvents):
            await self.events.record(settings_event(outcome, self.pod, pod_namespace()))

    async def tick(self) -> TickReport:
        """One tick of the reconciler, its report given to the controller's metrics; a changed
        settings file is read first, so that the tick runs by it."""
        await self.reload_settings()
        report = await self.reconciler.tick()
        self.telemetry.record(report)
        return report

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Until SIGTERM/SIGINT (or ``stop``): the informer, the election and the loop."""
        if self.role is not Role.CONTROLLER:
            raise RuntimeError(f"a controller built for {self.role} does not run the loop")
        with self.collections.between_ticks():
            return await run_controller(
                self.tick,
                informer=self.informer,
                elector=self.elector,
                edges=self.reconciler.next_edge,
                interval=self.settings.tick_interval,
                stop=stop,
                alerts=self.alerts,
                settings=self.watch,
                after_tick=self.collections.after_tick,
            )


def _telemetry(settings: Settings) -> Telemetry:
    """The controller's metrics, every configured pool's counted series there at zero."""
    strategies = {p.name: p.strategy.name for p in settings.pools}
    return Telemetry(cluster=settings.cluster_name, pools=strategies)


def _audit_log(
    settings: Settings, seams: Seams, store: AuditStore, telemetry: Telemetry
) -> AuditLog:
    """The cluster's audit log; every record it writes is also told to the telemetry, whose
    decision log series the dashboard reads (docs/design/decision-dashboard.md)."""
    return AuditLog(
        store,
        sink=seams.sink,
        new_id=seams.new_id,
        cluster=settings.cluster_name,
        listener=telemetry.audited,
    )


SETTINGS_EVENTS = {
    livesettings.APPLIED: ("Normal", "SettingsApplied"),
    livesettings.UNCHANGED: ("Normal", "SettingsApplied"),
    livesettings.RESTART_NEEDED: ("Warning", "SettingsNeedRestart"),
    livesettings.REFUSED: ("Warning", "SettingsRefused"),
}


def settings_event(outcome: livesettings.Outcome, pod: str, namespace: str) -> NodeEvent:
    """The Event a reload is worth, about this replica's Pod."""
    kind, reason = SETTINGS_EVENTS[outcome.result]
    return NodeEvent(
        pod, kind, reason, "Reload", outcome.summary(), kind="Pod", namespace=namespace
    )


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_namespace(
    environ: Mapping[str, str] = os.environ, mounted: Path = SERVICE_ACCOUNT_NAMESPACE
) -> str:
    """This replica's namespace: ``POD_NAMESPACE`` (the chart sets it from the downward API),
    else its service account's, else ``default``."""
    given = environ.get("POD_NAMESPACE", "").strip()
    if given:
        return given
    try:
        return mounted.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _gate(settings: Settings, api: Any) -> kubeauth.Gate:
    """Who may use the HTTP API: the cluster says (TokenReview, SubjectAccessReview), unless
    ``http.authentication`` is none, which is said loudly at every start."""
    if settings.http.authentication == "none":
        log.warning(
            "http.authentication is none: anyone who reaches port %d may read /metrics, the "
            "audit log (/api/v1/decisions) and /api/v1/explain, and post to "
            "/api/v1/alertmanager (take loans back and hold pools); no token is checked. Keep "
            "it so only behind a proxy that authenticates and authorizes every request",
            settings.http.port,
        )
        return kubeauth.OpenGate()
    return kubeauth.CachedGate(kubeauth.KubeReviews(api), time.monotonic)


def _leadership(
    settings: Settings,
    role: Role,
    api: Any,
    me: str,
    own_clock: Clock,
    telemetry: Telemetry,
    server_clock: Clock,
) -> tuple[LeaderElector | None, Leadership, NodeWriter]:
    """Who may write (on the process's own clock, as a Lease is), and the writer that holds
    every node write to it (its times on the API server's)."""
    kube = KubeWriter(client.CoreV1Api(api), clock=server_clock)
    le = settings.leader_election
    if role is Role.OPERATOR or not le.enabled or settings.dry_run:
        # A dry run writes nothing, not even a Lease: it plans and audits as if leading
        # (docs/design/dry-run.md).
        return None, AlwaysLeader(identity=me, now=own_clock), kube
    # The gauge follows the Lease as the elector sees it change (set after the write that won
    # it, cleared before the release write), not the next tick.
    elector = LeaderElector(
        api,
        name=le.lease_name,
        namespace=le.lease_namespace,
        identity=me,
        timings=adapterconfig.timings(settings),
        on_started=lambda _term: telemetry.set_leader(me, True),
        on_stopped=lambda _term, _why: telemetry.set_leader(me, False),
    )
    return elector, elector, LeaderGatedWriter(kube, elector.may_write, elector.now, me)


async def _api_for(seams: Seams, stack: AsyncExitStack) -> Any:
    """The caller's API client, else one built from the kubeconfig and closed with ``stack``."""
    if seams.api is not None:
        return seams.api
    return await stack.enter_async_context(kubeclient.api_client(seams.kubeconfig, seams.context))


async def _audit_store_for(
    settings: Settings, seams: Seams, role: Role, stack: AsyncExitStack
) -> AuditStore:
    """The caller's audit store (the caller closes it), else one opened here and closed with
    ``stack``."""
    if seams.audit_store is not None:
        return seams.audit_store
    store = await _store_for(settings, role)
    stack.push_async_callback(store.close)
    return store


def _prometheus(settings: Settings, stack: AsyncExitStack, own_clock: Clock) -> PoolMetricsRouter:
    """Each pool's Prometheus, whose skew is measured against the process's own clock."""
    by_pool = {
        PoolName(p.name): Metrics(adapterconfig.metrics_settings(settings, p), clock=own_clock)
        for p in settings.pools
    }
    for metrics in by_pool.values():
        stack.callback(metrics.close)
    return PoolMetricsRouter(by_pool)
