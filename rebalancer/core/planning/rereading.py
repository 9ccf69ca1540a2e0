"""A pool's nodes read by phase (``reading._read_nodes``' answer), made from the last tick's
where only some nodes changed, with what ``reading.read_pool`` counts of its serving nodes.

Why: a node's heartbeat is a new view of it, and at one in twenty nodes a tick every pool's
nodes were read again, each through its memo, every tick (4,000 look-ups at 5,000 nodes, and
as many warmth judgements). What a node reads as depends on its view alone (``reading._decode``,
memoised on it) while no node of the pool is an orphan or an overlap and none carries an
override with an end (those are read at ``now``): then the nodes whose views are the very
objects of the last read read as they did, and only the others are read again. Anything else
is read from scratch, as before. Exact: the answer is the one reading every node gives.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from rebalancer.core import model, warmth
from rebalancer.core.nodestate import Phase
from rebalancer.core.planning.draft import PHASES, DecodedNode, Node

COLD, TIMED = 0, 1  # a serving node Ready and not warm whatever the time; warm after warmup


@dataclass(frozen=True)
class Nodes:
    """A pool's nodes by phase, each its decoded node, with where each is and the positions
    of the serving nodes that may be warming."""

    views: tuple[model.NodeView, ...]
    decoded: tuple[DecodedNode, ...]  # each view's, in the views' order
    at: tuple[tuple[int, ...], ...]  # each phase's positions (in ``PHASES`` order), ascending
    nodes: tuple[tuple[Node, ...], ...]  # each phase's nodes, at those positions
    findings: tuple[model.Finding, ...]
    unreadable: int
    not_ready: int  # serving nodes not Ready
    warming: tuple[tuple[int, ...], tuple[int, ...]]  # COLD's and TIMED's positions
    sinces: tuple[datetime | None, ...]  # each node's ``since``

    @property
    def by_phase(self) -> dict[Phase, tuple[Node, ...]]:
        return dict(zip(PHASES, self.nodes, strict=True))

    @property
    def latest(self) -> datetime | None:
        """The latest ``since`` of any node."""
        return max(filter(None, self.sinces), default=None)

    def warming_at(self, now: datetime, warmup: timedelta) -> frozenset[model.NodeName]:
        """``reading.read_pool``'s warming nodes: serving, Ready and not warm at ``now``."""
        views = self.views
        cold = [views[i].name for i in self.warming[COLD]]
        timed = [self.decoded[i].node for i in self.warming[TIMED]]
        late = [n.name for n in timed if not warmth.is_warm(n.view, n.state, now, warmup)]
        return frozenset(cold + late)


def warm_kind(node: Node) -> int | None:
    """Whether a serving node is COLD, TIMED or neither (not Ready, or warm whatever the time),
    as ``warmth.is_warm`` judges it: by its inference pods where it runs some, else by the
    time since it came back."""
    if not node.view.ready:
        return None
    if node.state.phase is not Phase.SERVING:
        return COLD
    ready = node.view.inference_ready
    if ready is not None:
        return None if ready else COLD
    return None if node.state.since is None else TIMED


def plain(decoded: DecodedNode) -> bool:
    """Whether the node reads as its decoded node whatever the time: no override with an end."""
    return decoded.node.overrides.until is None


def from_scratch(views: tuple[model.NodeView, ...], decoded: tuple[DecodedNode, ...]) -> Nodes:
    """``Nodes`` of ``views``, each decoded (none of them with an override that ends)."""
    at: dict[Phase, list[int]] = {phase: [] for phase in PHASES}
    warming: tuple[list[int], list[int]] = ([], [])
    not_ready = unreadable = 0
    for i, d in enumerate(decoded):
        node = d.node
        at[node.phase].append(i)
        unreadable += node.error is not None
        if node.phase is Phase.SERVING:
            not_ready += not node.view.ready
            kind = warm_kind(node)
            if kind is not None:
                warming[kind].append(i)
    return Nodes(
        views,
        decoded,
        tuple(tuple(at[p]) for p in PHASES),
        tuple(tuple(decoded[i].node for i in at[p]) for p in PHASES),
        tuple(itertools.chain.from_iterable(d.findings for d in decoded)),
        unreadable,
        not_ready,
        (tuple(warming[COLD]), tuple(warming[TIMED])),
        tuple(d.node.state.since for d in decoded),
    )


def again(
    was: Nodes,
    views: tuple[model.NodeView, ...],
    decode: Callable[[model.NodeView, DecodedNode], DecodedNode],
) -> Nodes | None:
    """``was`` with the nodes whose views changed decoded again (``decode``, given the decoded
    node that was in the place), each in its place; None when there are more or fewer views,
    or a changed node has findings or an override that ends, before or after (read from
    scratch)."""
    if len(was.views) != len(views):
        return None
    changed = list(itertools.compress(range(len(views)), map(operator.is_not, was.views, views)))
    if len(changed) > len(views) // 4:  # more than a quarter changed: all read costs less
        return None
    decoded = list(was.decoded)
    for i in changed:
        decoded[i] = decode(views[i], was.decoded[i])
        if was.decoded[i].findings or decoded[i].findings or not plain(decoded[i]):
            return None
    phases = _Phases(was)
    warming = (list(was.warming[COLD]), list(was.warming[TIMED]))
    sinces = list(was.sinces)
    unreadable, not_ready = was.unreadable, was.not_ready
    for i in changed:
        before, now = was.decoded[i].node, decoded[i].node
        unreadable += (now.error is not None) - (before.error is not None)
        not_ready += _not_ready(now) - _not_ready(before)
        phases.move(i, before, now)
        old_kind, new_kind = _kind(before), _kind(now)
        if old_kind is not None:
            warming[old_kind].remove(i)
        if new_kind is not None:
            bisect.insort(warming[new_kind], i)
        sinces[i] = now.state.since
    return Nodes(
        views,
        tuple(decoded),
        tuple(tuple(at) for at in phases.at),
        tuple(tuple(nodes) for nodes in phases.nodes),
        was.findings,
        unreadable,
        not_ready,
        (tuple(warming[COLD]), tuple(warming[TIMED])),
        tuple(sinces),
    )


class _Phases:
    """Each phase's positions and nodes, copied from a ``Nodes`` to be changed."""

    def __init__(self, was: Nodes) -> None:
        self.at = [list(at) for at in was.at]
        self.nodes = [list(nodes) for nodes in was.nodes]

    def move(self, i: int, before: Node, now: Node) -> None:
        """Position ``i``'s node ``before`` replaced by ``now``, in its phase's place."""
        old, new = _INDEX[before.phase], _INDEX[now.phase]
        k = bisect.bisect_left(self.at[old], i)
        if old == new:
            self.nodes[old][k] = now
            return
        del self.at[old][k], self.nodes[old][k]
        k = bisect.bisect_left(self.at[new], i)
        self.at[new].insert(k, i)
        self.nodes[new].insert(k, now)


_INDEX = {phase: n for n, phase in enumerate(PHASES)}


def _not_ready(node: Node) -> int:
    return node.phase is Phase.SERVING and not node.view.ready


def _kind(node: Node) -> int | None:
    return warm_kind(node) if node.phase is Phase.SERVING else None
