"""The simulator's training side: a queue of preemptible jobs that runs on what the pool lends.

Opt-in (``rebalancer simulate --training-backlog N``): without it the simulator's pools have no
pods and lend as their strategy says. With it each run keeps its own ``Queue``, built from the
same seed, so every strategy meets the same jobs. The queue plays what a research cluster puts
in front of lent nodes, as the demo does (``sandbox.training``, whose ``48gb`` kind and
checkpoint rule it reuses):

- jobs of one, two or four whole nodes (every GPU of a node a pod), their work drawn from a
  seeded generator; ``backlog`` jobs are always waiting: as one starts, the next arrives;
- the waiting jobs' pods are the planner's takers (``PoolSnapshot.takers``), tolerating the lend
  taint, one ``PendingPod.job`` per job, so a gang is lent whole or not at all;
- a gang scheduler binds a waiting job's pods all at once to lent nodes with room, oldest job
  first, or binds none; running pods are borrowed ``PodView``s with their ``requests`` on their
  node, so the planner sees them (reclaims preempting the fewest jobs, ``unused_loan``);
- a job whose work is done ends; a reclaim evicts the node's pods at once, and the job loses its
  work since the last checkpoint and waits again, whole: its gang's pods on other nodes stop too.
- a reclaim with a notice (docs/design/reclaim-notice.md) tells the job first, when any node of
  its gang is noticed. A job that answers stops training when told, saves for ``save`` and then
  acknowledges, its pods answered (``core.notice.Answer``), and idles until it is evicted: it
  loses nothing, its work up to the notice saved. A share ``silent`` of the jobs, drawn from
  their own seeded stream so every strategy meets the same ones, never answer: they train on
  and are evicted when the notice's time is up, losing their work since their last periodic
  checkpoint, as without a notice. A job cut short while saving (a reclaim that cannot wait)
  loses its work since its last periodic checkpoint before the notice. A withdrawn notice lets
  a job that stopped train on from where it stopped.

Each minute, once the pool is as the planner left it, the queue counts what the report shows:
GPU-minutes lent and used, those held by jobs that stopped for a notice (saving, then waiting),
and a gang with some pods bound and others not (half-running: the scheduler here binds whole
gangs, so it must stay 0; it is a check, not a model). Goodput is the work kept (used, less
lost, less held after a notice) per GPU-hour lent.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rebalancer.core import model, notice
from sandbox import training as demo_training
from sandbox.sim.pool import FakePool

NAMESPACE = "training"
CHECKPOINT = demo_training.CHECKPOINT
_KIND = next(k for k in demo_training.KINDS if k.name == "48gb")


@dataclass(frozen=True)
class TrainingModel:
    """The queue's knobs; the defaults are the demo's ``48gb`` jobs on 8-GPU nodes."""

    backlog: int = 3  # jobs kept waiting
    seed: int = 7
    gpus_per_node: int = _KIND.gpus
    sizes: tuple[int, ...] = _KIND.sizes  # nodes per job, drawn uniformly from this list
    hours: tuple[float, float] = _KIND.hours  # work a job needs, drawn uniformly
    # A reclaim notice's answers: how long a told job takes to save, the share of jobs that
    # never answer (drawn per job from a stream of their own, so the jobs are the same ones
    # with and without), and the pods' terminationGracePeriodSeconds.
    save: timedelta = timedelta(minutes=2)
    silent: float = 0.2
    grace: timedelta = timedelta(seconds=30)

    @property
    def allocatable(self) -> model.Resources:
        """What one node offers training: its GPUs (the pods ask for nothing else)."""
        return model.Resources(gpu=self.gpus_per_node)


@dataclass(frozen=True)
class TrainingFigures:
    """What the training side saw over a run; ``docs/simulator.md`` defines each."""

    lent_gpu_hours: float
    used_gpu_hours: float
    used_share: float  # used over lent (1 when nothing was lent)
    no_taker_refusals: int  # lend refusals with reason ``no_taker``, one per tick each
    jobs_preempted: int  # distinct jobs preempted at least once
    preemptions: int
    lost_gpu_hours: float  # GPUs x time run since the last checkpoint, at each preemption
    jobs_submitted: int
    jobs_completed: int
    gangs_half_running: int  # minutes x jobs seen with some pods bound and others not
    # The reclaim notice (all zero without one, but the split of ``lost_gpu_hours``):
    lost_answering_gpu_hours: float = 0.0  # lost by the jobs that answer a notice
    lost_silent_gpu_hours: float = 0.0  # lost by the jobs that never answer one
    held_gpu_hours: float = 0.0  # GPUs x time a job stopped for a notice held: saving, waiting
    kept_gpu_hours: float = 0.0  # work kept: used, less lost, less held
    goodput: float = 1.0  # kept over lent (1 when nothing was lent)
    jobs_told: int = 0  # times a running job was told of a notice
    answered_evictions: int = 0  # preemptions of a job that had answered: nothing lost
    withdrawn: int = 0  # times a told job's notice was withdrawn and it trained on


@dataclass
class Job:
    name: str
    size: int
    work: timedelta
    submitted: datetime
    attempt: int = 0
    done: timedelta = timedelta(0)  # work saved at checkpoints
    started: datetime | None = None  # when this attempt's pods were bound
    nodes: tuple[model.NodeName, ...] = ()
    answers: bool = True  # answers a reclaim notice (saves, then acknowledges)
    told: datetime | None = None  # when this attempt was told of a notice; None: not under one

    def stopped(self) -> bool:
        """Told of a notice and answering it: it trains no more (saving, then waiting)."""
        return self.answers and self.told is not None

    def progress(self, now: datetime) -> timedelta:
        """Work done: saved, and run this attempt (up to the notice, for a job that stopped)."""
        if self.started is None:
            return self.done
        until = self.told if self.stopped() and self.told is not None else now
        return self.done + (until - self.started)


@dataclass
class _Tally:
    lent_gpu_minutes: int = 0
    used_gpu_minutes: int = 0
    no_taker: int = 0
    preempted: set[str] = field(default_factory=set)
    preemptions: int = 0
    lost_gpu_hours: float = 0.0
    lost_answering_gpu_hours: float = 0.0
    held_gpu_minutes: int = 0
    told: int = 0
    answered_evictions: int = 0
    withdrawn: int = 0
    submitted: int = 0
    completed: int = 0
    half_running: int = 0


class Queue:
    """The jobs of one run, their gang scheduler and their operator's restarts."""

    def __init__(self, spec: TrainingModel, lend_taints: Iterable[model.Taint]) -> None:
        self.spec = spec
        self.random = random.Random(spec.seed)
        # Who answers a notice: a stream of its own, so that the jobs drawn are the same ones
        # whatever the notice (and as they were before there was one).
        self.answering = random.Random(f"answers-{spec.seed}")
        self.jobs: dict[str, Job] = {}  # by name, in arrival order
        self.tally = _Tally()
        self._tolerations = tuple(
            model.Toleration(t.key, "Equal", t.value or "", t.effect) for t in lend_taints
        )
        self._serial = 0

    # -- before the planner -----------------------------------------------------------------

    def arrive(self, now: datetime, pool: FakePool) -> None:
        """End the jobs whose work is done, then let new ones arrive up to the backlog."""
        for job in list(self.jobs.values()):
            if job.started is not None and job.progress(now) >= job.work:
                self._unbind(job, pool)
                del self.jobs[job.name]
                self.tally.completed += 1
        waiting = sum(1 for j in self.jobs.values() if j.started is None)
        for _ in range(self.spec.backlog - waiting):
            self._serial += 1
            minutes = round(self.random.uniform(*self.spec.hours) * 60)
            job = Job(
                name=f"job-{self._serial:04d}",
                size=self.random.choice(self.spec.sizes),
                work=timedelta(minutes=minutes),
                submitted=now,
                answers=self.answering.random() >= self.spec.silent,
            )
            self.jobs[job.name] = job
            self.tally.submitted += 1

    def takers(self) -> tuple[model.PendingPod, ...]:
        """The waiting jobs' pods, as the planner is shown them."""
        need = model.Resources(gpu=self.spec.gpus_per_node)
        return tuple(
            model.PendingPod(
                namespace=NAMESPACE,
                name=f"{job.name}-{job.attempt}-{i}",
                tolerations=self._tolerations,
                requests=need,
                job=job.name,
                created=job.submitted,
            )
            for job in self.jobs.values()
            if job.started is None
            for i in range(job.size)
        )

    # -- after the planner ------------------------------------------------------------------

    def answers(self, node: model.NodeView, now: datetime) -> tuple[notice.Answer, ...]:
        """What the borrowed pods of ``node`` say of its notice at ``now`` (``FakePool``)."""
        found = []
        for pod in node.borrowed_pods:
            job = self.jobs.get(pod.job or "")
            if job is None or job.started is None:
                continue
            saved = job.stopped() and job.told is not None and now >= job.told + self.spec.save
            found.append(
                notice.Answer(
                    gpus=pod.requests.gpu,
                    grace=self.spec.grace,
                    told=job.told,
                    acked=saved,
                    ended=False,
                    checkpointed=self._checkpointed(job, now),
                )
            )
        return tuple(found)

    def evict(self, nodes: Iterable[model.NodeName], now: datetime, pool: FakePool) -> None:
        """Preempt the jobs on ``nodes``, whose reclaims began as their notices ran out."""
        begun = set(nodes)
        if not begun:
            return
        for job in self.jobs.values():
            if begun.intersection(job.nodes):
                self._preempt(job, now, pool)

    def react(self, plan: model.Plan, now: datetime, pool: FakePool) -> None:
        """Preempt what the plan reclaimed at once, tell the jobs on nodes under notice (and
        let those whose notice was withdrawn train on), bind what fits, count the minute."""
        reclaimed = {
            s.node
            for s in plan.steps
            if s.action is model.Action.RECLAIM and s.notice <= timedelta(0)
        }
        for job in self.jobs.values():
            if reclaimed.intersection(job.nodes):
                self._preempt(job, now, pool)
        self._hear(now, pool)
        self._schedule(now, pool)
        self.tally.no_taker += sum(1 for r in plan.rejections if r.reason is model.Reason.NO_TAKER)
        self._count(pool)

    def _hear(self, now: datetime, pool: FakePool) -> None:
        """A running job is under notice while any node of its gang is: told when the first
        is noticed; when none is any more (withdrawn), a job that stopped trains on."""
        if not pool.any_noticed and not self._told:
            return
        for job in self.jobs.values():
            if job.started is None:
                continue
            noticed = any(pool.noticed(n) for n in job.nodes)
            if noticed and job.told is None:
                job.told = now
                self.tally.told += 1
            elif not noticed and job.told is not None:
                self._resume(job, now)

    @property
    def _told(self) -> bool:
        return any(j.told is not None for j in self.jobs.values())

    def _resume(self, job: Job, now: datetime) -> None:
        """The notice withdrawn: a job that stopped for it trains on from where it stopped,
        its work to the notice saved (``save`` at most before; its save runs to its end)."""
        assert job.started is not None
        assert job.told is not None
        if job.stopped():
            job.done += job.told - job.started
            job.started = now
        job.told = None
        self.tally.withdrawn += 1

    def _preempt(self, job: Job, now: datetime, pool: FakePool) -> None:
        """The operator's restart: the whole gang stops and waits again from its checkpoint:
        the notice's, if it answered one (nothing lost), else its last periodic one."""
        assert job.started is not None
        answered = job.stopped() and job.told is not None and now >= job.told + self.spec.save
        ran = job.progress(now) - job.done
        saved = ran if answered else CHECKPOINT * (ran // CHECKPOINT)
        lost = (ran - saved) / timedelta(hours=1) * self._gpus(job)
        self.tally.lost_gpu_hours += lost
        if job.answers:
            self.tally.lost_answering_gpu_hours += lost
        self.tally.answered_evictions += answered
        self.tally.preempted.add(job.name)
        self.tally.preemptions += 1
        self._unbind(job, pool)
        job.done += saved
        job.attempt += 1
        job.started = None
        job.told = None

    def _checkpointed(self, job: Job, now: datetime) -> datetime | None:
        """The job's last checkpoint: the notice's once saved, else its last periodic one."""
        assert job.started is not None
        if job.stopped() and job.told is not None and now >= job.told + self.spec.save:
            return job.told + self.spec.save
        ran = job.progress(now) - job.done
        return job.started + CHECKPOINT * (ran // CHECKPOINT)

    def _schedule(self, now: datetime, pool: FakePool) -> None:
        """Bind each waiting job, oldest first, wholly to lent nodes with room, or not at all."""
        # Not onto a node under notice: its pods would be told at once.
        free = {name: pool.free(name) for name in pool.lent() if not pool.noticed(name)}
        for job in self.jobs.values():
            if job.started is not None:
                continue
            need = model.Resources(gpu=self.spec.gpus_per_node)
            trial = dict(free)
            chosen: list[model.NodeName] = []
            for _ in range(job.size):
                node = next((n for n, room in trial.items() if room.covers(need)), None)
                if node is None:
                    break
                trial[node] -= need
                chosen.append(node)
            if len(chosen) < job.size:
                continue
            free = trial
            job.started, job.nodes = now, tuple(chosen)
            for index, node in enumerate(chosen):
                pod = model.PodView(
                    namespace=NAMESPACE,
                    name=f"{job.name}-{job.attempt}-{index}",
                    role=model.PodRole.BORROWED,
                    job=job.name,
                    created=now,
                    requests=need,
                )
                pool.add_pod(node, pod)

    def _unbind(self, job: Job, pool: FakePool) -> None:
        for node in dict.fromkeys(job.nodes):
            pool.remove_pods(node, job.name)
        job.nodes = ()

    def _count(self, pool: FakePool) -> None:
        lent = pool.lent()
        self.tally.lent_gpu_minutes += len(lent) * self.spec.gpus_per_node
        bound: dict[str, int] = {}
        for node in pool.nodes():
            for pod in node.borrowed_pods:
                bound[pod.job or ""] = bound.get(pod.job or "", 0) + 1
                if node.name in lent:
                    self.tally.used_gpu_minutes += pod.requests.gpu
                    job = self.jobs.get(pod.job or "")
                    if job is not None and job.stopped():
                        self.tally.held_gpu_minutes += pod.requests.gpu
        for name, count in bound.items():
            job = self.jobs.get(name)
            if job is None or count != job.size:
                self.tally.half_running += 1

    def _gpus(self, job: Job) -> int:
        return job.size * self.spec.gpus_per_node

    # -- the figures ------------------------------------------------------------------------

    def figures(self) -> TrainingFigures:
        t = self.tally
        lent, used = t.lent_gpu_minutes / 60.0, t.used_gpu_minutes / 60.0
        held = t.held_gpu_minutes / 60.0
        kept = used - t.lost_gpu_hours - held
        return TrainingFigures(
            lent_gpu_hours=round(lent, 3),
            used_gpu_hours=round(used, 3),
            used_share=round(used / lent, 4) if lent > 0 else 1.0,
            no_taker_refusals=t.no_taker,
            jobs_preempted=len(t.preempted),
            preemptions=t.preemptions,
            lost_gpu_hours=round(t.lost_gpu_hours, 3),
            jobs_submitted=t.submitted,
            jobs_completed=t.completed,
            gangs_half_running=t.half_running,
            lost_answering_gpu_hours=round(t.lost_answering_gpu_hours, 3),
            lost_silent_gpu_hours=round(t.lost_gpu_hours - t.lost_answering_gpu_hours, 3),
            held_gpu_hours=round(held, 3),
            kept_gpu_hours=round(kept, 3),
            goodput=round(kept / lent, 4) if lent > 0 else 1.0,
            jobs_told=t.told,
            answered_evictions=t.answered_evictions,
            withdrawn=t.withdrawn,
        )
