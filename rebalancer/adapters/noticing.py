"""A borrowed pod as a reclaim's notice sees it: what it was told and how it answered, read from
the pod object; and what telling it writes (docs/design/reclaim-notice.md).

Where it sits: the actuator reads every pod it lists with ``told`` and writes ``tell`` /
``untell`` through its ``NodeWriter``. What a pod says of itself is checked before it counts:
an acknowledgement counts only for the reclaim id it names, a checkpoint time only as
``convert`` believes it (a time it cannot read, or one before the pod was created, is none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rebalancer.adapters import convert
from rebalancer.core import model, notice
from rebalancer.core.nodestate import Keys, format_time

Obj = Mapping[str, Any]
DEFAULT_GRACE = timedelta(seconds=30)  # the API's default terminationGracePeriodSeconds


@dataclass(frozen=True, slots=True)
class Told:
    """The notice a pod carries: the reclaim id and deadline written on it (None: none), when
    it was first told (the condition's transition), and its own answers, raw."""

    reclaim: str | None = None
    deadline: str | None = None
    since: datetime | None = None
    acked: str | None = None
    checkpointed: datetime | None = None
    grace: timedelta = DEFAULT_GRACE
    ended: bool = False
    gpus: float = 0.0

    def of(self, reclaim: str) -> bool:
        """Whether it was told of ``reclaim``."""
        return self.reclaim == reclaim

    def answer(self, reclaim: str) -> notice.Answer:
        return notice.Answer(
            gpus=self.gpus,
            grace=self.grace,
            told=self.since if self.of(reclaim) else None,
            acked=self.acked == reclaim,
            ended=self.ended,
            checkpointed=self.checkpointed,
        )


def told(pod: Obj, view: model.PodView, keys: Keys) -> Told:
    """What ``pod`` was told and how it answered; its own answers (the acknowledgement, the
    last checkpoint) as ``convert`` read them into ``view``."""
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds")
    return Told(
        reclaim=_text(notes.get(keys.reclaim_id)),
        deadline=_text(notes.get(keys.deadline)),
        since=_told_since(pod, keys),
        acked=view.acked,
        checkpointed=view.checkpointed,
        grace=timedelta(seconds=grace) if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE,
        ended=convert.finished(dict(pod)),
        gpus=view.requests.gpu,
    )


def tell(keys: Keys, reclaim: str, deadline: datetime) -> dict[str, str | None]:
    """The annotations that tell a pod of ``reclaim``."""
    return {keys.deadline: format_time(deadline), keys.reclaim_id: reclaim}


def untell(keys: Keys) -> dict[str, str | None]:
    """The annotations a withdrawal removes."""
    return {keys.deadline: None, keys.reclaim_id: None}


def condition(keys: Keys, reclaim: str, deadline: datetime | None) -> dict[str, str]:
    """The pod's notice condition: ``True`` while told (``deadline``), ``False`` withdrawn."""
    if deadline is None:
        message = f"reclaim {reclaim} was withdrawn: the node stays lent"
        return {
            "type": keys.notice_condition,
            "status": "False",
            "reason": "ReclaimWithdrawn",
            "message": message,
        }
    return {
        "type": keys.notice_condition,
        "status": "True",
        "reason": "ReclaimScheduled",
        "message": f"reclaim {reclaim}: the node is taken back; be gone by {format_time(deadline)}",
    }


def _told_since(pod: Obj, keys: Keys) -> datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        mine = isinstance(c, Mapping) and c.get("type") == keys.notice_condition
        if mine and c.get("status") == "True":
            return convert.time_of(c.get("lastTransitionTime"))
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
