"""``core.takers`` held to the real kube-scheduler: on a few hundred generated clusters, a pending
pod fits somewhere by takers' rules exactly when kube-scheduler binds it, and the node it binds
it to is one takers accepts (the scheduler picks among the nodes that fit by score, so the very
node need not be takers' first).

The clusters (``tests/support/takers_gen.py``) share one control plane of this module's own
(``control_plane.running``: the scheduler, the controller-manager, KWOK playing the nodes'
kubelets), each case on nodes of its own that only its pods select: every node is created as it
serves, lent once KWOK has made it Ready (the actuator's patch: the serving taint swapped for
the lend taint, the lent labels set), its holding pods bound to it, and then every case's
pending pod is created at once, unbound. takers reads the very objects the server holds
(``convert.pending_pod`` on the pod as created: its requests defaulted from limits, its
RuntimeClass's overhead set by admission; each node's room as the planner builds it for a lend:
labels and taints once lent, which the test checks are the lent node's, and allocatable less
its pods' requests).

Cases ``c0000`` on are drawn (``SEED``, ``COUNT``); ``c9000`` on are written by hand, one rule
each (``takers_gen._EDGES``). A failure lists each differing case: the scheduler's answer and
message, takers' answer per node, the nodes and pods.

A difference either is fixed in ``core.takers`` / ``adapters.convert`` or is listed in ``KNOWN``
with its reason (and in docs/design/takers.md, "Held to kube-scheduler"); a listed case must
still differ, so the list cannot go stale.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import control_plane, kube, takers_gen
from tests.support.control_plane import settle
from tests.support.takers_gen import Case
from tests.support.training_cluster import Api

Obj = dict[str, Any]
SEED = 30  # issue 30
COUNT = 320
NAMESPACE = "takers"
EDGES = takers_gen.edge_reasons()  # the hand-written cases, by name: what each is about
PENDING = re.compile(r"c\d{4}")
MERGE = "application/merge-patch+json"
# Requests in flight at once while the cases are made: one at a time, each of the ~1,800 waits
# for its own round trip (some 12 ms here), the server idle in between; a few at once keep it busy.
IN_FLIGHT = 16

# Cases where takers and kube-scheduler are known to differ, by name, each with its reason.
KNOWN: dict[str, str] = {}


@dataclass(frozen=True)
class Verdict:
    case: Case
    pod: Obj  # the pending pod as the server holds it after scheduling
    bound: str | None  # the node kube-scheduler bound it to; None: Unschedulable
    why: str  # the scheduler's message when it did not bind it
    fits: dict[str, bool]  # by node: whether takers places the pod there
    refusals: dict[str, str]  # by node: takers' reason, or "fits"

    @property
    def agrees(self) -> bool:
        if self.bound is None:
            return not any(self.fits.values())
        return self.fits.get(self.bound, False)

    def describe(self) -> str:
        scheduler = f"bound to {self.bound}" if self.bound else f"Unschedulable: {self.why}"
        edge = EDGES.get(self.case.name)
        what = f" ({edge})" if edge else ""
        lines = [f"{self.case.name}{what}: kube-scheduler {scheduler}; takers:"]
        lines += [f"    {node}: {why}" for node, why in self.refusals.items()]
        for node in self.case.nodes:
            meta = node["metadata"]
            lines.append(
                f"    node {meta['name']} labels={meta['labels']} taints={node['spec']['taints']}"
                f" allocatable={node['status']['allocatable']}"
            )
        held = [(h["metadata"]["name"], h["spec"]) for h in self.case.holders]
        lines += [f"    holder {name}: {spec}" for name, spec in held]
        lines.append(f"    pending spec: {self.pod['spec']}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Run:
    verdicts: list[Verdict]
    seconds: dict[str, float]  # by phase


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    generated = [*takers_gen.cases(SEED, COUNT), *takers_gen.edge_cases()]
    began = time.monotonic()
    with (
        kube.running(tmp_path_factory.mktemp("takers")) as server,
        control_plane.running(server),
    ):
        seconds = {"start": time.monotonic() - began}
        yield Run(_verdicts(server, generated, seconds), seconds)


def _verdicts(
    server: kube.KubeServer, generated: list[Case], seconds: dict[str, float]
) -> list[Verdict]:
    mark = time.monotonic()
    for name, value in takers_gen.PRIORITY_CLASSES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        _create(server, "/apis/scheduling.k8s.io/v1/priorityclasses", body)
    for name, overhead in takers_gen.RUNTIME_CLASSES.items():
        body = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": name,
            "overhead": {"podFixed": overhead},
        }
        _create(server, "/apis/node.k8s.io/v1/runtimeclasses", body)
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _create(server, "/api/v1/namespaces", body)
    _all(server, [("POST", "/api/v1/nodes", node) for case in generated for node in case.nodes])
    wanted = sum(len(c.nodes) for c in generated)
    settle(f"{wanted} KWOK nodes Ready", lambda: _nodes_ready(server)[0] == wanted, 60)
    # Lent, as the actuator lends them (which also takes off the server's not-ready taint).
    lends = [
        ("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", takers_gen.lend_patch(node))
        for case in generated
        for node in case.nodes
    ]
    _all(server, lends, content_type=MERGE, expected=200)
    settle("no node tainted by the lifecycle controller", lambda: _nodes_ready(server)[1] == 0, 60)
    seconds["nodes"] = time.monotonic() - mark

    mark = time.monotonic()
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    made = iter(_all(server, [("POST", pods, h) for case in generated for h in case.holders]))
    holders = {case.name: [next(made) for _ in case.holders] for case in generated}
    # Every holder is made (bound by its nodeName) before the first pending pod is.
    made = iter(_all(server, [("POST", pods, case.pending) for case in generated]))
    pending = {case.name: next(made) for case in generated}
    settle(
        "every pending pod bound or Unschedulable",
        lambda: _decided(server, len(generated)) == len(generated),
        90,
    )
    seconds["scheduling"] = time.monotonic() - mark

    by_name = {p["metadata"]["name"]: p for p in _pods(server)}
    code, doc = server.request("GET", f"/api/v1/nodes?labelSelector={takers_gen.CASE_LABEL}")
    assert code == 200, doc
    nodes = {n["metadata"]["name"]: n for n in doc["items"]}
    verdicts = []
    for case in generated:
        pod = by_name[case.name]
        rooms = takers_gen.rooms(case.nodes, holders[case.name])
        for room in rooms:  # takers judges the node the scheduler sees
            lent = nodes[room.node]
            assert lent["metadata"]["labels"] == room.labels, room
            assert lent["spec"]["taints"] == [t.to_doc() for t in room.taints], room
        assert pending[case.name]["spec"].get("overhead") == pod["spec"].get("overhead")
        scheduled = _scheduled(pod)
        verdicts.append(
            Verdict(
                case=case,
                pod=pod,
                bound=pod["spec"].get("nodeName") or None,
                why=str(scheduled.get("message", "")),
                fits={r.node: takers_gen.fits(pod, r) for r in rooms},
                refusals={r.node: takers_gen.refusal(pod, r) for r in rooms},
            )
        )
    return verdicts


def _all(
    server: kube.KubeServer,
    requests: Sequence[tuple[str, str, Obj]],
    content_type: str = "application/json",
    expected: int = 201,
) -> list[Obj]:
    """Each (method, path, body), ``IN_FLIGHT`` at a time; the answers in the same order."""

    async def send() -> list[Obj]:
        gate = asyncio.Semaphore(IN_FLIGHT)
        async with Api.session_for(server) as session:
            api = Api(server.url, session)

            async def one(method: str, path: str, body: Obj) -> Obj:
                async with gate:
                    code, doc = await api.ask(method, path, body, content_type)
                assert code == expected, (method, path, body, doc)
                return dict(doc)

            return await asyncio.gather(*(one(*r) for r in requests))

    return asyncio.run(send())


def _create(server: kube.KubeServer, path: str, body: Obj) -> Obj:
    code, doc = server.request("POST", path, body)
    assert code == 201, (path, body, doc)
    return dict(doc)


def _nodes_ready(server: kube.KubeServer) -> tuple[int, int]:
    """How many of the cases' nodes are Ready; how many carry a ``node.kubernetes.io/`` taint."""
    code, doc = server.request("GET", f"/api/v1/nodes?labelSelector={takers_gen.CASE_LABEL}")
    assert code == 200, doc
    ready = tainted = 0
    for node in doc["items"]:
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
        ready += conditions.get("Ready") == "True"
        tainted += any(
            t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", [])
        )
    return ready, tainted


def _pods(server: kube.KubeServer) -> list[Obj]:
    code, doc = server.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    assert code == 200, doc
    return [p for p in doc["items"] if PENDING.fullmatch(p["metadata"]["name"])]


def _scheduled(pod: Obj) -> Obj:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled":
            return dict(condition)
    return {}


def _decided(server: kube.KubeServer, expected: int) -> int:
    decided = 0
    pods = _pods(server)
    assert len(pods) == expected, f"pending pods deleted: {len(pods)} of {expected} left"
    for pod in pods:
        scheduled = _scheduled(pod)
        unschedulable = (
            scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        )
        if pod["spec"].get("nodeName") or unschedulable:
            decided += 1
    return decided


def test_takers_agrees_with_kube_scheduler_on_every_generated_case(run: Run) -> None:
    differ = [v for v in run.verdicts if not v.agrees and v.case.name not in KNOWN]
    bound = sum(v.bound is not None for v in run.verdicts)
    summary = (
        f"{len(run.verdicts)} cases ({bound} bound, {len(run.verdicts) - bound} Unschedulable);"
        f" {len(differ)} differ; phases {run.seconds}"
    )
    print(summary)
    assert not differ, summary + "\n" + "\n".join(v.describe() for v in differ)


def test_each_known_difference_still_differs(run: Run) -> None:
    by_name = {v.case.name: v for v in run.verdicts}
    stale = [name for name in KNOWN if name not in by_name or by_name[name].agrees]
    assert not stale, f"listed in KNOWN but now agree (or not generated): {stale}"


def test_the_cases_are_not_one_sided(run: Run) -> None:
    """The suite can only catch a difference where both answers occur often: a generator that
    made every pod fit (or none) would hold takers to nothing."""
    bound = sum(v.bound is not None for v in run.verdicts)
    assert len(run.verdicts) == COUNT + len(EDGES)
    assert COUNT * 0.25 <= bound <= COUNT * 0.75, bound
    several = [v for v in run.verdicts if len(v.case.nodes) > 1 and v.bound is not None]
    assert several, "no case where the scheduler chose among nodes"
