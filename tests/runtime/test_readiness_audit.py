"""``/readyz`` while the audit store fails: served by the real HTTP server, still 200, and the
reason names the store's error (docs/design/audit-failure.md says why it stays ready)."""

from __future__ import annotations

import aiohttp

from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.runtime import http
from rebalancer.runtime.telemetry import Telemetry
from tests.support import gates


async def test_readyz_names_a_failing_audit_store_and_stays_ready() -> None:
    failing: list[str | None] = [None]

    def ready() -> http.Readiness:
        return http.readiness(True, True, "rebalancer-0", failing[0])

    server = http.HttpServer(
        telemetry=Telemetry(),
        store=MemoryAuditStore(),
        ready=ready,
        gate=gates.Grants(),
        host="127.0.0.1",
        port=0,
        health_port=0,
    )
    async with server, aiohttp.ClientSession() as session:
        url = f"{server.health_url}/readyz"
        async with session.get(url) as response:
            assert response.status == 200
            assert "audit store" not in (await response.json())["reason"]
        failing[0] = "OperationalError: database or disk is full"
        async with session.get(url) as response:
            assert response.status == 200
            body = await response.json()
        assert body["ready"] is True
        assert body["reason"] == (
            "caches synced; the leader is rebalancer-0; the audit store fails (OperationalError: "
            "database or disk is full): no lending, safety reclaims recorded on their nodes "
            "until it takes writes"
        )
