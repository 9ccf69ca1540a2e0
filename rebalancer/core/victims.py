"""Which borrowed pods to evict first, and which training jobs to preempt: least cost first.

Where it sits: the actuator orders a reclaiming node's borrowed pods with ``eviction_order``
before it evicts them; the planner ranks the jobs on lent nodes with ``jobs`` to choose which
nodes a reclaim takes (``planning.steps.reclaim_order``: whole nodes, so a job's cost is not a sum
of units); the executor looks for the borrowed pods an earlier node of a name left with
``left_by_earlier_node`` on every tick. Pure: no I/O, no clock.

Cost (docs/design/actuator.md): fewest training jobs preempted, then lowest priority, then the
youngest (least work lost). A job is the pods sharing ``PodView.job``; a pod without a job is a job
of its own. A job's pods go out together, one job after the other, so that a reclaim stopped
halfway (a PodDisruptionBudget, a crash) has touched as few jobs as possible; evicting one pod of
a gang already costs the whole gang its step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from rebalancer.core.model import NodeView, PodRole, PodView

_NEVER = datetime.min.replace(tzinfo=UTC)  # a pod with no creation time counts as the oldest


@dataclass(frozen=True, slots=True)
class Job:
    """The borrowed pods of one training job (or one lone pod) on the nodes considered."""

    key: str
    pods: tuple[PodView, ...]

    @property
    def priority(self) -> int:
        # The job is as important as its most important pod.
        return max(p.priority for p in self.pods)

    @property
    def started(self) -> datetime:
        return min(_created(p) for p in self.pods)


def jobs(pods: Iterable[PodView]) -> tuple[Job, ...]:
    """The borrowed pods grouped by job, cheapest job first; pods within a job cheapest first."""
    groups: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.role is PodRole.BORROWED:
            groups.setdefault(job_key(pod), []).append(pod)
    built = [Job(key, tuple(sorted(members, key=_pod_cost))) for key, members in groups.items()]
    return tuple(sorted(built, key=_job_cost))


def eviction_order(pods: Iterable[PodView]) -> tuple[PodView, ...]:
    """Borrowed pods only (nothing else is ever evicted), job after job, cheapest first."""
    return tuple(pod for job in jobs(pods) for pod in job.pods)


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


def _job_cost(job: Job) -> tuple[int, float, int, str]:
    # Lowest priority, then the job started most recently (least work lost), then fewer pods.
    return (job.priority, -job.started.timestamp(), len(job.pods), job.key)
