"""The simulator's reclaim notice: a noticed node stays lent until its jobs answer or their time
is up, a withdrawn notice leaves it lent, a job that answers loses nothing, one that does not
loses what it lost before, and with no notice a run is the run it always was.

docs/design/reclaim-notice.md is the protocol; docs/simulator.md says how the simulator plays it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer import cli
from rebalancer.adapters import registry
from rebalancer.core import model, nodestate, tick
from rebalancer.core.policy import default_lend_spec
from sandbox.sim import engine, jobs, traces
from sandbox.sim.pool import FakePool
from sandbox.sim.traces import MINUTE, Trace

START = datetime(2024, 5, 10, tzinfo=UTC)
KEYS = nodestate.Keys()
SPEC = default_lend_spec(KEYS)
NOTICE = timedelta(minutes=5)
TOLD = START + timedelta(minutes=45)  # one periodic checkpoint saved, 15 minutes since
EXAMPLES = Path(__file__).parents[2] / "examples" / "traces"
WEEK = EXAMPLES / "azure_llm_2024_week_per_minute.csv"


def plan_of(action: model.Action, nodes: Iterable[str], notice: timedelta) -> model.Plan:
    intent = model.Intent(
        engine.POOL, action, 1, model.Origin.STRATEGY, model.Reason.STRATEGY, "by hand"
    )
    steps = tuple(
        model.Step(
            engine.POOL,
            model.NodeName(n),
            action,
            intent.reason,
            "by hand",
            intent,
            notice=notice,
        )
        for n in nodes
    )
    pool_plan = model.PoolPlan(engine.POOL, (intent,), steps, (), (), "by hand")
    return model.Plan(START, {engine.POOL: pool_plan})


def carry_out(
    pool: FakePool,
    queue: jobs.Queue,
    action: model.Action,
    nodes: list[str],
    now: datetime,
    notice: timedelta = timedelta(0),
) -> None:
    """What the engine does after the planner: the pool moves, then the queue reacts."""
    plan = plan_of(action, nodes, notice)
    pool.apply(plan.steps, now, decision=f"test-{now:%H%M}")
    queue.react(plan, now, pool)


def minute(pool: FakePool, queue: jobs.Queue, now: datetime) -> list[model.NodeName]:
    """A minute of the engine's in which the planner does nothing: notices whose time has come
    begin, then the queue counts the minute. The nodes begun."""
    pool.advance(now)
    queue.arrive(now, pool)
    begun = pool.begin_due(now, queue.answers)
    queue.evict(begun, now, pool)
    queue.react(plan_of(model.Action.LEND, [], timedelta(0)), now, pool)
    return begun


def lent_one_job(silent: float) -> tuple[FakePool, jobs.Queue, model.NodeName]:
    """A pool with one node lent to a one-node job, told of a reclaim at ``TOLD``."""
    training = jobs.TrainingModel(backlog=1, sizes=(1,), hours=(5.0, 5.0), silent=silent)
    pool = FakePool(
        2, SPEC, KEYS, timedelta(minutes=2), timedelta(minutes=5), allocatable=training.allocatable
    )
    queue = jobs.Queue(training, SPEC.add_taints)
    queue.arrive(START, pool)
    carry_out(pool, queue, model.Action.LEND, ["node-0"], START)
    assert queue.jobs["job-0001"].started == START
    carry_out(pool, queue, model.Action.RECLAIM, ["node-0"], TOLD, NOTICE)
    return pool, queue, model.NodeName("node-0")


def state(pool: FakePool, name: str) -> nodestate.NodeState:
    found = nodestate.read(next(n for n in pool.nodes() if n.name == name), KEYS)
    assert isinstance(found, nodestate.NodeState)
    return found


def test_a_noticed_node_stays_lent_and_reads_back_as_noticed_until_its_job_answers() -> None:
    pool, queue, node = lent_one_job(silent=0.0)
    noticed = state(pool, node)
    assert (noticed.phase, noticed.noticed) == (nodestate.Phase.LENT, True)
    assert noticed.deadline == TOLD + NOTICE
    assert noticed.decision == "test-0045"  # the notice's record: the reclaim id
    view = next(n for n in pool.nodes() if n.name == node)
    assert tick.noticed(view, KEYS, SPEC.add_taints)  # as the planner reads it
    assert pool.counts(TOLD)[1] == 1  # counted lent
    assert queue.jobs["job-0001"].told == TOLD
    # Saving takes two minutes: the node stays lent, the pod on it, till the job answers.
    assert minute(pool, queue, TOLD + MINUTE) == []
    assert state(pool, node).noticed
    assert minute(pool, queue, TOLD + 2 * MINUTE) == [node]
    back = state(pool, node)
    assert (back.phase, back.decision) == (nodestate.Phase.RECLAIMING, "test-0045")
    assert pool.reclaims == 1
    figures = queue.figures()
    assert (figures.lost_gpu_hours, figures.answered_evictions, figures.jobs_told) == (0, 1, 1)
    assert figures.held_gpu_hours == pytest.approx(2 / 60 * 8, abs=1e-3)  # the two minutes it saved
    job = queue.jobs["job-0001"]
    assert (job.started, job.done) == (None, timedelta(minutes=45))  # all of it saved


def test_a_job_that_never_answers_keeps_its_node_till_its_time_is_up_and_loses_as_before() -> None:
    pool, queue, node = lent_one_job(silent=1.0)
    for later in range(1, 5):  # the deadline less the pod's 30 s grace: 4.5 minutes on
        assert minute(pool, queue, TOLD + later * MINUTE) == []
        assert state(pool, node).noticed
    evicted = TOLD + NOTICE
    assert minute(pool, queue, evicted) == [node]
    told = queue.figures()
    # The same job reclaimed at once at that minute loses the same: 20 minutes since its
    # checkpoint at 30, all of it its own (it never answers).
    pool, queue, node = lent_one_job(silent=1.0)
    plan = plan_of(model.Action.RECLAIM, [node], timedelta(0))
    pool.apply(plan.steps, evicted, decision="at-once")
    queue.react(plan, evicted, pool)
    at_once = queue.figures()
    assert told.lost_gpu_hours == at_once.lost_gpu_hours == pytest.approx(20 / 60 * 8, abs=1e-3)
    assert told.lost_silent_gpu_hours == told.lost_gpu_hours
    assert (told.lost_answering_gpu_hours, told.held_gpu_hours) == (0, 0)


def test_a_withdrawn_notice_keeps_the_node_lent_and_the_job_trains_on_from_where_it_stopped() -> (
    None
):
    pool, queue, node = lent_one_job(silent=0.0)
    withdrawn = TOLD + 3 * MINUTE  # after it saved and answered
    assert minute(pool, queue, TOLD + MINUTE) == []
    carry_out(pool, queue, model.Action.WITHDRAW, [node], withdrawn)
    after = state(pool, node)
    assert (after.phase, after.noticed, after.deadline) == (nodestate.Phase.LENT, False, None)
    assert pool.counts(withdrawn)[1] == 1
    for later in range(1, 10):
        assert minute(pool, queue, withdrawn + later * MINUTE) == []
    job = queue.jobs["job-0001"]
    assert (job.told, job.started, job.done) == (None, withdrawn, timedelta(minutes=45))
    assert job.progress(withdrawn + 10 * MINUTE) == timedelta(minutes=55)
    assert pool.reclaims == 0
    assert queue.figures().withdrawn == 1


def test_a_reclaim_that_cannot_wait_cuts_the_notice_short_and_the_save_with_it() -> None:
    pool, queue, node = lent_one_job(silent=0.0)
    carry_out(pool, queue, model.Action.RECLAIM, [node], TOLD + MINUTE)  # no notice
    assert state(pool, node).phase is nodestate.Phase.RECLAIMING
    figures = queue.figures()
    # It stopped at the notice and had not saved: its work since the checkpoint at 30 is lost.
    assert figures.lost_answering_gpu_hours == pytest.approx(15 / 60 * 8, abs=1e-3)
    assert figures.answered_evictions == 0
    assert minute(pool, queue, TOLD + 2 * MINUTE) == []  # nothing left under notice


def test_no_job_is_bound_to_a_node_under_notice() -> None:
    training = jobs.TrainingModel(backlog=2, sizes=(1,), hours=(5.0, 5.0), silent=1.0)
    pool = FakePool(
        2, SPEC, KEYS, timedelta(minutes=2), timedelta(minutes=5), allocatable=training.allocatable
    )
    queue = jobs.Queue(training, SPEC.add_taints)
    queue.arrive(START, pool)
    carry_out(pool, queue, model.Action.LEND, ["node-0"], START)
    carry_out(pool, queue, model.Action.RECLAIM, ["node-0"], TOLD, NOTICE)
    # job-0001 finishes nowhere near; the notice frees nothing for job-0002 to start on.
    assert [j.name for j in queue.jobs.values() if j.started is not None] == ["job-0001"]
    assert queue.figures().gangs_half_running == 0


def day_and_night() -> Trace:
    """Two days: 40 rps by night, 100 by day, a 20-minute spike at 150 each afternoon."""
    rps: list[float | None] = []
    for m in range(2 * 24 * 60):
        hour = m // 60 % 24
        rps.append(150.0 if hour == 15 and m % 60 < 20 else 100.0 if 8 <= hour < 20 else 40.0)
    return Trace(name="days", source="days", start=START, rps=rps, native_step=MINUTE)


def test_with_the_notice_off_a_run_is_the_run_it_was_before_notices() -> None:
    """The figures of this seeded run as the simulator gave them before it knew of notices."""
    pool = engine.PoolModel(zone="America/Los_Angeles")
    assert pool.notice == timedelta(0)
    run = engine.run(
        day_and_night(), registry.build("adaptive"), pool, training=jobs.TrainingModel()
    )
    f, t = run.figures, run.training
    assert t is not None
    assert (f.lent_node_hours, f.oracle_node_hours, f.harvest_ratio) == (168.283, 354.767, 0.4743)
    assert (f.breach_minutes, f.headroom_minutes) == (8, 56)
    assert (f.reclaims, f.loans, f.short_loans, f.notices, f.withdrawals) == (27, 31, 0, 0, 0)
    assert (t.lent_gpu_hours, t.used_gpu_hours, t.lost_gpu_hours) == (1346.267, 1346.267, 28.0)
    assert (t.preemptions, t.jobs_preempted, t.jobs_submitted, t.jobs_completed) == (11, 11, 47, 43)
    assert (t.no_taker_refusals, t.gangs_half_running, t.held_gpu_hours) == (227, 0, 0)
    assert t.goodput == round((t.used_gpu_hours - t.lost_gpu_hours) / t.lent_gpu_hours, 4)


@pytest.fixture(scope="module")
def code_day() -> Trace:
    week = traces.load(WEEK, "code")
    return Trace(
        name="code-day", source=str(WEEK), start=week.start, rps=week.rps[:1440], native_step=MINUTE
    )


def test_with_a_notice_the_jobs_that_answer_lose_at_least_ten_times_less(code_day: Trace) -> None:
    def run(notice: timedelta) -> engine.Run:
        pool = engine.PoolModel(zone="America/Los_Angeles", notice=notice)
        strategy = registry.build(registry.DEFAULT)
        return engine.run(code_day, strategy, pool, training=jobs.TrainingModel())

    told, at_once = run(NOTICE), run(timedelta(0))
    assert told.training is not None
    assert at_once.training is not None
    assert told.figures.notices > 0
    assert at_once.training.lost_answering_gpu_hours > 10  # GPU-hours: a real loss to cut
    assert told.training.lost_answering_gpu_hours * 10 <= at_once.training.lost_answering_gpu_hours
    assert told.training.jobs_told > 0
    assert told.training.answered_evictions > 0
    assert told.training.goodput > at_once.training.goodput
    # The notice is paid for in lending, not in breaches: none either way on this day.
    assert told.figures.breach_minutes == at_once.figures.breach_minutes == 0


def test_who_answers_is_drawn_apart_so_every_run_meets_the_same_jobs() -> None:
    def drawn(silent: float) -> list[tuple[int, timedelta, bool]]:
        training = jobs.TrainingModel(backlog=200, silent=silent)
        queue = jobs.Queue(training, SPEC.add_taints)
        queue.arrive(START, FakePool(1, SPEC, KEYS, MINUTE, MINUTE))
        return [(j.size, j.work, j.answers) for j in queue.jobs.values()]

    some, none = drawn(0.2), drawn(0.0)
    assert [j[:2] for j in some] == [j[:2] for j in none]  # the jobs are the ones they were
    assert all(answers for _, _, answers in none)
    assert 0.1 < sum(not answers for _, _, answers in some) / len(some) < 0.3
    assert drawn(0.2) == some  # seeded


# -- rebalancer simulate --notice -------------------------------------------------------------


@pytest.fixture(scope="module")
def half_day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "small-12h.csv"
    lines = (EXAMPLES / "servegen_m-small.csv").read_text().splitlines()
    path.write_text("\n".join(lines[:73]) + "\n")
    return path


def simulate(out: Path, *argv: str) -> dict[str, Any]:
    assert cli.main(["simulate", *argv, "--no-trade", "--quiet", "--out", str(out)]) == 0
    return dict(json.loads((out / "summary.json").read_text()))


def test_a_bare_trace_gets_the_controllers_notice_and_off_gives_none(
    half_day: Path, tmp_path: Path
) -> None:
    default = simulate(tmp_path / "default", "--trace", str(half_day))
    assert (default["pool"]["notice_seconds"], default["pool"]["from"]["notice"]) == (
        300,
        "default",
    )
    off = simulate(tmp_path / "off", "--trace", str(half_day), "--notice", "off")
    assert (off["pool"]["notice_seconds"], off["pool"]["from"]["notice"]) == (0, "flag")
    assert off["notice"] == {"seconds": 0, "compare": None}
    given = simulate(tmp_path / "90s", "--trace", str(half_day), "--notice", "90s")
    assert given["pool"]["notice_seconds"] == 90
    assert "reclaim notice 90 s + drain" in (tmp_path / "90s" / "report.md").read_text()


def test_a_configured_pool_gets_its_own_notice(half_day: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "pools:\n  - name: small\n    node_selector: {gpu: l20}\n    rps_per_node: 100\n"
        "    limits: {reclaim_notice: 2m}\n"
    )
    found = simulate(
        tmp_path / "out", "--trace", str(half_day), "--config", str(config), "--pool", "small"
    )
    assert (found["pool"]["notice_seconds"], found["pool"]["from"]["notice"]) == (120, "settings")


def test_notice_compare_runs_every_strategy_again_without_it(
    half_day: Path, tmp_path: Path
) -> None:
    argv = ("--trace", str(half_day), "--training-backlog", "3")
    both = simulate(tmp_path / "both", *argv, "--notice", "5m", "--notice-compare")
    off = simulate(tmp_path / "off", *argv, "--notice", "off")
    compare = both["notice"]["compare"]
    assert (
        set(compare)
        == set(both["strategies"])
        == {
            registry.DEFAULT,
            "static",
            "cron",
            "reactive",
            "oracle",
        }
    )
    for name, entry in compare.items():
        # "with" is the run the report shows; "without" the run --notice off makes.
        shown, plain = both["strategies"][name], off["strategies"][name]
        assert entry["with"]["harvest_ratio"] == shown["harvest_ratio"], name
        assert entry["without"]["harvest_ratio"] == plain["harvest_ratio"], name
        assert entry["without"]["lost_gpu_hours"] == plain["training"]["lost_gpu_hours"], name
        assert entry["without"]["notices"] == 0, name
        assert entry["with"]["goodput"] == shown["training"]["goodput"], name
    assert sum(e["with"]["notices"] for e in compare.values()) > 0
    report = (tmp_path / "both" / "report.md").read_text()
    assert "## The reclaim notice" in report
    assert f"| {registry.DEFAULT} | without |" in report


def test_notice_compare_needs_a_notice(
    half_day: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(half_day), "--notice", "off", "--notice-compare"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 2
    assert "--notice-compare" in capsys.readouterr().err
    bad = ["simulate", "--trace", str(half_day), "--notice", "soon", "--out", str(tmp_path)]
    assert cli.main(bad) == 2
    assert "--notice='soon'" in capsys.readouterr().err
