"""A pool's ``flight.tally`` counts and picks out what the passes it stands for did, node by
node: ``core.tick``'s lent and kept counts, the nodes a tick drives on, the loans, and the
deadlines of the reclaims."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model, nodestate, tick, victims
from rebalancer.core.model import NodeView
from rebalancer.core.nodestate import Phase
from rebalancer.runtime import flight
from tests.support.factories import (
    KEYS,
    LEND_SPEC,
    T0,
    begin_reclaim,
    borrowed_pod,
    lend,
    lending,
    serving,
)


def noticed(view: NodeView) -> NodeView:
    return nodestate.apply(view, nodestate.notice(KEYS, T0 + timedelta(minutes=5), "dec-1"))


LENT = LEND_SPEC.add_taints
PLAIN = tuple(serving(f"z-{i}") for i in range(30))  # unchanged: a tally is made from the last
EARLIER = T0 - timedelta(hours=1)


def left_on(name: str) -> NodeView:
    """A node created at T0 with a borrowed pod bound to its name before: an earlier node's."""
    pod = dataclasses.replace(borrowed_pod("job"), bound=T0 - timedelta(minutes=1))
    return dataclasses.replace(serving(name), created=T0, pods=(pod,))


def agrees(counted: flight.Tally, nodes: tuple[NodeView, ...]) -> None:
    """``counted`` is what reading each of ``nodes`` alone comes to."""
    pool = model.PoolSnapshot(nodes=nodes)
    assert counted.nodes is nodes
    assert counted.lent == tick.lent_count(pool, KEYS, LENT)
    assert counted.kept == tick.kept_count(pool, KEYS, LENT)
    assert [v for v, _ in counted.driven] == [v for v in nodes if flight.driven(v, KEYS, LENT)]
    lent = [v for v in nodes if tick.phase(v, KEYS, LENT) is Phase.LENT and v.uid]
    assert list(counted.loans) == lent
    assert [v for v, _ in counted.left] == [v for v in nodes if victims.left_by_earlier_node(v)]
    states = [nodestate.read_in_pool(v, KEYS, LENT) for v in nodes]
    assert list(counted.deadlines) == [
        s.deadline
        for s in states
        if isinstance(s, nodestate.NodeState) and s.phase is Phase.RECLAIMING
    ]


def test_a_tally_is_what_each_node_read_alone_comes_to() -> None:
    nodes = (
        serving("s-0"),
        dataclasses.replace(lend(serving("l-0"), EARLIER), uid="uid-l-0"),
        lend(serving("l-1"), EARLIER),  # no UID: no loan to follow
        noticed(dataclasses.replace(lend(serving("n-0"), EARLIER), uid="uid-n-0")),
        lending(serving("g-0")),
        begin_reclaim(lend(serving("r-0"), EARLIER), T0, timedelta(minutes=2)),
        begin_reclaim(lend(serving("r-1"), EARLIER), T0, timedelta(minutes=9)),
        dataclasses.replace(serving("u-0"), labels={KEYS.state: "no-such-phase"}),
        left_on("e-0"),
        *PLAIN,
    )
    counted = flight.tally(nodes, KEYS, LENT)
    agrees(counted, nodes)
    assert (counted.lent, counted.kept) == (5, 4)
    assert [v.name for v, _ in counted.driven] == ["n-0", "g-0", "r-0", "r-1"]
    assert [v.name for v in counted.loans] == ["l-0", "n-0"]
    assert counted.deadlines == (T0 + timedelta(minutes=2), T0 + timedelta(minutes=9))
    assert [v.name for v, _ in counted.left] == ["e-0"]
    assert flight.tally(nodes, KEYS, LENT) is counted  # once for the very same nodes

    # The next tick's nodes: some changed in place (each mark gained or lost), read from the
    # last tally; then names in other places, read from scratch.
    changed = (
        dataclasses.replace(lend(nodes[0], EARLIER), uid="uid-s-0"),
        begin_reclaim(nodes[1], T0, timedelta(minutes=1)),
        dataclasses.replace(nodes[2], uid="uid-l-1"),  # a loan to follow now
        dataclasses.replace(lend(serving("n-0"), EARLIER), uid="uid-n-0"),  # notice withdrawn
        lend(serving("g-0"), EARLIER),
        *nodes[5:7],
        serving("u-0"),
        dataclasses.replace(nodes[8], resource_version="2"),  # a heartbeat: the same facts
        *PLAIN,
    )
    assert flight._again(counted, changed, KEYS, LENT) is not None  # the way it is made
    agrees(flight.tally(changed, KEYS, LENT), changed)
    moved = (changed[1], changed[0], *changed[2:])  # two names swap places
    assert flight._again(flight.tally(changed, KEYS, LENT), moved, KEYS, LENT) is None
    agrees(flight.tally(moved, KEYS, LENT), moved)
