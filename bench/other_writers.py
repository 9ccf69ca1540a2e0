"""Other writers on the controller's nodes: each case replayed on the controller PROCESS, as an
operator of a real cluster would see it, with the real ``kubectl``.

What it runs: the process tests' harness (``tests/support/harness.py``: the API emulator with one
pool of 8 ``gpu-pool=inference`` nodes, two of them running an inference replica, preemptible
training pods waiting, a fake vLLM exporter and a real Prometheus scraping it every second) and
``rebalancer run`` against it with the ``reactive`` strategy and 1 s ticks. Each case starts from a
fresh cluster, lets the controller lend, then plays another writer with ``kubectl`` (a GPU health
checker's taint, the node lifecycle's ``NoExecute``, a cordon, a lost state label, a removed lent
taint and a pod that does not tolerate it, garbled annotations, a relabel out of every pool, a lent
node deleted and registered again at once, 2, 6 and 60 s later and with a restart between, two
pools selecting one node, a finalizer nobody removes, a sync removing the audit records kept on
nodes while the store's disk is full, then a ``kill -9``, an original forged on a serving node)
and, where the case needs it, brings demand back. It prints the node before and after (state label,
taints, the controller's annotations), the Events on it and the audit rows that name it, and checks
what the controller promises (docs/design/other-writers.md): every check is printed as ``ok`` or
``FAILED`` with what was seen, and the exit status is 1 when one failed.

The clock cases run the controller under Debian's ``faketime`` (libfaketime), 90 s behind and
10 minutes ahead of the cluster and Prometheus, and are left out when it is not installed.

    .venv/bin/python bench/other_writers.py                 # every case, about 5 minutes
    .venv/bin/python bench/other_writers.py foreign-taints orphan --json out/other-writers.json

Needs the ``kubectl`` that ``tests/kube/build.sh`` builds, and Debian's ``prometheus``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rebalancer.core.audit import AuditRecord
from tests.support import processes
from tests.support.harness import IDLE, INFERENCE, LOW, PEAK, Controller, Harness, harness
from tests.support.kubectl import Kubectl, binary

PREFIX = "rebalancer.io/"
STATE, ORIGINAL, SINCE = PREFIX + "state", PREFIX + "original", PREFIX + "since"
LENT_TAINT = PREFIX + "lent"
SERVING_TAINT = "workload=inference:NoSchedule"
TICK = "1s"
BEHIND = ("faketime", "-f", "-90")  # libfaketime: the controller's clock 90 s behind
AHEAD = ("faketime", "-f", "+600")

Doc = dict[str, Any]


@dataclass
class Case:
    """What one case saw and what it checked."""

    name: str
    title: str
    checks: list[tuple[bool, str]] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> None:
        self.checks.append((bool(ok), what))

    def show(self, line: str) -> None:
        self.shown.append(line)

    @property
    def passed(self) -> bool:
        return all(ok for ok, _ in self.checks)


@dataclass
class World:
    """A case's cluster, its kubectl and the controller under test."""

    h: Harness
    kubectl: Kubectl
    case: Case
    c: Controller | None = None

    async def k(self, *args: str) -> str:
        return await self.kubectl.run(*args)

    async def node(self, name: str) -> Doc:
        doc: Doc = json.loads(await self.k("get", "node", name, "-o", "json"))
        return doc

    async def show_node(self, name: str, when: str) -> Doc:
        doc = await self.node(name)
        self.case.show(f"{when:>7} {name}: {describe(doc)}")
        return doc

    async def start(
        self, strategy: str = "reactive", wrapper: Sequence[str] = (), **settings: Any
    ) -> Controller:
        config = self.h.config(strategy=strategy, tick_interval=TICK, **settings)
        self.c = await spawn(self.h, config, wrapper)
        return self.c

    async def stop(self) -> str:
        """SIGTERM, and the controller's log."""
        assert self.c is not None
        c, self.c = self.c, None
        c.proc.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                await c.proc.wait()
        await Harness.kill(c)
        return c.log.read_text(errors="replace")

    async def lent(self) -> set[str]:
        return await self.h.lent()

    async def wait(self, what: str, done: Callable[[], Awaitable[bool]], within: float) -> bool:
        """Whether ``done`` came true within ``within`` seconds (polled every 0.25 s)."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            if await done():
                return True
            if self.c is not None and self.c.proc.returncode is not None:
                self.case.show(f"the controller exited {self.c.proc.returncode} waiting for {what}")
                return False
            await asyncio.sleep(0.25)
        return False

    async def wait_lent(self, nodes: set[str], within: float = 30) -> bool:
        async def done() -> bool:
            return await self.lent() >= nodes

        return await self.wait(f"lending {sorted(nodes)}", done, within)

    async def back(self, names: Sequence[str], within: float = 40) -> float | None:
        """Seconds until every named node serves (no state label, no lent taint), or None."""
        started = time.monotonic()

        async def done() -> bool:
            docs = [await self.node(n) for n in names]
            return all(
                not labels_of(d).get(STATE) and LENT_TAINT not in taint_keys(d) for d in docs
            )

        if await self.wait("every node serving", done, within):
            return round(time.monotonic() - started, 1)
        return None

    async def events(self, name: str) -> list[str]:
        """The Events about node ``name``, as ``type reason: note``, oldest first."""
        listed = json.loads(await self.k("get", "events", "-A", "-o", "json"))
        found = []
        for e in listed.get("items", []):
            about = (e.get("involvedObject") or e.get("regarding") or {}).get("name")
            if about == name:
                note = e.get("message") or e.get("note") or ""
                found.append((e.get("eventTime") or e.get("firstTimestamp") or "", e, note))
        found.sort(key=lambda item: str(item[0]))
        return [f"{e.get('type')} {e.get('reason')}: {note}" for _, e, note in found]

    async def records(self, node: str | None = None, after: float = 0.0) -> list[AuditRecord]:
        rows = await self.h.records()
        return [
            r
            for r in rows
            if (node is None or r.node == node) and r.time.timestamp() >= after - 0.5
        ]


# ---------------------------------------------------------------------------------------------
# Reading a node


def labels_of(doc: Doc) -> dict[str, str]:
    return dict((doc.get("metadata") or {}).get("labels") or {})


def annotations_of(doc: Doc) -> dict[str, str]:
    return dict((doc.get("metadata") or {}).get("annotations") or {})


def taints_of(doc: Doc) -> list[str]:
    out = []
    for t in (doc.get("spec") or {}).get("taints") or []:
        value = f"={t['value']}" if t.get("value") else ""
        out.append(f"{t['key']}{value}:{t['effect']}")
    return out


def taint_keys(doc: Doc) -> set[str]:
    return {t["key"] for t in (doc.get("spec") or {}).get("taints") or []}


def describe(doc: Doc) -> str:
    state = labels_of(doc).get(STATE) or "serving (no label)"
    ours = {
        k.removeprefix(PREFIX): (v if len(v) <= 40 else v[:37] + "...")
        for k, v in annotations_of(doc).items()
        if k.startswith(PREFIX) and k != ORIGINAL
    }
    original = "original recorded" if ORIGINAL in annotations_of(doc) else "no original"
    cordon = ", cordoned" if (doc.get("spec") or {}).get("unschedulable") else ""
    return f"{state}{cordon}; taints {taints_of(doc)}; {original}; {ours}"


def rows(records: Sequence[AuditRecord]) -> list[str]:
    out = []
    for r in records:
        what = r.outcome or r.action or ""
        out.append(f"{r.kind.value} {what} {r.reason or ''}: {(r.message or '')[:110]}")
    return out


async def spawn(h: Harness, config: Path, wrapper: Sequence[str]) -> Controller:
    """``rebalancer run`` as the process tests start it, under ``wrapper`` (faketime) if
    given; a controller that does not start is this case's failure."""
    try:
        return await h.spawn(config, wrapper)
    except Exception as exc:
        raise RuntimeError(f"the controller did not start: {exc}") from None


async def cli(h: Harness, config: Path, *args: str) -> tuple[int, str]:
    code, out, err = await processes.run_cli(
        *args, "--config", str(config), "--kubeconfig", str(h.kubeconfig), within=60
    )
    return code, (out + err).strip()


# ---------------------------------------------------------------------------------------------
# The cases


async def foreign_taints(w: World) -> None:
    """1. A reclaim keeps the taints other writers added to lent nodes, and a cordon."""
    await w.start()
    ok = await w.wait_lent(set(IDLE))
    w.case.check(ok, f"the 6 idle nodes are lent (lent: {sorted(await w.lent())})")
    await w.k("taint", "nodes", "inference-2", "nvidia.com/gpu.unhealthy=true:NoSchedule")
    await w.k("taint", "nodes", "inference-3", "node.kubernetes.io/unreachable:NoExecute")
    await w.k("cordon", "inference-4")
    await asyncio.sleep(2)  # the node controller's unschedulable taint follows the cordon
    for n in ("inference-2", "inference-3", "inference-4"):
        await w.show_node(n, "lent")
    w.h.exporter.set_load(PEAK, 0)
    took = await w.back(IDLE)
    w.case.check(took is not None, f"every lent node serves again ({took} s after the rise)")
    after = {
        n: await w.show_node(n, "after") for n in ("inference-2", "inference-3", "inference-4")
    }
    w.case.check(
        "nvidia.com/gpu.unhealthy=true:NoSchedule" in taints_of(after["inference-2"]),
        f"the GPU health checker's taint is kept on inference-2: {taints_of(after['inference-2'])}",
    )
    w.case.check(
        "node.kubernetes.io/unreachable:NoExecute" in taints_of(after["inference-3"]),
        f"the node lifecycle's NoExecute is kept on inference-3: {taints_of(after['inference-3'])}",
    )
    four = after["inference-4"]
    w.case.check(
        (four.get("spec") or {}).get("unschedulable") is True
        and "node.kubernetes.io/unschedulable:NoSchedule" in taints_of(four),
        f"the cordon stays on inference-4: {taints_of(four)}",
    )
    for n, doc in after.items():
        w.case.check(SERVING_TAINT in taints_of(doc), f"{n} has its serving taint back")
    restored = [e for e in await w.events("inference-2") if "Restored" in e]
    w.case.show(f"Events on inference-2: {restored}")
    w.case.check(
        any("nvidia.com/gpu.unhealthy" in e for e in restored),
        "the Restored Event names the foreign taint kept",
    )


async def lost_state_label(w: World) -> None:
    """2. A lent node whose state label was removed is not read as serving, is not lent again
    over its original, and comes back exactly."""
    start = await w.node("inference-2")
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    lent = await w.show_node("inference-2", "lent")
    original = annotations_of(lent).get(ORIGINAL)
    meddled = time.time()
    await w.k("label", "node", "inference-2", f"{STATE}-")
    await asyncio.sleep(6)  # six ticks at low demand: a serving node here would be lent
    seen = await w.show_node("inference-2", "6s on")
    w.case.check(
        annotations_of(seen).get(ORIGINAL) in (original, None),
        "the original recorded by the lend is not overwritten",
    )
    since = [
        r
        for r in await w.records("inference-2", meddled)
        if r.kind.value == "intent" and r.time.timestamp() > meddled
    ]
    first = since[0].action if since else None
    w.case.check(
        first == "reclaim",
        f"the first intent for inference-2 after the label went is a reclaim, not a lend "
        f"over its original ({[(r.action, r.reason) for r in since][:3]})",
    )
    w.h.exporter.set_load(PEAK, 0)
    took = await w.back(IDLE)
    w.case.check(took is not None, f"every node serves again ({took} s)")
    after = await w.show_node("inference-2", "after")
    w.case.check(
        taints_of(after) == taints_of(start),
        f"inference-2's taints are its originals: {taints_of(after)} (before: {taints_of(start)})",
    )
    w.case.show(f"audit rows: {rows(await w.records('inference-2', meddled))}")


async def lent_taint_removed(w: World) -> None:
    """3. A lent node that lost its lent taint and took a pod that does not tolerate it is
    noticed, taken back, and the pod evicted."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    meddled = time.time()
    await w.k("taint", "nodes", "inference-2", f"{LENT_TAINT}:NoSchedule-")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "namespace": "default"},
        "spec": {
            "nodeName": "inference-2",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
    path = w.h.tmp / "intruder.json"
    path.write_text(json.dumps(pod))
    await w.k("create", "-f", str(path))
    await w.show_node("inference-2", "meddled")

    async def gone() -> bool:
        listed = json.loads(await w.k("get", "pods", "-n", "default", "-o", "json"))
        return not any(p["metadata"]["name"] == "intruder" for p in listed["items"])

    evicted = await w.wait("the intruder evicted", gone, 30)
    w.case.check(evicted, "the pod that does not tolerate the lent taint is evicted")
    after = await w.show_node("inference-2", "after")
    w.case.check(
        LENT_TAINT in taint_keys(after) or SERVING_TAINT in taints_of(after),
        f"inference-2 is either lent again with its lent taint or serving: {taints_of(after)}",
    )
    events = await w.events("inference-2")
    w.case.show(f"Events on inference-2: {events}")
    w.case.check(
        any(e.startswith("Warning") and "OverrideRefused" not in e for e in events),
        "a Warning Event with a reason of its own says what drifted",
    )
    w.case.show(f"audit rows: {rows(await w.records('inference-2', meddled))}")


async def unreadable_original(w: World) -> None:
    """4. Nodes whose original, or since, cannot be read are counted away, are taken back from
    the pool's own specification, and ``rebalancer reclaim --node`` works on them."""
    config = w.h.config(strategy="reactive", tick_interval=TICK, limits={"max_lent_fraction": 0.5})
    w.c = await spawn(w.h, config, ())
    ok = await w.wait("four nodes lent", lambda: _count(w, 4), 30)
    lent = sorted(await w.lent())
    w.case.check(ok, f"4 of 8 lent under a 50 % cap: {lent}")
    a, b, c = lent[0], lent[1], lent[2]
    await w.k("annotate", "node", a, f"{ORIGINAL}=garbage", "--overwrite")
    await w.k("annotate", "node", b, f"{ORIGINAL}-")
    await w.k("annotate", "node", c, f"{SINCE}=yesterday", "--overwrite")
    for n in (a, b, c):
        await w.show_node(n, "garbled")
    peak = 0
    for _ in range(12):  # twelve ticks at low demand: more would be lent if these read serving
        await asyncio.sleep(0.5)
        peak = max(peak, await _away(w))
    w.case.check(peak <= 4, f"at most 4 of 8 away while three read unreadable (seen {peak})")
    events = await w.events(a)
    w.case.show(f"Events on {a}: {events}")
    w.case.check(
        any("OverrideRefused" not in e and e.startswith("Warning") for e in events),
        "the unreadable original has a Warning Event of its own kind",
    )
    await w.stop()
    code, out = await cli(w.h, config, "reclaim", "--node", a, "--node", c)
    w.case.show(f"rebalancer reclaim --node {a} --node {c}: exit {code}: {out[-400:]}")
    w.case.check(code == 0, "rebalancer reclaim --node works on an unreadable node")
    w.c = await spawn(w.h, config, ())
    w.h.exporter.set_load(PEAK, 0)
    took = await w.back(list(INFERENCE))
    w.case.check(took is not None, f"every node serves again under peak demand ({took} s)")
    for n in (a, b, c):
        after = await w.show_node(n, "after")
        w.case.check(
            SERVING_TAINT in taints_of(after) and LENT_TAINT not in taint_keys(after),
            f"{n} serves with the pool's serving taint: {taints_of(after)}",
        )


async def orphan(w: World) -> None:
    """5. A node relabelled out of every pool while lent is still taken back, and ``reclaim
    --all`` covers it."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    meddled = time.time()
    await w.k("label", "node", "inference-2", "gpu-pool=shared", "--overwrite")
    await w.show_node("inference-2", "relabel")
    took = await w.back(["inference-2"], within=20)
    w.case.check(took is not None, f"the orphan is taken back at low demand ({took} s)")
    await w.show_node("inference-2", "after")
    w.case.show(f"audit rows: {rows(await w.records('inference-2', meddled))}")
    config = w.h.config(strategy="reactive", tick_interval=TICK)
    await w.stop()
    await w.k("label", "node", "inference-3", "gpu-pool=shared", "--overwrite")
    code, out = await cli(w.h, config, "explain", "inference-3")
    w.case.show(f"rebalancer explain inference-3: exit {code}: {out.splitlines()[:1]}")
    w.case.check(code == 0, "explain works on a lent node no pool selects")
    code, out = await cli(w.h, config, "reclaim", "--all")
    w.case.show(f"rebalancer reclaim --all: exit {code}: {out[-400:]}")
    w.case.check(code == 0, "reclaim --all exits 0 with an orphan lent")
    three = await w.show_node("inference-3", "after")
    w.case.check(
        not labels_of(three).get(STATE) and LENT_TAINT not in taint_keys(three),
        "reclaim --all took the orphan back",
    )


def recreated(delay: float = 0.0, restart: bool = False) -> Callable[[World], Awaitable[None]]:
    """6. A lent node deleted and registered again under its name ``delay`` seconds later (as a
    kubelet does after a reboot), the controller restarted in between when ``restart``: the
    training pod bound to the old one is removed, and the loan's audit rows say so."""

    async def case(w: World) -> None:
        fresh = await w.node("inference-2")
        await w.start()
        w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")

        async def has_training() -> bool:
            return bool(await _pods_on(w, "inference-2"))

        await w.wait("a training pod on inference-2", has_training, 20)
        old = await _pods_on(w, "inference-2")
        w.case.show(f"pods bound to inference-2 before: {old}")
        meddled = time.time()
        await w.k("delete", "node", "inference-2", "--wait=false")
        if restart:
            await w.stop()
        await asyncio.sleep(delay)  # the node is away: a real wait, as for a reboot
        meta = fresh["metadata"]
        for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
            meta.pop(key, None)
        fresh.pop("status", None)
        path = w.h.tmp / "node.json"
        path.write_text(json.dumps(fresh))
        await w.k("create", "-f", str(path))
        if restart:
            await w.start()
        await w.show_node("inference-2", "new")
        back = time.monotonic()

        async def old_gone() -> bool:
            return not set(old) & set(await _pods_on(w, "inference-2"))

        gone = await w.wait("the old incarnation's pods removed", old_gone, 60)
        w.case.figures["removed_after_seconds"] = round(time.monotonic() - back, 1)
        w.case.check(bool(old) and gone, f"the pods bound to the old node are removed ({old})")
        records = await w.records("inference-2", meddled)
        said = " ".join(r.message for r in records)
        w.case.check(
            any(f"pod(s) bound to an earlier node of this name: {p}" in said for p in old),
            "the audit log says which pod was removed",
        )
        w.case.show(f"audit rows: {rows(records)}")

    return case


async def forged_original(w: World) -> None:
    """10. Another writer (a node's kubelet may: labels and annotations are its to edit) marks a
    serving node that carries the GPU health taint as lent, with an original listing that taint
    as added by the lend and ``evil.example/x=1`` as removed by it: the controller neither strips
    the taint nor writes the label; it says so and makes the node serve from its pool's
    specification (docs/design/node-state-integrity.md)."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    node = "inference-0"  # runs an inference replica: serving, never lent
    await w.k("taint", "nodes", node, "nvidia.com/gpu.unhealthy=true:NoSchedule")
    before = await w.show_node(node, "sick")
    original = {
        "v": 2,
        "taints": [t for t in before["spec"]["taints"] if t["key"] != "nvidia.com/gpu.unhealthy"],
        "labels": {"evil.example/x": "1"},
        "added": [{"key": "nvidia.com/gpu.unhealthy", "value": "true", "effect": "NoSchedule"}],
        "removed": [],
    }
    meddled = time.time()
    await w.k("label", "node", node, f"{STATE}=lent", "--overwrite")
    await w.k("annotate", "node", node, f"{ORIGINAL}={json.dumps(original)}", "--overwrite")
    await w.show_node(node, "forged")

    async def reported() -> bool:
        return any(r.reason == "state_unverified" for r in await w.records(node, meddled))

    seen = await w.wait("the forged state reported", reported, 20)
    w.case.check(seen, "a finding state_unverified names the node")

    async def serving() -> bool:
        return not labels_of(await w.node(node)).get(STATE)

    await w.wait("the node serving again", serving, 20)
    after = await w.show_node(node, "after")
    w.case.check(
        "nvidia.com/gpu.unhealthy=true:NoSchedule" in taints_of(after),
        f"the GPU health taint is kept: {taints_of(after)}",
    )
    w.case.check(
        "evil.example/x" not in labels_of(after),
        "the label the forged original names is not written",
    )
    w.case.check(not labels_of(after).get(STATE), "the node serves (no state label)")
    events = await w.events(node)
    w.case.show(f"Events on {node}: {events}")
    w.case.check(
        any(e.startswith("Warning StateUnverified") for e in events),
        "a Warning Event StateUnverified says so",
    )
    w.case.show(f"audit rows: {rows(await w.records(node, meddled))}")


@contextlib.asynccontextmanager
async def disk_filled(w: World) -> AsyncIterator[tuple[str, Path, float] | None]:
    """The audit store on a 4 MiB tmpfs, the controller started on it with the idle nodes lent,
    then the disk filled and demand at its peak, every node back: the store's URL, the file
    that fills the disk, and when it filled. None when no tmpfs can be mounted (a failed
    check). The controller is stopped and the tmpfs unmounted when the block ends."""
    mount = w.h.tmp / "auditfs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        check=False,
        capture_output=True,
    )
    if made.returncode != 0:
        w.case.check(False, f"a small tmpfs cannot be mounted here: {made.stderr.decode()}")
        yield None
        return
    url = f"sqlite+aiosqlite:///{mount / 'audit.sqlite3'}"
    try:
        await w.start(audit={"url": url})
        w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
        filler = mount / "filler"
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], check=False, capture_output=True
        )
        full = time.time()
        w.h.exporter.set_load(PEAK, 0)
        took = await w.back(IDLE, within=40)
        w.case.check(took is not None, f"every node back {took} s after the rise, disk full")
        yield url, filler, full
    finally:
        if w.c is not None:
            await w.stop()
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)


async def disk_full(w: World) -> None:
    """7. The audit store's file system fills up with nodes lent, and demand then needs every
    node: the safety reclaims still happen, recorded on the Node and in Events, readiness says
    the store fails, and the records reach the store once it has room again."""
    async with disk_filled(w) as filled:
        if filled is None:
            return
        url, filler, full = filled
        assert w.c is not None
        async with w.h.session.get(w.c.health + "/readyz") as r:
            ready = f"{r.status} {(await r.text()).strip()[:160]}"
        w.case.show(f"/readyz with the disk full: {ready}")
        w.case.check("audit" in ready, "readiness names the failing audit store")
        failing = await w.h.metric(w.c, "rebalancer_audit_store_failing")
        w.case.check(failing == 1.0, f"rebalancer_audit_store_failing is {failing}")
        events = await w.events("inference-2")
        w.case.show(f"Events on inference-2: {events[-3:]}")
        w.case.check(
            any("AuditStoreFailing" in e for e in events), "an Event carries the unstored record"
        )
        filler.unlink()
        await asyncio.sleep(4)
        stored = await processes.read_audit(url)
        reclaims = [
            r
            for r in stored
            if r.kind.value == "intent" and r.action == "reclaim" and r.time.timestamp() >= full - 1
        ]
        w.case.figures["reclaim_intents_stored_after_the_disk_had_room"] = len(reclaims)
        w.case.check(
            sorted(str(r.node) for r in reclaims) == IDLE,
            f"the store holds a reclaim intent for each node once it has room ({len(reclaims)})",
        )


async def disk_full_records_removed(w: World) -> None:
    """7b. As 7, then a GitOps sync removes ``rebalancer.io/audit-pending`` from every node and
    the controller is killed (SIGKILL) before the disk has room: the next run, with room, writes
    every intent to the store, in order, from the controller's own Events, and closes each."""
    async with disk_filled(w) as filled:
        if filled is None:
            return
        url, filler, _ = filled
        kept: dict[str, str] = {}
        for name in IDLE:
            pending = annotations_of(await w.node(name)).get(PREFIX + "audit-pending") or "[]"
            kept.update({d["id"]: name for d in json.loads(pending) if d["kind"] == "intent"})
        w.case.show(f"intents kept on the nodes: {len(kept)}")
        for name in IDLE:
            await w.k("annotate", "node", name, PREFIX + "audit-pending-")
        assert w.c is not None
        await Harness.kill(w.c)  # kill -9, before the store took a record
        w.c = None
        filler.unlink()
        await w.start(audit={"url": url})

        async def closed() -> bool:
            written = await processes.read_audit(url)
            ends = {r.intent_id for r in written if r.intent_id}
            return all(i in ends for i in kept)

        await w.wait("every intent stored and closed", closed, 20)
        stored = await processes.read_audit(url)
        order = [r.id for r in stored]
        found = [i for i in order if i in kept]
        w.case.figures["intents_kept_on_the_nodes"] = len(kept)
        w.case.figures["intents_in_the_store_after_the_restart"] = len(found)
        w.case.show(f"audit rows of the intents: {rows([r for r in stored if r.id in kept])}")
        w.case.check(
            len(kept) == len(IDLE) and sorted(found) == sorted(kept),
            f"the store holds every intent acted on ({len(found)} of {len(kept)})",
        )
        w.case.check(found == sorted(found), "in the order they were made, ids kept")
        verdicts = sorted({str(r.outcome) for r in stored if r.intent_id in kept})
        w.case.check(bool(verdicts), f"each is closed by the restart's recovery ({verdicts})")


async def overlapping(w: World) -> None:
    """9a. Two pools selecting the same nodes: an audit finding and an Event, not a log line."""
    second = {
        "name": "inference-b",
        "node_selector": {"gpu-pool": "inference"},
        "inference_selector": {"app": "llm-serving"},
        "rps_per_node": 10,
        "strategy": {"name": "reactive"},
        "lend_only_to_takers": False,
    }
    config = w.h.config(strategy="reactive", tick_interval=TICK)
    doc = json.loads(config.read_text())
    doc["pools"].append(second)
    config.write_text(json.dumps(doc))
    w.c = await spawn(w.h, config, ())
    await asyncio.sleep(5)
    events = await w.events("inference-2")
    w.case.show(f"Events on inference-2: {events}")
    w.case.check(
        any(e.startswith("Warning") and "inference-b" in e for e in events),
        "a Warning Event names the second pool",
    )
    findings = [r for r in await w.records("inference-2") if r.kind.value == "finding"]
    w.case.show(f"findings on inference-2: {rows(findings)}")
    w.case.check(bool(findings), "an audit finding says two pools select the node")


async def finalizer(w: World) -> None:
    """9b. A borrowed pod held by a finalizer nobody removes: the record names the finalizer and
    is not written again every tick."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")

    async def has_training() -> bool:
        return bool(await _pods_on(w, "inference-2"))

    await w.wait("a training pod on inference-2", has_training, 20)
    pod = (await _pods_on(w, "inference-2"))[0]
    ns, name = pod.split("/")
    patch = json.dumps({"metadata": {"finalizers": ["example.com/checkpoint-upload"]}})
    await w.k("patch", "pod", "-n", ns, name, "--type=merge", "-p", patch)
    rose = time.time()
    w.h.exporter.set_load(PEAK, 0)
    await asyncio.sleep(15)  # the 5 s deadline passes, and ten ticks more
    records = [r for r in await w.records("inference-2", rose) if r.kind.value == "outcome"]
    stuck = [r for r in records if r.outcome == "in_progress"]
    w.case.figures["in_progress_records_in_15s"] = len(stuck)
    w.case.show(f"outcomes for inference-2 in 15 s: {rows(records)[-4:]}")
    w.case.check(
        any("example.com/checkpoint-upload" in (r.message or "") for r in stuck),
        "an in_progress record names the finalizer",
    )
    w.case.check(len(stuck) <= 3, f"not a record every tick ({len(stuck)} in 15 ticks)")
    events = await w.events("inference-2")
    w.case.show(f"Events on inference-2: {events[-3:]}")
    await w.k(
        "patch", "pod", "-n", ns, name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
    )


async def clock_behind(w: World) -> None:
    """8a. A rise in demand taken back by a controller on time, then the same by a controller
    whose clock is 90 s behind Prometheus and the cluster: the lent nodes come back as quickly."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    w.h.exporter.set_load(PEAK, 0)
    on_time = await w.back(IDLE, within=60)
    w.h.exporter.set_load(LOW, 0)
    w.case.check(await w.wait_lent(set(IDLE)), "lent again once demand is low")
    await w.stop()
    switched = time.time()
    await w.start(wrapper=BEHIND)
    await asyncio.sleep(4)
    w.h.exporter.set_load(PEAK, 0)
    behind = await w.back(IDLE, within=120)
    w.case.figures["seconds_to_every_node_back"] = {"on time": on_time, "90 s behind": behind}
    w.case.check(
        on_time is not None and behind is not None and behind <= on_time + 3,
        f"every node back {behind} s after the rise, against {on_time} s on time",
    )
    _named_clock(w, await w.records(after=switched), -90)


async def clock_ahead(w: World) -> None:
    """8b. Loans made by a controller on time, then one whose clock is 10 minutes ahead: it
    names the clock, blames no metrics outage on Prometheus, writes no ``since`` in the
    cluster's future, and a controller on time lends the nodes again after its cooldown."""
    await w.start()
    w.case.check(await w.wait_lent(set(IDLE)), "the 6 idle nodes are lent")
    await w.stop()
    switched = time.time()
    await w.start(wrapper=AHEAD)
    await asyncio.sleep(6)
    records = await w.records(after=switched - 1)
    lost = [r for r in records if r.reason == "metrics_lost"]
    w.case.check(not lost, f"no metrics_lost blamed on Prometheus ({len(lost)} records)")
    w.h.exporter.set_load(PEAK, 0)
    took = await w.back(IDLE, within=60)
    _named_clock(w, await w.records(after=switched), 600)
    w.case.check(took is not None, f"demand at peak takes every node back ({took} s)")
    future = []
    for n in INFERENCE:
        since = annotations_of(await w.node(n)).get(SINCE)
        if since and datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp() > (
            time.time() + 2
        ):
            future.append((n, since))
    w.case.check(not future, f"no since in the future of the cluster ({future})")
    await w.stop()
    w.h.exporter.set_load(LOW, 0)
    await w.start()
    again = await w.wait_lent(set(IDLE), within=30)
    w.case.check(again, "a controller on time lends the nodes again within 30 s")


def _named_clock(w: World, records: Sequence[AuditRecord], offset: float) -> None:
    """Whether the reclaims' audit records name the API server's clock, off by ``offset``
    seconds from the controller's (2 s allowed), and say it is past the bound."""
    reclaims = [r for r in records if r.kind.value == "intent" and r.action == "reclaim"]
    seen = [
        ((r.inputs or {}).get("clocks") or {}).get("skew", {}).get("apiserver", {})
        for r in reclaims
    ]
    offsets = [s.get("offset_seconds") for s in seen if s]
    problems = [
        p for r in reclaims for p in ((r.inputs or {}).get("clocks") or {}).get("problems", [])
    ]
    w.case.figures["apiserver_offset_in_the_reclaims_records"] = sorted(set(offsets))[:3]
    w.case.show(f"clock problems named in the reclaims' records: {sorted(set(problems))[:1]}")
    w.case.check(
        bool(offsets) and all(o is not None and abs(-o - offset) <= 2 for o in offsets),
        f"each reclaim's audit record names the API server's clock off by {offset} s "
        f"({sorted(set(offsets))[:3]})",
    )


CASES: dict[str, tuple[str, Callable[[World], Awaitable[None]], Sequence[str]]] = {
    "foreign-taints": ("1. foreign taints and a cordon survive a reclaim", foreign_taints, ()),
    "lost-state-label": ("2. a lost state label", lost_state_label, ()),
    "lent-taint-removed": ("3. a removed lent taint and a pod that landed", lent_taint_removed, ()),
    "unreadable": ("4. unreadable originals", unreadable_original, ()),
    "orphan": ("5. a lent node no pool selects", orphan, ()),
    "recreated": ("6. a node re-created under its name", recreated(), ()),
    "recreated-2s": ("6b. ... 2 s after its deletion", recreated(2), ()),
    "recreated-6s": ("6c. ... 6 s after its deletion", recreated(6), ()),
    "recreated-60s": ("6d. ... 60 s after its deletion", recreated(60), ()),
    "recreated-restart": (
        "6e. ... 6 s later, the controller restarted between",
        recreated(6, True),
        (),
    ),
    "disk-full": ("7. the audit store's disk fills up", disk_full, ("mount",)),
    "disk-full-records-removed": (
        "7b. disk full, the nodes' pending records removed, kill -9",
        disk_full_records_removed,
        ("mount",),
    ),
    "clock-behind": ("8a. controller clock 90 s behind", clock_behind, ("faketime",)),
    "clock-ahead": ("8b. controller clock 10 min ahead", clock_ahead, ("faketime",)),
    "overlapping": ("9a. two pools select one node", overlapping, ()),
    "finalizer": ("9b. a finalizer nobody removes", finalizer, ()),
    "forged-original": ("10. a forged original on a serving node", forged_original, ()),
}


async def _count(w: World, n: int) -> bool:
    return len(await w.lent()) >= n


async def _away(w: World) -> int:
    """Nodes that do not serve: a state label, a lent taint or an original of ours."""
    listed = json.loads(await w.k("get", "nodes", "-o", "json"))
    return sum(
        1
        for d in listed["items"]
        if d["metadata"]["name"] in INFERENCE
        and bool(
            labels_of(d).get(STATE) or LENT_TAINT in taint_keys(d) or ORIGINAL in annotations_of(d)
        )
    )


async def _pods_on(w: World, node: str) -> list[str]:
    listed = json.loads(await w.k("get", "pods", "-A", "-o", "json"))
    return sorted(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in listed["items"]
        if (p.get("spec") or {}).get("nodeName") == node
        and (p["metadata"].get("labels") or {}).get("workload") == "training"
    )


async def run(name: str, tmp: Path) -> Case:
    title, body, wrapper = CASES[name]
    case = Case(name, title)
    if wrapper and shutil.which(wrapper[0]) is None:
        case.check(False, f"{wrapper[0]} is not installed (Debian's package {wrapper[0]})")
        return case
    async with harness(tmp, rps=LOW) as h:
        kubectl = Kubectl(binary(), h.kubeconfig, tmp / "kubectl-cache")
        w = World(h, kubectl, case)
        started = time.monotonic()
        try:
            await body(w)
        except Exception as exc:  # a case that breaks is a failed case, the others still run
            case.check(False, f"the case raised {type(exc).__name__}: {exc}")
        finally:
            if w.c is not None:
                log = await w.stop()
                tracebacks = log.count("Traceback")
                case.figures["tracebacks_logged"] = tracebacks
                case.check(tracebacks == 0, f"no traceback in the controller's log ({tracebacks})")
        case.figures["seconds"] = round(time.monotonic() - started, 1)
    return case


def report(cases: Sequence[Case]) -> str:
    lines = []
    for case in cases:
        verdict = "held" if case.passed else "FAILED"
        lines.append(f"\n## {case.title}: {verdict} ({case.figures.get('seconds', '?')} s)")
        lines.extend(f"    {line}" for line in case.shown)
        lines.extend(f"  {'ok    ' if ok else 'FAILED'} {what}" for ok, what in case.checks)
    held = sum(c.passed for c in cases)
    lines.append(f"\n{held} of {len(cases)} cases held")
    return "\n".join(lines)


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "cases", nargs="*", metavar="CASE", help=f"of {', '.join(CASES)}; default: all"
    )
    parser.add_argument("--json", type=Path, help="write every case's checks and figures here")
    args = parser.parse_args(argv)
    names = args.cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"no case {', '.join(unknown)}: the cases are {', '.join(CASES)}")
    done = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"writers-{name}-") as tmp:
            case = await run(name, Path(tmp))
        print(report([case]).rsplit("\n\n", 1)[0])
        sys.stdout.flush()
        done.append(case)
    print(f"\n{sum(c.passed for c in done)} of {len(done)} cases held")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc: Mapping[str, Any] = {
            c.name: {"title": c.title, "checks": c.checks, "figures": c.figures, "shown": c.shown}
            for c in done
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if all(c.passed for c in done) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
