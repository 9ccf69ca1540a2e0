"""One pool's plan, and the proposals it may be planned with.

Where it sits: ``core.tick.plan_tick`` checks each strategy's answer with ``invalid_proposal``,
replaces a failed one with ``safety_only``, and calls ``plan_pool`` for each pool in turn:
observe, then every intent in order of precedence, then the room the pool holds for takers.
"""

from __future__ import annotations

from datetime import datetime

from rebalancer.core import model, nodestate
from rebalancer.core.planning.draft import Draft
from rebalancer.core.planning.intents import (
    gang_intent,
    operator_intents,
    safety_intents,
    state_intents,
    strategy_intent,
    unused_loan_intent,
)
from rebalancer.core.planning.reading import read_pool
from rebalancer.core.planning.rooms import room_lent_already
from rebalancer.core.policy import PoolPolicy


def safety_only(lent: int, why: str) -> model.Proposal:
    """What a pool is planned with when its strategy failed: hold what is lent. No new loan;
    every safety rule (demand above serving, queue, metrics lost, windows, operators) still
    reclaims."""
    return model.Proposal(lend_target=lent, reason=f"safety only: {why}")


def invalid_proposal(proposal: object, size: int) -> str | None:
    """Why ``proposal`` cannot be planned with (a strategy's answer is checked, never trusted),
    or None when it can."""
    if not isinstance(proposal, model.Proposal):
        return f"answered {type(proposal).__name__}, not a Proposal"
    target = proposal.lend_target
    if isinstance(target, bool) or not isinstance(target, int):
        return f"lend_target {target!r} is not a whole number"
    if not 0 <= target <= size:
        return f"lend_target {target} is outside 0..{size}, the pool's size"
    if not isinstance(proposal.reason, str):
        return f"reason {proposal.reason!r} is not text"
    return None


def plan_pool(
    now: datetime,
    name: model.PoolName,
    pool: model.PoolSnapshot,
    proposal: model.Proposal | None,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool = False,
    frozen: bool = False,
    served: frozenset[str] = frozenset(),
) -> model.PoolPlan:
    """One pool's plan; ``served``: jobs other pools have room for (``core.takers``)."""
    draft = Draft(read_pool(now, name, pool, policy, keys, paused, frozen, served))
    # Every intent is still formed under a pause or a freeze, and refused: nothing is silent.
    operator_intents(draft)
    state_intents(draft)
    safety_intents(draft)
    strategy_intent(draft, proposal)
    unused_loan_intent(draft)
    gang_intent(draft)
    room_lent_already(draft)
    return draft.finish(proposal)
