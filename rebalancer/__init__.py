"""Capacity rebalancer: lends idle inference GPU nodes to preemptible training.

The flow, in the words of the package layout:
``core`` (pure values and decisions) <- ``strategies`` (what to propose) <- ``sim``
(replays traces through the same planner). See ``docs/`` for the design.
"""

__version__ = "0.1.0"
