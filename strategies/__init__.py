"""Strategies: given what a pool looks like now, how many of its nodes should be lent.

A strategy only proposes. The planner (``rebalancer.core.planning``) owns the safety rules and
may refuse any part of a proposal. Strategies import nothing of ours but ``rebalancer.core``.

These are the built-ins. Each implements the contract in ``rebalancer.core.strategy`` and is
declared as a ``rebalancer.strategies`` entry point in the project's ``pyproject.toml``, exactly
as a team's own strategy is in theirs (docs/strategies.md); ``rebalancer.adapters.registry``
finds them all by name and imports a module only when its strategy is built.
"""
