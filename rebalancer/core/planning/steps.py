"""Steps: which candidates an intent takes, cheapest first, and why what it cannot take is refused.

Where it sits: the last of the three stages of ``grant.grant``. A lend takes the nodes that
cost least to lend; a reclaim takes those that preempt the fewest training jobs
(``core.victims``). What the allowance permits but no candidate can take is refused with the
reasons the other nodes were excluded: nothing is refused silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial

from rebalancer.core import model, victims
from rebalancer.core.model import Action, Intent, Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.draft import Draft, Node, Pool
from rebalancer.core.policy import PoolPolicy


def lend_cost(node: Node) -> tuple[int, str]:
    """Cheapest first: fewest pods, then by name, so that plans are deterministic."""
    return len(node.view.pods), node.name


def reclaim_order(
    nodes: Sequence[Node], preempted: set[str], count: int, now: datetime
) -> list[Node]:
    """The ``count`` nodes a reclaim takes first, cheapest first in what they cost training:
    a job (a gang) is preempted whole as soon as one of its pods goes, so each next node is
    the one that preempts the fewest jobs not preempted already (``preempted``: by this tick's
    earlier steps, or by nodes on their way back), then the cheapest such jobs by
    ``victims``' order at ``now`` (lowest priority, then the least work lost: GPUs times the
    time since the job's last checkpoint), then the fewest pods. The other nodes of a gang
    taken once cost nothing more, and come next."""
    remaining = [(node, frozenset(jobs_on(node))) for node in nodes]
    lost = set(preempted)
    cost = {job.key: rank for rank, job in enumerate(victims.jobs(_borrowed(nodes), now))}
    chosen: list[Node] = []
    while remaining and len(chosen) < count:
        # The prices change only when a node taken preempts a job not lost before: until then
        # the next cheapest is the next in this order (a stable sort: ties as ``min`` breaks).
        ranked = sorted(remaining, key=partial(_price, lost=frozenset(lost), cost=cost))
        for taken in ranked:
            remaining.remove(taken)
            chosen.append(taken[0])
            if len(chosen) == count or not taken[1] <= lost:
                lost |= taken[1]
                break
    return chosen


def _price(
    node: tuple[Node, frozenset[str]], lost: frozenset[str], cost: Mapping[str, int]
) -> tuple[int, list[int], int, str]:
    """What taking ``node`` (with the jobs it runs) back costs when the jobs in ``lost`` are
    lost already: the jobs it preempts besides, the dearest of them first (by their rank in
    ``cost``), its pods."""
    taken, jobs = node
    new = jobs - lost
    return len(new), sorted((cost[j] for j in new), reverse=True), len(taken.view.pods), taken.name


def jobs_on(node: Node) -> set[str]:
    return {victims.job_key(p) for p in node.view.borrowed_pods}


def _borrowed(nodes: Iterable[Node]) -> list[model.PodView]:
    return [p for node in nodes for p in node.view.borrowed_pods]


def preempted_jobs(draft: Draft, *, noticed: bool = True) -> set[str]:
    """The jobs that lose pods this tick or are losing them: those on nodes a step of this
    tick takes back, and those on nodes already on their way back; with ``noticed``, those
    told of a reclaim too (a notice of this tick, or a node under notice)."""
    pool = draft.pool
    back = {
        s.node
        for s in draft.steps
        if s.action is Action.RECLAIM and (noticed or s.notice <= timedelta(0))
    }
    # A set of jobs: a node counted twice (taken back and under notice) adds nothing.
    nodes = [n for n in pool.by_phase[Phase.LENT] if n.name in back] if back else []
    if noticed:
        nodes += pool.noticed
    nodes += pool.by_phase[Phase.RECLAIMING]
    return {job for node in nodes for job in jobs_on(node)}


def shortfall(
    pool: Pool, intent: Intent, missing: int, excluded: Mapping[model.NodeName, Reason]
) -> list[model.Rejection]:
    """Refusals for the ``missing`` steps the allowance permitted but no candidate could take."""
    if missing <= 0:
        return []
    reasons = Counter(excluded.values())
    if intent.action is Action.LEND:
        reason, note = _why_no_lend_candidate(reasons)
        nodes = tuple(excluded.items())
        return [model.Rejection(intent, reason, note, missing, intent.node, nodes)]
    refused = []
    for reason, note in _reclaim_exclusions(pool.policy, intent):
        count = min(missing, reasons[reason])
        if count > 0:
            nodes = tuple((n, r) for n, r in excluded.items() if r is reason)
            refused.append(model.Rejection(intent, reason, note, count, intent.node, nodes))
        missing -= count
    if missing > 0:
        note = "no lent node is left to reclaim"
        refused.append(model.Rejection(intent, Reason.NO_CANDIDATE, note, missing, intent.node))
    return refused


LEND_EXCLUSIONS = {
    Reason.BAD_STATE: "with a state key that cannot be read",
    Reason.BAD_OVERRIDE: "with an override that cannot be read",
    Reason.OPERATOR_RECLAIM_NOW: "marked reclaim=now",
    Reason.NODE_PAUSED: "paused",
    Reason.LEND_NEVER: "marked lend=never",
    Reason.NOT_READY: "not ready",
    Reason.NOT_IDLE: "running inference or other pods",
    Reason.OUTSIDE_WINDOW: "outside their window",
    Reason.COOLDOWN: "in cooldown after a reclaim",
    Reason.WARMING: "warming up after a reclaim",
}


def _why_no_lend_candidate(excluded: Counter[Reason]) -> tuple[Reason, str]:
    """The commonest reason serving nodes were excluded, and a sentence counting them all."""
    if not excluded:
        return Reason.NO_CANDIDATE, "no serving node is left to lend"
    reason = excluded.most_common(1)[0][0]
    parts = ", ".join(f"{count} {LEND_EXCLUSIONS[r]}" for r, count in excluded.most_common())
    return reason, f"not enough idle serving nodes: {parts}"


def _reclaim_exclusions(policy: PoolPolicy, intent: Intent) -> list[tuple[Reason, str]]:
    """Why lent nodes are excluded from a reclaim, in the order a shortfall is blamed on them."""
    # An intent about one node says so: "the node is paused by an operator".
    paused = "the node is paused by an operator" if intent.node else "paused by an operator"
    return [
        (Reason.MIN_LOAN_TIME, f"lent less than {policy.min_loan} ago"),
        (Reason.NODE_PAUSED, paused),
        (Reason.OPERATOR_LEND_NOW, "kept lent by an operator (lend=now)"),
        (Reason.IN_FLIGHT, "still being lent; finished or rolled back first"),
    ]
