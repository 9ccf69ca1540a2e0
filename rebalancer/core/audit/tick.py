"""The records of one tick's plan (``build_tick``): an intent per step, a refusal per rejection,
a finding each, and a summary per pool that moved nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rebalancer.core import model, nodestate
from rebalancer.core.audit.documents import intent_doc, jsonable, node_doc
from rebalancer.core.audit.inputs import node_overrides, pool_inputs
from rebalancer.core.audit.record import STEADY, AuditRecord, Context, Json, Kind, NewId
from rebalancer.core.policy import PoolPolicy


@dataclass(frozen=True)
class Tick:
    """The records of one tick, and which intent record each step belongs to."""

    records: tuple[AuditRecord, ...]
    intents: Mapping[tuple[str, str, str], AuditRecord]  # (pool, node, action) -> intent

    def intent_for(self, step: model.Step) -> AuditRecord:
        return self.intents[(step.pool, step.node, step.action.value)]


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
        # By name for the records about a node; an idle pool's summary names none (a map of
        # its every node was built for nothing, every tick).
        about = pool_plan.steps or pool_plan.rejections or pool_plan.findings
        nodes = {n.name: n for n in pool.nodes} if about else {}
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
    detail: Json = {"urgent": step.urgent, "intent": intent_doc(step.intent)}
    if step.action is model.Action.RECLAIM:  # how far ahead its pods are told, and why
        detail["notice_seconds"] = step.notice.total_seconds()
        detail["notice"] = step.notice_note
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
        detail={"intent": intent_doc(rejection.intent)}
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
