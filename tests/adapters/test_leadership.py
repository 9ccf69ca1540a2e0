"""Leader election: two candidates against one server (the emulator, then a real kube-apiserver),
on the test's manual clock. The tests whose lease writes fail take the emulator alone
(``emulated``): the failures are injected by its server.

The candidates are stepped one attempt at a time (what ``run`` does every ``retry_period``) while
the test moves the shared ``ManualClock``, so "at any instant" is checked at every step without
waiting on the wall clock. A ``Witness`` listener records what the runtime could see at the
moment ``on_started`` / ``on_stopped`` reach it (the runtime sets ``rebalancer_leader`` there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from rebalancer.adapters import leadership
from rebalancer.adapters.leadership import LeaderElector, Sleep, Timings
from rebalancer.core.model import Term
from rebalancer.errors import ConfigError
from rebalancer.runtime import wiring
from sandbox.emulator.faults import Faults
from sandbox.emulator.resources import LEASES
from tests.support.backends import Opened
from tests.support.emulated import Sandbox
from tests.support.waits import stop

TIMINGS = Timings(lease_duration=15, renew_deadline=10, retry_period=2)
LEASE, NS = "rebalancer", "kube-system"


@dataclass
class Candidate:
    elector: LeaderElector
    started: list[Term] = field(default_factory=list)
    stopped: list[tuple[Term, str]] = field(default_factory=list)

    def may_write(self, box: Opened) -> bool:
        return self.elector.may_write(box.clock())


@asynccontextmanager
async def candidates(box: Opened) -> AsyncIterator[tuple[Candidate, Candidate]]:
    """Two candidates, each with its own client (as two replicas would have)."""
    async with box.another_client() as other:
        yield _candidate(box, box.api, "replica-a"), _candidate(box, other, "replica-b")


def _candidate(
    box: Opened,
    api: Any,
    identity: str,
    sleep: Sleep = asyncio.sleep,
) -> Candidate:
    started: list[Term] = []
    stopped: list[tuple[Term, str]] = []
    elector = LeaderElector(
        api,
        name=LEASE,
        namespace=NS,
        identity=identity,
        timings=TIMINGS,
        clock=box.clock,
        sleep=sleep,
        on_started=started.append,
        on_stopped=lambda term, why: stopped.append((term, why)),
    )
    return Candidate(elector, started, stopped)


def lease(box: Opened) -> dict[str, Any]:
    spec: dict[str, Any] = box.objects.get(LEASES, NS, LEASE)["spec"]
    return spec


def emulator_of(box: Opened) -> Sandbox:
    """The emulator behind ``box``: its faults are what the real server cannot be made to do."""
    assert box.box is not None, "a fault-injecting test runs on the emulator alone"
    return box.box


def check_one_writer(box: Opened, a: Candidate, b: Candidate) -> None:
    writers = [c for c in (a, b) if c.may_write(box)]
    assert len(writers) <= 1
    for writer in writers:
        assert lease(box)["holderIdentity"] == writer.elector.identity


async def failing_writes(box: Opened, candidate: Candidate) -> bool:
    """One attempt whose lease writes the emulator answers with 500 InternalError."""
    faults = emulator_of(box).faults
    faults.configure(Faults(error_rate=1.0))
    try:
        return await candidate.elector.step()
    finally:
        faults.configure(Faults())


async def test_the_first_candidate_creates_the_lease_and_the_other_follows(
    cluster: Opened,
) -> None:
    async with candidates(cluster) as (a, b):
        assert await a.elector.step()
        assert not await b.elector.step()
        check_one_writer(cluster, a, b)
        assert a.started == [Term("replica-a", 0, cluster.clock())]
        assert a.elector.elected.is_set()
        assert not b.elector.elected.is_set()
        assert b.elector.holder == "replica-a"
        spec = lease(cluster)
        assert spec["holderIdentity"] == "replica-a"
        assert spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        for _ in range(20):  # a healthy holder keeps it
            cluster.advance(TIMINGS.retry_period)
            assert await a.elector.step()
            assert not await b.elector.step()
            check_one_writer(cluster, a, b)
        assert a.stopped == []
        assert b.started == []


async def test_a_holder_that_cannot_renew_stops_writing_before_the_other_takes_over(
    emulated: Opened,
) -> None:
    async with candidates(emulated) as (a, b):
        await a.elector.step()
        await b.elector.step()
        renewed = emulated.clock()
        stopped_at = taken_at = None
        while taken_at is None:
            emulated.advance(1)
            await failing_writes(emulated, a)
            check_one_writer(emulated, a, b)
            if stopped_at is None and not a.may_write(emulated):
                stopped_at = emulated.clock()
            if await b.elector.step():
                taken_at = emulated.clock()
            check_one_writer(emulated, a, b)

        assert stopped_at is not None
        assert (stopped_at - renewed).total_seconds() == TIMINGS.renew_deadline
        assert (taken_at - renewed).total_seconds() == TIMINGS.lease_duration
        assert [why for _, why in a.stopped] == ["not renewed within renew_deadline (10s)"]
        assert b.started == [Term("replica-b", 1, taken_at)]
        assert lease(emulated)["holderIdentity"] == "replica-b"
        # The old holder, back in touch, sees the new one and does not write.
        emulated.advance(1)
        assert not await a.elector.step()
        assert a.elector.holder == "replica-b"
        check_one_writer(emulated, a, b)


async def test_a_holder_whose_renewals_fail_for_a_while_keeps_the_lease(
    emulated: Opened,
) -> None:
    async with candidates(emulated) as (a, b):
        await a.elector.step()
        await b.elector.step()
        for _ in range(4):  # 8 s of failures: inside the renew deadline
            emulated.advance(TIMINGS.retry_period)
            assert await failing_writes(emulated, a)
            assert not await b.elector.step()
            check_one_writer(emulated, a, b)
        emulated.advance(TIMINGS.retry_period)
        assert await a.elector.step()
        assert a.may_write(emulated)
        assert a.stopped == []
        assert a.elector.term == Term("replica-a", 0, a.started[0].acquired)


async def test_a_paused_holder_stops_writing_and_the_other_waits_for_expiry(
    cluster: Opened,
) -> None:
    async with candidates(cluster) as (a, b):
        await a.elector.step()
        await b.elector.step()
        for second in range(1, 16):
            cluster.advance(1)  # a is paused: it takes no step at all
            assert a.may_write(cluster) == (second < TIMINGS.renew_deadline)
            assert await b.elector.step() == (second >= TIMINGS.lease_duration)
            check_one_writer(cluster, a, b)
        assert lease(cluster)["holderIdentity"] == "replica-b"
        assert lease(cluster)["leaseTransitions"] == 1


async def test_a_graceful_release_hands_over_at_once(cluster: Opened) -> None:
    async with candidates(cluster) as (a, b):
        await a.elector.step()
        await b.elector.step()
        cluster.advance(1)
        assert await a.elector.release()
        assert not a.may_write(cluster)
        assert a.stopped[-1][1] == "released"
        assert lease(cluster)["holderIdentity"] == ""
        assert await b.elector.step()  # at the same instant
        check_one_writer(cluster, a, b)
        assert b.elector.term is not None
        assert b.elector.term.number == 1


async def test_of_two_candidates_racing_for_an_expired_lease_only_one_wins(
    cluster: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.objects.create(LEASES, NS, _lease_held_by("crashed-replica"))
    async with candidates(cluster) as (a, b):
        assert not await a.elector.step()
        assert not await b.elector.step()
        cluster.advance(TIMINGS.lease_duration)  # expired for both
        leases = b.elector._leases  # the typed API the elector writes through
        replace = leases.replace_namespaced_lease

        async def a_writes_between_read_and_write(*args: Any, **kwargs: Any) -> Any:
            assert await a.elector.step()
            return await replace(*args, **kwargs)

        monkeypatch.setattr(leases, "replace_namespaced_lease", a_writes_between_read_and_write)
        assert not await b.elector.step()  # its update carried a stale resourceVersion: 409
        check_one_writer(cluster, a, b)
        assert lease(cluster)["holderIdentity"] == "replica-a"
        assert lease(cluster)["leaseTransitions"] == 4


async def test_two_processes_started_with_the_same_pod_name_never_lead_at_once(
    cluster: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copied environment, or ``rebalancer run`` started with ``kubectl exec`` in the pod:
    # each process makes its identity as the composition root does, from the same POD_NAME.
    monkeypatch.setenv("POD_NAME", "dup")
    first, second = wiring.identity(), wiring.identity()
    async with cluster.another_client() as other:
        a = _candidate(cluster, cluster.api, first)
        b = _candidate(cluster, other, second)
        assert await a.elector.step()
        assert not await b.elector.step()  # not its own lease: it waits, as any candidate
        check_one_writer(cluster, a, b)
        for _ in range(20):
            cluster.advance(TIMINGS.retry_period)
            assert await a.elector.step()
            assert not await b.elector.step()
            check_one_writer(cluster, a, b)
        for elapsed in range(1, 16):  # a is paused: b takes over once the lease expires
            cluster.advance(1)
            assert await b.elector.step() == (elapsed >= TIMINGS.lease_duration)
            check_one_writer(cluster, a, b)
        assert not await a.elector.step()  # back, it sees b hold the lease
        check_one_writer(cluster, a, b)
        assert a.stopped[-1][1] == f"lease taken by {second}"
        assert await b.elector.release()
        assert await a.elector.step()
        check_one_writer(cluster, a, b)
    assert first != second
    assert [leadership.pod_of(first), leadership.pod_of(second)] == ["dup", "dup"]
    assert [(t.holder, t.number) for t in a.started] == [(first, 0), (first, 2)]
    assert [(t.holder, t.number) for t in b.started] == [(second, 1)]


def test_an_identity_names_its_pod_and_one_of_the_last_release_is_its_own_pod() -> None:
    made = leadership.process_identity("rebalancer-7c4b9-aaaaa")
    assert made.startswith("rebalancer-7c4b9-aaaaa_")
    assert leadership.pod_of(made) == "rebalancer-7c4b9-aaaaa"
    assert leadership.pod_of("rebalancer-7c4b9-aaaaa") == "rebalancer-7c4b9-aaaaa"
    assert leadership.pod_of("host_not-a-uuid") == "host_not-a-uuid"
    assert wiring.identity({}).startswith(wiring.pod_name({}) + "_")


def test_a_pod_name_too_long_for_the_audit_log_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"POD_NAME='p+… \(230 characters\).* 267 characters"):
        leadership.process_identity("p" * 230)


def _lease_held_by(holder: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": NS},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-03-02T11:00:00.000000Z",
            "renewTime": "2026-03-02T11:59:59.000000Z",
            "leaseTransitions": 3,
        },
    }


async def test_cancelling_run_releases_the_lease(cluster: Opened) -> None:
    parked = asyncio.Event()

    async def park(_: float) -> None:
        await parked.wait()  # never set: run waits here until cancelled

    a = _candidate(cluster, cluster.api, "replica-a", sleep=park)
    task = asyncio.create_task(a.elector.run())
    await asyncio.wait_for(a.elector.elected.wait(), 5)
    await stop(task)
    assert lease(cluster)["holderIdentity"] == ""
    assert not a.elector.elected.is_set()


async def test_a_holder_that_finds_another_name_in_the_lease_stops_at_once(
    cluster: Opened,
) -> None:
    async with candidates(cluster) as (a, _):
        await a.elector.step()
        current = cluster.objects.get(LEASES, NS, LEASE)
        current["spec"]["holderIdentity"] = "intruder"
        cluster.objects.replace(LEASES, NS, LEASE, current)
        cluster.advance(TIMINGS.retry_period)
        assert not await a.elector.step()
        assert not a.may_write(cluster)
        assert [why for _, why in a.stopped] == ["lease taken by intruder"]
        assert lease(cluster)["holderIdentity"] == "intruder"


# ---------------------------------------------------------------------------------------------
# The listeners: told of every change of leadership, at the right moment


@dataclass(frozen=True)
class Seen:
    """One call of a listener: what it was told and what was true at that moment."""

    leading: bool
    lease_holder: str  # the Lease as the API server had it
    may_write: bool


@dataclass
class Witness:
    elector: LeaderElector
    seen: list[Seen]
    terms: list[int]  # the term number each on_started was given


def witnessed(box: Opened, api: Any, identity: str, sleep: Sleep = asyncio.sleep) -> Witness:
    """A candidate whose listeners record what was true at the moment they were called."""
    seen: list[Seen] = []
    terms: list[int] = []

    def see(leading: bool) -> None:
        holder = lease(box)["holderIdentity"]
        seen.append(Seen(leading, holder, elector.may_write(box.clock())))

    def started(term: Term) -> None:
        terms.append(term.number)
        see(leading=True)

    elector = LeaderElector(
        api,
        name=LEASE,
        namespace=NS,
        identity=identity,
        timings=TIMINGS,
        clock=box.clock,
        sleep=sleep,
        on_started=started,
        on_stopped=lambda _term, _why: see(leading=False),
    )
    return Witness(elector, seen, terms)


async def test_the_listener_hears_of_a_win_once_the_lease_names_the_winner_and_not_of_renewals(
    cluster: Opened,
) -> None:
    a = witnessed(cluster, cluster.api, "replica-a")
    assert await a.elector.step()  # creates the Lease
    assert a.seen == [Seen(leading=True, lease_holder="replica-a", may_write=True)]
    for _ in range(5):
        cluster.advance(TIMINGS.retry_period)
        assert await a.elector.step()
    assert len(a.seen) == 1


async def test_the_listener_hears_of_a_missed_deadline_at_once_and_of_the_lease_won_back(
    emulated: Opened,
) -> None:
    a = witnessed(emulated, emulated.api, "replica-a")
    await a.elector.step()
    renewed = emulated.clock()
    while len(a.seen) == 1:  # every lease write answered 500
        emulated.advance(1)
        emulator_of(emulated).faults.configure(Faults(error_rate=1.0))
        try:
            await a.elector.step()
        finally:
            emulator_of(emulated).faults.configure(Faults())
    # Told at the step that found the deadline passed, and by then no longer allowed to write.
    assert (emulated.clock() - renewed).total_seconds() == TIMINGS.renew_deadline
    assert a.seen[-1] == Seen(leading=False, lease_holder="replica-a", may_write=False)
    emulated.advance(1)
    assert await a.elector.step()  # nobody else came: the same replica leads again
    assert a.seen[-1] == Seen(leading=True, lease_holder="replica-a", may_write=True)
    assert a.terms == [0, 1]  # a new stretch, told as one


async def test_the_listener_hears_of_a_lease_taken_by_another_at_the_next_step(
    cluster: Opened,
) -> None:
    async with cluster.another_client() as other:
        a = witnessed(cluster, cluster.api, "replica-a")
        b = witnessed(cluster, other, "replica-b")
        await a.elector.step()
        await b.elector.step()  # b sees the record: its expiry counts from here
        cluster.advance(TIMINGS.lease_duration)  # a is paused; the lease expires for b
        assert await b.elector.step()
        assert b.seen == [Seen(leading=True, lease_holder="replica-b", may_write=True)]
        assert await a.elector.step() is False
        assert a.seen[-1] == Seen(leading=False, lease_holder="replica-b", may_write=False)


async def test_the_listener_hears_of_a_release_before_the_lease_is_freed(
    cluster: Opened,
) -> None:
    parked = asyncio.Event()

    async def park(_: float) -> None:
        await parked.wait()  # never set: run waits here until cancelled

    a = witnessed(cluster, cluster.api, "replica-a", sleep=park)
    task = asyncio.create_task(a.elector.run())
    await asyncio.wait_for(a.elector.elected.wait(), 5)
    await stop(task)  # cancelling run releases the lease
    assert a.seen == [
        Seen(leading=True, lease_holder="replica-a", may_write=True),
        Seen(leading=False, lease_holder="replica-a", may_write=False),  # before the release
    ]
    assert lease(cluster)["holderIdentity"] == ""


async def test_a_listener_that_raises_changes_nothing_in_the_election(
    cluster: Opened, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(*_: object) -> None:
        raise RuntimeError("listener broken")

    a = LeaderElector(
        cluster.api,
        name=LEASE,
        namespace=NS,
        identity="replica-a",
        timings=TIMINGS,
        clock=cluster.clock,
        on_started=fail,
        on_stopped=fail,
    )
    assert await a.step()
    cluster.advance(TIMINGS.retry_period)
    assert await a.step()  # renewed: the failed listener did not count as a failed attempt
    assert await a.release()  # and it did not skip the release write
    assert lease(cluster)["holderIdentity"] == ""
    assert caplog.text.count("a leadership listener failed") == 2
