"""The controller's view of Nodes and Pods: a cache fed by one list, then WATCH for ever.

Where it sits: the runtime starts ``Informer.run`` once, waits for ``synced``, and on each tick
asks ``node_views(marks)`` for the ``NodeView``s the core decides from; ``changed`` (and the
optional ``on_change`` callback) wakes the runtime early when something that matters moved, and
the runtime debounces. The actuator reads a node and its pods here (``view``) before a step, and
asks the server again what the step's safety needs (``adapters.actuator``).

Why a watch cache: a tick every few seconds that LISTs every pod of a large cluster is the load
pattern the API server's priority and fairness throttles first. So each resource is listed once
(as the first events of its watch where the server streams lists, else page by page; recording
the list's resourceVersion) and then WATCHed from that version with bookmarks and a
server-side timeout; a stream that ends or drops is resumed from the last version seen (bookmarks
move it), without listing. Only a 410 (the version fell out of the server's history) lists again,
and the new list replaces the cache with its differences applied as ordinary changes, so nothing
downstream can tell a relist from a burst of events.

Raw JSON, not the client's models: lists and watches are asked for with
``_preload_content=False`` and parsed here with orjson (the models are slow to build; the standard
library's parser took 36 ms a page of 500 pods, orjson 20 ms), and each object is cut
down at once to what the controller reads: a pod to a ``convert.PodRecord``, a node to
``convert.slim_node`` (docs/design/informer.md: 150,000 pods parsed whole are about 2 GB).
The client's own ``watch.Watch`` is not used: it opens an ``ApiClient`` of its own, builds model
objects for every event and retries a 410 by itself. Pods are watched across namespaces with a
field selector that leaves out pods that have not been scheduled or have finished; a finished pod
that slips through is dropped here too.

Failures never end the loop: transport errors and non-410 API errors are logged and retried after
a bounded exponential backoff (the sleep is injectable for tests).

The list+watch loop itself (``Reflector``, its settings and backoff) is ``adapters.reflector``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes_asyncio import client

from rebalancer.adapters import convert
from rebalancer.adapters.reflector import Obj, Reflector, Sleep, WatchSettings
from rebalancer.core import model
from rebalancer.core.model import NodeView

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name); nodes use ("", name)
OnChange = Callable[[str, str], None]  # (node name, what happened)
T = TypeVar("T")

# Only pods on a node that still hold it; the API server filters, so the cache stays small.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# Pods no node holds yet: the possible takers of lent capacity (``core.takers``).
PENDING_FIELD_SELECTOR = "spec.nodeName=,status.phase=Pending"
# A build of views over at least half the nodes, and at least this many, is frozen once made
# (``_out_of_collector``); below it a full collection of the views costs little.
BULK_FROM = 500


@dataclass
class _Views:
    """The views of every node under one set of pod marks, and the nodes to build again."""

    marks: model.PodMarks
    views: dict[str, NodeView] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    # Those of ``dirty`` whose pods changed: the others (a heartbeat, a label) keep the pod
    # views they had, the same objects, where building them again was most of a rebuild.
    pods_changed: set[str] = field(default_factory=set)
    # The views by name as last handed out; None once one of them is another object. The
    # same tuple while no view changed, so a caller can tell "nothing changed" by identity
    # (the observer keeps its pool membership so) instead of looking at 5,000 nodes a tick.
    ordered: tuple[NodeView, ...] | None = None
    # The names of ``views`` in order; None once a name came or went (a view that changed
    # keeps its place: the tuple is made again without sorting 5,000 names).
    names: list[str] | None = None


class Informer:
    """Nodes and their (running, unfinished) pods, kept current by two reflectors, and, when
    a pool lends only to takers (``watch_pending``), the pods waiting for a node by a third;
    with ``watch_workloads``, Kueue's Workloads waiting for quota by a fourth (their pods are
    takers too: docs/design/takers.md#kueue-workloads)."""

    def __init__(
        self,
        api: Any,
        *,
        prefix: str = "rebalancer.io/",
        node_selector: str | None = None,
        settings: WatchSettings | None = None,
        sleep: Sleep = asyncio.sleep,
        on_change: OnChange | None = None,
        freeze_after_sync: bool = False,
        watch_pending: bool = False,
        watch_workloads: bool = False,
    ) -> None:
        core = client.CoreV1Api(api)
        settings = settings or WatchSettings()
        self.prefix = prefix
        self.synced = asyncio.Event()  # set once both initial lists are in
        self.changed = asyncio.Event()  # set on a change that matters; the runtime clears it
        self._on_change = on_change
        self._freeze = freeze_after_sync
        self._collecting_paused = False  # the collector, off until the first lists are in
        self._nodes: dict[str, Obj] = {}  # each as ``convert.slim_node`` keeps it
        self._pods: dict[Key, convert.PodRecord] = {}
        self._pods_on: dict[str, dict[Key, convert.PodRecord]] = {}
        self._bad_pods: dict[str, dict[Key, str]] = {}  # node -> pod -> why it cannot be read
        # The views under each set of pod marks asked for (one per pool with its own marks),
        # each with the nodes whose node or pods changed since it was last asked for.
        self._by_marks: list[_Views] = []
        # Each node's last view under any marks, with the node object it was read from: under
        # other marks the node reads the same but for its pods (pools with pod marks of their
        # own read each changed node once, not once per set of marks).
        self._read: dict[str, tuple[Obj, NodeView]] = {}
        self._unreadable: dict[str, str] = {}  # "node/<name>" or "pod/<node>/<ns>/<name>" -> why
        self.nodes = self._node_reflector(core, node_selector, settings, sleep)
        self.pods = self._pod_reflector(core, settings, sleep)
        self._pending: dict[Key, _Pending] = {}
        self.pending_pods: Reflector | None = (
            self._pending_reflector(core, settings, sleep) if watch_pending else None
        )
        self._workloads: dict[Key, _Workload] = {}
        self.workloads: Reflector | None = (
            self._workload_reflector(api, settings, sleep) if watch_workloads else None
        )

    def _node_reflector(
        self, core: Any, node_selector: str | None, settings: WatchSettings, sleep: Sleep
    ) -> Reflector:
        """Nodes (those ``node_selector`` picks, when given), each kept slim."""
        node_query = {"label_selector": node_selector} if node_selector else {}
        return Reflector(
            "nodes",
            core.list_node,
            node_query,
            convert.slim_node,
            self._apply_node,
            self._replace_nodes,
            settings,
            sleep,
        )

    def _pod_reflector(self, core: Any, settings: WatchSettings, sleep: Sleep) -> Reflector:
        """Pods that still hold a node, in every namespace."""
        return Reflector(
            "pods",
            core.list_pod_for_all_namespaces,
            {"field_selector": POD_FIELD_SELECTOR},
            functools.partial(_PodSeen.of, prefix=self.prefix),
            self._apply_pod,
            self._replace_pods,
            settings,
            sleep,
        )

    def _pending_reflector(self, core: Any, settings: WatchSettings, sleep: Sleep) -> Reflector:
        """Pods no node holds yet, in every namespace: the possible takers of lent capacity."""
        return Reflector(
            "pending pods",
            core.list_pod_for_all_namespaces,
            {"field_selector": PENDING_FIELD_SELECTOR},
            _Pending.of,
            self._apply_pending,
            self._replace_pending,
            settings,
            sleep,
        )

    def _workload_reflector(self, api: Any, settings: WatchSettings, sleep: Sleep) -> Reflector:
        """Kueue's Workloads, in every namespace: the jobs Kueue holds back are takers before
        they have pods. A cluster without Kueue's CRD serves none: said once, at ERROR, and
        asked again until it does (``Reflector``'s ``absent``); nothing waits on it."""
        custom = client.CustomObjectsApi(api)
        call = functools.partial(
            custom.list_cluster_custom_object,
            convert.KUEUE_GROUP,
            convert.KUEUE_VERSION,
            convert.KUEUE_WORKLOADS,
        )
        absent = (
            f"the CustomResourceDefinition {convert.KUEUE_CRD} ({convert.KUEUE_VERSION}) is "
            "not served (is Kueue installed?): Kueue Workloads are no takers until it is "
            "(takers.kueue_workloads is on)"
        )
        return Reflector(
            "kueue workloads",
            call,
            {},
            _Workload.of,
            self._apply_workload,
            self._replace_workloads,
            # Listed page by page: the client's call for custom objects takes no
            # ``send_initial_events`` (a few hundred Workloads: one or two pages).
            dataclasses.replace(settings, stream_lists=False),
            sleep,
            absent=absent,
        )

    async def run(self) -> None:
        """Run until cancelled."""
        # The controller's process (``freeze_after_sync``) collects no garbage until the first
        # lists are in: they allocate tens of millions of objects, nearly all freed by their
        # count of references, and the collections that allocation set off walked the growing
        # cache again and again (a quarter of a sync's CPU, measured). The cache is collected
        # and frozen once synced; until then a failure's garbage waits (a few objects a retry).
        self._collecting_paused = self._freeze and gc.isenabled()
        if self._collecting_paused:
            gc.disable()
        try:
            await self._run()
        finally:
            self._resume_collecting()

    def _resume_collecting(self) -> None:
        if self._collecting_paused:
            self._collecting_paused = False
            gc.enable()

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.nodes.run(), name="informer-nodes")
            group.create_task(self.pods.run(), name="informer-pods")
            if self.pending_pods is not None:
                group.create_task(self.pending_pods.run(), name="informer-pending-pods")
                await self.pending_pods.listed.wait()
            if self.workloads is not None:
                group.create_task(self.workloads.run(), name="informer-kueue-workloads")
                await self.workloads.listed.wait()
            await self.nodes.listed.wait()
            await self.pods.listed.wait()
            # The cache is the process's bulk and lives as long as it: out of the collector's
            # way, a full collection no longer walks 150,000 pods (1.4 s each, measured).
            # The controller's process asks for it (wiring); a process that runs many informers
            # one after another, as the test suite does, had better not keep each one's heap.
            if self._freeze:
                self._out_of_collector()
                self._resume_collecting()
                _give_back_freed_memory()
            self.synced.set()
            log.info("informer synced: %d nodes, %d pods", len(self._nodes), len(self._pods))

    def _out_of_collector(self) -> None:
        """The heap as it is now collected, then frozen: out of the way of every later full
        collection, where the process asked for it (``freeze_after_sync``). Called once the
        cache is listed, and once most views under a set of marks have been built (the first
        tick, or a relist): 150,000 pod views walked by each full collection cost 150 ms of
        the tick it fell in (a lend wave's, measured). A frozen object that is freed later is
        freed by its count of references; one in a cycle would not be (``_let_go``)."""
        if self._freeze:
            gc.collect()
            gc.freeze()

    # -----------------------------------------------------------------------------------------
    # Reading

    def node_views(self, marks: model.PodMarks) -> tuple[NodeView, ...]:
        """Every cached node with its pods, by name. A node whose node object and pods did not
        change since the last call (under the same marks) is the very same object as then, so
        what the core memoised on it stays valid; a rebuilt view equal to the old one is
        replaced by the old one for the same reason. Each set of marks keeps its own views, so
        pools with different pod marks cost a rebuild only of what changed, not of everything
        on every call."""
        cached = self._views_under(marks)
        built = len(cached.dirty)
        bulk = built >= BULK_FROM and built * 2 >= len(self._nodes)
        for name in cached.dirty:
            self._rebuild(cached, name)
        cached.dirty.clear()
        if bulk:
            self._out_of_collector()
        if cached.ordered is None:
            if cached.names is None:
                cached.names = sorted(cached.views)
            cached.ordered = tuple(map(cached.views.__getitem__, cached.names))
        return cached.ordered

    def _views_under(self, marks: model.PodMarks) -> _Views:
        cached = next((c for c in self._by_marks if c.marks == marks), None)
        if cached is None:
            cached = _Views(marks, dirty=set(self._nodes))
            self._by_marks.append(cached)
        return cached

    def pending(self, marks: model.PodMarks) -> tuple[model.PendingPod, ...]:
        """The pods waiting for a node that tolerate every lend taint of ``marks``: who would
        use a node lent under them, then the pods of the Kueue Workloads waiting for quota (when
        watched) that would. Empty when neither is watched."""
        pods = [seen.pod for _, seen in sorted(self._pending.items()) if seen.pod is not None]
        for _, workload in sorted(self._workloads.items()):
            pods.extend(workload.pods)
        return tuple(
            pod
            for pod in pods
            if all(model.tolerates(pod.tolerations, t) for t in marks.lend_taints)
        )

    def unreadable(self) -> dict[str, str]:
        """Objects that could not be turned into views, and why: their node is left out of
        every view (so nothing decides about it) until they can be read again."""
        pods = {
            f"pod/{node}/{namespace}/{name}": why
            for node, bad in self._bad_pods.items()
            for (namespace, name), why in bad.items()
        }
        pending = {
            f"pod/{key[0]}/{key[1]}": seen.problem
            for key, seen in self._pending.items()
            if seen.pod is None
        }
        workloads = {
            f"workload/{key[0]}/{key[1]}": seen.problem
            for key, seen in self._workloads.items()
            if seen.problem
        }
        return self._unreadable | pods | pending | workloads

    def _touch(self, name: str, *, pods: bool = False) -> None:
        """The node (or, with ``pods``, its pods) changed: every set of views builds it again
        when next asked."""
        for cached in self._by_marks:
            cached.dirty.add(name)
            if pods:
                cached.pods_changed.add(name)

    def _rebuild(self, cached: _Views, name: str) -> None:
        self._unreadable.pop(f"node/{name}", None)
        pods_changed = name in cached.pods_changed
        cached.pods_changed.discard(name)
        raw = self._nodes.get(name)
        if raw is None or self._bad_pods.get(name):
            self._drop(cached, name)  # a node whose pods cannot be read cannot be judged
            return
        old = cached.views.get(name)
        # Pod views are a function of the pods' records and the marks: while no pod of the
        # node changed, those of its last view are what building them again would give.
        pods = old.pods if old is not None and not pods_changed else self._pod_views(cached, name)
        try:
            view = self._node_view(name, raw, pods)
        except Exception as exc:
            self._unreadable[f"node/{name}"] = f"{type(exc).__name__}: {exc}"
            self._drop(cached, name)
            return
        if old is not None and old == view:
            return  # the very object of before: what the core memoised on it holds
        cached.views[name] = view
        cached.ordered = None
        if old is None:
            cached.names = None
        else:
            _let_go(old)

    def _node_view(self, name: str, raw: Obj, pods: Sequence[model.PodView]) -> NodeView:
        """``convert.node_view(raw, pods)``: a view another set of marks read from this very
        node object, with ``pods`` for its own (a new object: a memo of its own)."""
        read = self._read.get(name)
        if read is not None and read[0] is raw:
            return dataclasses.replace(read[1], pods=tuple(pods))
        view = convert.node_view(raw, pods)
        self._read[name] = (raw, view)
        return view

    @staticmethod
    def _drop(cached: _Views, name: str) -> None:
        old = cached.views.pop(name, None)
        if old is not None:
            cached.ordered = None
            cached.names = None
            _let_go(old)

    def _pod_views(self, cached: _Views, name: str) -> list[model.PodView]:
        """The node's pods under ``cached.marks``. A pod whose view is the same under another
        set of marks (pools that tell inference apart by different labels mostly agree on
        every pod) gets that set's very object: four sets of marks then hold one view per pod,
        not four (about 40 MB at 150,000 pods)."""
        on_node = self._pods_on.get(name, {})
        records = [on_node[key] for key in sorted(on_node)]
        donors = [
            other.views[name].pods
            for other in self._by_marks
            if other is not cached and name not in other.dirty and name in other.views
        ]
        donors = [pods for pods in donors if len(pods) == len(records)]
        out = []
        for i, record in enumerate(records):
            view = convert.pod_view(record, cached.marks)
            out.append(next((pods[i] for pods in donors if pods[i] == view), view))
        return out

    def view(self, name: str, marks: model.PodMarks) -> NodeView | None:
        """The node with its pods under ``marks`` as the cache holds it now; None when the
        cache has not synced, does not hold the node, or cannot read it or one of its pods.
        The actuator's first read of a node it is about to write (every such write is locked
        to the ``resource_version`` read, so a stale cache is a 409, never a wrong write)."""
        if not self.synced.is_set():
            return None
        cached = self._views_under(marks)
        if name in cached.dirty:
            self._rebuild(cached, name)
            cached.dirty.discard(name)
        return cached.views.get(name)

    def node(self, name: str) -> Obj | None:
        """The cached JSON of a node, as ``convert.slim_node`` keeps it (read only)."""
        return self._nodes.get(name)

    # -----------------------------------------------------------------------------------------
    # Nodes

    def _apply_node(self, kind: str, obj: Obj) -> None:
        name = str(obj["metadata"]["name"])
        old = self._nodes.get(name)
        new = None if kind == "DELETED" else obj
        if new is None:
            self._nodes.pop(name, None)
            self._read.pop(name, None)
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
        known = {("", k): _version(v) for k, v in self._nodes.items()}
        _replace(
            known, fresh, self._apply_node, _version, lambda key: {"metadata": {"name": key[1]}}
        )

    # -----------------------------------------------------------------------------------------
    # Pods

    def _apply_pod(self, kind: str, seen: _PodSeen) -> None:
        key = seen.key
        old = self._pods.pop(key, None)
        before = old.node if old is not None else self._forget_bad(key)
        if before:
            self._pods_on.get(before, {}).pop(key, None)
            self._touch(before, pods=True)
        after = seen.node
        if seen.record is None and not after:
            after = before  # where it cannot be read, it stays where it was last seen
        if kind == "DELETED":
            after = ""
        if after and seen.record is not None:
            self._pods[key] = seen.record
            self._pods_on.setdefault(after, {})[key] = seen.record
        elif after:
            why = f"{seen.problem}; its node {after} is left alone"
            self._bad_pods.setdefault(after, {})[key] = why
        if after:
            self._touch(after, pods=True)
        pod = f"{key[0]}/{key[1]}"
        if before and before != after:
            self._notify(before, f"pod {pod} left")
        if after and before != after:
            self._notify(after, f"pod {pod} landed")
        elif after and (old is None) != (seen.record is None):
            self._notify(after, f"pod {pod} can{'' if seen.record else 'not'} be read")
        elif after and (old is not None and old.terminating) != seen.terminating:
            self._notify(after, f"pod {pod} is terminating")

    def _forget_bad(self, key: Key) -> str:
        """The node of a pod that could not be read, if it was one; it is forgotten."""
        for node, bad in list(self._bad_pods.items()):
            if bad.pop(key, None) is not None:
                if not bad:
                    del self._bad_pods[node]
                return node
        return ""

    def _replace_pods(self, items: list[_PodSeen]) -> None:
        fresh = {seen.key: seen for seen in items}
        known = {k: r.resource_version for k, r in self._pods.items()}
        for bad in self._bad_pods.values():
            known.update(dict.fromkeys(bad, ""))  # listed again, they are read again
        _replace(known, fresh, self._apply_pod, lambda seen: seen.version, _PodSeen.gone)

    # -----------------------------------------------------------------------------------------
    # Pending pods: no node holds them, so no view changes; a new one may be a taker, so the
    # loop is woken (a pod that only changed, or left, wakes nothing: no loan waits on that)

    def _apply_pending(self, kind: str, seen: _Pending) -> None:
        if kind == "DELETED" or seen.scheduled:
            self._pending.pop(seen.key, None)
            return
        known = seen.key in self._pending
        self._pending[seen.key] = seen
        if not known and self.synced.is_set():
            log.debug("pod %s/%s waits for a node", *seen.key)
            self.changed.set()
            if self._on_change is not None:
                self._on_change("", f"pod {seen.key[0]}/{seen.key[1]} waits for a node")

    def _replace_pending(self, items: list[_Pending]) -> None:
        fresh = {seen.key: seen for seen in items}
        known = {k: v.version for k, v in self._pending.items()}
        _replace(known, fresh, self._apply_pending, lambda seen: seen.version, _Pending.gone)

    # -----------------------------------------------------------------------------------------
    # Kueue Workloads: kept while they wait for quota (``convert.workload_waits``); one that
    # starts to wait wakes the loop, as a new pending pod does

    def _apply_workload(self, kind: str, seen: _Workload) -> None:
        if kind == "DELETED" or not (seen.pods or seen.problem):
            self._workloads.pop(seen.key, None)
            return
        known = seen.key in self._workloads
        self._workloads[seen.key] = seen
        if not known and self.synced.is_set():
            log.debug("workload %s/%s waits for quota", *seen.key)
            self.changed.set()
            if self._on_change is not None:
                self._on_change("", f"workload {seen.key[0]}/{seen.key[1]} waits for quota")

    def _replace_workloads(self, items: list[_Workload]) -> None:
        fresh = {seen.key: seen for seen in items}
        known = {k: v.version for k, v in self._workloads.items()}
        _replace(known, fresh, self._apply_workload, lambda seen: seen.version, _Workload.gone)

    # -----------------------------------------------------------------------------------------

    def _notify(self, node: str, why: str) -> None:
        # One line per object at DEBUG: a sync of 150,000 pods is a line per list at INFO.
        log.debug("node %s: %s", node, why)
        self.changed.set()
        if self._on_change is not None:
            self._on_change(node, why)


def _let_go(view: NodeView) -> None:
    """A view no set holds any more, its memo emptied. What the core memoises on a view points
    back at it (a decoded node holds its view): a cycle, which only the collector frees (a full
    collection, once the view has lived a few ticks), and never where the view is frozen
    (``_out_of_collector``). Without the memo, the view is freed as soon as the last tick that
    read it lets go. The memo is a cache: a holder that asks it again gets the same answers,
    worked out afresh."""
    view.memo.clear()


def _give_back_freed_memory() -> None:
    """Hand the heap the sync freed (its pages of parsed JSON) back to the system, where the
    C library allows it (glibc's ``malloc_trim``): the resident set is what a pod's memory
    limit counts, and freed memory kept by the allocator counted in it (tens of MB at
    150,000 pods). Nowhere else is it needed: elsewhere this does nothing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return


def _replace(
    current: Mapping[Key, str],
    fresh: Mapping[Key, T],
    apply: Callable[[str, T], None],
    version_of: Callable[[T], str],
    gone: Callable[[Key], T],
) -> None:
    """Apply a new list over the cache (each key with its resourceVersion) as the events that
    would have led to it."""
    for key in current:
        if key not in fresh:
            apply("DELETED", gone(key))
    for key, item in fresh.items():
        version = current.get(key)
        if version is None:
            apply("ADDED", item)
        elif not version or version != version_of(item):
            apply("MODIFIED", item)


@dataclass(frozen=True, slots=True)
class _PodSeen:
    """A pod as it arrives, in what the cache keeps of it: its key, the node it holds (none
    once it has finished), and its record, or why it cannot be read."""

    key: Key
    node: str
    version: str
    record: convert.PodRecord | None = None
    problem: str = ""

    @property
    def terminating(self) -> bool:
        return self.record is not None and self.record.terminating

    @staticmethod
    def of(pod: Obj, prefix: str) -> _PodSeen:
        """The pod read, its own annotations under the controller's key ``prefix``."""
        key = _pod_key(pod)
        try:
            node = "" if convert.finished(pod) else _node_of(pod)
            record = convert.pod_record(pod, prefix)
        except Exception as exc:  # one bad object must not take the others with it
            why = f"{type(exc).__name__}: {exc}"
            return _PodSeen(key, _node_if_readable(pod), _version(pod), problem=why)
        return _PodSeen(key, node, record.resource_version, record)

    @staticmethod
    def gone(key: Key) -> _PodSeen:
        return _PodSeen(key, "", "")


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pod waiting for a node, as a possible taker, or why it cannot be read (it is then no
    taker: a job the controller cannot read is not lent for)."""

    key: Key
    version: str
    pod: model.PendingPod | None = None
    problem: str = ""
    scheduled: bool = False  # the event that tells it left the selector (it got a node)

    @staticmethod
    def of(pod: Obj) -> _Pending:
        key, version = _pod_key(pod), _version(pod)
        try:
            if _node_of(pod) or (pod.get("status") or {}).get("phase") != "Pending":
                return _Pending(key, version, scheduled=True)
            taker = convert.pending_pod(pod, pod.get("spec") or {})
        except Exception as exc:  # one bad object must not take the others with it
            return _Pending(key, version, problem=f"{type(exc).__name__}: {exc}")
        return _Pending(key, version, taker)

    @staticmethod
    def gone(key: Key) -> _Pending:
        return _Pending(key, "")


@dataclass(frozen=True, slots=True)
class _Workload:
    """A Kueue Workload as a taker: the pods its job would run while it waits for quota (none
    once admitted, finished or deactivated), or why it cannot be read (then no taker)."""

    key: Key
    version: str
    pods: tuple[model.PendingPod, ...] = ()
    problem: str = ""

    @staticmethod
    def of(workload: Obj) -> _Workload:
        key, version = _pod_key(workload), _version(workload)
        try:
            pods = convert.workload_takers(workload)
        except Exception as exc:  # one bad object must not take the others with it
            return _Workload(key, version, problem=f"{type(exc).__name__}: {exc}")
        return _Workload(key, version, pods)

    @staticmethod
    def gone(key: Key) -> _Workload:
        return _Workload(key, "")


def _pod_key(pod: Obj) -> Key:
    """(namespace, name); the namespace interned, as the record's is (150,000 keys held one
    copy of it each: 9 MB)."""
    meta = pod["metadata"]
    return sys.intern(str(meta.get("namespace", ""))), str(meta["name"])


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _prefixed(obj: Obj, member: str, prefix: str) -> dict[str, str]:
    values = (obj.get("metadata") or {}).get(member) or {}
    return {k: v for k, v in values.items() if k.startswith(prefix)}


def _readiness(node: Obj) -> tuple[bool, str | None]:
    conditions = (node.get("status") or {}).get("conditions") or ()
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    return bool((node.get("spec") or {}).get("unschedulable")), ready


def _node_if_readable(pod: Obj) -> str:
    """The node an unreadable pod names, if that much can be read ("" if not: it is then kept
    against the node it was last seen on)."""
    try:
        return _node_of(pod)
    except (AttributeError, TypeError):
        return ""


def _node_of(pod: Obj | None) -> str:
    return str(((pod or {}).get("spec") or {}).get("nodeName") or "")
