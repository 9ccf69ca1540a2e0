"""Intents, in order of precedence: operators, then the nodes' own state, then safety, then the
strategy.

Where it sits: ``plan_pool`` forms them in this order and hands each to ``grant.grant``, so an
operator's move is decided before a safety reclaim, and both before the strategy's. A reclaim
that protects inference is the safety rules' own; a strategy cannot ask for it away. Two follow
the strategy's: loans no job uses are given back, and a gang losing a node brings back the rest.
"""

from __future__ import annotations

from datetime import timedelta

from rebalancer.core import model, overrides, takers
from rebalancer.core.model import Action, Intent, Origin, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.allowance import alert_names, covered_keep
from rebalancer.core.planning.draft import Draft, Health, Node, Pool
from rebalancer.core.planning.grant import grant
from rebalancer.core.planning.rooms import lent_rooms
from rebalancer.core.planning.steps import jobs_on, preempted_jobs
from rebalancer.core.policy import Guard


def operator_intents(draft: Draft) -> None:
    """Per-node overrides and window edges: each is an intent of its own, about one node."""
    pool = draft.pool
    closing = pool.window_open and not pool.policy.window.is_open(pool.now + pool.notice)
    for node in draft.untouched(Phase.LENT):
        quiet = pool.window_open and not closing and not node.unreadable
        if node.overrides is overrides.NONE and quiet:
            continue  # the common case, decided without looking further
        intent = operator_reclaim(pool, node)
        if intent is not None:
            grant(draft, intent, [node])
    for node in draft.untouched(Phase.SERVING):
        if node.overrides.lend is overrides.LendMode.NOW and not node.unreadable:
            reason, why = Reason.OPERATOR_LEND_NOW, "an operator asked to lend this node now"
            intent = Intent(pool.name, Action.LEND, 1, Origin.OPERATOR, reason, why, node=node.name)
            grant(draft, intent, [node])


def operator_reclaim(pool: Pool, node: Node) -> Intent | None:
    """The intent to take back a lent node its overrides or its window no longer allow lent."""
    ov = node.overrides
    if ov.reclaim_now or ov.lend is overrides.LendMode.NEVER:
        reason = Reason.OPERATOR_RECLAIM_NOW if ov.reclaim_now else Reason.OPERATOR_NEVER
        origin, why = Origin.OPERATOR, "an operator asked for it"
    elif node.unreadable:
        origin, reason = Origin.OPERATOR, Reason.BAD_OVERRIDE_RECLAIM
        why = "an override on the node cannot be read; it may have meant to keep it serving"
    elif ov.lend is not overrides.LendMode.NOW and not pool.is_open(node):
        origin, reason = Origin.SCHEDULE, Reason.WINDOW_CLOSED
        why = f"window {node.window or pool.policy.window}"
    elif ov.lend is not overrides.LendMode.NOW and not node.state.noticed and pool.notice:
        window = node.window or pool.policy.window
        if window.is_open(pool.now + pool.notice):
            return None
        # Known ahead: the pods are told now, so that they are gone when the window closes.
        why = f"window {window} closes within the notice"
        return Intent(
            pool.name,
            Action.RECLAIM,
            1,
            Origin.SCHEDULE,
            Reason.WINDOW_CLOSING,
            why,
            node=node.name,
            notice=pool.notice,
        )
    else:
        return None
    return Intent(pool.name, Action.RECLAIM, 1, origin, reason, why, node=node.name)


PROBLEM_NOTES = {
    Reason.STATE_UNREADABLE: "its state cannot be read: it is taken back from the pool's "
    "specification, so that it serves again",
    Reason.STATE_UNVERIFIED: "its state is not signed by the controller for this node: it is "
    "taken back within what the pool's specification confirms, never as the state says",
    Reason.STATE_LABEL_LOST: "another writer removed its state label: it is taken back from "
    "its original before it can be mistaken for a serving node",
    Reason.LENT_TAINT_LOST: "another writer removed its lent taint: pods that do not tolerate "
    "it may land, so it is taken back",
    Reason.FOREIGN_POD: "a pod that is neither inference, a DaemonSet's, nor borrowed landed "
    "on it: it is taken back",
    Reason.ORPHANED: "no configured pool selects it, yet it is lent: it is taken back from its "
    "original",
}


def state_intents(draft: Draft) -> None:
    """Lent nodes another writer changed, or that no pool selects now: each is taken back at
    once, as a safety reclaim of its own. The controller does not keep a node lent whose state
    it cannot vouch for (docs/design/other-writers.md); an operator's pause still holds it."""
    pool = draft.pool
    for node in draft.untouched(Phase.LENT):
        if node.problem is None:
            continue
        why = PROBLEM_NOTES[node.problem]
        intent = Intent(
            pool.name, Action.RECLAIM, 1, Origin.SAFETY, node.problem, why, node=node.name
        )
        grant(draft, intent, [node])


def safety_intents(draft: Draft) -> None:
    """Reclaims that keep inference served: everything lent once demand is lost, else what
    demand above serving and a queue beyond its limit call for."""
    demand, policy = draft.pool.demand, draft.pool.policy
    if demand.health is Health.LOST:
        count = draft.pool.count(Phase.LENT) - draft.reclaims
        why = f"demand is unknown ({demand.note}): inference comes first"
        _safety_reclaim(draft, count, Reason.METRICS_LOST, why)
        return
    if demand.need is not None and Guard.DEMAND_ABOVE_SERVING in policy.guards:
        _reclaim_for_demand(draft, demand.need)
    if policy.queue_reclaims and Guard.QUEUE_LIMIT in policy.guards:
        _reclaim_for_queue(draft)
    _reclaim_for_alerts(draft)
    if draft.pool.budget_short:
        _reclaim_for_budget(draft)


def _reclaim_for_demand(draft: Draft, need: int) -> None:
    # Nodes already on their way back count: they will serve again.
    covered = draft.serving_count + draft.returning
    why = f"demand needs {need} serving nodes, {covered} serve or are returning"
    _safety_reclaim(draft, min(need - covered, draft.lent_count), Reason.DEMAND_ABOVE_SERVING, why)


def _reclaim_for_budget(draft: Draft) -> None:
    """The error budget cannot pay for another loan's worst case. Demand above what serves
    now is an episode under way: every loan comes back, so that it ends within one return time
    (no more than the budget had left when it could last pay for a whole one). Otherwise the
    loans the pool's history does not cover come back (docs/design/budget.md)."""
    pool = draft.pool
    budget, cover, rps = pool.budget, pool.cover, pool.demand.value
    assert budget is not None, "only a pool with a budget is short of it"
    unit = pool.policy.unit
    carried = pool.policy.rps_per_node * draft.serving_count
    if rps is not None and rps > carried + 1e-9:
        why = (
            f"demand {rps:.4g} {unit.symbol} is above what {draft.serving_count} warm nodes "
            f"carry and the error budget cannot pay for a longer episode ({budget.spent_text}): "
            "every loan comes back"
        )
        _safety_reclaim(draft, draft.lent_count, Reason.BUDGET_EXPOSED, why)
        return
    keep = covered_keep(pool)
    if cover is None or keep is None:
        return
    kept = draft.serving_count + draft.returning
    why = (
        f"the error budget cannot pay for another loan ({budget.spent_text}): {keep} serving "
        f"nodes carry {cover.text(rps, unit)}, {kept} serve or are returning"
    )
    _safety_reclaim(draft, min(keep - kept, draft.lent_count), Reason.BUDGET_EXPOSED, why)


def _reclaim_for_queue(draft: Draft) -> None:
    """Requests waiting beyond the limit: serving is short now, whatever the rate says (a rate
    lags, and under-reads a series younger than its window; a queue does not). Take back
    enough nodes to clear the backlog within a minute, counting those already on their way
    back, warming ones included. In tokens per second a waiting request has no size, so the
    queue cannot be counted in nodes: a wave of the pool's per-tick step is kept on its way
    back while requests wait, as for a firing alert."""
    pool, queue, policy = draft.pool, draft.pool.demand.queue, draft.pool.policy
    limit = policy.queue_limit
    if queue is None or queue <= limit or draft.lent_count <= 0:
        return
    backlog = policy.unit.backlog_nodes(queue, policy.rps_per_node)
    if backlog is None:
        backlog = policy.step_budget(pool.size)
        clears = f"a request has no size in {policy.unit.symbol}, so {backlog} nodes come back"
    else:
        clears = f"{backlog} nodes clear them within a minute"
    why = (
        f"{queue:.0f} requests wait (limit {limit:.0f}): {clears}, "
        f"{draft.returning} are on their way back"
    )
    _keep_returning(draft, backlog, Reason.QUEUE_ABOVE_LIMIT, why)


def _reclaim_for_alerts(draft: Draft) -> None:
    """A matched Alertmanager alert fires: inference is short as its rule sees it, whatever
    the samples here say. Stepped as the queue rule is: a wave of the pool's per-tick step
    is kept on its way back while an alert fires, so each wave is warm before the next is
    taken (docs/design/alertmanager.md)."""
    pool = draft.pool
    if not pool.alerts or draft.lent_count <= 0:
        return
    wave = pool.policy.step_budget(pool.size)
    why = (
        f"{alert_names(pool.alerts)} fires: {wave} nodes come back at a time, "
        f"{draft.returning} are on their way back"
    )
    _keep_returning(draft, wave, Reason.ALERT_FIRING, why)


def _keep_returning(draft: Draft, wanted: int, reason: Reason, why: str) -> None:
    """Reclaim until ``wanted`` nodes are on their way back, those returning included."""
    _safety_reclaim(draft, min(wanted - draft.returning, draft.lent_count), reason, why)


def _safety_reclaim(draft: Draft, count: int, reason: Reason, why: str) -> None:
    """Take ``count`` lent nodes back to keep inference served: no churn limit applies."""
    if count > 0:
        intent = Intent(draft.pool.name, Action.RECLAIM, count, Origin.SAFETY, reason, why)
        grant(draft, intent, _reclaimable(draft))


def _reclaimable(draft: Draft) -> list[Node]:
    """What a reclaim of the pool is about: the lent nodes no step has touched, and those still
    being lent, there only to be refused as in flight (``_why_not_reclaim``)."""
    return draft.untouched(Phase.LENT, Phase.LENDING)


def strategy_intent(draft: Draft, proposal: model.Proposal | None) -> None:
    """The strategy's target against the loans the pool means to keep (those under notice are
    on their way back): more lent first withdraws notices, then lends; fewer notices the
    cheapest loans (docs/design/reclaim-notice.md)."""
    if proposal is None:
        return
    delta = proposal.lend_target - draft.kept_count
    if delta > 0:
        delta -= _withdraw(draft, delta, proposal.reason)
    if delta == 0:
        return
    name, why = draft.pool.name, proposal.reason
    if delta > 0:
        intent = Intent(name, Action.LEND, delta, Origin.STRATEGY, Reason.STRATEGY, why)
        # lend=now nodes had their own intent; lend=never ones are candidates only to be
        # refused with their own reason (not "no serving node is left").
        nodes = [
            n
            for n in draft.untouched(Phase.SERVING)
            if n.overrides.lend is not overrides.LendMode.NOW
        ]
    else:
        notice = draft.pool.notice
        intent = Intent(
            name, Action.RECLAIM, -delta, Origin.STRATEGY, Reason.STRATEGY, why, notice=notice
        )
        nodes = [n for n in _reclaimable(draft) if not n.state.noticed]
    grant(draft, intent, nodes)


def _withdraw(draft: Draft, wanted: int, why: str) -> int:
    """Withdraw up to ``wanted`` notices, the latest first (their pods have had the least
    time to act on them); how many. A gang is untold whole, as it was told (``_untold``). Not
    under a pause or a freeze, nor on a paused node: a notice that goes on is the safe side."""
    pool = draft.pool
    if pool.paused or pool.frozen:
        return 0
    taken: list[Node] = []
    for group in _untold(draft):
        if len(taken) + len(group) <= wanted:
            taken += group
    if taken:
        message = f"the strategy wants {len(taken)} more lent ({why}): the notice is withdrawn"
        intent = Intent(
            pool.name,
            Action.WITHDRAW,
            len(taken),
            Origin.STRATEGY,
            Reason.NOTICE_WITHDRAWN,
            message,
        )
        draft.intents.append(intent)
        for node in taken:
            draft.step(intent, node)
    return len(taken)


def _untold(draft: Draft) -> list[list[Node]]:
    """The notices a withdrawal may take, in groups of nodes that share a job, the latest
    notice first: a job told on several nodes saves once, whole, and is untold whole or not at
    all. A group whose job is on a node on its way back (reclaiming, or taken by a step of this
    tick) is not withdrawn: that job is lost, or told, already; nor is one a pod of which has
    acknowledged its notice (it has saved and is stopping: its other pods may be gone already),
    nor one on a paused node."""
    busy = {s.node for s in draft.steps if s.action is Action.RECLAIM}
    lost = {
        job
        for n in [*draft.pool.by_phase[Phase.RECLAIMING], *draft.pool.by_phase[Phase.LENT]]
        if n.phase is Phase.RECLAIMING or n.name in busy
        for job in jobs_on(n)
    }
    groups: list[tuple[set[str], list[Node]]] = []
    for node in draft.noticed():
        jobs = jobs_on(node)
        joined = [g for g in groups if g[0] & jobs]
        merged = (jobs.union(*(g[0] for g in joined)), [n for g in joined for n in g[1]] + [node])
        groups = [g for g in groups if g not in joined] + [merged]
    kept = [
        nodes
        for jobs, nodes in groups
        if not jobs & lost and not any(n.overrides.paused or _acknowledged(n) for n in nodes)
    ]
    return sorted(
        kept, key=lambda nodes: max((n.state.deadline, n.name) for n in nodes), reverse=True
    )


def _acknowledged(node: Node) -> bool:
    """Whether a borrowed pod on the node has acknowledged the node's notice."""
    told = node.state.decision
    return told is not None and any(p.acked == told for p in node.view.borrowed_pods)


def unused_loan_intent(draft: Draft) -> None:
    """In a pool that lends only to takers, a loan is for a job: one that no borrowed pod runs
    on and no pending job would take, ``unused_loan`` after it began (the job finished, was
    deleted, or went elsewhere), harvests nothing and is given back. A strategy's move: held
    to ``min_loan``, an operator's ``lend=now`` and the pause, as any."""
    pool = draft.pool
    grace = pool.policy.unused_loan
    if not pool.policy.lend_only_to_takers:
        return
    used = takers.place(pool.takers, lent_rooms(draft), (), 0).used
    idle = [
        n
        for n in draft.untouched(Phase.LENT)
        if not n.view.borrowed_pods
        and n.name not in used
        and n.state.since is not None
        and pool.now - n.state.since >= grace
    ]
    if idle:
        why = f"lent over {grace} ago, and no job runs on it or waits for it"
        intent = Intent(
            pool.name,
            Action.RECLAIM,
            len(idle),
            Origin.STRATEGY,
            Reason.UNUSED_LOAN,
            why,
            notice=pool.notice,
        )
        grant(draft, intent, idle)


def gang_intent(draft: Draft) -> None:
    """No gang is left half-running: the lent nodes that still run pods of a job that is
    losing pods elsewhere (a step of this tick, or a node on its way back) come back too. The
    job is lost already, so taking its other nodes back costs it nothing more, and frees them
    for inference or for a job that can run whole. As urgent as any reclaim that is not the
    strategy's; a node an operator paused stays as it is.

    With notices (docs/design/reclaim-notice.md): a job told of a reclaim on one node is told
    on all of its nodes, with the same notice (it saves once, whole). A node under notice is
    left to its notice, its pods perhaps saving their part of the job's checkpoint, unless a
    reclaim of this tick takes one of the job's nodes at once: then the job is lost, and its
    noticed nodes are cut short with the others."""
    pool = draft.pool
    if not (draft.steps or pool.noticed or pool.by_phase[Phase.RECLAIMING]):
        return  # the common tick: no node is taken back or told, so no job loses pods
    lost = preempted_jobs(draft, noticed=False)
    cut = {j for n in _taken_at_once(draft) for j in jobs_on(n)}
    _gang(draft, lost, cut, "is losing pods on a node taken back", timedelta(0))
    told = preempted_jobs(draft) - lost
    _gang(draft, told, set(), "is told of a reclaim on another node", draft.pool.notice)


def _taken_at_once(draft: Draft) -> list[Node]:
    """The lent nodes a step of this tick takes back with no notice."""
    now = {s.node for s in draft.steps if s.action is Action.RECLAIM and not s.notice}
    return [n for n in draft.pool.by_phase[Phase.LENT] if n.name in now]


def _gang(draft: Draft, preempted: set[str], cut: set[str], what: str, notice: timedelta) -> None:
    if not preempted:
        return  # the common tick: no node shares a job with nothing (and the scan is per node)
    siblings = [
        n
        for n in draft.untouched(Phase.LENT)
        if jobs_on(n) & preempted and (not n.state.noticed or jobs_on(n) & cut)
    ]
    if not siblings:
        return
    jobs = sorted({j for n in siblings for j in jobs_on(n) & preempted})
    shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    why = f"job {shown} {what}: its other nodes come back with it"
    intent = Intent(
        draft.pool.name,
        Action.RECLAIM,
        len(siblings),
        Origin.SAFETY,
        Reason.GANG_PREEMPTED,
        why,
        notice=notice,
    )
    grant(draft, intent, siblings)
