"""The simulator's training queue: gangs bound whole, restarts from the last checkpoint, and
figures that hold together on a replayed trace."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from rebalancer.adapters import registry
from rebalancer.core import model, nodestate
from rebalancer.core.policy import default_lend_spec
from sandbox.sim import engine, jobs, report
from sandbox.sim.pool import FakePool
from sandbox.sim.traces import MINUTE, Trace

START = datetime(2024, 5, 10, tzinfo=UTC)
KEYS = nodestate.Keys()
SPEC = default_lend_spec(KEYS)


def pool_of(size: int, training: jobs.TrainingModel) -> FakePool:
    return FakePool(
        size,
        SPEC,
        KEYS,
        timedelta(minutes=2),
        timedelta(minutes=5),
        allocatable=training.allocatable,
    )


def plan_of(action: model.Action, nodes: Iterable[str]) -> model.Plan:
    intent = model.Intent(
        engine.POOL, action, 1, model.Origin.STRATEGY, model.Reason.STRATEGY, "by hand"
    )
    steps = tuple(
        model.Step(engine.POOL, model.NodeName(n), action, intent.reason, "by hand", intent)
        for n in nodes
    )
    pool_plan = model.PoolPlan(engine.POOL, (intent,), steps, (), (), "by hand")
    return model.Plan(START, {engine.POOL: pool_plan})


def carry_out(
    pool: FakePool, queue: jobs.Queue, action: model.Action, nodes: list[str], now: datetime
) -> None:
    """What the engine does after the planner: the pool moves, then the queue reacts."""
    plan = plan_of(action, nodes)
    pool.apply(plan.steps, now, decision="test")
    queue.react(plan, now, pool)


def pods_of(pool: FakePool, job: str) -> dict[str, int]:
    return {
        n.name: sum(1 for p in n.borrowed_pods if p.job == job)
        for n in pool.nodes()
        if any(p.job == job for p in n.borrowed_pods)
    }


def test_a_gang_is_bound_whole_or_not_at_all() -> None:
    training = jobs.TrainingModel(backlog=1, sizes=(4,), hours=(2.0, 2.0))
    pool, queue = pool_of(6, training), jobs.Queue(training, SPEC.add_taints)
    queue.arrive(START, pool)
    assert [p.job for p in queue.takers()] == ["job-0001"] * 4
    carry_out(pool, queue, model.Action.LEND, ["node-0", "node-1", "node-2"], START)
    assert queue.jobs["job-0001"].started is None
    assert pods_of(pool, "job-0001") == {}
    carry_out(pool, queue, model.Action.LEND, ["node-3"], START + MINUTE)
    assert queue.jobs["job-0001"].started == START + MINUTE
    assert pods_of(pool, "job-0001") == {f"node-{i}": 1 for i in range(4)}
    assert queue.takers() == ()  # the next job arrives with the next minute
    assert queue.figures().gangs_half_running == 0


def test_a_reclaim_stops_the_whole_gang_and_restarts_it_from_its_last_checkpoint() -> None:
    training = jobs.TrainingModel(backlog=1, sizes=(2,), hours=(2.0, 2.0))
    pool, queue = pool_of(4, training), jobs.Queue(training, SPEC.add_taints)
    queue.arrive(START, pool)
    carry_out(pool, queue, model.Action.LEND, ["node-0", "node-1"], START)
    later = START + timedelta(minutes=45)  # one checkpoint saved, 15 minutes since
    queue.arrive(later, pool)
    carry_out(pool, queue, model.Action.RECLAIM, ["node-0"], later)
    job = queue.jobs["job-0001"]
    assert (job.started, job.attempt, job.done) == (None, 1, timedelta(minutes=30))
    assert pods_of(pool, "job-0001") == {}  # its pod on node-1, still lent, stopped too
    figures = queue.figures()
    assert figures.lost_gpu_hours == pytest.approx(15 / 60 * 2 * 8)
    assert (figures.preemptions, figures.jobs_preempted, figures.gangs_half_running) == (1, 1, 0)
    assert {p.name for p in queue.takers() if p.job == "job-0001"} == {
        "job-0001-1-0",
        "job-0001-1-1",
    }


def test_a_restarted_job_runs_only_the_work_its_checkpoint_did_not_save() -> None:
    training = jobs.TrainingModel(backlog=1, sizes=(1,), hours=(2.0, 2.0))
    pool, queue = pool_of(2, training), jobs.Queue(training, SPEC.add_taints)
    queue.arrive(START, pool)
    carry_out(pool, queue, model.Action.LEND, ["node-0"], START)
    preempted = START + timedelta(minutes=70)  # two checkpoints: 60 minutes saved
    carry_out(pool, queue, model.Action.RECLAIM, ["node-0"], preempted)
    carry_out(pool, queue, model.Action.LEND, ["node-1"], preempted)
    assert queue.jobs["job-0001"].started == preempted
    queue.arrive(preempted + timedelta(minutes=59), pool)
    assert "job-0001" in queue.jobs
    queue.arrive(preempted + timedelta(minutes=60), pool)
    assert "job-0001" not in queue.jobs
    assert pods_of(pool, "job-0001") == {}
    assert queue.figures().jobs_completed == 1


def day_and_night() -> Trace:
    """Two days: 40 rps by night, 100 by day, a 20-minute spike at 150 each afternoon."""
    rps: list[float | None] = []
    for minute in range(2 * 24 * 60):
        hour = minute // 60 % 24
        rps.append(150.0 if hour == 15 and minute % 60 < 20 else 100.0 if 8 <= hour < 20 else 40.0)
    return Trace(name="days", source="days", start=START, rps=rps, native_step=MINUTE)


@pytest.mark.parametrize(
    ("name", "baseline"), [("forecast", False), ("reactive", True), ("cron", True)]
)
def test_the_training_figures_hold_together_on_a_replayed_trace(name: str, baseline: bool) -> None:
    training = jobs.TrainingModel()
    run = engine.run(
        day_and_night(), registry.build(name), engine.PoolModel(), baseline, training=training
    )
    t = run.training
    assert t is not None
    assert t.lent_gpu_hours == pytest.approx(run.figures.lent_node_hours * 8, abs=0.01)
    assert 0 < t.used_gpu_hours <= t.lent_gpu_hours
    assert t.used_share == pytest.approx(t.used_gpu_hours / t.lent_gpu_hours, abs=1e-4)
    assert t.gangs_half_running == 0
    assert t.jobs_completed < t.jobs_submitted
    assert t.jobs_preempted <= t.preemptions
    assert (t.lost_gpu_hours > 0) == (t.preemptions > 0)
    # Every loss is under one checkpoint interval of the largest gang's GPUs.
    assert t.lost_gpu_hours <= t.preemptions * 0.5 * 4 * 8


def test_the_same_seed_gives_the_same_figures_and_another_seed_other_jobs() -> None:
    trace, pool = day_and_night(), engine.PoolModel()

    def figures(seed: int) -> jobs.TrainingFigures | None:
        strategy = registry.build(registry.DEFAULT)
        return engine.run(trace, strategy, pool, training=jobs.TrainingModel(seed=seed)).training

    assert figures(7) == figures(7)
    assert figures(7) != figures(8)


def test_without_a_training_queue_a_run_is_what_it_always_was() -> None:
    trace, pool = day_and_night(), engine.PoolModel()
    strategy = registry.build(registry.DEFAULT)
    plain = engine.run(trace, strategy, pool)
    off = engine.run(trace, registry.build(registry.DEFAULT), pool, training=None)
    on = engine.run(trace, registry.build(registry.DEFAULT), pool, training=jobs.TrainingModel())
    assert (off.figures, off.timeline, off.training) == (plain.figures, plain.timeline, None)
    assert on.figures != plain.figures  # the queue is a code path that changes the run
    rps = pool.calibrate(trace)
    summary = report.summarise(trace, pool, rps, [off])
    assert summary["training"] is None
    assert "training" not in summary["strategies"][registry.DEFAULT]
    assert "## Training on lent nodes" not in report.markdown(summary)
