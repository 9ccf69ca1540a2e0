"""The controller's HTTP endpoints: metrics and a read-only audit API behind the cluster's
authentication, and the probes on a plain port of their own (plain aiohttp).

Two ports:

- the API (``http.port``): TLS (a mounted certificate, or a self-signed one made at start:
  ``runtime.tls``), and every request, to a route of ours or not, admitted by a
  ``kubeauth.Gate`` first. ``access`` maps each route to what RBAC grants (``/metrics`` a
  non-resource URL; the audit API and the receiver virtual resources of ``rebalancer.io``);
  no or an empty token, or one the cluster rejects, is a 401, a user RBAC does not grant it a
  403, a review that cannot be made a 503, never a pass (docs/http.md#who-may-ask). With
  ``http.authentication: none`` the gate is ``kubeauth.OpenGate``: anyone who reaches it.
- the probes (``http.health_port``): plain HTTP, no token (the kubelet sends none), and only
  ``/healthz`` and ``/readyz``.

The API:

- ``GET /metrics``: ``Telemetry.exposed`` (its registry) in the Prometheus text format
  (OpenMetrics if the scraper's ``Accept`` asks for it).
- ``GET /api/v1/decisions``: a page of audit records (``AuditStore.query``), oldest first
  unless ``order=desc``, with the store's keyset cursor as ``next``. ``parse_query`` reads its
  parameters; ``rebalancer audit`` reads its flags with it too, so both take the same values
  (``since=2h`` as well as an RFC 3339 time).
- ``GET /api/v1/explain?node=NAME`` or ``?pool=NAME``: the node or pool as the loop's last tick
  saw and planned it (``runtime.explaining``, the same document as ``rebalancer explain --json``);
  404 for a node no pool selects, 503 before the first tick.
- ``POST /api/v1/alertmanager``: Alertmanager's webhook (version 4), when the server is given
  a ``runtime.alerts.Receiver``: a firing alert that matches a pool's ``wake_on`` runs the
  reconcile step at once and holds the pool (docs/design/alertmanager.md). The body is read up
  to ``alerts.MAX_BODY`` bytes (more is a 413) and its nesting counted before it is parsed
  (deeper than ``alerts.MAX_DEPTH`` is a 400): neither reaches ``json.loads``. Its token must
  be minted for the receiver's audience (``http.alertmanager_audience``), so no pod's mounted
  token can post, whatever RBAC grants its account.

The probes:

- ``GET /healthz``: 200 whenever the event loop runs the handler (the process is alive).
- ``GET /readyz``: 200 once the ``ready`` callable says so (caches synced and, with leader
  election, the lease holder known, whoever it is), else 503 with the reason.

Errors are JSON, never a traceback: a bad parameter is a 400 naming the parameter, its value
and why; a store that raises or does not answer within ``query_timeout`` is a 503 (the
exception itself goes to the log, not to the client: it may carry SQL or a database URL).
No token is ever logged or answered back.

The server is an async context manager: ``async with HttpServer(...) as server`` binds both
ports (port 0: a free port, then ``server.port`` and ``server.health_port``) and serves until
the block ends. See docs/http.md and docs/design/http-server.md.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from rebalancer import errors
from rebalancer.adapters import kubeauth
from rebalancer.adapters.audit import AuditQuery, AuditStore, Cursor
from rebalancer.core import audit, bounded
from rebalancer.core.audit import Kind
from rebalancer.core.model import Action
from rebalancer.errors import ConfigError
from rebalancer.runtime import alerts as alerting
from rebalancer.runtime import tls as certificates
from rebalancer.runtime.explaining import NotExplained
from rebalancer.runtime.telemetry import Telemetry

log = logging.getLogger(__name__)
T = TypeVar("T")
# ``node``, ``pool`` (one of them) -> the explanation; None before the first tick.
Explainer = Callable[[str | None, str | None], dict[str, Any] | None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_HOST = "0.0.0.0"  # probes and scrapes come from outside the Pod
DEFAULT_PORT = 8443
DEFAULT_HEALTH_PORT = 8081
DEFAULT_AUDIENCE = "rebalancer"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

PARAMETERS = frozenset(
    {"since", "until", "cluster", "pool", "node", "action", "kind", "limit", "cursor", "order"}
)

# RFC 3339 section 5.6 date-time: a full date, a full time, and an offset (Z or +hh:mm).
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?P<frac>\.\d+)?(?P<tz>[Zz]|[+-]\d{2}:\d{2})"
)
# A time ago: days, hours, minutes and seconds, largest first, each at most once (7d, 2h, 1h30m).
_AGO = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,7})h)?(?:(\d{1,9})m)?(?:(\d{1,10})s)?")
_LONGEST_AGO = timedelta(days=100 * 365)  # keeps now minus it a time (year 1 is the floor)
TIME_FORMS = (
    "an RFC 3339 date-time with an offset (2026-03-02T12:00:00Z) or a time ago (30m, 2h, 7d)"
)


# ---------------------------------------------------------------------------------------------
# Readiness


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # why not, or what is ready


ReadyCheck = Callable[[], Readiness]


def readiness(
    synced: bool, election: bool, holder: str, audit_failing: str | None = None
) -> Readiness:
    """The controller's readiness: caches synced, and with leader election a holder known.

    ``holder`` is the identity the Lease names ('' when not read yet or released): being a
    follower is ready (the replica serves metrics and the audit API), not knowing is not.

    ``audit_failing`` (why the store fails this replica's writes) is said, and leaves the
    replica ready: readiness only takes a Pod out of its Service, and the Service is how the
    Alertmanager webhook and Prometheus reach the leader that is still taking nodes back for
    inference (docs/design/audit-failure.md). The ``rebalancer_audit_store_failing`` gauge
    and its alert are what call a person.
    """
    if not synced:
        return Readiness(False, "the informer caches are not synced yet")
    if election and not holder:
        return Readiness(False, "leader election has not settled: no lease holder known yet")
    said = f"caches synced; the leader is {holder}" if election else "caches synced"
    if audit_failing is not None:
        said += (
            f"; the audit store fails ({audit_failing}): no lending, safety reclaims recorded "
            "on their nodes until it takes writes"
        )
    return Readiness(True, said)


# ---------------------------------------------------------------------------------------------
# The decisions query


class BadParameter(Exception):
    def __init__(self, parameter: str, value: str, message: str) -> None:
        super().__init__(f"{parameter}={errors.shown(value)}: {message}")
        self.parameter, self.value, self.message = parameter, value, message

    def body(self) -> dict[str, Any]:
        return {
            "error": "bad_parameter",
            "parameter": self.parameter,
            "value": bounded.cut(self.value),  # what the client sent: it need not read it whole
            "message": self.message,
        }


def parse_time(name: str, text: str, now: datetime) -> datetime:
    """An RFC 3339 date-time with its offset, or a time ago (``2h``: ``now`` minus two hours),
    as an aware UTC datetime."""
    ago = _AGO.fullmatch(text)
    if text and ago is not None:
        days, hours, minutes, seconds = (int(n or 0) for n in ago.groups())
        span = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if span > _LONGEST_AGO:
            raise BadParameter(name, text, "must be at most 100 years ago")
        return (now - span).astimezone(UTC)
    # A '+hh:mm' offset sent unencoded in a URL arrives as ' hh:mm'.
    found = _RFC3339.fullmatch(re.sub(r" (\d{2}:\d{2})$", r"+\1", text))
    if found is None:
        raise BadParameter(name, text, f"must be {TIME_FORMS}")
    frac = found["frac"] or ""
    # Python parses at most microseconds; RFC 3339 allows any number of digits.
    given = found.string
    normal = given[: found.start("frac")] if frac else given[: found.start("tz")]
    normal = normal.replace("t", "T").replace(" ", "T") + frac[:7]
    tz = found["tz"]
    normal += "+00:00" if tz in ("Z", "z") else tz
    try:
        return datetime.fromisoformat(normal).astimezone(UTC)
    except ValueError as e:
        raise BadParameter(name, text, f"is not a valid date-time: {e}") from None


def parse_query(params: Mapping[str, list[str]], now: datetime) -> AuditQuery:
    """The ``AuditQuery`` a request's parameters ask for; ``BadParameter`` names what is wrong.

    ``params`` maps each parameter to every value it was given (repeats kept), in order;
    ``now`` is what a time ago (``since=2h``) counts back from.
    """
    _check_known_and_single(params)

    def one(name: str) -> str | None:
        values = params.get(name)
        return values[0] if values else None

    since = _maybe(one("since"), lambda t: parse_time("since", t, now))
    until = _maybe(one("until"), lambda t: parse_time("until", t, now))
    if since is not None and until is not None and until <= since:
        raise BadParameter("until", one("until") or "", "must be after since")

    names = {name: _parse_name(name, one(name)) for name in ("cluster", "pool", "node")}

    action = one("action")
    if action is not None and action not in {a.value for a in Action}:
        raise BadParameter("action", action, _one_of(a.value for a in Action))

    kinds = _parse_kinds(params.get("kind", []))
    limit = _parse_limit(one("limit"))

    after = _maybe(one("cursor"), parse_cursor)

    order = one("order") or "asc"
    if order not in ("asc", "desc"):
        raise BadParameter("order", order, _one_of(("asc", "desc")))

    return AuditQuery(
        since=since,
        until=until,
        cluster=names["cluster"],
        pool=names["pool"],
        node=names["node"],
        action=action,
        kinds=kinds,
        after=after,
        limit=limit,
        newest_first=order == "desc",
    )


def _check_known_and_single(params: Mapping[str, list[str]]) -> None:
    """Refuse a parameter the API does not know, or one other than ``kind`` given twice."""
    for name in sorted(params):
        if name not in PARAMETERS:
            raise BadParameter(
                name, params[name][0], f"unknown parameter; known: {', '.join(sorted(PARAMETERS))}"
            )
        if name != "kind" and len(params[name]) > 1:
            raise BadParameter(name, params[name][1], "given more than once")


def _parse_name(name: str, value: str | None) -> str | None:
    """A ``cluster``, ``pool`` or ``node`` filter, refused when given but blank."""
    if value is not None and not value.strip():
        raise BadParameter(name, value, "must not be empty")
    return value


def _parse_kinds(given_values: list[str]) -> tuple[Kind, ...]:
    """Every ``kind`` asked for, repeated or comma-separated, once each in first-seen order."""
    kinds: list[Kind] = []
    for given in given_values:
        for part in given.split(","):
            if part not in {k.value for k in Kind}:
                raise BadParameter("kind", given, _one_of(k.value for k in Kind))
            if Kind(part) not in kinds:
                kinds.append(Kind(part))
    return tuple(kinds)


def _parse_limit(text: str | None) -> int:
    """The page size asked for, ``DEFAULT_LIMIT`` when not given."""
    if text is None:
        return DEFAULT_LIMIT
    if not re.fullmatch(r"\d{1,7}", text) or not 1 <= int(text) <= MAX_LIMIT:
        raise BadParameter("limit", text, f"must be an integer from 1 to {MAX_LIMIT}")
    return int(text)


def parse_cursor(token: str) -> Cursor:
    """A page's ``next`` token back (``Cursor.token``: ``<time>|<id>``)."""
    why = "is not a cursor this API returned (pass a page's next unchanged, URL-encoded)"
    # A '+' of the offset sent unencoded arrives as a space; the time part has no other space.
    repaired = token.replace(" ", "+")
    _, bar, ident = repaired.partition("|")
    if not bar or not re.fullmatch(r"[0-9A-Za-z]{1,64}", ident):
        raise BadParameter("cursor", token, why)
    try:
        cursor = Cursor.parse(repaired)
    except ValueError:
        raise BadParameter("cursor", token, why) from None
    if cursor.time.tzinfo is None:  # our tokens always carry +00:00
        raise BadParameter("cursor", token, why)
    return cursor


def _maybe(text: str | None, parse: Callable[[str], T]) -> T | None:
    return None if text is None else parse(text)


def _one_of(values: Any) -> str:
    return "must be one of " + ", ".join(values)


# ---------------------------------------------------------------------------------------------
# Who may ask what


def access(method: str, path: str, alertmanager_audience: str) -> kubeauth.Access:
    """What a request asks of the cluster's authorizer (docs/http.md#who-may-ask).

    ``GET /metrics`` is ``get`` on the non-resource URL ``/metrics``, as controller-runtime's
    secure metrics ask it (the grant a Prometheus already has). The audit API and the receiver
    are virtual resources of ``rebalancer.io``: ``get decisions``, ``get explanations``,
    ``create alerts``. Not their URLs: the bootstrap ClusterRole ``system:discovery`` grants
    every authenticated user ``get`` on ``/api/*``, so any service account of the cluster
    would read the audit log. Any other path is its URL with its method, lower-cased, as the
    verb (kube-apiserver's own mapping), and is a 404 once admitted. The receiver's token must
    be minted for ``alertmanager_audience``; the others take the API server's own (a pod's
    mounted token)."""
    route = ROUTES.get((method.upper(), path))
    if route is None:
        return kubeauth.Access(verb=method.lower(), path=path)
    verb, resource = route
    if resource is None:
        return kubeauth.Access(verb=verb, path=path)
    audiences = (alertmanager_audience,) if path == ALERTMANAGER_PATH else ()
    return kubeauth.Access(verb=verb, group=GROUP, resource=resource, audiences=audiences)


GROUP = "rebalancer.io"
ALERTMANAGER_PATH = "/api/v1/alertmanager"
# (method, path) -> (verb, virtual resource of GROUP, or None: the path as a non-resource URL)
ROUTES: Mapping[tuple[str, str], tuple[str, str | None]] = {
    ("GET", "/metrics"): ("get", None),
    ("HEAD", "/metrics"): ("get", None),
    ("GET", "/api/v1/decisions"): ("get", "decisions"),
    ("HEAD", "/api/v1/decisions"): ("get", "decisions"),
    ("GET", "/api/v1/explain"): ("get", "explanations"),
    ("HEAD", "/api/v1/explain"): ("get", "explanations"),
    ("POST", ALERTMANAGER_PATH): ("create", "alerts"),
}
_REFUSALS = {
    kubeauth.Verdict.UNAUTHENTICATED: (401, "unauthorized"),
    kubeauth.Verdict.FORBIDDEN: (403, "forbidden"),
    kubeauth.Verdict.UNAVAILABLE: (503, "review_unavailable"),
}


# ---------------------------------------------------------------------------------------------
# The server


class HttpServer:
    """The API on ``host:port`` (TLS, each request through ``gate``) and the probes on
    ``host:health_port`` (plain HTTP, nothing else); ``async with`` starts and stops both."""

    def __init__(
        self,
        *,
        telemetry: Telemetry,
        store: AuditStore,
        ready: ReadyCheck,
        gate: kubeauth.Gate,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        health_port: int = DEFAULT_HEALTH_PORT,
        tls: ssl.SSLContext | None = None,
        alertmanager_audience: str = DEFAULT_AUDIENCE,
        query_timeout: float = 10.0,
        alerts: alerting.Receiver | None = None,
        explain: Explainer | None = None,
    ) -> None:
        self.telemetry, self.store, self.ready = telemetry, store, ready
        self.gate, self.alertmanager_audience = gate, alertmanager_audience
        self.host, self.port, self.health_port = host, port, health_port
        self.tls = tls
        self.query_timeout = query_timeout
        self.app = web.Application(middlewares=[self._admit])
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/api/v1/decisions", self._decisions)
        self.alerts = alerts
        self.explain = explain
        if explain is not None:
            self.app.router.add_get("/api/v1/explain", self._explain)
        if alerts is not None:
            self.app.router.add_post(ALERTMANAGER_PATH, self._alertmanager)
        # The probes: the kubelet asks them without a token, so they are served apart.
        self.health = web.Application()
        self.health.router.add_get("/healthz", self._healthz)
        self.health.router.add_get("/readyz", self._readyz)
        self._runners: list[web.AppRunner] = []

    @property
    def url(self) -> str:
        return f"https://{self._host()}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"http://{self._host()}:{self.health_port}"

    def _host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    async def start(self) -> None:
        tls = self.tls if self.tls is not None else certificates.context(None, None)
        try:
            self.port = await self._serve(self.app, self.port, "http.port", tls)
            self.health_port = await self._serve(self.health, self.health_port, "http.health_port")
        except BaseException:
            await self.stop()
            raise
        log.info("http: serving the API on %s and the probes on %s", self.url, self.health_url)

    async def _serve(
        self, app: web.Application, port: int, field: str, tls: ssl.SSLContext | None = None
    ) -> int:
        """``app`` on ``port`` (0: a free one), the port it took."""
        # No access log: probes and scrapes come every few seconds.
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, port, ssl_context=tls).start()
        except OSError as exc:  # the port is taken, the address is not this machine's
            await runner.cleanup()
            why = exc.strerror or str(exc)
            raise ConfigError(f"http.host={self.host!r}, {field}={port}: {why}") from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runners.append(runner)
        return port if port else int(runner.addresses[0][1])

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in reversed(runners):
            await runner.cleanup()

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @web.middleware
    async def _admit(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every API request, a route of ours or not, is the cluster's to admit first."""
        token = kubeauth.bearer(request.headers.get("Authorization"))
        answer = await self.gate.admit(
            token, access(request.method, request.path, self.alertmanager_audience)
        )
        if answer.verdict is kubeauth.Verdict.ALLOWED:
            return await handler(request)
        status, error = _REFUSALS[answer.verdict]
        log.debug(
            "http: %s %s refused (%s%s): %s",
            request.method,
            request.path,
            answer.verdict,
            f", {answer.user}" if answer.user else "",
            answer.reason,
        )
        headers = {"WWW-Authenticate": 'Bearer realm="rebalancer"'} if status == 401 else None
        body = {"error": error, "message": answer.reason}
        return web.json_response(body, status=status, headers=headers)

    # -----------------------------------------------------------------------------------------
    # Handlers

    async def _metrics(self, request: web.Request) -> web.Response:
        # The client library's own negotiation: OpenMetrics when the scraper asks for it, else
        # the classic text format (version 0.0.4, which every Prometheus reads).
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(self.telemetry.exposed)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        state = self.ready()
        return web.json_response(
            {"ready": state.ready, "reason": state.reason}, status=200 if state.ready else 503
        )

    async def _explain(self, request: web.Request) -> web.Response:
        assert self.explain is not None, "the route exists only with an explainer"
        node, pool = request.query.get("node"), request.query.get("pool")
        if (node is None) == (pool is None):
            return web.json_response(
                {
                    "error": "bad_parameter",
                    "parameter": "node" if node is None else "pool",
                    "message": "give exactly one of node=NAME or pool=NAME",
                },
                status=400,
            )
        try:
            doc = self.explain(node, pool)
        except NotExplained as exc:
            return web.json_response({"error": "not_found", "message": str(exc)}, status=404)
        if doc is None:
            body = {"error": "no_tick_yet", "message": "the loop has not planned yet; retry"}
            return web.json_response(body, status=503)
        return web.json_response(doc)

    async def _alertmanager(self, request: web.Request) -> web.Response:
        receiver = self.alerts
        assert receiver is not None, "the route exists only with a receiver"
        if not receiver.authorized(request.headers.get("Authorization")):
            return web.json_response(
                {"error": "unauthorized", "message": "a bearer token is required (Authorization)"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="rebalancer"'},
            )
        raw = await _body(request, alerting.MAX_BODY)
        if raw is None:
            return web.json_response(alerting.too_large(request.content_length).body(), status=413)
        parsed = alerting.parse_notification(raw)
        if isinstance(parsed, alerting.BadPayload):
            return web.json_response(parsed.body(), status=400)
        receipt = receiver.store.receive(parsed)
        if not receiver.leading():
            # Kept here too, but the leader must hear it: a new connection may reach it.
            body = {"error": "not_leader", "message": "this replica does not lead; retry"}
            return web.json_response(body, status=503, headers={"Connection": "close"})
        return web.json_response(receipt.body())

    async def _decisions(self, request: web.Request) -> web.Response:
        params: dict[str, list[str]] = {}
        for name, value in request.query.items():
            params.setdefault(name, []).append(value)
        try:
            query = parse_query(params, datetime.now(UTC))
        except BadParameter as e:
            return web.json_response(e.body(), status=400)
        try:
            async with asyncio.timeout(self.query_timeout):
                page = await self.store.query(query)
        except Exception as e:
            self.telemetry.audit_failed("query")
            log.warning("http: the audit store failed a query: %r", e, exc_info=True)
            why = (
                f"did not answer within {self.query_timeout:g} s"
                if isinstance(e, TimeoutError)
                else f"failed ({type(e).__name__}; the controller log has the details)"
            )
            return web.json_response(
                {"error": "audit_store_unavailable", "message": f"the audit store {why}"},
                status=503,
            )
        return web.json_response(
            {
                "items": [audit.to_json(r) for r in page.records],
                "next": None if page.next is None else page.next.token,
            }
        )


async def _body(request: web.Request, limit: int) -> bytes | None:
    """The request's body, or None once it is longer than ``limit`` bytes (read no further)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
