"""A recording ``Observer`` for the Reconciler's tests: every call kept, to assert on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from rebalancer.core import model
from rebalancer.runtime.seams import NoObserver


@dataclass
class Seen(NoObserver):
    """An ``Observer`` that remembers what it was told, in the order it was told."""

    leader: list[bool] = field(default_factory=list)
    lent: list[dict[str, int]] = field(default_factory=list)
    overdue: list[dict[str, int]] = field(default_factory=list)
    steps: int = 0
    audit_failures: list[str] = field(default_factory=list)
    reclaims: list[tuple[str, datetime, datetime]] = field(default_factory=list)
    strategy_failures: list[tuple[str, str, str]] = field(default_factory=list)
    planner_failures: list[str] = field(default_factory=list)
    safety_only: list[dict[str, bool]] = field(default_factory=list)
    pressure: list[dict[str, bool]] = field(default_factory=list)
    held: list[dict[str, bool]] = field(default_factory=list)
    unreadable: list[dict[str, int]] = field(default_factory=list)
    costs: list[str] = field(default_factory=list)  # a pool per minute of borrowing cost
    budgets: list[dict[str, model.ErrorBudget]] = field(default_factory=list)

    def observe_borrowing_cost(self, pool: str) -> None:
        self.costs.append(pool)

    def observe_budgets(self, budgets: Mapping[str, model.ErrorBudget]) -> None:
        self.budgets.append(dict(budgets))

    def observe_strategy_failure(self, pool: str, strategy: str, kind: str) -> None:
        self.strategy_failures.append((pool, strategy, kind))

    def observe_planner_failure(self, pool: str) -> None:
        self.planner_failures.append(pool)

    def observe_safety_only(self, states: Mapping[str, bool]) -> None:
        self.safety_only.append(dict(states))

    def observe_frozen_under_pressure(self, states: Mapping[str, bool]) -> None:
        self.pressure.append(dict(states))

    def observe_demand_held(self, states: Mapping[str, bool]) -> None:
        self.held.append(dict(states))

    def observe_unreadable(self, counts: Mapping[str, int]) -> None:
        self.unreadable.append(dict(counts))

    def observe_lent(self, lent: Mapping[str, int]) -> None:
        self.lent.append(dict(lent))

    def observe_overdue(self, overdue: Mapping[str, int]) -> None:
        self.overdue.append(dict(overdue))

    def observe_plan(self, plan: model.Plan) -> None:
        self.steps += len(plan.steps)

    def observe_leader(self, identity: str, leading: bool) -> None:
        self.leader.append(leading)

    def observe_audit_failure(self, operation: str) -> None:
        self.audit_failures.append(operation)

    def observe_reclaim_done(self, pool: str, started: datetime, serving: datetime) -> None:
        self.reclaims.append((pool, started, serving))
