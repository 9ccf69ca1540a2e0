"""The cluster objects as the core sees them: nodes, their taints and the pods on them, and
pending pods that could take a lent node; what adapters translate the Kubernetes API into."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from functools import cached_property

from rebalancer.core import bounded
from rebalancer.core.model.names import NodeName


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint exactly as the API holds it (``value`` may be absent)."""

    key: str
    effect: str
    value: str | None = None
    time_added: str | None = None  # as the API wrote it (RFC 3339), kept for exact restores

    def __str__(self) -> str:
        value = "" if self.value is None else f"={self.value}"
        return f"{self.key}{value}:{self.effect}"

    def to_doc(self) -> dict[str, str]:
        """The taint as the API writes it, in its field order (a restore gives back the very
        bytes a node had): absent fields left out, nothing normalised."""
        doc = {"key": self.key}
        if self.value is not None:
            doc["value"] = self.value
        doc["effect"] = self.effect
        if self.time_added is not None:
            doc["timeAdded"] = self.time_added
        return doc


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration as the API holds it (empty strings for absent fields)."""

    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" tolerates every effect


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Kubernetes' toleration matching (k8s.io/api/core/v1 ToleratesTaint)."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.operator == "Equal" and t.key == taint.key and t.value == (taint.value or ""):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Resources:
    """What a pod requests or a node offers, in the three units a GPU job is placed by:
    ``nvidia.com/gpu`` devices, CPU in millicores, memory in bytes."""

    gpu: int = 0
    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpu + other.gpu, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpu - other.gpu, self.cpu - other.cpu, self.memory - other.memory)

    def covers(self, wanted: Resources) -> bool:
        return self.gpu >= wanted.gpu and self.cpu >= wanted.cpu and self.memory >= wanted.memory

    def __str__(self) -> str:
        return f"{self.gpu} GPU, {self.cpu}m CPU, {self.memory / 2**30:.4g} GiB"


NOTHING = Resources()


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry of a required node affinity term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        values = f" {list(self.values)}" if self.values else ""
        return f"{self.key} {self.operator}{values}"


@dataclass(frozen=True, slots=True)
class PendingPod:
    """A pod waiting to be scheduled that would run on lent capacity: a possible taker.

    ``affinity`` is the required node affinity: any one term (a tuple of requirements that must
    all hold) admits a node; empty, no affinity. ``job`` is the pod's job identity: the pending
    pods of one job are a gang, placed together or not at all (``core.takers``)."""

    namespace: str
    name: str
    tolerations: tuple[Toleration, ...]
    requests: Resources = NOTHING
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[tuple[Requirement, ...], ...] = ()
    job: str | None = None
    priority: int = 0
    created: datetime | None = None


class PodRole(StrEnum):
    """What a pod is to the controller; decided by the adapter from the pool's selectors."""

    INFERENCE = "inference"  # a serving replica: its node is busy and never lent
    BORROWED = "borrowed"  # preemptible training that tolerates the lend taint
    DAEMON = "daemon"  # a DaemonSet pod: does not make a node busy
    OTHER = "other"  # anything else: the node is not idle, so it is not lent


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    role: PodRole
    priority: int = 0
    job: str | None = None  # the training job the pod belongs to, if any
    created: datetime | None = None
    terminating: bool = False
    ready: bool = True  # the pod's Ready condition: an inference pod serves only when Ready
    # When it was bound to its node (its PodScheduled condition's time, else its creation): a
    # pod bound before its node's ``created`` was bound to an earlier node of that name.
    bound: datetime | None = None
    requests: Resources = NOTHING  # what it holds of its node (a lent node's room for takers)
    # What the pod says of its own work (docs/design/reclaim-notice.md): when it last saved
    # (believed: at or after its creation), the reclaim id it has saved for, and why a
    # checkpoint it gives is not believed (reported as a finding on its node).
    checkpointed: datetime | None = None
    acked: str | None = None
    unbelieved: Unbelieved | None = None


@dataclass(frozen=True, slots=True)
class Unbelieved:
    """A pod annotation that was read and is not believed, and why. Reported (a finding on
    the pod's node), never raised: the pod is read as one that does not say it. The value
    comes from outside and is kept cut (``bounded.cut``)."""

    key: str
    value: str
    why: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", bounded.cut(self.value))

    def __str__(self) -> str:
        return f"{self.key}={bounded.quoted(self.value)} is not believed: {self.why}"


@dataclass(frozen=True)
class PodMarks:
    """How a pool tells its pods apart: a pod that tolerates every lend taint is borrowed, one
    whose labels match ``inference_selector`` serves (``adapters.convert`` reads them so); and
    the prefix under which a pod speaks to the controller."""

    lend_taints: tuple[Taint, ...]
    serving_taints: tuple[Taint, ...] = ()
    inference_selector: Mapping[str, str] = field(default_factory=dict)
    # The controller's key prefix: a pod says when it last saved, and which reclaim it has
    # saved for, under it (``<prefix>last-checkpoint-time``, ``<prefix>reclaim-ack``).
    prefix: str = "rebalancer.io/"


@dataclass(frozen=True)
class NodeView:
    """A Node as the core needs it. Parsed annotations are cached on the (immutable) value."""

    name: NodeName
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    pods: tuple[PodView, ...] = ()
    ready: bool = True
    resource_version: str = ""
    allocatable: Resources | None = None  # None: unknown, so no taker can be shown to fit
    # Which incarnation of the name this is: a node deleted and re-created under its name is
    # another node, and a pod bound before ``created`` was bound to an earlier one.
    uid: str = ""
    created: datetime | None = None
    # Derived values the core computes once per node value (parsed state, overrides). Not an
    # init field, so ``dataclasses.replace`` gives the new value a memo of its own.
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False, init=False)

    @cached_property
    def idle(self) -> bool:
        """No pod that makes lending unsafe: DaemonSet pods and borrowed ones do not count."""
        return all(p.role in (PodRole.DAEMON, PodRole.BORROWED) for p in self.pods)

    @cached_property
    def inference_ready(self) -> bool | None:
        """Whether every inference pod on the node is Ready; None when it runs none (pods that
        are terminating do not count). Computed once per node value, not per tick."""
        inference = [p for p in self.pods if p.role is PodRole.INFERENCE and not p.terminating]
        return all(p.ready for p in inference) if inference else None

    @cached_property
    def borrowed_pods(self) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if p.role is PodRole.BORROWED)

    def alike_but_version(self, other: NodeView) -> bool:
        """Whether ``other`` is this node with another resourceVersion alone (a heartbeat):
        whatever the core derives from a node but the version (its state, its facts, the
        planner's decoding) is then the same, and may be carried over instead of derived
        again. Every field but the version is compared, so a field added later counts."""
        return all(getattr(self, name) == getattr(other, name) for name in _BUT_VERSION)


# ``NodeView.alike_but_version``'s fields: all but the version and the memo.
_BUT_VERSION = tuple(f.name for f in fields(NodeView) if f.name not in ("resource_version", "memo"))
