"""A simulated inference pool: nodes that lend and return the way the actuator makes them.

Each step of a plan is carried out with the node-state codec's own transitions
(``nodestate.begin_lend`` and so on), so the nodes the planner reads back carry exactly the
labels, taints and annotations a real cluster would. What the fake adds is physics that no
Kubernetes object shows: a reclaimed node drains for ``drain``, then its inference replica
cold-starts for ``warmup`` before it serves warm again. Whether a node serves warm is decided by
the planner's own rule (``core.warmth.is_warm``), so the minutes scored are the capacity the
planner counted.

A reclaim with a notice (docs/design/reclaim-notice.md) is written as the actuator writes it
(``nodestate.notice``): the node stays lent, and counted lent, until ``begin_due`` finds its time
has come (``core.notice.due``, from what its pods answered); its reclaim then begins as an
immediate one does. A withdrawn notice (``nodestate.withdraw``) leaves the node lent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from rebalancer.core import model, nodestate, notice, warmth

# What the borrowed pods of a node under notice answered, read at a minute (``jobs.Queue``).
Answers = Callable[[model.NodeView, datetime], Sequence[notice.Answer]]


class FakePool:
    def __init__(
        self,
        size: int,
        spec: nodestate.LendSpec,
        keys: nodestate.Keys,
        drain: timedelta,
        warmup: timedelta,
        prefix: str = "node",
        allocatable: model.Resources | None = None,
    ) -> None:
        serving_taints = spec.remove_taints
        self.spec, self.keys, self.drain, self.warmup = spec, keys, drain, warmup
        width = len(str(size - 1))
        self._nodes = {
            model.NodeName(f"{prefix}-{i:0{width}d}"): model.NodeView(
                name=model.NodeName(f"{prefix}-{i:0{width}d}"),
                labels={"gpu-pool": "inference", **spec.serving_labels},
                taints=serving_taints,
                allocatable=allocatable,
            )
            for i in range(size)
        }
        self._view: tuple[model.NodeView, ...] | None = None
        self._drained_at: dict[model.NodeName, datetime] = {}
        self._loans: dict[model.NodeName, datetime] = {}  # lent nodes, since when
        self.loan_minutes: list[float] = []  # durations of finished loans
        self._warming: set[model.NodeName] = set()  # back from a loan, maybe not warm yet
        self._noticed: dict[model.NodeName, datetime] = {}  # lent under notice: the deadline
        self.reclaims = 0  # reclaims begun: at once, or when a notice's time came

    def nodes(self) -> tuple[model.NodeView, ...]:
        if self._view is None:
            self._view = tuple(self._nodes.values())
        return self._view

    def apply(self, steps: tuple[model.Step, ...], now: datetime, decision: str) -> None:
        for step in steps:
            node = self._nodes[step.node]
            if step.action is model.Action.LEND:
                self._lend(node, now, decision)
            elif step.action is model.Action.WITHDRAW:
                self._withdraw(node, decision)
            elif step.notice > timedelta(0):
                self._notice(node, now + step.notice, decision)
            else:  # at once; a node under notice is cut short
                self._reclaim(node, now, decision)

    def begin_due(self, now: datetime, answers: Answers) -> list[model.NodeName]:
        """Begin the reclaims whose notice is up (``core.notice.due``: every borrowed pod
        answered, or the deadline less their grace has come), as an immediate reclaim begins,
        under the notice's own decision (the reclaim id); the nodes begun."""
        if not self._noticed:
            return []
        begun = []
        for name, deadline in list(self._noticed.items()):
            node = self._nodes[name]
            if notice.due(now, deadline, answers(node, now)) is not None:
                self._reclaim(node, now, self._state(node).decision or "")
                begun.append(name)
        return begun

    def noticed(self, name: model.NodeName) -> bool:
        """Whether ``name`` is lent under a reclaim notice."""
        return name in self._noticed

    @property
    def any_noticed(self) -> bool:
        return bool(self._noticed)

    def advance(self, now: datetime) -> None:
        """Finish the reclaims whose borrowed pods are gone (``drain`` after they began)."""
        for name, drained in list(self._drained_at.items()):
            if drained <= now:
                node = self._nodes[name]
                state = self._state(node)
                self._set(
                    nodestate.apply(
                        node,
                        nodestate.finish(
                            state, self.keys, drained, taints=node.taints, spec=self.spec
                        ),
                    )
                )
                del self._drained_at[name]
                self._warming.add(name)

    def counts(self, now: datetime) -> tuple[int, int, int]:
        """(serving warm, lent, returning) at ``now``."""
        lent = len(self._loans)
        for name in list(self._warming):  # few: only nodes back from a loan are looked at
            node = self._nodes[name]
            if warmth.is_warm(node, self._state(node), now, self.warmup):
                self._warming.discard(name)
        returning = len(self._drained_at) + len(self._warming)
        return len(self._nodes) - lent - returning, lent, returning

    def lent(self) -> tuple[model.NodeName, ...]:
        """The nodes lent now, in the order they were lent."""
        return tuple(self._loans)

    # Borrowed pods, for the training queue (``sandbox.sim.jobs``): the planner reads them on
    # their node as it reads a cluster's.

    def free(self, name: model.NodeName) -> model.Resources:
        """What ``name`` offers less what its pods hold (nothing when its room is unknown)."""
        node = self._nodes[name]
        if node.allocatable is None:
            return model.Resources()
        held = sum((p.requests for p in node.pods), model.Resources())
        return node.allocatable - held

    def add_pod(self, name: model.NodeName, pod: model.PodView) -> None:
        node = self._nodes[name]
        self._set(replace(node, pods=(*node.pods, pod)))

    def remove_pods(self, name: model.NodeName, job: str) -> None:
        """Take ``job``'s pods off ``name``: ended, or evicted by a reclaim."""
        node = self._nodes[name]
        self._set(replace(node, pods=tuple(p for p in node.pods if p.job != job)))

    def _lend(self, node: model.NodeView, now: datetime, decision: str) -> None:
        begun = nodestate.apply(
            node, nodestate.begin_lend(node, self.spec, self.keys, now, decision)
        )
        state = self._state(begun)
        self._set(nodestate.apply(begun, nodestate.finish_lend(self.spec, state, self.keys, now)))
        self._loans[node.name] = now
        # Lent back while still returning: it never got warm, and never will while lent.
        self._warming.discard(node.name)

    def _notice(self, node: model.NodeView, deadline: datetime, decision: str) -> None:
        self._set(nodestate.apply(node, nodestate.notice(self.keys, deadline, decision)))
        self._noticed[node.name] = deadline

    def _withdraw(self, node: model.NodeView, decision: str) -> None:
        self._set(nodestate.apply(node, nodestate.withdraw(self.keys, decision)))
        del self._noticed[node.name]

    def _reclaim(self, node: model.NodeView, now: datetime, decision: str) -> None:
        self._noticed.pop(node.name, None)
        self.reclaims += 1
        state = self._state(node)
        deadline = now + self.drain
        change = nodestate.begin_reclaim(
            state, self.keys, now, deadline, decision, taints=node.taints, spec=self.spec
        )
        self._set(nodestate.apply(node, change))
        self._drained_at[node.name] = deadline
        started = self._loans.pop(node.name)
        self.loan_minutes.append((now - started) / timedelta(minutes=1))

    def _state(self, node: model.NodeView) -> nodestate.NodeState:
        state = nodestate.read(node, self.keys)
        assert isinstance(state, nodestate.NodeState), f"the fake wrote {node.name}: {state}"
        return state

    def _set(self, node: model.NodeView) -> None:
        self._nodes[node.name] = node
        self._view = None
