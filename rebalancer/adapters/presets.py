"""The PromQL of the inference servers a pool may run: vLLM, SGLang, TGI and Triton.

Where it sits: a pool's settings name a preset (``metrics.preset``, vLLM unless told otherwise)
and a unit (``capacity.unit``); ``rebalancer.settings`` takes from here the templates the
metrics adapter evaluates (``rebalancer.adapters.metrics``) and that ``rebalancer capacity``
measures a node with (``rebalancer.commands.capacity``). This module is the one home of those
templates: the adapter's defaults, the settings' defaults and docs/configuration.md all come
from it. It is text only: importing it loads no HTTP client.

Each preset says, in its server's own metric names:

- per unit, how much a pod serves (``Reading``): requests completed per second, tokens
  generated per second, or requests in flight at once;
- which requests wait (the queue the safety rules read) and which run;
- which signal says a node is full: its waiting queue never empty over a whole step. A full
  KV cache or a full batch is what makes a server queue, so the queue shows both, in the same
  words on every server (docs/capacity.md, "When is a node full").

Counters are read as the default vLLM demand always was (docs/design/metrics.md, "Demand"):
``rate()`` for a series older than the window, the slope of its own samples for a younger
one, and only series scraped now. Gauges are read as sampled (the live query, at the time of
the pool's newest sample) and averaged over a step (history, capacity).

Templates use ``$scope`` (the pool's pods), and ``$window`` where a step is meant; see
``metrics.render``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from rebalancer.core.model import Unit

LIVE_RATE_WINDOW = "5m"  # the window of a counter's rate in the live demand query
WINDOW = "$window"  # the step, in history and capacity templates
_JOIN = "* on (namespace, pod) group_left (node) $scope"


class Engine(StrEnum):
    """The servers with a preset (``metrics.preset``)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    TRITON = "triton"


@dataclass(frozen=True)
class Gauge:
    """A per-pod gauge: ``selector`` as scraped, ``fold`` an aggregation that turns a pod's
    series into one reading where the server repeats it (SGLang, per tensor-parallel rank)."""

    selector: str
    fold: str = ""

    def now(self) -> str:
        return f"{self.fold} ({self.selector})" if self.fold else self.selector

    def over(self, function: str, window: str) -> str:
        """``function`` (``avg_over_time``, ``min_over_time``) of each series over ``window``,
        then folded."""
        inner = f"{function}({self.selector}[{window}])"
        return f"{self.fold} ({inner})" if self.fold else inner


@dataclass(frozen=True)
class Reading:
    """One unit's reading of a server, per pod.

    ``live``: the demand the controller reads each tick; ``demand``: the same over a step
    (``$window``), for the history; ``served``: what a pod served over a step, for measuring a
    node's capacity (the same as ``demand`` except in concurrent sequences, where demand counts
    the waiting requests too and a node serves only those it runs); ``sampled``: the raw
    selector whose scrape time says how fresh ``live`` is."""

    live: str
    demand: str
    served: str
    sampled: str


@dataclass(frozen=True)
class Preset:
    engine: Engine
    readings: Mapping[Unit, Reading]  # the units this server's own metrics can say
    waiting: Gauge  # requests queued, not yet running: the queue and the "full" signal
    running: Gauge | None  # requests running (reported, not planned with); None: not exported
    missing: Mapping[Unit, str]  # why a unit has no reading, for the error that names it


def counter_rate(counter: str, window: str) -> str:
    """Per series: ``rate()`` for a series ``window`` old, ``deriv()`` for a younger one
    without a reset, ``rate()`` for a younger one with one; only series scraped now."""
    c, w = counter, window
    return (
        f"(((rate({c}[{w}]) and {c} offset {w})"
        f" or (deriv({c}[{w}]) and resets({c}[{w}]) == 0)"
        f" or rate({c}[{w}]))"
        f" and {c})"
    )


def _counted(counter: str, scale: str = "") -> Reading:
    """A reading from a counter (``scale``: e.g. `` / 1e6`` for microseconds to seconds)."""
    live = counter_rate(counter, LIVE_RATE_WINDOW) + scale
    step = counter_rate(counter, WINDOW) + scale
    return Reading(live=live, demand=step, served=step, sampled=counter)


def _in_flight(running: Gauge, waiting: Gauge) -> Reading:
    """Concurrent sequences from the gauges: demand is what runs and what waits for a place,
    a node serves what runs."""
    runs, waits = running.over("avg_over_time", WINDOW), waiting.over("avg_over_time", WINDOW)
    return Reading(
        live=f"({running.now()} + {waiting.now()})",
        demand=f"({runs} + {waits})",
        served=runs,
        sampled=running.selector,
    )


VLLM_RUNNING = Gauge("vllm:num_requests_running")
VLLM_WAITING = Gauge("vllm:num_requests_waiting")
# SGLang's scheduler gauges carry ``tp_rank``: folded so a tensor-parallel server counts once.
_SGLANG_RUNNING = Gauge("sglang:num_running_reqs", "max without (tp_rank)")
_SGLANG_WAITING = Gauge("sglang:num_queue_reqs", "max without (tp_rank)")
_TGI_RUNNING = Gauge("tgi_batch_current_size")
_TGI_WAITING = Gauge("tgi_queue_size")
_TRITON_WAITING = Gauge("nv_inference_pending_request_count")

PRESETS: Mapping[Engine, Preset] = {
    Engine.VLLM: Preset(
        Engine.VLLM,
        {
            Unit.REQUESTS_PER_SECOND: _counted("vllm:request_success_total"),
            Unit.TOKENS_PER_SECOND: _counted("vllm:generation_tokens_total"),
            Unit.CONCURRENT_SEQUENCES: _in_flight(VLLM_RUNNING, VLLM_WAITING),
        },
        waiting=VLLM_WAITING,
        running=VLLM_RUNNING,
        missing={},
    ),
    Engine.SGLANG: Preset(
        Engine.SGLANG,
        {
            Unit.REQUESTS_PER_SECOND: _counted("sglang:num_requests_total"),
            Unit.TOKENS_PER_SECOND: _counted("sglang:generation_tokens_total"),
            Unit.CONCURRENT_SEQUENCES: _in_flight(_SGLANG_RUNNING, _SGLANG_WAITING),
        },
        waiting=_SGLANG_WAITING,
        running=_SGLANG_RUNNING,
        missing={},
    ),
    Engine.TGI: Preset(
        Engine.TGI,
        {
            Unit.REQUESTS_PER_SECOND: _counted("tgi_request_success"),
            # A histogram's sum counts a request's generated tokens when it ends.
            Unit.TOKENS_PER_SECOND: _counted("tgi_request_generated_tokens_sum"),
            Unit.CONCURRENT_SEQUENCES: _in_flight(_TGI_RUNNING, _TGI_WAITING),
        },
        waiting=_TGI_WAITING,
        running=_TGI_RUNNING,
        missing={},
    ),
    Engine.TRITON: Preset(
        Engine.TRITON,
        {
            Unit.REQUESTS_PER_SECOND: _counted("nv_inference_request_success"),
            # No gauge of requests running: by Little's law the time requests spent in the
            # server per second is how many were in it at once (queued and computing), and
            # the time computing per second how many it ran.
            Unit.CONCURRENT_SEQUENCES: Reading(
                live=counter_rate("nv_inference_request_duration_us", LIVE_RATE_WINDOW) + " / 1e6",
                demand=counter_rate("nv_inference_request_duration_us", WINDOW) + " / 1e6",
                served=counter_rate("nv_inference_compute_infer_duration_us", WINDOW) + " / 1e6",
                sampled="nv_inference_request_duration_us",
            ),
        },
        waiting=_TRITON_WAITING,
        running=None,
        missing={
            Unit.TOKENS_PER_SECOND: "Triton's own metrics count requests, not tokens; a "
            "TensorRT-LLM backend's token metrics differ from version to version",
        },
    ),
}


# ---------------------------------------------------------------------------------------------
# The templates, as the metrics adapter and the settings take them


def preset(engine: Engine | str) -> Preset:
    return PRESETS[Engine(engine)]


def demand_value(p: Preset, unit: Unit) -> str:
    return f"sum({p.readings[unit].live} {_JOIN})"


def demand_sampled(p: Preset, unit: Unit) -> str:
    return sampled(p.readings[unit].sampled)


def history(p: Preset, unit: Unit) -> str:
    return f"sum({p.readings[unit].demand} {_JOIN})"


def pooled(gauge: Gauge) -> str:
    """The gauge summed over the pool's pods (``queue``, ``running``)."""
    return f"sum({gauge.now()} {_JOIN})"


def node_served(p: Preset, unit: Unit) -> str:
    """Per node (one series per ``node`` label): what its pods served over ``$window``."""
    return f"sum by (node) ({p.readings[unit].served} {_JOIN})"


def node_saturated(p: Preset) -> str:
    """Per node: above zero when every pod of it had requests waiting at every scrape of
    ``$window`` (a queue that never emptied: the node was full all through the step)."""
    return f"min by (node) ({p.waiting.over('min_over_time', WINDOW)} {_JOIN})"


def sampled_for(p: Preset, value: str) -> str | None:
    """``sampled`` for a ``value`` written out with its ``sampled`` left out: the scrape times of
    the first of the preset's own series that ``value`` reads (so its freshness is that of an
    input of the value); None when it reads none of them, and then nothing sound can be said:
    ``timestamp()`` of the value itself is the time it is asked, never stale."""
    gauges = [g for g in (p.running, p.waiting) if g is not None]
    series = [*(r.sampled for r in p.readings.values()), *(g.selector for g in gauges)]
    for selector in dict.fromkeys(series):
        name = selector.split("{", 1)[0]
        if re.search(rf"(?<![A-Za-z0-9_:]){re.escape(name)}(?![A-Za-z0-9_:])", value):
            return sampled(selector)
    return None


def sampled(selector: str) -> str:
    """The scrape times of ``selector``'s series on the pool's pods: ``timestamp()`` of a
    plain selector is when it was scraped, not when it is asked (docs/design/metrics.md)."""
    return f"timestamp({selector}) and on (namespace, pod) $scope"
