"""Whether a serving node carries load now: the capacity the planner counts and lends from.

Where it sits: the planner (``planning``) counts serving capacity with ``is_warm``, and the
simulator's fake pool scores its minutes with the same function, so what is planned and what
is measured cannot drift apart.

Why: a node taken back from training is not serving when its reclaim ends. Its inference
replica has to be scheduled, pull its image and load its model, which takes minutes. Counting
it as capacity at once is how a rise turns into a breach: the strategy lends another node "in
its place" while it is still cold. So a serving node is warm when:

- it runs inference pods and every one of them is Ready (the pods' own condition, which the
  informer sees); a node whose replica is still starting is not warm, however long it takes;
- it runs none (the pool's inference pods cannot be seen on it, or none has landed yet): once
  ``warmup`` has passed since it came back (``since``, written when its reclaim ended), or at
  once if it never was lent. An idle node that has served this long is the capacity an
  autoscaler places replicas on, as the evaluation model assumes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rebalancer.core import model, nodestate


def is_warm(
    view: model.NodeView, state: nodestate.NodeState, now: datetime, warmup: timedelta
) -> bool:
    if state.phase is not nodestate.Phase.SERVING or not view.ready:
        return False
    if view.inference_ready is not None:
        return view.inference_ready
    return state.since is None or now - state.since >= warmup
