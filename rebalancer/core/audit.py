"""Audit records: what the controller decided, from what, and what came of it (docs/audit.md).

Pure: this module builds ``AuditRecord`` values from a tick's ``Plan`` and the ``Snapshot`` it was
made from, turns them into JSON documents, and decides which of them a steady state would only
repeat (``Deduper``). Writing them (a database, stdout) is ``rebalancer.adapters.audit``; record
ids come from an injected ``new_id`` so that nothing here reads a clock or a random source.

Kinds of record:
- ``intent``: a step the actuator is about to carry out, written (and committed) before it acts;
  its id is what the actuator writes into the node's ``decision`` annotation.
- ``outcome``: what came of an intent, appended as a new row that names the intent
  (``intent_id``); the intent row itself is never changed.
- ``refusal``: (part of) an intent the planner refused, with its reason code.
- ``finding``: a bad operator annotation.
- ``summary``: a pool that got no step this tick, and why ("nothing to do because ...").
- ``cost``: a minute in which lending cost a pool (requests queued beyond its limit while nodes
  were away on loan), one per pool and minute: the pool's error budget is counted from these.

Refusals, findings and summaries are deduplicated (see ``Deduper``); intents and outcomes never.
See docs/audit.md for every field.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rebalancer.core import clocks, model, nodestate, overrides
from rebalancer.core.outcomes import Outcome
from rebalancer.core.policy import PoolPolicy

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

    controller: str  # this instance's identity (the Lease holder identity)
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


@dataclass(frozen=True)
class Tick:
    """The records of one tick, and which intent record each step belongs to."""

    records: tuple[AuditRecord, ...]
    intents: Mapping[tuple[str, str, str], AuditRecord]  # (pool, node, action) -> intent

    def intent_for(self, step: model.Step) -> AuditRecord:
        return self.intents[(step.pool, step.node, step.action.value)]


# ---------------------------------------------------------------------------------------------
# Building records


def build_tick(
    plan: model.Plan,
    snapshot: model.Snapshot,
    ctx: Context,
    new_id: NewId,
    proposals: Mapping[model.PoolName, model.Proposal] | None = None,
    policies: Mapping[model.PoolName, PoolPolicy] | None = None,
    keys: nodestate.Keys | None = None,
) -> Tick:
    """Every record a tick produces: intents, refusals, findings, and a summary per idle pool."""
    keys = keys or nodestate.Keys()
    proposals = proposals or {}
    policies = policies or {}
    records: list[AuditRecord] = []
    intents: dict[tuple[str, str, str], AuditRecord] = {}
    for name, pool_plan in plan.pools.items():
        pool = snapshot.pools.get(name, model.PoolSnapshot(nodes=()))
        policy, proposal = policies.get(name), proposals.get(name)
        nodes = {n.name: n for n in pool.nodes}
        base = pool_inputs(plan.now, pool, proposal, policy)
        stamp = _Stamp(ctx, new_id, plan.now, str(name), nodes, base, policy, keys)
        for step in pool_plan.steps:
            record = _intent(stamp, step)
            records.append(record)
            intents[(str(name), str(step.node), step.action.value)] = record
        records.extend(_refusal(stamp, r) for r in pool_plan.rejections)
        records.extend(_finding(stamp, f) for f in pool_plan.findings)
        if not pool_plan.steps:
            records.append(_summary(stamp, pool_plan, proposal))
    return Tick(tuple(records), intents)


def _intent(stamp: _Stamp, step: model.Step) -> AuditRecord:
    detail: Json = {"urgent": step.urgent, "intent": _intent_doc(step.intent)}
    view = stamp.nodes.get(step.node)
    if view is not None and view.uid:  # the incarnation of the name it was decided for
        detail["node_uid"] = view.uid
    return stamp(
        kind=Kind.INTENT,
        node=str(step.node),
        action=step.action,
        origin=step.intent.origin,
        reason=step.reason.value,
        message=step.message,
        detail=detail,
    )


def _refusal(stamp: _Stamp, rejection: model.Rejection) -> AuditRecord:
    return stamp(
        kind=Kind.REFUSAL,
        node=None if rejection.node is None else str(rejection.node),
        action=rejection.intent.action,
        origin=rejection.intent.origin,
        reason=rejection.reason.value,
        message=rejection.message,
        count=rejection.count,
        detail={"intent": _intent_doc(rejection.intent)}
        | ({"excluded": excluded_doc(rejection.excluded)} if rejection.excluded else {}),
    )


EXCLUDED_SHOWN = 50  # per refusal: the nodes named one by one, the rest counted


def excluded_doc(pairs: Sequence[tuple[model.NodeName, model.Reason]]) -> Json:
    """The nodes a refused intent could not take, each with its reason: the first
    ``EXCLUDED_SHOWN`` by name, and how many more."""
    shown = {str(n): r.value for n, r in pairs[:EXCLUDED_SHOWN]}
    return {"nodes": shown, "more": max(0, len(pairs) - EXCLUDED_SHOWN)}


def _finding(stamp: _Stamp, finding: model.Finding) -> AuditRecord:
    return stamp(
        kind=Kind.FINDING,
        node=str(finding.node),
        reason=finding.reason.value,
        message=finding.message,
        detail={"key": finding.key, "value": finding.value},
    )


def _summary(
    stamp: _Stamp, pool_plan: model.PoolPlan, proposal: model.Proposal | None
) -> AuditRecord:
    """A pool that moved nothing: what it was asked for and every refusal, in one record."""
    rejections = pool_plan.rejections
    refused = sorted({(r.reason.value, r.intent.action.value, r.count) for r in rejections})
    return stamp(
        kind=Kind.SUMMARY,
        reason=rejections[0].reason.value if rejections else STEADY,
        message=pool_plan.summary,
        count=0,
        detail={
            "lend_target": None if proposal is None else proposal.lend_target,
            "refusals": [list(r) for r in refused],
        },
    )


@dataclass(frozen=True)
class _Stamp:
    """Builds the records of one pool: the context, the inputs and the node's state filled in."""

    ctx: Context
    new_id: NewId
    now: datetime
    pool: str
    nodes: Mapping[model.NodeName, model.NodeView]
    base: Json
    policy: PoolPolicy | None
    keys: nodestate.Keys

    def __call__(self, **kw: Any) -> AuditRecord:
        node = kw.get("node")
        view = self.nodes.get(model.NodeName(node)) if node else None
        inputs = self.base
        if view is not None:
            inputs = {**self.base, **node_overrides(self.now, view, self.keys, self.policy)}
        return AuditRecord(
            id=self.new_id(),
            time=self.now,
            pool=self.pool,
            controller=self.ctx.controller,
            term=self.ctx.term,
            strategy=self.ctx.strategy,
            params=jsonable(self.ctx.params),
            dry_run=self.ctx.dry_run,
            inputs=inputs,
            before=node_doc(view) if view is not None else None,
            **kw,
        )


def episode_record(
    ctx: Context,
    new_id: NewId,
    now: datetime,
    pool: str,
    reason: model.Reason,
    message: str,
    detail: Mapping[str, Any],
) -> AuditRecord:
    """A pool-wide finding that starts or ends an episode (a strategy or the planner failing,
    and its recovery). Written once when the episode starts and once when it ends, never per
    tick: the runtime tracks the episode, this only builds the record."""
    return _stamped(
        ctx,
        new_id,
        now,
        pool,
        kind=Kind.FINDING,
        reason=reason.value,
        message=message,
        count=0,
        detail=jsonable(detail),
    )


def cost_record(
    ctx: Context,
    new_id: NewId,
    minute: datetime,
    pool: model.PoolSnapshot,
    name: str,
    policy: PoolPolicy,
    away: int,
    budget: model.ErrorBudget | None,
) -> AuditRecord:
    """A minute in which lending cost ``pool`` (``core.tick.costs``): its queue, its limit, the
    nodes away on loan, and, with an ``slo``, the budget this minute leaves."""
    queue = pool.queue.value if pool.queue is not None else 0.0
    message = (
        f"pool {name}: {queue:g} request(s) queued beyond the limit of {policy.queue_limit:g} "
        f"while {away} node(s) were away on loan"
    )
    detail: Json = {"queue": queue, "queue_limit": policy.queue_limit, "away": away}
    if budget is not None:
        message += f": error budget {budget.spent_text}"
        detail |= {"spent_minutes": budget.spent_minutes, "allowed_minutes": budget.allowed_minutes}
    return _stamped(
        ctx,
        new_id,
        minute,
        name,
        kind=Kind.COST,
        reason=model.Reason.BORROWING_COST.value,
        message=message,
        count=away,
        detail=jsonable(detail),
    )


def recovery_intent(
    ctx: Context,
    new_id: NewId,
    now: datetime,
    pool: str,
    view: model.NodeView,
    action: model.Action,
    recovers: str | None,
    message: str,
) -> AuditRecord:
    """The intent of a restarted controller to end a transition a previous run left in flight
    (``action`` ``rollback`` or ``reclaim``), naming the intent it takes over (``recovers``,
    None when the node names no record the store holds). Written before any of its writes."""
    return _stamped(
        ctx,
        new_id,
        now,
        pool,
        kind=Kind.INTENT,
        reason=model.Reason.RECOVERY.value,
        message=message,
        node=str(view.name),
        action=action,
        origin=model.Origin.RECOVERY,
        before=node_doc(view),
        detail={
            "recovers": recovers,
            "urgent": action is model.Action.RECLAIM,
            **({"node_uid": view.uid} if view.uid else {}),
        },
    )


def _stamped(ctx: Context, new_id: NewId, now: datetime, pool: str, **kw: Any) -> AuditRecord:
    """A record of ``pool`` at ``now`` with who decided and with what (``ctx``) filled in."""
    return AuditRecord(
        id=new_id(),
        time=now,
        pool=pool,
        controller=ctx.controller,
        term=ctx.term,
        strategy=ctx.strategy,
        params=jsonable(ctx.params),
        dry_run=ctx.dry_run,
        **kw,
    )


def outcome_record(
    intent: AuditRecord,
    new_id: NewId,
    now: datetime,
    result: Outcome,
    message: str,
    *,
    after: Mapping[str, Any] | None = None,
    pods: Sequence[str] = (),
    error: str | None = None,
    detail: Mapping[str, Any] | None = None,
    ctx: Context | None = None,
) -> AuditRecord:
    """The outcome of ``intent``: a new record carrying the intent's node, action and reason."""
    return replace(
        intent,
        id=new_id(),
        time=now,
        kind=Kind.OUTCOME,
        controller=ctx.controller if ctx else intent.controller,
        term=ctx.term if ctx else intent.term,
        message=message,
        outcome=result,
        intent_id=intent.id,
        after=after,
        pods=tuple(pods),
        error=error,
        detail=jsonable(detail or {}),
    )


def pool_inputs(
    now: datetime,
    pool: model.PoolSnapshot,
    proposal: model.Proposal | None,
    policy: PoolPolicy | None,
) -> Json:
    """What the pool's decision was made from: metric samples, window state, the proposal."""
    doc: Json = {
        "demand": _sample(pool.demand),
        "queue": _sample(pool.queue),
        "nodes": len(pool.nodes),
        "history_end": None if pool.history is None else _time(pool.history.end),
    }
    if not pool.demand_known:  # the sample above is the last good one, or there is none
        doc["demand_unknown"] = {
            "since": _time(pool.demand.at if pool.demand else pool.unknown_since or now)
        }
    if pool.clocks.skews or pool.clocks.unmeasured:  # what sample ages were told on
        doc["clocks"] = clocks.doc(pool.clocks)
    if pool.held is not None:  # the evidence of a fall not believed yet
        doc["demand_held"] = {
            "level": _sample(pool.held.level),
            "seen": _sample(pool.held.seen),
            "since": _time(pool.held.since),
        }
    if pool.alerts:  # the Alertmanager alerts the pool was held to, and what matched each
        doc["alerts"] = [
            {
                "alertname": a.name,
                "fingerprint": a.fingerprint,
                "starts_at": _time(a.starts_at),
                "matcher": a.matcher,
                "received": _time(a.received),
                "until": _time(a.until),
            }
            for a in pool.alerts
        ]
    if proposal is not None:
        doc["proposal"] = {
            "lend_target": proposal.lend_target,
            "reason": proposal.reason,
            "evidence": jsonable(proposal.evidence),
        }
    if policy is not None:
        doc["window"] = {"text": policy.window.text, "open": policy.window.is_open(now)}
    return doc


def node_overrides(
    now: datetime, view: model.NodeView, keys: nodestate.Keys, policy: PoolPolicy | None
) -> Json:
    """The node's operator overrides as they stand at ``now``, and its window if it has one."""
    zone = policy.zone if policy is not None else "UTC"
    parsed = overrides.parse(view.annotations, keys, zone)
    active = parsed.overrides.active(now)
    doc: Json = {
        "overrides": {
            "lend": active.lend.value,
            "reclaim_now": active.reclaim_now,
            "paused": active.paused,
            "until": None if parsed.overrides.until is None else _time(parsed.overrides.until),
            "expired": active is not parsed.overrides,
            "problems": [str(p) for p in parsed.problems],
        }
    }
    if active.window is not None:
        doc["node_window"] = {"text": active.window.text, "open": active.window.is_open(now)}
    return doc


def node_doc(view: model.NodeView) -> Json:
    """Taints and labels of a node, in the API's shape (taint order kept)."""
    return {
        "taints": [t.to_doc() for t in view.taints],
        "labels": dict(sorted(view.labels.items())),
    }


def _intent_doc(intent: model.Intent) -> Json:
    return {
        "action": intent.action.value,
        "count": intent.count,
        "origin": intent.origin.value,
        "reason": intent.reason.value,
        "message": intent.message,
        "node": intent.node,
    }


def _sample(sample: model.Sample | None) -> Json | None:
    if sample is None:
        return None
    return {"value": _number(sample.value), "at": _time(sample.at)}


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # JSON has no NaN or infinity


def _time(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` with datetimes, durations, enums, tuples and sets made JSON-safe."""
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, datetime):
        return _time(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [jsonable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return str(value)


def to_json(record: AuditRecord) -> Json:
    """The record as one JSON document (the stdout line, and what readers get)."""
    return {
        "id": record.id,
        "time": _time(record.time),
        "cluster": record.cluster,
        "kind": record.kind.value,
        "controller": record.controller,
        "term": record.term,
        "pool": record.pool,
        "node": record.node,
        "action": record.action,
        "origin": record.origin,
        "reason": record.reason,
        "message": record.message,
        "count": record.count,
        "strategy": record.strategy,
        "params": jsonable(record.params),
        "inputs": jsonable(record.inputs),
        "before": jsonable(record.before),
        "after": jsonable(record.after),
        "pods": list(record.pods),
        "dry_run": record.dry_run,
        "error": record.error,
        "outcome": record.outcome,
        "intent_id": record.intent_id,
        "detail": jsonable(record.detail),
    }


# ---------------------------------------------------------------------------------------------
# Dedupe: a steady state writes nothing new


DedupeKey = tuple[str, str, str, str, str]  # kind, pool, node, action, reason


def dedupe_key(record: AuditRecord) -> DedupeKey:
    return (record.kind.value, record.pool, record.node or "", record.action or "", record.reason)


def fingerprint(record: AuditRecord) -> str:
    """What must change for a deduplicated record to be written again. Not the message (it
    carries live numbers such as a sample's age) and not the inputs (metric values move every
    tick): who asked, how many nodes, and the details (the refused intent without its message,
    the bad annotation value, a summary's target and refusals)."""
    detail = dict(jsonable(record.detail))
    if isinstance(detail.get("intent"), dict):  # its message is the strategy's, with numbers
        detail["intent"] = {k: v for k, v in detail["intent"].items() if k != "message"}
    doc = {"origin": record.origin, "count": record.count, "detail": detail}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class Deduper:
    """Which refusals, findings and summaries of a tick to write.

    A record of a deduplicated kind is dropped when a record with the same key (kind, pool, node,
    action, reason code) and the same ``fingerprint`` was written and is still remembered. The
    memory of a key is forgotten, so the next such record is written again, when:
    - a tick of its pool comes without that key (the refusal went away, then came back);
    - a tick writes an intent for the pool (something was done: the situation changed);
    - ``repeat_after`` has passed since it was written (a steady state leaves one record per key
      per ``repeat_after``; ``None`` never repeats).
    Memory is per process: a restarted controller writes the current refusals once again.
    """

    def __init__(self, repeat_after: timedelta | None = timedelta(hours=1)) -> None:
        self.repeat_after = repeat_after
        self._seen: dict[DedupeKey, dict[str, datetime]] = {}

    def select(self, records: Iterable[AuditRecord]) -> list[AuditRecord]:
        """The records of one tick that should be written (nothing is remembered yet)."""
        batch = list(records)
        acted = {r.pool for r in batch if r.kind is Kind.INTENT}
        return [r for r in batch if r.kind not in DEDUPED or r.pool in acted or not self._known(r)]

    def _known(self, record: AuditRecord) -> bool:
        written = self._seen.get(dedupe_key(record), {}).get(fingerprint(record))
        if written is None:
            return False
        return self.repeat_after is None or record.time - written < self.repeat_after

    def commit(self, tick: Iterable[AuditRecord], written: Iterable[AuditRecord]) -> None:
        """Remember a tick once the selected records (``written``) are stored."""
        batch = list(tick)
        stored = {r.id for r in written}
        pools = {r.pool for r in batch}
        acted = {r.pool for r in batch if r.kind is Kind.INTENT}
        fresh: dict[DedupeKey, dict[str, datetime]] = {}
        for record in batch:
            if record.kind not in DEDUPED or record.pool in acted:
                continue
            key, fp = dedupe_key(record), fingerprint(record)
            old = self._seen.get(key, {}).get(fp)
            when = record.time if record.id in stored or old is None else old
            fresh.setdefault(key, {})[fp] = when
        for key in [k for k in self._seen if k[1] in pools]:
            del self._seen[key]
        self._seen.update(fresh)
