"""Leader election on a coordination.k8s.io/v1 Lease: only the holder writes, and it stops early.

Where it sits: ``rebalancer run`` may start several replicas; each runs a ``LeaderElector``. The
runtime asks ``may_write(now)`` before every write the actuator makes (and records ``term`` and
``identity`` in the audit log), and learns of every change of leadership from the ``on_started``
/ ``on_stopped`` callbacks (the ``rebalancer_leader`` gauge is set from them) or the ``elected``
event.

Why not kubernetes-asyncio's ``leaderelection`` package (see docs/design/leadership.md): its
clock is ``time.time()`` and its sleeps ``asyncio.sleep`` (neither injectable), it writes naive
local times with a ``Z`` suffix, it never sets ``leaseTransitions`` (so there is no term for the
audit log), it does not release the lease on shutdown, a hung renew request is not bounded by the
renew deadline, and a transport error (not an ``ApiException``) escapes its loop. The protocol
here is client-go's, kept small:

- A candidate reads the Lease each ``retry_period``. A lease whose record has not changed for
  ``leaseDurationSeconds`` *as measured on the candidate's own clock since it last saw the record
  change* (not the ``renewTime`` written in it, so clock offsets between machines do not matter,
  only their rates), or that has an empty holder, may be taken: the candidate writes itself as
  holder with an optimistic-lock update (the resourceVersion it read), so of two racing
  candidates one gets 409 Conflict.
- The holder renews each ``retry_period``. ``may_write(now)`` is true only while ``now`` is
  before the start of its last successful renewal plus ``renew_deadline``, which is shorter than
  the lease duration: a holder cut off from the API server stops writing at least
  ``lease_duration - renew_deadline`` before any other candidate can consider the lease expired.
  The renewal's start (before the read) is used, never its end, so a slow answer cannot stretch
  the window.
- ``term`` is the lease's ``leaseTransitions`` for the current stretch of leadership. Unlike
  client-go, which counts changes of holder, every new stretch increments it, including the same
  identity coming back after losing the lease or restarting: the audit log needs to tell apart
  writes made under different stretches.
- On shutdown (``release``, or ``run`` being cancelled) the holder first stops writing, then
  writes an empty holder with a one-second duration so the next candidate takes over at once.
- ``on_started(term)`` is called once per stretch, right after the write that made this
  candidate holder succeeded (the Lease already names it, ``may_write`` is already true);
  ``on_stopped(term, why)`` once when the stretch ends (lost, taken, deadline passed, released),
  with ``may_write`` already false and, on release, before the Lease is freed. So whatever the
  runtime shows from them never claims a leadership the Lease does not give. A listener that
  raises is logged and changes nothing in the election.

Errors never end ``run``: a failed attempt is logged and counts as not renewed.

The identity is the pod's name and a suffix unique to the process (``process_identity``, as
client-go's ``id + "_" + uuid``): the Lease tells holders apart by identity alone, so two
processes given the same name (a copied environment, ``rebalancer run`` started inside the pod
with ``kubectl exec``) would each take the other's lease for its own and lead together.
``pod_of`` gives the pod back from an identity, and from the pod name alone that the last
release wrote into the Lease and the audit log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client

from rebalancer.core.model import Clock, Term
from rebalancer.errors import ConfigError, shown

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Sleep = Callable[[float], Awaitable[None]]


def monotonic_clock() -> Clock:
    """UTC that moves with the monotonic clock: a wall-clock step cannot extend a lease."""
    wall, mono = datetime.now(UTC), time.monotonic()
    return lambda: wall + timedelta(seconds=time.monotonic() - mono)


def process_identity(pod: str) -> str:
    """``pod`` and a suffix of this call's own (a random UUID): one per process, as the
    composition root calls it once. Two processes with the same pod name are two holders."""
    if not pod:
        raise ConfigError("a leader election candidate needs a non-empty pod name")
    identity = f"{pod}{SEPARATOR}{uuid.uuid4()}"
    if len(identity) > MAX_IDENTITY:
        raise ConfigError(
            f"POD_NAME={shown(pod)}: with its process suffix the identity would be "
            f"{len(identity)} characters, over the {MAX_IDENTITY} the audit log keeps"
        )
    return identity


def pod_of(identity: str) -> str:
    """The pod (or host) a holder identity names: what comes before its process suffix. An
    identity with no suffix (the pod name alone, as the last release wrote it) is its own."""
    pod, separator, suffix = identity.rpartition(SEPARATOR)
    if not separator or not pod:
        return identity
    try:
        uuid.UUID(suffix)
    except ValueError:
        return identity
    return pod


SEPARATOR = "_"  # never in a pod name (a DNS subdomain) or a host name
# The audit log's ``controller`` column holds the identity; a pod name (up to 253 characters)
# generated by a Deployment or a StatefulSet is at most 63, so the 37 of the suffix fit.
MAX_IDENTITY = 253


@dataclass(frozen=True)
class Timings:
    """client-go's defaults; ``renew_deadline < lease_duration`` is what makes writes safe."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ConfigError(
                "leader election needs 0 < retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline}, {self.lease_duration}"
            )


@dataclass(frozen=True)
class Record:
    """What a Lease's spec says, as far as the election is concerned."""

    holder: str
    duration: float
    acquired: str | None
    renewed: str | None
    transitions: int


class LeaderElector:
    def __init__(
        self,
        api: Any,
        *,
        name: str,
        namespace: str,
        identity: str,
        timings: Timings | None = None,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        on_started: Callable[[Term], None] | None = None,
        on_stopped: Callable[[Term, str], None] | None = None,
    ) -> None:
        if not identity:
            raise ConfigError("a leader election candidate needs a non-empty identity")
        self._leases = client.CoordinationV1Api(api)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.timings = timings or Timings()
        self.now: Clock = clock or monotonic_clock()
        self._sleep = sleep
        self._on_started, self._on_stopped = on_started, on_stopped
        self.term: Term | None = None  # set while this candidate leads
        self.elected = asyncio.Event()  # set while this candidate leads
        self.observed: Record | None = None  # the lease as last read (holder for the audit)
        self._observed_at: datetime | None = None
        self._renewed: datetime | None = None  # start of the last successful acquire/renew

    # -----------------------------------------------------------------------------------------
    # What the runtime asks

    def may_write(self, now: datetime) -> bool:
        """Whether this candidate may write to the cluster at ``now`` (its own clock)."""
        if self.term is None or self._renewed is None:
            return False
        return now < self._renewed + timedelta(seconds=self.timings.renew_deadline)

    @property
    def holder(self) -> str:
        """The holder the lease named when last read ('' if none or not read yet)."""
        return self.observed.holder if self.observed else ""

    # -----------------------------------------------------------------------------------------
    # The loop

    async def run(self) -> None:
        """Try to acquire, then renew, every ``retry_period`` until cancelled; then release."""
        try:
            while True:
                await self.step()
                await self._sleep(self.timings.retry_period)
        except asyncio.CancelledError:
            await self.release()
            raise

    async def step(self) -> bool:
        """One attempt to acquire or renew the lease; whether this candidate leads after it."""
        now = self.now()
        try:
            await self._attempt(now)
        except Exception as exc:  # transport or API failure: an attempt that did not renew
            log.warning(
                "lease %s/%s: %s could not acquire or renew: %s: %s",
                self.namespace,
                self.name,
                self.identity,
                type(exc).__name__,
                exc,
            )
        if self.term is not None and not self.may_write(self.now()):
            self._stop(f"not renewed within renew_deadline ({self.timings.renew_deadline}s)")
        return self.term is not None

    async def _attempt(self, now: datetime) -> None:
        status, lease = await self._call(
            self._leases.read_namespaced_lease, self.name, self.namespace
        )
        if status == 404:
            if self.term is not None:
                self._stop("lease deleted")
            await self._create(now)
            return
        _raise_for(status, lease)
        record = _record(lease, self.timings.lease_duration)
        if record != self.observed:
            self.observed, self._observed_at = record, now
        if self.term is not None and record.holder != self.identity:
            self._stop(f"lease taken by {record.holder or 'nobody (released)'}")
        if record.holder and record.holder != self.identity and not self._expired(record, now):
            return
        renewing = self.term is not None and record.holder == self.identity
        spec = self._spec(now, record, renewing)
        lease["spec"] = spec  # metadata.resourceVersion stays: the update is conditional
        status, written = await self._call(
            self._leases.replace_namespaced_lease, self.name, self.namespace, lease
        )
        if status == 409:
            log.info("lease %s/%s: %s lost a race for it", self.namespace, self.name, self.identity)
            return
        _raise_for(status, written)
        self._written(now, _record(written, self.timings.lease_duration), renewing)

    def _expired(self, record: Record, now: datetime) -> bool:
        assert self._observed_at is not None
        return now >= self._observed_at + timedelta(seconds=record.duration)

    def _spec(self, now: datetime, record: Record, renewing: bool) -> Obj:
        stamp = _micro(now)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.timings.lease_duration),
            "acquireTime": record.acquired if renewing else stamp,
            "renewTime": stamp,
            "leaseTransitions": record.transitions if renewing else record.transitions + 1,
        }

    async def _create(self, now: datetime) -> None:
        stamp = _micro(now)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": math.ceil(self.timings.lease_duration),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        status, created = await self._call(
            self._leases.create_namespaced_lease, self.namespace, body
        )
        if status == 409:  # another candidate created it first
            return
        _raise_for(status, created)
        self._written(now, _record(created, self.timings.lease_duration), renewing=False)

    def _written(self, now: datetime, record: Record, renewing: bool) -> None:
        self.observed, self._observed_at, self._renewed = record, now, now
        if renewing:
            return
        self.term = Term(self.identity, record.transitions, now)
        self.elected.set()
        log.info(
            "lease %s/%s: %s leads, term %d",
            self.namespace,
            self.name,
            self.identity,
            record.transitions,
        )
        self._tell(self._on_started, self.term)

    def _stop(self, why: str) -> None:
        term = self.term
        self.term, self._renewed = None, None
        self.elected.clear()
        if term is None:
            return
        log.warning(
            "lease %s/%s: %s stops leading (term %d): %s",
            self.namespace,
            self.name,
            self.identity,
            term.number,
            why,
        )
        self._tell(self._on_stopped, term, why)

    def _tell(self, listener: Callable[..., None] | None, *args: object) -> None:
        """Call a listener. One that raises must not end ``run``, skip the release write, or be
        taken for a failed renewal: the election goes on as if it had returned."""
        if listener is None:
            return
        try:
            listener(*args)
        except Exception:
            log.exception("lease %s/%s: a leadership listener failed", self.namespace, self.name)

    async def release(self) -> bool:
        """Stop writing, then free the lease for the next candidate; whether it was freed."""
        if self.term is None:
            return False
        self._stop("released")  # no write of ours may follow the release
        now = self.now()
        try:
            status, lease = await self._call(
                self._leases.read_namespaced_lease, self.name, self.namespace
            )
            _raise_for(status, lease)
            record = _record(lease, self.timings.lease_duration)
            if record.holder != self.identity:
                return False
            stamp = _micro(now)
            lease["spec"] = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": record.transitions,
            }
            status, written = await self._call(
                self._leases.replace_namespaced_lease, self.name, self.namespace, lease
            )
            _raise_for(status, written)
        except Exception as exc:  # the lease then expires on its own
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
            return False
        log.info("lease %s/%s: %s released it", self.namespace, self.name, self.identity)
        return True

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any) -> tuple[int, Obj]:
        """Status and JSON body of one request; raw JSON, bounded well inside the deadline."""
        response = await method(
            *args, _preload_content=False, _request_timeout=self.timings.renew_deadline / 2
        )
        try:
            body: Obj = json.loads(await response.read() or b"{}")
            return int(response.status), body
        finally:
            response.release()


class LeaseError(Exception):
    """The API server refused a lease read or write for a reason other than a lost race."""


def _raise_for(status: int, body: Obj) -> None:
    if not 200 <= status <= 299:
        raise LeaseError(f"{status} {body.get('reason', '')}: {body.get('message', '')}")


def _record(lease: Obj, default_duration: float) -> Record:
    spec = lease.get("spec") or {}
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        duration=float(spec.get("leaseDurationSeconds") or default_duration),
        acquired=spec.get("acquireTime"),
        renewed=spec.get("renewTime"),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def _micro(when: datetime) -> str:
    """``metav1.MicroTime``: RFC 3339 with microseconds, UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
