"""Which pool drives each node: judged from scratch (``judge``), and again after a tick in which
some nodes changed by judging only those (``Judge``), with exactly the answer ``judge`` gives.

Where it sits: ``runtime.observing.Observer`` asks it each tick, with each pool's views under
its pod marks. A node two pools select goes to the first, and is reported to it (an overlap);
a node no pool selects that carries our keys is an orphan the ``adopter`` pool takes as a
member. Why incremental: a node's heartbeat gives it a new view, and a tick in which any node
changed judged every node against every pool again (20,000 look-ups at 5,000 nodes and four
pools, most of an idle tick); a node's verdict depends on its own views alone, so the verdicts
of the nodes whose views are the very objects of the last tick stand.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rebalancer.core import nodestate
from rebalancer.core.model import NodeName, NodeView, PoolName
from rebalancer.core.nodestate import Keys
from rebalancer.runtime.seams import PoolConfig


@dataclass
class Membership:
    """Which pool drives each node, as ``judge`` finds it: each pool's members (its views, in
    the order of its views, then the orphans it adopts), the orphans and the overlaps."""

    members: dict[PoolName, tuple[NodeView, ...]] = field(default_factory=dict)
    orphans: dict[PoolName, frozenset[NodeName]] = field(default_factory=dict)
    overlaps: dict[PoolName, dict[NodeName, tuple[PoolName, ...]]] = field(default_factory=dict)

    def overlap(self, first: PoolName, node: NodeName, other: PoolName) -> None:
        seen = self.overlaps.setdefault(first, {})
        seen[node] = (*seen.get(node, ()), other)

    def adopt(self, pool: PoolName, view: NodeView) -> None:
        self.members[pool] = (*self.members.get(pool, ()), view)
        self.orphans[pool] = self.orphans.get(pool, frozenset()) | {view.name}


def judge(
    pools: Sequence[PoolConfig], keys: Keys, every: Mapping[PoolName, tuple[NodeView, ...]]
) -> Membership:
    """Each pool's nodes from scratch; ``every``: each pool's views under its pod marks."""
    found = Membership()
    taken: dict[NodeName, PoolName] = {}
    for pool in pools:
        mine = []
        selects = pool.selects
        for view in [v for v in every[pool.name] if selects(v, keys)]:
            first = taken.setdefault(view.name, pool.name)
            if first != pool.name:
                found.overlap(first, view.name, pool.name)
                continue
            mine.append(view)
        found.members[pool.name] = tuple(mine)
    for pool, view in _orphans(pools, keys, every, taken):
        found.adopt(pool.name, view)
    return found


def _orphans(
    pools: Sequence[PoolConfig],
    keys: Keys,
    every: Mapping[PoolName, tuple[NodeView, ...]],
    taken: Mapping[NodeName, PoolName],
) -> list[tuple[PoolConfig, NodeView]]:
    """The nodes no pool selects that carry our keys, each with the pool that adopts it
    (as that pool's pod marks see the node)."""
    if not pools:
        return []
    out = []
    for view in every[pools[0].name]:
        if view.name in taken:
            continue
        pool = adopter(pools, view, keys)
        if pool is None:
            continue
        adopted = next(v for v in every[pool.name] if v.name == view.name)
        out.append((pool, adopted))
    return out


def adopter(pools: Sequence[PoolConfig], view: NodeView, keys: Keys) -> PoolConfig | None:
    """The pool that finishes a node no pool selects, or None when the node carries none of
    our keys (state label, original, a lent taint): the first pool whose every lent taint the
    node carries (its own lend, most likely), else the first configured pool. A readable
    original restores the node whatever pool finishes it; the pool's pod marks say which pods
    on it are borrowed, and its specification what it serves with when the original cannot
    be read (docs/design/other-writers.md)."""
    lent = tuple(t for p in pools for t in p.lend_spec.add_taints)
    if not pools or not nodestate.carries_ours(view, keys, lent):
        return None
    carried = {(t.key, t.value, t.effect) for t in view.taints}
    for pool in pools:
        wanted = pool.lend_spec.add_taints
        if wanted and all((t.key, t.value, t.effect) in carried for t in wanted):
            return pool
    return pools[0]


# ---------------------------------------------------------------------------------------------
# Judged again where views changed

NOBODY = -1  # a node's verdict: no pool selects it, and none adopts it


@dataclass(frozen=True)
class _Judged:
    """What ``judge`` found, with what it was found from and what judging a node again needs:
    where each name is in each pool's views and in its members, and each node's verdict (the
    index of the pool it is a member of, or ``NOBODY``)."""

    pools: tuple[PoolConfig, ...]
    keys: Keys
    every: tuple[tuple[NodeView, ...], ...]  # each pool's views, in the pools' order
    index: tuple[dict[NodeName, int], ...]  # where each name is in each pool's views
    where: tuple[dict[NodeName, int], ...]  # where each name is in each pool's members
    verdicts: dict[NodeName, int]
    found: Membership


class Judge:
    """``judge``'s answer, each tick, from the last one and the nodes whose views changed."""

    def __init__(self) -> None:
        self._last: _Judged | None = None

    def membership(
        self,
        pools: tuple[PoolConfig, ...],
        keys: Keys,
        every: Mapping[PoolName, tuple[NodeView, ...]],
    ) -> Membership:
        """Each pool's nodes, as ``judge(pools, keys, every)`` finds them. The same pools and
        keys (the very objects) as last time: only the nodes whose views are other objects are
        judged again, and while each keeps its verdict, the members are the last ones with
        those views put in their places. Anything else (a node that moves, appears or goes,
        an overlap or an orphan that changed, other pools or keys) is judged from scratch."""
        views = tuple(every[p.name] for p in pools)
        last = self._last
        if last is not None and last.pools is pools and last.keys is keys:
            if all(a is b for a, b in zip(last.every, views, strict=True)):
                return last.found
            found = _again(last, views)
            if found is not None:
                self._last = _Judged(
                    pools, keys, views, last.index, last.where, last.verdicts, found
                )
                return found
        found = judge(pools, keys, every)
        self._last = _judged(pools, keys, views, found)
        return found


def _judged(
    pools: tuple[PoolConfig, ...],
    keys: Keys,
    views: tuple[tuple[NodeView, ...], ...],
    found: Membership,
) -> _Judged | None:
    """What ``Judge`` keeps of a membership found from scratch; None when it cannot judge
    again by name (two pools of one name, or a name twice among a pool's views)."""
    index = tuple({v.name: i for i, v in enumerate(mine)} for mine in views)
    if len({p.name for p in pools}) != len(pools) or any(
        len(i) != len(v) for i, v in zip(index, views, strict=True)
    ):
        return None
    where = tuple({v.name: i for i, v in enumerate(found.members[p.name])} for p in pools)
    # An overlap's or an orphan's is the pool it is a member of: one judged again is never
    # that (``_verdict`` has none for either), so it is judged from scratch.
    verdicts = dict.fromkeys(itertools.chain.from_iterable(index), NOBODY)
    for i, members in enumerate(where):
        verdicts.update(dict.fromkeys(members, i))
    return _Judged(pools, keys, views, index, where, verdicts, found)


def _again(last: _Judged, views: tuple[tuple[NodeView, ...], ...]) -> Membership | None:
    """The membership after the nodes whose views changed are judged again, or None when one
    of them cannot be so (``Judge.membership``)."""
    changed = _changed(last.every, views)
    if changed is None:
        return None
    members: dict[PoolName, list[NodeView]] = {}
    for name in changed:
        verdict = last.verdicts.get(name)
        if verdict is None or any(name not in index for index in last.index):
            return None
        seen = [mine[index[name]] for mine, index in zip(views, last.index, strict=True)]
        was = [mine[index[name]] for mine, index in zip(last.every, last.index, strict=True)]
        alike = all(_alike(a, b) for a, b in zip(was, seen, strict=True))
        if not alike and _verdict(last.pools, last.keys, seen) != verdict:
            return None
        if verdict == NOBODY:
            continue
        pool = last.pools[verdict].name
        if pool not in members:
            members[pool] = list(last.found.members[pool])
        members[pool][last.where[verdict][name]] = seen[verdict]
    found = last.found
    return Membership(
        members={**found.members, **{p: tuple(m) for p, m in members.items()}},
        orphans=dict(found.orphans),
        overlaps={p: dict(seen) for p, seen in found.overlaps.items()},
    )


def _changed(
    before: tuple[tuple[NodeView, ...], ...], now: tuple[tuple[NodeView, ...], ...]
) -> dict[NodeName, None] | None:
    """The names whose view is another object than before, under any pool's marks (in the
    order met); None when a pool's views are not the same names in the same places (a node
    appeared or went)."""
    changed: dict[NodeName, None] = {}
    for old, new in zip(before, now, strict=True):
        if old is new:
            continue
        if len(old) != len(new):
            return None
        for i in itertools.compress(range(len(new)), map(operator.is_not, old, new)):
            name = new[i].name
            if old[i].name != name:
                return None
            changed[name] = None
    return changed


def _alike(was: NodeView, now: NodeView) -> bool:
    """Whether a node's verdict reads the same of both views: a pool's selector reads its
    labels as they are when it serves (``nodestate.read``: its name, UID, labels and
    annotations), and ``adopter`` its taints too. A heartbeat changes none of them."""
    return (
        was.uid == now.uid
        and was.labels == now.labels
        and was.annotations == now.annotations
        and was.taints == now.taints
    )


def _verdict(pools: Sequence[PoolConfig], keys: Keys, seen: Sequence[NodeView]) -> int | None:
    """The node's verdict from its view under each pool's marks: the index of the one pool
    that selects it, ``NOBODY`` when none does and none adopts it, None otherwise (an overlap
    or an orphan)."""
    selecting = [i for i, (p, v) in enumerate(zip(pools, seen, strict=True)) if p.selects(v, keys)]
    if len(selecting) == 1:
        return selecting[0]
    if selecting or adopter(pools, seen[0], keys) is not None:
        return None
    return NOBODY
