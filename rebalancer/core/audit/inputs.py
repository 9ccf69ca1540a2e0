"""What a decision was made from, as a record's ``inputs``: the pool's samples, window and
proposal, and a node's operator overrides."""

from __future__ import annotations

from datetime import datetime

from rebalancer.core import bounded, clocks, model, nodestate, overrides
from rebalancer.core.audit.documents import jsonable, sample_doc, time_doc
from rebalancer.core.audit.record import Json
from rebalancer.core.policy import PoolPolicy


def pool_inputs(
    now: datetime,
    pool: model.PoolSnapshot,
    proposal: model.Proposal | None,
    policy: PoolPolicy | None,
) -> Json:
    """What the pool's decision was made from: metric samples, window state, the proposal."""
    doc: Json = {
        "demand": sample_doc(pool.demand),
        "queue": sample_doc(pool.queue),
        "nodes": len(pool.nodes),
        "history_end": None if pool.history is None else time_doc(pool.history.end),
    }
    if not pool.demand_known:  # the sample above is the last good one, or there is none
        doc["demand_unknown"] = {
            "since": time_doc(pool.demand.at if pool.demand else pool.unknown_since or now)
        }
    if pool.clocks.skews or pool.clocks.unmeasured:  # what sample ages were told on
        doc["clocks"] = clocks.doc(pool.clocks)
    if pool.held is not None:  # the evidence of a fall not believed yet
        doc["demand_held"] = {
            "level": sample_doc(pool.held.level),
            "seen": sample_doc(pool.held.seen),
            "since": time_doc(pool.held.since),
        }
    if pool.alerts:  # the Alertmanager alerts the pool was held to, and what matched each
        # Anyone who may post can make a thousand: every record of the pool names the first
        # few and counts the rest.
        shown, more = bounded.listed(pool.alerts)
        if more:
            doc["alerts_more"] = more
        doc["alerts"] = [
            {
                "alertname": a.name,
                "fingerprint": a.fingerprint,
                "starts_at": time_doc(a.starts_at),
                "matcher": a.matcher,
                "received": time_doc(a.received),
                "until": time_doc(a.until),
            }
            for a in shown
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
            "until": None if parsed.overrides.until is None else time_doc(parsed.overrides.until),
            "expired": active is not parsed.overrides,
            "problems": [str(p) for p in parsed.problems],
        }
    }
    if active.window is not None:
        doc["node_window"] = {"text": active.window.text, "open": active.window.is_open(now)}
    return doc
