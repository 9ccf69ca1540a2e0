"""A list cut short: the page request it had asked for is over before the list is, so that no
request outlives the client it was made with."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from rebalancer.adapters.reflector import Reflector, WatchSettings


class Page:
    """A first page of 1,000 pods and a continue token: the list pauses every 100 of them to let
    the next page's request go out, and is cut short at one of those pauses."""

    status = 200

    async def read(self) -> bytes:
        items = [{"metadata": {"name": f"pod-{i}"}} for i in range(1000)]
        return orjson.dumps({"metadata": {"continue": "next"}, "items": items})

    def release(self) -> None:
        pass


async def test_a_cancelled_list_returns_only_once_its_next_page_request_has_finished() -> None:
    asked = asyncio.Event()
    cleaned: list[bool] = []

    async def call(**query: Any) -> Page:
        if not query.get("_continue"):
            return Page()
        asked.set()
        try:
            await asyncio.Event().wait()  # the next page: a request still connecting
        finally:
            for _ in range(10):  # closing a connection takes turns of the loop
                await asyncio.sleep(0)
            cleaned.append(True)
        raise AssertionError("unreachable")

    async def no_sleep(_: float) -> None:
        return None

    reflector = Reflector(
        "pods", call, {}, lambda o: o, lambda _, o: None, lambda _: None, WatchSettings(), no_sleep
    )
    listing = asyncio.create_task(reflector._list())
    await asyncio.wait_for(asked.wait(), 5)
    listing.cancel()
    await asyncio.wait({listing})
    assert listing.cancelled()
    assert cleaned == [True]


# ---------------------------------------------------------------------------------------------
# The list as the first events of a watch (``sendInitialEvents``), and its fallbacks


def added(name: str) -> dict[str, Any]:
    return {"type": "ADDED", "object": {"metadata": {"name": name, "resourceVersion": "5"}}}


def bookmark(version: str, end: bool) -> dict[str, Any]:
    annotations = {"k8s.io/initial-events-end": "true"} if end else {}
    metadata = {"resourceVersion": version, "annotations": annotations}
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": metadata}}


class Stream:
    """A watch's answer: its events, one a line, then its end (or the status it is refused
    with)."""

    connection = None
    reason = "Unprocessable Entity"

    def __init__(self, events: list[dict[str, Any]], status: int = 200) -> None:
        self.status = status
        self.content = self
        self._lines = [orjson.dumps(e) + b"\n" for e in events]

    async def readline(self) -> bytes:  # from the buffer: no pause, as a fast server's stream
        return self._lines.pop(0) if self._lines else b""

    async def read(self) -> bytes:
        return b'{"kind":"Status","code":422,"message":"sendInitialEvents is forbidden"}'

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Server:
    """Answers the reflector's calls from a script: each streamed list's answer in turn, each
    page-by-page list's one page, and each plain watch's in turn (the last one held open)."""

    def __init__(self, streams: list[Stream], watches: list[Stream]) -> None:
        self.streams, self.watches = streams, watches
        self.asked: list[str] = []
        self.replaced: list[list[str]] = []
        self.applied: list[tuple[str, str]] = []
        self.done = asyncio.Event()

    async def call(self, **query: Any) -> Any:
        if query.get("send_initial_events"):
            assert query["resource_version_match"] == "NotOlderThan"
            assert query["allow_watch_bookmarks"]
            assert "resource_version" not in query
            self.asked.append("stream")
            return self.streams.pop(0)
        if query.get("watch"):
            self.asked.append(f"watch from {query['resource_version']}")
            if self.watches:
                return self.watches.pop(0)
            self.done.set()
            await asyncio.Event().wait()  # held open until the test ends
        self.asked.append("list")
        return Listed()

    def reflector(self) -> Reflector:
        async def no_sleep(_: float) -> None:
            return None

        return Reflector(
            "pods",
            self.call,
            {},
            lambda o: o["metadata"]["name"],
            lambda kind, name: self.applied.append((kind, name)),
            self.replaced.append,
            WatchSettings(),
            no_sleep,
        )

    async def run(self) -> Reflector:
        reflector = self.reflector()
        running = asyncio.create_task(reflector.run())
        try:
            await asyncio.wait_for(self.done.wait(), 5)
        finally:
            running.cancel()
            await asyncio.wait({running})
        return reflector


class Listed:
    """One page, the whole list, at resourceVersion 9."""

    status = 200

    async def read(self) -> bytes:
        return orjson.dumps({"metadata": {"resourceVersion": "9"}, "items": [added("p")["object"]]})

    def release(self) -> None:
        pass


async def test_a_streamed_list_replaces_the_cache_once_whole_and_the_watch_goes_on() -> None:
    events = [added("a"), bookmark("6", end=False), added("b"), bookmark("7", end=True)]
    events.append(
        {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "8"}}}
    )
    server = Server([Stream(events)], [])
    reflector = await server.run()

    assert server.replaced == [["a", "b"]]  # the bookmark within the list is no end
    assert server.applied == [("MODIFIED", "a")]
    assert server.asked == ["stream", "watch from 8"]  # resumed from the stream's last version
    assert (reflector.lists, reflector.watches) == (1, 1)  # the second is still being opened


async def test_a_server_that_refuses_to_stream_is_listed_by_page_and_asked_again_after_a_410() -> (
    None
):
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    server = Server([Stream([], status=422), Stream([], status=422)], [Stream([gone])])
    reflector = await server.run()

    assert server.asked == ["stream", "list", "watch from 9", "stream", "list", "watch from 9"]
    assert server.replaced == [["p"], ["p"]]
    assert reflector.lists == 2


@pytest.mark.parametrize(
    "events",
    [
        [added("a"), added("b")],  # the stream ended before the list did
        [added("a"), {"type": "DELETED", "object": {"metadata": {"name": "a"}}}],  # a change
    ],
    ids=["ended early", "a change first"],
)
async def test_a_stream_that_is_not_a_whole_list_never_reaches_the_cache_and_is_listed_by_page(
    events: list[dict[str, Any]],
) -> None:
    server = Server([Stream(events)], [])
    await server.run()

    assert server.asked == ["stream", "list", "watch from 9"]
    assert server.replaced == [["p"]]  # never the stream's "a" alone
    assert server.applied == []


async def test_a_long_streamed_list_lets_the_rest_of_the_process_run_while_it_is_read() -> None:
    turns: list[int] = []
    server = Server([Stream([added(f"p{i}") for i in range(1000)] + [bookmark("7", end=True)])], [])

    async def others() -> None:  # the lease's renewal, say
        while True:
            turns.append(len(server.replaced))
            await asyncio.sleep(0)

    running = asyncio.create_task(others())
    try:
        await server.run()
    finally:
        running.cancel()
    assert server.replaced == [[f"p{i}" for i in range(1000)]]
    assert turns.count(0) >= 9  # a turn every 100 events, at least, before the list was whole
