"""An emulated cluster per test: the API emulator on a manual clock, served over real HTTP.

``running()`` gives a ``Sandbox``: its own ``Store`` on a ``ManualClock`` (time moves only when
the test advances it), served on a free port of 127.0.0.1 with a ``FaultInjector`` the test may
configure (and, given ``access``, its authentication and RBAC, the client using ``token``), a
configured ``ApiClient`` with the typed APIs, and ``requests``, the log of every
request the server answered (told by ``serve(on_request=...)``, so it holds what came over HTTP
and nothing a test did to the store directly). ``seeded=True`` starts from the default GPU
cluster (8 inference and 4 training nodes); ``on_request`` is told of each request too, as it
is logged; other keyword arguments go to the ``Store``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from sandbox.emulator import cluster
from sandbox.emulator.auth import Access
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.faults import FaultInjector
from sandbox.emulator.server import Request, serve
from sandbox.emulator.store import Store
from tests.support.factories import T0
from tests.support.waits import Pulse


@dataclass
class Requests:
    """Every request the emulator answered, in order; each one is handed to ``then`` (a test's
    own observer, if it has one) and pulses ``pulse``."""

    then: Callable[[Request], object] | None = None
    seen: list[Request] = field(default_factory=list)
    pulse: Pulse = field(default_factory=Pulse)

    def __call__(self, request: Request) -> None:
        self.seen.append(request)
        if self.then is not None:
            self.then(request)
        self.pulse()

    @property
    def lists(self) -> list[Request]:
        return [r for r in self.seen if r.is_list]

    @property
    def watches(self) -> list[Request]:
        return [r for r in self.seen if r.is_watch]

    def lists_of(self, plural: str) -> int:
        """Lists of ``plural``: LISTs (first pages only: a continued list is one list) and
        watches that stream a list (``sendInitialEvents``)."""
        return sum(1 for r in self.seen if r.resource == plural and asks_for_list(r))

    def watches_of(self, plural: str) -> list[Request]:
        return [r for r in self.watches if r.resource == plural]

    def writes_of(self, plural: str) -> list[Request]:
        """Writes of ``plural`` the server took."""
        return [r for r in self.seen if r.resource == plural and taken(r)]


def asks_for_list(request: Request) -> bool:
    """Whether ``request`` asks for a whole list: a LIST's first page, or a streamed list."""
    if request.is_list:
        return not request.query.get("continue")
    return request.is_watch and request.flag("sendInitialEvents")


def taken(request: Request) -> bool:
    """A write the server took: answered 2xx, and not a dry run."""
    return (
        request.is_write
        and 200 <= request.status < 300
        and request.query.get("dryRun") != "All"
        and request.response is not None
    )


@dataclass
class Sandbox:
    store: Store
    clock: ManualClock
    faults: FaultInjector
    requests: Requests
    url: str
    api: Any  # kubernetes_asyncio.client.ApiClient
    core: Any
    policy: Any
    coordination: Any
    events: Any

    def schedule(self) -> list[tuple[str, str, str]]:
        return self.store.schedule()


def configuration(url: str, token: str | None = None) -> Any:
    """A client's configuration for the emulator at ``url``, as ``token``'s user if given."""
    made = client.Configuration(host=url)
    if token is not None:
        made.api_key = {"BearerToken": f"Bearer {token}"}
    return made


@contextlib.asynccontextmanager
async def running(
    seeded: bool = False,
    on_request: Callable[[Request], object] | None = None,
    access: Access | None = None,
    token: str | None = None,
    **options: Any,
) -> AsyncIterator[Sandbox]:
    clock = ManualClock(T0)
    store = Store(clock, seed=1, **options)
    if seeded:
        cluster.seed(store)
    faults = FaultInjector()
    requests = Requests(then=on_request)
    async with (
        serve(store, faults=faults, on_request=requests, access=access) as url,
        kubeclient.opened(configuration(url, token)) as api,
    ):
        yield Sandbox(
            store=store,
            clock=clock,
            faults=faults,
            requests=requests,
            url=url,
            api=api,
            core=client.CoreV1Api(api),
            policy=client.PolicyV1Api(api),
            coordination=client.CoordinationV1Api(api),
            events=client.EventsV1Api(api),
        )
