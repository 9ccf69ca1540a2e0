"""Who sent an HTTP request, and whether they may: the cluster decides (TokenReview, then
SubjectAccessReview), as controller-runtime's secure metrics ask it
(``filters.WithAuthenticationAndAuthorization``).

Where it sits: ``runtime.http`` hands every request but the probes to a ``Gate`` with the
request's bearer token and the ``Access`` its route maps to (a non-resource URL and a verb);
the answer is a ``Verdict`` the server turns into a status: ``ALLOWED`` serves,
``UNAUTHENTICATED`` is a 401, ``FORBIDDEN`` a 403 and ``UNAVAILABLE`` a 503. A review that
cannot be made (the API server refuses the review itself, times out, is unreachable) is
``UNAVAILABLE``, never a pass.

Why the cluster: the port then needs nothing of its own to administer. Who may scrape, read
the audit log or wake the loop is plain RBAC (a ClusterRole's ``nonResourceURLs`` for
``/metrics``, virtual resources of ``rebalancer.io`` for the rest), granted and revoked as
everything else in the cluster is (docs/http.md#who-may-ask).

- ``KubeReviews`` asks the API server (``authentication.k8s.io/v1`` and
  ``authorization.k8s.io/v1`` through kubernetes-asyncio); ``Reviews`` is the seam it fills.
- ``CachedGate`` keeps the answers as controller-runtime keeps them: a token's (accepted or
  rejected) 1 minute, an allow 5 minutes, a denial 30 seconds, an unavailable answer never.
  A token is kept only as its SHA-256 digest, and no token is ever logged.
- ``OpenGate`` lets everything through: ``http.authentication: none``, for a port fronted by
  a proxy of its own (the start-up says so loudly).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

# controller-runtime's (pkg/metrics/filters): how long an answer is kept.
TOKEN_TTL = 60.0
ALLOW_TTL = 300.0
DENY_TTL = 30.0
REVIEW_TIMEOUT = 10.0  # seconds a review may take before the request is a 503
MAX_CACHED = 4096  # answers kept per cache: a flood of new tokens cannot grow it without bound


class Verdict(StrEnum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or the cluster does not accept it: 401
    FORBIDDEN = "forbidden"  # a known user RBAC does not grant the access: 403
    UNAVAILABLE = "unavailable"  # the review could not be made: 503, never a pass


@dataclass(frozen=True)
class Access:
    """What a request asks: ``verb`` on a virtual resource of ``group`` (``resourceAttributes``,
    when ``resource`` is set) or on the non-resource URL ``path`` (``nonResourceAttributes``).

    ``audiences``: the audiences the token must be minted for; empty is the API server's own
    (a pod's mounted service-account token)."""

    verb: str
    path: str = ""
    group: str = ""
    resource: str = ""
    audiences: tuple[str, ...] = ()

    def __str__(self) -> str:
        """As ``kubectl auth can-i`` takes it: ``get decisions.rebalancer.io``, ``get /metrics``."""
        what = f"{self.resource}.{self.group}" if self.resource else self.path
        return f"{self.verb} {what}"

    def attributes(self) -> dict[str, Any]:
        """The SubjectAccessReview's ``spec`` fields for it."""
        if self.resource:
            resource = {"group": self.group, "resource": self.resource, "verb": self.verb}
            return {"resourceAttributes": resource}
        return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}


@dataclass(frozen=True)
class User:
    """An authenticated identity, as the TokenReview reports it."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Answer:
    verdict: Verdict
    user: str = ""  # who, when the token was accepted
    reason: str = ""  # why not, in the cluster's words or ours (never the token)


class Gate(Protocol):
    """What ``runtime.http`` asks before it serves a request; ``token`` is None without one."""

    async def admit(self, token: str | None, access: Access) -> Answer: ...


class Unavailable(Exception):
    """A review could not be made; the message says why (never the token)."""


@dataclass(frozen=True)
class Authenticated:
    user: User | None  # None: the cluster does not accept the token
    reason: str = ""


@dataclass(frozen=True)
class Authorized:
    allowed: bool
    reason: str = ""


class Reviews(Protocol):
    """The two questions, asked of the cluster; each raises ``Unavailable`` when it cannot be
    asked."""

    async def authenticate(self, token: str, audiences: tuple[str, ...]) -> Authenticated: ...

    async def authorize(self, user: User, access: Access) -> Authorized: ...


# ---------------------------------------------------------------------------------------------
# The cluster's answers


class KubeReviews:
    """``Reviews`` through the API server, as the controller's own service account (which the
    chart grants ``create`` on ``tokenreviews`` and ``subjectaccessreviews``)."""

    def __init__(self, api: Any, timeout: float = REVIEW_TIMEOUT) -> None:
        self.authn = client.AuthenticationV1Api(api)
        self.authz = client.AuthorizationV1Api(api)
        self.timeout = timeout

    async def authenticate(self, token: str, audiences: tuple[str, ...]) -> Authenticated:
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = await self._ask("TokenReview", self.authn.create_token_review, body)
        u = status.get("user") or {}
        if not status.get("authenticated") or not u.get("username"):
            return Authenticated(None, str(status.get("error") or "the token is not accepted"))
        if audiences and not set(status.get("audiences") or ()) & set(audiences):
            # The API server checked the audiences asked for; an authenticator that ignores
            # them (a webhook) must not let a token for another audience through.
            return Authenticated(None, f"the token is not for audience {', '.join(audiences)}")
        extra = tuple(sorted((k, tuple(v or ())) for k, v in (u.get("extra") or {}).items()))
        groups = tuple(u.get("groups") or ())
        return Authenticated(User(str(u["username"]), str(u.get("uid") or ""), groups, extra))

    async def authorize(self, user: User, access: Access) -> Authorized:
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            **access.attributes(),
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        status = await self._ask(
            "SubjectAccessReview", self.authz.create_subject_access_review, body
        )
        if not status.get("allowed") or status.get("denied"):
            return Authorized(False, str(status.get("reason") or f"{user.name} may not {access}"))
        return Authorized(True)

    async def _ask(
        self, kind: str, create: Callable[..., Any], body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The review's ``status``. Read raw (``_preload_content=False``): the client logs a
        read body at DEBUG, and a TokenReview's answer repeats the token."""
        try:
            async with asyncio.timeout(self.timeout):
                response = await create(body, _preload_content=False)
                try:
                    if not 200 <= response.status <= 299:
                        why = f"the API server refused the {kind}: {response.status}"
                        raise Unavailable(f"{why} {response.reason or ''}".rstrip())
                    doc = await response.json()
                finally:
                    response.release()
        except Unavailable:
            raise
        except TimeoutError:
            raise Unavailable(f"the {kind} took longer than {self.timeout:g} s") from None
        except ApiException as exc:
            why = f"the API server refused the {kind}: {exc.status} {exc.reason}"
            raise Unavailable(why) from None
        except Exception as exc:  # unreachable, reset, TLS, not JSON (aiohttp, OSError, ...)
            raise Unavailable(f"the {kind} could not be made: {type(exc).__name__}") from None
        status = doc.get("status") if isinstance(doc, dict) else None
        return status if isinstance(status, dict) else {}


# ---------------------------------------------------------------------------------------------
# The gates


def digest(token: str) -> str:
    """What a token is kept as: its SHA-256, never the token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class _Ttl:
    """Answers kept until their time; the oldest go first beyond ``MAX_CACHED``."""

    clock: Callable[[], float]
    kept: dict[Any, tuple[float, Any]] = field(default_factory=dict)

    def get(self, key: Any) -> Any | None:
        hit = self.kept.get(key)
        if hit is None:
            return None
        until, value = hit
        if self.clock() >= until:
            del self.kept[key]
            return None
        return value

    def put(self, key: Any, value: Any, ttl: float) -> None:
        self.kept.pop(key, None)
        self.kept[key] = (self.clock() + ttl, value)
        while len(self.kept) > MAX_CACHED:
            del self.kept[next(iter(self.kept))]


class CachedGate:
    """``Gate`` over ``Reviews``: authenticate the token, then authorize the user, each answer
    kept for controller-runtime's times. ``clock`` is monotonic seconds (injected by tests)."""

    def __init__(
        self,
        reviews: Reviews,
        clock: Callable[[], float],
        *,
        token_ttl: float = TOKEN_TTL,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
    ) -> None:
        self.reviews = reviews
        self.tokens = _Ttl(clock)
        self.decisions = _Ttl(clock)
        self.token_ttl, self.allow_ttl, self.deny_ttl = token_ttl, allow_ttl, deny_ttl

    async def admit(self, token: str | None, access: Access) -> Answer:
        if not token:
            return Answer(Verdict.UNAUTHENTICATED, reason="a bearer token is required")
        try:
            who = await self._authenticate(token, access.audiences)
            if who.user is None:
                return Answer(Verdict.UNAUTHENTICATED, reason=who.reason)
            may = await self._authorize(who.user, access)
        except Unavailable as exc:
            log.warning("http: %s: no review could be made: %s", access, exc)
            return Answer(Verdict.UNAVAILABLE, reason=str(exc))
        if not may.allowed:
            return Answer(Verdict.FORBIDDEN, who.user.name, may.reason)
        return Answer(Verdict.ALLOWED, who.user.name)

    async def _authenticate(self, token: str, audiences: tuple[str, ...]) -> Authenticated:
        key = (digest(token), audiences)
        kept: Authenticated | None = self.tokens.get(key)
        if kept is None:
            kept = await self.reviews.authenticate(token, audiences)
            self.tokens.put(key, kept, self.token_ttl)
        return kept

    async def _authorize(self, user: User, access: Access) -> Authorized:
        key = (user, access.verb, access.path, access.group, access.resource)
        kept: Authorized | None = self.decisions.get(key)
        if kept is None:
            kept = await self.reviews.authorize(user, access)
            self.decisions.put(key, kept, self.allow_ttl if kept.allowed else self.deny_ttl)
        return kept


class OpenGate:
    """Every request let through (``http.authentication: none``)."""

    async def admit(self, token: str | None, access: Access) -> Answer:
        return Answer(Verdict.ALLOWED, reason="authentication is off (http.authentication: none)")


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None without one (an empty
    token, or another scheme, is none)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
