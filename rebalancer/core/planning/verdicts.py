"""Explain: every rule that holds one node, judged as the planner judges it.

Where it sits: ``core.explain`` (``rebalancer explain NODE``) reads ``node_rules``. It evaluates
the planner's own rule tables, limits and takers, every one rather than the first that refuses,
so what an operator reads is what the planner would do.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from rebalancer.core import model, nodestate, overrides, takers
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.allowance import intent_limits
from rebalancer.core.planning.candidates import LEND_RULES, RECLAIM_RULES
from rebalancer.core.planning.draft import Draft, Node, Pool
from rebalancer.core.planning.intents import PROBLEM_NOTES, operator_reclaim
from rebalancer.core.planning.reading import read_pool
from rebalancer.core.planning.rooms import as_room, lends_to_takers, lent_rooms, why_no_taker
from rebalancer.core.planning.steps import LEND_EXCLUSIONS
from rebalancer.core.policy import PoolPolicy


class Verdict(StrEnum):
    ASKS = "asks"  # the rule calls for the move (a closed window, an operator's reclaim=now)
    ALLOWS = "allows"
    REFUSES = "refuses"
    SKIPPED = "skipped"  # the rule does not hold this move (an operator's lend=now skips it)


@dataclass(frozen=True, slots=True)
class RuleCheck:
    rule: Reason
    verdict: Verdict
    note: str


@dataclass(frozen=True, slots=True)
class NodeRules:
    """The rules on one node's next move: lending it (a serving node) or taking it back (a lent
    one), each judged on its own, as if it were the tick's first move; ``move`` None when no
    rule applies (``note`` says why)."""

    move: Action | None
    checks: tuple[RuleCheck, ...] = ()
    note: str = ""


def node_rules(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    node: model.NodeName,
    paused: bool = False,
    frozen: bool = False,
) -> NodeRules:
    """What ``rebalancer explain NODE`` lists: the same rule tables, limits and takers the
    planner uses (``LEND_RULES``, ``RECLAIM_RULES``, ``intent_limits``), every one evaluated rather
    than the first that refuses. A node of ``snapshot`` only."""
    pool = read_pool(now, name, snapshot, policy, keys, paused, frozen)
    found = next((n for nodes in pool.by_phase.values() for n in nodes if n.name == node), None)
    if found is None:
        return NodeRules(None, note=f"not a node of pool {name}")
    if found.phase is Phase.SERVING:
        return NodeRules(Action.LEND, tuple(_lend_checks(pool, found)))
    if found.phase is Phase.LENT:
        return NodeRules(Action.RECLAIM, tuple(_reclaim_checks(pool, found)))
    return NodeRules(
        None,
        note=f"{found.phase.value}: in flight; the next tick carries it on (a lend in flight is "
        "rolled back) before any rule applies to it",
    )


_LEND_PASSES = {
    Reason.BAD_STATE: "its state keys can be read",
    Reason.BAD_OVERRIDE: "its overrides can be read",
    Reason.NODE_PAUSED: "not paused",
    Reason.LEND_NEVER: "not marked lend=never",
    Reason.OPERATOR_RECLAIM_NOW: "not marked reclaim=now",
    Reason.NOT_READY: "Ready",
    Reason.NOT_IDLE: "idle: no inference or other pods",
    Reason.OUTSIDE_WINDOW: "inside its window",
    Reason.COOLDOWN: "past its cooldown",
    Reason.WARMING: "not warming up",
}


_RECLAIM_NOTES = {
    Reason.IN_FLIGHT: ("not being lent", "still being lent"),
    Reason.NODE_PAUSED: ("not paused", "paused by an operator: nothing takes it back"),
    Reason.OPERATOR_LEND_NOW: ("not marked lend=now", "kept lent by lend=now"),
    Reason.MIN_LOAN_TIME: ("lent for its minimum loan", "lent for less than min_loan"),
}


def _lend_checks(pool: Pool, node: Node) -> Iterator[RuleCheck]:
    operator = node.overrides.lend is overrides.LendMode.NOW
    for reason, refuses, strategy_only in LEND_RULES:
        if strategy_only and operator:
            yield RuleCheck(reason, Verdict.SKIPPED, "lend=now skips it")
        elif refuses(pool, node):
            yield RuleCheck(reason, Verdict.REFUSES, LEND_EXCLUSIONS[reason])
        else:
            yield RuleCheck(reason, Verdict.ALLOWS, _LEND_PASSES[reason])
    if operator:
        why = "an operator asked to lend this node now"
        intent = Intent(pool.name, Action.LEND, 1, Origin.OPERATOR, Reason.OPERATOR_LEND_NOW, why)
    else:
        intent = Intent(pool.name, Action.LEND, 1, Origin.STRATEGY, Reason.STRATEGY, "")
    draft = Draft(pool)
    yield from _limit_checks(draft, intent)
    if lends_to_takers(pool, intent):
        placed = takers.place(pool.takers, lent_rooms(draft), [as_room(pool, node, False)], 1)
        if placed.lend:
            yield RuleCheck(Reason.NO_TAKER, Verdict.ALLOWS, f"job {placed.lend[0][1]} would run")
        else:
            yield RuleCheck(Reason.NO_TAKER, Verdict.REFUSES, why_no_taker(pool, placed))


def _reclaim_checks(pool: Pool, node: Node) -> Iterator[RuleCheck]:
    if node.problem is not None:
        yield RuleCheck(node.problem, Verdict.ASKS, PROBLEM_NOTES[node.problem])
    asked = operator_reclaim(pool, node)
    if asked is not None:
        yield RuleCheck(asked.reason, Verdict.ASKS, asked.message)
    elif pool.is_open(node):
        yield RuleCheck(
            Reason.WINDOW_CLOSED, Verdict.ALLOWS, "its window is open: it may stay lent"
        )
    for reason, refuses, strategy_only in RECLAIM_RULES:
        passed, refused = _RECLAIM_NOTES[reason]
        if refuses(pool, node):
            who = " (holds against the strategy only)" if strategy_only else ""
            yield RuleCheck(reason, Verdict.REFUSES, refused + who)
        else:
            yield RuleCheck(reason, Verdict.ALLOWS, passed)
    intent = Intent(pool.name, Action.RECLAIM, 1, Origin.STRATEGY, Reason.STRATEGY, "")
    yield from _limit_checks(Draft(pool), intent)


def _limit_checks(draft: Draft, intent: Intent) -> Iterator[RuleCheck]:
    """Each pool rule that bounds ``intent``, and what it leaves (one more step, or none)."""
    for limit in intent_limits(draft, intent):
        if limit.cap >= 1:
            yield RuleCheck(limit.reason, Verdict.ALLOWS, f"{limit.message}: room for {limit.cap}")
        else:
            yield RuleCheck(limit.reason, Verdict.REFUSES, limit.message)
