"""The emulator's HTTP face: kube-apiserver's REST paths over plain HTTP on 127.0.0.1.

``serve(store)`` runs an aiohttp server for the store and yields its URL; ``write_kubeconfig``
points ``kubernetes_asyncio.config.load_kube_config`` at it (no TLS; a bearer token when the
server enforces ``auth.Access``: tokens and RBAC, off by default); ``main`` is the
``rebalancer sandbox --port N`` command. Paths, verbs, query parameters, status codes and bodies
follow the real server: ``/api/v1/...`` and ``/apis/{group}/{version}/...``, lists that carry
``metadata.resourceVersion`` and items without ``kind``, watches as a chunked stream of JSON
lines, failures as ``Status`` objects; and what kubectl reads first: discovery (``discovery``),
``Table`` answers to ``kubectl get`` (``tables``) and OpenAPI v3 (``openapi``). Boolean query
parameters are read the way apimachinery converts them (``Convert_Slice_string_To_bool``):
absent, ``0`` and ``false`` (any case) are false and everything else, ``True`` and the empty
string included, is true.

``TokenReview`` and ``SubjectAccessReview`` are answered from the served ``auth.Access`` and
the stored RBAC (``reviews``), so a client that asks the cluster who sent a request (the
controller's HTTP API does) can run against the emulator.

Besides the request handlers, the server runs a ticker that calls ``store.tick`` (so a wall
clock works without a test driving it) and, when asked, the scheduler on an interval.

``serve(store, on_request=...)`` (and ``make_app``) take an observer: a callable told of every
request once its answer is decided, as a frozen ``Request`` (method, path, query, the verb and
resource as authorization reads them, the status code, and for a write the JSON answered). It is
how a test counts the lists and watches a client made, or journals the writes the server took,
without reaching into the store: it sees only what came over HTTP, faults and denials included,
and changes nothing of the answer. It is called in the request's task before the answer is sent
(for a watch, before the stream's first byte), so what a client does after a reply is always
told after the request that got it; what it raises is logged and does not change the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import errno
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aiohttp import hdrs, web

from sandbox.emulator import (
    cluster,
    conversion,
    discovery,
    openapi,
    rbac,
    resources,
    reviews,
    selector,
    status,
    tables,
    validation,
)
from sandbox.emulator.auth import Access
from sandbox.emulator.faults import FaultInjector, Faults
from sandbox.emulator.resources import PODS, ResourceType
from sandbox.emulator.store import (
    DeleteOptions,
    ListRequest,
    Store,
    WatchRequest,
    delete_options,
)
from sandbox.emulator.watcher import Scope, Watcher

Obj = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Request:
    """One request the server answered, as ``on_request`` is told of it.

    ``verb``, ``group``, ``resource`` (the plural), ``subresource``, ``namespace`` and ``name``
    are what authorization reads (``rbac.attributes``): a collection GET is ``list``, or
    ``watch`` with ``watch=true``; an empty string is what the request does not name (the core
    group, a cluster-scoped or all-namespaces request, a collection; a non-resource path such as
    ``/version`` has no resource at all). ``query`` holds the first value of each parameter.
    ``status`` is the code answered (a watch's is its stream's, sent before any event);
    ``response`` is, for a write (POST, PUT, PATCH, DELETE), the JSON body answered: the
    object as stored, or the ``Status`` of a refusal.
    """

    method: str
    path: str
    query: Mapping[str, str]
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    status: int
    response: Obj | None = None

    @classmethod
    def of(
        cls,
        method: str,
        path: str,
        query: Mapping[str, str],
        status: int,
        response: Obj | None = None,
    ) -> Request:
        """The request ``method path?query`` answered with ``status``, read as authorization
        reads it (``rbac.attributes``)."""
        attrs = rbac.attributes(method, path, query)
        return cls(
            method=method,
            path=path,
            query=query,
            verb=attrs.verb,
            group=attrs.group,
            resource=attrs.resource,
            subresource=attrs.subresource,
            namespace=attrs.namespace,
            name=attrs.name,
            status=status,
            response=response,
        )

    @property
    def is_list(self) -> bool:
        return self.verb == "list"

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"

    @property
    def is_write(self) -> bool:
        return self.method in _WRITES

    def flag(self, name: str) -> bool:
        """A boolean query parameter, read as the server reads it (``allowWatchBookmarks``)."""
        return flag(self.query, name)


RequestObserver = Callable[[Request], object]

STORE = web.AppKey("store", Store)
FAULTS = web.AppKey("faults", FaultInjector)
ACCESS = web.AppKey("access", Access)
OBSERVER: web.AppKey[RequestObserver] = web.AppKey("observer")
_TOLD = web.RequestKey("told", bool)  # the observer has been told of this request already
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def route(path: str) -> Route | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    rt = resources.find(group, version, rest[0])
    if rt is None or (namespace is not None and not rt.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if subresource not in (None, "status", "eviction") or (
        subresource == "eviction" and rt is not PODS
    ):
        return None
    if subresource == "status" and not rt.status_subresource:
        return None
    return Route(rt, namespace, name, subresource)


def flag(query: Any, name: str) -> bool:
    """``Convert_Slice_string_To_bool``: only absent, ``0`` and ``false`` are false."""
    if name not in query:
        return False
    value = str(query.get(name))
    return not (value == "0" or value.lower() == "false")


def _check_initial_events(query: Any) -> None:
    """``sendInitialEvents`` as kube-apiserver 1.36 validates it (asked of it, and held to it in
    ``tests/kubeapi/test_conformance.py``): on a watch, with ``resourceVersionMatch`` set to
    ``NotOlderThan``, the one value a watch takes; never on a list."""
    if "sendInitialEvents" not in query:
        return
    match = query.get(_MATCH)
    causes = []
    if not flag(query, "watch"):
        if match is not None and not query.get("resourceVersion"):
            unless = "resourceVersionMatch is forbidden unless resourceVersion is provided"
            causes.append(validation.forbidden(_MATCH, unless))
        forbidden = "sendInitialEvents is forbidden for list"
        causes.append(validation.forbidden("sendInitialEvents", forbidden))
    else:
        if flag(query, "sendInitialEvents") and match != "NotOlderThan":
            requires = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            causes.append(validation.forbidden(_MATCH, requires))
        if match is not None and match != "NotOlderThan":
            causes.append(validation.unsupported(_MATCH, match, ("NotOlderThan",)))
    if causes:
        raise status.invalid("ListOptions", "meta.k8s.io", "", causes)


_MATCH = "resourceVersionMatch"


def _integer(query: Any, name: str) -> int | None:
    if name not in query:
        return None
    try:
        return int(query[name])
    except ValueError:
        raise status.bad_request(f"invalid value for {name}: {query[name]!r}") from None


# ---------------------------------------------------------------------------------------------
# Handlers


def _respond(payload: Obj, code: int = 200) -> web.Response:
    headers = {}
    retry = (payload.get("details") or {}).get("retryAfterSeconds")
    if payload.get("kind") == "Status" and retry:
        headers["Retry-After"] = str(retry)
    return web.Response(
        body=json.dumps(payload).encode(), status=code, content_type=_JSON, headers=headers
    )


def _failure(error: status.ApiError) -> web.Response:
    return _respond(error.status, error.code)


async def _handle(request: web.Request) -> web.StreamResponse:
    where = route(request.path)
    try:
        if where is None:
            raise status.no_such_path()
        return await _dispatch(request, where)
    except status.ApiError as error:
        return _failure(error)


async def _dispatch(request: web.Request, where: Route) -> web.StreamResponse:
    store, query, method = request.app[STORE], request.query, request.method
    rt = where.rt
    if where.name is None:
        if method == "GET":
            _check_initial_events(query)
            if flag(query, "watch"):
                return await _watch(request, where, None)
            return _respond(_list(store, where, query, _table_version(request)))
        if method == "POST" and (where.namespace is not None or not rt.namespaced):
            body = await _body(request)
            created = store.create(
                rt, where.namespace, conversion.to_storage(rt, body), dry_run=_dry_run(query)
            )
            return _respond(conversion.from_storage(rt, created), 201)
        raise status.method_not_allowed(rt.plural, rt.group, method.lower())
    if rt.namespaced and where.namespace is None:
        raise status.no_such_path()
    return await _item(request, where, method)


async def _item(request: web.Request, where: Route, method: str) -> web.StreamResponse:
    store, query, rt, name = request.app[STORE], request.query, where.rt, str(where.name)
    if where.subresource == "eviction":
        if method != "POST":
            raise status.method_not_allowed("pods/eviction", "", method.lower())
        return _respond(store.evict(str(where.namespace), name, await _body(request)), 201)
    if method == "GET":
        if flag(query, "watch"):
            return await _watch(request, where, name)
        obj = store.get(rt, where.namespace, name)
        version = _table_version(request)
        if version is not None and where.subresource is None:
            meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            return _respond(_table(store, rt, [obj], meta, version, query))
        return _respond(conversion.from_storage(rt, obj))
    if method == "PUT":
        body = conversion.to_storage(rt, await _body(request))
        out = store.replace(
            rt, where.namespace, name, body, subresource=where.subresource, dry_run=_dry_run(query)
        )
        return _respond(conversion.from_storage(rt, out))
    if method == "PATCH":
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        out = store.patch(
            rt,
            where.namespace,
            name,
            content_type,
            await request.read(),
            subresource=where.subresource,
            dry_run=_dry_run(query),
        )
        return _respond(conversion.from_storage(rt, out))
    if method == "DELETE" and where.subresource is None:
        out = store.delete(rt, where.namespace, name, await _delete_options(request))
        return _respond(out if out.get("kind") == "Status" else conversion.from_storage(rt, out))
    raise status.method_not_allowed(rt.plural, rt.group, method.lower())


async def _body(request: web.Request) -> Obj:
    raw = await request.read()
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise status.bad_request(f"the body of the request could not be decoded: {exc}") from None
    if not isinstance(body, dict):
        raise status.bad_request("the body of the request is not a JSON object")
    return body


def _dry_run(query: Any) -> bool:
    return "All" in query.getall("dryRun", [])


async def _delete_options(request: web.Request) -> DeleteOptions:
    """The body when there is one, else the query (the real handler reads only one of them)."""
    raw = await request.read()
    if raw.strip():
        return _parse_delete_body(raw)
    grace = _integer(request.query, "gracePeriodSeconds")
    return DeleteOptions(grace_period=grace, dry_run=_dry_run(request.query))


def _parse_delete_body(raw: bytes) -> DeleteOptions:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise status.bad_request(f"the body of the request could not be decoded: {exc}") from None
    if not isinstance(body, dict):
        raise status.bad_request("the body of the request is not a JSON object")
    options = delete_options(body)
    if "All" in (body.get("dryRun") or []):
        options = DeleteOptions(options.grace_period, options.uid, options.resource_version, True)
    return options


def _scope(where: Route, query: Any, name: str | None) -> Scope:
    try:
        labels = selector.parse_labels(query.get("labelSelector"))
        fields = selector.parse_fields(query.get("fieldSelector"), frozenset(where.rt.fields))
    except selector.SelectorError as exc:
        raise status.bad_request(str(exc)) from None
    if name is not None:
        only = selector.FieldRequirement("metadata.name", False, name)
        fields = selector.FieldSelector((*fields.requirements, only))
    return Scope(where.rt, where.namespace, labels, fields)


def _asked(request: web.Request, group: str, kind: str, versions: Sequence[str]) -> str | None:
    """The first of ``versions`` of ``group``'s ``kind`` that the ``Accept`` header asks for
    (``application/json;as=Table;v=v1;g=meta.k8s.io``), or ``None``: plain objects. The
    versions offered have the same fields, so the order is only a preference."""
    asked = set()
    for media in request.headers.get("Accept", "").split(","):
        params = {
            k.strip(): v.strip() for k, _, v in (p.partition("=") for p in media.split(";")[1:])
        }
        if params.get("as") == kind and params.get("g") == group:
            asked.add(params.get("v", ""))
    return next((v for v in versions if v in asked), None)


def _table_version(request: web.Request) -> str | None:
    """The ``Table`` version the client asks for (``kubectl get``), or ``None`` for objects."""
    return _asked(request, "meta.k8s.io", "Table", ("v1", "v1beta1"))


def _table(
    store: Store, rt: ResourceType, objs: list[Obj], meta: Obj, version: str, query: Any
) -> Obj:
    include = tables.include_object(query)
    return tables.table(rt, objs, store.clock(), metadata=meta, version=version, include=include)


def _list(store: Store, where: Route, query: Any, table: str | None = None) -> Obj:
    scope = _scope(where, query, None)
    page = store.list_page(
        ListRequest(
            scope,
            limit=_integer(query, "limit") or 0,
            continue_token=query.get("continue", ""),
            resource_version=query.get("resourceVersion", ""),
            copies=False,  # serialized below; ``from_storage`` copies the level it changes
        )
    )
    metadata: Obj = {"resourceVersion": str(page.resource_version)}
    if page.continue_token:
        metadata["continue"] = page.continue_token
    if page.remaining is not None:
        metadata["remainingItemCount"] = page.remaining
    if table is not None:
        return _table(store, where.rt, list(page.items), metadata, table, query)
    items = []
    for obj in page.items:
        item = conversion.from_storage(where.rt, obj)
        del item["kind"], item["apiVersion"]
        items.append(item)
    rt = where.rt
    return {
        "kind": rt.list_kind,
        "apiVersion": rt.api_version,
        "metadata": metadata,
        "items": items,
    }


async def _watch(request: web.Request, where: Route, name: str | None) -> web.StreamResponse:
    store, query = request.app[STORE], request.query
    timeout = _integer(query, "timeoutSeconds")
    watcher = store.watch(
        WatchRequest(
            _scope(where, query, name),
            resource_version=query.get("resourceVersion", ""),
            bookmarks=flag(query, "allowWatchBookmarks"),
            timeout=float(timeout) if timeout is not None else None,
            send_initial_events=flag(query, "sendInitialEvents"),
        )
    )
    try:
        return await _stream(request, watcher, _watch_tables(request, where))
    finally:
        store.forget(watcher)


def _watch_tables(request: web.Request, where: Route) -> Callable[[Obj], Obj]:
    """What a watch sends for each event: the event itself, or, when the client asked for
    tables (``kubectl get -w``), its object as a one-row ``Table``, the column definitions in
    the first one only. Bookmarks and errors pass as they are."""
    version = _table_version(request)
    if version is None:
        return lambda event: event
    store, rt, sent = request.app[STORE], where.rt, [False]

    def convert(event: Obj) -> Obj:
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return event
        obj = conversion.to_storage(rt, event["object"])
        meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
        include = tables.include_object(request.query)
        converted = tables.table(
            rt,
            [obj],
            store.clock(),
            metadata=meta,
            version=version,
            include=include,
            headers=not sent[0],
        )
        sent[0] = True
        return {"type": event["type"], "object": converted}

    return convert


async def _stream(
    request: web.Request, watcher: Watcher, convert: Callable[[Obj], Obj]
) -> web.StreamResponse:
    faults = request.app[FAULTS]
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
    response.enable_chunked_encoding()
    _tell(request, response.status)  # a stream may last for hours: told as it opens
    await response.prepare(request)
    sent = 0
    with contextlib.suppress(ConnectionResetError):
        while True:
            event = await watcher.queue.get()
            if event is None:
                break
            await response.write(json.dumps(convert(event)).encode() + b"\n")
            sent += 1
            if faults.drop_watch(sent):
                break
        await response.write_eof()
    return response


@web.middleware
async def _observe(request: web.Request, handler: Any) -> web.StreamResponse:
    """Tell ``on_request`` of the request once its answer is decided (outermost: denials and
    injected faults are told too)."""
    if OBSERVER not in request.app:
        plain: web.StreamResponse = await handler(request)
        return plain
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException as exc:
        _tell(request, exc.status)
        raise
    except Exception:
        _tell(request, 500)  # aiohttp answers an unexpected error with a 500
        raise
    _tell(request, response.status, response)
    return response


def _tell(request: web.Request, code: int, response: web.StreamResponse | None = None) -> None:
    observer = request.app.get(OBSERVER)
    if observer is None or request.get(_TOLD):
        return
    request[_TOLD] = True
    query = MappingProxyType({key: request.query[key] for key in request.query})
    answered = None
    body = response.body if isinstance(response, web.Response) else None
    if request.method in _WRITES and isinstance(body, bytes):
        with contextlib.suppress(ValueError):  # every answer of ours is JSON; aiohttp's may not be
            answered = json.loads(body)
    seen = Request.of(request.method, request.path, query, code, answered)
    try:
        observer(seen)
    except Exception:  # the observer is the test's; the client's answer stays the server's
        log.exception("the request observer raised on %s %s", request.method, request.path)


@web.middleware
async def _authorize(request: web.Request, handler: Any) -> web.StreamResponse:
    """Authentication, then authorization, before anything else (as the real filter chain)."""
    access = request.app.get(ACCESS)
    if access is not None:
        user = access.authenticate(request.headers.get("Authorization"))
        if user is None:
            return _failure(status.unauthorized())
        attrs = rbac.attributes(request.method, request.path, request.query)
        if not access.authorize(request.app[STORE], user, attrs):
            return _failure(rbac.forbidden(user, attrs))
    response: web.StreamResponse = await handler(request)
    return response


@web.middleware
async def _inject(request: web.Request, handler: Any) -> web.StreamResponse:
    faults = request.app[FAULTS]
    if faults.faults.latency:
        await asyncio.sleep(faults.faults.latency)
    if request.method in _WRITES:
        where = route(request.path)
        if where is not None:
            error = faults.write_fault(where.rt.plural, where.rt.group, where.name or "")
            if error is not None:
                return _failure(error)
    response: web.StreamResponse = await handler(request)
    return response


async def _date(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer's ``Date`` header on the store's clock, as kube-apiserver's is on its own
    (Go's net/http sets it): a client measures its skew against the server by it, and aiohttp's
    default would be the wall clock even when the store runs on a ``ManualClock``."""
    clock = request.app[STORE].clock()
    response.headers[hdrs.DATE] = email.utils.format_datetime(clock.astimezone(UTC), usegmt=True)


async def _version(_: web.Request) -> web.Response:
    return _respond(
        {
            "major": "1",
            "minor": "34",
            "gitVersion": "v1.34.0-rebalancer-sandbox",
            "platform": "linux/amd64",
        }
    )


async def _discover(request: web.Request) -> web.Response:
    """``/api`` and ``/apis``, aggregated when the client asks for it (kubectl does)."""
    core = request.path.rstrip("/") == "/api"
    version = _asked(request, "apidiscovery.k8s.io", "APIGroupDiscoveryList", ("v2", "v2beta1"))
    if version is not None:
        body = json.dumps(discovery.aggregated(core, version)).encode()
        kind = discovery.AGGREGATED.format(version=version)
        return web.Response(body=body, headers={"Content-Type": kind, "Vary": "Accept"})
    return _respond(discovery.api_versions(request.host) if core else discovery.api_group_list())


async def _discover_group(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    if group not in discovery.groups():
        return _failure(status.no_such_path())
    return _respond(discovery.api_group(group))


async def _discover_version(request: web.Request) -> web.Response:
    """``/api/v1`` and ``/apis/{group}/{version}``: that version's ``APIResourceList``."""
    found = discovery.api_resource_list(
        request.match_info.get("group", ""), request.match_info["version"]
    )
    return _failure(status.no_such_path()) if found is None else _respond(found)


async def _openapi_index(_: web.Request) -> web.Response:
    return _respond(openapi.index())


async def _openapi_document(request: web.Request) -> web.Response:
    """One group version's document; the ``hash`` the index gave is not checked."""
    found = openapi.find(request.match_info["path"])
    return _failure(status.no_such_path()) if found is None else _respond(found)


async def _healthy(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _token_review(request: web.Request) -> web.Response:
    body = await reviews.read(request)
    if isinstance(body, web.Response):
        return body
    return _respond(reviews.token_review(request.app.get(ACCESS), body), 201)


async def _access_review(request: web.Request) -> web.Response:
    body = await reviews.read(request)
    if isinstance(body, web.Response):
        return body
    answer = reviews.access_review(request.app.get(ACCESS), request.app[STORE], body)
    return _respond(answer, 201)


def make_app(
    store: Store,
    faults: FaultInjector | None = None,
    access: Access | None = None,
    on_request: RequestObserver | None = None,
) -> web.Application:
    app = web.Application(
        middlewares=[_observe, _authorize, _inject], client_max_size=8 * 1024 * 1024
    )
    app[STORE] = store
    app[FAULTS] = faults or FaultInjector()
    app.on_response_prepare.append(_date)
    if access is not None:
        app[ACCESS] = access
    if on_request is not None:
        app[OBSERVER] = on_request
    app.router.add_get("/version", _version)
    for path in ("/api", "/apis"):
        app.router.add_get(path, _discover)
    app.router.add_get("/api/{version}", _discover_version)
    app.router.add_get("/apis/{group}", _discover_group)
    app.router.add_get("/apis/{group}/{version}", _discover_version)
    app.router.add_get("/openapi/v3", _openapi_index)
    app.router.add_get("/openapi/v3/{path:.+}", _openapi_document)
    for probe in ("/healthz", "/readyz", "/livez"):
        app.router.add_get(probe, _healthy)
    app.router.add_post(reviews.TOKEN_REVIEWS, _token_review)
    app.router.add_post(reviews.ACCESS_REVIEWS, _access_review)
    app.router.add_route("*", "/{tail:.*}", _handle)
    return app


# ---------------------------------------------------------------------------------------------
# Running


@contextlib.asynccontextmanager
async def serve(
    store: Store,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    faults: FaultInjector | Faults | None = None,
    tick: float = 0.2,
    schedule_every: float | None = None,
    access: Access | None = None,
    on_request: RequestObserver | None = None,
) -> AsyncIterator[str]:
    """Serve ``store`` until the block ends; yields ``http://host:port``. With ``access``,
    requests are authenticated and authorized (``auth.Access``); without, all are allowed.
    With ``on_request``, it is told of every request once its answer is decided (``Request``)."""
    injector = FaultInjector(faults) if isinstance(faults, Faults) else faults
    app = make_app(store, injector, access, on_request)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()  # nothing listens: what setup opened is closed before the error
        raise
    bound = runner.addresses[0][1]
    tasks = [asyncio.create_task(_every(tick, store.tick))]
    if schedule_every is not None:
        tasks.append(asyncio.create_task(_every(schedule_every, store.schedule)))
    try:
        yield f"http://{host}:{bound}"
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        store.close_watches()
        await runner.cleanup()


async def _every(seconds: float, action: Any) -> None:
    while True:
        await asyncio.sleep(seconds)
        action()


def kubeconfig(url: str, namespace: str = "default", token: str | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {"server": url}}],
        "users": [{"name": "sandbox", "user": {"token": token} if token else {}}],
        "contexts": [
            {
                "name": "sandbox",
                "context": {"cluster": "sandbox", "user": "sandbox", "namespace": namespace},
            }
        ],
        "current-context": "sandbox",
        "preferences": {},
    }


def write_kubeconfig(
    url: str, path: Path, namespace: str = "default", token: str | None = None
) -> Path:
    """Write a kubeconfig for ``url`` (JSON, which is YAML) and return its path; with
    ``token`` the client sends it as a bearer token (see ``auth.Access``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(kubeconfig(url, namespace, token), indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``rebalancer sandbox``: serve a default cluster until interrupted."""
    args = parser().parse_args(argv)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(args))
    except NotListening as exc:
        print(f"rebalancer sandbox: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    """``rebalancer sandbox``'s flags (``rebalancer completion`` reads them too)."""
    p = argparse.ArgumentParser(
        prog="rebalancer sandbox",
        description="Serve an emulated Kubernetes API with a small GPU cluster on 127.0.0.1.",
    )
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path("sandbox.kubeconfig"),
        help="write a kubeconfig for it here (sandbox.kubeconfig)",
    )
    p.add_argument("--empty", action="store_true", help="start with no nodes or pods")
    p.add_argument(
        "--schedule-every",
        type=float,
        default=1.0,
        metavar="DURATION",
        help="run the scheduler stand-in this often (1s)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for uids and faults (0)")
    return p


class NotListening(Exception):
    """The address could not be bound: one line for the person who chose it."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        # asyncio words it "error while attempting to bind on address (...): ..."; the errno's
        # own words say it in short.
        why = os.strerror(error.errno).lower() if error.errno else str(error)
        if error.errno == errno.EADDRINUSE:
            super().__init__(f"port {port} is in use ({why}); pass --port")
        else:
            super().__init__(f"cannot listen on {host}:{port} ({why}); pass --host or --port")


async def _run(args: argparse.Namespace) -> None:
    store = Store(seed=args.seed)
    if not args.empty:
        cluster.seed(store)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        try:
            url = await stack.enter_async_context(
                serve(store, args.port, args.host, schedule_every=args.schedule_every)
            )
        except OSError as exc:
            raise NotListening(args.host, args.port, exc) from None
        print(f"rebalancer sandbox: serving {url}", flush=True)
        written = write_kubeconfig(url, args.kubeconfig)
        print(f"rebalancer sandbox: kubeconfig written to {written}", flush=True)
        kubectl = f"kubectl --kubeconfig {written}"
        print(f"rebalancer sandbox: try  {kubectl} get nodes -L rebalancer.io/state", flush=True)
        if not args.empty:
            print(f"rebalancer sandbox: or   {kubectl} describe node inference-0", flush=True)
        await stop.wait()
    print("rebalancer sandbox: stopped", file=sys.stderr, flush=True)
