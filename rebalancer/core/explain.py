"""Why a node is lent or not, and what the next tick would do to it: ``rebalancer explain``.

Where it sits: the runtime observes and decides exactly as a tick does (``Reconciler.preview``,
or the loop's last tick for ``GET /api/v1/explain``) and hands the snapshot and the decision
here; nothing here decides anything of its own. The rules come from ``planning.node_rules``
(the planner's own tables and limits, every one evaluated), the next move from the plan.

The answer is one JSON document (the CLI's ``--json`` and the HTTP API print it as it is) and
``lines``, its words for a person. The first line says it all: the node, its phase and since
when, and what the next tick does to it. Pure: time, state and the decision are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from rebalancer.core import (
    audit,
    bounded,
    clocks,
    model,
    nodestate,
    overrides,
    planning,
    tick,
    victims,
)
from rebalancer.core import demand as demand_module
from rebalancer.core.model import NodeName, PoolName
from rebalancer.core.policy import PoolPolicy
from rebalancer.core.tick import Decision, Stage

Json = dict[str, Any]


def node(
    name: NodeName,
    pool: PoolName,
    snapshot: model.Snapshot,
    decision: Decision,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool = False,
    frozen: bool = False,
) -> Json:
    """Everything about one node of ``pool`` as the tick of ``snapshot`` saw and decided it."""
    now, seen = snapshot.now, snapshot.pools[pool]
    view = next(v for v in seen.nodes if v.name == name)
    state = nodestate.read(view, keys)
    parsed = overrides.parse(view.annotations, keys, policy.zone)
    rules = planning.node_rules(now, pool, seen, policy, keys, name, paused, frozen)
    plan = decision.plan.pools.get(pool)
    doc: Json = {
        "node": str(name),
        "pool": str(pool),
        "as_of": _time(now),
        **_state(state, now),
        "ready": view.ready,
        "pods": _pods(view.pods),
        # Bound to the name before this node was created: a deleted lent node's, removed by
        # every tick until gone (docs/design/other-writers.md), whatever the plan says.
        "left_by_earlier_node": [
            f"{p.namespace}/{p.name}" for p in victims.left_by_earlier_node(view)
        ],
        "overrides": _overrides(parsed.overrides.active(now)),
        "override_problems": [str(p) for p in parsed.problems],
        **_pool_inputs(pool, seen, decision, policy, now),
        "rules": {
            "move": rules.move.value if rules.move else None,
            "note": rules.note,
            "checks": [
                {"rule": c.rule.value, "verdict": c.verdict.value, "note": c.note}
                for c in rules.checks
            ],
        },
        "next": _next(name, rules.move, plan) if plan else [],
    }
    lent = tick.kept_count(seen, keys, policy.lend_spec.add_taints)
    doc["headline"] = _headline(doc, lent)
    return doc


def _headline(doc: Json, lent: int) -> str:
    """The first line: the node, its phase and since when, and what the next tick does."""
    since = ""
    if doc.get("since"):
        since = f" since {doc['since']} ({_ago(doc['for_seconds'])} ago)"
    # Most specific first: a step or a refusal about this node, then the first of its own
    # rules that refuses, then a pool-wide intent cut short, then what the strategy wants.
    nexts = doc["next"]
    about = [n for n in nexts if n["what"] != "not_chosen"]
    rules = doc["rules"]
    refusing = [c for c in rules["checks"] if c["verdict"] == planning.Verdict.REFUSES]
    if about:
        what = about[0]["text"]
    elif rules["move"] is None:
        what = f"nothing, it stays {doc['phase']}: {rules['note']}"
    elif refusing and refusing[0]["rule"] in planning.NODE_RULES:
        what = f"nothing, it stays {doc['phase']}: {_refusing(refusing[0])}"
    elif nexts:
        what = nexts[0]["text"]
    elif refusing:
        what = f"nothing, it stays {doc['phase']}: {_refusing(refusing[0])}"
    elif doc["proposal"] is None:
        what = f"nothing, it stays {doc['phase']}: the strategy gave no usable answer"
    else:
        wanted = doc["proposal"]["lend_target"]
        what = f"nothing, it stays {doc['phase']}: the strategy wants {wanted} lent, {lent} are"
    return f"node {doc['node']} (pool {doc['pool']}): {doc['phase']}{since}; next tick: {what}"


def _refusing(check: Json) -> str:
    return f"{check['rule']} refuses ({check['note']})"


def _ago(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{seconds:.0f}s"
    hours, minutes = divmod(minutes, 60)
    if hours >= 24:
        days, hours = divmod(hours, 24)
        return f"{days}d{hours}h" if hours else f"{days}d"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


def pool(
    name: PoolName,
    snapshot: model.Snapshot,
    decision: Decision,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool = False,
    frozen: bool = False,
) -> Json:
    """The pool as the tick saw it, what its strategy proposed, and what the plan does."""
    now, seen = snapshot.now, snapshot.pools[name]
    plan = decision.plan.pools.get(name)
    by_phase: dict[str, list[str]] = {}
    for view in seen.nodes:
        state = nodestate.read(view, keys)
        phase = "unreadable" if isinstance(state, nodestate.StateError) else _phase(state)
        by_phase.setdefault(phase, []).append(str(view.name))
    return {
        "pool": str(name),
        "as_of": _time(now),
        "summary": plan.summary if plan else "not planned",
        "paused": paused,
        "frozen": frozen,
        "nodes": {phase: sorted(names) for phase, names in sorted(by_phase.items())},
        **_pool_inputs(name, seen, decision, policy, now),
        "steps": [_step(s) for s in plan.steps] if plan else [],
        "refusals": [_refusal(r) for r in plan.rejections] if plan else [],
        "findings": [
            {"node": str(f.node), "key": f.key, "value": f.value, "message": f.message}
            for f in (plan.findings if plan else ())
        ],
    }


# ---------------------------------------------------------------------------------------------
# Words for a person


def node_lines(doc: Json) -> list[str]:
    lines = [doc["headline"]]
    lines += [f"  also: {n['text']}" for n in doc["next"][1:]]
    if doc.get("state_error"):
        lines.append(f"  state: {doc['state_error']}")
    if doc.get("decision"):
        lines.append(f"  decision: {doc['decision']}")
    pods = doc["pods"]
    shown = "; ".join(f"{role}: {', '.join(names)}" for role, names in pods.items() if names)
    lines.append(f"  pods: {shown or 'none'}; {'Ready' if doc['ready'] else 'NotReady'}")
    if doc.get("left_by_earlier_node"):
        lines.append(
            f"  left by an earlier node of its name: {', '.join(doc['left_by_earlier_node'])}; "
            "each tick evicts them (deletes them past the pool's reclaim deadline) until gone"
        )
    ov = doc["overrides"]
    set_ = [f"{k}={v}" for k, v in ov.items() if v not in (None, False, "auto")]
    lines.append(f"  overrides: {', '.join(set_) or 'none'}")
    lines += [f"  override refused: {p}" for p in doc["override_problems"]]
    lines += _input_lines(doc)
    rules = doc["rules"]
    if rules["move"] is None:
        lines.append(f"  rules: {rules['note']}")
    else:
        lines.append(f"  rules on {'lending' if rules['move'] == 'lend' else 'taking it back'}:")
        lines += [f"    {c['verdict']:<8} {c['rule']}: {c['note']}" for c in rules["checks"]]
    return lines


def pool_lines(doc: Json) -> list[str]:
    lines = [doc["summary"]]
    lines += [f"  {phase}: {', '.join(names)}" for phase, names in doc["nodes"].items()]
    lines += _input_lines(doc)
    lines += [f"  step: {s['text']}" for s in doc["steps"]]
    lines += [f"  refused: {r['text']}" for r in doc["refusals"]]
    lines += [f"  finding: {f['node']}: {f['message']}" for f in doc["findings"]]
    return lines


def _input_lines(doc: Json) -> list[str]:
    d = doc["demand"]
    symbol = model.Unit(d["unit"]).symbol
    if d["value"] is None:
        demand = "unknown (no sample)"
    elif isinstance(d["value"], str):
        demand = f"unknown (the sample {d['value']} is not a figure in {symbol})"
    else:
        demand = (
            f"{d['value']:.4g} {symbol} sampled {d['age_seconds']:.0f}s ago, "
            f"needs {d['need']} nodes of {d['per_node']:.4g} {symbol}"
        )
        if not d["known"]:
            demand += f"; unknown since {d['unknown_since'] or d['sampled_at']}"
    if d["held"]:
        demand += f"; a fall to {d['held']['seen']:.4g} {symbol} is held"
    queue = "" if d["queue"] is None else f", {d['queue']:.0f} requests waiting"
    lines = [*_read_lines(doc), f"  demand: {demand}{queue}", _history_line(doc.get("history"))]
    lines += [
        f"  alert firing: {a['name']} (matched {a['matcher']}), holds until {a['until']}"
        for a in doc["alerts"]
    ]
    if doc["alerts_more"]:
        lines.append(f"  and {doc['alerts_more']} more alerts firing")
    p = doc["proposal"]
    if doc["strategy_failure"]:
        lines.append(f"  strategy failed: {doc['strategy_failure']}")
    if p is not None:
        evidence = ", ".join(f"{k}={v}" for k, v in p["evidence"].items())
        lines.append(f"  strategy: lend {p['lend_target']}: {p['reason']}")
        if evidence:
            lines.append(f"  evidence: {evidence}")
    return lines


def _read_lines(doc: Json) -> list[str]:
    """Whose reading the answer is, and how old (``runtime.explaining`` says)."""
    read = doc.get("read")
    if read is None:
        return []
    if read["by"] == "loop":
        age = _ago(read["age_seconds"])
        return [f"  inputs: the loop's last tick, at {doc['as_of']} ({age} before this answer)"]
    return [f"  inputs: read now, as the loop reads them at {doc['as_of']}"]


def _history_line(history: Json | None) -> str:
    if history is None:
        return "  history: none (the strategy reads none)"
    if history["newest_age_seconds"] is None:
        # Its end is where the read stopped, not data: an age of it would say nothing.
        searched = _ago(history["searched_seconds"])
        return f"  history: no points in the last {searched} (Prometheus unreachable?)"
    span, step = _ago(history["span_seconds"]), _ago(history["step_seconds"])
    return (
        f"  history: {span} of {step} steps ({history['points']} points) up to "
        f"{history['until']}, its newest point {_ago(history['newest_age_seconds'])} old"
    )


# ---------------------------------------------------------------------------------------------
# Parts


def _state(state: nodestate.NodeState | nodestate.StateError, now: datetime) -> Json:
    if isinstance(state, nodestate.StateError):
        return {"phase": "unreadable", "since": None, "state_error": str(state)}
    return {
        "phase": _phase(state),
        "since": _time(state.since) if state.since else None,
        "for_seconds": (now - state.since).total_seconds() if state.since else None,
        "decision": state.decision,
        "deadline": _time(state.deadline) if state.deadline else None,
    }


def _phase(state: nodestate.NodeState) -> str:
    """The phase in words: a loan under a reclaim notice is ``noticed``."""
    return "noticed" if state.noticed else state.phase.value


def _pods(pods: Iterable[model.PodView]) -> Json:
    by_role: Json = {role.value: [] for role in model.PodRole}
    for pod in pods:
        by_role[pod.role.value].append(f"{pod.namespace}/{pod.name}")
    return by_role


def _overrides(ov: overrides.Overrides) -> Json:
    return {
        "lend": ov.lend.value,
        "reclaim_now": ov.reclaim_now,
        "paused": ov.paused,
        "window": str(ov.window) if ov.window else None,
        "until": _time(ov.until) if ov.until else None,
    }


def _pool_inputs(
    pool: PoolName,
    seen: model.PoolSnapshot,
    decision: Decision,
    policy: PoolPolicy,
    now: datetime,
) -> Json:
    sample, usable = seen.demand, demand_module.usable(seen.demand)
    held = seen.held
    demand = {
        # In the pool's unit, as are ``per_node`` and ``held``'s figures.
        "unit": policy.unit.value,
        # A sample that is no figure (NaN, negative) is shown as the text it was: JSON has no
        # NaN.
        "value": usable.value if usable else (str(sample.value) if sample else None),
        "per_node": policy.rps_per_node,
        "sampled_at": _time(sample.at) if sample else None,
        # On Prometheus' clock, as the planner ages it.
        "age_seconds": sample.age(clocks.prometheus_now(seen.clocks, now)).total_seconds()
        if sample
        else None,
        "known": seen.demand_known,
        "unknown_since": _time(seen.unknown_since) if seen.unknown_since else None,
        "need": policy.need(usable.value) if usable else None,
        "queue": seen.queue.value if seen.queue else None,
        "held": {"level": held.level.value, "seen": held.seen.value, "since": _time(held.since)}
        if held
        else None,
    }
    proposal = decision.proposals.get(pool)
    failure = decision.failures.get((pool, Stage.STRATEGY))
    alerts, more_alerts = bounded.listed([a for a in seen.alerts if a.until > now])
    return {
        "demand": demand,
        "history": _history(seen.history, now),
        "clocks": clocks.doc(seen.clocks),
        "alerts": [
            {
                "name": a.name,
                "fingerprint": a.fingerprint,
                "starts_at": _time(a.starts_at),
                "matcher": a.matcher,
                "until": _time(a.until),
            }
            for a in alerts
        ],
        "alerts_more": more_alerts,  # firing besides those named: counted, not copied
        "proposal": {
            "lend_target": proposal.lend_target,
            "reason": proposal.reason,
            "evidence": dict(proposal.evidence),
        }
        if proposal
        else None,
        "strategy_failure": str(failure) if failure else None,
    }


def _history(history: model.DemandHistory | None, now: datetime) -> Json | None:
    """The demand history the strategy was shown: its span, its step, how many points it
    holds, how old its end and its newest point are (the newest None when it holds none), and
    how far back it was searched (None: the pool's strategy reads none)."""
    if history is None:
        return None
    shown = history.values[: history.end_index]
    known = [i for i, v in enumerate(shown) if v is not None]
    # A point covers its step: it is known up to its step's end.
    newest = history.start + history.step * (known[-1] + 1) if known else None
    return {
        "from": _time(history.start),
        "until": _time(history.end),
        "span_seconds": (history.end - history.start).total_seconds(),
        "step_seconds": history.step.total_seconds(),
        "points": sum(1 for v in shown if v is not None),
        "age_seconds": (now - history.end).total_seconds(),
        "newest_age_seconds": None if newest is None else (now - newest).total_seconds(),
        "searched_seconds": (now - history.start).total_seconds(),
    }


def _next(name: NodeName, move: model.Action | None, plan: model.PoolPlan) -> list[Json]:
    """What the plan does to the node: its step, the refusals about it by name, and the
    refusals of pool-wide intents it was left out of, each with its own reason; else, for a
    node the rules allow to move, the pool-wide intents of that move that were cut short."""
    out: list[Json] = [_step(s, named=False) for s in plan.steps if s.node == name]
    cut: list[Json] = []
    for r in plan.rejections:
        what = f"{r.intent.origin.value} {r.intent.action.value} of {r.intent.count}"
        reason = dict(r.excluded).get(name)
        if r.node == name:
            out.append(_refusal(r, named=False))
        elif reason is not None:
            text = f"left out of the {what}: {reason.value}"
            out.append({"what": "excluded", "reason": reason.value, "text": text})
        elif r.node is None and r.intent.action is move and not r.excluded:
            text = f"not chosen: the {what} had {r.count} refused ({r.reason.value}: {r.message})"
            cut.append({"what": "not_chosen", "reason": r.reason.value, "text": text})
    return out or cut


def _step(step: model.Step, named: bool = True) -> Json:
    node = f" {step.node}" if named else ""
    return {
        "what": step.action.value,
        "node": str(step.node),
        "reason": step.reason.value,
        "origin": step.intent.origin.value,
        "message": step.message,
        "text": f"{step.action.value}{node} ({step.reason.value}: {step.message})",
    }


def _refusal(r: model.Rejection, named: bool = True) -> Json:
    excluded = audit.excluded_doc(r.excluded)
    about = (f" {r.node}" if named else "") if r.node else f" {r.count}"
    return {
        "what": "refused",
        "action": r.intent.action.value,
        "origin": r.intent.origin.value,
        "node": str(r.node) if r.node else None,
        "count": r.count,
        "reason": r.reason.value,
        "message": r.message,
        "excluded": excluded,
        "text": f"{r.intent.origin.value} {r.intent.action.value}{about} refused "
        f"({r.reason.value}: {r.message})",
    }


def _time(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
