"""Capacity rebalancer: lends idle inference GPU nodes to preemptible training.

The flow, in the words of the package layout:
``core`` (pure values and decisions) <- ``strategies`` (what to propose) <- ``sim``
(replays traces through the same planner). See ``docs/`` for the design.
"""

__version__ = "0.1.0"

from rebalancer import lazyclient

# Before anything of ours imports the Kubernetes client: its generated packages import each
# name when first used, not 832 modules up front (``rebalancer.lazyclient``).
lazyclient.install()
