"""Which borrowed pods to evict first, and which training jobs to preempt: least cost first.

Where it sits: the actuator orders a reclaiming node's borrowed pods with ``eviction_order``
before it evicts them; the planner ranks the jobs on lent nodes with ``jobs`` to choose which
nodes a reclaim takes (``planning.steps.reclaim_order``: whole nodes, so a job's cost is not a sum
of units); the executor looks for the borrowed pods an earlier node of a name left with
``left_by_earlier_node`` on every tick. Pure: no I/O, no clock (``now`` is an argument).

Cost (docs/design/reclaim-notice.md#victims-by-work-lost): lowest priority first; then the least
work lost, a job's GPUs times the time since its last checkpoint; then fewer pods. A job is the
pods sharing ``PodView.job``; a pod without a job is a job of its own. A gang saves together, so
its last checkpoint is the oldest any of its pods reports: the work the whole gang would lose. A
job that reports none is given the median of those that do, so that saying nothing protects no
job; when none reports, the time since the job started. A job's pods go out together, one job
after the other, so that a reclaim stopped halfway (a PodDisruptionBudget, a crash) has touched
as few jobs as possible; evicting one pod of a gang already costs the whole gang its step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from rebalancer.core.model import NodeView, PodRole, PodView

_NEVER = datetime.min.replace(tzinfo=UTC)  # a pod with no creation time counts as the oldest
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Job:
    """The borrowed pods of one training job (or one lone pod) on the nodes considered, with
    the work it would lose if preempted now (``jobs`` fills ``lost`` in)."""

    key: str
    pods: tuple[PodView, ...]
    lost: timedelta = timedelta(0)  # the time since its last checkpoint (or the prior: below)
    reported: bool = False  # whether ``lost`` is the job's own word, or the prior it is given

    @property
    def priority(self) -> int:
        # The job is as important as its most important pod.
        return max(p.priority for p in self.pods)

    @property
    def started(self) -> datetime:
        return min(_created(p) for p in self.pods)

    @property
    def gpus(self) -> int:
        """The GPUs its pods request on the nodes considered, at least one: a job that asks for
        none (a CPU job, one that uses devices it did not request) still loses its time, so it
        is weighed as one device and compared by that time, not tied at nothing with every
        other such job. A pod asking none beside pods that ask some (a launcher) adds nothing."""
        return max(1, sum(p.requests.gpu for p in self.pods))

    @property
    def checkpointed(self) -> datetime | None:
        """The oldest checkpoint its pods report (a gang saves together: the work the whole gang
        would lose goes back to its oldest); None when none of them reports one."""
        said = [p.checkpointed for p in self.pods if p.checkpointed is not None]
        return min(said) if said else None

    @property
    def cost(self) -> int:
        """The work it would lose: GPUs times ``lost``, in GPU-microseconds (whole numbers,
        so that equal costs are equal)."""
        return self.gpus * (self.lost // _MICROSECOND)


def jobs(pods: Iterable[PodView], now: datetime) -> tuple[Job, ...]:
    """The borrowed pods grouped by job, each with what it would lose at ``now``, cheapest job
    first; pods within a job cheapest first."""
    groups: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.role is PodRole.BORROWED:
            groups.setdefault(job_key(pod), []).append(pod)
    built = [Job(key, tuple(sorted(members, key=_pod_cost))) for key, members in groups.items()]
    return tuple(sorted(_priced(built, now), key=_job_cost))


def eviction_order(pods: Iterable[PodView], now: datetime) -> tuple[PodView, ...]:
    """Borrowed pods only (nothing else is ever evicted), job after job, cheapest first."""
    return tuple(pod for job in jobs(pods, now) for pod in job.pods)


def _priced(built: Sequence[Job], now: datetime) -> list[Job]:
    """Each job with ``lost``, the time since its last checkpoint, never more than the time
    since it started (a job cannot lose more than it has run) nor less than nothing (a
    checkpoint ahead of ``now``, a clock ahead, counts as saved just now: that can only make
    the job cheaper, which costs the job itself, never inference or another job). A job that
    reports no checkpoint is given the median of those that do: neither the cheapest (saying
    nothing would put it first) nor the dearest (saying nothing would protect it). When none
    reports, the time since it started: the youngest loses least."""
    ran = {job.key: _since(job.started, now) for job in built}
    said = {
        job.key: min(_since(job.checkpointed, now), ran[job.key])
        for job in built
        if job.checkpointed is not None
    }
    prior = _median(sorted(said.values()))
    return [
        replace(
            job,
            lost=said.get(job.key, ran[job.key] if prior is None else min(prior, ran[job.key])),
            reported=job.key in said,
        )
        for job in built
    ]


def _since(when: datetime, now: datetime) -> timedelta:
    return max(now - when, timedelta(0))


def _median(ordered: Sequence[timedelta]) -> timedelta | None:
    """The median of sorted durations (the mean of the middle two of an even count)."""
    if not ordered:
        return None
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def left_by_earlier_node(node: NodeView) -> tuple[PodView, ...]:
    """The borrowed pods bound to ``node``'s name before ``node`` was created: an earlier node
    of that name was deleted, and a node created again under it (a kubelet re-registering after
    a reboot, seconds or hours later) runs them, though it serves. A borrowed pod tolerates
    the pool's lent taint, so it ran there on a loan, and that loan ended with its node.

    Strictly before, by whole seconds (the API's times): a pod bound in the second ``node``
    was created may have been bound to ``node`` itself. A pod with no known bind time, or a
    node with no creation time, is never taken for one."""
    if node.created is None:
        return ()
    created = node.created
    return tuple(
        pod
        for pod in node.pods
        if pod.role is PodRole.BORROWED and pod.bound is not None and pod.bound < created
    )


def job_key(pod: PodView) -> str:
    return pod.job if pod.job is not None else f"pod:{pod.namespace}/{pod.name}"


def _created(pod: PodView) -> datetime:
    return pod.created if pod.created is not None else _NEVER


def _pod_cost(pod: PodView) -> tuple[int, float, str, str]:
    # Lowest priority first, then youngest (latest creation) first, then by name for determinism.
    return (pod.priority, -_created(pod).timestamp(), pod.namespace, pod.name)


def _job_cost(job: Job) -> tuple[int, int, int, str]:
    # Lowest priority, then the least work lost (GPUs times time), then fewer pods.
    return (job.priority, job.cost, len(job.pods), job.key)
