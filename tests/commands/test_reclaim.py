"""``reclaim.reclaim_wave`` (``rebalancer reclaim``) in process, against the API emulator on a
manual clock.

The emulator serves over HTTP as in ``tests/test_cli_run.py``, but time moves only when the wave
sleeps between passes (``Sleeper`` advances the emulator's clock, which is also the wave's), so a
two-minute deadline and pods that take a minute to terminate cost no wall time. The emulator's
request observer keeps a journal of the node writes the server took, in order, into which the
sleeper writes its sleeps too: "every serving taint is back before anything is waited on" is read
off the server's own record. A ``Watched`` actuator (the ``NodeActuator`` protocol, around the
real one) checks that the audit store holds every intent before the first write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rebalancer import settings as settings_mod
from rebalancer.adapters import ledger
from rebalancer.adapters.audit import AuditLog, AuditQuery, MemoryAuditStore
from rebalancer.cli import reclaim as reclaim_command
from rebalancer.commands import reclaim
from rebalancer.commands.reclaim import ReclaimEvent, Stage
from rebalancer.core import model, nodestate
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.outcomes import ActionResult, Outcome
from rebalancer.runtime import wiring
from rebalancer.runtime.seams import NodeActuator
from sandbox.emulator import cluster
from sandbox.emulator.clock import ManualClock
from sandbox.emulator.resources import NODES
from sandbox.emulator.server import Request, serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support import emulated
from tests.support.factories import T0
from tests.support.processes import free_port

Obj = dict[str, Any]
SERVING = {"key": "workload", "value": "inference", "effect": "NoSchedule"}
LENT = tuple(f"inference-{i}" for i in range(2, 8))  # six nodes, lent
SPARE = cluster.Pool("spare", 2, "NVIDIA-L20", cluster.INFERENCE_TAINT)  # a second pool
POLL = 5.0  # seconds of emulator time between passes: few passes, same story
DEADLINE = timedelta(minutes=2)  # the default limits.reclaim_deadline


Journal = list[tuple[str, str]]  # ("serving" or "lent", node) per node write; ("sleep", seconds)


def journal_node_writes(journal: Journal) -> Callable[[Request], None]:
    """An emulator request observer: each node write the server took, as the taints it left."""

    def note(request: Request) -> None:
        if request.resource == "nodes" and emulated.taken(request):
            assert request.response is not None
            taints = (request.response.get("spec") or {}).get("taints") or []
            journal.append(("serving" if SERVING in taints else "lent", request.name))

    return note


@dataclass
class Sleeper:
    """The wave's ``sleep``: moves the emulator's clock, and says so in the journal."""

    clock: ManualClock
    journal: Journal
    slept: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.journal.append(("sleep", f"{seconds}"))
        self.clock.advance(seconds)


@dataclass
class Watched:
    """A ``NodeActuator`` around the real one that checks, at each node's first write, that the
    audit store already holds every intent of the wave."""

    inner: NodeActuator
    controller: wiring.Controller
    expected: int
    intents_seen: list[int] = field(default_factory=list)

    async def lend(self, node: str, decision: str) -> ActionResult:
        return await self.inner.lend(node, decision)

    async def reclaim(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        page = await self.controller.store.query(AuditQuery(kinds=(Kind.INTENT,), limit=1000))
        self.intents_seen.append(len(page.records))
        assert any(r.id == decision for r in page.records), "the intent is stored first"
        return await self.inner.reclaim(node, decision, deadline, uid=uid)

    async def notice(
        self, node: str, decision: str, deadline: datetime, *, uid: str | None = None
    ) -> ActionResult:
        raise AssertionError("an operator's reclaim gives no notice")

    async def withdraw(self, node: str, decision: str) -> ActionResult:
        raise AssertionError("an operator's reclaim withdraws no notice")

    async def progress(
        self,
        node: str,
        decision: str | None = None,
        *,
        uid: str | None = None,
        deadline: datetime | None = None,
    ) -> ActionResult:
        return await self.inner.progress(node, uid=uid, deadline=deadline)

    async def remove_earlier(self, node: str, decision: str, deadline: datetime) -> ActionResult:
        return await self.inner.remove_earlier(node, decision, deadline)


class RefusingStore(MemoryAuditStore):
    """An audit store that takes nothing (a full disk, a database that went away)."""

    async def append(self, batch: Sequence[AuditRecord]) -> None:
        raise OSError("disk full")


@dataclass
class Box:
    store: Store
    clock: ManualClock
    journal: Journal
    controller: wiring.Controller
    sleeper: Sleeper
    events: list[ReclaimEvent] = field(default_factory=list)

    async def wave(self, nodes: list[str], **options: Any) -> list[reclaim.Reclaimed]:
        return await reclaim.reclaim_wave(
            self.controller,
            nodes,
            poll=POLL,
            sleep=self.sleeper,
            on_event=self.events.append,
            **options,
        )

    def taints(self, node: str) -> list[Obj]:
        return list(self.store.get(NODES, None, node)["spec"].get("taints") or [])

    async def records(self) -> list[AuditRecord]:
        return list((await self.controller.store.query(AuditQuery(limit=1000))).records)


def config_text(audit_db: Path) -> str:
    return f"""
leader_election: {{enabled: false}}
prometheus: {{url: "http://127.0.0.1:{free_port()}"}}
audit: {{url: "sqlite+aiosqlite:///{audit_db}"}}
pools:
  - name: inference
    node_selector: {{gpu-pool: inference}}
    inference_selector: {{app: llm-serving}}
    rps_per_node: 100
  - name: spare
    node_selector: {{gpu-pool: spare}}
    inference_selector: {{app: llm-serving}}
    rps_per_node: 100
"""


@contextlib.asynccontextmanager
async def lent(
    tmp_path: Path, nodes: tuple[str, ...] = LENT, pods: int = 2, grace: int = 60
) -> AsyncIterator[Box]:
    """The default inference pool plus two ``spare`` nodes; ``nodes`` lent, each running
    ``pods`` training pods that take ``grace`` seconds to terminate once evicted."""
    clock = ManualClock(T0)
    store = Store(clock, seed=1)
    cluster.seed(store, (cluster.INFERENCE, SPARE))
    journal: Journal = []
    async with serve(store, on_request=journal_node_writes(journal)) as url:
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig")
        path = tmp_path / "config.yaml"
        path.write_text(config_text(tmp_path / "audit.sqlite3"), encoding="utf-8")
        config = settings_mod.load(path, env={})
        seams = wiring.Seams(kubeconfig=kubeconfig, clock=clock, name="operator", sink=None)
        async with wiring.Controller.open(config, seams, wiring.Role.OPERATOR) as controller:
            actuators = controller.reconciler.actuators
            for node in nodes:
                pool = "spare" if node.startswith("spare") else "inference"
                done = await actuators[model.PoolName(pool)].lend(node, "test-lend")
                assert done.outcome is Outcome.APPLIED, done.message
                for index in range(pods):
                    pod = cluster.training_pod(f"job-{node}", index, gpus=1, priority_class=None)
                    pod["spec"]["nodeName"] = node
                    pod["spec"]["terminationGracePeriodSeconds"] = grace
                    cluster.add(store, pod)
            journal.clear()
            yield Box(store, clock, journal, controller, Sleeper(clock, journal))


def back_at(done: list[reclaim.Reclaimed]) -> list[float]:
    return [d.back.total_seconds() for d in done if d.back is not None]


# ---------------------------------------------------------------------------------------------


async def test_every_node_gets_its_serving_taints_back_before_any_node_is_waited_on(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path) as box:
        done = await box.wave(list(LENT))
        assert all(d.ok for d in done), [d.message for d in done]
        journal = box.journal
        first_sleep = journal.index(("sleep", f"{POLL}"))
        restored = [i for i, (what, _node) in enumerate(journal) if what == "serving"]
        # Each node: its serving taints back (begin reclaim), later its finish, also serving.
        assert sorted({journal[i][1] for i in restored if i < first_sleep}) == list(LENT)
        assert all(journal[i][0] != "lent" for i in range(len(journal)))  # no write re-lends
        # And at that moment no node was back: each still had its pods terminating.
        assert all(d.tainted == timedelta(0) for d in done)
        assert all(d.back is not None and d.back > timedelta(0) for d in done)
        stages = [e.stage for e in box.events]
        assert stages.index(Stage.BACK) > max(
            i for i, s in enumerate(stages) if s is Stage.SERVING_TAINTED
        )
        for node in LENT:
            assert SERVING in box.taints(node)


async def test_the_drains_run_together_six_minute_long_drains_take_a_minute_not_six(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path, grace=60) as box:
        done = await box.wave(list(LENT))
        assert [d.ok for d in done] == [True] * len(LENT)
        # Evicted at 0 s, gone at 60 s: every node is back on the first pass after that.
        assert all(60.0 <= t <= 60.0 + POLL for t in back_at(done)), back_at(done)
        assert sum(box.sleeper.slept) <= 60.0 + POLL  # one node after another: 360 s
        assert all(d.evicted == 2 and d.deleted == 0 for d in done)


async def test_every_deadline_is_counted_from_the_same_start(tmp_path: Path) -> None:
    # Pods that would take ten minutes: every node is back when the one deadline passes.
    async with lent(tmp_path, grace=600) as box:
        done = await box.wave(list(LENT))
        assert all(d.ok for d in done)
        limit = DEADLINE.total_seconds()
        assert all(limit <= t <= limit + POLL for t in back_at(done)), back_at(done)
        assert all(d.evicted == 2 and d.deleted == 2 for d in done)
        # One deadline, written on every node by its begin-reclaim write.
        records = await box.records()
        written = [
            w["body"]["metadata"]["annotations"]["rebalancer.io/reclaim-deadline"]
            for r in records
            if r.kind is Kind.OUTCOME
            for w in (r.detail or {}).get("writes", [])
            if w["kind"] == "begin_reclaim"
        ]
        assert len(written) == len(LENT)
        assert set(written) == {nodestate.format_time(T0 + DEADLINE)}, written


async def test_every_node_has_one_intent_stored_before_its_first_write_and_its_outcomes(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path) as box:
        reconciler = box.controller.reconciler
        watched = {
            name: Watched(a, box.controller, len(LENT)) for name, a in reconciler.actuators.items()
        }
        reconciler.actuators = watched
        done = await box.wave(list(LENT))
        assert all(d.ok for d in done)
        # All of them in one batch, before the first node's first write.
        assert watched[next(iter(watched))].intents_seen[0] == len(LENT)
        records = await box.records()
        intents = [r for r in records if r.kind is Kind.INTENT and r.action == "reclaim"]
        assert sorted(str(r.node) for r in intents) == sorted(LENT)
        assert len({r.time for r in intents}) == 1
        assert all(r.origin == "operator" and r.reason == "operator_reclaim_now" for r in intents)
        for intent in intents:
            outcomes = [r for r in records if r.kind is Kind.OUTCOME and r.intent_id == intent.id]
            calls = [((r.detail or {})["call"], r.outcome) for r in outcomes]
            # The first call (taints back, pods evicted), then the pass that finished: the
            # passes in between wrote nothing and left no row.
            assert calls == [("reclaim", "in_progress"), ("progress", "applied")], calls
            assert all(r.time >= intent.time for r in outcomes)


async def test_a_garbled_since_does_not_keep_a_node_lent_and_a_missing_node_is_reported(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path) as box:
        garbled = LENT[2]
        box.store.patch(
            NODES,
            None,
            garbled,
            "application/merge-patch+json",
            json.dumps(
                {"metadata": {"annotations": {"rebalancer.io/since": "yesterday"}}}
            ).encode(),
        )
        done = await box.wave([*LENT, "no-such-node"])
        by_node = {d.node: d for d in done}
        assert [d.node for d in done] == [*LENT, "no-such-node"]
        # Its original can be read: it comes back from it like the others.
        assert by_node[garbled].ok
        assert not by_node["no-such-node"].ok
        assert by_node["no-such-node"].message.startswith("cannot read the node")
        assert all(by_node[n].ok for n in LENT)
        failed = {e.node for e in box.events if e.stage is Stage.FAILED}
        assert failed == {"no-such-node"}
        lines = reclaim_command.reclaim_summary(done)
        assert lines[0].startswith("7 nodes: 6 back, 1 not back; last serving taint 0.0s")
        assert lines[-1] == "exit 1: 1 node(s) not back"


async def test_a_pool_takes_back_only_its_own_lent_nodes(tmp_path: Path) -> None:
    async with lent(tmp_path, nodes=(*LENT[:2], "spare-0", "spare-1"), pods=1) as box:
        spare = await reclaim.lent_nodes(box.controller, ["spare"])
        assert list(spare) == ["spare-0", "spare-1"]
        everything = await reclaim.lent_nodes(box.controller)
        assert list(everything) == sorted([*LENT[:2], "spare-0", "spare-1"])
        done = await box.wave(list(spare), known=spare)
        assert [(d.node, d.pool, d.ok) for d in done] == [
            ("spare-0", "spare", True),
            ("spare-1", "spare", True),
        ]
        assert list(await reclaim.lent_nodes(box.controller)) == list(LENT[:2])


async def test_an_intent_batch_the_store_refuses_with_nowhere_else_to_record_it_touches_nothing(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path, pods=0) as box:
        box.controller.reconciler.audit_log = AuditLog(RefusingStore(), sink=None)
        box.controller.reconciler.ledger = None
        with pytest.raises(reclaim.IntentsNotRecorded, match="no node was touched"):
            await box.wave(list(LENT))
        assert box.journal == []


async def test_a_store_that_refuses_the_intents_still_takes_every_node_back_recorded_on_it(
    tmp_path: Path,
) -> None:
    async with lent(tmp_path, pods=1) as box:
        lines: list[str] = []
        refused = AuditLog(RefusingStore(), sink=lines.append)
        box.controller.reconciler.audit_log = refused
        done = await box.wave(list(LENT))
        assert all(d.ok for d in done), [d.message for d in done]
        key = ledger.annotation(box.controller.keys)
        for d in done:
            node = box.store.get(NODES, None, d.node)
            notes = node["metadata"]["annotations"]
            kept = json.loads(notes[key])
            assert d.intent is not None
            # The intent first, then its outcomes, as made; the node's decision names it.
            assert [r["kind"] for r in kept] == ["intent"] + ["outcome"] * (len(kept) - 1)
            assert kept[0]["id"] == notes[box.controller.keys.decision] == d.intent.id
            assert {r["intent_id"] for r in kept[1:]} == {d.intent.id}
            assert kept[-1]["outcome"] == "applied"
            [said] = d.audit_errors
            assert said.startswith("the audit store fails (OSError: disk full): ")
            assert f"record(s) of intent {d.intent.id} are kept on the node" in said
            assert f"(annotation {key})" in said
        printed = {json.loads(line)["id"] for line in lines}
        assert {d.intent.id for d in done if d.intent is not None} <= printed
