"""The controller's own Prometheus metrics, on a registry of their own.

The controller owns one ``Telemetry`` and gives it each tick's report (``record``, reading what
the tick's phases noted: ``runtime.report``); the elector sets ``rebalancer_leader`` as the lease
comes and goes. The HTTP server (``runtime.http``) serves ``telemetry.registry`` on
``GET /metrics``. Every value, every time included, is passed in: nothing here reads a clock,
so a test (or the simulator) can drive it with any times it likes.

The registry is a dedicated ``CollectorRegistry``, not prometheus-client's global one: two
controllers in one process (the tests) do not share counters, and the exposition carries only the
controller's metrics (no process or platform collectors, which a Pod's cAdvisor already covers).
``/metrics`` serves ``exposed``: the registry without the library's ``_created`` series.

Every counter and histogram a dashboard or alert reads through ``increase()`` or ``rate()`` is
created at zero when the telemetry is built, for every configured pool (``pools``) and every
label value the core enumerates (``prepare``): a labelled series that appears with its first
event has no earlier sample, so ``increase()`` would miss that event (after every restart), and
a panel over it would say "No data" while nothing is wrong. The label sets are bounded by the
pools and the enums (docs/design/metrics.md#cardinality).

Metrics (docs/http.md has the table):
- ``rebalancer_cluster_info{cluster_name}``: 1, naming the cluster this controller runs in (the
  ``cluster_name`` setting). No other series carries the cluster: as kube-state-metrics and
  Karpenter leave it to Prometheus, so does this controller. A fleet's Prometheus servers give
  every series they scrape a ``cluster`` label (an external label, or a target label), the same
  one as every other exporter's series of that cluster, so a query joins them on it; a
  ``cluster`` label of our own would clash with that one (``exported_cluster``, or an external
  label silently not applied) and could disagree with it. The info series is there to check the
  two names agree, and for a Grafana variable (docs/design/fleet.md).
- ``rebalancer_nodes_lent{pool}``: nodes lent or being lent, as the last snapshot saw them.
- ``rebalancer_decisions_total{pool,kind,action,reason}``: plan steps (``kind="step"``) and
  planner refusals (``kind="refusal"``) of the pool, by action and reason code
  (``core.model.Reason``).
- ``rebalancer_decision_timestamp_seconds{pool,node,action,reason,origin,outcome,id}``: the
  time of each node's latest decision (an audit intent, ``outcome`` its latest outcome or
  ``pending``): the decision log, one live series per node (docs/design/decision-dashboard.md).
- ``rebalancer_reclaims_overdue{pool}``: nodes whose reclaim is past its deadline and not done
  (the drain is forced at the deadline, so a value that stays above 0 means a stuck reclaim).
- ``rebalancer_reclaim_duration_seconds{pool}``: from the reclaim decision to the node serving
  again.
- ``rebalancer_reclaim_notice_seconds{pool}``: how long a reclaim's borrowed pods had between
  its notice and its evictions (0 for a reclaim that gave none).
- ``rebalancer_reclaim_answer_seconds{pool}``: how soon after its notice a borrowed pod
  answered (acknowledged it, or ended).
- ``rebalancer_lost_work_gpu_seconds_total{pool}``: GPUs times the time since their last
  reported checkpoint of the borrowed pods a reclaim evicted unanswered; a pod that never
  reported one is counted in ``rebalancer_reclaim_unreported_pods_total{pool}`` instead.
- ``rebalancer_demand_sample_age_seconds{pool}``: seconds since the last good demand sample
  (``+Inf`` until this process has seen one).
- ``rebalancer_leader{identity}``: 1 while this instance leads, else 0.
- ``rebalancer_audit_store_failures_total{operation}``: audit store calls that raised
  (``AUDIT_OPERATIONS``).
- ``rebalancer_audit_store_failing``: 1 while the leader's writes to the audit store fail (no
  lending; safety reclaims recorded on their nodes and spooled), else 0.
- ``rebalancer_audit_spooled_records``: records waiting in memory (and on their nodes) for the
  store to take them.
- ``rebalancer_audit_spool_overflows_total``: records the full spool refused: the actions they
  describe were not carried out.
- ``rebalancer_strategy_failures_total{pool,strategy,kind}``: strategy calls that raised,
  answered garbage or overran (``kind`` ``raised``, ``invalid``, ``timeout``).
- ``rebalancer_planner_failures_total{pool}``: planner runs for the pool that raised.
- ``rebalancer_pool_safety_only{pool}``: 1 while the pool is planned with the safety-only
  proposal because its strategy or planner fails.
- ``rebalancer_objects_unreadable{kind}``: Nodes and Pods in the cache that cannot be read.
- ``rebalancer_frozen_under_pressure{pool}``: 1 while a freeze (or paused nodes) holds lent nodes
  that demand needs.
- ``rebalancer_demand_held{pool}``: 1 while an implausibly fast fall of demand is held.
- ``rebalancer_node_drift{pool,kind}``: nodes of the pool another writer changed (a state
  that cannot be read, a lost state label or lent taint, a foreign pod on a lent node), or
  that are not where they belong (orphaned, selected by many pools), as the last plan found.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from rebalancer.core import clocks, model
from rebalancer.core.audit import DEFAULT_CLUSTER, AuditRecord, Kind
from rebalancer.core.model import Action, PoolName, Reason
from rebalancer.core.outcomes import Notice
from rebalancer.core.tick import FailureKind
from rebalancer.runtime.report import Happened, TickReport

# A reclaim drains borrowed pods (a grace period of seconds to minutes), then the node warms up
# (image pull, model load): the interesting range is ten seconds to an hour.
RECLAIM_BUCKETS: tuple[float, ...] = (5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
# A notice and its answers: none (0) to a window's worth of notice.
NOTICE_BUCKETS: tuple[float, ...] = (0, 5, 15, 30, 60, 120, 300, 600, 1200, 1800)

STEP = "step"
REFUSAL = "refusal"
# The actions a plan's steps and refusals carry (the planner plans these three).
PLANNED_ACTIONS = (Action.LEND, Action.RECLAIM, Action.WITHDRAW)
# The audit store operations ``rebalancer_audit_store_failures_total`` counts, as the runtime
# names them: a tick's records, an outcome, the error budget's minutes, a start-up recovery,
# and a read of the HTTP API.
AUDIT_OPERATIONS = ("tick", "outcome", "cost", "recover", "query")
# The outcome label of a decision whose intent has no outcome yet.
PENDING = "pending"
# The findings ``rebalancer_node_drift`` counts: a node another writer changed, or that is not
# where it belongs (docs/design/other-writers.md).
DRIFT_KINDS = (
    model.Reason.STATE_UNREADABLE,
    model.Reason.STATE_UNVERIFIED,
    model.Reason.STATE_LABEL_LOST,
    model.Reason.LENT_TAINT_LOST,
    model.Reason.FOREIGN_POD,
    model.Reason.ORPHANED,
    model.Reason.SELECTED_BY_MANY_POOLS,
)


class Telemetry:
    """The metric families and the functions the runtime calls to move them."""

    def __init__(
        self,
        reclaim_buckets: Sequence[float] = RECLAIM_BUCKETS,
        cluster: str = DEFAULT_CLUSTER,
        pools: Mapping[str, str] | None = None,
    ) -> None:
        """``pools``: each configured pool's strategy name, by pool; their series start at 0."""
        self.registry = CollectorRegistry()
        r = self.registry
        self._loan_families(r, cluster, reclaim_buckets)
        self._notice_families(r)
        self._clock_families(r)
        self._audit_families(r)
        self._health_families(r)
        self._budget_families(r)
        self._last_demand: dict[str, datetime] = {}  # pool -> time of its last good sample
        # node -> the labels and the value of its decision series
        self._latest: dict[str, tuple[tuple[str, ...], float]] = {}
        self.exposed = WithoutCreated(self.registry)  # what GET /metrics serves
        self.prepare(pools or {})

    def _loan_families(
        self, r: CollectorRegistry, cluster: str, reclaim_buckets: Sequence[float]
    ) -> None:
        """What is lent and taken back, and how long a reclaim takes."""
        self.cluster_info = Gauge(
            "rebalancer_cluster_info",
            "1, naming the cluster this controller runs in (its cluster_name setting).",
            ["cluster_name"],
            registry=r,
        )
        self.cluster_info.labels(cluster).set(1)
        self.nodes_lent = Gauge(
            "rebalancer_nodes_lent",
            "Nodes of the pool lent to training or being lent, as the last snapshot saw them.",
            ["pool"],
            registry=r,
        )
        self.decisions = Counter(
            "rebalancer_decisions",
            "Plan steps (kind=step) and planner refusals (kind=refusal) by action and reason code.",
            ["pool", "kind", "action", "reason"],
            registry=r,
        )
        self.decision_log = Gauge(
            "rebalancer_decision_timestamp_seconds",
            "The time of the node's latest decision (an audit intent); outcome is its latest "
            "outcome, or pending. One series per node: the previous one goes with the next.",
            ["pool", "node", "action", "reason", "origin", "outcome", "id"],
            registry=r,
        )
        self.reclaims_overdue = Gauge(
            "rebalancer_reclaims_overdue",
            "Nodes of the pool whose reclaim is past its deadline and has not finished.",
            ["pool"],
            registry=r,
        )
        self.reclaim_duration = Histogram(
            "rebalancer_reclaim_duration_seconds",
            "Seconds from a reclaim decision until the node serves inference again.",
            ["pool"],
            buckets=tuple(reclaim_buckets),
            registry=r,
        )

    def _notice_families(self, r: CollectorRegistry) -> None:
        """What a reclaim's notice gave its borrowed pods, and what they lost."""
        self.reclaim_notice = Histogram(
            "rebalancer_reclaim_notice_seconds",
            "Seconds a reclaim's borrowed pods had between its notice and its evictions.",
            ["pool"],
            buckets=NOTICE_BUCKETS,
            registry=r,
        )
        self.reclaim_answer = Histogram(
            "rebalancer_reclaim_answer_seconds",
            "Seconds from a reclaim's notice until a borrowed pod answered it.",
            ["pool"],
            buckets=NOTICE_BUCKETS,
            registry=r,
        )
        self.lost_work = Counter(
            "rebalancer_lost_work_gpu_seconds",
            "GPU-seconds of training since the last reported checkpoint, evicted unanswered.",
            ["pool"],
            registry=r,
        )
        self.unreported = Counter(
            "rebalancer_reclaim_unreported_pods",
            "Borrowed pods evicted unanswered that never reported a checkpoint (loss unknown).",
            ["pool"],
            registry=r,
        )

    def _clock_families(self, r: CollectorRegistry) -> None:
        """How old the demand is, how far the clocks are off, and who leads."""
        self.demand_age = Gauge(
            "rebalancer_demand_sample_age_seconds",
            "Seconds since the last good (finite) demand sample of the pool; +Inf if none yet.",
            ["pool"],
            registry=r,
        )
        self.clock_skew = Gauge(
            "rebalancer_clock_skew_seconds",
            "The clock's offset from this controller's own (positive: it is ahead), the median "
            "of its recent readings; for prometheus the largest of the pools' Prometheus.",
            ["against"],
            registry=r,
        )
        self.clock_uncertainty = Gauge(
            "rebalancer_clock_skew_uncertainty_seconds",
            "How far the measured skew may be off (half the round trip, half the resolution).",
            ["against"],
            registry=r,
        )
        self.clock_untrusted = Gauge(
            "rebalancer_clock_untrusted",
            "1 while the clock is past the skew bound, or cannot be measured: the pool lends "
            "nothing; else 0.",
            ["pool", "against"],
            registry=r,
        )
        self.leader = Gauge(
            "rebalancer_leader",
            "1 while this instance holds the leader lease (may write), else 0.",
            ["identity"],
            registry=r,
        )

    def _audit_families(self, r: CollectorRegistry) -> None:
        """Whether the audit store takes the records, and what waits for it."""
        self.audit_failures = Counter(
            "rebalancer_audit_store_failures",
            "Audit store calls that raised, by operation (tick, outcome, cost, recover, query).",
            ["operation"],
            registry=r,
        )
        self.audit_store_failing = Gauge(
            "rebalancer_audit_store_failing",
            "1 while the audit store fails the leader's writes: nothing is lent, safety "
            "reclaims go on recorded on their nodes and spooled for the store.",
            registry=r,
        )
        self.audit_spooled = Gauge(
            "rebalancer_audit_spooled_records",
            "Audit records waiting, in order, for the store to take them.",
            registry=r,
        )
        self.spool_overflows = Counter(
            "rebalancer_audit_spool_overflows",
            "Records the full audit spool refused: what they describe was not carried out.",
            registry=r,
        )

    def _health_families(self, r: CollectorRegistry) -> None:
        """What fails or holds a pool."""
        self.strategy_failures = Counter(
            "rebalancer_strategy_failures",
            "Strategy calls that raised, answered garbage or overran (kind), by pool.",
            ["pool", "strategy", "kind"],
            registry=r,
        )
        self.planner_failures = Counter(
            "rebalancer_planner_failures",
            "Planner runs for the pool that raised.",
            ["pool"],
            registry=r,
        )
        self.node_drift = Gauge(
            "rebalancer_node_drift",
            "Nodes of the pool another writer changed, or that are not where they belong, by "
            "kind (state_unreadable, state_unverified, state_label_lost, lent_taint_lost, "
            "foreign_pod, orphaned, selected_by_many_pools), as the last plan found them.",
            ["pool", "kind"],
            registry=r,
        )
        self.safety_only = Gauge(
            "rebalancer_pool_safety_only",
            "1 while the pool is planned with the safety-only proposal (strategy or planner "
            "failing): no new loans, safety reclaims still happen.",
            ["pool"],
            registry=r,
        )
        self.unreadable = Gauge(
            "rebalancer_objects_unreadable",
            "Nodes and Pods in the cache that cannot be read; their nodes are left alone.",
            ["kind"],
            registry=r,
        )
        self.frozen_under_pressure = Gauge(
            "rebalancer_frozen_under_pressure",
            "1 while a freeze (or paused nodes) holds lent nodes that demand needs.",
            ["pool"],
            registry=r,
        )
        self.demand_held = Gauge(
            "rebalancer_demand_held",
            "1 while an implausibly fast fall of the pool's demand is held, not yet believed.",
            ["pool"],
            registry=r,
        )

    def _budget_families(self, r: CollectorRegistry) -> None:
        """What lending costs a pool, against its error budget."""
        self.borrowing_cost = Counter(
            "rebalancer_borrowing_cost_minutes",
            "Minutes in which the pool's requests queued beyond its queue_limit while it had "
            "nodes lent: what lending cost, counted by the leader.",
            ["pool"],
            registry=r,
        )
        self.budget_allowed = Gauge(
            "rebalancer_error_budget_allowed_minutes",
            "The minutes per rolling window the pool's slo lets lending cost it (pools with an "
            "slo, set by the leader).",
            ["pool"],
            registry=r,
        )
        self.budget_spent = Gauge(
            "rebalancer_error_budget_spent_minutes",
            "The minutes of the pool's rolling slo window in which lending cost it (requests "
            "queued beyond queue_limit while nodes were away on loan), as the leader counts them.",
            ["pool"],
            registry=r,
        )

    def prepare(self, pools: Mapping[str, str]) -> None:
        """Every counter and histogram series a panel or an alert reads through ``increase()``
        or ``rate()``, at zero, for each pool (with its strategy's name) and each label value
        the core enumerates; so the first event after a start is counted, and a healthy
        controller's panels read 0, not "No data"."""
        for operation in AUDIT_OPERATIONS:
            self.audit_failures.labels(operation)
        for pool, strategy in pools.items():
            for family in (self.reclaim_duration, self.reclaim_notice, self.reclaim_answer):
                family.labels(pool)
            for counter in (self.lost_work, self.unreported, self.planner_failures):
                counter.labels(pool)
            self.borrowing_cost.labels(pool)
            for kind in FailureKind:
                self.strategy_failures.labels(pool, strategy, kind.value)
            for decided in (STEP, REFUSAL):
                for action in PLANNED_ACTIONS:
                    for reason in Reason:
                        self.decisions.labels(pool, decided, action.value, reason.value)

    # -----------------------------------------------------------------------------------------
    # What the controller calls

    def record(self, report: TickReport) -> None:
        """Every metric a tick's report speaks of; a gauge it did not measure keeps its value."""
        noted = report.happened
        self.set_demand_ages(report.snapshot)
        if noted.leader is not None:
            self.set_leader(*noted.leader)
        for plan in noted.decided:
            self.count_decisions(plan)
        self._gauges(noted)
        for failure in noted.strategy_failures:
            self.strategy_failed(*failure)
        for pool in noted.planner_failures:
            self.planner_failed(pool)
        for pool in noted.borrowing_minutes:
            self.borrowing_minute(pool)
        for operation in noted.audit_failures:
            self.audit_failed(operation)
        for _ in range(noted.spool_overflows):
            self.spool_overflowed()
        for reclaim in noted.reclaims:
            self.reclaim_done(*reclaim)
        for pool, notice in noted.notices:
            self.noticed(pool, notice)

    def _gauges(self, noted: Happened) -> None:
        """The gauges a tick measured (``None``: not measured, the last value stays)."""
        if noted.lent is not None:
            self.set_lent(noted.lent)
        if noted.overdue is not None:
            self.set_overdue(noted.overdue)
        if noted.safety_only is not None:
            self.set_safety_only(noted.safety_only)
        if noted.demand_held is not None:
            self.set_demand_held(noted.demand_held)
        if noted.frozen_under_pressure is not None:
            self.set_frozen_under_pressure(noted.frozen_under_pressure)
        if noted.clocks is not None:
            self.set_clocks(noted.clocks)
        if noted.unreadable is not None:
            self.set_unreadable(noted.unreadable)
        if noted.budgets is not None:
            self.set_budgets(noted.budgets)
        if noted.audit_store is not None:
            self.set_audit_store(*noted.audit_store)

    def count_decisions(self, plan: model.Plan) -> None:
        """Count a tick's decisions: one per step and one per refusal, by action and reason;
        and set the nodes each pool found changed by another writer, by kind."""
        for step in plan.steps:
            self.decisions.labels(str(step.pool), STEP, step.action.value, step.reason.value).inc()
        for rejection in plan.rejections:
            action, pool = rejection.intent.action.value, str(rejection.intent.pool)
            self.decisions.labels(pool, REFUSAL, action, rejection.reason.value).inc()
        for pool, pool_plan in plan.pools.items():
            for kind in DRIFT_KINDS:
                nodes = {f.node for f in pool_plan.findings if f.reason is kind}
                self.node_drift.labels(str(pool), kind.value).set(len(nodes))

    def audited(self, record: AuditRecord) -> None:
        """An audit record was written (stored, or spooled for the store): a node's intent
        becomes its decision series, and its outcomes move that series' ``outcome`` label.

        One live series per node, its latest decision: the previous label set goes when the
        next is set (Prometheus keeps the history). An outcome of an intent this process did
        not see (made before a restart) takes its place, at the outcome's time, unless the
        node has a newer intent (ids sort by time); other records are not decisions."""
        if record.node is None or record.kind not in (Kind.INTENT, Kind.OUTCOME):
            return
        node, (current, at) = record.node, self._latest.get(record.node, ((), 0.0))
        decision = record.id
        if record.kind is Kind.OUTCOME:
            decision = record.intent_id or record.id
            if current and current[-1] > decision:
                return  # a late outcome of a decision the node's newer one replaced
        if not current or current[-1] != decision:
            at = record.time.timestamp()  # the intent's, or an outcome's of an unseen intent
        outcome = record.outcome.value if record.outcome is not None else PENDING
        labels = (
            record.pool,
            node,
            record.action.value if record.action is not None else "",
            record.reason,
            record.origin.value if record.origin is not None else "",
            outcome,
            decision,
        )
        if current and current != labels:
            self.decision_log.remove(*current)
        self.decision_log.labels(*labels).set(at)
        self._latest[node] = (labels, at)

    def set_lent(self, lent: Mapping[str, int]) -> None:
        """Set the nodes lent per pool; a pool no longer given loses its series."""
        for pool, count in lent.items():
            self.nodes_lent.labels(pool).set(count)
        self._forget(self.nodes_lent, set(lent))

    def set_overdue(self, overdue: Mapping[str, int]) -> None:
        """Nodes per pool whose reclaim is past its deadline; pools not given lose their series."""
        for pool, count in overdue.items():
            self.reclaims_overdue.labels(pool).set(count)
        self._forget(self.reclaims_overdue, set(overdue))

    def set_demand_age(self, pool: str, sample: model.Sample | None, now: datetime) -> None:
        """The age at ``now`` of the pool's last good demand sample (a finite value).

        A missing or non-finite sample leaves the last good one in place, so the age keeps
        growing; a sample time after ``now`` (clock skew) counts as age 0.
        """
        if sample is not None and math.isfinite(sample.value):
            last = self._last_demand.get(pool)
            if last is None or sample.at > last:
                self._last_demand[pool] = sample.at
        last = self._last_demand.get(pool)
        age = math.inf if last is None else max(0.0, (now - last).total_seconds())
        self.demand_age.labels(pool).set(age)

    def set_clocks(self, measured: Mapping[PoolName, clocks.Clocks]) -> None:
        """Each clock's skew and uncertainty, and per pool whether it is trusted."""
        for against in clocks.Against:
            found = [s for c in measured.values() if (s := c.skew(against)) is not None]
            if found:
                worst = max(found, key=lambda s: abs(s.offset))
                self.clock_skew.labels(against).set(worst.offset.total_seconds())
                self.clock_uncertainty.labels(against).set(worst.uncertainty.total_seconds())
            for pool, c in measured.items():
                skew = c.skew(against)
                untrusted = against in c.unmeasured or (skew is not None and skew.beyond(c.bound))
                self.clock_untrusted.labels(pool, against).set(1 if untrusted else 0)

    def set_demand_ages(self, snapshot: model.Snapshot) -> None:
        """``set_demand_age`` for every pool of the snapshot, at the snapshot's ``now``."""
        for pool, snap in snapshot.pools.items():
            # Aged on Prometheus' clock, as the planner ages it.
            at = clocks.prometheus_now(snap.clocks, snapshot.now)
            self.set_demand_age(str(pool), snap.demand, at)
        pools = {str(p) for p in snapshot.pools}
        self._forget(self.demand_age, pools)
        for gone in set(self._last_demand) - pools:
            del self._last_demand[gone]

    def reclaim_done(self, pool: str, started: datetime, serving: datetime) -> None:
        """A reclaim decided at ``started`` ended with the node serving again at ``serving``."""
        seconds = max(0.0, (serving - started).total_seconds())
        self.reclaim_duration.labels(pool).observe(seconds)

    def noticed(self, pool: str, notice: Notice) -> None:
        """A reclaim's evictions began: what its notice gave, and what the pods lost."""
        self.reclaim_notice.labels(pool).observe(notice.given_seconds)
        for seconds in notice.answer_seconds:
            self.reclaim_answer.labels(pool).observe(seconds)
        self.lost_work.labels(pool).inc(notice.lost_gpu_seconds)
        self.unreported.labels(pool).inc(notice.unknown)

    def set_leader(self, identity: str, leading: bool) -> None:
        """Whether this instance (``identity``, the Lease holder identity) leads now."""
        self.leader.labels(identity).set(1 if leading else 0)

    def audit_failed(self, operation: str) -> None:
        """An audit store call raised (one of ``AUDIT_OPERATIONS``)."""
        self.audit_failures.labels(operation).inc()

    def set_audit_store(self, failing: bool, spooled: int) -> None:
        """Whether the store fails the leader's writes now, and how many records wait."""
        self.audit_store_failing.set(1 if failing else 0)
        self.audit_spooled.set(spooled)

    def spool_overflowed(self) -> None:
        self.spool_overflows.inc()

    def strategy_failed(self, pool: str, strategy: str, kind: str) -> None:
        """A strategy call failed (``raised``, ``invalid``, ``timeout``)."""
        self.strategy_failures.labels(pool, strategy, kind).inc()

    def planner_failed(self, pool: str) -> None:
        self.planner_failures.labels(pool).inc()

    def set_safety_only(self, states: Mapping[str, bool]) -> None:
        self._flags(self.safety_only, states)

    def set_unreadable(self, counts: Mapping[str, int]) -> None:
        for kind, count in counts.items():
            self.unreadable.labels(kind).set(count)

    def set_frozen_under_pressure(self, states: Mapping[str, bool]) -> None:
        self._flags(self.frozen_under_pressure, states)

    def set_demand_held(self, states: Mapping[str, bool]) -> None:
        self._flags(self.demand_held, states)

    def borrowing_minute(self, pool: str) -> None:
        self.borrowing_cost.labels(pool).inc()

    def set_budgets(self, budgets: Mapping[str, model.ErrorBudget]) -> None:
        """The error budget of each pool that has one; pools not given lose their series."""
        for pool, budget in budgets.items():
            self.budget_allowed.labels(pool).set(budget.allowed_minutes)
            self.budget_spent.labels(pool).set(budget.spent_minutes)
        self._forget(self.budget_allowed, set(budgets))
        self._forget(self.budget_spent, set(budgets))

    # -----------------------------------------------------------------------------------------

    def _flags(self, gauge: Gauge, states: Mapping[str, bool]) -> None:
        """One 0/1 series per pool given; pools not given lose theirs."""
        for pool, on in states.items():
            gauge.labels(pool).set(1 if on else 0)
        self._forget(gauge, set(states))

    @staticmethod
    def _forget(gauge: Gauge, keep: Iterable[str]) -> None:
        """Drop the pool series of ``gauge`` that are not in ``keep`` (a pool went away)."""
        wanted = set(keep)
        for pool in _pool_labels(gauge) - wanted:
            gauge.remove(pool)


class WithoutCreated:
    """A registry as served: without the counters' and histograms' ``_created`` series.

    prometheus-client stamps each series with the wall-clock time it was created; the classic
    text format shows that as one more gauge family per counter. The controller exports only
    values it was given, so those are left out (``registry`` itself still has them).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


def _pool_labels(gauge: Gauge) -> set[str]:
    """The ``pool`` label values a gauge has series for."""
    found: set[str] = set()
    for family in gauge.collect():
        for sample in family.samples:
            pool = sample.labels.get("pool")
            if pool is not None:
                found.add(pool)
    return found
