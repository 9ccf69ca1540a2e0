"""The emulator's object store: every object, one resourceVersion counter, watch history.

Like etcd behind kube-apiserver there is a single revision counter; every write takes the next
value and stamps it, as a decimal string, on the object's ``metadata.resourceVersion``. A list
answers with the current revision. A write that names a stale ``resourceVersion`` (a PUT, a patch
carrying one, a delete precondition) is refused with 409 Conflict. Each collection keeps a bounded
history of changes, so a watch can resume from a revision it still holds and gets 410 Expired
(as an ``ERROR`` event) when it does not.

The store also plays the cluster's other actors, synchronously after each write, because a
controller under test sees their effects through the API: the kubelet (a bound pod starts and
becomes Ready; a terminating pod disappears when its grace period ends on the emulator's clock),
the node lifecycle controller (the ``node.kubernetes.io/unschedulable`` taint follows
``spec.unschedulable``), the disruption controller (PodDisruptionBudget status) and, on demand,
the scheduler (``schedule``). All methods are synchronous: the event loop never interleaves two
writes, which is what makes each one atomic.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rebalancer.core.model import Clock
from sandbox.emulator import (
    conversion,
    disruption,
    patch,
    scheduling,
    selector,
    status,
    strategic,
    strategy,
)
from sandbox.emulator.clock import ManualClock, parse_rfc3339, rfc3339, wall_clock
from sandbox.emulator.index import Index
from sandbox.emulator.resources import NODES, PDBS, PODS, ResourceType
from sandbox.emulator.status import Cause
from sandbox.emulator.watcher import Change, Scope, Watcher

Obj = dict[str, Any]
Key = tuple[str, str]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what apiserver's generateName draws from
_SNAPSHOTS = 64
_ACTED_ON = frozenset(rt.storage for rt in (NODES, PODS, PDBS))  # what the other actors watch


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    grace_period: int | None = None
    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ListRequest:
    scope: Scope
    limit: int = 0
    continue_token: str = ""
    resource_version: str = ""
    # False: the page holds the stored objects themselves, for a caller that only serializes
    # them (the HTTP server): copying 150,000 pods made a LIST take twice as long.
    copies: bool = True


@dataclass(frozen=True, slots=True)
class WatchRequest:
    scope: Scope
    resource_version: str = ""
    bookmarks: bool = False
    timeout: float | None = None
    send_initial_events: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Obj]
    resource_version: int
    continue_token: str = ""
    remaining: int | None = None


class Store:
    def __init__(
        self,
        clock: Clock = wall_clock,
        *,
        history: int = 1000,
        seed: int = 0,
        bookmark_interval: float = 60.0,
        watch_timeout: tuple[float, float] = (1800.0, 3600.0),
        kubelet: bool = True,
        node_lifecycle: bool = True,
    ) -> None:
        self.clock = clock
        self._rv = 1
        self._rng = random.Random(seed)
        self._objects: dict[str, dict[Key, Obj]] = {}
        self._indexes: dict[str, Index] = {}
        # What changed since the other actors last looked, per collection, and the pods whose
        # grace period runs: the actors look only at these, so a write costs the same in a
        # cluster of 150,000 pods as in one of ten.
        self._dirty: dict[str, set[Key]] = {}
        self._terminating: set[Key] = set()
        self._history: dict[str, deque[Change]] = {}
        self._floor: dict[str, int] = {}
        self._history_size = history
        self._watchers: set[Watcher] = set()
        self._snapshots: OrderedDict[str, tuple[int, list[Obj]]] = OrderedDict()
        self._bookmark_interval = timedelta(seconds=bookmark_interval)
        self._watch_timeout = watch_timeout
        self._kubelet, self._node_lifecycle = kubelet, node_lifecycle
        self._settling = False
        self._scales: dict[str, int] = {}
        if isinstance(clock, ManualClock):
            clock.on_advance(self.tick)

    @property
    def resource_version(self) -> int:
        return self._rv

    def set_scale(self, controller_uid: str, replicas: int) -> None:
        """Declare a workload controller's desired replicas, which the emulated disruption
        controller reads for percentage and ``maxUnavailable`` budgets (there are no
        ReplicaSet objects to read it from)."""
        self._scales[controller_uid] = replicas
        self._dirty.setdefault(PDBS.storage, set()).update(self._collection(PDBS))
        self._settle()

    # -----------------------------------------------------------------------------------------
    # Reads

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._collection(rt).get(_key(rt, namespace, name))
        if obj is None:
            raise status.not_found(rt.plural, rt.group, name)
        return copy.deepcopy(obj)

    def peek(self, rt: ResourceType) -> list[Obj]:
        """The stored objects of ``rt`` themselves, not copies: for reading only (the authorizer
        reads the RBAC objects on every request, and copying them each time would be waste)."""
        return list(self._collection(rt).values())

    def list_page(self, request: ListRequest) -> Page:
        self._check_read_version(request.resource_version)
        if request.continue_token:
            rv, items, offset = self._resume(request.continue_token)
        else:
            rv, offset = self._rv, 0
            items = self._select(request.scope)
        copied = copy.deepcopy if request.copies else _same_object
        if request.limit <= 0 or offset + request.limit >= len(items):
            return Page([copied(o) for o in items[offset:]], rv)
        end = offset + request.limit
        token = self._remember(rv, items, end)
        remaining = None
        if request.scope.labels.empty and request.scope.fields.empty:
            remaining = len(items) - end
        return Page([copied(o) for o in items[offset:end]], rv, token, remaining)

    def _remember(self, rv: int, items: list[Obj], offset: int) -> str:
        ident = f"{self._rng.getrandbits(128):032x}"
        self._snapshots[ident] = (rv, items)
        while len(self._snapshots) > _SNAPSHOTS:
            self._snapshots.popitem(last=False)
        raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "id": ident, "offset": offset})
        return base64.urlsafe_b64encode(raw.encode()).decode()

    def _resume(self, token: str) -> tuple[int, list[Obj], int]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            ident, offset = str(data["id"]), int(data["offset"])
        except (ValueError, KeyError, TypeError):
            raise status.bad_request(f"continue key is not valid: {token}") from None
        if ident not in self._snapshots:
            raise status.expired(
                "The provided continue parameter is too old to display a consistent list result. "
                "You can start a new list without the continue parameter."
            )
        rv, items = self._snapshots[ident]
        return rv, items, offset

    def _check_read_version(self, text: str) -> None:
        if text in ("", "0"):
            return
        asked = _parse_version(text)
        if asked > self._rv:
            raise status.too_large_resource_version(asked, self._rv)

    # -----------------------------------------------------------------------------------------
    # Writes

    def create(
        self, rt: ResourceType, namespace: str | None, body: Obj, *, dry_run: bool = False
    ) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        _bind_namespace(rt, namespace, meta)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                self._rng.choice(_NAME_CHARS) for _ in range(5)
            )
        causes = strategy.validate_create(rt, obj)
        if causes:
            raise status.invalid(rt.kind, rt.invalid_group, meta.get("name", ""), causes)
        key = _key(rt, meta.get("namespace"), meta["name"])
        if key in self._collection(rt):
            raise status.already_exists(rt.plural, rt.group, meta["name"])
        new = strategy.prepare_create(rt, obj, self.clock(), self._uid())
        new = _typed(rt, new)
        if dry_run:
            return new
        out = self._write(rt, "ADDED", new, None)
        self._settle()
        return out

    def load(self, rt: ResourceType, objects: Iterable[Obj]) -> int:
        """Seed ``objects`` as a cluster that was already running holds them: each is taken as
        it is (no copy, no defaults, no validation), given a uid if it has none and the next
        resourceVersion, and indexed; nothing is recorded for watches, so load before anyone
        watches. For clusters of 150,000 pods, which ``create`` seeds in minutes (each create
        validates, defaults, copies and lets the kubelet start the pod). The caller hands over
        what ``create`` and the kubelet would have made of its objects; ``tests/sandbox``
        holds the two paths to the same answer. The number loaded."""
        collection, count = self._collection(rt), 0
        for obj in objects:
            meta = obj["metadata"]
            key = _key(rt, meta.get("namespace"), meta["name"])
            if key in collection:
                raise status.already_exists(rt.plural, rt.group, meta["name"])
            meta.setdefault("uid", self._uid())
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._stored(rt, key, None, obj)
            collection[key] = obj
            count += 1
        self._settle()
        return count

    def replace(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        _check_name(meta, name)
        _bind_namespace(rt, namespace, meta)
        current = self._collection(rt).get(_key(rt, meta.get("namespace"), name))
        if current is None:
            if rt.create_on_update and subresource is None:
                return self.create(rt, namespace, obj, dry_run=dry_run)
            raise status.not_found(rt.plural, rt.group, name)
        return self._update(rt, current, obj, subresource, dry_run)

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        if content_type not in PATCH_TYPES:
            raise status.unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(PATCH_TYPES)}"
            )
        current = self._collection(rt).get(_key(rt, namespace, name))
        if current is None:
            raise status.not_found(rt.plural, rt.group, name)
        view = conversion.from_storage(rt, copy.deepcopy(current))
        operations = patch.decode(body)
        if content_type == JSON_PATCH:
            patched = patch.json_patch(view, operations)
        elif content_type == MERGE_PATCH:
            patched = patch.merge_patch(view, operations)
        else:
            patched = strategic.apply(view, operations, rt.kind)
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise status.bad_request("the patched object is not a valid object")
        obj = conversion.to_storage(rt, patched)
        _check_name(obj["metadata"], name)
        _bind_namespace(rt, namespace, obj["metadata"])
        return self._update(rt, current, obj, subresource, dry_run)

    def _update(
        self, rt: ResourceType, current: Obj, obj: Obj, subresource: str | None, dry_run: bool
    ) -> Obj:
        name = current["metadata"]["name"]
        asked = obj["metadata"].get("resourceVersion")
        # The server reads the version as a number: "0" (or "00") is no version at all.
        if asked and not (asked.isdigit() and int(asked) == 0):
            if asked != current["metadata"]["resourceVersion"]:
                raise status.conflict(rt.plural, rt.group, name)
        elif not rt.unconditional_update:
            cause = Cause(
                "FieldValueInvalid",
                "Invalid value: 0: must be specified for an update",
                "metadata.resourceVersion",
            )
            raise status.invalid(rt.plural, rt.group, name, [cause])  # as the update path names it
        new = _typed(rt, strategy.prepare_update(rt, obj, current, subresource))
        causes = strategy.validate_update(rt, new, current)
        if causes:
            raise status.invalid(rt.kind, rt.invalid_group, name, causes)
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if _same(new, current) or dry_run:
            return new if dry_run else copy.deepcopy(current)
        if _finalized(new, current):
            out = self._remove(rt, new)
        else:
            out = self._write(rt, "MODIFIED", new, current)
        self._settle()
        return out

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions
    ) -> Obj:
        """What DELETE answers: the object (pods, or any pending deletion) or a ``Status``."""
        current = self._collection(rt).get(_key(rt, namespace, name))
        if current is None:
            raise status.not_found(rt.plural, rt.group, name)
        _check_preconditions(rt, current, options)
        if options.dry_run:
            return copy.deepcopy(current)
        if rt.graceful:
            result, removed = self._delete_gracefully(rt, current, options)
        else:
            result, removed = self._delete_plainly(rt, current)
        self._settle()
        if removed and not rt.return_deleted:
            meta = result["metadata"]
            details = {"name": meta["name"], "kind": rt.plural, "uid": meta["uid"]}
            if rt.group:
                details["group"] = rt.group
            return status.success(details=details)
        return result

    def _delete_plainly(self, rt: ResourceType, current: Obj) -> tuple[Obj, bool]:
        if not current["metadata"].get("finalizers"):
            return self._remove(rt, current), True
        new = copy.deepcopy(current)
        meta = new["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = rfc3339(self.clock())
            if meta.get("generation"):
                meta["generation"] += 1
        meta["deletionGracePeriodSeconds"] = 0
        if _same(new, current):
            return copy.deepcopy(current), False
        return self._write(rt, "MODIFIED", new, current), False

    def _delete_gracefully(
        self, rt: ResourceType, current: Obj, options: DeleteOptions
    ) -> tuple[Obj, bool]:
        meta = current["metadata"]
        if meta.get("deletionTimestamp"):
            grace = meta.get("deletionGracePeriodSeconds")
            if not grace:
                return self._delete_plainly(rt, current)
            asked = options.grace_period
            if asked is None or max(asked, 0) >= grace:
                return copy.deepcopy(current), False
            started = parse_rfc3339(meta["deletionTimestamp"]) - timedelta(seconds=grace)
            return self._mark_deleting(rt, current, started, max(asked, 0), bump=False)
        period = _grace_period(current, options)
        return self._mark_deleting(rt, current, self.clock(), period, bump=True)

    def _mark_deleting(
        self, rt: ResourceType, current: Obj, start: datetime, period: int, bump: bool
    ) -> tuple[Obj, bool]:
        new = copy.deepcopy(current)
        meta = new["metadata"]
        meta["deletionTimestamp"] = rfc3339(start + timedelta(seconds=period))
        meta["deletionGracePeriodSeconds"] = period
        if bump and meta.get("generation"):
            meta["generation"] += 1
        written = self._write(rt, "MODIFIED", new, current)
        if period == 0 and not meta.get("finalizers"):
            return self._remove(rt, self._collection(rt)[_key_of(rt, written)]), True
        return written, False

    def evict(self, namespace: str, name: str, body: Obj) -> Obj:
        """The Eviction subresource: a 201 ``Status`` when the pod may go, else the refusal."""
        if (body.get("metadata") or {}).get("name") != name:
            raise status.bad_request("name in URL does not match name in Eviction object")
        pod = self.get(PODS, namespace, name)
        budgets = [b for b in self._collection(PDBS).values() if _ns(b) == namespace]
        refusal = disruption.eviction_refusal(pod, budgets)
        if refusal is not None:
            raise refusal
        raw = body.get("deleteOptions") or {}
        options = _delete_options(raw)
        _check_preconditions(PODS, pod, options)
        if not options.dry_run:
            self._mark_disruption_target(pod)
            self.delete(PODS, namespace, name, DeleteOptions(grace_period=options.grace_period))
        return status.success(code=201)

    def _mark_disruption_target(self, pod: Obj) -> None:
        new = copy.deepcopy(pod)
        changed = _set_condition(
            new,
            "DisruptionTarget",
            "True",
            "EvictionByEvictionAPI",
            "Eviction API: evicting",
            self.clock(),
        )
        if changed:
            self._write(PODS, "MODIFIED", new, self._collection(PODS)[_key_of(PODS, pod)])

    # -----------------------------------------------------------------------------------------
    # Watches

    def watch(self, request: WatchRequest) -> Watcher:
        now = self.clock()
        timeout = request.timeout
        if not timeout:  # unset or 0: the server's own randomized limit
            timeout = self._rng.uniform(*self._watch_timeout)
        bookmark_at = now + self._bookmark_interval if request.bookmarks else None
        watcher = Watcher(
            request.scope, request.bookmarks, now + timedelta(seconds=timeout), bookmark_at
        )
        if request.resource_version in ("", "0"):
            self._replay_state(watcher, request)
        else:
            asked = _parse_version(request.resource_version)
            failure = self._resume_failure(request.scope.rt, asked)
            if failure is not None:
                watcher.error(failure.status)
                return watcher
            for change in self._history.get(request.scope.rt.storage, ()):
                if change.resource_version > asked:
                    watcher.offer(change)
        self._watchers.add(watcher)
        return watcher

    def _replay_state(self, watcher: Watcher, request: WatchRequest) -> None:
        for obj in self._select(request.scope):
            watcher.added(obj)
        if request.send_initial_events and request.bookmarks:
            watcher.bookmark(self._rv, initial_events_end=True)

    def _resume_failure(self, rt: ResourceType, asked: int) -> status.ApiError | None:
        if asked > self._rv:
            return status.too_large_resource_version(asked, self._rv)
        floor = self._floor.get(rt.storage, 0)
        if asked < floor:
            return status.expired(f"too old resource version: {asked} ({floor})")
        return None

    def forget(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
        watcher.close()

    def close_watches(self) -> None:
        for watcher in list(self._watchers):
            self.forget(watcher)

    # -----------------------------------------------------------------------------------------
    # Time

    def tick(self) -> None:
        """Do what is due at the clock's current time: end grace periods, watch timeouts,
        bookmarks. Called when a ``ManualClock`` advances and periodically by the server."""
        now = self.clock()
        pods = self._collection(PODS)
        for key in sorted(self._terminating):
            pod = pods[key]
            if parse_rfc3339(pod["metadata"]["deletionTimestamp"]) <= now:
                # The kubelet confirms the kill with a zero grace period, as the real one does.
                self._delete_gracefully(PODS, pod, DeleteOptions(grace_period=0))
        for watcher in list(self._watchers):
            if watcher.deadline <= now:
                self.forget(watcher)
            elif watcher.bookmark_at is not None and watcher.bookmark_at <= now:
                watcher.bookmark(self._rv)
                watcher.bookmark_at = now + self._bookmark_interval
        self._settle()

    # -----------------------------------------------------------------------------------------
    # The scheduler stand-in

    def schedule(self) -> list[tuple[str, str, str]]:
        """Bind every pending pod that fits somewhere; ``(namespace, pod, node)`` per binding."""
        nodes = [n for _, n in sorted(self._collection(NODES).items())]
        bound: list[tuple[str, str, str]] = []
        for pod, placement in scheduling.placements(self._collection(PODS).values(), nodes):
            if placement.node is None:
                self._mark_unschedulable(pod, placement.message)
                continue
            self._bind(pod, placement.node)
            bound.append((_ns(pod), pod["metadata"]["name"], placement.node))
        self._settle()
        return bound

    def _bind(self, pod: Obj, node: str) -> None:
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        _set_condition(new, "PodScheduled", "True", None, None, self.clock())
        self._write(PODS, "MODIFIED", new, pod)

    def _mark_unschedulable(self, pod: Obj, message: str) -> None:
        new = copy.deepcopy(pod)
        if _set_condition(new, "PodScheduled", "False", "Unschedulable", message, self.clock()):
            self._write(PODS, "MODIFIED", new, pod)

    # -----------------------------------------------------------------------------------------
    # The other actors

    def _settle(self) -> None:
        if self._settling:
            return
        self._settling = True
        try:
            for _ in range(50):
                pods = self._dirty.pop(PODS.storage, set())
                nodes = self._dirty.pop(NODES.storage, set())
                budgets = self._dirty.pop(PDBS.storage, set())
                if not (pods or nodes or budgets):
                    break
                if self._kubelet:
                    self._start_pods(pods, nodes)
                if self._node_lifecycle:
                    self._sync_unschedulable_taints(nodes)
                self._sync_budgets(budgets, {namespace for namespace, _ in pods})
        finally:
            self._settling = False

    def _start_pods(self, pods: set[Key], nodes: set[Key]) -> None:
        """The kubelet: start the changed pods, and those on changed nodes, that are bound to
        a node that exists and have not started."""
        collection, index = self._collection(PODS), self._index(PODS)
        for _, node in nodes:
            pods = pods | index.keys("field", "spec.nodeName", node)
        for key in sorted(pods):
            pod = collection.get(key)
            if pod is None:
                continue
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Pending":
                continue
            if not spec.get("nodeName") or ("", spec["nodeName"]) not in self._collection(NODES):
                continue
            self._write(PODS, "MODIFIED", started(pod, self.clock()), pod)

    def _sync_unschedulable_taints(self, nodes: set[Key]) -> None:
        collection = self._collection(NODES)
        for key in sorted(nodes):
            node = collection.get(key)
            if node is None:
                continue
            spec = node.get("spec") or {}
            taints = spec.get("taints") or []
            has = any(_is_unschedulable_taint(t) for t in taints)
            if bool(spec.get("unschedulable")) == has:
                continue
            new = copy.deepcopy(node)
            if has:
                kept = [t for t in taints if not _is_unschedulable_taint(t)]
            else:
                taint = {**scheduling.UNSCHEDULABLE_TAINT, "timeAdded": rfc3339(self.clock())}
                kept = [*taints, taint]
            new.setdefault("spec", {})["taints"] = kept
            self._write(NODES, "MODIFIED", strategy.normalize(new), node)

    def _sync_budgets(self, budgets: set[Key], namespaces: set[str]) -> None:
        """The disruption controller: the status of the changed budgets and of every budget in
        a namespace where a pod changed, counted over the pods its selector can match."""
        collection, index = self._collection(PDBS), self._index(PDBS)
        for namespace in namespaces:
            budgets = budgets | index.keys("namespace", "", namespace)
        for key in sorted(budgets):
            budget = collection.get(key)
            if budget is None:
                continue
            pods = self._matching_pods(budget)
            wanted = disruption.budget_status(budget, pods, self.clock(), self._scales)
            if wanted == budget.get("status"):
                continue
            new = copy.deepcopy(budget)
            new["status"] = wanted
            self._write(PDBS, "MODIFIED", new, budget)

    def _matching_pods(self, budget: Obj) -> list[Obj]:
        """The pods of the budget's namespace its selector may match (a superset: the
        disruption arithmetic applies the selector itself)."""
        try:
            chosen = selector.from_object((budget.get("spec") or {}).get("selector"))
        except selector.SelectorError:
            chosen = None
        scope = Scope(PODS, _ns(budget), chosen or selector.EVERYTHING)
        return self._select(scope)

    # -----------------------------------------------------------------------------------------
    # Primitives

    def _collection(self, rt: ResourceType) -> dict[Key, Obj]:
        return self._objects.setdefault(rt.storage, {})

    def _index(self, rt: ResourceType) -> Index:
        index = self._indexes.get(rt.storage)
        if index is None:
            index = self._indexes[rt.storage] = Index(rt)
        return index

    def _select(self, scope: Scope) -> list[Obj]:
        """The stored objects ``scope`` selects, in key order (not copies)."""
        collection = self._collection(scope.rt)
        keys = self._index(scope.rt).candidates(scope)
        chosen = sorted(collection) if keys is None else sorted(keys)
        return [collection[k] for k in chosen if scope.selects(collection[k])]

    def _stored(self, rt: ResourceType, key: Key, old: Obj | None, new: Obj | None) -> None:
        """Keep the indexes and the actors' bookkeeping in step with one write."""
        index = self._index(rt)
        if old is not None:
            index.discard(key, old)
        if new is not None:
            index.add(key, new)
        if rt.storage in _ACTED_ON:
            self._dirty.setdefault(rt.storage, set()).add(key)
        if rt.storage == PODS.storage:
            if new is not None and new["metadata"].get("deletionGracePeriodSeconds"):
                self._terminating.add(key)
            else:
                self._terminating.discard(key)

    def _uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _write(self, rt: ResourceType, kind: str, new: Obj, previous: Obj | None) -> Obj:
        self._rv += 1
        stored = copy.deepcopy(new)
        stored["metadata"]["resourceVersion"] = str(self._rv)
        key = _key_of(rt, stored)
        self._stored(rt, key, self._collection(rt).get(key), stored)
        self._collection(rt)[key] = stored
        self._record(rt, Change(kind, stored, previous, self._rv))
        return copy.deepcopy(stored)

    def _remove(self, rt: ResourceType, current: Obj) -> Obj:
        self._rv += 1
        key = _key_of(rt, current)
        previous = self._collection(rt).pop(key)
        self._stored(rt, key, previous, None)
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(rt, Change("DELETED", gone, previous, self._rv))
        return copy.deepcopy(current)

    def _record(self, rt: ResourceType, change: Change) -> None:
        history = self._history.setdefault(rt.storage, deque())
        history.append(change)
        if len(history) > self._history_size:
            history.popleft()
            self._floor[rt.storage] = history[0].resource_version - 1
        for watcher in list(self._watchers):
            if watcher.scope.rt.storage == rt.storage:
                watcher.offer(change)


# ---------------------------------------------------------------------------------------------
# Helpers


def _same_object(obj: Obj) -> Obj:
    return obj


def _key(rt: ResourceType, namespace: str | None, name: str) -> Key:
    return (namespace or "" if rt.namespaced else "", name)


def _key_of(rt: ResourceType, obj: Obj) -> Key:
    return _key(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])


def _ns(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace", ""))


def _typed(rt: ResourceType, obj: Obj) -> Obj:
    storage_type = conversion.to_storage(rt, {})
    obj["apiVersion"] = storage_type.get("apiVersion", rt.api_version)
    obj["kind"] = storage_type.get("kind", rt.kind)
    return obj


def _parse_version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise status.bad_request(f"invalid resource version: {text!r}") from None
    if value < 0:
        raise status.bad_request(f"invalid resource version: {text!r}")
    return value


def _check_name(meta: Obj, name: str) -> None:
    if meta.get("name", "") != name:
        raise status.bad_request(
            f"the name of the object ({meta.get('name', '')}) does not match the name on the "
            f"URL ({name})"
        )


def _bind_namespace(rt: ResourceType, namespace: str | None, meta: Obj) -> None:
    if not rt.namespaced:
        meta.pop("namespace", None)
        return
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise status.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = namespace


def _check_preconditions(rt: ResourceType, current: Obj, options: DeleteOptions) -> None:
    meta, name = current["metadata"], current["metadata"]["name"]
    if options.uid and options.uid != meta.get("uid"):
        why = (
            f"Precondition failed: UID in precondition: {options.uid}, "
            f"UID in object meta: {meta.get('uid')}"
        )
        raise status.conflict(rt.plural, rt.group, name, why)
    if options.resource_version and options.resource_version != meta.get("resourceVersion"):
        why = (
            f"Precondition failed: ResourceVersion in precondition: {options.resource_version}, "
            f"ResourceVersion in object meta: {meta.get('resourceVersion')}"
        )
        raise status.conflict(rt.plural, rt.group, name, why)


def _delete_options(raw: Obj) -> DeleteOptions:
    preconditions = raw.get("preconditions") or {}
    grace = raw.get("gracePeriodSeconds")
    return DeleteOptions(
        grace_period=int(grace) if grace is not None else None,
        uid=preconditions.get("uid"),
        resource_version=preconditions.get("resourceVersion"),
        dry_run=bool(raw.get("dryRun")),
    )


def delete_options(raw: Obj) -> DeleteOptions:
    """``DeleteOptions`` from a request body (or the query, shaped like one)."""
    return _delete_options(raw)


def _grace_period(pod: Obj, options: DeleteOptions) -> int:
    """``podStrategy.CheckGracefulDelete`` with the negative-to-1 rule of ``BeforeDelete``."""
    spec = pod.get("spec") or {}
    if options.grace_period is not None:
        period = options.grace_period if options.grace_period >= 0 else 1
    else:
        period = int(spec.get("terminationGracePeriodSeconds", 30))
    if not spec.get("nodeName") or disruption.is_terminal(pod):
        return 0
    return period


def _same(new: Obj, current: Obj) -> bool:
    return json.dumps(new, sort_keys=True) == json.dumps(current, sort_keys=True)


def _finalized(new: Obj, current: Obj) -> bool:
    """``shouldDeleteDuringUpdate``: the last finalizer of an object whose grace is over."""
    meta = new["metadata"]
    old_grace = current["metadata"].get("deletionGracePeriodSeconds")
    return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") and old_grace == 0


def _set_condition(
    pod: Obj, kind: str, value: str, reason: str | None, message: str | None, now: datetime
) -> bool:
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    wanted: Obj = {"type": kind, "status": value}
    if reason:
        wanted["reason"] = reason
    if message:
        wanted["message"] = message
    for index, condition in enumerate(conditions):
        if condition.get("type") != kind:
            continue
        same = all(condition.get(k) == wanted.get(k) for k in ("status", "reason", "message"))
        if same:
            return False
        stamp = condition.get("lastTransitionTime") if condition.get("status") == value else None
        conditions[index] = {**wanted, "lastTransitionTime": stamp or rfc3339(now)}
        return True
    conditions.append({**wanted, "lastTransitionTime": rfc3339(now)})
    return True


def started(pod: Obj, now: datetime) -> Obj:
    """What the kubelet writes once a bound pod's containers run: Running, Ready."""
    new = copy.deepcopy(pod)
    stamp = rfc3339(now)
    previous = (pod.get("status") or {}).get("conditions") or []
    scheduled = [c for c in previous if c.get("type") == "PodScheduled"] or [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}
    ]
    others = [c for c in previous if c.get("type") not in (*_STARTED_CONDITIONS, "PodScheduled")]
    started = [
        {"type": t, "status": "True", "lastTransitionTime": stamp} for t in _STARTED_CONDITIONS
    ]
    new["status"] = {
        **(pod.get("status") or {}),
        "phase": "Running",
        "conditions": started + scheduled + others,
        "startTime": stamp,
        "containerStatuses": [
            {
                "name": c.get("name", ""),
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": stamp}},
            }
            for c in (pod.get("spec") or {}).get("containers") or []
        ],
    }
    return new


_STARTED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")


def _is_unschedulable_taint(taint: Obj) -> bool:
    return bool(
        taint.get("key") == scheduling.UNSCHEDULABLE_TAINT["key"]
        and taint.get("effect") == "NoSchedule"
    )
