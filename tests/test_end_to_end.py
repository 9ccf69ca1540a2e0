"""End to end: the controller PROCESS against the API emulator and a real, scraping Prometheus.

Everything runs on the wall clock. The test serves the emulator (8 ``gpu-pool=inference`` nodes,
two of them running an inference replica, 4 training nodes, 10 preemptible training pods of which
6 cannot fit until inference nodes are lent; its scheduler runs every 0.5 s) and a fake vLLM
exporter that a real ``prometheus`` scrapes every second, then runs the controller as the Helm
chart deploys it: the chart is rendered with this cluster's values (``chart_values``: strategy
``window`` with window ``always``, a 1 s tick), and the rendered Deployment's container runs as a
local process (``tests.support.processes.as_pod``): its args, its environment with the downward
API resolved (``POD_NAME`` and a suffix of the process's own become the Lease holder and the
audit records' identity), the
rendered ConfigMap as its settings file and its volumes (the SQLite audit file) under a
directory of the test's.
Its readiness and liveness probe paths must answer before the scenario starts.

On a real kube-apiserver the same path runs with the real kube-scheduler, kube-controller-manager
and KWOK's kubelets, training as a real Job (``tests/kubeapi/test_end_to_end_real.py``, which
holds the chart's roles to the same least privilege).

RBAC is proven, not asserted: the emulator enforces tokens and RBAC, the Helm chart is rendered
(``tests.support.chart.render``) and its ServiceAccount, ClusterRole, Roles and bindings are
created through the API as an admin, and the controller authenticates as the chart's service
account (``system:serviceaccount:rebalancer:rebalancer``), with leader election on the chart's
Lease (``rebalancer/rebalancer``).

1. Low load (5 rps for a pool of 8 nodes at 10 rps each, nothing queued): the planner allows
   8 - min_serving 2 = 6 loans and the 6 idle nodes are lent (4 per tick, the per-tick limit),
   never the two running inference; training pods are scheduled onto them.
2. Load rises to 20000 rps (see ``HIGH_RPS``) and 50 requests queue: demand needs every node,
   the safety rule reclaims all 6, the borrowed pods are evicted (1 s grace), the nodes serve
   again, and the queue keeps the strategy from lending anything more.
3. SIGTERM: exit 0. Then every inference node's taints and labels are the originals byte for
   byte, every transition has its intent before its outcome in the audit store, and an Event
   on the node.
4. From the emulator's authorization record: no request of the controller was refused, and the
   grants of the rendered roles that the scenario never used are among ``MAY_GO_UNUSED`` (least
   privilege says any other should go: a new unused grant fails the test).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from datetime import timedelta
from pathlib import Path

import aiohttp

from rebalancer.adapters import leadership
from rebalancer.core.audit import Kind
from rebalancer.core.model import Reason
from rebalancer.core.outcomes import Outcome
from sandbox.emulator import cluster
from tests.support.chart import NAMESPACE, render
from tests.support.exporter import Exporter, serve_exporter
from tests.support.pools import (
    IDLE,
    INFERENCE,
    REPLICAS,
    STATE,
)
from tests.support.processes import as_pod, free_port, probe, read_audit, start_pod
from tests.support.prometheus import scraping
from tests.support.rbac import MAY_GO_UNUSED, grants, rbac_of, unused, used
from tests.support.reads import scheduling
from tests.support.scenario import (
    HIGH_QUEUE,
    HIGH_RPS,
    LEASE,
    LOW_RPS,
    POD_NAME,
    chart_values,
    on_emulator,
)
from tests.support.waits import until


async def test_lends_at_low_load_and_reclaims_when_load_and_queue_rise(tmp_path: Path) -> None:
    began = time.monotonic()
    exporter = Exporter(pods=REPLICAS, rps=LOW_RPS)
    docs = render({})
    async with (
        serve_exporter(exporter) as target,
        scraping(tmp_path / "prometheus", target) as prom,
        on_emulator(docs, tmp_path) as box,
    ):
        originals = {name: scheduling(n) for name, n in (await box.nodes()).items()}
        # The controller runs as the chart deploys it: the rendered Deployment's args and env,
        # its ConfigMap as the settings file, its volumes under a directory of the test's.
        installed = render(chart_values(prom, free_port()))
        assert rbac_of(installed) == rbac_of(docs), "the roles enforced are the ones installed"
        pod = as_pod(installed, tmp_path / "pod", name=POD_NAME, namespace=NAMESPACE)
        audit_url = f"sqlite+aiosqlite:///{pod.root}/var/lib/rebalancer/audit.sqlite3"
        base = f"http://127.0.0.1:{pod.health_port}"  # the probes' port
        decisions = f"https://127.0.0.1:{pod.port}/api/v1/decisions"  # as the admin, reviewed
        proc = await start_pod(pod, box.kubeconfig)
        try:
            await until(
                "the readiness probe", lambda: probe(box.session, base + pod.readiness), proc, 20
            )
            assert await probe(box.session, base + pod.liveness)
            lent_seen: set[str] = set()
            borrowed: set[str] = set()

            async def all_idle_lent() -> bool:
                nodes = await box.nodes()
                lent = {n for n in INFERENCE if nodes[n]["metadata"]["labels"].get(STATE)}
                lent_seen.update(lent)
                borrowed.update(
                    p["spec"]["nodeName"]
                    for p in await box.pods()
                    if p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
                    and p["spec"].get("nodeName") in INFERENCE
                    and p["status"].get("phase") == "Running"
                )
                states = {nodes[n]["metadata"]["labels"].get(STATE) for n in IDLE}
                return states == {"lent"} and borrowed == set(IDLE)

            lend_time = await until("lending the idle nodes", all_idle_lent, proc, within=25)
            assert lent_seen == set(IDLE), "only idle nodes are lent"

            exporter.set_load(HIGH_RPS, HIGH_QUEUE)
            raised = time.monotonic()

            async def all_serving() -> bool:
                nodes = await box.nodes()
                return all(scheduling(nodes[n]) == originals[n] for n in INFERENCE)

            reclaim_time = await until("reclaiming every lent node", all_serving, proc, within=25)
            # A little more of high load: the strategy still wants to lend, the queue says no.
            refused = await until(
                "refusing to lend while the queue builds",
                lambda: _has_queue_refusal(box.session, decisions),
                proc,
                within=10,
            )
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "Traceback" not in err.decode()
        assert out.decode().strip(), "the audit JSON lines go to stdout"

        nodes = await box.nodes()
        for name in INFERENCE:
            assert scheduling(nodes[name]) == originals[name], name
        events = await box.get("/apis/events.k8s.io/v1/namespaces/default/events")
        training_left = [
            p
            for p in await box.pods()
            if p["spec"].get("nodeName") in INFERENCE
            and p["metadata"]["namespace"] == cluster.TRAINING_NAMESPACE
        ]
        assert training_left == [], "borrowed pods are gone from reclaimed nodes"
        lease = await box.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE[0]}/leases/{LEASE[1]}"
        )
        assert not lease["spec"].get("holderIdentity"), "released on the way out"
        scrapes = exporter.scrapes
        controller = box.decisions()

    denied = [d for d in controller if not d.allowed]
    assert denied == [], denied
    print(f"\ne2e: the controller used {sorted(used(controller))}")
    assert unused(grants(docs), controller) <= MAY_GO_UNUSED

    records = await read_audit(audit_url)
    by_id = {r.id: r for r in records}
    intents = [r for r in records if r.kind is Kind.INTENT]
    outcomes = [r for r in records if r.kind is Kind.OUTCOME]
    (identity,) = {r.controller for r in records}  # one process wrote them all
    assert identity.startswith(f"{POD_NAME}_"), "the identity names the pod, then the process"
    assert leadership.pod_of(identity) == POD_NAME
    lends = [r for r in intents if r.action == "lend"]
    reclaims = [r for r in intents if r.action == "reclaim"]
    assert sorted(str(r.node) for r in lends) == IDLE
    assert sorted(str(r.node) for r in reclaims) == IDLE
    # Load and queue rise together: the queue is read at once, the rate a scrape or two later,
    # so either safety rule may be the first to take the loans back.
    safety = {Reason.DEMAND_ABOVE_SERVING.value, Reason.QUEUE_ABOVE_LIMIT.value}
    assert {r.reason for r in reclaims} <= safety
    assert {r.origin for r in reclaims} == {"safety"}
    for outcome in outcomes:  # intent before outcome, always
        assert outcome.intent_id in by_id, outcome
        intent = by_id[outcome.intent_id]
        assert (intent.time, intent.id) < (outcome.time, outcome.id)
    for intent in lends + reclaims:
        mine = [o for o in outcomes if o.intent_id == intent.id]
        assert [o.outcome for o in mine][-1] == Outcome.APPLIED.value, (intent, mine)
        assert all(o.outcome in (Outcome.APPLIED, Outcome.IN_PROGRESS) for o in mine), mine
    drained = [p for o in outcomes for p in o.pods]
    assert len(drained) == len(IDLE), drained  # one borrowed training pod per lent node

    reasons: dict[str, list[str]] = {}
    for e in events["items"]:
        assert e["metadata"]["namespace"] == "default"
        assert e["regarding"]["kind"] == "Node"
        reasons.setdefault(e["regarding"]["name"], []).append(e["reason"])
    assert {n: sorted(r) for n, r in reasons.items()} == {
        n: ["Lent", "Reclaiming", "Restored"] for n in IDLE
    }

    total = time.monotonic() - began
    print(
        f"\ne2e: lent {len(IDLE)} nodes in {lend_time:.1f}s, "
        f"reclaimed all in {reclaim_time:.1f}s "
        f"after the load rose ({time.monotonic() - raised:.1f}s to stop), queue refusal seen "
        f"{refused:.1f}s later; {len(records)} audit rows, {len(events['items'])} events, "
        f"{scrapes} scrapes; {total:.1f}s in all"
    )
    assert total < timedelta(seconds=90).total_seconds()


async def _has_queue_refusal(session: aiohttp.ClientSession, decisions: str) -> bool:
    """Through the controller's own audit API while it runs (``kind=refusal``, newest first)."""
    with contextlib.suppress(aiohttp.ClientError):
        query = {"kind": "refusal", "order": "desc", "limit": "50"}
        async with session.get(decisions, params=query, ssl=False) as r:  # self-signed
            if r.status == 200:
                body = await r.json()
                return any(i["reason"] == Reason.QUEUE_BUILDING.value for i in body["items"])
    return False
