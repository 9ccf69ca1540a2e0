"""The controller's view of Nodes and Pods: a cache fed by LIST once, then WATCH for ever.

Where it sits: the runtime starts ``Informer.run`` once, waits for ``synced``, and on each tick
asks ``node_views(rules)`` for the ``NodeView``s the core decides from; ``changed`` (and the
optional ``on_change`` callback) wakes the runtime early when something that matters moved, and
the runtime debounces. The actuator never reads this cache to decide a write: it re-reads the
node it writes.

Why a watch cache: a tick every few seconds that LISTs every pod of a large cluster is the load
pattern the API server's priority and fairness throttles first. So each resource is LISTed once
(recording the list's resourceVersion) and then WATCHed from that version with bookmarks and a
server-side timeout; a stream that ends or drops is resumed from the last version seen (bookmarks
move it), without listing. Only a 410 (the version fell out of the server's history) lists again,
and the new list replaces the cache with its differences applied as ordinary changes, so nothing
downstream can tell a relist from a burst of events.

Raw JSON throughout: lists and watches are asked for with ``_preload_content=False`` and parsed
here, so no model object of the client is built (they are slow, and ``convert`` reads dicts).
The client's own ``watch.Watch`` is not used: it opens an ``ApiClient`` of its own, builds model
objects for every event and retries a 410 by itself. Pods are watched across namespaces with a
field selector that leaves out pods that have not been scheduled or have finished; a finished pod
that slips through is dropped here too.

Failures never end the loop: transport errors and non-410 API errors are logged and retried after
a bounded exponential backoff (the sleep is injectable for tests).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rebalancer.adapters import convert
from rebalancer.core import model
from rebalancer.core.model import NodeName, NodeView

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); nodes use ("", name)
Sleep = Callable[[float], Awaitable[None]]
OnChange = Callable[[str, str], None]  # (node name, what happened)
Apply = Callable[[str, Obj], None]

# Only pods on a node that still hold it; the API server filters, so the cache stays small.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


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
    backoff: Backoff = Backoff()


class Gone(Exception):
    """410: the resourceVersion asked for is older than the server's history."""


class Reflector:
    """LIST then WATCH of one resource, feeding ``apply`` (events) and ``replace`` (lists)."""

    def __init__(
        self,
        resource: str,
        call: Callable[..., Awaitable[Any]],
        query: Mapping[str, str],
        apply: Apply,
        replace: Callable[[list[Obj]], None],
        settings: WatchSettings,
        sleep: Sleep,
    ) -> None:
        self.resource = resource
        self._call, self._query = call, dict(query)
        self._apply, self._replace = apply, replace
        self._settings, self._sleep = settings, sleep
        self.resource_version = ""
        self.listed = asyncio.Event()
        self.lists = 0  # LIST calls made (pages count once); for tests and metrics
        self.watches = 0  # WATCH streams opened

    async def run(self) -> None:
        failures, relist = 0, True
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                received = await self._watch()
            except Gone as exc:
                log.info("%s: %s; listing again", self.resource, exc)
                relist = True
                failures += 1
                if failures > 1:  # a 410 right after a fresh list: do not spin
                    await self._sleep(self._settings.backoff.delay(failures - 1))
                continue
            except Exception as exc:  # any failure: log, back off, resume; never end the loop
                failures += 1
                delay = self._settings.backoff.delay(failures)
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

    async def _list(self) -> None:
        items: list[Obj] = []
        token = ""
        while True:
            query: dict[str, Any] = {**self._query, "limit": self._settings.page_size}
            if token:
                query["_continue"] = token
            body = await self._get(query, self._settings.list_timeout)
            items.extend(body.get("items") or ())
            meta = body.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        self.lists += 1
        self._replace(items)
        self.resource_version = str(meta.get("resourceVersion", ""))
        log.info(
            "%s: listed %d at resourceVersion %s", self.resource, len(items), self.resource_version
        )
        self.listed.set()

    async def _get(self, query: Mapping[str, Any], timeout: float) -> Obj:
        response = await self._call(**query, _preload_content=False, _request_timeout=timeout)
        try:
            await _check(response)
            body: Obj = json.loads(await response.read())
            return body
        finally:
            response.release()

    async def _watch(self) -> int:
        """Follow one stream until it ends; the number of events it carried."""
        settings = self._settings
        response = await self._call(
            **self._query,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=settings.timeout_seconds,
            _preload_content=False,
            _request_timeout=(settings.connect_timeout, settings.read_timeout),
        )
        self.watches += 1
        received = 0
        try:
            await _check(response)
            while line := await response.content.readline():
                self._event(json.loads(line))
                received += 1
        finally:
            response.close()
        log.debug(
            "%s: watch ended after %d events at resourceVersion %s",
            self.resource,
            received,
            self.resource_version,
        )
        return received

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
                self._apply(str(kind), obj)
            except (KeyError, TypeError, AttributeError) as exc:
                # An object without the identity the cache keys on: skip it, keep the stream
                # (raising here would relist for ever on the same object).
                log.error("%s: skipping an unreadable %s event: %s", self.resource, kind, exc)
        elif kind != "BOOKMARK":
            log.warning("%s: ignoring a watch event of type %r", self.resource, kind)
            return
        if version:
            self.resource_version = version


async def _check(response: Any) -> None:
    """Raise for a failed response: ``_preload_content=False`` makes the client skip this."""
    if 200 <= response.status <= 299:
        return
    text = (await response.read()).decode(errors="replace")
    if response.status == 410:
        raise Gone(text)
    raise ApiException(status=response.status, reason=f"{response.reason}: {text[:300]}")


@dataclass
class _Views:
    """The views of every node under one set of pod rules, and the nodes to build again."""

    rules: model.PodRules
    views: dict[str, NodeView] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)


class Informer:
    """Nodes and their (running, unfinished) pods, kept current by two reflectors."""

    def __init__(
        self,
        api: Any,
        *,
        prefix: str = "rebalancer.io/",
        node_selector: str | None = None,
        settings: WatchSettings | None = None,
        sleep: Sleep = asyncio.sleep,
        on_change: OnChange | None = None,
    ) -> None:
        core = client.CoreV1Api(api)
        settings = settings or WatchSettings()
        self.prefix = prefix
        self.synced = asyncio.Event()  # set once both initial lists are in
        self.changed = asyncio.Event()  # set on a change that matters; the runtime clears it
        self._on_change = on_change
        self._nodes: dict[str, Obj] = {}
        self._pods: dict[Key, Obj] = {}
        self._pods_on: dict[str, dict[Key, Obj]] = {}
        # The views under each set of pod rules asked for (one per pool with its own rules),
        # each with the nodes whose node or pods changed since it was last asked for.
        self._by_rules: list[_Views] = []
        self._unreadable: dict[str, str] = {}  # "node/<name>" or "pod/<node>/<ns>/<name>" -> why
        node_query = {"label_selector": node_selector} if node_selector else {}
        self.nodes = Reflector(
            "nodes",
            core.list_node,
            node_query,
            self._apply_node,
            self._replace_nodes,
            settings,
            sleep,
        )
        self.pods = Reflector(
            "pods",
            core.list_pod_for_all_namespaces,
            {"field_selector": POD_FIELD_SELECTOR},
            self._apply_pod,
            self._replace_pods,
            settings,
            sleep,
        )

    async def run(self) -> None:
        """Run until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.nodes.run(), name="informer-nodes")
            group.create_task(self.pods.run(), name="informer-pods")
            await self.nodes.listed.wait()
            await self.pods.listed.wait()
            self.synced.set()
            log.info("informer synced: %d nodes, %d pods", len(self._nodes), len(self._pods))

    # -----------------------------------------------------------------------------------------
    # Reading

    def node_views(self, rules: model.PodRules) -> tuple[NodeView, ...]:
        """Every cached node with its pods, by name. A node whose node object and pods did not
        change since the last call (under the same rules) is the very same object as then, so
        what the core memoised on it stays valid; a rebuilt view equal to the old one is
        replaced by the old one for the same reason. Each set of rules keeps its own views, so
        pools with different pod rules cost a rebuild only of what changed, not of everything
        on every call."""
        cached = next((c for c in self._by_rules if c.rules == rules), None)
        if cached is None:
            cached = _Views(rules, dirty=set(self._nodes))
            self._by_rules.append(cached)
        for name in cached.dirty:
            self._rebuild(cached, name)
        cached.dirty.clear()
        return tuple(cached.views[name] for name in sorted(cached.views))

    def unreadable(self) -> dict[str, str]:
        """Objects that could not be turned into views, and why: their node is left out of
        every view (so nothing decides about it) until they can be read again."""
        return dict(self._unreadable)

    def _touch(self, name: str) -> None:
        """The node or its pods changed: every set of views builds it again when next asked."""
        for cached in self._by_rules:
            cached.dirty.add(name)

    def _rebuild(self, cached: _Views, name: str) -> None:
        rules, views = cached.rules, cached.views
        raw = self._nodes.get(name)
        self._unreadable = {
            k: v
            for k, v in self._unreadable.items()
            if k != f"node/{name}" and not k.startswith(f"pod/{name}/")
        }
        if raw is None:
            views.pop(name, None)
            return
        pods = []
        for (namespace, pod_name), pod in sorted(self._pods_on.get(name, {}).items()):
            try:
                pods.append(convert.pod_view(pod, rules))
            except Exception as exc:  # one bad object must not take the others with it
                why = f"{type(exc).__name__}: {exc}; its node {name} is left alone"
                self._unreadable[f"pod/{name}/{namespace}/{pod_name}"] = why
        try:
            view = convert.node_view(raw, pods)
        except Exception as exc:
            self._unreadable[f"node/{name}"] = f"{type(exc).__name__}: {exc}"
            views.pop(name, None)
            return
        if any(k.startswith(f"pod/{name}/") for k in self._unreadable):
            views.pop(name, None)  # a node whose pods cannot be read cannot be judged
            return
        old = views.get(name)
        views[name] = old if old is not None and old == view else view

    def node(self, name: str) -> Obj | None:
        """The cached JSON of a node (read only)."""
        return self._nodes.get(name)

    def pods_on(self, name: NodeName | str) -> list[Obj]:
        """The cached JSON of the pods on a node (read only)."""
        return [pod for _, pod in sorted(self._pods_on.get(name, {}).items())]

    # -----------------------------------------------------------------------------------------
    # Nodes

    def _apply_node(self, kind: str, obj: Obj) -> None:
        name = str(obj["metadata"]["name"])
        old = self._nodes.get(name)
        new = None if kind == "DELETED" else obj
        if new is None:
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = new
        self._touch(name)
        why = self._node_change(old, new)
        if why:
            self._notify(name, why)

    def _node_change(self, old: Obj | None, new: Obj | None) -> str:
        if old is None:
            return "node appeared" if new is not None else ""
        if new is None:
            return "node removed"
        changed = [
            what
            for what, part in (
                ("annotations", lambda o: _prefixed(o, "annotations", self.prefix)),
                ("labels", lambda o: _prefixed(o, "labels", self.prefix)),
                ("taints", convert.taints),
                ("readiness", _readiness),
            )
            if part(old) != part(new)
        ]
        return f"node {', '.join(changed)} changed" if changed else ""

    def _replace_nodes(self, items: list[Obj]) -> None:
        fresh = {("", str(o["metadata"]["name"])): o for o in items}
        _replace({("", k): v for k, v in self._nodes.items()}, fresh, self._apply_node)

    # -----------------------------------------------------------------------------------------
    # Pods

    def _apply_pod(self, kind: str, obj: Obj) -> None:
        key = _pod_key(obj)
        old = self._pods.pop(key, None)
        before = _node_of(old)
        if before:
            self._pods_on.get(before, {}).pop(key, None)
            self._touch(before)
        keep = kind != "DELETED" and not convert.finished(obj) and bool(_node_of(obj))
        after = _node_of(obj) if keep else ""
        if after:
            self._pods[key] = obj
            self._pods_on.setdefault(after, {})[key] = obj
            self._touch(after)
        pod = f"{key[0]}/{key[1]}"
        if before and before != after:
            self._notify(before, f"pod {pod} left")
        if after and before != after:
            self._notify(after, f"pod {pod} landed")
        elif after and _terminating(old) != _terminating(obj):
            self._notify(after, f"pod {pod} is terminating")

    def _replace_pods(self, items: list[Obj]) -> None:
        fresh = {_pod_key(o): o for o in items}
        _replace(dict(self._pods), fresh, self._apply_pod)

    # -----------------------------------------------------------------------------------------

    def _notify(self, node: str, why: str) -> None:
        # One line per object at DEBUG: a sync of 150,000 pods is a line per list at INFO.
        log.debug("node %s: %s", node, why)
        self.changed.set()
        if self._on_change is not None:
            self._on_change(node, why)


def _replace(current: Mapping[Key, Obj], fresh: Mapping[Key, Obj], apply: Apply) -> None:
    """Apply a new list over the cache as the events that would have led to it."""
    for key, obj in current.items():
        if key not in fresh:
            apply("DELETED", obj)
    for key, obj in fresh.items():
        old = current.get(key)
        if old is None:
            apply("ADDED", obj)
        elif _version(old) != _version(obj):
            apply("MODIFIED", obj)


def _pod_key(pod: Obj) -> Key:
    meta = pod["metadata"]
    return str(meta.get("namespace", "")), str(meta["name"])


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _prefixed(obj: Obj, member: str, prefix: str) -> dict[str, str]:
    values = (obj.get("metadata") or {}).get(member) or {}
    return {k: v for k, v in values.items() if k.startswith(prefix)}


def _readiness(node: Obj) -> tuple[bool, str | None]:
    conditions = (node.get("status") or {}).get("conditions") or ()
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    return bool((node.get("spec") or {}).get("unschedulable")), ready


def _node_of(pod: Obj | None) -> str:
    return str(((pod or {}).get("spec") or {}).get("nodeName") or "")


def _terminating(pod: Obj | None) -> bool:
    return ((pod or {}).get("metadata") or {}).get("deletionTimestamp") is not None
