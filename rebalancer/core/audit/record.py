"""What an audit record is: its kinds, the context every record of a tick shares, and the
record itself; the vocabulary the other rooms build, encode and deduplicate."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rebalancer.core import model
from rebalancer.core.outcomes import Outcome

NewId = Callable[[], str]
Json = dict[str, Any]


class Kind(enum.StrEnum):
    INTENT = "intent"
    OUTCOME = "outcome"
    REFUSAL = "refusal"
    FINDING = "finding"
    SUMMARY = "summary"
    COST = "cost"


DEDUPED = frozenset({Kind.REFUSAL, Kind.FINDING, Kind.SUMMARY})


# The cluster a record belongs to when none is named: the ``cluster_name`` setting's default, and
# what schema version 2 gave the rows written before records carried a cluster (so a controller
# upgraded in place, still unnamed, reads its own history back).
DEFAULT_CLUSTER = "default"
STEADY = "steady"  # the reason code of a summary with no refusal: nothing asked for anything


@dataclass(frozen=True)
class Context:
    """Who decides, and with what: the same for every record of a tick."""

    # This process's identity, the Lease holder's: ``<pod>_<uuid>``, its pod's name and a suffix
    # of its own (``adapters.leadership.pod_of`` gives the pod back); the pod's name alone in
    # records of earlier releases.
    controller: str
    term: int | None  # the leader term the decision was made under; None when not leading
    strategy: str
    params: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False


@dataclass(frozen=True)
class AuditRecord:
    id: str  # sortable: ULID-like, time first
    time: datetime  # aware, UTC
    kind: Kind
    pool: str
    controller: str
    reason: str  # a stable reason code (core.model.Reason, or "steady")
    message: str  # the human sentence
    node: str | None = None
    action: model.Action | None = None
    origin: model.Origin | None = None
    count: int = 1  # nodes concerned (a refusal may cover several)
    term: int | None = None
    strategy: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    before: Mapping[str, Any] | None = None  # {"taints": [...], "labels": {...}}
    after: Mapping[str, Any] | None = None
    pods: tuple[str, ...] = ()  # "namespace/name" evicted or deleted
    dry_run: bool = False
    error: str | None = None
    outcome: Outcome | None = None  # on outcome records
    intent_id: str | None = None  # on outcome records: the intent they close
    detail: Mapping[str, Any] = field(default_factory=dict)  # e.g. the actuator's writes
    # The cluster whose controller wrote it: ``adapters.audit.AuditLog`` sets its own on every
    # record it writes, and reads back only those (one store may be shared by a fleet).
    cluster: str = DEFAULT_CLUSTER
