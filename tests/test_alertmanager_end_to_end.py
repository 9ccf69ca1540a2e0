"""End to end: an Alertmanager notification posted to the controller PROCESS takes lent nodes
back at once, and the audit record of the reclaim names the alert.

The controller runs on the session's real control plane, real training Jobs its takers, and a
real, scraping Prometheus (``tests.support.harness.on_plane``), with a 60 s tick: the lends come
from its first tick and the informer's wake-ups, so a reclaim seen within seconds of the
notification was the notification's doing, not the next scheduled tick's. Demand stays low
throughout: nothing but the alert says inference is short.

It posts as the chart tells Alertmanager to (docs/http.md#alertmanager): a service account's
token projected for the receiver's audience, the account granted ``create`` on
``alerts.rebalancer.io`` by a ClusterRole; the controller reviews both with the cluster. The
plane's admin, whose token is the API server's alone, is refused the write (401): no token of
another audience posts, whatever it may do elsewhere."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rebalancer.adapters import kubeclient
from rebalancer.core.audit import Kind
from rebalancer.core.model import Action, Reason
from tests.support import tokens
from tests.support.alertmanager import alert, notification
from tests.support.control_plane import ControlPlane
from tests.support.harness import INFERENCE, Harness, on_plane
from tests.support.waits import until


async def demand_known(h: Harness) -> bool:
    query = {"query": "sum(rate(vllm:request_success_total[4s]))"}
    async with h.session.get(h.prometheus.url + "/api/v1/query", params=query) as r:
        return bool((await r.json())["data"]["result"])


@contextlib.asynccontextmanager
async def alertmanager_token(plane: ControlPlane, tmp_path: Path) -> AsyncIterator[str]:
    """Alertmanager's projected token: audience ``rebalancer``, ``create alerts.rebalancer.io``."""
    config = plane.server.kubeconfig(tmp_path / "admin.kubeconfig")
    async with (
        kubeclient.api_client(config) as api,
        tokens.accounts(
            api, "monitoring", {"alertmanager": [("create", "alerts.rebalancer.io")]}
        ) as made,
    ):
        yield await made["alertmanager"].token("rebalancer")


WAKE_ON = [{"matchers": ['alertname="InferenceQueueHigh"', 'service="llm"']}]
IDLE_NODES = set(INFERENCE[2:])  # the two first run an inference replica


async def test_a_posted_alert_takes_lent_nodes_back_at_once_with_the_alert_in_the_audit(
    plane: ControlPlane, tmp_path: Path
) -> None:
    async with on_plane(plane, tmp_path) as h:
        config = h.config(tick_interval="60s", pool={"wake_on": WAKE_ON})
        # The first tick must find demand known: the next is a minute later.
        await until("demand in Prometheus", lambda: demand_known(h), None, 20)
        async with h.controller(config) as c:
            await h.wait_lent(c, IDLE_NODES)

            # The alert started two minutes ago on the process's own (real) clock: an alert
            # holds its pool at most alertmanager.max_life after its startsAt.
            started = datetime.now(UTC).replace(microsecond=123456) - timedelta(minutes=2)
            starts_at = started.isoformat().replace("+00:00", "Z")
            body = notification(
                [alert(service="llm", fingerprint="9a1b2c3d4e5f6071", starts_at=starts_at)]
            )
            url, data = c.base + "/api/v1/alertmanager", json.dumps(body)
            async with c.session.post(url, data=data) as r:  # the admin's token
                assert r.status == 401, await r.text()
            async with alertmanager_token(plane, tmp_path) as token:
                posted = time.monotonic()
                headers = {"Authorization": f"Bearer {token}"}
                async with c.session.post(url, data=data, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    receipt = await r.json()

            async def some_node_comes_back() -> bool:
                return await h.lent() != IDLE_NODES

            await until("a node taken back", some_node_comes_back, c.proc, 10)
            took = time.monotonic() - posted
            await h.wait_all_serving(c)

        assert [h["pool"] for h in receipt["held"]] == ["inference"]
        assert took < 10  # the next scheduled tick was up to a minute away
        records = await h.records()
        reclaims = [r for r in records if r.kind is Kind.INTENT and r.action is Action.RECLAIM]
        assert {r.node for r in reclaims} == IDLE_NODES
        assert {r.reason for r in reclaims} == {Reason.ALERT_FIRING.value}
        (named,) = reclaims[0].inputs["alerts"]
        assert named["alertname"] == "InferenceQueueHigh"
        assert named["fingerprint"] == "9a1b2c3d4e5f6071"
        assert named["matcher"] == '{alertname="InferenceQueueHigh", service="llm"}'
        assert named["starts_at"] == starts_at
        # While it fires the pool lends nothing: the nodes stay serving.
        first = min(r.time for r in reclaims)
        assert not [
            r
            for r in records
            if r.kind is Kind.INTENT and r.action is Action.LEND and r.time > first
        ]
