"""End to end on the real control plane: training is a real batch/v1 Job, and the pool lends
only to takers (``lend_only_to_takers: true``, as users get it).

This module's own kube-apiserver with the real kube-scheduler, kube-controller-manager (Job,
disruption, Deployment, ReplicaSet, garbage collector, node lifecycle...) and KWOK playing the
kubelets (``tests/support/control_plane.py``). Nothing of the test stands in for them: it
creates objects as a user would and reads what the components did. What is still the test's:
the demand, a fake vLLM exporter that a real Prometheus scrapes every second (as
``tests/test_end_to_end.py``), and the wall clock (no ``ManualClock`` here: the components run
on their own time, so durations are scaled to seconds).

The controller runs as the Helm chart deploys it (the rendered Deployment's container as a
local process, ``processes.as_pod``), authenticated as the chart's service account under the
rendered RBAC, applied to the real server.

1. Five KWOK GPU nodes of the pool (``gpu-pool=<pool>``, ``workload=inference:NoSchedule``);
   the Deployment controller's two inference replicas take two of them; low demand. An
   Indexed Job of two 8-GPU pods, tolerating the lent taint, is pending (the real scheduler
   says: unschedulable), under a PodDisruptionBudget. The controller lends two of the three
   idle nodes, no more (``no_taker`` for the third); the scheduler binds the Job's pods onto
   them and KWOK runs them.
2. Demand rises: both are reclaimed, restored byte for byte, except that another writer's
   label and taint, put on during the loan, stay. The evicted pods checkpoint for their
   ``stop-after`` first. The Job controller re-creates both indices, which stay pending (the
   scheduler: unschedulable).
3. Demand falls: the controller lends two nodes again, for the re-created pods, which the
   scheduler binds and KWOK runs.

Two budgets (``Case``), each on a pool and namespaces of its own: ``minAvailable: 1``, where
the disruption controller allows one eviction (201) and the other is refused (429) on every
pass until the reclaim deadline, when the pod is deleted with grace 0 and the Job counts a
failure (a finding: docs/design/real-apiserver.md); and ``minAvailable: 0``, the whole Job may
go, as ``docs/training-jobs.md`` advises: two evictions, no failure counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import Reason
from rebalancer.core.outcomes import Outcome
from tests.support import kube
from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.control_plane import ControlPlane
from tests.support.deployed import chart_values, controller
from tests.support.exporter import Exporter, serve_exporter
from tests.support.processes import free_port, read_audit
from tests.support.prometheus import scraping
from tests.support.rbac import MAY_GO_UNUSED, Grant, grants, rbac_of, unused
from tests.support.reads import scheduling
from tests.support.training_cluster import (
    INDEX,
    JOB_NAME,
    LENT_TAINT,
    Api,
    answered,
    budget,
    conditions,
    gpu_node,
    namespace,
    running_ready,
    schedulable,
    serving,
    training_job,
    unschedulable,
)
from tests.support.waits import counted, until

Obj = dict[str, Any]
STATE = "rebalancer.io/state"
OURS = "rebalancer.io/controller"  # the reportingController of the controller's Events
JOB = "train"
PODS = 2  # the Job's pods: one node each
STOP_AFTER, GRACE = 3, 8  # the checkpoint, within the grace period, within the deadline
DEADLINE = 12  # the pool's reclaim_deadline, seconds
LOW, HIGH = 5.0, 200.0  # LOW needs 2 serving nodes (RPS_PER_NODE each); HIGH more than the pool
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}"
# Another writer's label and taint put on a lent node during the loan: a restore keeps them.
FOREIGN_LABEL = ("example.com/rack", "r7")
FOREIGN_TAINT = {"key": "example.com/noisy", "value": "true", "effect": "PreferNoSchedule"}


def plane_rbac() -> list[Any]:
    """The chart's ServiceAccount and roles (the same whatever the pools), which the session's
    control plane has applied (tests/conftest.py)."""
    return rbac_of(render({}))


@dataclass(frozen=True)
class Case:
    """One run of the scenario: its budget, and its own pool and namespaces on the module's
    cluster (a pool is ``gpu-pool=<pool>``); its Job and nodes are deleted at its end."""

    pool: str
    min_available: int  # of the Job's budget

    @property
    def nodes(self) -> list[str]:
        return [f"{self.pool}-{i}" for i in range(5)]

    @property
    def inference(self) -> str:
        return f"{self.pool}-serving"

    @property
    def training(self) -> str:
        return f"{self.pool}-training"


ALLOWS_ONE = Case("one", min_available=PODS - 1)
ALLOWS_ALL = Case("all", min_available=0)


@pytest.mark.parametrize("case", [ALLOWS_ONE, ALLOWS_ALL], ids=lambda c: f"budget-{c.pool}")
async def test_a_job_borrows_is_taken_back_through_its_budget_and_borrows_again(
    plane: ControlPlane, case: Case, tmp_path: Path
) -> None:
    began = time.monotonic()
    server = plane.server
    nodes_of = case.nodes
    async with (
        Api.session_for(server) as session,
        _left_clean(Api(server.url, session), case) as api,
    ):
        for name in (case.inference, case.training):
            await api.create("/api/v1/namespaces", namespace(name))
        for name in nodes_of:
            await api.create("/api/v1/nodes", gpu_node(name, case.pool))

        async def nodes_ready() -> bool:
            nodes = await api.nodes()
            return all(schedulable(nodes[n]) for n in nodes_of)

        await until("the KWOK nodes Ready, not-ready taken off", nodes_ready, None, 30)
        deployments = f"/apis/apps/v1/namespaces/{case.inference}/deployments"
        await api.create(deployments, serving(2, case.inference, case.pool))

        async def replicas() -> list[Obj]:
            return [p for p in await api.pods(case.inference) if running_ready(p)]

        await until("the inference replicas running", lambda: counted(replicas, 2), None, 30)
        placed = {
            f"{case.inference}/{p['metadata']['name']}": p["spec"]["nodeName"]
            for p in await replicas()
        }
        busy = set(placed.values())
        assert len(busy) == 2, placed  # a replica takes a node's 8 GPUs
        idle = sorted(set(nodes_of) - busy)

        # The Job, pending: nothing that tolerates only the lent taint fits anywhere yet.
        budgets = f"/apis/policy/v1/namespaces/{case.training}/poddisruptionbudgets"
        await api.create(budgets, budget(JOB, case.training, case.min_available))
        job = training_job(JOB, case.training, case.pool, PODS, f"{STOP_AFTER}s", GRACE)
        await api.create(f"/apis/batch/v1/namespaces/{case.training}/jobs", job)

        async def job_pods() -> list[Obj]:
            return await api.pods(case.training, f"{JOB_NAME}={JOB}")

        async def pending() -> list[Obj]:
            return [p for p in await job_pods() if unschedulable(p)]

        async def running() -> list[Obj]:
            return [p for p in await job_pods() if running_ready(p)]

        await until("the Job's pods unschedulable", lambda: counted(pending, PODS), None, 30)
        first_pods = {p["metadata"]["uid"] for p in await pending()}
        originals = {n: scheduling(obj) for n, obj in (await api.nodes()).items()}

        async def lent_now() -> list[str]:
            nodes = await api.nodes()
            return sorted(n for n in nodes_of if nodes[n]["metadata"]["labels"].get(STATE))

        exporter = Exporter(pods=placed, rps=LOW)
        async with (
            serve_exporter(exporter) as target,
            scraping(tmp_path / "prometheus", target) as prom,
        ):
            docs = render(chart_values(prom, free_port(), case.pool, DEADLINE))
            assert rbac_of(docs) == rbac_of(plane_rbac()), (
                "the roles enforced are the ones installed"
            )
            mark = server.audit_mark()
            async with controller(server, docs, tmp_path) as (c, audit_url):
                # -- 1. lent to the Job's pods, and to nothing else ---------------------------
                lend_time = await until(
                    "the Job's pods running on lent nodes",
                    lambda: counted(running, PODS),
                    c.proc,
                    40,
                )
                await asyncio.sleep(3)  # three ticks more: nothing else is lent
                lent = await lent_now()
                borrowed = await running()
                assert len(lent) == PODS, lent
                assert set(lent) < set(idle), (lent, idle)
                assert {p["spec"]["nodeName"] for p in borrowed} == set(lent)
                assert {p["metadata"]["uid"] for p in borrowed} == first_pods
                nodes = await api.nodes()
                for n in lent:
                    assert nodes[n]["metadata"]["labels"][STATE] == "lent"
                    assert LENT_TAINT in nodes[n]["spec"]["taints"]
                (unlent,) = set(idle) - set(lent)
                assert scheduling(nodes[unlent]) == originals[unlent]
                await _scheduled_by_the_scheduler(api, case.training, borrowed)
                status = (await api.job(case.training, JOB))["status"]
                assert (status.get("active"), status.get("ready")) == (PODS, PODS), status

                # Another writer labels and taints a lent node during the loan.
                other = lent[0]
                await _json_patch(
                    api,
                    other,
                    [
                        {"op": "add", "path": "/spec/taints/-", "value": FOREIGN_TAINT},
                        {
                            "op": "add",
                            "path": "/metadata/labels/" + FOREIGN_LABEL[0].replace("/", "~1"),
                            "value": FOREIGN_LABEL[1],
                        },
                    ],
                )

                # -- 2. demand rises: reclaimed through the budget ----------------------------
                budget_before = (await api.budget(case.training, JOB))["status"]
                exporter.set_load(HIGH, 0)
                raised = time.monotonic()
                seen = _Seen()

                async def all_back() -> bool:
                    nodes = await api.nodes()
                    pods = await job_pods()
                    seen.look(pods, await api.budget(case.training, JOB))
                    on_pool = [p for p in pods if p["spec"].get("nodeName") in nodes_of]
                    lent = any(nodes[n]["metadata"]["labels"].get(STATE) for n in nodes_of)
                    return not lent and not on_pool

                reclaim_time = await until(
                    "every lent node back and empty", all_back, c.proc, DEADLINE + 30
                )
                nodes = await api.nodes()
                for n in nodes_of:
                    if n != other:
                        assert scheduling(nodes[n]) == originals[n], n
                labels, taints = (json.loads(t) for t in originals[other])
                assert nodes[other]["metadata"]["labels"] == {
                    **labels,
                    FOREIGN_LABEL[0]: FOREIGN_LABEL[1],
                }
                assert sorted(map(json.dumps, nodes[other]["spec"]["taints"])) == sorted(
                    map(json.dumps, [*taints, FOREIGN_TAINT])
                )

                # The Job controller makes both indices again; they wait (the nodes serve).
                async def recreated() -> list[Obj]:
                    return [p for p in await pending() if p["metadata"]["uid"] not in first_pods]

                await until(
                    "both indices re-created, unschedulable",
                    lambda: counted(recreated, PODS),
                    c.proc,
                    40,
                )
                again = {p["metadata"]["uid"] for p in await recreated()}
                indices = sorted(p["metadata"]["annotations"][INDEX] for p in await recreated())
                assert indices == [str(i) for i in range(PODS)]
                after_reclaim = (await api.job(case.training, JOB))["status"]
                budget_after = (await api.budget(case.training, JOB))["status"]
                await asyncio.sleep(3)  # three ticks: nothing is lent while demand is high
                assert await lent_now() == []

                # -- 3. demand falls: lent again to the re-created pods -----------------------
                exporter.set_load(LOW, 0)
                fell = time.monotonic()

                async def rerun() -> list[Obj]:
                    return [p for p in await running() if p["metadata"]["uid"] in again]

                relend_time = await until(
                    "the re-created pods running", lambda: counted(rerun, PODS), c.proc, 40
                )
                rerunning = await rerun()
                await _scheduled_by_the_scheduler(api, case.training, rerunning)
                lent_again = await lent_now()
                assert len(lent_again) == PODS, lent_again
                assert set(lent_again) <= set(idle), lent_again
                assert {p["spec"]["nodeName"] for p in rerunning} == set(lent_again)

                async def counted_ready() -> bool:
                    status = (await api.job(case.training, JOB))["status"]
                    return bool(status.get("ready") == PODS)

                await until("the Job counting them ready", counted_ready, c.proc, 20)
                records = await read_audit(audit_url)
            lease = (await api.get(LEASE_PATH))["spec"]
            (tmp_path / "controller.log").write_bytes(c.err)  # kept for a failure's reader
            log = c.err.decode(errors="replace")
            assert c.proc.returncode == 0, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
            job_status = (await api.job(case.training, JOB))["status"]
            told: dict[str, list[str]] = {}  # the controller's Events, by node
            for e in await api.events("default"):
                if e["regarding"]["name"] in nodes_of and e["reportingController"] == OURS:
                    told.setdefault(e["regarding"]["name"], []).append(e["reason"])

    # -- What the components did, from their own records --------------------------------------
    mine = [a for a in answered(server, kube.CONTROLLER_USER, mark) if a.namespace == case.training]
    evictions = [a for a in mine if a.resource == "pods/eviction"]
    deletions = [a for a in mine if (a.verb, a.resource) == ("delete", "pods")]
    codes = [a.code for a in evictions]
    print(
        f"\ne2e-real[{case.pool}]: evictions answered {codes}; "
        f"deletions {[(a.name, a.code) for a in deletions]}; budget while draining "
        f"(healthy, desired, allowed, disrupted) {seen.budgets}, after {budget_after}; "
        f"Job after the reclaim {after_reclaim}, at the end {job_status}"
    )
    print(f"e2e-real[{case.pool}]: Events {told}")
    decided = server.decisions(kube.CONTROLLER_USER, mark)
    denied = [d for d in decided if not d.allowed]
    assert denied == [], denied
    # Least privilege: a grant of the rendered roles the run never used must be one it may not
    # need (a deletion past the deadline, a node read outside the cache); any other should go.
    left = unused(grants(docs), decided)
    assert left <= MAY_GO_UNUSED, left
    if case.min_available:  # past the deadline: a pod marked DisruptionTarget, then deleted
        assert not left & {Grant("delete", "", "pods"), Grant("patch", "", "pods/status")}, left
    assert not lease.get("holderIdentity"), "the Lease released on the way out"

    assert budget_before.get("disruptionsAllowed") == PODS - case.min_available, budget_before
    evicted = [a for a in evictions if a.code == 201]
    assert len(evicted) == PODS - case.min_available, codes  # what the budget allowed
    # The evicted pods checkpointed: running on, their deletion under way, a DisruptionTarget.
    for a in evicted:
        condition = seen.stopping.get(a.name)
        assert condition is not None, (a.name, seen.stopping)
        assert condition["reason"] == "EvictionByEvictionAPI", condition
    if case.min_available:
        # The rest were refused (429) every pass: the budget allowed no more while the evicted
        # pods' replacements could not run; then deleted once the deadline passed, not before.
        refused = {a.name for a in evictions if a.code == 429}
        assert len(refused) == case.min_available, codes
        assert not refused & {a.name for a in evicted}
        # Asked again every pass (a 429 may come back first: two drains race for the budget).
        retried = [a for a in evictions if a.code == 429 and a.at > evicted[-1].at]
        assert len(retried) >= 3, codes
        assert (PODS - len(evicted), 0) in {(h, allowed) for h, _, allowed, _ in seen.budgets}
        assert {a.name for a in deletions} == refused
        waited = min(a.at for a in deletions) - evicted[0].at
        assert DEADLINE - 2 <= waited.total_seconds() <= DEADLINE + 8, waited
    else:
        assert codes == [201] * PODS, codes
        assert deletions == [], deletions
    # Evicted or deleted at the deadline (marked DisruptionTarget first), every pod stopped as a
    # disruption: the Job's podFailurePolicy ignores them all.
    assert after_reclaim.get("failed", 0) == 0, after_reclaim
    assert job_status.get("failed", 0) == after_reclaim.get("failed", 0), job_status
    assert not [c for c in job_status.get("conditions", []) if c["type"] == "Failed"]

    _check_audit(records, lent, lent_again, case.training)
    # Intent before act, against the server's own record: no write to a node before its first
    # intent, and each intent acted on (a write to its node) before the node's next intent.
    patches = [
        a
        for a in answered(server, kube.CONTROLLER_USER, mark)
        if (a.verb, a.resource) == ("patch", "nodes")
    ]
    for n in nodes_of:
        times = sorted(r.time for r in records if r.kind is Kind.INTENT and r.node == n)
        acts = [a.at for a in patches if a.name == n]
        if not times:
            assert acts == [], (n, acts)  # never decided on, never written
            continue
        assert min(acts) >= times[0], (n, times, acts)
        for t, after in zip(times, [*times[1:], None], strict=True):
            assert any(t <= at and (after is None or at < after) for at in acts), (n, t, acts)
    for n in lent:
        assert told[n][:3] == ["Lent", "Reclaiming", "Restored"], told
    for n in lent_again:
        assert told[n][-1] == "Lent", told
    # A pod deleted past the deadline that its Job's finalizer holds until the Job controller
    # sees it stop is not a drain blocked (the pass that deleted it used to say so).
    assert not [n for n, reasons in told.items() if "DrainBlocked" in reasons], told

    total = time.monotonic() - began
    print(
        f"e2e-real[{case.pool}]: lent {PODS} in {lend_time:.1f}s, reclaimed in "
        f"{reclaim_time:.1f}s after the rise ({fell - raised:.1f}s to the fall), the re-created "
        f"pods running {relend_time:.1f}s after the fall; {len(records)} audit rows; "
        f"{total:.1f}s in all"
    )


@contextlib.asynccontextmanager
async def _left_clean(api: Api, case: Case) -> AsyncIterator[Api]:
    """The case's Job and nodes deleted at its end: the next case's controller would take
    lent nodes that no pool of its own selects back, as orphans (docs/design/other-writers.md);
    and the chart's Lease, before and after, which a fresh install does not have (its
    controller creates it; the plane is the session's)."""
    await api.ask("DELETE", LEASE_PATH)
    try:
        yield api
    finally:
        path = f"/apis/batch/v1/namespaces/{case.training}/jobs/{JOB}?propagationPolicy=Background"
        await api.ask("DELETE", path)

        async def gone() -> bool:
            return not await api.pods(case.training, f"{JOB_NAME}={JOB}")

        await until("the Job's pods gone", gone, None, 30)
        for name in case.nodes:
            await api.ask("DELETE", f"/api/v1/nodes/{name}")
        await api.ask("DELETE", LEASE_PATH)


class _Seen:
    """What the test saw while the reclaim went on: the budget's status, and each evicted pod
    while it stopped."""

    def __init__(self) -> None:
        self.budgets: list[tuple[Any, ...]] = []
        self.stopping: dict[str, Obj] = {}  # pod name -> its DisruptionTarget condition

    def look(self, pods: list[Obj], budget: Obj) -> None:
        status = budget.get("status", {})
        counts = (
            status.get("currentHealthy"),
            status.get("desiredHealthy"),
            status.get("disruptionsAllowed"),
            sorted(status.get("disruptedPods") or {}),
        )
        if not self.budgets or self.budgets[-1] != counts:
            self.budgets.append(counts)
        for p in pods:
            target = conditions(p).get("DisruptionTarget")
            if (
                target is not None
                and "deletionTimestamp" in p["metadata"]
                and p["status"].get("phase") == "Running"
            ):
                self.stopping.setdefault(p["metadata"]["name"], target)


def _check_audit(
    records: list[AuditRecord], lent: list[str], lent_again: list[str], namespace: str
) -> None:
    by_id = {r.id: r for r in records}
    intents = [r for r in records if r.kind is Kind.INTENT]
    outcomes = [r for r in records if r.kind is Kind.OUTCOME]
    lends = [r for r in intents if r.action == "lend"]
    reclaims = [r for r in intents if r.action == "reclaim"]
    assert len(lends) == 2 * PODS, lends  # two rounds, each the Job's pods' nodes only
    assert sorted(str(r.node) for r in lends[:PODS]) == lent
    assert sorted(str(r.node) for r in lends[PODS:]) == lent_again
    assert all(f"for job {namespace}/{JOB}" in (r.message or "") for r in lends), lends
    assert sorted(str(r.node) for r in reclaims) == sorted(lent)
    assert {r.reason for r in reclaims} <= {
        Reason.DEMAND_ABOVE_SERVING.value,
        Reason.GANG_PREEMPTED.value,
    }, reclaims
    assert any(r.reason == Reason.NO_TAKER.value for r in records), "the third node: no taker"
    for outcome in outcomes:  # intent before outcome, always
        intent = by_id[outcome.intent_id or ""]
        assert (intent.time, intent.id) < (outcome.time, outcome.id)
    for intent in lends + reclaims:
        mine = [o for o in outcomes if o.intent_id == intent.id]
        assert mine, intent
        assert mine[-1].outcome == Outcome.APPLIED.value, (intent, mine)
    # Every lend of the second round comes after every reclaim of the first.
    assert max(r.time for r in reclaims) < min(r.time for r in lends[PODS:])


async def _json_patch(api: Api, node: str, ops: list[Obj]) -> None:
    code, doc = await api.ask("PATCH", f"/api/v1/nodes/{node}", ops, "application/json-patch+json")
    assert code == 200, doc


async def _scheduled_by_the_scheduler(api: Api, namespace: str, pods: list[Obj]) -> None:
    """Each pod's binding is kube-scheduler's: its ``Scheduled`` Event names the node."""
    events = await api.events(namespace)
    for p in pods:
        name, node = p["metadata"]["name"], p["spec"]["nodeName"]
        mine = [
            e
            for e in events
            if e.get("regarding", {}).get("name") == name and e.get("reason") == "Scheduled"
        ]
        assert mine, (name, [e.get("reason") for e in events])
        assert mine[-1]["reportingController"] == "default-scheduler", mine[-1]
        assert node in mine[-1]["note"], mine[-1]
        assert conditions(p)["PodScheduled"]["status"] == "True"
