"""Candidates: which nodes could take an intent's steps, and the Reason each other one is excluded.

Where it sits: the first of the three stages of ``grant.grant``. The rule tables here are the
ones ``verdicts.node_rules`` evaluates in full for ``rebalancer explain``: one table, two readers,
so explain cannot drift from what the planner does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

from rebalancer.core import overrides
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.draft import Candidates, Node, Pool


def candidates_for(pool: Pool, intent: Intent, nodes: Sequence[Node]) -> Candidates:
    """Sort ``nodes`` into those that may take ``intent``'s steps and those excluded, and why."""
    why_not = _why_not_lend if intent.action is Action.LEND else _why_not_reclaim
    strategy = intent.origin is Origin.STRATEGY
    eligible, excluded = [], {}
    for node in nodes:
        reason = why_not(pool, node, strategy)
        if reason is None:
            eligible.append(node)
        else:
            excluded[node.name] = reason
    return Candidates(tuple(eligible), excluded)


# The rules a node is held to, in the order they are judged: (reason, refuses, the strategy's
# only). The first that refuses is the reason a node is excluded; ``verdicts.node_rules`` shows
# them all.
_NodeRule = tuple[Reason, Callable[["Pool", "Node"], bool], bool]


LEND_RULES: tuple[_NodeRule, ...] = (
    # A serving node with a state key another writer garbled: fail closed, as for an override.
    (Reason.BAD_STATE, lambda pool, node: bool(node.state.drift), False),
    (Reason.BAD_OVERRIDE, lambda pool, node: node.unreadable, False),
    (Reason.NODE_PAUSED, lambda pool, node: node.overrides.paused, False),
    (Reason.LEND_NEVER, lambda pool, node: node.overrides.lend is overrides.LendMode.NEVER, False),
    (Reason.OPERATOR_RECLAIM_NOW, lambda pool, node: node.overrides.reclaim_now, False),
    (Reason.NOT_READY, lambda pool, node: not node.view.ready, False),
    (Reason.NOT_IDLE, lambda pool, node: not node.view.idle, False),
    # An operator's lend=now skips the window, the cooldown and the warm-up; nothing else.
    (Reason.OUTSIDE_WINDOW, lambda pool, node: not pool.open_for_a_loan(node), True),
    (Reason.COOLDOWN, lambda pool, node: _within(pool, node, pool.policy.cooldown), True),
    # On its way back: lending it again is churn.
    (Reason.WARMING, lambda pool, node: node.name in pool.warming, True),
)


RECLAIM_RULES: tuple[_NodeRule, ...] = (
    # The actuator finishes or rolls back a lend in flight first.
    (Reason.IN_FLIGHT, lambda pool, node: node.phase is Phase.LENDING, False),
    (Reason.NODE_PAUSED, lambda pool, node: node.overrides.paused, False),
    # The operator outranks the strategy: taking the node back would only have it lent again
    # (lend=now skips the cooldown) as soon as it returns, a loop that preempts the training
    # on it every few minutes.
    (
        Reason.OPERATOR_LEND_NOW,
        lambda pool, node: node.overrides.lend is overrides.LendMode.NOW,
        True,
    ),
    # A since ahead of the API server's clock holds no reclaim: inference comes first.
    (
        Reason.MIN_LOAN_TIME,
        lambda pool, node: (
            node.name not in pool.future and _within(pool, node, pool.policy.min_loan)
        ),
        True,
    ),
)


def _within(pool: Pool, node: Node, span: timedelta) -> bool:
    """Whether the node's phase began less than ``span`` ago."""
    since = node.state.since
    return since is not None and pool.now - since < span


# The rules about one node, as against those about the pool (its limits): ``core.explain``.
NODE_RULES = frozenset(reason for reason, _, _ in LEND_RULES + RECLAIM_RULES)


def _first_refusal(
    rules: Sequence[_NodeRule], pool: Pool, node: Node, strategy: bool
) -> Reason | None:
    for reason, refuses, strategy_only in rules:
        if strategy_only and not strategy:
            return None  # the strategy's rules come last
        if refuses(pool, node):
            return reason
    return None


def _why_not_lend(pool: Pool, node: Node, strategy: bool) -> Reason | None:
    """Why ``node`` may not be lent now, or None when it may (``LEND_RULES``)."""
    return _first_refusal(LEND_RULES, pool, node, strategy)


def _why_not_reclaim(pool: Pool, node: Node, strategy: bool) -> Reason | None:
    """Why ``node`` may not be reclaimed now, or None when it may (``RECLAIM_RULES``). Only
    the strategy is held to ``min_loan`` and to an operator's ``lend=now``."""
    return _first_refusal(RECLAIM_RULES, pool, node, strategy)
