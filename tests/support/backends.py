"""Where the adapter suites run: the API emulator, or a real kube-apiserver.

A suite that runs on both takes the ``backend`` fixture (``tests/conftest.py``): one test, two
servers. What a test does to the cluster behind the controller's back goes through ``Objects``,
the part of the emulator's ``Store`` it needs (create, get, patch, delete, peek, by resource
type). ``Store`` is one; ``RealCluster`` is the other, the same calls as HTTP requests to a real
kube-apiserver as its admin, failures raised as the emulator's ``ApiError`` with the server's
own ``Status``.

The emulator plays the cluster's other actors itself (``sandbox.emulator.store``). A real server
runs none (no kubelet, no controller-manager), so ``RealCluster`` does what they would, with the
emulator's own rules, at the moments a test acts:

- the node lifecycle controller: a created Node's ``node.kubernetes.io/not-ready`` taint (added
  by the TaintNodesByCondition admission plugin) is taken off, as it is once a node reports
  Ready;
- the kubelet: a pod bound to a node (created with ``spec.nodeName``, or bound by the scheduler
  stand-in) is reported Running and Ready through the ``status`` subresource; a terminating pod
  whose grace period has run out on the test's time is deleted with grace 0;
- the scheduler, when a test asks (``schedule``; ``act`` runs it with the others, for a process
  test on the wall clock): the emulator's placement rules, bound through the ``binding``
  subresource;
- the disruption controller: every PodDisruptionBudget's ``status`` is computed from its pods
  (``sandbox.emulator.disruption.budget_status``) and written through its ``status`` subresource;
- the Priority admission plugin wants the PriorityClass a pod names to exist, and a non-zero
  ``spec.priority`` to come from one: the class is created (``test-priority-N`` for a bare
  priority N) and the pod names it.

Time: the controller's clock is a ``ManualClock`` on both. On the real server it starts at the
wall clock, and ``advance`` moves it and the kubelet's view of time together (a grace period
ends when the wall clock plus the time advanced passes the pod's ``deletionTimestamp``), so a
test that advances 60 s sees a 60 s grace period end on either server.

What the real server cannot show: injected faults (a dropped watch, a 5xx, a cut connection)
and watch timeouts or bookmarks on the test's clock (its watches time out on the wall clock).
A test that needs those stays on the emulator and says so.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.adapters import kubeclient
from sandbox.emulator import cluster, disruption, scheduling, status
from sandbox.emulator.auth import Access, admin, service_account
from sandbox.emulator.clock import ManualClock, parse_rfc3339
from sandbox.emulator.rbac import User
from sandbox.emulator.resources import NODES, PDBS, PODS, RBAC, SERVICEACCOUNTS, ResourceType
from sandbox.emulator.server import Request
from sandbox.emulator.store import DeleteOptions, started
from tests.support import emulated, kube

Obj = dict[str, Any]
NOT_READY = "node.kubernetes.io/not-ready"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
_MERGE = "application/merge-patch+json"
# What a sweep deletes in every namespace, then what it deletes by the label the tests' objects
# carry, and the Leases it leaves alone: kube-apiserver's own identity Leases (in kube-system).
_SWEPT = ("/api/v1/{ns}/pods", "/apis/policy/v1/{ns}/poddisruptionbudgets", "/api/v1/{ns}/events")
_MADE_HERE = "tests.rebalancer.io/made-here"
_SWEPT_BY_LABEL = (SERVICEACCOUNTS, *RBAC)
_NOT_SERVERS = "labelSelector=" + urllib.parse.quote("!apiserver.kubernetes.io/identity")


class Objects(Protocol):
    """What a test does to the cluster behind the controller's back: ``Store``'s own calls."""

    def create(self, rt: ResourceType, namespace: str | None, body: Obj) -> Obj: ...

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj: ...

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        *,
        subresource: str | None = None,
    ) -> Obj: ...

    def replace(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
    ) -> Obj: ...

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj: ...

    def peek(self, rt: ResourceType) -> list[Obj]: ...


def path(
    rt: ResourceType, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    """The REST path of a collection (``name`` None; in every namespace when ``namespace`` is
    None too), of one object, or of its ``subresource``."""
    root = "/api/v1" if not rt.group else f"/apis/{rt.group}/{rt.version}"
    scope = f"/namespaces/{namespace}" if rt.namespaced and namespace else ""
    tail = "".join(f"/{part}" for part in (name, subresource) if part)
    return f"{root}{scope}/{rt.plural}{tail}"


@dataclass
class RealCluster:
    """A real kube-apiserver as a ``Store``: each call one request as the admin."""

    server: kube.KubeServer
    clock: ManualClock
    advanced: float = 0.0
    namespaces: set[str] = field(default_factory=set)
    # Whether the kubelet and the disruption controller have anything to do: only a test makes
    # pods and budgets (the controller never does). Until then their turns cost nothing, which
    # matters: a consistent list of an idle collection waits for etcd's progress notification
    # (about 100 ms on kube-apiserver 1.36).
    actors: bool = False

    # ------------------------------------------------------------------ the Store's calls

    def create(self, rt: ResourceType, namespace: str | None, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        namespace = namespace or obj["metadata"].get("namespace")
        if rt.namespaced and namespace:
            self._namespace(namespace)
        if rt is PODS:
            self._priority_class(obj)
        if rt in _SWEPT_BY_LABEL:
            obj["metadata"].setdefault("labels", {})[_MADE_HERE] = "true"
        made = self._post(path(rt, namespace), obj)
        if rt is NODES:
            made = self._ready_node(made)
        if rt not in (PODS, PDBS):
            return made
        self.actors = True
        self._settle()
        return self.get(rt, namespace, made["metadata"]["name"])

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        return self._ask("GET", path(rt, namespace, name))

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        *,
        subresource: str | None = None,
    ) -> Obj:
        where = path(rt, namespace, name, subresource)
        out = self._ask("PATCH", where, json.loads(body), content_type)
        if rt in (PODS, PDBS):
            self._settle()
        return out

    def replace(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
    ) -> Obj:
        out = self._ask("PUT", path(rt, namespace, name, subresource), body)
        if rt in (PODS, PDBS):
            self._settle()
        return out

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj:
        out = self._ask("DELETE", path(rt, namespace, name), _delete_body(options))
        if rt in (PODS, PDBS):
            self._settle()
        return out

    def peek(self, rt: ResourceType) -> list[Obj]:
        items: list[Obj] = self._ask("GET", path(rt, None))["items"]
        return items

    # ------------------------------------------------------------------ time and the actors

    def advance(self, seconds: float) -> None:
        """Time passes: the controller's clock moves, and so does the kubelet's."""
        self.clock.advance(seconds)
        self.advanced += seconds
        self._settle()

    def _now(self) -> datetime:
        """The kubelet's time: the wall clock plus all the time a test advanced."""
        return datetime.now(UTC) + timedelta(seconds=self.advanced)

    def act(self) -> None:
        """One turn of the cluster's other actors, on the wall clock: what a test of a process
        runs every half second (the scheduler, then the kubelet and the disruption controller)."""
        self.schedule()
        self._settle()

    def schedule(self) -> list[tuple[str, str, str]]:
        """The scheduler: bind each pending pod that fits, by the emulator's placement rules,
        through the ``binding`` subresource as kube-scheduler does; ``(namespace, pod, node)``
        per binding. The kubelet starts them at its next turn."""
        nodes = sorted(self.peek(NODES), key=lambda n: str(n["metadata"]["name"]))
        bound = []
        for pod, placement in scheduling.placements(self.peek(PODS), nodes):
            if placement.node is None:
                continue
            namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": placement.node},
            }
            with _unless_gone():
                self._ask("POST", path(PODS, namespace, name, "binding"), binding)
                bound.append((namespace, name, placement.node))
        return bound

    def _settle(self) -> None:
        if not self.actors:
            return
        pods = self.peek(PODS)
        if self._kubelet(pods):
            pods = self.peek(PODS)
        self._disruption_controller(pods)

    def _kubelet(self, pods: list[Obj]) -> bool:
        """Start bound pods, end those whose grace period is over; whether it wrote."""
        wrote = False
        nodes: set[str] | None = None
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            ending = meta.get("deletionTimestamp")
            with _unless_gone():
                if ending is None and spec.get("nodeName") and _phase(pod) == "Pending":
                    nodes = nodes or {n["metadata"]["name"] for n in self.peek(NODES)}
                    if spec["nodeName"] in nodes:
                        self._start(pod)
                        wrote = True
                elif ending is not None and parse_rfc3339(ending) <= self._now():
                    # The kill is confirmed with a zero grace period, as the kubelet does.
                    options = DeleteOptions(grace_period=0, uid=meta["uid"])
                    where = path(PODS, meta["namespace"], meta["name"])
                    self._ask("DELETE", where, _delete_body(options))
                    wrote = True
        return wrote

    def _disruption_controller(self, pods: list[Obj]) -> None:
        for budget in self.peek(PDBS):
            meta = budget["metadata"]
            wanted = disruption.budget_status(budget, pods, self._now(), {})
            if _counts(wanted) == _counts(budget.get("status") or {}):
                continue
            with _unless_gone():
                where = path(PDBS, meta["namespace"], meta["name"], "status")
                self._ask("PUT", where, {**budget, "status": wanted})

    def _ready_node(self, node: Obj) -> Obj:
        taints = node["spec"].get("taints") or []
        kept = [t for t in taints if t["key"] != NOT_READY]
        if kept == taints:
            return node
        body = {
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": kept or None},
        }
        return self._ask("PATCH", path(NODES, None, node["metadata"]["name"]), body, _MERGE)

    def _start(self, pod: Obj) -> Obj:
        meta = pod["metadata"]
        body = {"status": started(pod, datetime.now(UTC))["status"]}
        return self._ask(
            "PATCH", path(PODS, meta["namespace"], meta["name"], "status"), body, _MERGE
        )

    def _priority_class(self, pod: Obj) -> None:
        """The Priority admission plugin resolves a pod's class, which must exist, and refuses a
        ``spec.priority`` that differs from the class's value; the emulator resolves none."""
        spec = pod["spec"]
        if spec.get("priority") and not spec.get("priorityClassName"):
            spec["priorityClassName"] = f"test-priority-{spec['priority']}"
        name = spec.get("priorityClassName")
        if not name or name.startswith("system-"):
            return
        value = spec.pop("priority", 0)
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {_MADE_HERE: "true"}},
            "value": value,
        }
        self._ensure(PRIORITY_CLASSES, body)

    def _namespace(self, name: str) -> None:
        if name not in self.namespaces:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            self._ensure("/api/v1/namespaces", body)
            self.namespaces.add(name)

    def _post(self, collection: str, body: Obj, within: float = 10.0) -> Obj:
        """Create ``body``. A PriorityClass just created reaches the Priority admission plugin's
        cache a moment later; until then the pod is refused as naming none, and is sent again."""
        deadline = time.monotonic() + within
        while True:
            try:
                return self._ask("POST", collection, body)
            except status.ApiError as error:
                if "no PriorityClass with name" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _ensure(self, collection: str, body: Obj) -> None:
        """Create ``body`` unless it exists already."""
        code, answer = self.server.request("POST", collection, body)
        if code not in (201, 409):
            raise status.ApiError(answer)

    # ------------------------------------------------------------------ requests

    def _ask(self, method: str, where: str, body: Any = None, content_type: str = "") -> Obj:
        code, answer = self.server.request(
            method, where, body, content_type=content_type or "application/json"
        )
        if not 200 <= code < 300:
            raise status.ApiError(answer if isinstance(answer, dict) else {"code": code})
        out: Obj = answer
        return out

    def sweep(self) -> None:
        """Delete what a test made, so the next one starts from an empty cluster: pods (grace
        0), budgets, Events, Leases (but the server's own), nodes, priority classes.
        Namespaces stay: deleting one needs the namespace controller, which does not run."""
        listed = self._ask("GET", "/api/v1/namespaces")["items"]
        names = [n["metadata"]["name"] for n in listed]
        zero = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        for name in names:
            scope = f"namespaces/{urllib.parse.quote(name)}"
            for template in _SWEPT:
                self._ask("DELETE", template.format(ns=scope), zero)
            self._ask("DELETE", f"/apis/coordination.k8s.io/v1/{scope}/leases?{_NOT_SERVERS}", zero)
            for rt in _SWEPT_BY_LABEL:
                if rt.namespaced:
                    where = path(rt, name) + f"?labelSelector={_MADE_HERE}"
                    self._ask("DELETE", where, zero)
        self._ask("DELETE", "/api/v1/nodes", zero)
        self._ask("DELETE", f"{PRIORITY_CLASSES}?labelSelector={_MADE_HERE}", zero)
        for rt in _SWEPT_BY_LABEL:
            if not rt.namespaced:
                self._ask("DELETE", path(rt, None) + f"?labelSelector={_MADE_HERE}", zero)

    def allowed(
        self, user: User, verb: str, group: str, resource: str, namespace: str, name: str = ""
    ) -> bool:
        """Whether kube-apiserver's authorizer allows it now (a SubjectAccessReview): a new
        RBAC object takes a moment to reach the authorizer's cache."""
        plural, _, sub = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": plural, "subresource": sub}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "groups": list(user.groups),
                "resourceAttributes": {**attributes, "namespace": namespace, "name": name},
            },
        }
        answer = self._ask("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))


def _delete_body(options: DeleteOptions) -> Obj:
    body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if options.grace_period is not None:
        body["gracePeriodSeconds"] = options.grace_period
    preconditions = {"uid": options.uid, "resourceVersion": options.resource_version}
    if any(preconditions.values()):
        body["preconditions"] = {k: v for k, v in preconditions.items() if v}
    if options.dry_run:
        body["dryRun"] = ["All"]
    return body


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", ""))


def _counts(budget_status: Obj) -> tuple[Any, ...]:
    fields = ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")
    return tuple(budget_status.get(f) for f in fields)


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    """An actor's write that another (the controller under test) made moot: the object is gone
    or changed since it was read. The actor looks again at its next turn."""
    try:
        yield
    except status.ApiError as error:
        if error.code not in (404, 409):
            raise


@dataclass
class Opened:
    """A cluster a test runs against, on either backend: ``objects`` for what the test does
    behind the controller's back, ``clock`` for the controller's time, ``api`` (and the typed
    APIs) for the controller's client; ``box`` is the emulator, on the emulator only."""

    backend: str
    objects: Any  # Store | RealCluster: both are ``Objects``
    clock: ManualClock
    api: Any  # kubernetes_asyncio.client.ApiClient
    requests: emulated.Requests  # on the emulator, what its server answered; on the real
    # server, what this client (``api``) asked and was answered
    box: emulated.Sandbox | None = None
    real: kube.KubeServer | None = None  # the server, on the real server
    home: Path | None = None  # where its kubeconfigs are written
    core: Any = field(init=False)
    policy: Any = field(init=False)
    coordination: Any = field(init=False)
    events: Any = field(init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.events = client.EventsV1Api(self.api)

    @contextlib.asynccontextmanager
    async def another_client(self) -> AsyncIterator[Any]:
        """A second client of the same user, with its own connections (another replica's)."""
        async with self.client_as(kube.ADMIN_TOKEN) as (api, _):
            yield api

    @contextlib.asynccontextmanager
    async def client_as(self, token: str) -> AsyncIterator[tuple[Any, emulated.Requests]]:
        """A client as ``token``'s user, and the log of what it asked and was answered."""
        requests = emulated.Requests()
        if self.box is not None:
            async with kubeclient.opened(emulated.configuration(self.box.url, token)) as api:
                log_requests(api, requests)
                yield api, requests
            return
        assert self.real is not None
        assert self.home is not None
        path = self.real.kubeconfig(self.home / f"kubeconfig-{token}", token)
        async with kubeclient.api_client(path) as api:
            log_requests(api, requests)
            yield api, requests

    def advance(self, seconds: float) -> None:
        """Time passes for the controller and for the cluster's other actors."""
        if isinstance(self.objects, RealCluster):
            self.objects.advance(seconds)
        else:
            self.clock.advance(seconds)  # the store listens to its clock


class Backend(Protocol):
    @property
    def name(self) -> str: ...

    def open(
        self, seeded: bool = False, authorized: bool = False, **store_options: Any
    ) -> contextlib.AbstractAsyncContextManager[Opened]:
        """A cluster for one test; ``seeded`` starts it from the default GPU cluster's nodes (8
        inference, 4 training); ``authorized`` has it authenticate and authorize every request
        (a real server always does), ``api`` being the admin (``kube.ADMIN_TOKEN``, in
        ``system:masters``) and ``kube.CONTROLLER_TOKEN`` the controller's service account, to
        which only RBAC grants anything; ``store_options`` go to the emulator's ``Store``."""


@dataclass(frozen=True)
class Emulator:
    """The ``emulator`` backend: a fresh emulator per cluster (``tests.support.emulated``)."""

    name: str = "emulator"

    @contextlib.asynccontextmanager
    async def open(
        self, seeded: bool = False, authorized: bool = False, **store_options: Any
    ) -> AsyncIterator[Opened]:
        access, token = None, None
        if authorized:
            user = service_account(kube.CONTROLLER_NAMESPACE, kube.CONTROLLER_NAME)
            access = Access({kube.ADMIN_TOKEN: admin(), kube.CONTROLLER_TOKEN: user})
            token = kube.ADMIN_TOKEN
        async with emulated.running(seeded, access=access, token=token, **store_options) as box:
            yield Opened(self.name, box.store, box.clock, box.api, box.requests, box)


@dataclass(frozen=True)
class Real:
    """The ``real`` backend: the session's kube-apiserver, swept before and after each use."""

    server: kube.KubeServer
    home: Path
    name: str = "real"

    @contextlib.asynccontextmanager
    async def open(
        self, seeded: bool = False, authorized: bool = True, **store_options: Any
    ) -> AsyncIterator[Opened]:
        if store_options:
            raise TypeError(f"emulator options on the real server: {sorted(store_options)}")
        made = RealCluster(self.server, ManualClock(datetime.now(UTC).replace(microsecond=0)))
        made.sweep()  # whatever an earlier test left behind
        if seeded:
            for pool in cluster.DEFAULT_POOLS:
                for node in cluster.pool_nodes(pool):
                    made.create(NODES, None, node)
        config = self.server.kubeconfig(self.home / "kubeconfig")
        try:
            async with kubeclient.api_client(config) as api:
                requests = emulated.Requests()
                log_requests(api, requests)
                yield Opened(
                    self.name, made, made.clock, api, requests, real=self.server, home=self.home
                )
        finally:
            made.sweep()


def log_requests(api: Any, requests: emulated.Requests) -> None:
    """Tell ``requests`` of every request ``api`` sends, as the emulator's server tells of what
    it answered (``sandbox.emulator.server.Request``, the same attributes)."""
    rest = api.rest_client
    send = rest.request

    async def logged(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        refused: ApiException | None = None
        try:
            response = await send(method, url, *args, **kwargs)
        except ApiException as error:  # a typed call's answer that is not 2xx
            refused = error
        split = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(split.query))
        query.update({str(k): str(v) for k, v in kwargs.get("query_params") or []})
        code = refused.status if refused is not None else response.status
        seen = Request.of(method, split.path, query, int(code))
        requests(seen)
        if refused is not None:
            raise refused
        return response

    rest.request = logged


EMULATOR = Emulator()
