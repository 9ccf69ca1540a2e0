"""The runtime's seams are the real adapters' shapes: each function below is a type check that
mypy (``make test`` runs it on the tests) fails if an adapter drifts from the Protocol."""

from __future__ import annotations

from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.informer import Informer
from rebalancer.adapters.leadership import LeaderElector
from rebalancer.adapters.metrics import Metrics
from rebalancer.runtime.seams import (
    Leadership,
    MetricsSource,
    NodeActuator,
    ViewSource,
)


def as_leadership(elector: LeaderElector) -> Leadership:
    return elector


def as_actuator(actuator: Actuator) -> NodeActuator:
    return actuator


def as_views(informer: Informer) -> ViewSource:
    return informer


def as_metrics(metrics: Metrics) -> MetricsSource:
    return metrics
