"""What one node of a pool serves when it is full, measured from the pool's own history.

Where it sits: ``rebalancer capacity`` (``commands.capacity``) reads, node by node and step by
step, what each node served in the pool's unit and whether its queue stayed non-empty all
through the step; ``measure`` turns those readings into a figure for ``capacity.per_node``
and says how far to trust it. Pure: readings in, a ``Measurement`` out.

Why only the steps a node was full: a node that has nothing waiting serves what it is sent,
which says how busy the pool was, not what a node can do. A node whose queue never emptied
for a whole step served as much as it could in that step: those steps are its capacity, seen.

Why a high quantile of them and not the highest: one step of unusually short requests, or a
counter's extrapolation at a series' edge, makes the highest figure an outlier; the steps
just after a queue built up, or with unusually long requests, pull the median down. The 0.9
quantile (``QUANTILE``) is what a full node served in all but its best tenth of steps.

What it cannot know, and says (``Measurement.limits``): a pool that was never full gives
only a lower bound (the most a node served, which it can at least serve); what a node
serves depends on the mix of prompt and output lengths in the steps measured; a pool of
different GPUs has no one figure (the nodes' own figures are shown when they differ); and
a full node is past its latency target (requests wait), so the figure is the most a node
serves, which the pool's ``headroom`` keeps serving nodes below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rebalancer.core.model import NodeName, Unit

QUANTILE = 0.9  # of the full node-steps' figures: the per-node capacity reported
FEW = 30  # full node-steps under which the figure is called rough
SPREAD = 0.25  # nodes whose own figures differ by more than this share are pointed out
NODE_FIGURE_STEPS = 5  # full steps a node needs before its own figure is compared with the others


@dataclass(frozen=True, slots=True)
class NodeFigure:
    """One node over the span: what it served when full, and the most it served otherwise."""

    node: NodeName
    steps: int  # steps with a reading of what it served
    full: int  # of which the node was full all through
    per_node: float | None  # the quantile of its full steps' figures; None: never full
    most: float | None  # the most it served in any step (at least what it can serve)


@dataclass(frozen=True, slots=True)
class Measurement:
    unit: Unit
    quantile: float
    step: timedelta
    per_node: float | None  # the quantile of every full node-step's figure; None: none full
    full: int  # node-steps in which a node was full all through
    steps: int  # node-steps with a reading of what the node served
    lower_bound: float | None  # never full: the most a node served in a step; None otherwise
    nodes: tuple[NodeFigure, ...]

    @property
    def spread(self) -> tuple[NodeFigure, NodeFigure] | None:
        """The nodes with the lowest and the highest own figure, when those differ by more
        than ``SPREAD`` (different GPUs, models or settings in one pool?); else None."""
        measured = [n for n in self.nodes if n.per_node is not None and n.full >= NODE_FIGURE_STEPS]
        if len(measured) < 2:
            return None
        low = min(measured, key=lambda n: n.per_node or 0.0)
        high = max(measured, key=lambda n: n.per_node or 0.0)
        assert low.per_node is not None
        assert high.per_node is not None
        return (low, high) if high.per_node > low.per_node * (1 + SPREAD) else None

    @property
    def suggested(self) -> float | None:
        """The ``per_node`` to write: the pool's figure, or, when its nodes differ, the weakest
        node's (one figure sizes every node alike, and the weakest is the one that queues)."""
        spread = self.spread
        return self.per_node if spread is None else spread[0].per_node

    def limits(self) -> list[str]:
        """What the figure cannot say, in words for the operator, the most pressing first."""
        symbol = self.unit.symbol
        said: list[str] = []
        if self.per_node is None:
            most = "nothing" if self.lower_bound is None else f"{self.lower_bound:.4g} {symbol}"
            said.append(
                "no node was full in any step (its queue never stayed non-empty for a whole "
                f"step), so this is only a lower bound: a node served at most {most}, and can "
                "serve at least that. Measure over a span with a peak that filled a node, or "
                "send one node more than it serves (a load test) until requests wait"
            )
        elif self.full < FEW:
            said.append(
                f"only {self.full} full node-steps: a rough figure; measure over a longer span"
            )
        spread = self.spread
        if spread is not None:
            low, high = spread
            said.append(
                f"the nodes differ: {high.node} serves {high.per_node:.4g} {symbol} when full, "
                f"{low.node} {low.per_node:.4g}. Different GPUs, models or server settings in "
                "one pool have no one figure: per_node sizes every node alike, so the weakest "
                "node's is the one to write, or split the pool by GPU type"
            )
        said.append(_MIX[self.unit])
        said.append(
            "a full node has requests waiting, so it is past its latency target: this is the "
            "most a node serves, and limits.headroom (0.2 by default) keeps serving nodes "
            "below it; lower it further if the pool's latency target is tight"
        )
        return said


_MIX = {
    Unit.REQUESTS_PER_SECOND: (
        "a request's cost grows with its prompt and its output: the figure holds for the mix "
        "of requests in the steps measured, and a mix of longer ones fills a node at fewer "
        "requests per second"
    ),
    Unit.TOKENS_PER_SECOND: (
        "prompts take the same GPU as generation: the figure holds for the prompt lengths of "
        "the steps measured, and longer prompts leave fewer tokens generated per second"
    ),
    Unit.CONCURRENT_SEQUENCES: (
        "how many sequences fit depends on their lengths (the KV cache holds every token of "
        "each): the figure holds for the lengths of the steps measured"
    ),
}


def measure(
    served: Mapping[NodeName, Sequence[float | None]],
    full: Mapping[NodeName, Sequence[float | None]],
    unit: Unit,
    step: timedelta,
    quantile: float = QUANTILE,
) -> Measurement:
    """A node's capacity in ``unit`` from ``served[node][i]`` (what the node served over step
    ``i``) and ``full[node][i]`` (above zero: its queue was never empty in step ``i``; ``None``
    or absent: not known, taken as not full)."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"a quantile is between 0 and 1, not {quantile}")
    figures: list[NodeFigure] = []
    pooled: list[float] = []
    most: float | None = None
    steps = 0
    for node in sorted(served):
        flags = full.get(node, ())
        seen = [(i, v) for i, v in enumerate(served[node]) if v is not None and math.isfinite(v)]
        when_full = [v for i, v in seen if i < len(flags) and (flags[i] or 0.0) > 0.0]
        node_most = max((v for _, v in seen), default=None)
        figures.append(
            NodeFigure(
                node=node,
                steps=len(seen),
                full=len(when_full),
                per_node=_quantile(when_full, quantile),
                most=node_most,
            )
        )
        pooled.extend(when_full)
        steps += len(seen)
        if node_most is not None:
            most = node_most if most is None else max(most, node_most)
    per_node = _quantile(pooled, quantile)
    return Measurement(
        unit=unit,
        quantile=quantile,
        step=step,
        per_node=per_node,
        full=len(pooled),
        steps=steps,
        lower_bound=most if per_node is None else None,
        nodes=tuple(figures),
    )


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile, linear between the closest ranks (numpy's default); None: empty."""
    if not values:
        return None
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    if low + 1 >= len(ordered):
        return ordered[-1]
    return ordered[low] + (h - low) * (ordered[low + 1] - ordered[low])
