"""``POST /api/v1/alertmanager`` over real HTTP, the alert store behind it, and the loop it wakes.

The server is the controller's own ``HttpServer`` on a free loopback port; the store runs on a
clock the test moves, so that expiry by ``endsAt`` and by the maximum age is shown without
waiting on any clock."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest

from rebalancer.adapters import kubeauth
from rebalancer.adapters.audit import MemoryAuditStore
from rebalancer.core import alerts as matching
from rebalancer.core.model import PoolName
from rebalancer.runtime import alerts
from rebalancer.runtime.http import HttpServer, readiness
from rebalancer.runtime.loop import ReconcileLoop, alert_wake, run_controller
from rebalancer.runtime.telemetry import Telemetry
from tests.support.alertmanager import alert, notification
from tests.support.factories import T0

L20, T4 = PoolName("l20"), PoolName("t4")
HOUR = timedelta(hours=1)


def selector(*texts: str) -> matching.Selector:
    parsed = matching.parse_selector(list(texts))
    assert isinstance(parsed, matching.Selector)
    return parsed


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now


def store_for(clock: Clock, max_age: timedelta = HOUR) -> alerts.AlertStore:
    return alerts.AlertStore(
        {
            L20: [selector('alertname="InferenceQueueHigh"', 'service="llm"')],
            T4: [selector('alertname=~"Inference.*"', 'service="chat"')],
        },
        max_age=max_age,
        clock=clock,
    )


@dataclass
class Posting:
    session: aiohttp.ClientSession
    url: str

    async def __call__(
        self, body: Any, token: str | None = None, raw: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.url, data=data, headers=headers) as r:
            return r.status, await r.json()


@asynccontextmanager
async def serving(receiver: alerts.Receiver) -> AsyncIterator[Posting]:
    server = HttpServer(
        telemetry=Telemetry(),
        store=MemoryAuditStore(),
        ready=lambda: readiness(True, False, ""),
        # The receiver alone: who may post is the gate's (tests/runtime/test_http_auth.py), and
        # the shared token is the receiver's own, for a port whose authentication is off.
        gate=kubeauth.OpenGate(),
        host="127.0.0.1",
        port=0,
        health_port=0,
        alerts=receiver,
    )
    async with server, aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session:
        yield Posting(session, server.url + "/api/v1/alertmanager")


# ---------------------------------------------------------------------------------------------
# The endpoint


async def test_a_firing_alert_that_matches_a_pool_is_held_for_it_and_rings_the_loop() -> None:
    clock = Clock()
    store = store_for(clock)
    async with serving(alerts.Receiver(store)) as post:
        status, body = await post(notification([alert(service="llm")]))

    assert status == 200
    assert body == {
        "held": [
            {
                "pool": "l20",
                "alertname": "InferenceQueueHigh",
                "fingerprint": "5f0e2c8a1b3d4e6f",
                "matcher": '{alertname="InferenceQueueHigh", service="llm"}',
                "until": (T0 + HOUR).isoformat(),
            }
        ],
        "resolved": [],
        "unmatched": 0,
        "ended": [],
    }
    assert store.rung.is_set()
    assert "alert InferenceQueueHigh for pool l20" in store.why
    (held,) = store.firing(L20, T0)
    assert (held.name, held.fingerprint, held.received, held.until) == (
        "InferenceQueueHigh",
        "5f0e2c8a1b3d4e6f",
        T0,
        T0 + HOUR,
    )
    assert held.starts_at == datetime.fromisoformat("2026-03-02T11:58:00.123456+00:00")
    assert store.firing(T4, T0) == ()


async def test_an_alert_no_pool_selects_is_counted_and_rings_nothing() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store)) as post:
        status, body = await post(notification([alert("DiskFull", service="llm")]))

    assert (status, body["held"], body["unmatched"]) == (200, [], 1)
    assert not store.rung.is_set()


async def test_a_resolved_notification_lets_the_pool_go_and_runs_the_step() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store)) as post:
        await post(notification([alert(service="llm")]))
        store.rung.clear()
        status, body = await post(notification([alert(service="llm", status="resolved")]))

    assert (status, body["resolved"]) == (200, ["5f0e2c8a1b3d4e6f"])
    assert store.firing(L20, T0) == ()
    assert store.rung.is_set()  # the pool may lend again: the step runs to see it
    assert store.why == "alert 5f0e2c8a1b3d4e6f resolved"


def test_a_lost_resolved_holds_the_pool_no_longer_than_the_maximum_age() -> None:
    clock = Clock()
    store = store_for(clock, max_age=timedelta(minutes=30))
    store.receive(alerts.Notification.model_validate(notification([alert(service="llm")])))

    assert len(store.firing(L20, T0 + timedelta(minutes=29))) == 1
    assert store.firing(L20, T0 + timedelta(minutes=30)) == ()


def test_every_firing_notification_starts_the_maximum_age_again() -> None:
    clock = Clock()
    store = store_for(clock, max_age=timedelta(minutes=30))
    again = alerts.Notification.model_validate(notification([alert(service="llm")]))
    store.receive(again)
    clock.now = T0 + timedelta(minutes=20)  # Alertmanager's repeat_interval
    store.receive(again)

    assert len(store.firing(L20, T0 + timedelta(minutes=45))) == 1
    assert store.firing(L20, T0 + timedelta(minutes=50)) == ()


STARTS = datetime.fromisoformat("2026-03-02T11:58:00.123456+00:00")  # alert()'s startsAt
LIFE = timedelta(hours=12)  # AlertStore's max_life by default


def test_alertmanager_re_sending_a_firing_alert_holds_its_pool_for_the_alert_s_life() -> None:
    clock = Clock()
    store = store_for(clock)
    again = alerts.Notification.model_validate(notification([alert(service="llm")]))
    while clock.now < STARTS + LIFE - timedelta(minutes=15):  # every repeat_interval
        store.receive(again)
        assert len(store.firing(L20, clock.now + timedelta(minutes=14))) == 1, clock.now
        clock.now += timedelta(minutes=15)


def test_a_notification_posted_again_and_again_holds_no_longer_than_its_alert_s_life() -> None:
    clock = Clock()
    store = store_for(clock)
    replay = alerts.Notification.model_validate(notification([alert(service="llm")]))
    store.receive(replay)
    (held,) = store.firing(L20, T0)
    assert held.until == T0 + HOUR

    clock.now = STARTS + LIFE - timedelta(minutes=10)
    store.receive(replay)
    (held,) = store.firing(L20, clock.now)
    assert held.until == STARTS + LIFE  # not an hour after this receipt

    for hours in range(1, 4):  # posted again after its life: held by nothing, ever
        clock.now = STARTS + LIFE + timedelta(hours=hours)
        receipt = store.receive(replay)
        assert (receipt.held, receipt.ended) == ((), ("5f0e2c8a1b3d4e6f",))
        assert store.firing(L20, clock.now) == ()


def test_a_firing_notification_replayed_after_its_resolved_holds_nothing_and_rings_nothing() -> (
    None
):
    clock = Clock()
    store = store_for(clock)
    firing = alerts.Notification.model_validate(notification([alert(service="llm")]))
    store.receive(firing)
    clock.now = T0 + timedelta(minutes=5)
    store.receive(
        alerts.Notification.model_validate(
            notification([alert(service="llm", status="resolved", ends_at="2026-03-02T12:04:00Z")])
        )
    )
    store.rung.clear()

    clock.now = T0 + timedelta(minutes=6)
    receipt = store.receive(firing)

    assert receipt.ended == ("5f0e2c8a1b3d4e6f",)
    assert store.firing(L20, clock.now) == ()
    assert not store.rung.is_set()


def test_an_alert_that_fires_again_after_its_resolved_is_held_again() -> None:
    clock = Clock()
    store = store_for(clock)
    store.receive(alerts.Notification.model_validate(notification([alert(service="llm")])))
    store.receive(
        alerts.Notification.model_validate(notification([alert(service="llm", status="resolved")]))
    )
    clock.now = T0 + timedelta(minutes=30)
    anew = alert(service="llm", starts_at="2026-03-02T12:29:00Z")  # a new life: a new startsAt
    store.receive(alerts.Notification.model_validate(notification([anew])))

    (held,) = store.firing(L20, clock.now)
    assert held.starts_at == datetime.fromisoformat("2026-03-02T12:29:00+00:00")


def test_a_re_sent_alert_already_held_does_not_ring_the_loop_again() -> None:
    clock = Clock()
    store = store_for(clock)
    again = alerts.Notification.model_validate(notification([alert(service="llm")]))
    store.receive(again)
    assert store.rung.is_set()
    store.rung.clear()
    clock.now = T0 + timedelta(minutes=15)

    receipt = store.receive(again)

    assert len(receipt.held) == 1  # held, for longer
    assert not store.rung.is_set()  # but nothing the step must act on at once


def test_an_alert_with_an_ends_at_holds_until_then_and_one_already_ended_holds_nothing() -> None:
    clock = Clock()
    store = store_for(clock)
    soon = alert(service="llm", ends_at="2026-03-02T12:05:00Z")
    over = alert(service="chat", fingerprint="0a", ends_at="2026-03-02T11:59:00Z")
    store.receive(alerts.Notification.model_validate(notification([soon, over])))

    (held,) = store.firing(L20, T0)
    assert held.until == T0 + timedelta(minutes=5)
    assert store.firing(T4, T0) == ()
    assert store.firing(L20, T0 + timedelta(minutes=5)) == ()


def test_one_alert_may_hold_several_pools_each_with_the_selector_that_matched() -> None:
    store = alerts.AlertStore(
        {L20: [selector('service="llm"')], T4: [selector('alertname=~"Inference.*"')]},
        max_age=HOUR,
        clock=Clock(),
    )
    store.receive(alerts.Notification.model_validate(notification([alert(service="llm")])))

    assert [a.matcher for a in store.firing(L20, T0)] == ['{service="llm"}']
    assert [a.matcher for a in store.firing(T4, T0)] == ['{alertname=~"Inference.*"}']


BAD = [
    pytest.param(b"{not json", "(body)", "not JSON", id="not JSON"),
    pytest.param(b"[]", "(body)", "must be a JSON object", id="an array"),
    pytest.param({"version": "4"}, "groupKey", "Field required", id="no groupKey"),
    pytest.param(
        {**notification([alert()]), "alerts": "none"}, "alerts", "valid list", id="alerts text"
    ),
    pytest.param(
        notification([{**alert(), "startsAt": "yesterday"}]),
        "alerts[0].startsAt",
        "datetime",
        id="a bad startsAt",
    ),
    pytest.param(
        notification([{**alert(), "startsAt": "2026-03-02T11:58:00"}]),
        "alerts[0].startsAt",
        "timezone",
        id="a startsAt without its offset",
    ),
    pytest.param(
        notification([{**alert(), "status": "pending"}]),
        "alerts[0].status",
        "'firing' or 'resolved'",
        id="a bad status",
    ),
    pytest.param(
        notification([{**alert(), "labels": {"alertname": 1}}]),
        "alerts[0].labels.alertname",
        "valid string",
        id="a label that is not text",
    ),
    pytest.param(
        notification([{**alert(), "fingerprint": ""}]),
        "alerts[0].fingerprint",
        "at least 1 character",
        id="no fingerprint",
    ),
]


@pytest.mark.parametrize(("body", "field", "why"), BAD)
async def test_a_bad_payload_is_a_400_naming_the_field_and_its_value(
    body: Any, field: str, why: str
) -> None:
    store = store_for(Clock())
    raw = body if isinstance(body, bytes) else None
    async with serving(alerts.Receiver(store)) as post:
        status, answer = await post(body, raw=raw)

    assert status == 400
    assert answer["error"] == "bad_payload"
    assert answer["field"] == field
    assert why in answer["message"]
    assert "value" in answer
    assert store.firing(L20, T0) == ()


async def test_a_bad_value_is_shown_in_the_answer() -> None:
    bad = notification([{**alert(), "startsAt": "yesterday"}])
    async with serving(alerts.Receiver(store_for(Clock()))) as post:
        _, answer = await post(bad)

    assert answer["value"] == "yesterday"


async def test_a_notification_of_another_version_is_refused_naming_it() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store)) as post:
        status, answer = await post(notification([alert(service="llm")], version="3"))

    assert status == 400
    assert answer == {
        "error": "unsupported_version",
        "field": "version",
        "value": "3",
        "message": 'only Alertmanager\'s webhook version "4" is read here',
    }
    assert store.firing(L20, T0) == ()


async def test_json_nested_deeper_than_the_bound_is_a_400_naming_it_not_a_500() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store)) as post:
        status, answer = await post(None, raw=b"[" * 100_000 + b"]" * 100_000)
        just_deep_enough, _ = await post(None, raw=b"[" * 64 + b"]" * 64)

    assert status == 400
    assert answer["error"] == "too_deep"
    assert answer["message"] == (
        "JSON nested 100000 levels deep: a notification is nested at most 64"
    )
    assert just_deep_enough == 400  # read, and refused for what it is: not an object


async def test_a_body_over_the_size_bound_is_refused_naming_its_size() -> None:
    store = store_for(Clock())
    big = json.dumps(notification([alert(service="llm")] * 4000)).encode()
    assert len(big) > alerts.MAX_BODY
    async with (
        serving(alerts.Receiver(store)) as post,
        post.session.post(post.url, data=io.BytesIO(big)) as r,  # with its Content-Length
    ):
        status, answer = r.status, await r.json()

    assert status == 413
    assert answer["error"] == "body_too_large"
    assert answer["message"].startswith(f"{len(big)} bytes: a notification is at most 1048576")
    assert store.firing(L20, T0) == ()


async def test_a_body_sent_in_chunks_is_cut_off_once_over_the_size_bound() -> None:
    store = store_for(Clock())

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 65536  # JSON's whitespace: 1.25 MiB of it, no Content-Length

    async with (
        serving(alerts.Receiver(store)) as post,
        post.session.post(post.url, data=chunks()) as r,
    ):
        status, answer = r.status, await r.json()

    assert (status, answer["error"]) == (413, "body_too_large")
    assert answer["value"] == f"(more than {alerts.MAX_BODY} bytes)"


def test_depth_is_counted_without_recursion_and_ignores_brackets_inside_strings() -> None:
    assert alerts.depth(b'{"a": [1, {"b": "[[[[{{{{\\"]"}]}') == 3
    assert alerts.depth(b"[" * 100_000) == 100_000
    assert alerts.depth(b"3") == 0


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_with_a_token_set_a_notification_without_it_is_a_401(token: str | None) -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store, token="s3cret")) as post:
        status, answer = await post(notification([alert(service="llm")]), token=token)

    assert (status, answer["error"]) == (401, "unauthorized")
    assert store.firing(L20, T0) == ()


async def test_with_a_token_set_a_notification_with_it_is_taken() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store, token="s3cret")) as post:
        status, _ = await post(notification([alert(service="llm")]), token="s3cret")

    assert status == 200
    assert len(store.firing(L20, T0)) == 1


async def test_a_follower_keeps_the_alert_but_answers_503_so_that_alertmanager_retries() -> None:
    store = store_for(Clock())
    async with serving(alerts.Receiver(store, leading=lambda: False)) as post:
        status, answer = await post(notification([alert(service="llm")]))

    assert (status, answer["error"]) == (503, "not_leader")
    assert len(store.firing(L20, T0)) == 1


# ---------------------------------------------------------------------------------------------
# The loop


async def test_a_wake_up_at_once_runs_the_step_without_the_debounce() -> None:
    ran = asyncio.Event()
    runs = 0

    async def step() -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            ran.set()

    loop = ReconcileLoop(step, interval=HOUR, debounce=HOUR)
    loop.start()
    try:
        async with asyncio.timeout(2):
            while runs < 1:
                await asyncio.sleep(0)
            loop.wake("a debounced change")  # an hour's debounce: not before the timeout
            loop.wake("alertmanager: alert InferenceQueueHigh", at_once=True)
            await ran.wait()
    finally:
        await loop.stop()


async def test_a_wake_up_at_once_during_a_run_runs_again_as_soon_as_it_ends() -> None:
    release, second = asyncio.Event(), asyncio.Event()
    runs = 0

    async def step() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            await release.wait()
        else:
            second.set()

    loop = ReconcileLoop(step, interval=HOUR, debounce=HOUR)
    loop.start()
    try:
        async with asyncio.timeout(2):
            while runs < 1:
                await asyncio.sleep(0)
            loop.wake("alertmanager: alert InferenceQueueHigh", at_once=True)
            release.set()
            await second.wait()
    finally:
        await loop.stop()


def test_an_alert_wakes_the_loop_at_once_only_when_none_did_within_the_tick_interval() -> None:
    assert alert_wake(T0, None, HOUR)
    assert not alert_wake(T0 + timedelta(minutes=59), T0, HOUR)
    assert alert_wake(T0 + HOUR, T0, HOUR)


class Listed:
    """An informer that has listed and sees no change: only alerts wake the loop."""

    def __init__(self) -> None:
        self.synced, self.changed = asyncio.Event(), asyncio.Event()
        self.synced.set()

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_two_hundred_notifications_in_a_tick_run_the_step_once_not_once_each() -> None:
    store = store_for(Clock())
    runs = 0
    ran = asyncio.Event()

    async def step() -> None:
        nonlocal runs
        runs += 1
        ran.set()

    async def until_runs(n: int) -> None:
        while runs < n:
            ran.clear()
            await ran.wait()

    stop = asyncio.Event()
    controller = asyncio.create_task(
        run_controller(
            step,
            informer=Listed(),
            interval=HOUR,
            debounce=HOUR,
            stop=stop,
            signals=(),
            alerts=store,
        )
    )
    try:
        async with serving(alerts.Receiver(store)) as post, asyncio.timeout(10):
            await until_runs(1)  # the first tick
            for i in range(200):  # each a new alert: each rings the bell
                status, _ = await post(notification([alert(service="llm", fingerprint=f"{i:x}")]))
                assert status == 200
            await until_runs(2)  # the first of them ran the step at once
            while store.rung.is_set():  # the loop has heard the last of them
                await asyncio.sleep(0)
        assert runs == 2
        assert len(store.firing(L20, T0)) == 200  # the next tick reads every one
    finally:
        stop.set()
        assert await controller == 0
