"""The planner: the safety rules no strategy can bypass.

Where it sits: ``observe -> strategy.decide -> tick.plan_tick -> audit -> actuator.apply``.
``core.tick.plan_tick`` is the only way in: it checks each strategy's answer and calls
``plan_pool`` for one pool at a time, which takes the pool's snapshot, its Proposal and its
policy, and answers with a PoolPlan: the intents it considered, the steps to carry out and, for
every intent or part of one it refused, a Rejection with a reason code and a sentence. Nothing
is ever refused silently: for each intent, the nodes in its steps plus the counts in its
rejections equal its count.

How one pool is planned (``planner.plan_pool``), one module per stage:

1. ``reading``: every node is decoded once and demand is judged, into a ``Pool`` that does not
   change while the tick is decided (the values passed between the stages are in ``draft``);
2. ``intents``, in order of precedence: operators, safety, then the strategy. Each goes through
   the same three stages (``grant``), and what it decides lands in the ``Draft``, the plan being
   built, so that later intents see the steps of earlier ones:
   - ``candidates``: which nodes could take its steps, and the Reason each other one is excluded;
   - ``allowance``: how many steps the rules allow (pause, metrics, capacity, the per-tick limit),
     each rule refusing what it cuts;
   - ``steps``: the cheapest candidates, up to the allowance; what is allowed but finds no
     candidate is refused with the reasons the other nodes were excluded.
3. ``rooms``: the jobs the pool has room for, on nodes lent or lent now, are the pool's
   (``PoolPlan.served``): the pools planned after it lend nothing more for them.

``verdicts`` judges one node against every rule, as the planner would, for ``core.explain``.

The rules (the decisions behind each in ``docs/design/safety-rules.md``):

- pause: a global or pool pause, or a node's ``paused`` override, freezes the node(s) as they are;
- metrics: a missing or stale demand sample stops all lending; past the grace period every lent
  node is reclaimed. A missing sample is never read as zero load. Requests queueing beyond
  ``queue_limit`` stop lending too: serving is already short. A fall of demand faster than
  traffic falls (``core.demand``) is held, and nothing is lent while it is;
- capacity: never lend below ``min_serving``, below what demand needs with ``headroom``, or above
  ``max_lent_fraction`` of the pool; when demand rises above what serves, reclaim at once;
- only idle, ready nodes are lent: no inference pods, nothing but DaemonSets and borrowed pods;
- windows: outside its window (the pool's, or the node's override) a node is not lent, and a lent
  node is taken back;
- churn: a node is not lent again within ``cooldown`` of coming back; a strategy may not take a
  node back within ``min_loan``; strategy lends and reclaims are limited per tick.

Reclaims that protect inference (demand above serving, metrics lost, operator ``reclaim=now``,
window closed) ignore ``min_loan`` and the per-tick limit: inference comes first.

The metrics, demand-drop, headroom, lent-fraction, demand-above-serving and queue rules are
guards (``policy.Guard``): the controller always holds them all; only the simulator's
baselines run without, so that their own rule shows.
"""

from rebalancer.core.planning.candidates import NODE_RULES
from rebalancer.core.planning.planner import invalid_proposal, plan_pool, safety_only
from rebalancer.core.planning.verdicts import Verdict, node_rules

__all__ = ["NODE_RULES", "Verdict", "invalid_proposal", "node_rules", "plan_pool", "safety_only"]
