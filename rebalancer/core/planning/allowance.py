"""Allowance: how many steps an intent may take, each rule refusing what it cuts.

Where it sits: the second of the three stages of ``grant.grant``. The limits are the pool's,
not one node's: pause and freeze, metrics, alerts, capacity (``min_serving``, headroom,
``max_lent_fraction``, what the error budget covers) and the per-tick step limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from rebalancer.core import model, takers
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.draft import Allowance, Draft, Health, Limit, Pool
from rebalancer.core.planning.rooms import as_room, lends_to_takers
from rebalancer.core.policy import Guard


def apply_limits(intent: Intent, limits: Iterable[Limit]) -> Allowance:
    """What every limit, in turn, leaves of ``intent``; each refuses the part it cuts."""
    allowed, refused = intent.count, []
    for limit in limits:
        granted = max(0, min(allowed, limit.cap))
        if granted < allowed:
            cut = allowed - granted
            refused.append(model.Rejection(intent, limit.reason, limit.message, cut, intent.node))
            allowed = granted
        if allowed == 0:
            break  # the rules after this one have nothing left to cut
    return Allowance(allowed, tuple(refused))


def intent_limits(draft: Draft, intent: Intent) -> Iterator[Limit]:
    """The rules that bound ``intent``, in the order their refusals are reported."""
    pool = draft.pool
    paused = _pause_limit(pool, intent)
    if paused is not None:
        yield paused
    if intent.action is Action.LEND:
        blocked = _lend_blocked(pool)
        if blocked is not None:
            yield blocked
        yield _lend_room(draft)
    if intent.origin is Origin.STRATEGY:
        per_tick = pool.policy.step_budget(pool.size)
        why = f"at most {per_tick} strategy changes per tick"
        yield Limit(_per_tick_cap(draft, intent), Reason.RATE_LIMIT, why)


def _per_tick_cap(draft: Draft, intent: Intent) -> int:
    """The strategy's moves left this tick. A gang is lent whole in one tick or not at all, so
    where lends go to takers, the first move of a tick may be as large as the largest waiting
    gang a node of the pool would accept (its pods: at least the nodes it needs): a job of four
    is never kept waiting for ever by a limit of two a tick. The capacity rules still bound
    it."""
    left = draft.per_tick_left
    pool = draft.pool
    if not lends_to_takers(pool, intent) or left < pool.policy.step_budget(pool.size):
        return left
    rooms = [as_room(pool, node, lent=False) for node in draft.untouched(Phase.SERVING)]

    def welcome(pod: model.PendingPod) -> bool:
        return any(takers.accepts(pod, r.labels, r.taints) is None for r in rooms)

    gangs = [len(g.pods) for g in pool.takers if all(welcome(p) for p in g.pods)]
    return max(left, max(gangs, default=0))


def _pause_limit(pool: Pool, intent: Intent) -> Limit | None:
    """A freeze refuses everything. A pause refuses lending and the moves that are not about
    keeping inference served: a safety reclaim, or one an operator asked for on a node,
    still happens."""
    if pool.frozen:
        why = "the pool is frozen: nothing moves, not even safety reclaims"
        return Limit(0, Reason.FROZEN, why)
    protects = intent.action is Action.RECLAIM and intent.origin in (
        Origin.SAFETY,
        Origin.OPERATOR,
    )
    if pool.paused and not protects:
        return Limit(0, Reason.PAUSED, "the pool is paused")
    return None


def _lend_blocked(pool: Pool) -> Limit | None:
    """The rules under which nothing is lent at all: a node of the pool not as the controller
    left it, demand unknown, a fall not believed yet, requests queueing."""
    demand, policy = pool.demand, pool.policy
    changed = [n for n in pool.by_phase[Phase.LENT] if n.problem is not None]
    if changed:
        # Until it is back, the node is away, and what else another writer did to the pool is
        # not known: lending waits for every node to read as the controller wrote it.
        first = changed[0]
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return Limit(
            0,
            first.problem or Reason.STATE_UNREADABLE,
            f"no lending while node {first.name}{more} is taken back ({first.problem})",
        )
    if demand.health is not Health.FRESH:
        stale = demand.health is Health.STALE
        reason = Reason.METRICS_STALE if stale else Reason.METRICS_MISSING
        return Limit(0, reason, f"no lending while demand is unknown ({demand.note})")
    problems = pool.clocks.problems()
    if problems:
        # The ages of samples and the times written on nodes rest on the clocks: a clock that
        # cannot be trusted fails toward inference, as unknown demand does. Reclaims go on.
        # After the metrics rule: a Prometheus that is down is not a clock's fault (its
        # ``time()`` fails with the rest, and the refusal above names the clocks too).
        return Limit(0, Reason.CLOCK_SKEW, f"no lending: {'; '.join(problems)}")
    if demand.held is not None:
        held = demand.held
        return Limit(
            0,
            Reason.DEMAND_DROP_HELD,
            f"demand fell from {held.level.value:.4g} to {held.seen.value:.4g} "
            f"{policy.unit.symbol} faster than "
            f"traffic falls; not believed until it lasts {policy.drop_hold} "
            f"(since {held.since.isoformat()})",
        )
    if pool.alerts:
        return Limit(0, Reason.ALERT_FIRING, f"no lending while {alert_names(pool.alerts)} fires")
    queue = demand.queue
    if Guard.QUEUE_LIMIT in policy.guards and queue is not None and queue > policy.queue_limit:
        return Limit(
            0,
            Reason.QUEUE_BUILDING,
            f"{queue:.0f} requests wait (limit {policy.queue_limit:.0f}): serving is short already",
        )
    return None


def alert_names(alerts: Sequence[model.FiringAlert]) -> str:
    shown = ", ".join(f"alert {a.name} ({a.matcher})" for a in alerts[:3])
    return shown + (f" and {len(alerts) - 3} more" if len(alerts) > 3 else "")


def _lend_room(draft: Draft) -> Limit:
    """How many more nodes may be lent, and the rule that sets that number.

    Only warm serving nodes are capacity to lend from: a node still reclaiming or warming up
    will serve soon but does not now, and lending against it is how a rise breaches (the
    node lent in its place leaves serving short until the returning one is warm)."""
    pool, policy = draft.pool, draft.pool.policy
    size, serving, need = pool.size, draft.serving_count, pool.demand.need
    limits = [
        Limit(serving - policy.min_serving, Reason.MIN_SERVING, f"{policy.min_serving} must serve")
    ]
    if Guard.MAX_LENT_FRACTION in policy.guards:
        most = math.floor(policy.max_lent_fraction * size + 1e-9)
        why = f"at most {policy.max_lent_fraction:.0%} of {size} nodes may be lent"
        limits.append(Limit(most - draft.lent_count, Reason.MAX_FRACTION, why))
    if Guard.HEADROOM in policy.guards and need is not None:
        why = f"demand needs {need} of {size} nodes with {policy.headroom:.0%} headroom"
        limits.append(Limit(serving - need, Reason.HEADROOM, why))
    if pool.budget_short:
        limits.append(_covered_room(pool, serving))
    tightest = min(limits, key=lambda limit: limit.cap)
    if tightest.reason in (Reason.MIN_SERVING, Reason.HEADROOM):
        return _blame_cold_nodes(pool, tightest)
    return tightest


def covered_keep(pool: Pool) -> int | None:
    """The serving nodes what the pool's history covers needs, the demand sample raising the
    peaks; None: no cover, or none of its windows covers anything."""
    cover = pool.cover
    return None if cover is None else cover.keep(pool.policy.need, pool.demand.value)


def _covered_room(pool: Pool, serving: int) -> Limit:
    """With the error budget short, what may be lent leaves serving what the pool's history
    covers; with no cover, nothing."""
    budget, cover, rps = pool.budget, pool.cover, pool.demand.value
    assert budget is not None, "only a pool with a budget is short of it"
    keep = covered_keep(pool)
    if cover is None or keep is None:
        why = (
            f"the error budget cannot cover another loan ({budget.spent_text}, a loan may cost "
            f"{pool.policy.loan_risk_minutes}) and the pool's history covers none: no lending "
            "until minutes leave the window"
        )
        return Limit(0, Reason.BUDGET_SPENT, why)
    why = (
        f"the error budget cannot pay for another loan ({budget.spent_text}): only covered "
        f"loans, {keep} serving nodes carry {cover.text(rps, pool.policy.unit)}"
    )
    return Limit(serving - keep, Reason.BUDGET_SPENT, why)


def _blame_cold_nodes(pool: Pool, limit: Limit) -> Limit:
    """When serving capacity limits lending, name the serving nodes that carry no load: not
    ready, or on their way back and not warm yet."""
    cold = []
    if pool.not_ready:
        cold.append(f"{pool.not_ready} serving nodes are not ready")
    returning = pool.count(Phase.RECLAIMING) + len(pool.warming)
    if returning:
        cold.append(f"{returning} are on their way back and not warm yet")
    if not cold:
        return limit
    reason = Reason.NOT_READY if pool.not_ready else Reason.WARMING
    return Limit(limit.cap, reason, f"{'; '.join(cold)}, so they carry no load; {limit.message}")
