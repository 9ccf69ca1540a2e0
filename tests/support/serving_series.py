"""Inference servers whose capacity is known, as the series each server's own metrics would show.

For the presets' tests (``tests/adapters/test_presets.py``): a node runs one pod that serves at
most ``capacity`` requests a second, each request generating ``TOKENS`` tokens and taking
``SECONDS`` seconds (so ``SECONDS * capacity`` sequences run at once when it is full). Requests
arrive at ``load[m]`` a second in minute ``m``; what the node cannot serve waits in a queue.
Simulated second by second in whole requests, so every figure is exact:

- served in a second: ``min(capacity, waiting + arriving)``; the rest waits;
- running: what it served in the last second times ``SECONDS`` (Little's law);
- full: requests wait. While they do the node serves exactly ``capacity`` a second.

The pod is scraped every ``SCRAPE`` seconds at ``OFFSET`` past each boundary (never on a minute,
so no step's edge is in doubt), and the series are written under each server's metric names:
vLLM, SGLang (its scheduler gauges once per tensor-parallel rank, as SGLang exports them), TGI
(its counters without ``_total``, as its Rust exporter names them) and Triton (no running gauge;
its cumulative request and compute durations in microseconds). ``kube_pod_info`` puts each pod
on its node, ``kube_node_labels`` gives each node the label ``pool=<its pool>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

BASE = datetime(2024, 6, 3, tzinfo=UTC)
MINUTES = 100
SCRAPE = 15  # s
OFFSET = 8  # s past each 15 s boundary
TOKENS = 200  # generated per request
SECONDS = 4  # a request's time in the server once it runs

# Calm at 6 rps, then 16 for half an hour (over a 12 rps node: its queue grows), then 3.
SURGE = [6] * 30 + [16] * 30 + [3] * 40
CALM = [5 if m % 2 else 7 for m in range(MINUTES)]  # never more than a node serves


@dataclass(frozen=True)
class Node:
    """One node of ``pool`` running pod ``pod`` of ``engine``."""

    name: str
    pod: str
    pool: str
    engine: str
    capacity: int  # requests a second, when full
    load: Sequence[int]  # requests arriving a second, minute by minute

    @cached_property
    def seconds(self) -> list[tuple[int, int, int]]:
        """``(served so far, waiting, served in that second)`` after each second ``t``: index
        ``t`` is the state at time ``t`` (before second ``t`` is served)."""
        states = [(0, 0, 0)]
        total = waiting = 0
        for t in range(MINUTES * 60):
            arriving = self.load[t // 60]
            served = min(self.capacity, waiting + arriving)
            waiting += arriving - served
            total += served
            states.append((total, waiting, served))
        return states

    def scrapes(self) -> list[int]:
        return list(range(OFFSET, MINUTES * 60, SCRAPE))

    def waiting(self, t: int) -> int:
        return self.seconds[t][1]

    def running(self, t: int) -> int:
        return self.seconds[t][2] * SECONDS

    def full_steps(self) -> list[int]:
        """The minutes ``i`` in whose every scrape (in ``(60 i, 60 i + 60]``) requests waited."""
        return [
            i
            for i in range(MINUTES)
            if all(self.waiting(t) > 0 for t in self.scrapes() if 60 * i < t <= 60 * i + 60)
        ]

    def in_server_seconds(self, t: int) -> int:
        """Request-seconds spent in the server (waiting or running) up to ``t``."""
        return sum(w + s * SECONDS for _, w, s in self.seconds[1 : t + 1])

    def running_seconds(self, t: int) -> int:
        return sum(s * SECONDS for _, _, s in self.seconds[1 : t + 1])


NODES = [
    Node("gpu-vllm", "vllm-0", "vllm", "vllm", 12, SURGE),
    Node("gpu-sglang", "sglang-0", "sglang", "sglang", 12, SURGE),
    Node("gpu-tgi", "tgi-0", "tgi", "tgi", 12, SURGE),
    Node("gpu-triton", "triton-0", "triton", "triton", 12, SURGE),
    Node("gpu-calm", "calm-0", "calm", "vllm", 12, CALM),
    # Two GPU types in one pool: the same load, one node serves 12 a second, the other 8.
    Node("gpu-mixed-a", "mixed-a", "mixed", "vllm", 12, SURGE),
    Node("gpu-mixed-b", "mixed-b", "mixed", "vllm", 8, SURGE),
]


def at(t: float) -> datetime:
    return BASE + timedelta(seconds=t)


def openmetrics() -> str:
    base = int(BASE.timestamp())
    families: dict[str, list[str]] = {}

    def put(name: str, labels: str, value: float, t: int) -> None:
        families.setdefault(name, []).append(f"{name}{{{labels}}} {value:g} {base + t}")

    for node in NODES:
        pod = f'namespace="infer",pod="{node.pod}"'
        for t in node.scrapes():
            total, waiting, running = node.seconds[t][0], node.waiting(t), node.running(t)
            put("kube_pod_info", f'{pod},node="{node.name}"', 1, t)
            put("kube_node_labels", f'node="{node.name}",label_pool="{node.pool}"', 1, t)
            if node.engine == "vllm":
                model = f'{pod},model_name="m",engine="0"'
                put("vllm:request_success_total", f'{model},finished_reason="stop"', total, t)
                put("vllm:generation_tokens_total", model, total * TOKENS, t)
                put("vllm:num_requests_running", model, running, t)
                put("vllm:num_requests_waiting", model, waiting, t)
            elif node.engine == "sglang":
                put("sglang:num_requests_total", f'{pod},model_name="m"', total, t)
                put("sglang:generation_tokens_total", f'{pod},model_name="m"', total * TOKENS, t)
                for rank in ("0", "1"):
                    ranked = f'{pod},model_name="m",tp_rank="{rank}"'
                    put("sglang:num_running_reqs", ranked, running, t)
                    put("sglang:num_queue_reqs", ranked, waiting, t)
            elif node.engine == "tgi":
                put("tgi_request_success", pod, total, t)
                put("tgi_request_generated_tokens_sum", pod, total * TOKENS, t)
                put("tgi_batch_current_size", pod, running, t)
                put("tgi_queue_size", pod, waiting, t)
            else:
                model = f'{pod},model="m",version="1"'
                put("nv_inference_request_success", model, total, t)
                put("nv_inference_pending_request_count", model, waiting, t)
                put("nv_inference_request_duration_us", model, node.in_server_seconds(t) * 1e6, t)
                put(
                    "nv_inference_compute_infer_duration_us",
                    model,
                    node.running_seconds(t) * 1e6,
                    t,
                )
    lines: list[str] = []
    for name, samples in families.items():
        lines.append(f"# TYPE {name} unknown")
        lines += samples
    lines.append("# EOF")
    return "\n".join(lines) + "\n"
