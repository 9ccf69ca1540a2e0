"""The demo's training jobs: gangs placed whole, restarted whole, and the two checks that must
never fire in the demo (a half-running gang, a pod on a GPU it refuses) do fire when it happens."""

from __future__ import annotations

import json
from datetime import timedelta

from rebalancer.core import nodestate
from sandbox import training
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import MERGE_PATCH, DeleteOptions, Store
from tests.support.factories import T0

PAIR = training.Kind("pair", training.KINDS[0].needs, 8, (2,), (1.0, 1.0), 1)


def _store() -> tuple[ManualClock, Store]:
    clock = ManualClock(T0)
    store = Store(clock, seed=1)
    cluster.seed(store, cluster.HETEROGENEOUS)
    return clock, store


def _bound(store: Store) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in store.peek(PODS)
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


def test_each_kind_fits_only_the_gpus_it_asks_for() -> None:
    fits = {k.name: {p.name for p in cluster.HETEROGENEOUS if k.fits(p)} for k in training.KINDS}
    assert fits == {"48gb": {"l20", "a100"}, "turing": {"t4"}, "hopper": set()}


def test_a_gang_runs_whole_and_restarts_whole_from_its_last_checkpoint() -> None:
    clock, store = _store()
    jobs = training.Training(store, cluster.HETEROGENEOUS, kinds=[PAIR])
    jobs.step()
    assert sorted(_bound(store).values()) == ["a100-0", "a100-1"]
    (job,) = jobs.jobs.values()
    clock.advance(45 * 60)
    victim = f"{job.name}-0-0"
    store.delete(PODS, cluster.TRAINING_NAMESPACE, victim, DeleteOptions(grace_period=0))
    jobs.step()
    (broken,) = jobs.record.broken
    assert (broken.running, broken.size) == (1, 2)
    (preempted,) = jobs.record.preemptions
    assert preempted.lost_gpu_hours == 15 / 60 * 16  # 15 min past the 30-min checkpoint
    assert (job.attempt, job.done) == (1, timedelta(minutes=30))
    clock.advance(60)  # the other pod's grace period ends; the restart is placed whole
    jobs.step()
    mine = sorted(name for name in _bound(store) if name.startswith(job.name))
    assert mine == [f"{job.name}-1-0", f"{job.name}-1-1"]
    assert len(jobs.record.broken) == 1


def test_a_pod_on_a_node_whose_gpu_its_affinity_refuses_is_counted() -> None:
    clock, store = _store()
    jobs = training.Training(store, cluster.HETEROGENEOUS, kinds=[PAIR])
    jobs.step()
    assert jobs.record.misplaced == []
    node = store.get(NODES, None, "a100-0")
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "16384"
    store.replace(NODES, None, "a100-0", node)
    jobs.check(clock())
    assert [m.node for m in jobs.record.misplaced] == ["a100-0"]


def _lend(store: Store, name: str) -> None:
    """The node as a lend leaves it: its serving taint swapped for the lent one."""
    node = store.get(NODES, None, name)
    node["spec"]["taints"] = [cluster.LEND_TAINT]
    store.replace(NODES, None, name, node)


def _fill(store: Store, *names: str) -> None:
    """Each node's GPUs taken by a one-pod job the demo's queue does not know."""
    for name in names:
        pod = cluster.training_pod(f"other-{name}", 0, gpus=8, priority_class=None)
        pod["spec"]["nodeName"] = name
        cluster.add(store, pod)


def _gang_on(clock: ManualClock, store: Store, lent: tuple[str, ...]) -> training.Training:
    """A job of two pods placed by the scheduler on the nodes left free: every A100 full but
    the last ``2 - len(lent)``, ``lent`` lent; then 45 minutes of running."""
    for name in lent:
        _lend(store, name)
    _fill(store, *(f"a100-{i}" for i in range(4 - (2 - len(lent)))))
    jobs = training.Training(store, cluster.HETEROGENEOUS, kinds=[PAIR], lenders=["l20", "t4"])
    jobs.step()
    (job,) = jobs.jobs.values()
    assert job.started is not None
    clock.advance(45 * 60)
    return jobs


def _take(store: Store, job: str, node: str) -> None:
    """The job's pod on ``node`` removed, as a reclaim's drain removes it."""
    name = next(k for k, v in _bound(store).items() if k.startswith(job) and v == node)
    store.delete(PODS, cluster.TRAINING_NAMESPACE, name, DeleteOptions(grace_period=0))


def test_a_gang_whose_other_pod_runs_on_a_node_no_pool_lends_is_preempted_not_half_running() -> (
    None
):
    # A reclaim of the lent L20 cannot reach the A100 pod: the controller never touches a node
    # it did not lend. The job's operator restarts it; it is preempted, not left half-running.
    clock, store = _store()
    jobs = _gang_on(clock, store, ("l20-2",))
    (job,) = jobs.jobs.values()
    assert {v for k, v in _bound(store).items() if k.startswith(job.name)} == {"a100-3", "l20-2"}
    _take(store, job.name, "l20-2")
    jobs.step()
    assert jobs.record.broken == []
    assert [p.job for p in jobs.record.preemptions] == [job.name]
    assert job.attempt == 1  # restarted whole by its operator


def test_a_gang_that_loses_a_pod_while_another_runs_on_a_lent_node_is_half_running() -> None:
    # What the controller's gang rule forbids: one lent node of the job taken back, the other
    # left lent with the job's pod running on it.
    clock, store = _store()
    jobs = _gang_on(clock, store, ("l20-2", "l20-3"))
    (job,) = jobs.jobs.values()
    assert {v for k, v in _bound(store).items() if k.startswith(job.name)} == {"l20-2", "l20-3"}
    _take(store, job.name, "l20-2")
    jobs.step()
    (broken,) = jobs.record.broken
    assert (broken.job, broken.running, broken.size) == (job.name, 1, 2)


def _tell(store: Store, job: str, reclaim: str | None) -> None:
    """What the controller's actuator writes on a noticed node's borrowed pods (and removes
    when the notice is withdrawn): the reclaim id."""
    keys = nodestate.Keys()
    value = None if reclaim is None else reclaim
    body = json.dumps({"metadata": {"annotations": {keys.reclaim_id: value}}}).encode()
    for pod in store.peek(PODS):
        if pod["metadata"]["name"].startswith(job) and pod["spec"].get("nodeName"):
            store.patch(
                PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], MERGE_PATCH, body
            )


def _annotations(store: Store, job: str) -> list[dict[str, str]]:
    return [
        dict(p["metadata"].get("annotations") or {})
        for p in store.peek(PODS)
        if p["metadata"]["name"].startswith(job) and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_job_told_of_a_reclaim_saves_acknowledges_and_loses_nothing_when_evicted() -> None:
    clock, store = _store()
    jobs = training.Training(store, cluster.HETEROGENEOUS, kinds=[PAIR])
    jobs.step()
    (job,) = jobs.jobs.values()
    clock.advance(45 * 60)  # 15 minutes past its checkpoint
    _tell(store, job.name, "reclaim-1")
    jobs.step()
    assert job.told == clock()
    keys = nodestate.Keys()
    clock.advance(60)
    jobs.step()
    assert all(keys.reclaim_ack not in a for a in _annotations(store, job.name))  # still saving
    clock.advance(60)
    jobs.step()
    saved = _annotations(store, job.name)
    assert [a[keys.reclaim_ack] for a in saved] == ["reclaim-1", "reclaim-1"]
    assert {a[keys.last_checkpoint] for a in saved} == {
        nodestate.format_time(job.told + training.SAVE)
    }
    clock.advance(60)
    for pod in [p for p in store.peek(PODS) if p["metadata"]["name"].startswith(job.name)]:
        store.delete(
            PODS, cluster.TRAINING_NAMESPACE, pod["metadata"]["name"], DeleteOptions(grace_period=0)
        )
    jobs.step()
    (preempted,) = jobs.record.preemptions
    assert (preempted.lost_gpu_hours, preempted.answered) == (0, True)
    assert (job.attempt, job.done) == (1, timedelta(minutes=45))
    assert jobs.jobs[job.name].told is None  # the restart waits, told of nothing


def test_a_withdrawn_notice_lets_the_job_train_on_from_where_it_stopped() -> None:
    clock, store = _store()
    jobs = training.Training(store, cluster.HETEROGENEOUS, kinds=[PAIR])
    jobs.step()
    (job,) = jobs.jobs.values()
    clock.advance(45 * 60)
    _tell(store, job.name, "reclaim-1")
    jobs.step()
    clock.advance(3 * 60)
    _tell(store, job.name, None)
    jobs.step()
    assert (job.told, job.started, job.done) == (None, clock(), timedelta(minutes=45))
    assert jobs.record.preemptions == []
