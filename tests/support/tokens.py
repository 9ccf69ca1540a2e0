"""Service accounts with tokens, on a real kube-apiserver, as a cluster gives them to
Prometheus and Alertmanager: ``account`` makes one, grants it what it is given (a verb on a
non-resource URL, ``/metrics``, or on a resource, ``alerts.rebalancer.io``) with a ClusterRole
and its binding (plain RBAC, as the chart's), waits until the authorizer says so,
and mints a token with the TokenRequest API for the audience asked (none: the API server's own,
as a pod's mounted token is). ``Account.delete`` takes it all away again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

MADE_HERE = {"tests.rebalancer.io/made-here": "true"}  # what ``backends.Real`` sweeps


@dataclass
class Account:
    api: Any  # the admin's ApiClient
    namespace: str
    name: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    async def token(self, audience: str | None = None, seconds: int = 3600) -> str:
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if audience is not None:
            spec["audiences"] = [audience]
        core: Any = client.CoreV1Api(self.api)  # dict bodies, as the server takes them
        made = await core.create_namespaced_service_account_token(
            self.name, self.namespace, {"spec": spec}
        )
        return str(made.status.token)

    async def delete(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.api)
        for gone in (
            rbac.delete_cluster_role_binding(self._role),
            rbac.delete_cluster_role(self._role),
            client.CoreV1Api(self.api).delete_namespaced_service_account(self.name, self.namespace),
        ):
            with contextlib.suppress(ApiException):
                await gone

    @property
    def _role(self) -> str:
        return f"tests-{self.namespace}-{self.name}"


async def account(
    api: Any, namespace: str, name: str, grants: Sequence[tuple[str, str]] = ()
) -> Account:
    """A ServiceAccount ``namespace/name`` granted each ``(verb, /url or resource.group)``."""
    core: Any = client.CoreV1Api(api)  # dict bodies, as the server takes them
    rbac: Any = client.RbacAuthorizationV1Api(api)
    with contextlib.suppress(ApiException):  # 409: there already
        await core.create_namespace({"metadata": {"name": namespace}})
    made = Account(api, namespace, name)
    meta = {"name": name, "labels": MADE_HERE}
    await core.create_namespaced_service_account(namespace, {"metadata": meta})
    if grants:
        role = {"name": made._role, "labels": MADE_HERE}
        rules = [_rule(verb, what) for verb, what in grants]
        await rbac.create_cluster_role({"metadata": role, "rules": rules})
        subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": made._role}
        await rbac.create_cluster_role_binding(
            {"metadata": role, "roleRef": ref, "subjects": [subject]}
        )
        for verb, path in grants:
            await until_allowed(api, made.user, namespace, verb, path)
    return made


@contextlib.asynccontextmanager
async def accounts(
    api: Any, namespace: str, wanted: dict[str, Sequence[tuple[str, str]]]
) -> AsyncIterator[dict[str, Account]]:
    """``account`` for each name in ``wanted``, deleted when the block ends."""
    made: dict[str, Account] = {}
    try:
        for name, grants in wanted.items():
            made[name] = await account(api, namespace, name, grants)
        yield made
    finally:
        for each in made.values():
            await each.delete()


def _rule(verb: str, what: str) -> dict[str, Any]:
    if what.startswith("/"):
        return {"nonResourceURLs": [what], "verbs": [verb]}
    resource, _, group = what.partition(".")
    return {"apiGroups": [group], "resources": [resource], "verbs": [verb]}


def _attributes(verb: str, what: str) -> dict[str, Any]:
    if what.startswith("/"):
        return {"nonResourceAttributes": {"path": what, "verb": verb}}
    resource, _, group = what.partition(".")
    return {"resourceAttributes": {"group": group, "resource": resource, "verb": verb}}


async def until_allowed(
    api: Any, user: str, namespace: str, verb: str, what: str, within: float = 10.0
) -> None:
    """The RBAC authorizer reads bindings from its informer: wait until it allows ``user`` (a
    service account of ``namespace``) ``verb`` on ``what`` (``/url`` or ``resource.group``)."""
    review = {
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            **_attributes(verb, what),
        }
    }
    authz: Any = client.AuthorizationV1Api(api)
    deadline = time.monotonic() + within
    while not (await authz.create_subject_access_review(review)).status.allowed:
        assert time.monotonic() < deadline, f"{user} not allowed {verb} {what} in {within} s"
        # The server's informer, not ours: there is nothing to wait on but its answer.
        await asyncio.sleep(0.05)
