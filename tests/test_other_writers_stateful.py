"""Not the only writer: the controller lends, reclaims, crashes and restarts while other writers
add, change and remove taints, labels and the controller's own keys on its nodes.

A stateful property test (Hypothesis ``RuleBasedStateMachine``). The controller is the real
one, as far as the nodes are concerned: the ``Informer``, the ``Actuator`` over the
``KubeWriter`` and the ``Reconciler``, with the ``reactive`` strategy, a demand the machine sets
(``tests.support.fakes.Demand``: low lends every node, high takes them all back) and the
in-memory audit store, which outlives a crash as a database would. A crash cuts the running
process after its k-th write (``tests.support.actuation.Recorder``); the next tick is a new
process (a new Reconciler and actuator: start-up recovery runs first), as is a restart. The
informer's cache is shared across processes: a new one would list the same nodes.

The other writers are the cluster's: a GPU health checker's ``nvidia.com/gpu.unhealthy``, the
node lifecycle's ``node.kubernetes.io/unreachable:NoExecute``, a maintenance taint whose value
changes, GPU Feature Discovery rewriting ``nvidia.com/gpu.product``, a team label; and a person
or a tool that removes the state label, removes or garbles ``original``, garbles ``since`` or
removes the lent taint. Each is a read and a merge patch carrying the resourceVersion read,
between two of the controller's steps. The pool's selector label is left alone (a node that
leaves every pool is a case of its own).

The invariants, each failure named by its letter:

(a) no foreign taint is lost: a taint whose key is neither the controller's nor the pool's
    serving or lent taint, put there by another writer (or there from the start), is on the node
    with the value that writer left after any controller action, unless that writer removed it;
    labels likewise;
(b) an original is never lost or overwritten: once a lend recorded one, the node carries that
    same original until it is restored from it (unless another writer removed or garbled it);
(c) a node is never counted as serving capacity while it is lent or its state cannot be read:
    the pool snapshot the Reconciler builds counts it in ``core.tick.away``;
(d) where nobody else wrote, restore is exact: a node back to serving has the labels and taints
    it had before the lend, byte for byte (order and ``timeAdded`` included).

Run on the emulator and on a real kube-apiserver (the ``backend`` fixture); ``derandomize``
makes the examples the same on every run, so a failure in CI is a failure on a laptop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.audit import AuditLog, MemoryAuditStore, UlidFactory
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.reflector import WatchSettings
from rebalancer.adapters.writer import KubeWriter, RetryPolicy
from rebalancer.core import model, nodestate, tick
from rebalancer.core.model import PodMarks, PoolName
from rebalancer.core.policy import PoolPolicy
from rebalancer.runtime.observing import Observer
from rebalancer.runtime.reconcile import Reconciler
from rebalancer.runtime.seams import AlwaysLeader, PoolConfig
from sandbox.emulator.resources import NODES
from sandbox.emulator.views import expected_views
from tests.support import backends, objects, pools
from tests.support.actuation import Crash, Recorder
from tests.support.fakes import Demand
from tests.support.reads import scheduling
from tests.support.waits import Pulse, no_sleep, stop

Obj = dict[str, Any]
# Signed, as the controller always runs (docs/design/node-state-integrity.md): a writer that
# writes back what it read of the controller's keys changes nothing the signature covers.
KEYS = nodestate.Keys(seal=nodestate.Seal(nodestate.SealKey(b"the-stateful-test-key-" * 2)))
POOL = PoolName("inference")
NAMES = ("gpu-0", "gpu-1", "gpu-2")
SERVE = model.Taint(key="workload", value="inference", effect="NoSchedule")
LEND = model.Taint(key=KEYS.lent_taint, value="training", effect="NoSchedule")
# The lend changes a label the node has and adds one it has not, so that restoring labels is
# exercised as well as the taint swap; the pool's selector (gpu-pool) is not among them.
SPEC = nodestate.LendSpec(
    remove_taints=(SERVE,),
    add_taints=(LEND,),
    labels={"example.com/serving": "no", "example.com/lent-to": "training"},
)
MARKS = PodMarks(
    lend_taints=(LEND,), serving_taints=(SERVE,), inference_selector={"app": "llm-serving"}
)
POLICY = PoolPolicy(
    rps_per_node=100.0,
    min_serving=0,
    cooldown=timedelta(0),
    min_loan=timedelta(0),
    warmup=timedelta(0),
    max_step_fraction=1.0,
    reclaim_deadline=timedelta(seconds=60),
    # Demand jumps between the two levels: a fall is held one tick or so, not ten minutes, so
    # that an example sees loans come and go.
    drop_hold=timedelta(seconds=30),
    lend_spec=SPEC,
)
LOW, HIGH = 0.0, 1000.0  # rps: lend every node; need every node back
OWNED_TAINTS = {SERVE.key, LEND.key}
# (key, effect) -> the values another writer may give it.
FOREIGN_TAINTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("nvidia.com/gpu.unhealthy", "NoSchedule"): ("true",),
    ("node.kubernetes.io/unreachable", "NoExecute"): ("",),
    ("example.com/maintenance", "PreferNoSchedule"): ("planned", "now"),  # on every node at start
}
FOREIGN_LABELS: dict[str, tuple[str, ...]] = {
    "nvidia.com/gpu.product": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED"),
    "example.com/team": ("search", "ads"),
}
# What another writer does to the controller's own keys, and the garbage it leaves.
GARBLED_ORIGINAL = '{"v": 1, "taints": '
GARBLED_SINCE = "yesterday"
OWN_KEY_CHANGES = (
    "state label removed",
    "original removed",
    "original garbled",
    "since garbled",
    "lent taint removed",
)
_MERGE = "application/merge-patch+json"


def config() -> PoolConfig:
    """The pool, with a strategy of its own per process (a strategy may keep state)."""
    return pools.reactive_pool()


def taints_of(node: Obj) -> list[Obj]:
    return list(node["spec"].get("taints") or [])


def has_taint(node: Obj, key: str, effect: str, value: str) -> bool:
    return any(
        (t["key"], t["effect"], t.get("value", "")) == (key, effect, value) for t in taints_of(node)
    )


def marks(node: Obj) -> list[str]:
    """The controller's marks on the node: what says it is, or was being, lent."""
    meta = node["metadata"]
    found = []
    if KEYS.state in (meta.get("labels") or {}):
        found.append("state label")
    if KEYS.original in (meta.get("annotations") or {}):
        found.append("original")
    if any(t["key"] == LEND.key for t in taints_of(node)):
        found.append("lent taint")
    return found


def restored_from(node: Obj, text: str) -> list[str]:
    """What of the original ``text`` the node does not have back: the taints the lend removed,
    the labels it changed."""
    original = nodestate.decode_original(text)
    assert isinstance(original, nodestate.Original), original
    missing = []
    removed = {(t.key, t.effect) for t in SPEC.remove_taints}
    for taint in original.taints:
        if (taint.key, taint.effect) in removed and not has_taint(
            node, taint.key, taint.effect, taint.value or ""
        ):
            missing.append(f"taint {taint}")
    labels = node["metadata"].get("labels") or {}
    for key, value in original.labels.items():
        if labels.get(key) != value:
            missing.append(f"label {key}={value} (has {labels.get(key)})")
    return missing


@dataclasses.dataclass
class Truth:
    """What the machine knows of one node, whatever the node itself now says."""

    foreign_taints: dict[tuple[str, str], str]  # (key, effect) -> value other writers left
    foreign_labels: dict[str, str]
    baseline: tuple[str, str]  # labels and taints as JSON text before the current loan
    original: str | None = None  # the original a lend recorded, while the loan lasts
    lost: bool = False  # another writer removed or garbled that original
    loaned: bool = False  # a lend reached the node and no restore has been seen since
    meddled: bool = False  # another writer wrote the node during the loan


class OtherWriters(RuleBasedStateMachine):
    """One cluster per example: three inference nodes, the controller, the other writers."""

    backend: ClassVar[backends.Backend] = backends.EMULATOR
    # The invariants this run holds the controller to. Each test holds one, so that a failure
    # of one (which ends its example at once) does not hide the ways another can fail.
    checks: ClassVar[frozenset[str]] = frozenset("abcd")

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.stack = contextlib.AsyncExitStack()
        self.opened: backends.Opened = self.run(self.stack.enter_async_context(self.backend.open()))
        self.objects: backends.Objects = self.opened.objects
        for name in NAMES:
            body = objects.gpu_node(name)
            body["metadata"]["labels"]["example.com/serving"] = "yes"
            objects.add(self.objects, body)
        self.pulse = Pulse()
        self.informer = Informer(
            self.opened.api, settings=WatchSettings(timeout_seconds=86_400), on_change=self.pulse
        )
        self.informer_task = self.run(self._start_informer())
        self.audit = MemoryAuditStore()  # the store outlives every process, as a database does
        self.demand = Demand({POOL: LOW}, self.opened.clock)
        self.jobs = 0
        self.nodes: dict[str, Obj] = {}
        self.controller, self.writer = self.process()
        # Counts with the Reconciler's own observe, and never ticks: the controller's beliefs
        # (a demand drop held, episodes) are not disturbed by the invariants' looking.
        self.counter, _ = self.process()
        self.read_nodes()
        self.truth = {name: self._first_truth(self.nodes[name]) for name in NAMES}

    def _first_truth(self, node: Obj) -> Truth:
        foreign = {
            (t["key"], t["effect"]): t.get("value", "")
            for t in taints_of(node)
            if t["key"] not in OWNED_TAINTS
        }
        labels = node["metadata"]["labels"]
        known = {k: labels[k] for k in FOREIGN_LABELS if k in labels}
        return Truth(foreign, known, scheduling(node))

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return self.runner.run(work)

    async def _start_informer(self) -> asyncio.Task[None]:
        task = asyncio.create_task(self.informer.run())
        await asyncio.wait_for(self.informer.synced.wait(), 10)
        return task

    def process(self) -> tuple[Reconciler, Recorder]:
        """A controller process: a reconciler, its actuator and its writer, nothing carried
        over from an earlier one but the cluster and the audit store."""
        clock = self.opened.clock
        writer = Recorder(KubeWriter(self.opened.core, RetryPolicy(sleep=no_sleep)))
        reconciler = Reconciler(
            [config()],
            observer=Observer([config()], views=self.informer, metrics=self.demand, keys=KEYS),
            clock=clock,
            actuators={POOL: Actuator(writer, KEYS, SPEC, MARKS, clock)},
            audit_log=AuditLog(self.audit, sink=None, new_id=UlidFactory(clock)),
            leadership=AlwaysLeader(now=clock),
            keys=KEYS,
            # One write in flight at a time: a crash cuts exactly where it says.
            reclaim_concurrency=1,
            lend_concurrency=1,
        )
        return reconciler, writer

    def teardown(self) -> None:
        try:
            self.run(stop(self.informer_task))
            self.run(self.stack.aclose())
        finally:
            self.runner.close()

    # -- reading the cluster --------------------------------------------------------------------

    def read_nodes(self) -> None:
        """Wait for the informer to hold what the server holds, then read every node."""

        store = self.objects  # the emulator's store or RealCluster: both answer ``peek``

        async def caught_up() -> None:
            await self.pulse.until(
                lambda: self.informer.node_views(MARKS) == expected_views(store, MARKS), within=10
            )

        self.run(caught_up())
        self.nodes = {name: self.objects.get(NODES, None, name) for name in NAMES}

    def _write(self, name: str, change: Callable[[Obj], Obj]) -> None:
        """Another writer's write: read the node, merge-patch what it changes, with the
        resourceVersion it read (a taint list is replaced whole, as any writer's is)."""
        node = self.objects.get(NODES, None, name)
        body = change(copy.deepcopy(node))
        body.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        self.objects.patch(NODES, None, name, _MERGE, json.dumps(body).encode())
        truth = self.truth[name]
        if truth.loaned or marks(node):
            truth.meddled = True

    # -- the controller -------------------------------------------------------------------------

    @initialize()
    def the_idle_nodes_are_lent_first(self) -> None:
        """Every example starts with the nodes on loan (demand is low), so that a short run
        spends its steps on what others do to lent nodes."""
        self.a_tick(5)

    # Two rules rather than one with a value: a rule is as likely as any other, where the
    # first value of a sampled one is what Hypothesis tries most.
    @rule()
    def demand_rises(self) -> None:
        self.demand.rps[POOL] = HIGH

    @rule()
    def demand_falls(self) -> None:
        self.demand.rps[POOL] = LOW

    @rule(seconds=st.sampled_from([5, 30, 90]))
    def a_tick(self, seconds: int) -> None:
        self.opened.advance(seconds)
        self.run(self.controller.tick())
        self.after_the_controller()

    @rule(seconds=st.sampled_from([5, 30, 90]), writes=st.integers(1, 4))
    def a_tick_that_crashes(self, seconds: int, writes: int) -> None:
        """The process dies right after its ``writes``-th write of the tick (or after the tick,
        if it writes less); the next tick is a new process's."""
        self.opened.advance(seconds)
        self.writer.crash_after = len(self.writer.writes) + writes
        with contextlib.suppress(Crash):
            self.run(self.controller.tick())
        self.controller, self.writer = self.process()
        self.after_the_controller()

    @rule()
    def a_restart(self) -> None:
        self.controller, self.writer = self.process()
        self.read_nodes()

    def lent_nodes(self) -> list[str]:
        return [
            n
            for n in NAMES
            if (self.nodes[n]["metadata"]["labels"] or {}).get(KEYS.state) == "lent"
        ]

    @precondition(lambda self: self.lent_nodes())
    @rule(data=st.data())
    def training_lands(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self.lent_nodes()), label="node")
        self.jobs += 1
        objects.training(self.objects, f"job-{self.jobs}", 1, node)
        self.read_nodes()

    # -- the other writers ----------------------------------------------------------------------

    @rule(
        name=st.sampled_from(NAMES),
        which=st.sampled_from(sorted(FOREIGN_TAINTS)),
        data=st.data(),
    )
    def a_foreign_taint_is_set(
        self, name: str, which: tuple[str, str], data: st.DataObject
    ) -> None:
        key, effect = which
        value = data.draw(st.sampled_from(FOREIGN_TAINTS[which]), label="value")
        taint = {"key": key, "effect": effect, **({"value": value} if value else {})}

        def change(node: Obj) -> Obj:
            taints = taints_of(node)
            at = [i for i, t in enumerate(taints) if (t["key"], t["effect"]) == which]
            if at:
                taints[at[0]] = {**taints[at[0]], **taint, "value": value}
                if not value:
                    taints[at[0]].pop("value")
            else:
                taints.append(taint)
            return {"spec": {"taints": taints}}

        self._write(name, change)
        self.truth[name].foreign_taints[which] = value
        self.read_nodes()

    def with_foreign_taints(self) -> list[tuple[str, tuple[str, str]]]:
        return [(n, kv) for n in NAMES for kv in sorted(self.truth[n].foreign_taints)]

    @precondition(lambda self: self.with_foreign_taints())
    @rule(data=st.data())
    def a_foreign_taint_is_removed(self, data: st.DataObject) -> None:
        name, which = data.draw(st.sampled_from(self.with_foreign_taints()), label="taint")

        def change(node: Obj) -> Obj:
            kept = [t for t in taints_of(node) if (t["key"], t["effect"]) != which]
            return {"spec": {"taints": kept or None}}

        self._write(name, change)
        del self.truth[name].foreign_taints[which]
        self.read_nodes()

    @rule(name=st.sampled_from(NAMES), key=st.sampled_from(sorted(FOREIGN_LABELS)), data=st.data())
    def a_foreign_label_is_set_or_removed(self, name: str, key: str, data: st.DataObject) -> None:
        value = data.draw(st.sampled_from((*FOREIGN_LABELS[key], None)), label="value")
        self._write(name, lambda _: {"metadata": {"labels": {key: value}}})
        if value is None:
            self.truth[name].foreign_labels.pop(key, None)
        else:
            self.truth[name].foreign_labels[key] = value
        self.read_nodes()

    def own_key_changes(self) -> list[tuple[str, str]]:
        """The changes to the controller's own keys that would change something now."""
        found = []
        for name in NAMES:
            node = self.nodes[name]
            labels = node["metadata"].get("labels") or {}
            annotations = node["metadata"].get("annotations") or {}
            present = {
                "state label removed": KEYS.state in labels,
                "original removed": KEYS.original in annotations,
                "original garbled": annotations.get(KEYS.original, GARBLED_ORIGINAL)
                != GARBLED_ORIGINAL,
                "since garbled": annotations.get(KEYS.since, GARBLED_SINCE) != GARBLED_SINCE,
                "lent taint removed": "lent taint" in marks(node),
            }
            found += [(name, what) for what in OWN_KEY_CHANGES if present[what]]
        return found

    @precondition(lambda self: self.own_key_changes())
    @rule(data=st.data())
    def another_writer_changes_a_key_of_the_controllers(self, data: st.DataObject) -> None:
        name, what = data.draw(st.sampled_from(self.own_key_changes()), label="change")
        changes: dict[str, Callable[[Obj], Obj]] = {
            "state label removed": lambda _: {"metadata": {"labels": {KEYS.state: None}}},
            "original removed": lambda _: {"metadata": {"annotations": {KEYS.original: None}}},
            "original garbled": lambda _: {
                "metadata": {"annotations": {KEYS.original: GARBLED_ORIGINAL}}
            },
            "since garbled": lambda _: {"metadata": {"annotations": {KEYS.since: GARBLED_SINCE}}},
            "lent taint removed": lambda node: {
                "spec": {"taints": [t for t in taints_of(node) if t["key"] != LEND.key] or None}
            },
        }
        self._write(name, changes[what])
        if what.startswith("original") or what == "since garbled":
            # A garbled since breaks the signature as a garbled original does: the original is
            # no longer provably the controller's, and counts only as far as the pool's
            # specification confirms it (docs/design/node-state-integrity.md).
            self.truth[name].lost = True
        self.read_nodes()

    # -- what the controller did, judged -----------------------------------------------------

    def after_the_controller(self) -> None:
        """After the controller's step: learn the originals its lends recorded, and check (b)
        and (d) on every node. Nobody else wrote during the step."""
        self.read_nodes()
        for name in NAMES:
            node, truth = self.nodes[name], self.truth[name]
            value = (node["metadata"].get("annotations") or {}).get(KEYS.original)
            ours = value is not None and value != GARBLED_ORIGINAL
            if ours and value != truth.original:
                assert "b" not in self.checks or truth.original is None or truth.lost, (
                    f"(b) {name}: its original {truth.original} was overwritten with {value}"
                )
                truth.original, truth.lost, truth.loaned = value, False, True
            on = marks(node)
            if truth.loaned and not on:
                if "b" in self.checks and truth.original is not None and not truth.lost:
                    missing = restored_from(node, truth.original)
                    assert not missing, (
                        f"(b) {name}: back to serving, but not from its original: {missing}"
                    )
                if "d" in self.checks and not truth.meddled:
                    assert scheduling(node) == truth.baseline, (
                        f"(d) {name}: nobody else wrote it, yet the restore is not exact: "
                        f"{scheduling(node)} != {truth.baseline}"
                    )
                truth.original, truth.lost, truth.loaned = None, False, False
            elif "b" in self.checks and truth.loaned and value is None and not truth.lost:
                raise AssertionError(
                    f"(b) {name}: its original {truth.original} is gone, yet the node is not "
                    f"back to serving from it (it still carries the {', '.join(on)})"
                )
            elif "d" in self.checks and not truth.loaned and not on and not truth.meddled:
                # Never lent, or lent and rolled back within the step.
                assert scheduling(node) == truth.baseline, (
                    f"(d) {name}: nobody else wrote it, yet it is not as it was: "
                    f"{scheduling(node)} != {truth.baseline}"
                )

    # -- the invariants ---------------------------------------------------------------------

    @invariant()
    def a_baseline_is_taken_of_every_node_between_loans(self) -> None:
        """Not a check: where a node is not on loan, what it is now is what a restore of its
        next loan must give back (nobody wrote it since)."""
        for name in NAMES:
            truth = self.truth[name]
            if not truth.loaned and not marks(self.nodes[name]):
                truth.baseline, truth.meddled = scheduling(self.nodes[name]), False

    @invariant()
    def no_foreign_taint_or_label_is_lost(self) -> None:
        if "a" not in self.checks:
            return
        for name in NAMES:
            node, truth = self.nodes[name], self.truth[name]
            for (key, effect), value in truth.foreign_taints.items():
                assert has_taint(node, key, effect, value), (
                    f"(a) {name}: another writer's taint {key}={value}:{effect} is gone: "
                    f"{taints_of(node)}"
                )
            labels = node["metadata"].get("labels") or {}
            for key, value in truth.foreign_labels.items():
                assert labels.get(key) == value, (
                    f"(a) {name}: another writer's label {key}={value} is now {labels.get(key)}"
                )

    @invariant()
    def no_node_lent_or_unreadable_is_counted_as_serving(self) -> None:
        if "c" not in self.checks:
            return
        now = self.opened.clock()
        seen = self.run(self.counter.observer.observe(now))
        pool = seen.snapshot.pools[POOL]
        for view in pool.nodes:
            name, truth = str(view.name), self.truth[str(view.name)]
            state = nodestate.read(view, KEYS)
            on = marks(self.nodes[name])
            lent = truth.loaned and bool(on)
            unreadable = isinstance(state, nodestate.StateError)
            if not (lent or unreadable):
                continue
            one = dataclasses.replace(pool, nodes=(view,))
            assert tick.away(one, POLICY, KEYS, now) == 1, (
                f"(c) {name}: {'unreadable' if unreadable else 'lent'} ({state}; it carries "
                f"{on}), yet the pool counts it as serving capacity"
            )


def run_machine(backend: backends.Backend, check: str) -> None:
    """The machine on ``backend``, held to invariant ``check``."""
    machine = type(
        f"OtherWritersOn{backend.name.title()}",
        (OtherWriters,),
        {"backend": backend, "checks": frozenset(check)},
    )
    limits = EMULATOR_RUN if backend.name == "emulator" else REAL_RUN
    run_state_machine_as_test(machine, settings=limits)


# The emulator runs 20 examples of up to 25 steps per invariant; the real server, a shared
# process that every step asks a few requests of, a few dozen steps. Derandomized: the same
# examples on every run, on every machine. A failure is shrunk to its shortest sequence, which
# Hypothesis bounds at a few minutes.
EMULATOR_RUN = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
REAL_RUN = settings(EMULATOR_RUN, max_examples=8, stateful_step_count=20)


def test_no_foreign_taint_or_label_is_lost_whatever_else_writes_the_nodes(
    backend: backends.Backend,
) -> None:
    run_machine(backend, "a")


def test_an_original_is_never_lost_or_overwritten(backend: backends.Backend) -> None:
    run_machine(backend, "b")


def test_a_node_lent_or_unreadable_is_never_counted_as_serving_capacity(
    backend: backends.Backend,
) -> None:
    run_machine(backend, "c")


def test_where_nobody_else_wrote_a_restore_is_exact(backend: backends.Backend) -> None:
    run_machine(backend, "d")
