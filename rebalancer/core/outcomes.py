"""What carrying out a step came to: one vocabulary for the actuator, the runtime and the audit log.

An actuator call answers with an ``ActionResult``: its ``Outcome`` and every ``Write`` it made
(or, in a dry run, would have made). The outcome record the audit log writes for it carries the
same ``Outcome``, so a call's result and its record never need translating. Two outcomes only
records have: ``SUPERSEDED`` (never carried out: a newer decision or a restart replaced it) and
``INTERRUPTED`` (begun, then the run stopped; a recovery intent takes it over). A dry run's
call that would have changed the node answers ``WOULD_APPLY``, never ``APPLIED``: a dry run's
audit log and logs must not read like a real run's.

A step's outcome and one write's outcome are two types on purpose: a reclaim can be
``IN_PROGRESS`` while one of its evictions was ``BLOCKED`` by a budget and another ``EVICTED``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rebalancer.core.model import Action


class Outcome(StrEnum):
    APPLIED = "applied"  # the transition is complete: the node is lent, or serving again
    IN_PROGRESS = "in_progress"  # a reclaim is under way: pods draining or a budget says wait
    NOTHING = "nothing"  # the node needed no write (serving or lent, nothing in flight)
    REFUSED = "refused"  # the node is not as the step needs it (busy, not serving, bad state)
    CONFLICT = "conflict"  # 409: the node or a pod changed since it was read; step abandoned
    GONE = "gone"  # the node no longer exists
    FAILED = "failed"  # the API refused or kept failing; nothing more was written
    SUPERSEDED = "superseded"  # never carried out: a restart or a newer decision replaced it
    INTERRUPTED = "interrupted"  # begun, then the run stopped; a recovery intent takes it over
    WOULD_APPLY = "would_apply"  # a dry run: the writes it lists would have been sent, none was


BACK = frozenset({Outcome.APPLIED, Outcome.NOTHING})  # a reclaim after which the node serves
ERRORS = frozenset({Outcome.REFUSED, Outcome.CONFLICT, Outcome.GONE, Outcome.FAILED})


class WriteKind(StrEnum):
    BEGIN_LEND = "begin_lend"
    FINISH_LEND = "finish_lend"
    BEGIN_RECLAIM = "begin_reclaim"
    FINISH = "finish"  # ends a reclaim, or rolls back an unfinished lend
    TAKE_OVER = "take_over"  # a transition in flight now answers to another decision (recovery)
    EVICT = "evict"
    DELETE = "delete"
    NOTICE = "notice"  # a lent node's reclaim deadline, before any pod is evicted
    WITHDRAW = "withdraw"  # a notice withdrawn: the node stays lent
    TELL = "tell"  # a borrowed pod's notice annotations, written or removed
    CONDITION = "condition"  # a borrowed pod's notice condition
    REQUEST = "request"  # a borrowed pod's EvictionRequest, filed or withdrawn


class WriteOutcome(StrEnum):
    APPLIED = "applied"
    EVICTED = "evicted"  # 201: the pod is being deleted with its own grace period
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget says not now; tried again next pass
    GONE = "gone"  # 404: the pod was already gone
    PLANNED = "planned"  # dry run: not sent


@dataclass(frozen=True, slots=True)
class Write:
    """One write: what, to which object, with which body (exactly what is or would be sent)."""

    kind: WriteKind
    target: str  # "node/NAME" or "pod/NAMESPACE/NAME"
    body: Mapping[str, Any]
    outcome: WriteOutcome


@dataclass(frozen=True, slots=True)
class Notice:
    """What a reclaim's notice came to when its evictions began (or it was withdrawn).

    ``given``: from the notice to the evictions (zero for a reclaim without one); ``pods``:
    the borrowed pods it was about; ``answered``: those that acknowledged it or ended, each
    with how long after the notice (``answer_seconds``); ``lost_gpu_seconds``: GPUs times the
    time from each other pod's last reported checkpoint to its eviction; ``unknown``: the pods
    that reported none, whose loss cannot be told."""

    reclaim: str
    given_seconds: float
    pods: int
    answered: int
    answer_seconds: tuple[float, ...]
    lost_gpu_seconds: float
    unknown: int
    why: str  # what began the evictions: all answered, the deadline less the grace, cut short

    def to_doc(self) -> dict[str, Any]:
        return {
            "reclaim": self.reclaim,
            "given_seconds": round(self.given_seconds, 3),
            "pods": self.pods,
            "answered": self.answered,
            "answer_seconds": [round(s, 3) for s in self.answer_seconds],
            "lost_gpu_seconds": round(self.lost_gpu_seconds, 3),
            "unknown": self.unknown,
            "why": self.why,
        }


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What one actuator call did to one node."""

    node: str
    action: Action  # lend, reclaim, or progress: a pass over a transition in flight
    outcome: Outcome
    message: str
    writes: tuple[Write, ...] = ()
    dry_run: bool = False
    # What a restore of this call kept of other writers' work: their taints on the node, as
    # ``key=value:Effect`` (``nodestate.Restore.kept``); the Events and the audit record name them.
    kept: tuple[str, ...] = ()
    # The pods a drain past its deadline cannot remove because a finalizer holds them, each as
    # ``namespace/name (finalizer, ...)``: the node stays reclaiming, and says why.
    held: tuple[str, ...] = ()
    # A reclaim's notice, once its evictions begin or it is withdrawn: what the pods were
    # told and how they answered (docs/design/reclaim-notice.md).
    notice: Notice | None = None

    @property
    def applied(self) -> tuple[Write, ...]:
        return tuple(w for w in self.writes if w.outcome is not WriteOutcome.PLANNED)
