"""A fake vLLM exporter: what vLLM and kube-state-metrics would serve to a scraping Prometheus.

``Exporter`` serves, on 127.0.0.1, per inference pod ``vllm:request_success_total`` (a counter
advanced on the wall clock at ``rps`` requests per second in all, split evenly over the pods),
``vllm:num_requests_waiting`` (``waiting`` in all), ``vllm:num_requests_running``, and
``kube_pod_info`` joining each pod to its node, with the ``namespace``/``pod``/``node`` labels
the default queries of ``rebalancer.adapters.promql`` join on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Exporter:
    """The fake exporter's state; change ``rps`` and ``waiting`` while it runs."""

    pods: Mapping[str, str]  # "namespace/pod" -> node
    rps: float = 0.0
    waiting: int = 0
    total: float = 0.0  # requests completed so far, all pods together
    scrapes: int = 0
    _at: float = field(default_factory=time.monotonic)

    def advance(self) -> None:
        now = time.monotonic()
        self.total += self.rps * (now - self._at)
        self._at = now

    def set_load(self, rps: float, waiting: int) -> None:
        self.advance()  # the old rate holds up to now
        self.rps, self.waiting = rps, waiting

    def text(self) -> str:
        self.advance()
        self.scrapes += 1
        n = len(self.pods)
        families: dict[str, tuple[str, list[str]]] = {
            "vllm:request_success_total": ("counter", []),
            "vllm:num_requests_waiting": ("gauge", []),
            "vllm:num_requests_running": ("gauge", []),
            "kube_pod_info": ("gauge", []),
        }
        running = min(self.rps, 64.0)
        for i, (key, node) in enumerate(sorted(self.pods.items())):
            namespace, pod = key.split("/")
            who = f'namespace="{namespace}",pod="{pod}"'
            vllm = f'{who},model_name="llm"'
            share = self.waiting // n + (1 if i < self.waiting % n else 0)
            families["vllm:request_success_total"][1].append(f"{{{vllm}}} {self.total / n:.3f}")
            families["vllm:num_requests_waiting"][1].append(f"{{{vllm}}} {share}")
            families["vllm:num_requests_running"][1].append(f"{{{vllm}}} {running / n:.3f}")
            families["kube_pod_info"][1].append(f'{{{who},node="{node}",uid="uid-{pod}"}} 1')
        lines = []
        for name, (kind, series) in families.items():
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(name + s for s in series)
        return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def serve_exporter(exporter: Exporter) -> AsyncIterator[str]:
    """Serve ``/metrics`` until the block ends; yields ``host:port``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=exporter.text(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
