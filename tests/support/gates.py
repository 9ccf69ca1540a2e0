"""Stand-ins for the HTTP API's gate and the cluster's reviews, and a client of the API.

- ``Grants`` (a ``kubeauth.Gate``): tokens the test names, each a user granted the accesses
  the test lists; it records what it was asked, and answers ``UNAVAILABLE`` when told to;
- ``Counted`` (a ``kubeauth.Reviews``): wraps another (``KubeReviews`` on a real server, or
  ``Scripted``) and counts the reviews asked, for the cache's tests;
- ``Scripted`` (a ``kubeauth.Reviews``): users by token and grants by user, or ``Unavailable``;
- ``session``: an aiohttp session on the API's TLS port with a bearer token (a self-signed
  certificate is not verified: the tests check who may ask, not the certificate's chain).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

from rebalancer.adapters import kubeauth
from rebalancer.adapters.kubeauth import Access, Answer, Authenticated, Authorized, User, Verdict

TOKEN = "a-token-for-tests"  # ``Grants.everything``'s one user's token
EVERYTHING = "*"


@dataclass
class Grants:
    """``users``: token -> user name; ``grants``: user -> accesses as ``str(Access)``
    (``get /metrics``, ``get decisions.rebalancer.io``), or ``EVERYTHING``."""

    users: dict[str, str] = field(default_factory=dict)
    grants: dict[str, set[str] | str] = field(default_factory=dict)
    unavailable: bool = False
    asked: list[tuple[str | None, Access]] = field(default_factory=list)

    @classmethod
    def everything(cls) -> Grants:
        return cls({TOKEN: "tester"}, {"tester": EVERYTHING})

    async def admit(self, token: str | None, access: Access) -> Answer:
        self.asked.append((token, access))
        if not token:
            return Answer(Verdict.UNAUTHENTICATED, reason="a bearer token is required")
        if self.unavailable:
            return Answer(Verdict.UNAVAILABLE, reason="the TokenReview took longer than 10 s")
        user = self.users.get(token)
        if user is None:
            return Answer(Verdict.UNAUTHENTICATED, reason="the token is not accepted")
        granted = self.grants.get(user, set())
        if granted != EVERYTHING and str(access) not in granted:
            return Answer(Verdict.FORBIDDEN, user, f"{user} may not {access}")
        return Answer(Verdict.ALLOWED, user)


@dataclass
class Scripted:
    """``kubeauth.Reviews`` from tables: ``users`` token -> user, ``grants`` user name ->
    accesses as ``str(Access)``; ``unavailable`` makes every review raise."""

    users: dict[str, User] = field(default_factory=dict)
    grants: dict[str, set[str]] = field(default_factory=dict)
    unavailable: bool = False

    async def authenticate(self, token: str, audiences: tuple[str, ...]) -> Authenticated:
        if self.unavailable:
            raise kubeauth.Unavailable("the TokenReview took longer than 10 s")
        user = self.users.get(token)
        return Authenticated(user, "" if user else "the token is not accepted")

    async def authorize(self, user: User, access: Access) -> Authorized:
        if self.unavailable:
            raise kubeauth.Unavailable("the SubjectAccessReview took longer than 10 s")
        return Authorized(str(access) in self.grants.get(user.name, set()))


@dataclass
class Counted:
    """Counts the reviews ``inner`` is asked."""

    inner: kubeauth.Reviews
    tokens: int = 0
    accesses: int = 0

    async def authenticate(self, token: str, audiences: tuple[str, ...]) -> Authenticated:
        self.tokens += 1
        return await self.inner.authenticate(token, audiences)

    async def authorize(self, user: User, access: Access) -> Authorized:
        self.accesses += 1
        return await self.inner.authorize(user, access)


@contextlib.asynccontextmanager
async def session(base_url: str, token: str | None = TOKEN) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of the API at ``base_url`` sending ``token`` (None: no Authorization)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(ssl=False)
    async with aiohttp.ClientSession(base_url, headers=headers, connector=connector) as made:
        yield made
