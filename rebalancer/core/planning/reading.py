"""Observe: decode every node of a pool once and judge its demand, into a ``Pool``.

Where it sits: the first stage of ``plan_pool`` (and of ``node_rules``, so that explain judges a
node on what the planner saw). A node whose state or overrides cannot be read is decoded as such,
never guessed at; a demand sample is judged fresh, stale or lost here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from rebalancer.core import clocks, model, nodestate, overrides, takers, warmth
from rebalancer.core import demand as demand_module
from rebalancer.core.model import Reason
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning import rereading
from rebalancer.core.planning.draft import PHASES, DecodedNode, Demand, Health, Node, Pool
from rebalancer.core.policy import Guard, PoolPolicy


def read_pool(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    policy: PoolPolicy,
    keys: nodestate.Keys,
    paused: bool,
    frozen: bool,
    served: frozenset[str] = frozenset(),
) -> Pool:
    read = _read_again(name, snapshot, keys, policy)
    if read is None:
        by_phase, findings, unreadable = _read_nodes(now, name, snapshot, keys, policy)
        future = _in_future(now, by_phase, snapshot.clocks, keys)
        not_ready, warming = _serving(by_phase[Phase.SERVING], now, policy.warmup)
    else:
        by_phase, findings, unreadable = read.by_phase, read.findings, read.unreadable
        latest = read.latest  # no node's since after the bound: none is in the future
        ahead = latest is not None and latest > clocks.future_bound(snapshot.clocks, now)
        future = _in_future(now, by_phase, snapshot.clocks, keys) if ahead else {}
        not_ready, warming = read.not_ready, read.warming_at(now, policy.warmup)
    return Pool(
        name=name,
        now=now,
        policy=policy,
        by_phase=by_phase,
        unreadable=unreadable,
        not_ready=not_ready,
        warming=warming,
        demand=_judge_demand(now, snapshot, policy),
        budget=snapshot.budget,
        cover=snapshot.cover,
        findings=findings + tuple(future.values()),
        window_open=policy.window.is_open(now),
        paused=paused,
        frozen=frozen,
        takers=tuple(g for g in takers.gangs(snapshot.takers) if g.key not in served),
        alerts=tuple(a for a in snapshot.alerts if a.until > now),
        clocks=snapshot.clocks,
        future=frozenset(future),
        noticed=tuple(n for n in by_phase[Phase.LENT] if n.state.noticed),
    )


def _serving(
    serving: Sequence[Node], now: datetime, warmup: timedelta
) -> tuple[int, frozenset[model.NodeName]]:
    """Of the serving nodes: how many are not Ready, and which are Ready but not warm at
    ``now`` (``warmth.is_warm``), in one pass."""
    not_ready, warming = 0, []
    for n in serving:
        if not n.view.ready:
            not_ready += 1
        elif not warmth.is_warm(n.view, n.state, now, warmup):
            warming.append(n.name)
    return not_ready, frozenset(warming)


def _in_future(
    now: datetime,
    by_phase: Mapping[Phase, Sequence[Node]],
    measured: clocks.Clocks,
    keys: nodestate.Keys,
) -> dict[model.NodeName, model.Finding]:
    """The nodes whose ``since`` is ahead of the API server's clock (a clock ahead wrote it),
    each with its finding. Judged every tick, not once per node value: the clock moves."""
    found = {}
    # The same test as ``in_future``'s, without a call per node: a time after the bound is
    # ahead (``when - server_now > slack``, exact in microseconds); how far, for those only.
    bound = clocks.future_bound(measured, now)
    for node in itertools.chain.from_iterable(by_phase.values()):
        since = node.state.since
        if since is None or since <= bound:
            continue
        ahead = clocks.in_future(measured, now)(since)
        if ahead is None:
            continue
        found[node.name] = model.Finding(
            node.name,
            keys.since,
            since.isoformat().replace("+00:00", "Z"),
            Reason.SINCE_IN_FUTURE,
            f"since is {ahead.total_seconds():.0f}s ahead of the API server's clock (a clock "
            "ahead wrote it): not trusted; the cooldown and the warm-up count it as now, "
            "the minimum loan does not hold a reclaim",
        )
    return found


def _read_nodes(
    now: datetime,
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    keys: nodestate.Keys,
    policy: PoolPolicy,
) -> tuple[dict[Phase, tuple[Node, ...]], tuple[model.Finding, ...], int]:
    """The nodes by phase (every phase, in the order of ``Phase``; a node whose state cannot
    be read among the lent), what could not be read or was changed by another writer on any
    node, and how many nodes' state could not be read at all."""
    by_phase: dict[Phase, list[Node]] = {phase: [] for phase in PHASES}
    findings: list[model.Finding] = []
    unreadable = 0
    # This runs for every node every tick: the common case costs no call.
    memo_key = _decode_key(keys, policy)
    members = bool(snapshot.orphans or snapshot.overlaps)
    for view in snapshot.nodes:
        decoded = view.memo.get(memo_key)
        if not isinstance(decoded, DecodedNode):
            decoded = _decoded(view, memo_key, keys, policy)
        if decoded.findings:
            findings.extend(decoded.findings)
        node = decoded.node
        unreadable += node.error is not None
        if node.overrides.until is not None:
            node = node.as_of(now)
        if members:
            node = _membership(name, snapshot, node, findings)
        by_phase[node.phase].append(node)
    return {phase: tuple(nodes) for phase, nodes in by_phase.items()}, tuple(findings), unreadable


_READS: dict[tuple[model.PoolName, str], rereading.Nodes] = {}
# Smaller pools are read node by node: what is kept to read them again costs more than that
# (the simulator's 16-node week took a fifth longer).
REREAD_FROM = 64


def _read_again(
    name: model.PoolName,
    snapshot: model.PoolSnapshot,
    keys: nodestate.Keys,
    policy: PoolPolicy,
) -> rereading.Nodes | None:
    """The pool's nodes by phase, made from the last read of the pool (``rereading``) where
    only some nodes changed; None when they are read as ``_read_nodes`` reads them (an orphan
    or an overlap among them, an override with an end, or fewer than ``REREAD_FROM``)."""
    if snapshot.orphans or snapshot.overlaps or len(snapshot.nodes) < REREAD_FROM:
        return None
    memo_key = _decode_key(keys, policy)

    def decode(view: model.NodeView, was: DecodedNode) -> DecodedNode:
        """The view's decoded node; ``was``'s (the one at its place last time) with the view
        put in, when the view differs from its in the resourceVersion alone (a heartbeat:
        decoding does not read it)."""
        decoded = view.memo.get(memo_key)
        if isinstance(decoded, DecodedNode):
            return decoded
        if not was.node.view.alike_but_version(view):
            return _decoded(view, memo_key, keys, policy)
        decoded = DecodedNode(dataclasses.replace(was.node, view=view), was.findings)
        view.memo[memo_key] = decoded
        return decoded

    nodes, key = snapshot.nodes, (name, memo_key)
    was = _READS.get(key)
    if was is not None and was.views is nodes:
        return was
    made = rereading.again(was, nodes, decode) if was is not None else None
    if made is None:
        decoded = tuple(_decoded(view, memo_key, keys, policy) for view in nodes)
        if not all(rereading.plain(d) for d in decoded):
            _READS.pop(key, None)
            return None
        made = rereading.from_scratch(nodes, decoded)
    _READS.pop(key, None)
    while len(_READS) >= 64:  # pools, and settings reloaded: the oldest go
        del _READS[next(iter(_READS))]
    _READS[key] = made
    return made


def _decode_key(keys: nodestate.Keys, policy: PoolPolicy) -> str:
    """The decode memo's key for ``keys`` and the pool's zone and lent taints: one string (a
    string keeps its hash; a tuple hashes its parts again at every look-up, a taint's own hash
    a call of its own)."""
    taints = tuple((t.key, t.effect, t.value, t.time_added) for t in policy.lend_spec.add_taints)
    return _memo_key(keys.prefix, policy.zone, taints)


def _decoded(
    view: model.NodeView, memo_key: str, keys: nodestate.Keys, policy: PoolPolicy
) -> DecodedNode:
    """``view`` decoded: from its memo under ``memo_key``, else decoded and kept there."""
    decoded = view.memo.get(memo_key)
    if not isinstance(decoded, DecodedNode):
        decoded = view.memo[memo_key] = _decode(view, keys, policy.zone, policy.lend_spec)
    return decoded


@functools.lru_cache(maxsize=64)
def _memo_key(prefix: str, zone: str, taints: tuple[object, ...]) -> str:
    """The decode memo's key for these keys, zone and lent taints: ``repr`` keeps keys that
    differ apart, and the same string object comes back every tick (its hash computed once).
    Bounded as ``nodestate``'s in-pool keys are: settings reloaded many times add keys."""
    return repr(("planning", prefix, zone, taints))


def _membership(
    name: model.PoolName, snapshot: model.PoolSnapshot, node: Node, findings: list[model.Finding]
) -> Node:
    """An orphan (no pool selects it, yet it carries our keys) is this pool's to take back;
    a node other pools select too is this pool's to drive. Both are reported."""
    others = snapshot.overlaps.get(node.name)
    if others:
        pools = ", ".join(others)
        why = f"selected by pools {name} and {pools}: only {name} drives it; fix the selectors"
        findings.append(model.Finding(node.name, "pools", f"{name},{','.join(others)}", _MANY, why))
    if node.name not in snapshot.orphans:
        return node
    why = (
        f"no configured pool selects it, yet it carries the controller's keys: pool {name} "
        "takes it back from its own original"
    )
    findings.append(model.Finding(node.name, "pools", "", Reason.ORPHANED, why))
    if node.phase is Phase.LENT and node.problem is None:
        return dataclasses.replace(node, problem=Reason.ORPHANED)
    return node


_MANY = Reason.SELECTED_BY_MANY_POOLS


def _decode(
    view: model.NodeView, keys: nodestate.Keys, zone: str, spec: nodestate.LendSpec
) -> DecodedNode:
    """Everything about a node that depends only on its metadata: computed once per version."""
    state = nodestate.read_in_pool(view, keys, spec.add_taints)
    parsed = overrides.parse(view.annotations, keys, zone)
    findings = [
        model.Finding(view.name, p.key, p.value, Reason.BAD_OVERRIDE, str(p))
        for p in parsed.problems
    ]
    findings += _unbelieved(view)
    ov = parsed.overrides
    bad_override = bool(parsed.problems)
    if isinstance(state, nodestate.StateError):
        why = f"{state}; planned as lent and taken back from the pool's specification"
        findings.append(
            model.Finding(view.name, state.key, state.value, Reason.STATE_UNREADABLE, why)
        )
        # Away from serving for every cap, as a lent node is: whatever it runs, it is not the
        # capacity the pool counts on until it is back.
        stand_in = nodestate.NodeState(phase=Phase.LENT)
        node = Node(view, view.name, stand_in, Phase.LENT, ov, ov.window, bad_override)
        node = dataclasses.replace(node, problem=Reason.STATE_UNREADABLE, error=state)
        return DecodedNode(node, tuple(findings))
    if not state.verified:
        # Not the controller's own: planned as lent whatever it says (its times and phase are
        # not trusted either) and taken back at once, within what the pool's specification
        # confirms (docs/design/node-state-integrity.md).
        findings += [
            model.Finding(
                view.name,
                d.key,
                d.value,
                d.reason,
                f"{d}; taken back within what the pool's specification confirms",
            )
            for d in state.drift
        ]
        stand_in = nodestate.NodeState(phase=Phase.LENT, drift=state.drift, verified=False)
        node = Node(view, view.name, stand_in, Phase.LENT, ov, ov.window, bad_override)
        node = dataclasses.replace(node, problem=Reason.STATE_UNVERIFIED)
        return DecodedNode(node, tuple(findings))
    drift = list(state.drift)
    if state.phase is Phase.LENT:
        drift += _lent_drift(view, spec)
    after = "the node is taken back" if state.phase is Phase.LENT else "it is not lent until fixed"
    findings += [model.Finding(view.name, d.key, d.value, d.reason, f"{d}; {after}") for d in drift]
    problem = drift[0].reason if drift and state.phase is Phase.LENT else None
    node = Node(view, view.name, state, state.phase, ov, ov.window, bad_override, problem)
    return DecodedNode(node, tuple(findings))


def _unbelieved(view: model.NodeView) -> list[model.Finding]:
    """A finding for each borrowed pod whose checkpoint is not believed: what its job would
    lose is then judged as if it did not say (``core.victims``), and whoever runs it should
    know why (docs/design/reclaim-notice.md#victims-by-work-lost)."""
    return [
        model.Finding(
            view.name,
            u.key,
            u.value,
            Reason.CHECKPOINT_NOT_BELIEVED,
            f"pod {p.namespace}/{p.name}: {u}; its job is costed as one that does not say "
            "when it last saved",
        )
        for p in view.borrowed_pods
        if (u := p.unbelieved) is not None
    ]


def _lent_drift(view: model.NodeView, spec: nodestate.LendSpec) -> list[nodestate.Drift]:
    """What another writer did to a lent node that lets inference down: a lent taint removed
    (pods with no toleration may land), or a pod landed that is neither inference, a
    DaemonSet's, nor tolerant of the lent taints."""
    drift = [
        nodestate.Drift(
            Reason.LENT_TAINT_LOST, t.key, str(t), "the lent taint is gone: any pod may land"
        )
        for t in nodestate.missing_lent_taints(view, spec)
    ]
    drift += [
        nodestate.Drift(
            Reason.FOREIGN_POD,
            "pod",
            f"{p.namespace}/{p.name}",
            "landed on the lent node: neither inference, a DaemonSet's, nor tolerant of the "
            "lent taint",
        )
        for p in view.pods
        if p.role is model.PodRole.OTHER
    ]
    return drift


def _judge_demand(now: datetime, pool: model.PoolSnapshot, policy: PoolPolicy) -> Demand:
    # A rate that is not a finite number >= 0 is no sample: never read as a load, and never
    # handed to ``need``, which cannot round NaN or infinity.
    demand = demand_module.usable(pool.demand)
    health, note = _health(now, pool, demand, policy)
    if demand is None and pool.demand is not None:
        note = f"demand sample {pool.demand.value} is not a rate"
    queue = pool.queue
    sampled_now = clocks.prometheus_now(pool.clocks, now)
    fresh_queue = queue is not None and queue.age(sampled_now) <= policy.staleness
    return Demand(
        health=health,
        note=note,
        need=policy.need(demand.value) if demand is not None else None,
        value=demand.value if demand is not None else None,
        queue=queue.value if queue is not None and fresh_queue else None,
        held=pool.held if Guard.DEMAND_DROP_HOLD in policy.guards else None,
    )


def _health(
    now: datetime, pool: model.PoolSnapshot, demand: model.Sample | None, policy: PoolPolicy
) -> tuple[Health, str]:
    """Unreachable, empty, NaN and old all mean one thing: demand is unknown since the last
    good sample (or since the controller started, before any). No lending at once; past
    ``staleness + stale_grace`` since then, everything lent is reclaimed.

    A sample's age is Prometheus' now minus its sample time (``clocks.prometheus_now``): a
    controller behind Prometheus does not read old samples as fresh, nor one ahead fresh ones
    as lost. The start, with no sample yet, is a time of the controller's: aged on ``now``."""
    if Guard.METRICS not in policy.guards:
        return Health.FRESH, "metrics not checked"
    since = demand.at if demand is not None else pool.unknown_since
    if since is None:
        return Health.LOST, "no demand sample"
    age = (clocks.prometheus_now(pool.clocks, now) if demand is not None else now) - since
    seconds = age.total_seconds()
    what = "the last good demand sample" if demand is not None else "the start, with no sample"
    if pool.demand_known and demand is not None and age <= policy.staleness:
        return Health.FRESH, f"demand sample {seconds:.0f}s old"
    # Past the fresh mark: say on which clock, so that a clock's fault is not Prometheus'.
    judged = _judged_on(pool.clocks) if demand is not None else ""
    if age <= policy.staleness + policy.stale_grace:
        unknown = "unknown now" if not pool.demand_known else f"older than {policy.staleness}"
        return Health.STALE, f"demand {unknown}; {seconds:.0f}s since {what}{judged}"
    return (
        Health.LOST,
        f"demand unknown {seconds:.0f}s since {what}{judged}, past the grace period",
    )


def _judged_on(measured: clocks.Clocks) -> str:
    """Which clock a sample's age was told on, and what is wrong with the clocks, if anything."""
    skew = measured.skew(clocks.Against.PROMETHEUS)
    if skew is not None:
        on = f" (aged on Prometheus' clock, {skew.offset.total_seconds():+.1f}s from this one's)"
    elif clocks.Against.PROMETHEUS in measured.unmeasured:
        on = " (aged on the API server's clock: Prometheus' could not be read)"
    else:
        on = ""
    problems = measured.problems()
    return on + (f"; clocks: {'; '.join(problems)}" if problems else "")
