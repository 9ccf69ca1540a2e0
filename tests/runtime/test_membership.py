"""The pools' membership judged again only where nodes changed (``membership.Judge``) is the one
judged from scratch (``membership.judge``), view for view, through heartbeats, nodes that move
between pools, appear and go, overlaps, orphans and a change of the pools' configuration."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rebalancer.adapters import registry
from rebalancer.core import model
from rebalancer.core.model import NodeView, PodMarks, PoolName
from rebalancer.runtime.membership import Judge, Membership, judge
from rebalancer.runtime.seams import PoolConfig
from tests.support.factories import INFERENCE_TAINT, KEYS, LEND_SPEC, lend, policy, serving

A, B, C = PoolName("a"), PoolName("b"), PoolName("c")
OWN_MARKS = PodMarks(lend_taints=(), serving_taints=(INFERENCE_TAINT,))  # pool c's own views


def pool(name: PoolName, selector: Mapping[str, str], marks: PodMarks | None = None) -> PoolConfig:
    return PoolConfig(
        name=name,
        node_selector=selector,
        policy=policy(),
        marks=marks or PodMarks(lend_taints=LEND_SPEC.add_taints),
        strategy=registry.build("reactive"),
        strategy_name="reactive",
    )


def node(name: str, **labels: str) -> NodeView:
    view = serving(name)
    return dataclasses.replace(view, labels={**view.labels, **labels})


def beat(view: NodeView) -> NodeView:
    """The node after a heartbeat: another object, and another resourceVersion."""
    return dataclasses.replace(view, resource_version=f"{view.resource_version}+")


class Cluster:
    """The nodes by name, and each pool's views: pool c's under marks of its own (other
    objects for the same nodes, as the informer keeps them)."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.nodes = {str(v.name): v for v in nodes}
        self.own = {name: dataclasses.replace(v) for name, v in self.nodes.items()}

    def set(self, view: NodeView, *, own_too: bool = True) -> None:
        self.nodes[str(view.name)] = view
        if own_too:
            self.own[str(view.name)] = dataclasses.replace(view)

    def drop(self, name: str) -> None:
        del self.nodes[name], self.own[name]

    def every(self, pools: Sequence[PoolConfig]) -> dict[PoolName, tuple[NodeView, ...]]:
        shared = tuple(self.nodes[n] for n in sorted(self.nodes))
        own = tuple(self.own[n] for n in sorted(self.own))
        return {p.name: own if p.marks == OWN_MARKS else shared for p in pools}


def same(judged: Judge, pools: tuple[PoolConfig, ...], cluster: Cluster) -> Membership:
    """``judged``'s membership, checked against the one from scratch view for view."""
    every = cluster.every(pools)
    got = judged.membership(pools, KEYS, every)
    want = judge(pools, KEYS, every)
    assert got == want
    ids = {p: [id(v) for v in views] for p, views in got.members.items()}
    assert ids == {p: [id(v) for v in views] for p, views in want.members.items()}
    assert list(got.overlaps) == list(want.overlaps)
    assert [list(o) for o in got.overlaps.values()] == [list(o) for o in want.overlaps.values()]
    return got


def test_membership_judged_again_where_nodes_changed_is_the_one_from_scratch() -> None:
    pools = (pool(A, {"pool": "a"}), pool(B, {"pool": "b"}), pool(C, {"gpu": "x"}, OWN_MARKS))
    orphan = lend(node("o-0", pool="gone"), spec=LEND_SPEC)  # our keys, no pool selects it
    cluster = Cluster(
        [
            *(node(f"a-{i}", pool="a") for i in range(6)),
            *(node(f"b-{i}", pool="b") for i in range(6)),
            *(node(f"t-{i}") for i in range(3)),  # in no pool, none of our keys
            *(node(f"c-{i}", gpu="x") for i in range(2)),
            node("shared", pool="a", gpu="x"),  # a's, and c's too: an overlap
            orphan,
        ]
    )
    judged = Judge()
    first = same(judged, pools, cluster)
    assert first.orphans == {A: frozenset({"o-0"})}
    assert first.overlaps == {A: {"shared": (C,)}}

    # Heartbeats on members and on nodes of no pool: judged again alone; b's members, none
    # of them changed, are the very tuple of before (as no judging from scratch gives).
    for name in ("a-1", "a-4", "t-0", "b-2"):
        cluster.set(beat(cluster.nodes[name]), own_too=name != "b-2")
    beaten = same(judged, pools, cluster)
    assert beaten.members[C] is first.members[C]
    cluster.set(beat(cluster.nodes["a-2"]))
    assert same(judged, pools, cluster).members[B] is beaten.members[B]

    cluster.set(node("b-3", pool="a"))  # moves from b to a
    cluster.set(beat(cluster.nodes["a-0"]))
    same(judged, pools, cluster)
    cluster.set(node("a-9", pool="a"))  # appears
    same(judged, pools, cluster)
    cluster.drop("a-5")  # goes
    same(judged, pools, cluster)
    cluster.drop("a-4")  # goes as another appears: as many views, other names in places
    cluster.set(node("a-8", pool="a"))
    same(judged, pools, cluster)
    del cluster.own["t-2"]  # not among c's views (one of its pods unreadable, say)
    cluster.set(beat(cluster.nodes["t-2"]), own_too=False)
    same(judged, pools, cluster)
    cluster.set(beat(cluster.nodes["t-2"]), own_too=False)
    same(judged, pools, cluster)
    cluster.set(beat(cluster.nodes["shared"]))  # an overlap that changed
    same(judged, pools, cluster)
    cluster.set(beat(cluster.nodes["o-0"]))  # an orphan that changed
    same(judged, pools, cluster)
    cluster.set(lend(cluster.nodes["t-1"], spec=LEND_SPEC))  # of no pool, now an orphan
    assert "t-1" in same(judged, pools, cluster).orphans[A]
    # Of no pool, with a taint or an annotation of ours alone: an orphan too.
    ours = model.Taint(key=f"{KEYS.prefix}lent", value="x", effect="NoSchedule")
    t0 = cluster.nodes["t-0"]
    cluster.set(dataclasses.replace(t0, taints=(*t0.taints, ours)))
    assert "t-0" in same(judged, pools, cluster).orphans[A]
    cluster.set(node("t-3"))
    same(judged, pools, cluster)
    cluster.set(dataclasses.replace(node("t-3"), annotations={KEYS.original: "garbled"}))
    assert "t-3" in same(judged, pools, cluster).orphans[A]
    cluster.set(node("a-3", pool="a", gpu="x"))  # into an overlap
    assert "a-3" in same(judged, pools, cluster).overlaps[A]

    # Another configuration: b selects by another label; a node changes with it.
    other = (pools[0], pool(B, {"gpu": "y"}), pools[2])
    cluster.set(node("b-0", pool="b", gpu="y"))
    same(judged, other, cluster)
    cluster.set(beat(cluster.nodes["b-0"]))
    same(judged, other, cluster)
    same(judged, pools, cluster)


def test_a_pool_that_selects_nothing_and_no_pools_are_judged_as_from_scratch() -> None:
    cluster = Cluster([node("a-0", pool="a"), node("t-0")])
    judged = Judge()
    pools = (pool(A, {"pool": "a"}), pool(B, {"pool": "none"}))
    same(judged, pools, cluster)
    cluster.set(beat(cluster.nodes["t-0"]))
    assert same(judged, pools, cluster).members[B] == ()
    assert same(judged, (), cluster) == Membership()


def test_views_in_another_order_or_with_a_name_twice_are_judged_as_from_scratch() -> None:
    # The informer holds one view a name, in the names' order, and settings name each pool
    # once; a source or pools that did otherwise are still answered as from scratch.
    x, y = node("a-0", pool="a", gpu="x"), node("a-1", pool="a")
    bx = beat(x)
    for pools in ((pool(A, {"pool": "a"}),), (pool(A, {"pool": "a"}), pool(A, {"gpu": "x"}))):
        judged = Judge()
        for views in ((x, y), (y, x), (x, bx), (beat(bx), bx), (y, bx), (y, beat(bx))):
            got = judged.membership(pools, KEYS, {A: views})
            want = judge(pools, KEYS, {A: views})
            assert got == want
            assert [id(v) for v in got.members[A]] == [id(v) for v in want.members[A]]
