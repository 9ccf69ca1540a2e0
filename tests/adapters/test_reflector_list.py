"""A list cut short: the page request it had asked for is over before the list is, so that no
request outlives the client it was made with."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

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
