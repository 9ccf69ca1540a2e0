"""Records written one at a time, outside a tick's plan: an episode's start or end, a minute of
cost, a restarted controller's recovery intent, and the outcome of an intent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from rebalancer.core import model
from rebalancer.core.audit.documents import jsonable, node_doc
from rebalancer.core.audit.record import AuditRecord, Context, Json, Kind, NewId
from rebalancer.core.outcomes import Outcome
from rebalancer.core.policy import PoolPolicy


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
    """A minute in which lending cost ``pool`` (``core.tick.nodes_lending_costs``): its queue,
    its limit, the nodes away on loan, and, with an ``slo``, the budget this minute leaves."""
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
    detail: Mapping[str, Any] | None = None,
) -> AuditRecord:
    """The intent of a restarted controller to end a transition a previous run left in flight
    (``action`` ``rollback`` or ``reclaim``), naming the intent it takes over (``recovers``,
    None when the node names no record the store holds), with ``detail`` added. Written
    before any of its writes."""
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
            **(detail or {}),
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
