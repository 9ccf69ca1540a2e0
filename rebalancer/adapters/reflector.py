"""The list+watch loop of one Kubernetes resource: list once, then WATCH from that
resourceVersion for ever, listing again only on a 410. The informer runs one per resource it
caches; why it lists once and reads raw JSON is in ``adapters.informer``'s docstring.

The list is the first events of a watch where the server streams it (``sendInitialEvents``,
Kubernetes' watch-list): the objects as ADDED events, then a bookmark that says the list is
whole, then the watch goes on in the same stream. A server that refuses the request, or ends the
stream before that bookmark, is listed page by page (LIST with ``limit``) that time. At
150,000 pods on kube-apiserver 1.36 the stream cost the server about half the CPU of the paged
LIST and a bare client a third of its own; the controller's sync took 7.4 s of CPU instead of
12.0 (docs/design/scale.md, "The list as a stream")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException

# The loop's lines are the informer's: they keep its logger name (and the log's ``logger`` field).
log = logging.getLogger("rebalancer.adapters.informer")

Obj = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (1-based): ``initial * factor**(n-1)``, never above ``maximum``."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0

    def delay(self, failures: int) -> float:
        return min(self.maximum, self.initial * self.factor ** max(0, failures - 1))


@dataclass(frozen=True)
class WatchSettings:
    timeout_seconds: int = 300  # the server ends each watch after this; it is resumed at once
    # Bookmarks come about once a minute, so this much silence means a dead connection. A
    # needless reconnect costs nothing: it resumes from the last version.
    read_timeout: float = 150.0
    connect_timeout: float = 10.0
    list_timeout: float = 60.0
    page_size: int = 500
    stream_lists: bool = True  # list in a watch's first events where the server can
    backoff: Backoff = Backoff()


class Gone(Exception):
    """410: the resourceVersion asked for is older than the server's history."""


class NotStreamed(Exception):
    """The server does not stream a list in a watch: it refused the request, or it ended the
    stream, or sent a change, before the bookmark that ends the list."""


INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of the list's last bookmark


class Reflector:
    """A list then WATCH of one resource, feeding ``apply`` (events) and ``replace`` (lists).

    Every object goes through ``transform`` as it arrives, event by event or page by page, so
    that only what the cache keeps is ever held for a whole list: a list of 150,000 pods parsed
    whole is about 2 GB of Python objects, its slim records a tenth of that. An object
    ``transform`` cannot even key (no name) is skipped with an error line."""

    def __init__(
        self,
        resource: str,
        call: Callable[..., Awaitable[Any]],
        query: Mapping[str, str],
        transform: Callable[[Obj], Any],
        apply: Callable[[str, Any], None],
        replace: Callable[[list[Any]], None],
        settings: WatchSettings,
        sleep: Sleep,
        absent: str = "",
    ) -> None:
        self.resource = resource
        # Set for a resource a cluster may not serve (a custom resource whose definition may
        # not be installed): a 404 is then that, said in these words, and the resource is
        # listed as empty (``listed`` is set: nothing waits on it) and asked again, with the
        # backoff, until it is served.
        self._absent = absent
        self.served = True
        self._call, self._query = call, dict(query)
        self._transform, self._apply, self._replace = transform, apply, replace
        self._settings, self._sleep = settings, sleep
        self.resource_version = ""
        self.listed = asyncio.Event()
        self.lists = 0  # lists made (a paged LIST or a streamed one); for tests and metrics
        self.watches = 0  # WATCH streams opened (a streamed list's too)

    async def run(self) -> None:
        # ``stream``: the next list is asked for as a stream; off until the next 410 once the
        # server has not streamed one (it is then listed page by page, as client-go does).
        failures, relist, stream = 0, True, self._settings.stream_lists
        while True:
            try:
                if relist and stream:
                    received = await self._watch(streaming=True)
                    relist = False
                else:
                    if relist:
                        await self._list()
                        relist = False
                    received = await self._watch()
            except NotStreamed as exc:
                log.info("%s: %s; listing page by page", self.resource, exc)
                stream = False
                continue
            except Gone as exc:
                log.info("%s: %s; listing again", self.resource, exc)
                relist, stream = True, self._settings.stream_lists
                failures += 1
                if failures > 1:  # a 410 right after a fresh list: do not spin
                    await self._sleep(self._settings.backoff.delay(failures - 1))
                continue
            except Exception as exc:  # any failure: log, back off, resume; never end the loop
                failures += 1
                delay = self._settings.backoff.delay(failures)
                if self._absent and isinstance(exc, ApiException) and exc.status == 404:
                    self._not_served(delay)
                    relist = True
                    await self._sleep(delay)
                    continue
                log.warning(
                    "%s: %s: %s; retrying in %.1fs from resourceVersion %s",
                    self.resource,
                    type(exc).__name__,
                    exc,
                    delay,
                    self.resource_version or "(list)",
                )
                await self._sleep(delay)
                continue
            if received:
                failures = 0
            else:
                # With bookmarks on, a healthy stream always carries something; one that ends
                # empty may be a proxy cutting connections, so do not reconnect in a hot loop.
                failures += 1
                await self._sleep(self._settings.backoff.delay(failures))

    def _not_served(self, delay: float) -> None:
        """A 404 for a resource that may be absent: said at ERROR when first seen (and when a
        resource that was served stops being), at DEBUG on each retry after; the cache is
        emptied (a definition removed takes its objects with it) and counts as listed."""
        level = logging.ERROR if self.served else logging.DEBUG
        log.log(
            level,
            "%s: %s; asking again every %.0fs at most",
            self.resource,
            self._absent,
            self._settings.backoff.maximum,
        )
        log.debug("%s: not served; retrying in %.1fs", self.resource, delay)
        self.served = False
        self.resource_version = ""
        self._replace([])
        self.listed.set()

    async def _list(self) -> None:
        """Page after page; the next page is asked for as soon as this one's continue token is
        known, so the server prepares it while this one is cut down (at 150,000 pods the two
        took turns: a sync waited on the server for a third of its time), and the work on a
        page pauses every 100 objects, so that request goes out and nothing else in the
        process (the lease's renewal above all) waits for a whole list."""
        items: list[Any] = []
        pending = asyncio.ensure_future(self._page(""))
        try:
            while True:
                body = await pending
                meta = body.get("metadata") or {}
                token = meta.get("continue") or ""
                if token:
                    pending = asyncio.ensure_future(self._page(token))
                for i, item in enumerate(body.get("items") or ()):
                    try:
                        items.append(self._transform(item))
                    except _UNREADABLE as exc:
                        log.error("%s: skipping an unreadable object: %r", self.resource, exc)
                    if i % 100 == 99:
                        # Let the next page's request go out (and the lease be renewed): a
                        # page of 500 pods is 40 ms of work without a pause.
                        await asyncio.sleep(0)
                del body  # the page's parsed JSON goes now, not when the next page replaces it
                if not token:
                    break
        finally:  # a failure (or a cancellation) leaves no page asked for, nor unread
            if not pending.done():
                # Cancelled, and waited for: a request still connecting otherwise outlives the
                # list, and the client it uses may be closed under it (a socket left open).
                pending.cancel()
                await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()
        self._listed(items, meta.get("resourceVersion"), "")

    def _listed(self, items: list[Any], version: object, how: str) -> None:
        """The list is whole: it replaces the cache, and the watch goes on from its version."""
        self.lists += 1
        self.served = True
        self._replace(items)
        self.resource_version = str(version or "")
        log.info(
            "%s: listed %d at resourceVersion %s%s",
            self.resource,
            len(items),
            self.resource_version,
            how,
        )
        self.listed.set()

    def _page(self, token: str) -> Awaitable[Obj]:
        query: dict[str, Any] = {**self._query, "limit": self._settings.page_size}
        if token:
            query["_continue"] = token
        return self._get(query, self._settings.list_timeout)

    async def _get(self, query: Mapping[str, Any], timeout: float) -> Obj:
        response = await self._call(**query, _preload_content=False, _request_timeout=timeout)
        try:
            await _check(response)
            body: Obj = orjson.loads(await response.read())
        except BaseException:
            _drop(response)
            raise
        response.release()
        return body

    async def _watch(self, streaming: bool = False) -> int:
        """Follow one stream until it ends; the number of events it carried. ``streaming``: from
        no version, the list first (``_initial``), then the watch from the list's version."""
        settings = self._settings
        since: dict[str, Any] = {"resource_version": self.resource_version}
        if streaming:  # as consistent as a LIST without a version: the server's latest state
            since = {"send_initial_events": True, "resource_version_match": "NotOlderThan"}
        response = await self._call(
            **self._query,
            **since,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=settings.timeout_seconds,
            _preload_content=False,
            _request_timeout=(settings.connect_timeout, settings.read_timeout),
        )
        self.watches += 1
        received = 0
        initial: list[Any] | None = [] if streaming else None
        try:
            await (_refused_stream if streaming else _check)(response)
            while line := await response.content.readline():
                received += 1
                if initial is None:
                    self._event(orjson.loads(line))
                    continue
                if self._initial(orjson.loads(line), initial):
                    initial = None
                elif received % 100 == 0:
                    # Let the rest of the process (the lease's renewal above all) run: the
                    # list's events are read from the buffer without a pause otherwise.
                    await asyncio.sleep(0)
        except BaseException:  # a stream left unread (a failure, a cancellation)
            _drop(response)
            raise
        response.release()  # the server ended it: the connection is whole and is reused
        if initial is not None:
            raise NotStreamed(f"the stream ended after {received} events, before its list did")
        log.debug(
            "%s: watch ended after %d events at resourceVersion %s",
            self.resource,
            received,
            self.resource_version,
        )
        return received

    def _initial(self, event: Obj, items: list[Any]) -> bool:
        """One event of a streamed list: an object added to ``items``, or the bookmark that
        ends the list (True: the list replaces the cache). Anything else before that bookmark
        is not a list as Kubernetes streams it."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ADDED":
            try:
                items.append(self._transform(obj))
            except _UNREADABLE as exc:
                log.error("%s: skipping an unreadable object: %r", self.resource, exc)
            return False
        if kind == "ERROR":
            self._event(event)  # raises
        if kind != "BOOKMARK":
            raise NotStreamed(f"a {kind} event came before the list's end")
        metadata = obj.get("metadata") or {}
        if (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END) != "true":
            return False  # the server's progress, within the list
        self._listed(items, metadata.get("resourceVersion"), " (streamed)")
        return True

    def _event(self, event: Obj) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            message = f"{obj.get('reason')}: {obj.get('message')}"
            if obj.get("code") == 410:
                raise Gone(f"resourceVersion {self.resource_version} expired ({message})")
            raise ApiException(status=obj.get("code"), reason=message)
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self._apply(str(kind), self._transform(obj))
            except _UNREADABLE as exc:
                # An object without the identity the cache keys on: skip it, keep the stream
                # (raising here would relist for ever on the same object).
                log.error("%s: skipping an unreadable %s event: %s", self.resource, kind, exc)
        elif kind != "BOOKMARK":
            log.warning("%s: ignoring a watch event of type %r", self.resource, kind)
            return
        if version:
            self.resource_version = version


_UNREADABLE = (KeyError, TypeError, AttributeError)  # an object without a name to key it by


def _drop(response: Any) -> None:
    """End a response whose body is left unread by aborting its connection. Closing it would
    start a TLS shutdown, which waits for the server's close_notify; the API server does not send
    one on a stream it is still writing, so the socket would stay open for the shutdown's timeout
    (30 s), and for good if the event loop ends first (the process's last watches)."""
    connection = response.connection
    if connection is not None and connection.transport is not None:
        connection.transport.abort()
    response.close()


async def _refused_stream(response: Any) -> None:
    """``_check`` for a streamed list's request, where a 400 or a 422 is the server saying it
    does not stream lists (an older server, or the WatchList feature off): ``NotStreamed``."""
    if response.status in (400, 422):
        text = (await response.read()).decode(errors="replace")
        raise NotStreamed(
            f"the server refused to stream the list ({response.status}: {text[:300]})"
        )
    await _check(response)


async def _check(response: Any) -> None:
    """Raise for a failed response: ``_preload_content=False`` makes the client skip this."""
    if 200 <= response.status <= 299:
        return
    text = (await response.read()).decode(errors="replace")
    if response.status == 410:
        raise Gone(text)
    raise ApiException(status=response.status, reason=f"{response.reason}: {text[:300]}")
