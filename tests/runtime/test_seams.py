"""The runtime's seams are the real adapters' shapes: each function below is a type check that
mypy (``make test`` runs it on the tests) fails if an adapter drifts from the Protocol."""

from __future__ import annotations

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.leadership import LeaderElector
from rebalancer.adapters.metrics import Metrics
from rebalancer.runtime.seams import (
    AlwaysLeader,
    Leadership,
    MetricsSource,
    NodeActuator,
    Observer,
    ViewSource,
)
from rebalancer.runtime.telemetry import Telemetry


def as_leadership(elector: LeaderElector) -> Leadership:
    return elector


def as_actuator(actuator: Actuator) -> NodeActuator:
    return actuator


def as_views(informer: Informer) -> ViewSource:
    return informer


def as_metrics(metrics: Metrics) -> MetricsSource:
    return metrics


def as_observer(telemetry: Telemetry) -> Observer:
    return telemetry


def test_a_single_replica_without_election_always_leads() -> None:
    lead: Leadership = AlwaysLeader("solo")
    assert lead.may_write(lead.now())
    assert lead.term is None
    assert lead.identity == "solo"
