"""``Controller.open`` against the API emulator: the parts are connected as the runtime needs.

In-process (unlike ``tests/test_cli_run.py``, which runs the command): the controller is opened
from a settings file with leader election on, and its elector is stepped by hand, so what the
telemetry says is checked right after each change of leadership, with no tick in between; and
the cluster's name is followed from the settings to what the built controller writes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from rebalancer import settings as settings_mod
from rebalancer.adapters import events
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.runtime import wiring
from tests.support import factories
from tests.support.processes import setup

ME = "rebalancer-7c4b9-aaaaa"


async def test_the_leader_metric_follows_the_lease_as_the_elector_wins_and_releases_it(
    tmp_path: Path,
) -> None:
    async with setup(tmp_path, election=True) as box:
        config = settings_mod.load(box.config, env={})
        seams = wiring.Seams(kubeconfig=box.kubeconfig, name=ME, sink=None)
        async with wiring.Controller.open(config, seams) as c:
            assert c.elector is not None

            def leader() -> float | None:
                return c.telemetry.registry.get_sample_value("rebalancer_leader", {"identity": ME})

            assert leader() == 0.0  # a candidate says 0 from the start, before any tick
            assert await c.elector.step()
            assert leader() == 1.0  # as soon as the Lease names it: no tick has run
            assert await c.elector.release()
            assert leader() == 0.0


async def test_two_controllers_started_with_the_same_pod_name_are_two_candidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", ME)  # a copied environment, or a second run in the pod
    async with setup(tmp_path, election=True) as box:
        config = settings_mod.load(box.config, env={})
        seams = wiring.Seams(kubeconfig=box.kubeconfig, sink=None, serve_http=False)
        async with (
            wiring.Controller.open(config, seams) as a,
            wiring.Controller.open(config, seams) as b,
        ):
            assert a.identity != b.identity
            assert (a.pod, b.pod) == (ME, ME)
            assert a.elector is not None
            assert b.elector is not None
            assert await a.elector.step()
            assert not await b.elector.step()  # the Lease names a, not "ME": b waits
            now = a.leadership.now()
            assert (a.leadership.may_write(now), b.leadership.may_write(now)) == (True, False)
            assert b.elector.holder == a.identity
            # What a leads is recorded under its identity: the pod and the process in it.
            pool = a.pools[0].name
            _, tick = a.reconciler.operator_plan({pool: [factories.serving("n-1")]}, "test")
            assert {r.controller for r in tick.records} == {a.identity}
            assert {r.term for r in tick.records} == {0}


async def test_the_cluster_name_reaches_the_audit_log_the_metrics_and_the_events(
    tmp_path: Path,
) -> None:
    async with setup(tmp_path) as box:
        config = settings_mod.load(box.config, env={"REBALANCER_CLUSTER_NAME": "prod-eu-1"})
        seams = wiring.Seams(kubeconfig=box.kubeconfig, name=ME, sink=None, serve_http=False)
        async with wiring.Controller.open(config, seams) as c:
            info = {"cluster_name": "prod-eu-1"}
            assert c.telemetry.registry.get_sample_value("rebalancer_cluster_info", info) == 1.0

            summary = AuditRecord(
                id=c.audit_log.new_id(),
                time=c.clock(),
                kind=Kind.SUMMARY,
                pool="inference",
                controller=ME,
                reason="steady",
                message="nothing to do",
            )
            await c.audit_log.tick([summary])
            stored = await c.store.get(summary.id)
            assert stored is not None
            assert stored.cluster == "prod-eu-1"

            assert isinstance(c.events, events.KubeEvents)
            assert await c.events.record(
                events.NodeEvent("inference-5", "Normal", "Lent", "Lend", "lent")
            )
            found = await client.EventsV1Api(c.api).list_namespaced_event(events.NAMESPACE)
            assert [e.metadata.annotations for e in found.items] == [
                {f"{config.key_prefix}cluster": "prod-eu-1"}
            ]


async def test_kueue_workloads_are_watched_only_when_the_settings_ask(tmp_path: Path) -> None:
    async with setup(tmp_path) as box:
        seams = wiring.Seams(kubeconfig=box.kubeconfig, name=ME, sink=None, serve_http=False)
        text = box.config.read_text(encoding="utf-8")
        for on in (False, True):
            box.config.write_text(
                f"takers: {{kueue_workloads: {str(on).lower()}}}\n{text}", encoding="utf-8"
            )
            config = settings_mod.load(box.config, env={})
            async with wiring.Controller.open(config, seams) as c:
                assert (c.informer.workloads is not None) is on
                assert c.informer.pending_pods is not None  # the pool lends only to takers
