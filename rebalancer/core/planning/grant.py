"""Granting an intent: candidates, then allowance, then steps. The same for every intent, lend or
reclaim, whoever asks for it.

Where it sits: every intent of ``intents`` goes through ``_grant``, which writes its steps and
refusals into the ``_Draft``. A strategy's lend in a pool that lends only to takers is placed on
the nodes a pending job would run on (``core.takers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rebalancer.core import model, takers
from rebalancer.core.model import Action, Intent, Reason
from rebalancer.core.planning.allowance import _allowance, _limits
from rebalancer.core.planning.candidates import _candidates
from rebalancer.core.planning.draft import _Draft, _Node
from rebalancer.core.planning.rooms import _lent_rooms, _room, _to_takers, _why_no_taker
from rebalancer.core.planning.steps import _lend_cost, _preempted, _reclaim_order, _shortfall


def _grant(draft: _Draft, intent: Intent, nodes: Sequence[_Node]) -> None:
    """Decide ``intent`` over the ``nodes`` it is about: the candidates among them, the allowance
    the rules leave, and the steps: the cheapest candidates, up to the allowance. What the
    allowance permits but no candidate can take is refused with the reasons nodes were excluded."""
    draft.intents.append(intent)
    candidates = _candidates(draft.pool, intent, nodes)
    allowance = _allowance(intent, _limits(draft, intent))
    draft.rejections.extend(allowance.refused)
    if intent.action is Action.LEND:
        ordered = sorted(candidates.eligible, key=_lend_cost)
    else:
        ordered = _reclaim_order(candidates.eligible, _preempted(draft), allowance.allowed)
    if _to_takers(draft.pool, intent):
        _lend_to_takers(draft, intent, ordered, allowance.allowed, candidates.excluded)
        return
    chosen = ordered[: allowance.allowed]
    for node in chosen:
        draft.step(intent, node)
    missing = allowance.allowed - len(chosen)
    draft.rejections.extend(_shortfall(draft.pool, intent, missing, candidates.excluded))


def _lend_to_takers(
    draft: _Draft,
    intent: Intent,
    ordered: Sequence[_Node],
    allowed: int,
    excluded: Mapping[model.NodeName, Reason],
) -> None:
    """Lend, of the ``ordered`` candidates, only nodes a pending job would run on, up to
    ``allowed``; jobs that fit on room already lent need none (``core.takers``)."""
    pool = draft.pool
    offered = [_room(pool, node, lent=False) for node in ordered]
    placed = takers.place(pool.takers, _lent_rooms(draft), offered, allowed)
    by_name = {node.name: node for node in ordered}
    for name, job in placed.lend:
        draft.step(intent, by_name[name], taker=job)
        draft.served.add(job)
    draft.served.update(placed.served)
    missing = allowed - len(placed.lend)
    without_candidate = max(0, missing - max(0, len(ordered) - len(placed.lend)))
    draft.rejections.extend(_shortfall(pool, intent, without_candidate, excluded))
    no_taker = missing - without_candidate
    if no_taker > 0:
        note = _why_no_taker(pool, placed)
        draft.rejections.append(
            model.Rejection(intent, Reason.NO_TAKER, note, no_taker, intent.node)
        )
