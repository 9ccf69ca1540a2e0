"""The chart's RBAC, proven against an RBAC authorizer rather than read: the emulator's, then a
real kube-apiserver's.

Fast checks of the rendered roles (no ``*``, no Secrets, read-only on a dry run), then the
controller's own adapters, in process, as the chart's service account against a server that
holds exactly the rendered ServiceAccount, roles and bindings: every operation the controller
performs succeeds under them, and removing the one rule an operation needs makes it fail with a
403 for exactly that verb and resource. (The whole controller runs under the rendered RBAC in
``tests/test_end_to_end.py``, which also compares what it used with what it was granted.)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer import settings as settings_mod
from rebalancer.adapters import ledger
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.events import KubeEvents, NodeEvent
from rebalancer.adapters.leadership import LeaderElector
from rebalancer.adapters.writer import KubeWriter, WriteError
from rebalancer.core.audit import Kind
from rebalancer.core.model import PoolName
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import livesettings, wiring
from sandbox.emulator import cluster
from sandbox.emulator.resources import PODS
from tests.support import kube, objects
from tests.support.backends import Backend, Opened
from tests.support.chart import NAMESPACE, RELEASE, Doc, of_kind, one, render
from tests.support.emulated import Requests
from tests.support.fakes import Demand
from tests.support.processes import config_text, free_port, read_audit
from tests.support.rbac import CONTROLLER_TOKEN, apply_to, grants, rbac_of, service_account_of

SA = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
SERVING, LENT, LENT_TOO = "inference-5", "inference-6", "inference-7"


# ---------------------------------------------------------------------------------------------
# What is rendered


@pytest.mark.parametrize("dry_run", [False, True], ids=["writes", "dry-run"])
def test_the_cluster_role_has_no_wildcard_and_no_secrets(dry_run: bool) -> None:
    docs = render({"config": {"dry_run": dry_run}})
    for role in [*of_kind(docs, "ClusterRole"), *of_kind(docs, "Role")]:
        for rule in role["rules"]:
            for key in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
                assert not any("*" in item for item in rule.get(key) or ()), (role, rule)
            assert not {"secrets", "configmaps"} & set(rule.get("resources") or ()), rule


def test_every_binding_binds_a_rendered_role_to_the_chart_service_account() -> None:
    docs = render({})
    account = one(docs, "ServiceAccount")["metadata"]
    assert service_account_of(docs).name == SA
    roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs}
    bindings = [*of_kind(docs, "ClusterRoleBinding"), *of_kind(docs, "RoleBinding")]
    assert len(bindings) == 4  # the cluster's, the Lease's, the nodes' Events, the Pod's Events
    for binding in bindings:
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        assert (ref["kind"], namespace, ref["name"]) in roles, binding
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]


def test_a_dry_run_cluster_role_only_reads_nodes_and_pods() -> None:
    """And asks who sent each HTTP request (a review is a question, stored nowhere)."""
    role = one(rbac_of(render({"config": {"dry_run": True}})), "ClusterRole")
    assert {(g.verb, g.resource) for g in grants([role])} == {
        ("get", "nodes"),
        ("list", "nodes"),
        ("watch", "nodes"),
        ("list", "pods"),
        ("watch", "pods"),
        ("create", "tokenreviews"),
        ("create", "subjectaccessreviews"),
    }


@pytest.mark.parametrize("dry_run", [False, True], ids=["writes", "dry-run"])
def test_kueue_workloads_are_listed_and_watched_only_when_the_settings_read_them(
    dry_run: bool,
) -> None:
    """``takers.kueue_workloads`` adds list and watch on workloads.kueue.x-k8s.io, nothing
    else (tests/kubeapi/test_kueue_workloads.py proves it against a real server)."""
    off = grants([one(rbac_of(render({"config": {"dry_run": dry_run}})), "ClusterRole")])
    on_values = {"config": {"dry_run": dry_run, "takers": {"kueue_workloads": True}}}
    on = grants([one(rbac_of(render(on_values)), "ClusterRole")])
    assert not any(g.group == "kueue.x-k8s.io" for g in off)
    assert {(g.verb, g.group, g.resource) for g in on - off} == {
        ("list", "kueue.x-k8s.io", "workloads"),
        ("watch", "kueue.x-k8s.io", "workloads"),
    }
    assert off < on


# ---------------------------------------------------------------------------------------------
# Proven: the controller's operations under the rendered RBAC


@dataclass
class Cluster:
    """A cluster holding the chart's RBAC, and the controller's adapters as its account."""

    opened: Opened  # its ``api`` is a system:masters user
    controller: Any  # ApiClient as the chart's service account
    asked: Requests  # what the controller's client asked and was answered
    actuator: Actuator  # as the controller

    @property
    def admin(self) -> Any:
        return self.opened.api

    def denied(self) -> set[tuple[str, str, str]]:
        """(verb, group, resource[/subresource]) of every request of the controller refused."""
        return {
            (r.verb, r.group, r.resource + (f"/{r.subresource}" if r.subresource else ""))
            for r in self.asked.seen
            if r.status == 403
        }


@contextlib.asynccontextmanager
async def running(
    backend: Backend, docs: list[Doc], tmp_path: Path, dry_run: bool = False
) -> AsyncIterator[Cluster]:
    """The default cluster with ``docs`` applied; ``LENT`` and ``LENT_TOO`` lent (by the admin)
    and each running one borrowed training pod."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(config_text(tmp_path / "audit.sqlite3", free_port()), encoding="utf-8")
    config = settings_mod.load(config_path, env={})
    (pool,) = wiring.pool_configs(config)

    def actuator(api: Any, dry: bool = False) -> Actuator:
        writer = KubeWriter(client.CoreV1Api(api))
        return Actuator(
            writer, wiring.signed_keys(config), pool.lend_spec, pool.marks, wiring.utc_now, dry
        )

    async with backend.open(seeded=True, authorized=True) as opened:
        assert service_account_of(docs).name == kube.CONTROLLER_USER
        apply_to(opened.objects, docs)
        async with opened.client_as(CONTROLLER_TOKEN) as (controller, asked):
            for i, node in enumerate((LENT, LENT_TOO)):
                assert (await actuator(opened.api).lend(node, "setup")).outcome is Outcome.APPLIED
                pod = cluster.training_pod(f"borrowed-{i}", 0, priority_class=None)
                pod["spec"]["nodeName"] = node
                objects.add(opened.objects, pod)
            yield Cluster(opened, controller, asked, actuator(controller, dry_run))


Operation = Callable[[Cluster], Awaitable[bool]]


async def lend(c: Cluster) -> bool:
    """Lend an idle node: read it and its pods, then patch it twice."""
    return (await c.actuator.lend(SERVING, "test")).outcome is Outcome.APPLIED


async def reclaim_by_eviction(c: Cluster) -> bool:
    """Reclaim before the deadline: the borrowed pod is evicted, so the node waits for it."""
    deadline = datetime.now(UTC) + timedelta(hours=1)
    result = await c.actuator.reclaim(LENT, "test", deadline)
    return result.outcome is Outcome.IN_PROGRESS and _terminating(c, "borrowed-0-0")


async def reclaim_by_deletion(c: Cluster) -> bool:
    """Reclaim past the deadline: the borrowed pod is deleted."""
    deadline = datetime.now(UTC) - timedelta(seconds=1)
    result = await c.actuator.reclaim(LENT_TOO, "test", deadline)
    return result.outcome in (Outcome.APPLIED, Outcome.IN_PROGRESS) and _terminating(
        c, "borrowed-1-0"
    )


async def take_a_new_lease(c: Cluster) -> bool:
    """No Lease yet: read (404), then create it."""
    return await _elector(c).step()


async def take_a_released_lease(c: Cluster) -> bool:
    """A released Lease: read it, then update it."""
    leases: Any = client.CoordinationV1Api(c.admin)
    await leases.create_namespaced_lease(
        NAMESPACE, {"metadata": {"name": RELEASE}, "spec": {"leaseTransitions": 3}}
    )
    return await _elector(c).step()


async def record_an_event(c: Cluster) -> bool:
    events = KubeEvents(c.controller, instance="test")
    return await events.record(NodeEvent(SERVING, "Normal", "Lent", "Lend", "lent for a test"))


async def record_a_settings_event(c: Cluster) -> bool:
    """What a replica made of a change of its settings file, on its own Pod, in the release's
    namespace (docs/design/live-settings.md)."""
    events = KubeEvents(c.controller, instance="test")
    outcome = livesettings.Outcome(livesettings.REFUSED, "0" * 64, ("paused='maybe': ...",))
    return await events.record(wiring.settings_event(outcome, f"{RELEASE}-0", NAMESPACE))


async def read_back_kept_records(c: Cluster) -> bool:
    """The audit records kept in the controller's own Events are listed back."""
    events = KubeEvents(c.controller, instance="test")
    try:
        await events.own(ledger.AUDIT_STORE_FAILING)
    except ApiException:
        return False
    return True


NOTICED = "borrowed-0-0"  # on LENT


async def annotate_a_borrowed_pod(c: Cluster) -> bool:
    """A reclaim notice's annotations on a borrowed pod: a merge patch of the pod."""
    deadline = {"rebalancer.io/reclaim-deadline": "2026-12-04T09:35:00Z"}
    written = await _pod_write(
        c, lambda w, uid: w.annotate_pod(cluster.TRAINING_NAMESPACE, NOTICED, uid, deadline)
    )
    return (
        written and deadline.items() <= (_noticed(c)["metadata"].get("annotations") or {}).items()
    )


async def set_a_borrowed_pods_condition(c: Cluster) -> bool:
    """A reclaim notice's condition on a borrowed pod: the pod listed by its name, then a
    strategic merge patch of its status."""
    notice = {"type": "rebalancer.io/ReclaimNotice", "status": "True", "reason": "ReclaimScheduled"}
    written = await _pod_write(
        c, lambda w, uid: w.set_pod_condition(cluster.TRAINING_NAMESPACE, NOTICED, uid, notice)
    )
    found = _noticed(c)["status"].get("conditions") or []
    return written and any(x["type"] == notice["type"] for x in found)


async def _pod_write(c: Cluster, write: Callable[[KubeWriter, str], Awaitable[bool]]) -> bool:
    """``write`` as the controller on the noticed pod; False when it was refused."""
    try:
        return await write(
            KubeWriter(client.CoreV1Api(c.controller)), _noticed(c)["metadata"]["uid"]
        )
    except WriteError:
        return False


def _noticed(c: Cluster) -> Any:
    return c.opened.objects.get(PODS, cluster.TRAINING_NAMESPACE, NOTICED)


def _elector(c: Cluster) -> LeaderElector:
    return LeaderElector(c.controller, name=RELEASE, namespace=NAMESPACE, identity="test")


def _terminating(c: Cluster, pod: str) -> bool:
    found = [p for p in c.opened.objects.peek(PODS) if p["metadata"]["name"] == pod]
    return not found or bool(found[0]["metadata"].get("deletionTimestamp"))


OPERATIONS: dict[str, Operation] = {
    "lend": lend,
    "reclaim-by-eviction": reclaim_by_eviction,
    "reclaim-by-deletion": reclaim_by_deletion,
    "take-a-new-lease": take_a_new_lease,
    "take-a-released-lease": take_a_released_lease,
    "record-an-event": record_an_event,
    "record-a-settings-event": record_a_settings_event,
    "read-back-kept-records": read_back_kept_records,
    "annotate-a-borrowed-pod": annotate_a_borrowed_pod,
    "set-a-borrowed-pods-condition": set_a_borrowed_pods_condition,
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_the_controller_operations_succeed_under_the_rendered_rbac(
    backend: Backend, operation: str, tmp_path: Path
) -> None:
    async with running(backend, render({}), tmp_path) as c:
        assert await OPERATIONS[operation](c)
        assert c.denied() == set()
        assert c.asked.seen, "the operation was asked as the service account"


def without(docs: list[Doc], verb: str, group: str, resource: str) -> list[Doc]:
    """``docs`` with ``verb`` taken out of every role rule on ``group``/``resource``."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        rules = []
        for rule in doc["rules"]:
            if group in rule.get("apiGroups", ()) and resource in rule.get("resources", ()):
                rule["verbs"] = [v for v in rule["verbs"] if v != verb]
            if rule["verbs"]:
                rules.append(rule)
        doc["rules"] = rules
    assert grants(out) < grants(docs), f"nothing grants {verb} on {resource}"
    return out


@pytest.mark.parametrize(
    ("verb", "group", "resource", "operation"),
    [
        ("patch", "", "nodes", "lend"),
        ("get", "", "nodes", "lend"),
        ("list", "", "pods", "lend"),
        ("create", "", "pods/eviction", "reclaim-by-eviction"),
        ("delete", "", "pods", "reclaim-by-deletion"),
        ("create", "coordination.k8s.io", "leases", "take-a-new-lease"),
        ("get", "coordination.k8s.io", "leases", "take-a-released-lease"),
        ("update", "coordination.k8s.io", "leases", "take-a-released-lease"),
        ("create", "events.k8s.io", "events", "record-an-event"),
        ("create", "events.k8s.io", "events", "record-a-settings-event"),
        ("list", "events.k8s.io", "events", "read-back-kept-records"),
        ("patch", "", "pods", "annotate-a-borrowed-pod"),
        ("patch", "", "pods/status", "set-a-borrowed-pods-condition"),
        ("list", "", "pods", "set-a-borrowed-pods-condition"),
    ],
)
async def test_removing_the_rule_an_operation_needs_makes_it_fail_with_403(
    backend: Backend, verb: str, group: str, resource: str, operation: str, tmp_path: Path
) -> None:
    async with running(backend, without(render({}), verb, group, resource), tmp_path) as c:
        assert not await OPERATIONS[operation](c)
        assert c.denied() == {(verb, group, resource)}


async def test_without_patch_on_pod_status_a_deadline_deletion_still_happens(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The DisruptionTarget mark is not worth an inference node: a role without it (an older
    chart's) still deletes the pod at the deadline, and says what it could not mark."""
    docs = without(render({}), "patch", "", "pods/status")
    async with running(backend, docs, tmp_path) as c:
        assert await reclaim_by_deletion(c)
        assert c.denied() == {("patch", "", "pods/status")}
    assert "not marked DisruptionTarget before its deletion" in caplog.text


async def test_a_dry_run_controller_writes_nothing_under_the_dry_run_role(
    backend: Backend, tmp_path: Path
) -> None:
    """The whole controller in dry run, as the chart's dry-run account: the informer, two ticks
    of planning and auditing. Every step answers ``would_apply``, each intent is audited once,
    the server is asked no write at all (no Lease, no Event) and refuses nothing."""
    docs = render({"config": {"dry_run": True}})
    assert list(of_kind(docs, "Role")) == []  # neither the Lease's nor the Events'
    async with running(backend, docs, tmp_path, dry_run=True) as c:
        assert (await c.actuator.lend(SERVING, "test")).outcome is Outcome.WOULD_APPLY
        deadline = datetime.now(UTC) + timedelta(hours=1)
        assert (await c.actuator.reclaim(LENT, "test", deadline)).outcome is Outcome.WOULD_APPLY
        past = datetime.now(UTC) - timedelta(seconds=1)
        assert (await c.actuator.reclaim(LENT_TOO, "test", past)).outcome is Outcome.WOULD_APPLY

        path = tmp_path / "dry-run.yaml"
        audit_db = tmp_path / "dry-run.sqlite3"
        # Leader election asked for: a dry run elects no leader, so it takes no Lease.
        text = config_text(audit_db, free_port(), election=True)
        text += "    lend_only_to_takers: false\n"  # no training waits in this cluster
        path.write_text(f"dry_run: true\n{text}", encoding="utf-8")
        config = settings_mod.load(path, env={})
        # The cluster's clock: the controller measures the API server's, and one that is far
        # off (the emulator's manual clock against the wall's) would stop every lend.
        clock = c.opened.clock
        demand = Demand({PoolName("inference"): 1.0}, clock)
        seams = wiring.Seams(
            api=c.controller, clock=clock, metrics=demand, sink=None, serve_http=False
        )
        async with wiring.Controller.open(config, seams) as controller:
            assert controller.elector is None
            informer = asyncio.create_task(controller.informer.run())
            try:
                await asyncio.wait_for(controller.informer.synced.wait(), 10)
                first = await controller.reconciler.tick()
                again = await controller.reconciler.tick()
            finally:
                informer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await informer
        assert first.plan.steps
        assert again.plan.steps == first.plan.steps
        assert {a.result.outcome for a in first.applied if a.result} == {Outcome.WOULD_APPLY}
        assert again.applied == ()  # the same plan: nothing audited or "done" twice
        records = await read_audit(f"sqlite+aiosqlite:///{audit_db}")
        intents = [r for r in records if r.kind is Kind.INTENT]
        outcomes = [r for r in records if r.kind is Kind.OUTCOME]
        assert len(intents) == len(first.plan.steps)
        assert {r.outcome for r in outcomes} == {Outcome.WOULD_APPLY}
        assert all(r.dry_run for r in intents + outcomes)
        assert c.denied() == set()
        assert [(r.verb, r.resource) for r in c.asked.seen if r.is_write] == []
