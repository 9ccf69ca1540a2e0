"""The values of the state machine: the phase a node is in, what a lend changed, what a read
finds, and the metadata a transition writes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from rebalancer.core import bounded, model


class Phase(StrEnum):
    SERVING = "serving"  # the state label is absent
    LENDING = "lending"
    LENT = "lent"
    RECLAIMING = "reclaiming"


TaintKey = tuple[str, str]  # (key, effect): what the API keeps unique in a node's taints


def taint_key(taint: model.Taint) -> TaintKey:
    return (taint.key, taint.effect)


@dataclass(frozen=True, slots=True)
class Original:
    """What lending changed: the whole taint list before, and each changed label's old value.

    A label that lending added has ``None`` here: restore removes it. ``added`` and ``removed``
    are what the lend did to the taints (the taints it added; the key and effect of those it
    took out), as recorded by this release (format version 2); ``None`` in a version 1 record,
    as older releases wrote it, whose restore derives them from the pool's ``LendSpec``.
    """

    taints: tuple[model.Taint, ...]
    labels: Mapping[str, str | None]
    added: tuple[model.Taint, ...] | None = None
    removed: tuple[TaintKey, ...] | None = None


@dataclass(frozen=True, slots=True)
class Drift:
    """Something another writer changed on a node that is ours to finish: the node is still
    readable, but not as the controller left it (docs/design/other-writers.md)."""

    reason: model.Reason  # its own code: state_label_lost, state_unreadable, lent_taint_lost, ...
    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={bounded.quoted(self.value)}: {self.why}"


@dataclass(frozen=True, slots=True)
class NodeState:
    phase: Phase
    original: Original | None = None
    since: datetime | None = None
    decision: str | None = None
    deadline: datetime | None = None
    # What another writer changed that the read worked around (a lost state label read as
    # lent, a garbled time read as unknown); empty when the node is as the controller left it.
    drift: tuple[Drift, ...] = ()
    # False when the state is not signed by the controller for this node (a drift
    # ``state_unverified`` says why): it is never acted on as written.
    verified: bool = True

    @property
    def noticed(self) -> bool:
        """Lent, and its borrowed pods told to be gone by ``deadline``: a reclaim that has
        not begun yet (docs/design/reclaim-notice.md). The label still says lent."""
        return self.phase is Phase.LENT and self.deadline is not None


@dataclass(frozen=True, slots=True)
class StateError:
    """A key the controller owns holds something it cannot read. The node is left alone."""

    key: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}={bounded.quoted(self.value)}: {self.why}"


@dataclass(frozen=True, slots=True)
class LendSpec:
    """What lending does to a node of a pool: taints out, taints in, labels set or removed."""

    remove_taints: tuple[model.Taint, ...]  # matched by key and effect
    add_taints: tuple[model.Taint, ...]
    labels: Mapping[str, str | None] = field(default_factory=dict)  # None removes the label
    # The labels a serving node of the pool carries (its ``serving_labels`` setting): what a
    # restore from the specification sets, when a node's own original cannot be read.
    serving_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeChange:
    """The metadata one transition writes. ``None`` in a mapping deletes that key.

    ``taints`` is the whole new list (the API treats it as atomic) or ``None`` for no change;
    ``kept``, for a restore, the taints of other writers it leaves on the node (not written:
    said in the result, the outcome record and the Event).
    """

    taints: tuple[model.Taint, ...] | None
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]
    kept: tuple[model.Taint, ...] = ()


def merged(current: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
    """``current`` with ``change`` written over it (``None`` deletes a key), as a merge patch
    writes a node's labels or annotations."""
    result = dict(current)
    for key, value in change.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result
