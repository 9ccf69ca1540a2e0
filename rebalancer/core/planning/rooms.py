"""The room pending pods would find: nodes lent, being lent or lent this tick, as ``core.takers``
sees them.

Where it sits: read by ``grant`` when a strategy's lend goes to takers, by the per-tick cap of
``allowance`` (a waiting gang may be lent whole in one tick), by ``verdicts``, and at the end of
``plan_pool``, which hands the jobs a pool has room for (``PoolPlan.served``) to the pools
planned after it.
"""

from __future__ import annotations

from rebalancer.core import model, nodestate, takers
from rebalancer.core.model import Action, Intent, Origin
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.draft import Draft, Node, Pool


def lends_to_takers(pool: Pool, intent: Intent) -> bool:
    """Whether ``intent`` lends only to pending jobs: the strategy's lends in a pool that says
    so. An operator's ``lend=now`` is the operator's call, as it is for the window."""
    return (
        pool.policy.lend_only_to_takers
        and intent.action is Action.LEND
        and intent.origin is Origin.STRATEGY
    )


def room_lent_already(draft: Draft) -> None:
    """Jobs that fit on what the pool holds lent once this tick's steps are taken are the
    pool's (``PoolPlan.served``), whether or not it lends more now: a pool that holds, is
    paused or plans safety only still has the room it lent for a job the scheduler has not
    placed yet, and no pool planned after it lends that job a second node. Counting a job
    served that will not land here costs at most a loan not made: the side of inference.
    With no job waiting there is nothing to place: the rooms are not worked out, every tick."""
    if not draft.pool.takers:
        return
    placed = takers.place(draft.pool.takers, lent_rooms(draft), (), 0)
    draft.served.update(placed.served)


def why_no_taker(pool: Pool, placed: takers.Placement) -> str:
    if not pool.takers:
        return "no pending pod tolerates the lend taint: a lent node would run nothing"
    waiting = list(placed.waiting.items())
    if not waiting:
        return f"every pending job ({len(pool.takers)}) fits on nodes lent already"
    shown = "; ".join(f"job {job}: {why}" for job, why in waiting[:3])
    more = f"; and {len(waiting) - 3} more" if len(waiting) > 3 else ""
    return f"no pending job would run on another node: {shown}{more}"


def lent_rooms(draft: Draft) -> list[takers.Room]:
    """The room pending pods may find without a new loan: nodes lent or being lent (not
    taken back this tick), then those lent this tick, as they will be once lent."""
    pool = draft.pool
    stepped = {s.node: s.action for s in draft.steps}
    rooms = [
        as_room(pool, node, lent=node.phase is Phase.LENT)
        for node in (*pool.by_phase[Phase.LENT], *pool.by_phase[Phase.LENDING])
        if stepped.get(node.name) is not Action.RECLAIM
    ]
    by_name = {n.name: n for n in pool.by_phase[Phase.SERVING]}
    rooms += [
        as_room(pool, by_name[s.node], lent=False)
        for s in draft.steps
        if s.action is Action.LEND and s.node in by_name
    ]
    return rooms


def as_room(pool: Pool, node: Node, lent: bool) -> takers.Room:
    """``node`` as a pending pod would find it: as it is when ``lent``, else once lent."""
    view, spec = node.view, pool.policy.lend_spec
    labels, taints = view.labels, view.taints
    if not lent:
        change = nodestate.NodeChange(nodestate.lent_taints(taints, spec), spec.labels, {})
        after = nodestate.apply(view, change)
        labels, taints = after.labels, after.taints
    free = None
    if view.allocatable is not None:
        free = view.allocatable - sum((p.requests for p in view.pods), model.NOTHING)
    return takers.Room(view.name, labels, taints, free)
