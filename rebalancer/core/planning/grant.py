"""Granting an intent: candidates, then allowance, then steps. The same for every intent, lend or
reclaim, whoever asks for it.

Where it sits: every intent of ``intents`` goes through ``grant``, which writes its steps and
refusals into the ``Draft``. A strategy's lend in a pool that lends only to takers is placed on
the nodes a pending job would run on (``core.takers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rebalancer.core import model, takers
from rebalancer.core.model import Action, Intent, Reason
from rebalancer.core.planning.allowance import apply_limits, intent_limits
from rebalancer.core.planning.candidates import candidates_for
from rebalancer.core.planning.draft import Draft, Node
from rebalancer.core.planning.rooms import as_room, lends_to_takers, lent_rooms, why_no_taker
from rebalancer.core.planning.steps import lend_cost, preempted_jobs, reclaim_order, shortfall


def grant(draft: Draft, intent: Intent, nodes: Sequence[Node]) -> None:
    """Decide ``intent`` over the ``nodes`` it is about: the candidates among them, the allowance
    the rules leave, and the steps: the cheapest candidates, up to the allowance. What the
    allowance permits but no candidate can take is refused with the reasons nodes were excluded."""
    draft.intents.append(intent)
    candidates = candidates_for(draft.pool, intent, nodes)
    allowance = apply_limits(intent, intent_limits(draft, intent))
    draft.rejections.extend(allowance.refused)
    if intent.action is Action.LEND:
        ordered = sorted(candidates.eligible, key=lend_cost)
    else:
        preempted = preempted_jobs(draft)
        ordered = reclaim_order(candidates.eligible, preempted, allowance.allowed, draft.pool.now)
    if lends_to_takers(draft.pool, intent):
        _lend_to_takers(draft, intent, ordered, allowance.allowed, candidates.excluded)
        return
    chosen = ordered[: allowance.allowed]
    for node in chosen:
        draft.step(intent, node)
    missing = allowance.allowed - len(chosen)
    draft.rejections.extend(shortfall(draft.pool, intent, missing, candidates.excluded))


def _lend_to_takers(
    draft: Draft,
    intent: Intent,
    ordered: Sequence[Node],
    allowed: int,
    excluded: Mapping[model.NodeName, Reason],
) -> None:
    """Lend, of the ``ordered`` candidates, only nodes a pending job would run on, up to
    ``allowed``; jobs that fit on room already lent need none (``core.takers``)."""
    pool = draft.pool
    offered = [as_room(pool, node, lent=False) for node in ordered]
    placed = takers.place(pool.takers, lent_rooms(draft), offered, allowed)
    by_name = {node.name: node for node in ordered}
    for name, job in placed.lend:
        draft.step(intent, by_name[name], taker=job)
        draft.served.add(job)
    draft.served.update(placed.served)
    missing = allowed - len(placed.lend)
    without_candidate = max(0, missing - max(0, len(ordered) - len(placed.lend)))
    draft.rejections.extend(shortfall(pool, intent, without_candidate, excluded))
    no_taker = missing - without_candidate
    if no_taker > 0:
        note = why_no_taker(pool, placed)
        draft.rejections.append(
            model.Rejection(intent, Reason.NO_TAKER, note, no_taker, intent.node)
        )
