"""Who is asking, and may they: static bearer tokens, RBAC, and a record of every decision.

``Access`` is what ``serve(store, access=...)`` enforces; without it the emulator lets every
request through, as before. It authenticates as kube-apiserver's ``--token-auth-file`` does: the
``Authorization: Bearer <token>`` header names a user (name and groups, ``system:authenticated``
added as the server adds it), and a request without a known token is 401 ``Unauthorized``. A
member of ``system:masters`` is allowed everything without asking RBAC (as the real server's
privileged-group authorizer does); anyone else is authorized by ``rbac.allows`` against the
RBAC objects in the store, and denied with the real 403. Each of those decisions is appended to
``Access.decisions`` so a test can compare what a client used with what it was granted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sandbox.emulator import rbac
from sandbox.emulator.rbac import Attributes, User

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"


def service_account(namespace: str, name: str) -> User:
    """The user a service account's token authenticates as, with the groups the real
    service account authenticator gives it."""
    return User(
        rbac.service_account_name(namespace, name),
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


def admin(name: str = "kubernetes-admin") -> User:
    """A cluster administrator: a member of ``system:masters``, which bypasses RBAC."""
    return User(name, (MASTERS, AUTHENTICATED))


@dataclass(frozen=True, slots=True)
class Decision:
    """One authorization decision for a user outside ``system:masters``; ``path`` is set for
    non-resource requests (``/version``...), whose resource fields are empty."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    allowed: bool
    path: str = ""


class Access:
    """Token authentication and RBAC authorization for one served store."""

    def __init__(self, tokens: Mapping[str, User]) -> None:
        self.tokens = {
            token: user
            if AUTHENTICATED in user.groups
            else User(user.name, (*user.groups, AUTHENTICATED))
            for token, user in tokens.items()
        }
        self.decisions: list[Decision] = []

    def authenticate(self, header: str | None) -> User | None:
        """The user of an ``Authorization`` header, or None (the request is 401)."""
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.tokens.get(token.strip())

    def authorize(self, store: object, user: User, attrs: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        allowed = rbac.allows(store, user, attrs)
        self.decisions.append(
            Decision(
                user=user.name,
                verb=attrs.verb,
                group=attrs.group,
                resource=attrs.resource,
                subresource=attrs.subresource,
                namespace=attrs.namespace,
                name=attrs.name,
                allowed=allowed,
                path="" if attrs.resource_request else attrs.path,
            )
        )
        return allowed

    def of(self, user: str) -> list[Decision]:
        """The decisions made for ``user`` (by name), in order."""
        return [d for d in self.decisions if d.user == user]
