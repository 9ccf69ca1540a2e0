"""The what-if simulator: replay a trace, minute by minute, through a strategy and the planner.

This implements docs/evaluation.md (the pool model and figures every report uses). Each minute:

1. the fake pool finishes the reclaims whose drain has ended, and begins those whose notice is
   up (its pods answered, or their time came: ``FakePool.begin_due``);
2. a Snapshot is built with what the metric pipeline would show: the demand of the minute
   before, sampled ``sample_age`` ago, and the history up to there (never later);
3. the strategy proposes and ``core.tick.plan_tick`` decides, exactly as in the controller;
4. the fake pool carries out the steps with the node-state codec's transitions;
5. the minute is scored against the demand that actually arrived.

With a training queue (``sandbox.sim.jobs``, opt-in) the pool lends only to takers: before
step 2 finished jobs end and new ones arrive, their pods go into the snapshot as takers, and
after step 4 the queue preempts what was reclaimed and binds waiting gangs to lent nodes. With a
reclaim notice (``PoolModel.notice``) a strategy's reclaim of a node that runs a job tells the
job first; the job saves and answers, or does not (``jobs.TrainingModel``), and the queue
preempts it when the reclaim begins in step 1.

The baselines (and the oracle) run through the same planner without the guards in
``BASELINE_DROPS`` and without churn limits, so that their own rule shows: nothing protects them
from themselves. The oracle is the one place that sees the future: it is handed the physical
limit (``oracle_plan``), within the pool's lending window, which holds for the oracle too.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ClassVar

from rebalancer.core import demand as demand_belief
from rebalancer.core import exposure, model, nodestate, notice, tick, windows
from rebalancer.core.policy import ALL_GUARDS, Guard, PoolPolicy
from rebalancer.core.strategy import Strategy
from rebalancer.errors import TraceError
from sandbox.sim import jobs, nights
from sandbox.sim.pool import FakePool
from sandbox.sim.traces import MINUTE, Trace

POOL = model.PoolName("sim")
SHORT_LOAN = timedelta(minutes=30)
# The planner's guards a baseline runs without. What stays: pauses, windows, ``min_serving``,
# and the rules on which nodes may move (idle, ready, not paused by an operator).
BASELINE_DROPS = frozenset(
    {
        Guard.METRICS,
        Guard.DEMAND_DROP_HOLD,
        Guard.HEADROOM,
        Guard.MAX_LENT_FRACTION,
        Guard.DEMAND_ABOVE_SERVING,
        Guard.QUEUE_LIMIT,
        Guard.ERROR_BUDGET,
    }
)


@dataclass(frozen=True)
class PoolModel:
    """The simulated pool (docs/evaluation.md). A node serves ``rps_per_node``, the pool's own
    figure when its settings are given, else calibrated from the trace (``calibrate``).
    ``rules`` is the pool's own policy (limits, window, lend spec) when its settings are given,
    else the planner's defaults; either way the fields above it win (the command's flags)."""

    size: int = 16
    min_serving: int = 2
    headroom: float = 0.2
    drain: timedelta = timedelta(seconds=120)
    warmup: timedelta = timedelta(seconds=300)
    sample_age: timedelta = timedelta(seconds=30)
    peak_share: float = 0.9  # calibrated: the peak minute needs this share of the pool
    zone: str = "UTC"
    gpus_per_node: int = 8  # for GPU-hours; the training queue's nodes have as many
    rps_per_node: float | None = None  # None: calibrated from the trace
    rules: PoolPolicy | None = None  # None: the planner's defaults, lending at any hour
    # How far ahead the pods of a strategy's reclaim are told (the policy's ``reclaim_notice``,
    # whatever ``rules`` say); zero: evicted at once, as before notices.
    notice: timedelta = timedelta(0)

    @property
    def return_minutes(self) -> int:
        return math.ceil((self.drain + self.warmup) / MINUTE)

    @property
    def lead_minutes(self) -> int:
        """From a noticed reclaim's decision until the node serves warm, at the latest."""
        return math.ceil((self.notice + self.drain + self.warmup) / MINUTE)

    @property
    def window(self) -> windows.Window:
        return windows.ALWAYS if self.rules is None else self.rules.window

    def need(self, rps: float, rps_per_node: float) -> int:
        """Nodes ``rps`` needs warm: its share with headroom, never fewer than ``min_serving``."""
        return model.nodes_needed(rps, rps_per_node, self.headroom, self.min_serving)

    def capacity(self, trace: Trace) -> float:
        """Requests per second one node serves: the pool's own figure, else calibrated."""
        return self.calibrate(trace) if self.rps_per_node is None else self.rps_per_node

    def calibrate(self, trace: Trace) -> float:
        """Requests per second one node serves, so that the peak needs ``peak_share`` of it."""
        if trace.peak <= 0:
            raise TraceError(
                f"trace {trace.name} has no demand above zero: nothing to calibrate a node on"
            )
        return trace.peak / (self.peak_share * self.size)

    def lendable(self, trace: Trace) -> list[bool] | None:
        """Per minute of ``trace``, whether the window lets a node be lent (None: always): open
        then and, with a notice, still open at the notice's end, as the planner lends (no loan
        its window takes back before its pods could be told in full, and every loan noticed
        that long before the window closes)."""
        now = nights.lendable(self.window, trace.start, trace.minutes)
        if now is None or not self.notice:
            return now
        later = nights.lendable(self.window, trace.start + self.notice, trace.minutes)
        assert later is not None, "the same window"
        return [a and b for a, b in zip(now, later, strict=True)]

    def policy(self, rps_per_node: float, baseline: bool = False) -> PoolPolicy:
        """The planner's limits for this pool; a baseline runs without ``BASELINE_DROPS`` and
        without churn limits (no cooldown, no minimum loan, no per-tick limit).

        Lending only to takers is off whatever the settings say: the engine turns it on with a
        training queue, and without one no pod would ever take a loan."""
        base_policy = replace(
            PoolPolicy(rps_per_node=rps_per_node) if self.rules is None else self.rules,
            rps_per_node=rps_per_node,
            min_serving=self.min_serving,
            headroom=self.headroom,
            reclaim_notice=self.notice,
            reclaim_deadline=self.drain,
            warmup=self.warmup,
            zone=self.zone,
            lend_only_to_takers=False,
        )
        if not baseline:
            return base_policy
        return replace(
            base_policy,
            guards=ALL_GUARDS - BASELINE_DROPS,
            cooldown=timedelta(0),
            min_loan=timedelta(0),
            max_step_fraction=1.0,
        )


@dataclass(frozen=True)
class Minute:
    time: datetime
    demand_rps: float | None
    need: int | None
    serving: int
    lent: int
    returning: int
    queue: float


@dataclass(frozen=True)
class Figures:
    lent_node_hours: float
    oracle_node_hours: float
    harvest_ratio: float
    breach_minutes: int
    headroom_minutes: int
    reclaims: int
    loans: int
    short_loans: int
    notices: int = 0  # reclaims that began as a notice (counted in ``reclaims`` once begun)
    withdrawals: int = 0  # notices withdrawn: those nodes stayed lent


@dataclass(frozen=True)
class Run:
    strategy: str
    baseline: bool
    timeline: list[Minute]
    figures: Figures
    training: jobs.TrainingFigures | None = None  # with a training queue only


def needs(trace: Trace, pool: PoolModel, rps_per_node: float) -> list[int | None]:
    return [None if r is None else pool.need(r, rps_per_node) for r in trace.rps]


def oracle_plan(
    need: Sequence[int | None],
    pool: PoolModel,
    lendable: Sequence[bool] | None = None,
    horizon: int | None = None,
) -> list[int]:
    """With perfect foresight: lend N - max(need) over [t, t + horizon], never < 0, and
    nothing in a minute ``lendable`` says the window is closed in (None: always open). The
    horizon is drain + warm-up unless given: the oracle that runs with a notice looks that much
    further (``simulate``), the oracle harvest is measured against does not.

    A minute without a demand sample counts as needing the whole pool: what it held is unknown.
    """
    horizon = pool.return_minutes if horizon is None else horizon
    worst = [pool.size if n is None else n for n in need]
    plan = [max(0, pool.size - max(worst[t : t + horizon + 1])) for t in range(len(worst))]
    if lendable is None:
        return plan
    return [n if open_ else 0 for n, open_ in zip(plan, lendable, strict=True)]


class Oracle:
    """Follows ``oracle_plan``; the only strategy allowed to know the future."""

    name: ClassVar[str] = "oracle"

    reads_history: ClassVar[bool] = False

    def __init__(self, plan: list[int], start: datetime) -> None:
        self.plan, self.start = plan, start

    def decide(self, pool: model.PoolView) -> model.Proposal:
        index = (pool.now - self.start) // MINUTE
        return model.Proposal(self.plan[index], "oracle: perfect foresight")


def run(
    trace: Trace,
    strategy: Strategy,
    pool_model: PoolModel,
    baseline: bool = False,
    keys: nodestate.Keys | None = None,
    on_minute: Callable[[], object] | None = None,
    slo: model.Slo | None = None,
    training: jobs.TrainingModel | None = None,
    on_steps: Callable[[int, tuple[model.Step, ...]], object] | None = None,
    shown: Shown | None = None,
) -> Run:
    """Replay ``trace`` through ``strategy``; with ``training``, lend only to its queue's jobs.
    ``on_steps`` is told each minute's steps (its index, the planner's steps), for a caller that
    holds the run to its decisions. ``shown``: what the metric pipeline shows each minute
    (``Shown.of``), when the caller has it from another run of the same trace and pool."""
    keys = keys or nodestate.Keys()
    rps_per_node = pool_model.capacity(trace)
    policy = pool_model.policy(rps_per_node, baseline)
    room = None
    trainer = None
    if training is not None:
        policy = replace(policy, lend_only_to_takers=True)
        room = training.allocatable
        trainer = jobs.Queue(training, policy.lend_spec.add_taints)
    fake = FakePool(
        pool_model.size,
        policy.lend_spec,
        keys,
        pool_model.drain,
        pool_model.warmup,
        allocatable=room,
    )
    need = needs(trace, pool_model, rps_per_node)
    timeline: list[Minute] = []
    queue = 0.0
    counted: Counter[str] = Counter()
    if shown is None:
        shown = Shown.of(trace, pool_model, policy)
    shown.check(trace, pool_model, policy)
    breaches: deque[int] = deque()  # the breached minutes within the SLO's window
    jumps = None if slo is None else exposure.Jumps(exposure.shape_of(policy))
    controls = {POOL: tick.PoolControls(policy)}  # the same every minute: built once
    for t, demand in enumerate(trace.rps):
        now = trace.start + MINUTE * t
        takers = _before_the_tick(now, fake, trainer)
        budget = None if slo is None else _budget(slo, breaches, t)
        snapshot = _read_pool(trace, t, now, fake, queue, shown, budget, takers, jumps)
        lent_now = fake.counts(now)[1]
        view = policy.view(POOL, now, snapshot.pools[POOL], lent_now)
        answer = _answer(strategy, view)
        plan = tick.plan_tick(snapshot, {POOL: answer}, controls, keys).plan
        steps = plan.steps
        fake.apply(steps, now, decision=f"sim-{t}")
        if on_steps is not None:
            on_steps(t, steps)
        if trainer is not None:
            trainer.react(plan, now, fake)
        counted.update(_kind(s) for s in steps)
        serving, lent, returning = fake.counts(now)
        if demand is not None:
            queue = max(0.0, queue + (demand - rps_per_node * serving) * 60.0)
        timeline.append(Minute(now, demand, need[t], serving, lent, returning, queue))
        if slo is not None and breached(timeline[-1], rps_per_node):
            breaches.append(t)
        if on_minute is not None:
            on_minute()
    figures = score(
        timeline,
        need,
        pool_model,
        rps_per_node,
        fake.loan_minutes,
        counted["lend"],
        fake.reclaims,
        pool_model.lendable(trace),
    )
    figures = replace(figures, notices=counted["notice"], withdrawals=counted["withdraw"])
    trained = None if trainer is None else trainer.figures()
    return Run(strategy.name, baseline, timeline, figures, trained)


def _budget(slo: model.Slo, breaches: deque[int], t: int) -> model.ErrorBudget:
    """The error budget at minute ``t``: ``breaches`` (the breached minutes) kept to the SLO's
    window, and counted."""
    while breaches and breaches[0] <= t - slo.window / MINUTE:
        breaches.popleft()
    return model.ErrorBudget(slo.max_breach_minutes, slo.window, len(breaches))


def _before_the_tick(
    now: datetime, fake: FakePool, trainer: jobs.Queue | None
) -> tuple[model.PendingPod, ...]:
    """Step 1, and the queue's part before the planner: drains end, finished jobs end and new
    ones arrive, the reclaims whose notice is up begin and preempt their jobs; the takers."""
    fake.advance(now)
    if trainer is None:
        fake.begin_due(now, _no_answers)
        return ()
    trainer.arrive(now, fake)
    trainer.evict(fake.begin_due(now, trainer.answers), now, fake)
    return trainer.takers()


def _kind(step: model.Step) -> str:
    """What a step counts as: a lend, a reclaim at once, a notice, a withdrawn notice. The
    reclaims are counted as they begin (``FakePool.reclaims``), a notice's when it is up."""
    if step.action is model.Action.RECLAIM and step.notice > timedelta(0):
        return "notice"
    return step.action.value


def _no_answers(node: model.NodeView, now: datetime) -> tuple[notice.Answer, ...]:
    """Without a training queue no pod runs on a loan, so none is told: nothing answers."""
    return ()


def _answer(strategy: Strategy, view: model.PoolView) -> tick.Unchecked:
    """The strategy's answer, or how it failed: the controller's own rules then apply."""
    try:
        return strategy.decide(view)
    except Exception as exc:
        return tick.Failure.raised(exc)


@dataclass(frozen=True)
class Shown:
    """What the metric pipeline shows at each minute of a trace: the demand of the minute
    before, sampled ``age`` ago, judged by the controller's own demand belief (``core.demand``)
    with ``rule``. It depends on the trace, the age and the drop rule alone, not on what a run
    lends: ``simulate`` judges it once for all its runs of a trace."""

    rule: demand_belief.DropRule
    age: timedelta
    readings: tuple[demand_belief.Reading, ...]  # one a minute

    @classmethod
    def of(cls, trace: Trace, pool_model: PoolModel, policy: PoolPolicy) -> Shown:
        """A gap in the trace is a metrics outage: no sample, so demand is unknown since the
        last good one, exactly as when the controller's read fails."""
        age, rule = pool_model.sample_age, policy.drop_rule
        belief = demand_belief.start(trace.start)
        readings = []
        for t in range(len(trace.rps)):
            now = trace.start + MINUTE * t
            value = trace.rps[t - 1] if t > 0 else None
            seen = None if value is None else model.Sample(value, now - age)
            belief, reading = demand_belief.judge(belief, seen, now, rule)
            readings.append(reading)
        return cls(rule, age, tuple(readings))

    def check(self, trace: Trace, pool_model: PoolModel, policy: PoolPolicy) -> None:
        """Raise unless it is what a run of ``trace`` on ``pool_model`` under ``policy`` is
        shown (its minutes, the sample's age and the drop rule)."""
        if (len(self.readings), self.age, self.rule) != (
            len(trace.rps),
            pool_model.sample_age,
            policy.drop_rule,
        ):
            raise ValueError("shown for another trace, sample age or drop rule than this run's")


def _read_pool(
    trace: Trace,
    t: int,
    now: datetime,
    fake: FakePool,
    queue: float,
    shown: Shown,
    budget: model.ErrorBudget | None,
    takers: tuple[model.PendingPod, ...] = (),
    jumps: exposure.Jumps | None = None,
) -> model.Snapshot:
    """What the controller reads at minute ``t``: the pool's nodes, the demand ``shown``, the
    history up to the minute before ``t`` (never later), the queue aged as the demand is."""
    history = model.DemandHistory(start=trace.start, step=MINUTE, values=trace.rps, end_index=t)
    reading = shown.readings[t]
    pool = model.PoolSnapshot(
        nodes=fake.nodes(),
        demand=reading.demand,
        queue=model.Sample(queue, now - shown.age),
        history=history,
        demand_known=reading.known,
        unknown_since=reading.unknown_since,
        held=reading.held,
        budget=budget,
        cover=None if jumps is None else jumps.cover(history),
        takers=takers,
    )
    return model.Snapshot(now=now, pools={POOL: pool})


def most_spent(timeline: Sequence[Minute], rps_per_node: float, window: timedelta) -> int:
    """The most breach minutes any rolling ``window`` of the run held: what it spent of an error
    budget at its worst."""
    span = window / MINUTE
    held: deque[int] = deque()
    most = 0
    for t, m in enumerate(timeline):
        if breached(m, rps_per_node):
            held.append(t)
        while held and held[0] <= t - span:
            held.popleft()
        most = max(most, len(held))
    return most


def breached(m: Minute, rps_per_node: float) -> bool:
    """A minute whose demand is above what its warm nodes serve (docs/evaluation.md)."""
    return m.demand_rps is not None and rps_per_node * m.serving < m.demand_rps - 1e-9


def score(
    timeline: list[Minute],
    need: list[int | None],
    pool_model: PoolModel,
    rps_per_node: float,
    loan_minutes: list[float],
    loans: int,
    reclaims: int,
    lendable: Sequence[bool] | None = None,
) -> Figures:
    oracle = oracle_plan(need, pool_model, lendable)
    lent_hours = sum(m.lent for m in timeline) / 60.0
    oracle_hours = sum(oracle) / 60.0
    breach = sum(1 for m in timeline if breached(m, rps_per_node))
    short_threshold = SHORT_LOAN / MINUTE
    return Figures(
        lent_node_hours=round(lent_hours, 3),
        oracle_node_hours=round(oracle_hours, 3),
        harvest_ratio=round(lent_hours / oracle_hours, 4) if oracle_hours else 0.0,
        breach_minutes=breach,
        headroom_minutes=sum(1 for m in timeline if m.need is not None and m.serving < m.need),
        reclaims=reclaims,
        loans=loans,
        short_loans=sum(1 for d in loan_minutes if d < short_threshold),
    )
