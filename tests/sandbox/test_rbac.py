"""Bearer tokens and RBAC in the emulator, through the real kubernetes-asyncio client over HTTP.

The emulator is served with an ``Access`` knowing three tokens: a ``system:masters`` admin, the
controller's service account (``system:serviceaccount:rebalancer:rebalancer``) and a plain user
in group ``devs``. The admin writes RBAC objects through the API, as on a real cluster, and the
others are then allowed or refused exactly as kube-apiserver's RBAC authorizer would.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from sandbox.emulator import cluster, rbac
from sandbox.emulator.auth import Access, Decision, admin, service_account
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.rbac import User
from sandbox.emulator.resources import CLUSTERROLES, NODES, PODS, ROLES
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support.reads import raw, status_body

SA = "system:serviceaccount:rebalancer:rebalancer"
ADMIN_TOKEN, SA_TOKEN, JANE_TOKEN = "admin-token", "sa-token", "jane-token"
GROUP = "rbac.authorization.k8s.io"
NODE = "inference-0"
POD_NS = cluster.TRAINING_NAMESPACE


def _rbac_api(api: Any) -> Any:
    return client.RbacAuthorizationV1Api(api)


def _core(api: Any) -> Any:
    return client.CoreV1Api(api)


def _leases(api: Any) -> Any:
    return client.CoordinationV1Api(api)


def api_client(url: str, token: str | None) -> Any:
    configuration = client.Configuration(host=url)
    if token is not None:
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
    return client.ApiClient(configuration)


@dataclass
class Box:
    store: Store
    access: Access
    url: str
    admin: Any  # ApiClient as the admin
    sa: Any  # ApiClient as the service account
    jane: Any  # ApiClient as jane (group devs)

    async def grant(
        self, rules: list[dict[str, Any]], namespace: str | None = None, who: str = "sa"
    ) -> None:
        """A Role (in ``namespace``) or ClusterRole with ``rules``, bound to ``who``."""
        subject = (
            {"kind": "ServiceAccount", "name": "rebalancer", "namespace": "rebalancer"}
            if who == "sa"
            else {"kind": "Group", "name": "devs", "apiGroup": GROUP}
        )
        rbac_api = _rbac_api(self.admin)
        name = f"grant-{len(self.store.peek(CLUSTERROLES)) + len(self.store.peek(ROLES))}"
        role = {"metadata": {"name": name}, "rules": rules}
        kind = "ClusterRole" if namespace is None else "Role"
        binding = {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": GROUP, "kind": kind, "name": name},
            "subjects": [subject],
        }
        if namespace is None:
            await rbac_api.create_cluster_role(role)
            await rbac_api.create_cluster_role_binding(binding)
        else:
            await rbac_api.create_namespaced_role(namespace, role)
            await rbac_api.create_namespaced_role_binding(namespace, binding)


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[Box]:
    store = Store(ManualClock(datetime(2026, 3, 2, 12, tzinfo=UTC)), seed=1)
    cluster.seed(store)
    cluster.add(store, cluster.training_pod("train-0", 0, priority_class=None))
    store.schedule()
    access = Access(
        {
            ADMIN_TOKEN: admin(),
            SA_TOKEN: service_account("rebalancer", "rebalancer"),
            JANE_TOKEN: User("jane", ("devs",)),
        }
    )
    async with (
        serve(store, access=access) as url,
        api_client(url, ADMIN_TOKEN) as root,
        api_client(url, SA_TOKEN) as sa,
        api_client(url, JANE_TOKEN) as jane,
    ):
        yield Box(store, access, url, root, sa, jane)


@pytest.fixture
async def box() -> AsyncIterator[Box]:
    async with running() as b:
        yield b


async def refused(call: Any) -> dict[str, Any]:
    """The 403 ``Status`` of a call that must be refused."""
    with pytest.raises(ApiException) as caught:
        await call
    assert caught.value.status == 403, caught.value.body
    return status_body(caught.value)


def training_pod(box: Box) -> str:
    pods = [p for p in box.store.peek(PODS) if p["metadata"]["namespace"] == POD_NS]
    return str(pods[0]["metadata"]["name"])


# ---------------------------------------------------------------------------------------------
# Authentication


@pytest.mark.parametrize("token", [None, "not-a-known-token"], ids=["no-token", "unknown-token"])
async def test_a_request_without_a_known_token_is_401(box: Box, token: str | None) -> None:
    async with api_client(box.url, token) as anonymous:
        with pytest.raises(ApiException) as caught:
            await _core(anonymous).list_node()
    assert caught.value.status == 401
    assert status_body(caught.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    assert box.access.decisions == []


async def test_system_masters_bypass_rbac_and_are_not_recorded(box: Box) -> None:
    core = _core(box.admin)
    assert len((await core.list_node()).items) == 12
    await core.patch_node(NODE, {"metadata": {"labels": {"x": "y"}}})
    await core.delete_node(NODE)
    assert box.access.decisions == []


async def test_service_accounts_have_the_real_user_name_and_groups() -> None:
    user = service_account("rebalancer", "rebalancer")
    assert user == User(
        SA,
        ("system:serviceaccounts", "system:serviceaccounts:rebalancer", "system:authenticated"),
    )
    access = Access({"t": User("jane", ("devs",))})
    assert access.authenticate("Bearer t") == User("jane", ("devs", "system:authenticated"))
    assert access.authenticate("Basic t") is None
    assert access.authenticate("Bearer other") is None


async def test_a_kubeconfig_with_a_token_authenticates(box: Box, tmp_path: Path) -> None:
    await box.grant([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}])
    path = write_kubeconfig(box.url, tmp_path / "kubeconfig", token=SA_TOKEN)
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        assert len((await _core(api).list_node()).items) == 12
    assert box.access.of(SA) == [Decision(SA, "list", "", "nodes", "", "", "", True)]


# ---------------------------------------------------------------------------------------------
# Authorization


async def test_nothing_is_allowed_without_a_binding(box: Box) -> None:
    body = await refused(_core(box.sa).list_node())
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'nodes is forbidden: User "{SA}" cannot list resource "nodes" in API group "" '
        "at the cluster scope",
        "reason": "Forbidden",
        "details": {"kind": "nodes"},
        "code": 403,
    }


async def test_cluster_scoped_verbs_are_granted_one_by_one(box: Box) -> None:
    await box.grant([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])
    core = _core(box.sa)
    await core.read_node(NODE)
    await core.patch_node(NODE, {"metadata": {"labels": {"lent": "yes"}}})
    body = await refused(core.delete_node(NODE))
    assert body["message"] == (
        f'nodes "{NODE}" is forbidden: User "{SA}" cannot delete resource "nodes" in API group '
        '"" at the cluster scope'
    )
    assert body["details"] == {"name": NODE, "kind": "nodes"}
    assert box.store.get(NODES, None, NODE)["metadata"]["labels"]["lent"] == "yes"
    assert [(d.verb, d.name, d.allowed) for d in box.access.of(SA)] == [
        ("get", NODE, True),
        ("patch", NODE, True),
        ("delete", NODE, False),
    ]


async def test_a_role_grants_in_its_namespace_only(box: Box) -> None:
    await box.grant([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], POD_NS)
    core = _core(box.sa)
    assert (await core.list_namespaced_pod(POD_NS)).items
    other = await refused(core.list_namespaced_pod("elsewhere"))
    assert other["message"] == (
        f'pods is forbidden: User "{SA}" cannot list resource "pods" in API group "" in the '
        'namespace "elsewhere"'
    )
    everywhere = await refused(core.list_pod_for_all_namespaces())
    assert everywhere["message"].endswith('"pods" in API group "" at the cluster scope')


async def test_a_rolebinding_to_a_cluster_role_grants_in_its_namespace_only(box: Box) -> None:
    rbac_api = _rbac_api(box.admin)
    await rbac_api.create_cluster_role(
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        }
    )
    await rbac_api.create_namespaced_role_binding(
        POD_NS,
        {
            "metadata": {"name": "read-pods"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "pod-reader"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "rebalancer", "namespace": "rebalancer"}
            ],
        },
    )
    core = _core(box.sa)
    name = training_pod(box)
    await core.read_namespaced_pod(name, POD_NS)
    assert (await core.list_namespaced_pod(POD_NS)).items
    await refused(core.list_namespaced_pod(cluster.INFERENCE_NAMESPACE))
    await refused(core.list_pod_for_all_namespaces())


async def test_a_subresource_needs_its_own_rule(box: Box) -> None:
    await box.grant([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}])
    core = _core(box.sa)
    name = training_pod(box)
    eviction = {"metadata": {"name": name, "namespace": POD_NS}}
    body = await refused(core.create_namespaced_pod_eviction(name, POD_NS, eviction))
    assert body["message"] == (
        f'pods "{name}" is forbidden: User "{SA}" cannot create resource "pods/eviction" in API '
        f'group "" in the namespace "{POD_NS}"'
    )
    assert body["details"] == {"name": name, "kind": "pods"}
    await box.grant([{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}])
    await core.create_namespaced_pod_eviction(name, POD_NS, eviction)
    assert box.store.get(PODS, POD_NS, name)["metadata"].get("deletionTimestamp")
    # "*/status" names the subresource of every resource.
    await refused(core.patch_node_status(NODE, {"status": {}}))
    await box.grant([{"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]}])
    await core.patch_node_status(NODE, {"status": {}})
    await refused(core.patch_node(NODE, {"metadata": {"labels": {"a": "b"}}}))


async def test_resource_names_match_named_requests_only(box: Box) -> None:
    await box.grant(
        [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["mine"],
                "verbs": ["create", "get", "list", "update"],
            }
        ],
        "rebalancer",
    )
    admin_leases = _leases(box.admin)
    for name in ("mine", "theirs"):
        await admin_leases.create_namespaced_lease(
            "rebalancer", {"metadata": {"name": name}, "spec": {}}
        )
    leases = _leases(box.sa)
    lease = await leases.read_namespaced_lease("mine", "rebalancer")
    await leases.replace_namespaced_lease("mine", "rebalancer", lease)
    theirs = await refused(leases.read_namespaced_lease("theirs", "rebalancer"))
    assert theirs["details"] == {
        "name": "theirs",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }
    assert theirs["message"].startswith('leases.coordination.k8s.io "theirs" is forbidden: ')
    # create has no name to match, even when the body names the listed one
    await admin_leases.delete_namespaced_lease("mine", "rebalancer")
    created = {"metadata": {"name": "mine"}, "spec": {}}
    await refused(leases.create_namespaced_lease("rebalancer", created))
    # a list has a name only through an exact metadata.name field selector
    await refused(leases.list_namespaced_lease("rebalancer"))
    await refused(leases.list_namespaced_lease("rebalancer", field_selector="metadata.name=theirs"))
    await refused(leases.list_namespaced_lease("rebalancer", field_selector="metadata.name!=mine"))
    assert (
        await leases.list_namespaced_lease("rebalancer", field_selector="metadata.name=mine")
    ).items == []


async def test_watch_is_a_verb_of_its_own(box: Box) -> None:
    await box.grant([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}])
    core = _core(box.sa)
    await core.list_node()
    response = await core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert response.status == 403
    body = await raw(response)
    assert body["message"] == (
        f'nodes is forbidden: User "{SA}" cannot watch resource "nodes" in API group "" at the '
        "cluster scope"
    )
    assert [(d.verb, d.allowed) for d in box.access.of(SA)] == [("list", True), ("watch", False)]
    await box.grant([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["watch"]}])
    response = await core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert response.status == 200
    response.release()


async def test_groups_and_wildcards(box: Box) -> None:
    core = _core(box.jane)
    await refused(core.list_node())
    await box.grant([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]}], who="devs")
    await core.read_node(NODE)
    await refused(core.list_node())
    assert box.access.of("jane")[-2:] == [
        Decision("jane", "get", "", "nodes", "", "", NODE, True),
        Decision("jane", "list", "", "nodes", "", "", "", False),
    ]


async def test_non_resource_paths(box: Box) -> None:
    version = await box.sa.call_api(
        "/version", "GET", auth_settings=["BearerToken"], _preload_content=False
    )
    assert version.status == 200
    version.release()
    response = await box.sa.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
    )
    assert response.status == 403
    assert await raw(response) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'forbidden: User "{SA}" cannot get path "/metrics"',
        "reason": "Forbidden",
        "details": {},
        "code": 403,
    }
    assert box.access.of(SA)[-1] == Decision(SA, "get", "", "", "", "", "", False, "/metrics")


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes", {}, ("list", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"watch": "true"}, ("watch", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"watch": "0"}, ("list", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"watch": ""}, ("watch", "", "nodes", "", "", "")),
        ("GET", "/api/v1/watch/nodes", {}, ("watch", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "nodes", "", "", "n1")),
        ("PATCH", "/api/v1/nodes/n1/status", {}, ("patch", "", "nodes", "status", "", "n1")),
        (
            "POST",
            "/api/v1/namespaces/a/pods/p/eviction",
            {},
            ("create", "", "pods", "eviction", "a", "p"),
        ),
        ("DELETE", "/api/v1/namespaces/a/pods", {}, ("deletecollection", "", "pods", "", "a", "")),
        ("DELETE", "/api/v1/namespaces/a/pods/p", {}, ("delete", "", "pods", "", "a", "p")),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases",
            {"fieldSelector": "metadata.name=l"},
            ("list", "coordination.k8s.io", "leases", "", "a", "l"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            {},
            ("update", "coordination.k8s.io", "leases", "", "a", "l"),
        ),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "", "a", "a")),
        (
            "PUT",
            "/api/v1/namespaces/a/status",
            {},
            ("update", "", "namespaces", "status", "a", "a"),
        ),
    ],
)
def test_request_attributes_are_computed_as_the_real_server_does(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    attrs = rbac.attributes(method, path, query)
    assert attrs.resource_request
    got = (attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.namespace, attrs.name)
    assert got == expected


def test_short_paths_are_non_resource_requests() -> None:
    for path in ("/version", "/api/v1", "/apis/rbac.authorization.k8s.io/v1", "/metrics"):
        attrs = rbac.attributes("GET", path, {})
        assert not attrs.resource_request
        assert (attrs.verb, attrs.path) == ("get", path)


# ---------------------------------------------------------------------------------------------
# The RBAC objects themselves


async def test_rbac_objects_are_created_read_listed_updated_and_deleted(box: Box) -> None:
    rbac_api = _rbac_api(box.admin)
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    role = await rbac_api.create_cluster_role({"metadata": {"name": "system:x"}, "rules": [rule]})
    assert role.metadata.uid
    assert role.metadata.resource_version
    role.rules[0].verbs = ["get", "list"]
    updated = await rbac_api.replace_cluster_role("system:x", role)
    assert updated.rules[0].verbs == ["get", "list"]
    assert [r.metadata.name for r in (await rbac_api.list_cluster_role()).items] == ["system:x"]
    binding = {
        "metadata": {"name": "x"},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "system:x"},
        "subjects": [{"kind": "User", "name": "jane", "apiGroup": GROUP}],
    }
    await rbac_api.create_cluster_role_binding(binding)
    assert (await rbac_api.read_cluster_role_binding("x")).subjects[0].name == "jane"
    await _core(box.jane).list_node()
    changed = {**binding, "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "y"}}
    with pytest.raises(ApiException) as caught:
        await rbac_api.replace_cluster_role_binding("x", changed)
    assert caught.value.status == 422
    assert "cannot change roleRef" in status_body(caught.value)["message"]
    await rbac_api.delete_cluster_role_binding("x")
    await refused(_core(box.jane).list_node())
    await rbac_api.delete_cluster_role("system:x")
    assert (await rbac_api.list_cluster_role()).items == []

    await rbac_api.create_namespaced_role("a", {"metadata": {"name": "r"}, "rules": [rule]})
    assert (await rbac_api.read_namespaced_role("r", "a")).rules[0].resources == ["nodes"]
    assert (await rbac_api.list_namespaced_role("b")).items == []
    ns_binding = {**binding, "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "r"}}
    await rbac_api.create_namespaced_role_binding("a", ns_binding)
    assert [b.metadata.name for b in (await rbac_api.list_namespaced_role_binding("a")).items] == [
        "x"
    ]
    await rbac_api.delete_namespaced_role_binding("x", "a")
    await rbac_api.delete_namespaced_role("r", "a")


async def test_invalid_rbac_objects_are_422(box: Box) -> None:
    rbac_api = _rbac_api(box.admin)
    with pytest.raises(ApiException) as caught:
        await rbac_api.create_cluster_role(
            {"metadata": {"name": "bad"}, "rules": [{"apiGroups": [""], "resources": ["pods"]}]}
        )
    assert caught.value.status == 422
    assert status_body(caught.value)["details"]["causes"][0]["field"] == "rules[0].verbs"
    with pytest.raises(ApiException) as caught:
        await rbac_api.create_cluster_role_binding(
            {
                "metadata": {"name": "bad"},
                "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "r"},
                "subjects": [],
            }
        )
    assert caught.value.status == 422


async def test_service_accounts_are_created_read_and_listed(box: Box) -> None:
    core = _core(box.admin)
    await core.create_namespaced_service_account("rebalancer", {"metadata": {"name": "rebalancer"}})
    read = await core.read_namespaced_service_account("rebalancer", "rebalancer")
    assert read.metadata.namespace == "rebalancer"
    listed = await core.list_namespaced_service_account("rebalancer")
    assert [s.metadata.name for s in listed.items] == ["rebalancer"]
    await refused(_core(box.sa).list_namespaced_service_account("rebalancer"))


async def test_a_service_account_subject_names_one_account(box: Box) -> None:
    rbac_api = _rbac_api(box.admin)
    await rbac_api.create_cluster_role(
        {
            "metadata": {"name": "pod-lister"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        }
    )
    ref = {"apiGroup": GROUP, "kind": "ClusterRole", "name": "pod-lister"}
    others = [
        {"kind": "ServiceAccount", "name": "other", "namespace": "rebalancer"},
        {"kind": "ServiceAccount", "name": "rebalancer", "namespace": "elsewhere"},
        {"kind": "User", "name": "rebalancer"},
    ]
    await rbac_api.create_cluster_role_binding(
        {"metadata": {"name": "others"}, "roleRef": ref, "subjects": others}
    )
    core = _core(box.sa)
    await refused(core.list_pod_for_all_namespaces())
    # A RoleBinding's service account subject without a namespace is in the binding's.
    local = [{"kind": "ServiceAccount", "name": "rebalancer"}]
    await rbac_api.create_namespaced_role_binding(
        "elsewhere", {"metadata": {"name": "local"}, "roleRef": ref, "subjects": local}
    )
    await refused(core.list_namespaced_pod("elsewhere"))
    await rbac_api.create_namespaced_role_binding(
        "rebalancer", {"metadata": {"name": "local"}, "roleRef": ref, "subjects": local}
    )
    await core.list_namespaced_pod("rebalancer")
    await refused(core.list_namespaced_pod("elsewhere"))
