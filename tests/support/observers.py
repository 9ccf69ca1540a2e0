"""What the reports of a reconciler's ticks noted for the telemetry, kept tick after tick to
assert on (``runtime.report``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from rebalancer.core import model
from rebalancer.runtime.report import TickReport

T = TypeVar("T")


@dataclass
class Seen:
    """Each gauge as every tick measured it, and every event, in the order they came."""

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
    borrowing_minutes: list[str] = field(default_factory=list)  # a pool per minute lending cost
    budgets: list[dict[str, model.ErrorBudget]] = field(default_factory=list)

    def record(self, report: TickReport) -> TickReport:
        """Keep what ``report`` noted; ``report`` itself, to go on with."""
        noted = report.happened
        if noted.leader is not None:
            self.leader.append(noted.leader[1])
        _keep(self.lent, noted.lent)
        _keep(self.overdue, noted.overdue)
        _keep(self.safety_only, noted.safety_only)
        _keep(self.pressure, noted.frozen_under_pressure)
        _keep(self.held, noted.demand_held)
        _keep(self.unreadable, noted.unreadable)
        _keep(self.budgets, noted.budgets)
        self.steps += sum(len(plan.steps) for plan in noted.decided)
        self.audit_failures += noted.audit_failures
        self.reclaims += noted.reclaims
        self.strategy_failures += noted.strategy_failures
        self.planner_failures += noted.planner_failures
        self.borrowing_minutes += noted.borrowing_minutes
        return report


def _keep(readings: list[dict[str, T]], gauge: Mapping[str, T] | None) -> None:
    """A gauge's reading, when the tick measured it."""
    if gauge is not None:
        readings.append(dict(gauge))
