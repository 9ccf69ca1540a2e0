"""A reclaim's notice, pod by pod: when its evictions begin, and what it came to.

Where it sits: the actuator reads each borrowed pod of a node under notice into an ``Answer``
and asks ``begins`` on every pass; when the time has come (or a reclaim cuts the notice short)
it records ``summary`` with the reclaim (docs/design/reclaim-notice.md). Pure: the time is an
argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.core.outcomes import Notice


@dataclass(frozen=True, slots=True)
class Answer:
    """What one borrowed pod says of the notice ``reclaim``."""

    gpus: float
    grace: timedelta  # its terminationGracePeriodSeconds: what an eviction gives it
    told: datetime | None  # when it was first told of this reclaim (None: not yet)
    acked: bool  # it acknowledged this reclaim: saved, evict it now
    ended: bool  # its containers ended: exiting answers too
    checkpointed: datetime | None  # its last reported checkpoint (None: never reported)

    @property
    def answered(self) -> bool:
        return self.acked or self.ended


def begins(deadline: datetime, answers: Sequence[Answer]) -> datetime | None:
    """When the evictions begin: the deadline less the longest grace of the pods yet to
    answer, so that each has its whole grace before the deadline; None when every pod has
    answered (at once)."""
    waiting = [a.grace for a in answers if not a.answered]
    if not waiting:
        return None
    return deadline - max(waiting)


def due(now: datetime, deadline: datetime, answers: Sequence[Answer]) -> str | None:
    """Why the evictions begin now, or None while the notice runs."""
    start = begins(deadline, answers)
    if start is None:
        return "every borrowed pod answered" if answers else "no borrowed pod is left"
    if now >= start:
        return f"the deadline less the pods' grace ({(deadline - start).total_seconds():g} s)"
    return None


def summary(reclaim: str, now: datetime, answers: Sequence[Answer], why: str) -> Notice:
    """What the notice came to at ``now``, as its evictions begin: how long the pods had, which
    answered and how soon, and the work the others lose (GPUs times the time since their last
    checkpoint; none known for a pod that never reported one)."""
    told = [a.told for a in answers if a.told is not None]
    first = min(told) if told else None
    lost, unknown = 0.0, 0
    for a in answers:
        if a.answered:
            continue
        if a.checkpointed is None:
            unknown += 1
        else:
            lost += a.gpus * max(0.0, (now - a.checkpointed).total_seconds())
    return Notice(
        reclaim=reclaim,
        given_seconds=0.0 if first is None else max(0.0, (now - first).total_seconds()),
        pods=len(answers),
        answered=sum(1 for a in answers if a.answered),
        answer_seconds=tuple(_answer_seconds(a, now) for a in answers if a.answered),
        lost_gpu_seconds=lost,
        unknown=unknown,
        why=why,
    )


def _answer_seconds(answer: Answer, now: datetime) -> float:
    """How long after it was told a pod answered: the checkpoint it reported for the notice
    when it says one, else no later than ``now``."""
    if answer.told is None:
        return 0.0
    at = answer.checkpointed
    if at is None or at < answer.told or at > now:
        at = now
    return (at - answer.told).total_seconds()
