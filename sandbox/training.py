"""The demo's training side: jobs that wait, run as gangs, finish or are preempted, and what
they say about lending.

``Training`` plays what a research cluster puts in front of the lent nodes: a queue of
preemptible jobs of one, two and four whole nodes, each asking by node affinity for the GPU it
can use (``Kind``: 48 GB of memory or more, a Turing card, a Hopper card), a few of each kind
always waiting (a backlog, as a busy queue has). Each job's pods form a Volcano PodGroup, so the
emulator's scheduler stand-in binds them all together or none (``sandbox.emulator.scheduling``),
as Volcano or Kueue would on a real cluster. It also plays the job's operator: a job whose pod
is evicted or deleted loses its work since its last checkpoint and starts again whole (what
Volcano's ``PodEvicted -> RestartJob`` policy, JobSet and the Kubeflow operators do), and a job
whose work is done ends. A job whose pods are told of a reclaim (the controller's reclaim-id
annotation, docs/design/reclaim-notice.md) stops, saves for ``SAVE`` and acknowledges it on
its pods (the reclaim-ack and last-checkpoint-time annotations, what the design asks of a
job); evicted then, it loses nothing. A notice withdrawn, it trains on.

Once a minute, before it reacts to anything, ``step`` checks the cluster as the controller left
it: a gang that lost pods while another of its pods still runs on a node of a pool the
controller lends from is *half-running* (a job the controller broke: its rule takes back every
lent node of a job losing pods on one); a pod bound to a node whose labels its node affinity
refuses, or whose GPU its affinity refuses (the node's pool as built, whatever its labels say
now), is *misplaced*. Both must never happen; they are counted, not corrected.

A gang may also run partly on nodes no pool lends (a ``48gb`` job on a lent L20 and an A100 of
the training pool): a reclaim of the L20 leaves its A100 pod running, and no controller that
touches only the nodes it lent can stop it. Ending that job is its operator's part (the
restart below, which Volcano's ``RestartJob`` makes within seconds), so such a job is counted
as preempted, not as half-running.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rebalancer.core import nodestate
from sandbox.emulator import cluster, scheduling
from sandbox.emulator.resources import NODES, PODS
from sandbox.emulator.store import MERGE_PATCH, DeleteOptions, Store

Obj = dict[str, Any]

CHECKPOINT = timedelta(minutes=30)  # a job saves its state every half hour of running
SAVE = timedelta(minutes=2)  # a job told of a reclaim saves this long, then acknowledges it
ATTEMPT = "training.rebalancer.io/attempt"  # the label telling a job's restarts apart


def _needs(key: str, operator: str, *values: str) -> Obj:
    return {"key": key, "operator": operator, "values": list(values)}


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of job: the GPU it asks for and how big and long its jobs are."""

    name: str
    needs: tuple[Obj, ...]  # node selector requirements on GFD's labels
    gpus: int  # per pod: a whole node of the GPU it asks for
    sizes: tuple[int, ...]  # nodes per job, drawn at random
    hours: tuple[float, float]  # work a job needs, drawn uniformly
    backlog: int  # jobs of this kind kept waiting

    def fits(self, pool: cluster.Pool) -> bool:
        """Whether the GPU of ``pool`` is one this kind's jobs can use."""
        terms = {"nodeSelectorTerms": [{"matchExpressions": list(self.needs)}]}
        probe = {"spec": {"affinity": {"nodeAffinity": {_REQUIRED: terms}}}}
        return scheduling.matches_affinity(probe, cluster.node(pool.name, pool))


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

KINDS = (
    # Fine-tunes whose model needs 40 GB a GPU: an L20 (46 GB) or an A100 (80 GB) will do.
    Kind(
        "48gb",
        (_needs("nvidia.com/gpu.memory", "Gt", "40000"),),
        8,
        (1, 1, 1, 2, 2, 4),
        (1.0, 4.0),
        3,
    ),
    # Small jobs kept on the cheap cards.
    Kind("turing", (_needs("nvidia.com/gpu.family", "In", "turing"),), 4, (1, 1, 2), (1.0, 3.0), 2),
    # FP8 pretraining: Hopper or nothing. No pool has Hopper, so these wait all day, and no
    # node may be lent for them.
    Kind("hopper", (_needs("nvidia.com/gpu.family", "In", "hopper"),), 8, (1, 2), (4.0, 8.0), 2),
)


@dataclass
class Job:
    name: str
    kind: Kind
    size: int
    work: timedelta
    attempt: int = 0
    done: timedelta = timedelta(0)  # work saved at checkpoints
    started: datetime | None = None  # when every pod of this attempt was bound
    preemptions: int = 0
    # A reclaim notice on its pods (docs/design/reclaim-notice.md): when it was first seen, the
    # reclaim id, and whether the job has saved and acknowledged it.
    told: datetime | None = None
    reclaim: str | None = None
    acked: bool = False

    @property
    def gpus(self) -> int:
        return self.size * self.kind.gpus

    def progress(self, now: datetime) -> timedelta:
        """Work done by ``now``: saved, and run this attempt up to a notice (it stops when told)."""
        assert self.started is not None
        until = now if self.told is None else self.told
        return self.done + (until - self.started)


@dataclass(frozen=True, slots=True)
class Preemption:
    time: datetime
    job: str
    lost_gpu_hours: float  # GPUs x time run since the last checkpoint
    answered: bool = False  # it had saved for a notice and acknowledged it: nothing lost


@dataclass(frozen=True, slots=True)
class Broken:
    """A gang seen half-running: ``running`` of its ``size`` pods bound and not terminating,
    one of them at least on a node of a pool the controller lends from."""

    time: datetime
    job: str
    running: int
    size: int


@dataclass(frozen=True, slots=True)
class Misplaced:
    time: datetime
    pod: str
    node: str


@dataclass
class Record:
    submitted: dict[str, int] = field(default_factory=dict)  # per kind
    completed: dict[str, int] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)
    broken: list[Broken] = field(default_factory=list)
    misplaced: list[Misplaced] = field(default_factory=list)
    checks: int = 0

    @property
    def jobs_preempted(self) -> int:
        return len({p.job for p in self.preemptions})

    @property
    def lost_gpu_hours(self) -> float:
        return sum(p.lost_gpu_hours for p in self.preemptions)

    @property
    def gangs_broken(self) -> int:
        return len({b.job for b in self.broken})


class Training:
    """The queue of training jobs, their scheduler's gang rule and their operator's restarts."""

    def __init__(
        self,
        store: Store,
        pools: Sequence[cluster.Pool],
        kinds: Sequence[Kind] = KINDS,
        seed: int = 7,
        lenders: Sequence[str] | None = None,
        keys: nodestate.Keys | None = None,
    ) -> None:
        self.store = store
        self.keys = keys or nodestate.Keys()  # the controller's prefix: the notice's keys
        self.kinds = tuple(kinds)
        self.pools = {p.name: p for p in pools}
        # The pools the controller lends from (every pool unless said): only a pod still
        # running on one of their nodes makes a gang that lost pods half-running.
        self.lenders = frozenset(self.pools if lenders is None else lenders)
        self.random = random.Random(seed)
        self.jobs: dict[str, Job] = {}
        self.record = Record()
        self._serial = 0

    # -- the minute -------------------------------------------------------------------------

    def step(self) -> None:
        """Check the cluster as it was left, then react: restart, end, submit, schedule."""
        now = self.store.clock()
        pods = self._pods_by_job()
        self.check(now, pods)
        for job in list(self.jobs.values()):
            self._react(job, pods.get(job.name, []), now)
        self._submit()
        self.store.schedule()
        pods = self._pods_by_job()
        for job in self.jobs.values():
            if job.started is None and self._bound(pods.get(job.name, [])) == job.size:
                job.started = now

    def check(self, now: datetime, pods: Mapping[str, list[Obj]] | None = None) -> None:
        """Count half-running gangs and misplaced pods in the cluster as it is now."""
        pods = self._pods_by_job() if pods is None else pods
        nodes = {n["metadata"]["name"]: n for n in self.store.peek(NODES)}
        self.record.checks += 1
        for job in self.jobs.values():
            mine = pods.get(job.name, [])
            running = self._bound(mine)
            if 0 < running < job.size and self._on_loan(mine, nodes):
                self.record.broken.append(Broken(now, job.name, running, job.size))
            for pod in mine:
                node = nodes.get(pod["spec"].get("nodeName") or "")
                if node is not None and not self._usable(pod, node):
                    name = pod["metadata"]["name"]
                    self.record.misplaced.append(Misplaced(now, name, node["metadata"]["name"]))

    # -- the job's operator -----------------------------------------------------------------

    def _react(self, job: Job, pods: list[Obj], now: datetime) -> None:
        if job.started is None:
            return
        ran = job.progress(now) - job.done
        if self._bound(pods) < job.size:  # a pod was evicted or deleted: the job restarts
            # From the notice's checkpoint once it acknowledged one, else its last periodic one.
            saved = ran if job.acked else CHECKPOINT * (ran // CHECKPOINT)
            lost = (ran - saved) / timedelta(hours=1) * job.gpus
            self.record.preemptions.append(Preemption(now, job.name, lost, job.acked))
            job.done += saved
            job.preemptions += 1
            self._delete(pods)
            job.attempt += 1
            job.started = job.told = job.reclaim = None
            job.acked = False
            self._create(job)
        elif job.done + ran < job.work:
            self._hear(job, pods, now)
        else:
            self._delete(pods, grace=0)
            del self.jobs[job.name]
            done = self.record.completed
            done[job.kind.name] = done.get(job.kind.name, 0) + 1

    def _hear(self, job: Job, pods: list[Obj], now: datetime) -> None:
        """Answer a reclaim notice on the job's pods: stop training when told, save for
        ``SAVE``, then acknowledge on every pod the reclaim id that pod was told (each node of
        a gang has a notice of its own), with the checkpoint's time, so that the controller
        evicts them at once; a notice withdrawn (its annotation gone), train on from where it
        stopped."""
        keys = self.keys
        told = {
            ann[keys.reclaim_id]
            for ann in ((p["metadata"].get("annotations") or {}) for p in pods)
            if keys.reclaim_id in ann
        }
        if told and job.told is None:
            job.told, job.reclaim = now, min(told)
        elif not told and job.told is not None:
            assert job.started is not None
            job.done += job.told - job.started
            job.started, job.told, job.reclaim, job.acked = now, None, None, False
        if job.told is None or job.acked or now < job.told + SAVE:
            return
        saved = nodestate.format_time(job.told + SAVE)
        for pod in pods:
            meta = pod["metadata"]
            own = (meta.get("annotations") or {}).get(keys.reclaim_id) or job.reclaim
            answer = {keys.reclaim_ack: own, keys.last_checkpoint: saved}
            body = json.dumps({"metadata": {"annotations": answer}}).encode()
            self.store.patch(PODS, meta["namespace"], meta["name"], MERGE_PATCH, body)
        job.acked = True

    def _submit(self) -> None:
        waiting: dict[str, int] = {}
        for job in self.jobs.values():
            if job.started is None:
                waiting[job.kind.name] = waiting.get(job.kind.name, 0) + 1
        for kind in self.kinds:
            for _ in range(kind.backlog - waiting.get(kind.name, 0)):
                self._serial += 1
                hours = self.random.uniform(*kind.hours)
                job = Job(
                    name=f"{kind.name}-{self._serial:03d}",
                    kind=kind,
                    size=self.random.choice(kind.sizes),
                    work=timedelta(minutes=round(hours * 60)),
                )
                self.jobs[job.name] = job
                submitted = self.record.submitted
                submitted[kind.name] = submitted.get(kind.name, 0) + 1
                self._create(job)

    def _create(self, job: Job) -> None:
        for index in range(job.size):
            pod = cluster.training_pod(
                job.name,
                index,
                gpus=job.kind.gpus,
                priority_class=None,
                needs=job.kind.needs,
                group=job.name,
                pools=tuple(self.pools),
            )
            pod["metadata"]["name"] = f"{job.name}-{job.attempt}-{index}"
            pod["metadata"]["labels"][ATTEMPT] = str(job.attempt)
            cluster.add(self.store, pod)

    def _delete(self, pods: list[Obj], grace: int | None = None) -> None:
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") and grace is None:
                continue
            meta = pod["metadata"]
            self.store.delete(
                PODS, meta["namespace"], meta["name"], DeleteOptions(grace_period=grace)
            )

    # -- reading the cluster ----------------------------------------------------------------

    def _pods_by_job(self) -> dict[str, list[Obj]]:
        """Each job's pods of its current attempt."""
        out: dict[str, list[Obj]] = {}
        for pod in self.store.peek(PODS):
            meta = pod["metadata"]
            name = (meta.get("annotations") or {}).get(scheduling.GROUP_ANNOTATION)
            job = self.jobs.get(name or "")
            if job is not None and meta["labels"].get(ATTEMPT) == str(job.attempt):
                out.setdefault(job.name, []).append(pod)
        return out

    @staticmethod
    def _bound(pods: list[Obj]) -> int:
        """Pods bound to a node and not on their way out."""
        return sum(
            1
            for p in pods
            if p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )

    def _on_loan(self, pods: list[Obj], nodes: Mapping[str, Obj]) -> bool:
        """Whether one of ``pods`` still runs on a node of a pool the controller lends from:
        what its gang rule must have taken back with the pods the job lost."""
        for pod in pods:
            if self._bound([pod]):
                node = nodes.get(pod["spec"]["nodeName"])
                labels = (node or {}).get("metadata", {}).get("labels") or {}
                if labels.get("gpu-pool") in self.lenders:
                    return True
        return False

    def _usable(self, pod: Obj, node: Obj) -> bool:
        """Whether ``pod``'s affinity accepts ``node`` by its labels now and as built."""
        if not scheduling.matches_affinity(pod, node):
            return False
        pool = self.pools.get((node["metadata"].get("labels") or {}).get("gpu-pool", ""))
        if pool is None:
            return False
        return scheduling.matches_affinity(pod, cluster.node(node["metadata"]["name"], pool))
