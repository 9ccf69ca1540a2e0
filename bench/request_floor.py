"""What one API request costs the controller's process before any of the controller's own code:
the floor under a wave's CPU in ``bench/scale.py``.

The emulator runs in its own process (``bench/scale.py``'s, seeded at 500 nodes); this process
sends GETs of one node, then merge PATCHes of one label of it (the same value each time, as a
wave's writes carry a small body), three ways each, and prints the CPU and wall time per
request:

- through kubernetes-asyncio's generated API (``CoreV1Api.read_node``, ``patch_node``), as the
  actuator does;
- through the same client's ``rest_client`` (no generated code: the parameters already built);
- through the client's aiohttp session alone (no kubernetes-asyncio code at all).

Each is measured one request at a time and eight at a time (the actuator's default wave
concurrency). The body is read and released, never parsed, so the figure is the transport's.

    .venv/bin/python bench/request_floor.py [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import emulator

from rebalancer.adapters.kubeclient import api_client

Send = Callable[[], Awaitable[Any]]
MERGE = "application/merge-patch+json"


async def timed(send: Send, requests: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per request."""
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await send()
            await response.read()
            response.release()

    await asyncio.gather(*(one() for _ in range(50)))  # connections open, caches warm
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return 1000 * cpu / requests, 1000 * wall / requests


async def measure(kubeconfig: Path, requests: int) -> None:
    from kubernetes_asyncio import client

    async with api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        name = "inf-0-0"  # bench/scale.py's first node
        first: Any = await core.read_node(name, _preload_content=False)  # a raw response
        if first.status != 200:
            raise SystemExit(f"GET node/{name}: {first.status}")
        first.release()
        url = f"{api.configuration.host}/api/v1/nodes/{name}"
        ways: list[tuple[str, Send]] = [
            ("CoreV1Api.read_node", lambda: core.read_node(name, _preload_content=False)),
            (
                "ApiClient.rest_client",
                lambda: api.rest_client.request(
                    "GET", url, headers={"Accept": "application/json"}, _preload_content=False
                ),
            ),
            ("aiohttp session alone", lambda: api.rest_client.pool_manager.get(url)),
        ]
        patch = {"metadata": {"labels": {"bench.rebalancer.io/floor": "1"}}}
        patch_node: Any = core.patch_node  # its stubs do not know the client's _content_type
        body, merge = json.dumps(patch), {"Content-Type": MERGE, "Accept": "application/json"}
        writes: list[tuple[str, Send]] = [
            (
                "CoreV1Api.patch_node",
                lambda: patch_node(name, patch, _content_type=MERGE, _preload_content=False),
            ),
            (
                "ApiClient.rest_client",
                lambda: api.rest_client.request(
                    "PATCH", url, headers=merge, body=patch, _preload_content=False
                ),
            ),
            (
                "aiohttp session alone",
                lambda: api.rest_client.pool_manager.patch(url, data=body, headers=merge),
            ),
        ]
        for what, sends in (("GET of one node", ways), ("PATCH of one label", writes)):
            print(f"{what:26} {'at a time':>9} {'CPU ms':>8} {'wall ms':>8}")
            for label, send in sends:
                for concurrency in (1, 8):
                    cpu, wall = await timed(send, requests, concurrency)
                    print(f"{label:26} {concurrency:>9} {cpu:>8.3f} {wall:>8.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, emulator(500, Path(tmp)) as (kubeconfig, _):
        asyncio.run(measure(kubeconfig, args.requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
