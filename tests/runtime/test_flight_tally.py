"""A pool's ``flight.tally`` counts and picks out what the passes it stands for did, node by
node: ``core.tick``'s lent and kept counts, the nodes a tick drives on, the loans, and the
deadlines of the reclaims."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model, nodestate, tick
from rebalancer.core.model import NodeView
from rebalancer.runtime import flight
from tests.support.factories import KEYS, LEND_SPEC, T0, begin_reclaim, lend, lending, serving


def noticed(view: NodeView) -> NodeView:
    return nodestate.apply(view, nodestate.notice(KEYS, T0 + timedelta(minutes=5), "dec-1"))


def test_a_tally_is_what_each_node_read_alone_comes_to() -> None:
    lent = LEND_SPEC.add_taints
    earlier = T0 - timedelta(hours=1)
    nodes = (
        serving("s-0"),
        dataclasses.replace(lend(serving("l-0"), earlier), uid="uid-l-0"),
        lend(serving("l-1"), earlier),  # no UID: no loan to follow
        noticed(dataclasses.replace(lend(serving("n-0"), earlier), uid="uid-n-0")),
        lending(serving("g-0")),
        begin_reclaim(lend(serving("r-0"), earlier), T0, timedelta(minutes=2)),
        begin_reclaim(lend(serving("r-1"), earlier), T0, timedelta(minutes=9)),
        dataclasses.replace(serving("u-0"), labels={KEYS.state: "no-such-phase"}),
    )
    counted = flight.tally(nodes, KEYS, lent)
    pool = model.PoolSnapshot(nodes=nodes)

    assert counted.lent == tick.lent_count(pool, KEYS, lent) == 5
    assert counted.kept == tick.kept_count(pool, KEYS, lent) == 4
    assert [v.name for v, _ in counted.driven] == [
        v.name for v in nodes if flight.driven(v, KEYS, lent)
    ]
    assert [v.name for v, _ in counted.driven] == ["n-0", "g-0", "r-0", "r-1"]
    assert [v.name for v in counted.loans] == ["l-0", "n-0"]
    assert counted.deadlines == (T0 + timedelta(minutes=2), T0 + timedelta(minutes=9))
    assert counted.left == ()
    assert flight.tally(nodes, KEYS, lent) is counted  # once for the very same nodes
    again = flight.tally((*nodes[:-1], serving("u-0")), KEYS, lent)  # the same nodes but one
    assert again is not counted
    assert again.lent == 4
