"""Strategies: given what a pool looks like now, how many of its nodes should be lent.

A strategy only proposes. The planner (``rebalancer.core.planning``) owns the safety rules and
may refuse any part of a proposal. Strategies import nothing of ours but ``rebalancer.core``.

Use ``registry.build(name, params)``; ``registry.names()`` lists what is available.
"""
