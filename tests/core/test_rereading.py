"""A pool's nodes read again only where they changed (``planning.rereading``) read as every node
read from scratch does (``reading._read_nodes``, the way a pool with an orphan is read),
through heartbeats, lends and reclaims, readiness and warmth, findings, overrides with an end,
nodes that appear, go or move, at several times."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from rebalancer.core import model
from rebalancer.core.model import NodeView, PoolName
from rebalancer.core.planning import reading, rereading
from rebalancer.core.planning.draft import DecodedNode, Pool
from tests.support.factories import (
    KEYS,
    T0,
    begin_reclaim,
    demand,
    finish,
    inference_pod,
    lend,
    lending,
    policy,
    pool_snapshot,
    returned,
    serving,
    with_overrides,
)

NAME = PoolName("chat")
POLICY = policy(warmup=timedelta(minutes=10))
EARLIER = T0 - timedelta(hours=2)
PLAIN = tuple(serving(f"z-{i}") for i in range(60))  # unchanged: read from the last reading


def read(nodes: tuple[NodeView, ...], minutes: int) -> Pool:
    """The pool at ``minutes`` after T0, read as the planner reads it, checked against the
    same pool read from scratch."""
    now = T0 + timedelta(minutes=minutes)
    snapshot = pool_snapshot(nodes, demand(10.0, now=now))
    got = reading.read_pool(now, NAME, snapshot, POLICY, KEYS, False, False)
    # An orphan named that no node has: the pool is read node by node, and reads the same.
    scratch = dataclasses.replace(snapshot, orphans=frozenset({model.NodeName("elsewhere")}))
    want = reading.read_pool(now, NAME, scratch, POLICY, KEYS, False, False)
    assert got == want
    return got


def beat(view: NodeView) -> NodeView:
    return dataclasses.replace(view, resource_version=f"{view.resource_version}+")


def test_nodes_read_again_where_they_changed_read_as_every_node_read_afresh() -> None:
    ready_pod = dataclasses.replace(inference_pod("llm-a"), ready=True)
    cold_pod = dataclasses.replace(inference_pod("llm-b"), ready=False)
    nodes = (
        serving("a-0"),
        serving("a-1", ready=False),
        serving("a-2", pods=(ready_pod,)),
        serving("a-3", pods=(cold_pod,)),  # its replica not Ready: cold
        returned("a-4", EARLIER, T0 - timedelta(minutes=5)),  # warm 5 minutes from now
        lend(serving("a-5"), EARLIER),
        lending(serving("a-6")),
        begin_reclaim(lend(serving("a-7"), EARLIER), T0),
        serving("a-8"),
        serving("a-9"),
        *PLAIN,
    )
    first = read(nodes, 0)
    assert first.warming == {"a-3", "a-4"}
    assert first.not_ready == 1
    assert read(nodes, 6).warming == {"a-3"}  # a-4 warm by now

    # Heartbeats, a lend, a reclaim that finishes, readiness lost and found: read again alone.
    changed = (
        beat(nodes[0]),
        serving("a-1"),
        nodes[2],
        serving("a-3", pods=(dataclasses.replace(cold_pod, ready=True),)),  # warm now
        beat(nodes[4]),
        begin_reclaim(nodes[5], T0 + timedelta(minutes=1)),
        lend(serving("a-6"), T0),
        finish(nodes[7], T0 + timedelta(minutes=1)),
        returned("a-8", EARLIER, T0 + timedelta(hours=1)),  # since ahead of the clock
        lend(serving("a-9"), T0),
        *PLAIN[:-2],
        beat(PLAIN[-2]),  # heartbeats: decoded as before, with the new view
        beat(PLAIN[-1]),
    )
    was = next(r for k, r in reading._READS.items() if k[0] == NAME and r.views is nodes)

    def decode(view: NodeView, _: object) -> DecodedNode:
        return reading._decode(view, KEYS, POLICY.zone, POLICY.lend_spec)

    assert rereading.again(was, changed, decode) is not None  # the way it is read
    pool = read(changed, 2)
    assert pool.warming == {"a-4", "a-7", "a-8"}
    assert pool.not_ready == 0
    assert pool.future == {"a-8"}
    assert read(changed, 12).warming == {"a-8"}

    # A bad override (a finding), an override with an end, then both gone: read afresh.
    bad = (with_overrides(changed[0], lend="sometimes"), *changed[1:])
    assert read(bad, 3).findings
    until = with_overrides(changed[0], lend="never", override_until="2026-03-02T12:05:00Z")
    ending = (until, *changed[1:])
    assert read(ending, 3) != read(ending, 6)  # the override lapses at 12:05
    read(changed, 7)

    # Nodes that go, come, or stand in other places.
    read(changed[1:], 8)
    read((*changed, serving("a-10")), 9)
    read((*changed[1:], changed[0]), 10)
    read((changed[1], changed[0], *changed[2:]), 11)  # two names swap places
