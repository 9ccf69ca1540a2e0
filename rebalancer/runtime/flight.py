"""The nodes in flight: which are driven on by a tick (``drives``), and what the passes came to,
folded into the memory the next tick starts from (``settle``).

Where it sits: ``runtime.step`` asks for the drives of each branch of the commit; the shell
(``runtime.shell``) carries them out; ``runtime.reconcile`` settles the results. Every loan
ends, whatever happens to its node (docs/design/other-writers.md): a lent node deleted ends its
loan under an intent of its own, whose drain goes on while the node is away and after a node is
created again under its name; and since a process that restarts remembers none of that, every
tick also looks at each node for borrowed pods bound to its name before it was created
(``core.victims.left_by_earlier_node``), and removes them under an intent of their own.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property

from rebalancer.core import audit, model, nodestate, recovery, victims
from rebalancer.core.audit import AuditRecord, Context
from rebalancer.core.model import Action, NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys, Phase
from rebalancer.core.outcomes import ActionResult, Outcome, WriteOutcome
from rebalancer.core.tick import noticed, phase
from rebalancer.runtime.effects import (
    Carry,
    Done,
    Drive,
    EndLoan,
    Progress,
    RemoveLeft,
    RollBack,
    Rules,
    Say,
    StoreEvent,
    Wave,
)
from rebalancer.runtime.memory import Drain, Loan, Memory, Removal
from rebalancer.runtime.seams import PoolConfig

IN_FLIGHT = (Phase.LENDING, Phase.RECLAIMING)  # the phases a tick drives a node on in


@dataclass(frozen=True, slots=True)
class Facts:
    """What every tick reads of a node for the nodes in flight and the gauges, under its
    pool's lent taints: its state (``nodestate.read_in_pool``), its phase (``core.tick.phase``),
    whether it is a loan under a reclaim notice (``core.tick.noticed``), so whether a tick
    drives it on, and whether an earlier node of its name left borrowed pods on it."""

    state: nodestate.NodeState | nodestate.StateError
    phase: Phase | None
    noticed: bool
    driven: bool
    left: bool


_FACTS = object()  # their key in a view's memo: hashed by identity, as cheap as a key can be


def facts(view: NodeView, keys: Keys, lent: tuple[model.Taint, ...]) -> Facts:
    """The node's ``Facts``, read once per node value (the view's memo): a tick asks them of
    every node of every pool several times, and at 5,000 nodes each reading of the state
    through its memo key cost more than the rest of an idle tick. Kept for the very ``keys``
    and ``lent`` asked with (the reconciler's, the same objects every tick); others read
    afresh."""
    held = view.memo.get(_FACTS)
    if isinstance(held, tuple) and held[0] is keys and held[1] is lent:
        found: Facts = held[2]
        return found
    state = nodestate.read_in_pool(view, keys, lent)
    now_phase = phase(view, keys, lent)
    told = noticed(view, keys, lent)
    found = Facts(
        state,
        now_phase,
        told,
        now_phase in IN_FLIGHT or told,
        bool(victims.left_by_earlier_node(view)),
    )
    view.memo[_FACTS] = (keys, lent, found)
    return found


@dataclass(frozen=True)
class Tally:
    """What a tick reads of a pool's nodes from their ``Facts``: how many are lent
    (``core.tick.lent_count``) and under a reclaim notice, and where the few it looks at
    again are (driven on, loans, left-behind pods, reclaims), in the nodes' order. A tick
    asked these of every node in five passes (the strategy's kept count, the gauges, and each
    branch of the commit's drives); one tally a tick serves them all, and is made from the
    last one where only some nodes changed (``tally``)."""

    nodes: tuple[NodeView, ...]
    facts: tuple[Facts, ...]  # each node's, in the nodes' order
    lent: int
    noticed: int
    marked: tuple[tuple[int, ...], ...]  # where each of ``_MARKS`` holds, in order

    @property
    def kept(self) -> int:
        """``core.tick.kept_count``: the loans the pool means to keep."""
        return self.lent - self.noticed

    @property
    def driven(self) -> tuple[tuple[NodeView, Facts], ...]:
        return tuple((self.nodes[i], self.facts[i]) for i in self.marked[0])

    @property
    def loans(self) -> tuple[NodeView, ...]:
        """The nodes lent, each with a UID (a loan to follow)."""
        return tuple(self.nodes[i] for i in self.marked[1])

    @property
    def left(self) -> tuple[tuple[NodeView, Facts], ...]:
        """The nodes an earlier node of their name left borrowed pods on."""
        return tuple((self.nodes[i], self.facts[i]) for i in self.marked[2])

    @property
    def deadlines(self) -> tuple[datetime | None, ...]:
        """The deadline of each node reclaiming."""
        states = (self.facts[i].state for i in self.marked[3])
        return tuple(s.deadline for s in states if isinstance(s, nodestate.NodeState))

    @cached_property
    def by_name(self) -> dict[NodeName, NodeView]:
        return {v.name: v for v in self.nodes}


def _reclaiming(seen: Facts) -> bool:
    state = seen.state
    return isinstance(state, nodestate.NodeState) and state.phase is Phase.RECLAIMING


# What a tally notes where it holds: driven on, a loan (lent, with a UID), pods left behind,
# reclaiming.
_MARKS: tuple[Callable[[NodeView, Facts], bool], ...] = (
    lambda view, seen: seen.driven,
    lambda view, seen: seen.phase is Phase.LENT and bool(view.uid),
    lambda view, seen: seen.left,
    lambda view, seen: _reclaiming(seen),
)
_COUNTED = (Phase.LENDING, Phase.LENT, None)  # what ``core.tick.lent_count`` counts
_TALLIES: dict[tuple[int, int, int], tuple[object, object, Tally]] = {}


def tally(nodes: tuple[NodeView, ...], keys: Keys, lent: tuple[model.Taint, ...]) -> Tally:
    """The pool's ``Tally``, made once for the very ``nodes``, ``keys`` and ``lent`` (held
    here, so their ids stay theirs): the strategies' step and the pure step ask it of the same
    snapshot. From a tally of the last tick's nodes (the same names in the same places, under
    the same keys and taints) only the nodes whose views changed are read."""
    key = (id(nodes), id(keys), id(lent))
    held = _TALLIES.get(key)
    if held is not None and held[0] is keys and held[1] is lent and held[2].nodes is nodes:
        return held[2]
    made = None
    for was_keys, was_lent, was in reversed(_TALLIES.values()):  # the latest first
        if was_keys is keys and was_lent is lent and len(was.nodes) == len(nodes):
            made = _again(was, nodes, keys, lent)
            if made is not None:
                break
    if made is None:
        made = _tallied(nodes, keys, lent)
    while len(_TALLIES) >= 32:  # a few pools' snapshots of a few ticks: the oldest go
        del _TALLIES[next(iter(_TALLIES))]
    _TALLIES[key] = (keys, lent, made)
    return made


def _carried(
    was: NodeView, view: NodeView, seen: Facts, keys: Keys, lent: tuple[model.Taint, ...]
) -> Facts:
    """``view``'s facts: ``seen`` (``was``'s), kept in its memo, when it differs from ``was``
    in its resourceVersion alone (a heartbeat; the facts do not read it), else read."""
    if not was.alike_but_version(view) or _FACTS in view.memo:
        return facts(view, keys, lent)
    view.memo[_FACTS] = (keys, lent, seen)
    return seen


def _tallied(nodes: tuple[NodeView, ...], keys: Keys, lent: tuple[model.Taint, ...]) -> Tally:
    every = tuple(facts(view, keys, lent) for view in nodes)
    counted = noticed = 0
    marked: tuple[list[int], ...] = ([], [], [], [])
    for i, seen in enumerate(every):
        counted += seen.phase in _COUNTED
        noticed += seen.noticed
        if seen.driven or seen.left or seen.phase is Phase.LENT or _reclaiming(seen):
            for mark, at in zip(_MARKS, marked, strict=True):
                if mark(nodes[i], seen):
                    at.append(i)
    return Tally(nodes, every, counted, noticed, tuple(tuple(at) for at in marked))


def _again(
    was: Tally, nodes: tuple[NodeView, ...], keys: Keys, lent: tuple[model.Taint, ...]
) -> Tally | None:
    """``was`` with the nodes whose views changed read again; None when ``nodes`` are not
    the same names in the same places as ``was.nodes``."""
    changed = list(itertools.compress(range(len(nodes)), map(operator.is_not, was.nodes, nodes)))
    if len(changed) > len(nodes) // 4:  # more than a quarter changed: all read costs less
        return None
    if any(was.nodes[i].name != nodes[i].name for i in changed):
        return None
    every = list(was.facts)
    counted, noticed = was.lent, was.noticed
    marked = [list(at) for at in was.marked]
    for i in changed:
        before, now = every[i], _carried(was.nodes[i], nodes[i], every[i], keys, lent)
        every[i] = now
        counted += (now.phase in _COUNTED) - (before.phase in _COUNTED)
        noticed += now.noticed - before.noticed
        for mark, at in zip(_MARKS, marked, strict=True):
            held, holds = mark(was.nodes[i], before), mark(nodes[i], now)
            if held and not holds:
                at.remove(i)
            elif holds and not held:
                bisect.insort(at, i)
    return Tally(nodes, tuple(every), counted, noticed, tuple(tuple(at) for at in marked))


def driven(view: NodeView, keys: Keys, lent: tuple[model.Taint, ...]) -> bool:
    """Whether a tick drives the node on: in flight, or lent under a reclaim notice (whose
    pods are told, and whose reclaim begins when they answer)."""
    return facts(view, keys, lent).driven


def drives(
    memory: Memory,
    snapshot: model.Snapshot,
    rules: Rules,
    carries: Sequence[Carry],
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
) -> tuple[Memory, list[Say], tuple[Wave, ...]]:
    """Every node in flight that gets no step this tick (``carries``) is driven on, a wave of
    drains together as the reclaims that began them; then the drains whose node vanished from
    the pools, under their UID; then the end of every loan whose node was replaced; then the
    removal of the borrowed pods an earlier node of a name left on the node there now. A dry
    run drives nothing: it says once which nodes a run that writes would drive on."""
    now = snapshot.now
    acted = {c.step.node for c in carries}
    read = _read(snapshot, rules)
    in_flight = [(pool, view) for pool, t in read for view, _ in t.driven if view.name not in acted]
    if rules.dry_run:
        return _would_drive(memory, in_flight, rules)
    looked_at = {v.name for _, v in in_flight} | acted
    vanished = [
        (name, drain)
        for name, drain in memory.draining.items()
        if name not in looked_at and _uid(read, name) != drain.uid
    ]
    # By UID alone, acted on or not: a new node under the name may be lent already, and the
    # pods bound to the old one are still there. A loan whose node was being reclaimed ends
    # with that drain, under its intent.
    gone = {name for name, _ in vanished}
    ended = [
        loan
        for name, loan in memory.loans.items()
        if _uid(read, name) != loan.view.uid and name not in gone
    ]
    memory = _tracked(memory, read, rules, in_flight, acted)
    passes = tuple(
        _pass(memory, pool, view, rules, new_id, context, now) for pool, view in in_flight
    )
    followed = tuple(
        Progress(d.pool, name, d.decision or None, d.uid, d.deadline, memory.said.get(name), True)
        for name, d in vanished
    )
    ends = tuple(_end_loan(loan, rules, new_id, context, now) for loan in ended)
    # A node a reclaim, a drain or a loan's end has this tick takes the borrowed pods itself;
    # one lent this tick does not, and is looked at as the snapshot saw it.
    reclaimed = {c.step.node for c in carries if c.step.action is not Action.LEND}
    busy = reclaimed | {v.name for _, v in in_flight} | set(memory.draining) | gone
    busy |= {e.view.name for e in ends}
    left = _left_behind(memory, read, busy, new_id, context, now)
    limit = rules.reclaim_concurrency
    waves = (Wave(passes, limit), Wave(followed, limit), Wave(ends, 1), Wave(left, limit))
    return memory, [], waves


Read = list[tuple[PoolConfig, Tally]]


def _read(snapshot: model.Snapshot, rules: Rules) -> Read:
    """Every pool's ``Tally``, in the pools' order."""
    keys = rules.keys
    return [
        (pool, tally(snapshot.pools[pool.name].nodes, keys, pool.lent_taints))
        for pool in rules.pools
    ]


def _uid(read: Read, name: NodeName) -> str | None:
    """The UID of the node of ``name`` in the snapshot (of the last pool that holds one, as
    one map of every pool's nodes gave it); None when no pool holds one."""
    for _, t in reversed(read):
        view = t.by_name.get(name)
        if view is not None:
            return view.uid
    return None


def _tracked(
    memory: Memory,
    read: Read,
    rules: Rules,
    in_flight: Sequence[tuple[PoolConfig, NodeView]],
    acted: set[NodeName],
) -> Memory:
    """The drains and loans to look at again next tick. The drains: those of this tick's steps
    (their reclaims add theirs as they begin), and every node seen reclaiming, under its UID.
    The loans: those the snapshot shows lent (this tick's lends are added as they are made: a
    node may be replaced before the next tick sees it lent)."""
    keys = rules.keys
    draining = {
        **{name: d for name, d in memory.draining.items() if name in acted},
        **{
            view.name: Drain(
                pool.name, view.uid, view.annotations.get(keys.decision, ""), _deadline(view, keys)
            )
            for pool, view in in_flight
            if view.uid and phase(view, keys, pool.lent_taints) is Phase.RECLAIMING
        },
    }
    loans = {view.name: Loan(pool.name, view) for pool, t in read for view in t.loans}
    return replace(memory, draining=draining, loans=loans)


def _would_drive(
    memory: Memory, in_flight: Sequence[tuple[PoolConfig, NodeView]], rules: Rules
) -> tuple[Memory, list[Say], tuple[Wave, ...]]:
    """A node in flight was left so by a run that writes: a dry run neither drives it on nor
    closes the intent it answers to. Each is said once."""
    says = []
    for pool, view in in_flight:
        if view.name not in memory.would_drive:
            state = phase(view, rules.keys, pool.lent_taints)
            says.append(
                Say(
                    logging.WARNING,
                    f"dry run: node {view.name} of pool {pool.name} is "
                    f"{state.value if state else 'unreadable'}; a run that writes would drive "
                    "it on",
                )
            )
    names = frozenset(view.name for _, view in in_flight)
    return replace(memory, would_drive=names), says, ()


def _pass(
    memory: Memory,
    pool: PoolConfig,
    view: NodeView,
    rules: Rules,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> Progress | RollBack:
    """One pass over a node in flight: a lend left unfinished (its call ended in a conflict or
    a failure, and its intent is closed with that) is rolled back under an intent of its own,
    like a restart's; a reclaim is drained on."""
    decision = view.annotations.get(rules.keys.decision)
    if phase(view, rules.keys, pool.lent_taints) is Phase.LENDING:
        why = f"lend {decision} left the node lending: rolling it back"
        intent = audit.recovery_intent(
            context(pool), new_id, now, str(pool.name), view, recovery.ROLLBACK, decision, why
        )
        return RollBack(pool.name, view.name, intent)
    deadline = _deadline(view, rules.keys)
    return Progress(
        pool.name, view.name, decision, view.uid or None, deadline, memory.said.get(view.name)
    )


def _end_loan(
    loan: Loan,
    rules: Rules,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> EndLoan:
    """A lent node that was deleted, and perhaps created again under its name, is not lent
    any more, and nothing in its snapshot says so: a new node is serving, and the pods the
    loan took are still bound to the name. The loan is ended under an intent of its own (a
    reclaim for the lent node's UID, which finds it gone or replaced), and the pods bound to
    the earlier node are removed as a drain removes them: evicted, deleted past the deadline.
    While any is left the drain is driven on every tick, whether the name has a node again or
    not."""
    pool, lent = rules.pool(loan.pool), loan.view
    decision = lent.annotations.get(rules.keys.decision)
    # A node lent by the last tick is seen as it was before the lend: no decision yet.
    under = f" under {decision}" if decision else ""
    why = (
        f"node {lent.name} (uid {lent.uid}) was lent{under} and has been deleted: "
        "its loan ends, and the pods bound to it are removed"
    )
    intent = audit.recovery_intent(
        context(pool), new_id, now, str(pool.name), lent, Action.RECLAIM, decision, why
    )
    return EndLoan(pool.name, lent, intent, now + pool.policy.reclaim_deadline)


def _left_behind(
    memory: Memory,
    read: Read,
    busy: set[NodeName],
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> tuple[RemoveLeft, ...]:
    """The nodes to remove borrowed pods from that an earlier node of their name left: each
    that shows some (none in flight: its drain takes them), and each whose removal is under
    way (until a pass finds none, so that its intent is closed)."""
    out: dict[NodeName, RemoveLeft] = {}
    for pool, view, seen in ((p, v, f) for p, t in read for v, f in t.left):
        if seen.driven or view.name in busy or view.name in out:
            continue
        under_way = memory.removing.get(view.name)
        if under_way is not None:
            out[view.name] = _removal(view.name, under_way, memory)
            continue
        intent = _left_intent(pool, view, new_id, context, now)
        deadline = now + pool.policy.reclaim_deadline
        out[view.name] = RemoveLeft(pool.name, view.name, intent, deadline, True, None)
    going = tuple(
        _removal(name, removal, memory)
        for name, removal in memory.removing.items()
        if name not in out and name not in busy
    )
    return (*out.values(), *going)


def _removal(name: NodeName, removal: Removal, memory: Memory) -> RemoveLeft:
    return RemoveLeft(
        removal.pool, name, removal.intent, removal.deadline, False, memory.said.get(name)
    )


def _left_intent(
    pool: PoolConfig,
    view: NodeView,
    new_id: audit.NewId,
    context: Callable[[PoolConfig | None], Context],
    now: datetime,
) -> AuditRecord:
    pods = [f"{p.namespace}/{p.name}" for p in victims.left_by_earlier_node(view)]
    shown = ", ".join(pods[:5]) + (f" and {len(pods) - 5} more" if len(pods) > 5 else "")
    created = nodestate.format_time(view.created) if view.created else "?"
    why = (
        f"node {view.name} (uid {view.uid}, created {created}) runs borrowed pod(s) bound "
        f"to its name before it was created: {shown}; an earlier node of the name was lent "
        "and deleted, and its loan ends: they are removed"
    )
    return audit.recovery_intent(
        context(pool),
        new_id,
        now,
        str(pool.name),
        view,
        Action.RECLAIM,
        None,
        why,
        detail={recovery.EARLIER_PODS: pods},
    )


def _deadline(view: NodeView, keys: Keys) -> datetime | None:
    """The reclaim deadline the node carries (None: none readable, so passed)."""
    state = nodestate.read(view, keys)
    return state.deadline if isinstance(state, nodestate.NodeState) else None


# ---------------------------------------------------------------------------------------------
# What the effects came to, folded into the memory


def settle(
    memory: Memory, done: Sequence[Done], store: Sequence[StoreEvent]
) -> tuple[Memory, list[Say]]:
    """The memory after the tick's effects: the drains begun or still going, the loans made
    or not ended, the removals under way, what each drain's last record said, and the audit
    store's failure episode."""
    draining, loans = dict(memory.draining), dict(memory.loans)
    removing, said = dict(memory.removing), dict(memory.said)
    for item in done:
        effect, result = item.effect, item.result
        if isinstance(effect, EndLoan) and item.unaudited:  # ended next tick, once it can be
            loans.setdefault(effect.view.name, Loan(effect.pool, effect.view))
        if result is None:
            continue
        name, going = _node_of(effect), result.outcome is Outcome.IN_PROGRESS
        if isinstance(effect, Carry) and effect.step.action is Action.LEND:
            lent = _seen(memory, effect.step.pool, name)
            if result.outcome is Outcome.APPLIED and lent is not None and lent.uid:
                loans[name] = Loan(effect.step.pool, lent)
        elif isinstance(effect, Carry) and going and node_uid(effect.intent):
            uid = node_uid(effect.intent) or ""
            draining[name] = Drain(effect.step.pool, uid, effect.intent.id, item.deadline)
        elif isinstance(effect, Progress) and effect.vanished and going:
            draining[name] = Drain(
                effect.pool, effect.uid or "", effect.decision or "", effect.deadline
            )
        elif isinstance(effect, EndLoan) and going:
            draining[name] = Drain(effect.pool, effect.view.uid, effect.intent.id, effect.deadline)
        elif isinstance(effect, RemoveLeft) and going:
            removing[name] = Removal(effect.pool, effect.intent, effect.deadline)
        elif isinstance(effect, RemoveLeft):
            removing.pop(name, None)
        if isinstance(effect, RollBack):
            continue
        if not going:
            said.pop(name, None)
        elif item.recorded and item.intent is not None:
            said[name] = (item.intent.id, result.message)
    memory = replace(memory, draining=draining, loans=loans, removing=removing, said=said)
    return _store_episode(memory, store)


def _seen(memory: Memory, pool: PoolName, name: NodeName) -> NodeView | None:
    """The node as the last snapshot saw it."""
    seen = memory.last.pools.get(pool) if memory.last is not None else None
    return next((v for v in seen.nodes if v.name == name), None) if seen else None


def _store_episode(memory: Memory, events: Sequence[StoreEvent]) -> tuple[Memory, list[Say]]:
    """The store's failure episode: its traceback once when it begins, a line on each later
    failure, and how long it lasted once it takes writes again."""
    since, says = memory.store_since, []
    for event in events:
        if event.error is not None and since is None:
            since = event.now
            says.append(
                Say(
                    logging.ERROR,
                    "audit store failed; lending stops, safety reclaims go on recorded on their "
                    "nodes until it takes writes again",
                    event.error,
                )
            )
        elif event.error is not None and since is not None:
            says.append(
                Say(
                    logging.WARNING,
                    f"audit store still failing since {nodestate.format_time(since)}: "
                    f"{event.failing or event.error}",
                )
            )
        elif since is not None:
            seconds = int((event.now - since).total_seconds())
            says.append(Say(logging.INFO, f"audit store takes writes again after {seconds}s"))
            since = None
    return replace(memory, store_since=since), says


def _node_of(effect: Carry | Drive) -> NodeName:
    if isinstance(effect, Carry):
        return effect.step.node
    if isinstance(effect, EndLoan):
        return effect.view.name
    return effect.node


def node_uid(intent: AuditRecord) -> str | None:
    """The UID of the node an intent was decided for, as its record holds it."""
    uid = intent.detail.get("node_uid")
    return uid if isinstance(uid, str) and uid else None


# What a write that changed something came to (a 429 from a budget changed nothing).
CHANGED = frozenset({WriteOutcome.APPLIED, WriteOutcome.EVICTED, WriteOutcome.GONE})


def news(said: tuple[str, str] | None, intent: AuditRecord, result: ActionResult) -> bool:
    """Whether a pass is worth a record: it ended, changed something (a pod evicted or
    deleted, a node written), or says something else than the last record of its drain."""
    if result.outcome is not Outcome.IN_PROGRESS:
        return True
    changed = any(w.outcome in CHANGED for w in result.writes)
    return changed or said != (intent.id, result.message)
