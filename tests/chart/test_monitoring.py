"""The chart's monitoring, proven with the real tools: promtool, Prometheus and PostgreSQL.

- The ServiceMonitor selects the chart's Service and its ``http`` port; it and the
  PrometheusRule validate, strictly, against the operator's documented fields
  (``OPERATOR_SCHEMAS``).
- The PrometheusRule passes ``promtool check rules``, and ``promtool test rules`` runs cases for
  every alert, each with firing and quiet evaluations (``CASES``; an alert without both fails).
  The expected annotations are the rendered ones with the labels and value filled in, so the
  alert texts are executed too.
- The Grafana dashboard (with and without the PostgreSQL table) is valid JSON with unique panel
  ids, a datasource on every panel and target and an expression on every target; every PromQL
  expression and variable query of it runs on a real Prometheus (``tests/support/prometheus.py``)
  holding series exported by the controller's own ``Telemetry``, and returns data.
- The decisions SQL of the PostgreSQL panel runs on a real PostgreSQL whose schema the audit
  store's own migrations made, and returns the expected records in the expected order.
- Every ``rebalancer_*`` name in the alerts and the dashboard is one ``Telemetry`` exports.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from rebalancer.adapters.audit import SqlAuditStore
from rebalancer.core import clocks, model
from rebalancer.core.audit import AuditRecord, Kind
from rebalancer.core.model import PoolName
from rebalancer.core.outcomes import Notice, Outcome
from rebalancer.runtime.telemetry import Telemetry
from tests.support import grafana
from tests.support import prometheus as prom
from tests.support.chart import CHART, Doc, of_kind, one, render
from tests.support.factories import T0
from tests.support.grafana import dashboard, targets
from tests.support.postgres import PostgresServer

ON: dict[str, Any] = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}
POSTGRES: dict[str, Any] = {
    **ON,
    "audit": {"store": "postgresql", "postgresql": {"existingSecret": "rebalancer-db"}},
}
JOB = 'job="rebalancer", namespace="rebalancer"'  # what the default install's targets carry
METRIC = re.compile(r"\brebalancer_[a-z_]+\b")


def rules(values: Mapping[str, Any] = ON) -> dict[str, Doc]:
    """Alert name -> its rule, from the rendered PrometheusRule."""
    spec = one(render(values), "PrometheusRule")["spec"]
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}


# ---------------------------------------------------------------------------------------------
# What is rendered


def test_nothing_is_rendered_unless_enabled() -> None:
    docs = render({})
    assert not list(of_kind(docs, "ServiceMonitor"))
    assert not list(of_kind(docs, "PrometheusRule"))
    assert not [d for d in docs if d["metadata"]["name"].endswith("-dashboard")]


def test_servicemonitor_scrapes_the_services_api_port_with_a_token() -> None:
    values = {
        "monitoring": {
            "serviceMonitor": {
                "enabled": True,
                "labels": {"release": "kps"},
                "interval": "15s",
                "scrapeTimeout": "5s",
            }
        }
    }
    docs = render(values)
    sm, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == service["metadata"]["namespace"] == "rebalancer"
    assert sm["metadata"]["labels"]["release"] == "kps"
    wanted = sm["spec"]["selector"]["matchLabels"]
    assert wanted == service["spec"]["selector"]  # the chart's selector labels
    assert wanted.items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["rebalancer"]}
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint == {
        "port": "https",
        "path": "/metrics",
        "scheme": "https",
        "interval": "15s",
        "scrapeTimeout": "5s",
        # The chart's own scraper's token: get on /metrics, nothing else (test_api_access.py).
        "authorization": {
            "type": "Bearer",
            "credentials": {"name": "rebalancer-metrics-scraper-token", "key": "token"},
        },
        "tlsConfig": {"insecureSkipVerify": True},  # the controller's self-signed certificate
    }


def test_servicemonitor_verifies_a_mounted_certificate_and_takes_a_token_secret() -> None:
    values = {
        "http": {"tls": {"secretName": "rebalancer-tls"}},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "tokenSecret": {"name": "prometheus-token"}}
        },
    }
    docs = render(values)
    [endpoint] = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "prometheus-token", "key": "token"}
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "rebalancer-tls", "key": "ca.crt"}},
        "serverName": "rebalancer.rebalancer.svc",
    }
    # A Secret of the user's: no scraper of the chart's own.
    assert not [d for d in docs if d["metadata"]["name"].endswith("-metrics-scraper")]


def test_rules_select_the_servicemonitors_job() -> None:
    """prometheus-operator names the job after the Service: the rules must select that."""
    docs = render(ON, name="prod", namespace="gpu")
    service = one(docs, "Service")["metadata"]
    selector = f'job="{service["name"]}", namespace="{service["namespace"]}"'
    assert service["name"] == "prod-rebalancer"
    rule = one(docs, "PrometheusRule")
    for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        names = METRIC.findall(r["expr"]) + re.findall(r"\bup\b", r["expr"])
        assert r["expr"].count(selector) == len(names), r["expr"]


def test_the_rule_needs_the_servicemonitor() -> None:
    with pytest.raises(helm_python.HelmError, match=r"needs monitoring\.serviceMonitor\.enabled"):
        render({"monitoring": {"prometheusRule": {"enabled": True}}})


def test_rule_values() -> None:
    values = {
        "monitoring": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "kps"},
                "ruleLabels": {"team": "ml-infra", "severity": "ignored"},
                "runbookBaseUrl": "https://runbooks.example.com/rebalancer",
                "demandStaleSeconds": 300,
            },
        }
    }
    rule = one(render(values), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    for name, r in alerts.items():
        assert r["labels"]["team"] == "ml-infra"
        assert r["labels"]["severity"] in ("critical", "warning")  # the chart's, not the value
        assert r["annotations"]["runbook_url"] == (
            f"https://runbooks.example.com/rebalancer#{name.lower()}"
        )
    assert "rebalancer_demand_sample_age_seconds{" in alerts["RebalancerDemandStale"]["expr"]
    assert "} > 300)" in alerts["RebalancerDemandStale"]["expr"]


def test_runbook_anchors_exist() -> None:
    """Each alert's runbook_url names a section of docs/design/monitoring.md."""
    doc = (Path(__file__).parents[2] / "docs" / "design" / "monitoring.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", doc, re.MULTILINE)
    }
    for name, r in rules().items():
        base, _, anchor = r["annotations"]["runbook_url"].partition("#")
        # Absolute, at the release's own version of the doc: a link that works from an alert.
        version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        site = "https://github.com/rebalancer-project/rebalancer/blob"
        assert base == f"{site}/v{version}/docs/design/monitoring.md"
        assert anchor in anchors, f"{name}: no section #{anchor} in docs/design/monitoring.md"


# The two prometheus-operator kinds are not in Kubernetes' schemas. These are their fields as the
# operator's API reference (monitoring.coreos.com/v1) documents them, the ones a chart like this
# one may set, written out here and strict: a misspelt or misplaced field is an error.
DURATION = {
    "type": "string",
    "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    "(([0-9]+)ms)?)$",
}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRINGS,
        "annotations": STRINGS,
    },
}
SECRET_KEY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "name": {"type": "string"},
        "key": {"type": "string"},
        "optional": {"type": "boolean"},
    },
}
SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": STRINGS, "matchExpressions": {"type": "array"}},
}


def kind_schema(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
    }


OPERATOR_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": kind_schema(
        "ServiceMonitor",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "sampleLimit": {"type": "integer", "minimum": 0},
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": DURATION,
                            "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                            "params": {"type": "object"},
                            "authorization": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "type": {"type": "string"},
                                    "credentials": SECRET_KEY,
                                },
                            },
                            "tlsConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "ca": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {
                                            "secret": SECRET_KEY,
                                            "configMap": SECRET_KEY,
                                        },
                                    },
                                    "serverName": {"type": "string"},
                                    "insecureSkipVerify": {"type": "boolean"},
                                },
                            },
                        },
                    },
                },
            },
        },
    ),
    "PrometheusRule": kind_schema(
        "PrometheusRule",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": DURATION,
                            "limit": {"type": "integer"},
                            "labels": STRINGS,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "properties": {
                                        "record": {"type": "string"},
                                        "alert": {"type": "string"},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": DURATION,
                                        "keep_firing_for": DURATION,
                                        "labels": STRINGS,
                                        "annotations": STRINGS,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    ),
}


def operator_errors(doc: Doc) -> list[str]:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    validator = jsonschema.Draft7Validator(OPERATOR_SCHEMAS[doc["kind"]])
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@pytest.mark.parametrize(
    "values",
    [
        ON,
        {
            "monitoring": {
                "serviceMonitor": {
                    "enabled": True,
                    "labels": {"release": "kps"},
                    "interval": "1m",
                    "scrapeTimeout": "",
                },
                "prometheusRule": {
                    "enabled": True,
                    "labels": {"release": "kps"},
                    "ruleLabels": {"team": "ml"},
                    "demandStaleSeconds": 300,
                },
            }
        },
    ],
    ids=["defaults", "custom"],
)
def test_objects_match_the_operators_documented_fields(values: Mapping[str, Any]) -> None:
    docs = render(values)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert operator_errors(one(docs, kind)) == [], kind


def test_the_operator_field_check_bites() -> None:
    sm = one(render(ON), "ServiceMonitor")
    sm["spec"]["endpoints"][0]["scrapeTimeout"] = "10 seconds"
    sm["spec"]["endpoint"] = []
    errors = operator_errors(sm)
    assert len(errors) == 2, errors
    assert "spec: Additional properties are not allowed ('endpoint' was unexpected)" in errors
    assert any(
        e.startswith("spec/endpoints/0/scrapeTimeout: '10 seconds' does not match") for e in errors
    )


# ---------------------------------------------------------------------------------------------
# The alerts: promtool check rules, and promtool test rules with cases for each


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [prom.require("promtool"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def write_rules(directory: Path, values: Mapping[str, Any] = ON) -> Path:
    spec = one(render(values), "PrometheusRule")["spec"]
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "values",
    [
        ON,
        {
            "monitoring": {
                **ON["monitoring"],
                "prometheusRule": {
                    "enabled": True,
                    "ruleLabels": {"team": "x"},
                    "demandStaleSeconds": 90.5,
                },
            }
        },
    ],
    ids=["defaults", "custom"],
)
def test_rules_pass_promtool_check(tmp_path: Path, values: Mapping[str, Any]) -> None:
    done = promtool("check", "rules", str(write_rules(tmp_path, values)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules(values))} rules found" in done.stdout


@dataclass(frozen=True)
class Fire:
    """One firing alert: its labels (severity comes from the rule) and ``$value`` as printed."""

    labels: Mapping[str, str]
    value: str = ""
    humanized: str = ""  # ``$value | humanizeDuration``


@dataclass(frozen=True)
class Case:
    name: str
    series: Mapping[str, str]  # series -> promtool expanding notation, one sample a minute
    checks: tuple[tuple[str, tuple[Fire, ...]], ...]  # (eval time, the alerts firing then)


def s(name: str, **labels: str) -> str:
    """A series of the default install's job."""
    extra = "".join(f', {k}="{v}"' for k, v in labels.items())
    return f"{name}{{{JOB}{extra}}}"


TARGET = {"job": "rebalancer", "namespace": "rebalancer"}
POOL = {**TARGET, "pool": "l20"}


def up(a: str, b: str) -> dict[str, str]:
    return {s("up", pod="rebalancer-0"): a, s("up", pod="rebalancer-1"): b}


def leader(a: str, b: str) -> dict[str, str]:
    return {
        s("rebalancer_leader", pod="rebalancer-0", identity="rebalancer-0"): a,
        s("rebalancer_leader", pod="rebalancer-1", identity="rebalancer-1"): b,
    }


def age(pod: str, values: str, pool: str = "l20") -> dict[str, str]:
    return {s("rebalancer_demand_sample_age_seconds", pod=pod, pool=pool): values}


def failures(op: str, values: str) -> dict[str, str]:
    return {s("rebalancer_audit_store_failures_total", pod="rebalancer-0", operation=op): values}


def lent(l20: str, h100: str = "0x15") -> dict[str, str]:
    return {
        s("rebalancer_nodes_lent", pod=p, pool=pool): v
        for p in ("rebalancer-0", "rebalancer-1")
        for pool, v in (("l20", l20), ("h100", h100))
    }


def leading(name: str, values: str, follower: str = "0x20", **labels: str) -> dict[str, str]:
    """``name`` as the leader (rebalancer-0) and a follower (rebalancer-1) export it."""
    return {
        **leader("1x20", "0x20"),
        s(name, pod="rebalancer-0", **labels): values,
        s(name, pod="rebalancer-1", **labels): follower,
    }


def budget(spent: str, allowed: str, follower: str = "0x20") -> dict[str, str]:
    """Pool l20's error budget as the leader and a follower export it."""
    series = leading("rebalancer_error_budget_spent_minutes", spent, follower, pool="l20")
    for pod in ("rebalancer-0", "rebalancer-1"):
        series[s("rebalancer_error_budget_allowed_minutes", pod=pod, pool="l20")] = allowed
    return series


QUIET: tuple[Fire, ...] = ()
STALE_LEADER = {**POOL, "pod": "rebalancer-0"}
UNREADABLE_PODS = {**TARGET, "kind": "pod"}
POOL_APISERVER = {**POOL, "against": "apiserver"}

CASES: dict[str, list[Case]] = {
    "RebalancerDown": [
        Case("two replicas up", up("1x15", "1x15"), (("10m", QUIET),)),
        Case(
            "the follower alone is up: still running",
            up("1 1 stale", "1x15"),
            (("10m", QUIET),),
        ),
        Case(
            "every scrape fails: down after 5 minutes",
            up("0x15", "0x15"),
            (("4m", QUIET), ("5m", (Fire(TARGET),)), ("10m", (Fire(TARGET),))),
        ),
        Case(
            "the targets are gone (scaled to zero, not ready): down after 5 minutes",
            up("1 1 1 stale", "1 1 1 stale"),
            (("2m", QUIET), ("7m", QUIET), ("8m", (Fire(TARGET),))),
        ),
    ],
    "RebalancerNoLeader": [
        Case("a leader and a follower", leader("1x15", "0x15"), (("10m", QUIET),)),
        Case(
            "a handover with 2 minutes without a leader",
            leader("1 1 1 0 0 0 0 0 0 0 0", "0 0 0 0 0 1 1 1 1 1 1"),
            (("4m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "replicas run, none leads: after 5 minutes",
            leader("0x15", "0x15"),
            (("4m", QUIET), ("5m", (Fire(TARGET),))),
        ),
        Case("nothing scraped: RebalancerDown's business", up("0x15", "0x15"), (("10m", QUIET),)),
    ],
    "RebalancerSeveralLeaders": [
        Case("one leader", leader("0x15", "1x15"), (("10m", QUIET),)),
        Case(
            "a deposed leader says so one tick late",
            leader("1 1 1 1 1 0 0 0 0 0 0", "0 0 0 0 1 1 1 1 1 1 1"),
            (("4m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "two leaders for 5 minutes",
            leader("1x15", "1x15"),
            (("4m", QUIET), ("5m", (Fire(TARGET, value="2"),))),
        ),
    ],
    "RebalancerDemandStale": [
        Case(
            "fresh samples",
            {**leader("1x15", "0x15"), **age("rebalancer-0", "30x15")},
            (("10m", QUIET),),
        ),
        Case(
            "at the threshold, not above it",
            {**leader("1x15", "0x15"), **age("rebalancer-0", "120x15")},
            (("10m", QUIET),),
        ),
        Case(
            "the age grows 30 s a minute: above 120 s at 5m, firing from 6m",
            {**leader("1x15", "0x15"), **age("rebalancer-0", "0+30x15")},
            (
                ("5m", QUIET),
                ("6m", (Fire(STALE_LEADER, value="180", humanized="3m 0s"),)),
            ),
        ),
        Case(
            "no sample since the start (+Inf)",
            {**leader("1x15", "0x15"), **age("rebalancer-0", "Inf Inf Inf Inf Inf")},
            (("0m", QUIET), ("1m", (Fire(STALE_LEADER, value="+Inf", humanized="+Inf"),))),
        ),
        Case(
            "a stale follower next to a fresh leader",
            {
                **leader("1x15", "0x15"),
                **age("rebalancer-0", "30x15"),
                **age("rebalancer-1", "0+60x15"),
            },
            (("10m", QUIET),),
        ),
        Case(
            "the stale one leads",
            {
                **leader("0x15", "1x15"),
                **age("rebalancer-0", "30x15"),
                **age("rebalancer-1", "600x15"),
            },
            (("1m", (Fire({**POOL, "pod": "rebalancer-1"}, "600", "10m 0s"),)),),
        ),
    ],
    "RebalancerReclaimOverdue": [
        Case(
            "nothing overdue",
            {s("rebalancer_reclaims_overdue", pod="rebalancer-0", pool="l20"): "0x15"},
            (("10m", QUIET),),
        ),
        Case(
            "overdue for 3 minutes, then done",
            {s("rebalancer_reclaims_overdue", pod="rebalancer-0", pool="l20"): "0 1 1 1 0x10"},
            (("3m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "two nodes stuck, seen by both replicas: one alert after 5 minutes",
            {
                s("rebalancer_reclaims_overdue", pod=p, pool=pool): v
                for p in ("rebalancer-0", "rebalancer-1")
                for pool, v in (("l20", "2x15"), ("h100", "0x15"))
            },
            (("4m", QUIET), ("5m", (Fire(POOL, value="2"),))),
        ),
    ],
    "RebalancerAuditStoreFailingWhileLent": [
        Case(
            "ticks fail while l20 has nodes lent: firing 3 minutes after the second failure",
            {**lent("2x15"), **failures("tick", "1+1x15")},
            (("3m", QUIET), ("4m", (Fire(POOL, value="2"),))),
        ),
        Case(
            "ticks fail, nothing lent",
            {**lent("0x15"), **failures("tick", "1+1x15")},
            (("10m", QUIET),),
        ),
        Case(
            "only the API's reads fail",
            {**lent("2x15"), **failures("query", "1+1x15")},
            (("10m", QUIET),),
        ),
        Case(
            "nodes lent, an old failure count that does not grow",
            {**lent("2x15"), **failures("outcome", "4x15")},
            (("10m", QUIET),),
        ),
        Case(
            "the store recovers at 3m: the alert ends once 5 minutes pass without failures",
            {**lent("2x15"), **failures("supersede", "1 2 3 4x12")},
            (("4m", (Fire(POOL, value="2"),)), ("8m", QUIET)),
        ),
    ],
    "RebalancerAuditStoreFailing": [
        Case(
            "the leader's writes fail for 3 minutes, then the store takes them again",
            {s("rebalancer_audit_store_failing", pod="rebalancer-0"): "0 1 1 1 1 0x10"},
            (("2m", QUIET), ("3m", (Fire(TARGET),)), ("6m", QUIET)),
        ),
        Case(
            "the store works",
            {s("rebalancer_audit_store_failing", pod="rebalancer-0"): "0x15"},
            (("10m", QUIET),),
        ),
    ],
    "RebalancerAuditSpoolFull": [
        Case(
            "records refused at 2m: firing at once, quiet once 5 minutes pass without more",
            {s("rebalancer_audit_spool_overflows_total", pod="rebalancer-0"): "0 0 3x15"},
            (("1m", QUIET), ("2m", (Fire(TARGET),)), ("8m", QUIET)),
        ),
        Case(
            "an old count that does not grow",
            {s("rebalancer_audit_spool_overflows_total", pod="rebalancer-0"): "4x15"},
            (("10m", QUIET),),
        ),
    ],
    "RebalancerStrategyFailing": [
        Case(
            "every strategy answers",
            leading("rebalancer_pool_safety_only", "0x20", pool="l20"),
            (("10m", QUIET),),
        ),
        Case(
            "safety-only for 3 minutes, then the strategy answers again",
            leading("rebalancer_pool_safety_only", "0 1 1 1 0x16", pool="l20"),
            (("3m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "the leader plans l20 safety-only: after 5 minutes",
            leading("rebalancer_pool_safety_only", "1x20", "1x20", pool="l20"),
            (("4m", QUIET), ("5m", (Fire(POOL, value="1"),)), ("10m", (Fire(POOL, value="1"),))),
        ),
        Case(
            "only the follower says so (it decides nothing)",
            leading("rebalancer_pool_safety_only", "0x20", "1x20", pool="l20"),
            (("10m", QUIET),),
        ),
    ],
    "RebalancerFrozenUnderPressure": [
        Case(
            "frozen, but demand does not need the lent nodes",
            leading("rebalancer_frozen_under_pressure", "0x20", pool="l20"),
            (("10m", QUIET),),
        ),
        Case(
            "held for a minute, then the freeze is lifted",
            leading("rebalancer_frozen_under_pressure", "0 1 1 0x17", pool="l20"),
            (("2m", QUIET), ("3m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "held while demand needs the nodes: after 2 minutes",
            leading("rebalancer_frozen_under_pressure", "1x20", pool="l20"),
            (("1m", QUIET), ("2m", (Fire(POOL, value="1"),))),
        ),
        Case(
            "only the follower says so",
            leading("rebalancer_frozen_under_pressure", "0x20", "1x20", pool="l20"),
            (("10m", QUIET),),
        ),
    ],
    "RebalancerErrorBudgetSpent": [
        Case("minutes spent, fewer than allowed", budget("0 1 2 3x17", "10x20"), (("10m", QUIET),)),
        Case(
            "the budget is reached: after a minute",
            budget("8 9 10x18", "10x20"),
            (("2m", QUIET), ("3m", (Fire(POOL, value="10"),))),
        ),
        Case("a budget of zero, nothing spent", budget("0x20", "0x20"), (("10m", QUIET),)),
        Case("only the follower counts minutes", budget("0x20", "5x20", "7x20"), (("10m", QUIET),)),
    ],
    "RebalancerClockUntrusted": [
        Case(
            "the clocks can be trusted",
            leading("rebalancer_clock_untrusted", "0x20", pool="l20", against="apiserver"),
            (("10m", QUIET),),
        ),
        Case(
            "past the bound for a minute, then back",
            leading("rebalancer_clock_untrusted", "1 1 0x18", pool="l20", against="apiserver"),
            (("2m", QUIET), ("10m", QUIET)),
        ),
        Case(
            "past the bound: after 2 minutes, naming the clock",
            leading("rebalancer_clock_untrusted", "1x20", pool="l20", against="apiserver"),
            (("1m", QUIET), ("2m", (Fire(POOL_APISERVER, value="1"),))),
        ),
        Case(
            "only the follower's clock is off (the leader decides)",
            leading("rebalancer_clock_untrusted", "0x20", "1x20", pool="l20", against="apiserver"),
            (("10m", QUIET),),
        ),
    ],
    "RebalancerUnreadableObjects": [
        Case(
            "everything reads",
            {
                **leading("rebalancer_objects_unreadable", "0x20", kind="node"),
                **leading("rebalancer_objects_unreadable", "0x20", kind="pod"),
            },
            (("16m", QUIET),),
        ),
        Case(
            "a pod unreadable for 10 minutes, then fixed",
            leading("rebalancer_objects_unreadable", "1x10 0x10", kind="pod"),
            (("10m", QUIET), ("16m", QUIET)),
        ),
        Case(
            "two pods unreadable: after 15 minutes, one alert for the kind",
            {
                **leading("rebalancer_objects_unreadable", "0x20", "0x20", kind="node"),
                **leading("rebalancer_objects_unreadable", "2x20", "2x20", kind="pod"),
            },
            (("14m", QUIET), ("15m", (Fire(UNREADABLE_PODS, value="2"),))),
        ),
        Case(
            "only the follower cannot read them (the leader decides)",
            leading("rebalancer_objects_unreadable", "0x20", "3x20", kind="pod"),
            (("16m", QUIET),),
        ),
    ],
}


def expected_annotations(rule: Doc, fire: Fire) -> dict[str, str]:
    """The rule's annotations as Prometheus prints them for ``fire``."""
    out: dict[str, str] = {}
    for key, template in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: fire.labels[m[1]], template)
        text = text.replace("{{ $value | humanizeDuration }}", fire.humanized)
        text = text.replace("{{ $value }}", fire.value)
        assert "{{" not in text, f"a template this test does not fill in: {text}"
        out[key] = text
    return out


def unit_tests(alert: str, rule: Doc) -> dict[str, Any]:
    tests = []
    for case in CASES[alert]:
        checks = []
        for at, fires in case.checks:
            exp = [
                {
                    "exp_labels": {**f.labels, "severity": rule["labels"]["severity"]},
                    "exp_annotations": expected_annotations(rule, f),
                }
                for f in fires
            ]
            checks.append({"eval_time": at, "alertname": alert, "exp_alerts": exp})
        tests.append(
            {
                "name": f"{alert}: {case.name}",
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in case.series.items()],
                "alert_rule_test": checks,
            }
        )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def test_every_alert_has_firing_and_quiet_cases() -> None:
    assert set(CASES) == set(rules())
    for alert, cases in CASES.items():
        checks = [fires for case in cases for _, fires in case.checks]
        assert any(checks), f"{alert}: no case where it fires"
        assert not all(checks), f"{alert}: no case where it stays quiet"


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_with_promtool(tmp_path: Path, alert: str) -> None:
    write_rules(tmp_path)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(unit_tests(alert, rules()[alert])))
    done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_catches_a_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: the same cases with the firing time one minute early do."""
    write_rules(tmp_path)
    doc = unit_tests("RebalancerReclaimOverdue", rules()["RebalancerReclaimOverdue"])
    for test in doc["tests"]:
        for check in test["alert_rule_test"]:
            if check["exp_alerts"]:
                check["eval_time"] = "4m"
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(doc))
    done = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# Metric names


def exported_names() -> set[str]:
    """Every series name the controller's Telemetry exports."""
    names: set[str] = set()
    for family in Telemetry().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names


def test_every_metric_name_used_is_exported() -> None:
    exported = exported_names()
    used_in_rules = {n for r in rules().values() for n in METRIC.findall(r["expr"])}
    dash = dashboard(POSTGRES)
    used_in_dash = {n for _, t in targets(dash) for n in METRIC.findall(t.get("expr", ""))}
    used_in_dash |= {
        n for v in dash["templating"]["list"] for n in METRIC.findall(v.get("definition", ""))
    }
    assert used_in_rules - exported == set()
    assert used_in_dash - exported == set()
    assert used_in_rules >= {
        "rebalancer_leader",
        "rebalancer_demand_sample_age_seconds",
        "rebalancer_reclaims_overdue",
        "rebalancer_nodes_lent",
        "rebalancer_audit_store_failures_total",
        "rebalancer_pool_safety_only",
        "rebalancer_frozen_under_pressure",
        "rebalancer_objects_unreadable",
    }
    # every family is on the dashboard
    assert {n.removesuffix("_bucket").removesuffix("_count") for n in used_in_dash} >= {
        n for n in exported if not n.endswith(("_sum", "_count", "_bucket"))
    } | {"rebalancer_reclaim_duration_seconds"}


# ---------------------------------------------------------------------------------------------
# The dashboard's structure


def test_dashboard_configmap() -> None:
    values = {
        "monitoring": {
            "dashboard": {
                "enabled": True,
                "labels": {"grafana_dashboard": "1", "team": "ml"},
                "annotations": {"grafana_folder": "GPU"},
                "namespace": "monitoring",
            }
        }
    }
    docs = render(values, name="prod", namespace="gpu")
    [cm] = [
        d
        for d in of_kind(docs, "ConfigMap")
        if d["metadata"]["name"] == "prod-rebalancer-dashboard"
    ]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["team"] == "ml"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert list(cm["data"]) == ["rebalancer.json"]
    dash = json.loads(cm["data"]["rebalancer.json"])
    assert dash["title"] == "Rebalancer (gpu/prod-rebalancer)"
    assert len(dash["uid"]) <= 40
    current = {v["name"]: v["current"] for v in dash["templating"]["list"]}
    assert current["namespace"] == {"text": "gpu", "value": "gpu"}
    assert current["job"] == {"text": "prod-rebalancer", "value": "prod-rebalancer"}
    # another release gets another uid; the default sidecar label and the release's namespace
    other = render({"monitoring": {"dashboard": {"enabled": True}}}, name="b", namespace="gpu")
    [cm2] = [d for d in of_kind(other, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm2["metadata"]["namespace"] == "gpu"
    assert cm2["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm2["data"]["rebalancer.json"])["uid"] != dash["uid"]


@pytest.mark.parametrize("threshold", [None, 300])
def test_the_age_panel_draws_the_alerts_threshold(threshold: int | None) -> None:
    values: dict[str, Any] = {"monitoring": {**ON["monitoring"]}}
    if threshold is not None:
        values["monitoring"]["prometheusRule"] = {"enabled": True, "demandStaleSeconds": threshold}
    expr = rules(values)["RebalancerDemandStale"]["expr"]
    [alert_threshold] = re.findall(r"\} > ([0-9.]+)\)", expr)
    [panel] = [p for p in dashboard(values)["panels"] if p["title"].startswith("Demand sample age")]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == float(alert_threshold) == (threshold or 120)


@pytest.mark.parametrize("values", [ON, POSTGRES], ids=["sqlite", "postgresql"])
def test_dashboard_is_valid(values: Mapping[str, Any]) -> None:
    dash = dashboard(values)
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert len(variables) == len(dash["templating"]["list"])
    kinds = {"prometheus": "datasource", "grafana-postgresql-datasource": "audit_datasource"}
    for panel in panels:
        assert panel["title"], panel["id"]
        assert panel["description"], panel["title"]
        ds = panel["datasource"]
        assert ds["uid"] == "${" + kinds[ds["type"]] + "}", panel["title"]
        assert variables[kinds[ds["type"]]]["type"] == "datasource"
        assert variables[kinds[ds["type"]]]["query"] == ds["type"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for t in panel["targets"]:
            assert t["datasource"] == ds, panel["title"]
            text = t["expr"] if ds["type"] == "prometheus" else t["rawSql"]
            assert text.strip(), panel["title"]
            for var in re.findall(r"\$(?!__)\{?(\w+)", text):
                assert var in variables, f"{panel['title']}: ${var} is not a variable"
    # no two panels overlap on the 24-column grid
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_the_audit_table_only_with_postgresql() -> None:
    def sql_panels(dash: Mapping[str, Any]) -> list[str]:
        return [p["title"] for p in dash["panels"] if "rawSql" in p["targets"][0]]

    sqlite, postgres = dashboard(ON), dashboard(POSTGRES)
    assert sql_panels(sqlite) == []
    assert "audit_datasource" not in {v["name"] for v in sqlite["templating"]["list"]}
    assert sql_panels(postgres) == ["Recent decisions (audit store)"]
    assert "audit_datasource" in {v["name"] for v in postgres["templating"]["list"]}
    assert len(postgres["panels"]) == len(sqlite["panels"]) + 1


# ---------------------------------------------------------------------------------------------
# The dashboard's PromQL on a real Prometheus, over series the real Telemetry exported

PODS = ("rebalancer-0", "rebalancer-1")  # rebalancer-0 leads
POOLS = ("l20", "h100")


@dataclass(frozen=True)
class Site:
    """One cluster's controller, as a fleet's Prometheus servers see its series."""

    cluster: str | None  # the label Prometheus adds; None: one cluster's own Prometheus
    namespace: str
    leader: str
    more_lent: int = 0  # added to each pool's lent count, to tell the sites apart
    follower_safety_only: bool = False  # the follower says l20 is safety-only (it decides nothing)
    idle: bool = False  # healthy, and nothing to do: no loan, no reclaim, no decision, no slo


# Two clusters of a fleet, with the same namespace, job and pod names (in "us" the other replica
# leads), a third controller whose Prometheus adds no cluster label (in namespace "solo"), and a
# second release in eu that has had nothing to do for the three hours (in namespace "idle").
SITES = (
    Site("eu", "rebalancer", "rebalancer-0"),
    Site("us", "rebalancer", "rebalancer-1", more_lent=5, follower_safety_only=True),
    Site(None, "solo", "rebalancer-0"),
    Site("eu", "idle", "rebalancer-0", idle=True),
)
AT = prom.scrape_time(prom.MINUTES - 10)  # where the expressions are evaluated
GRAFANA = {  # Grafana's variables and macros as a panel over the whole window would have them
    "$__rate_interval": "4m",  # 4 scrape intervals of 1 m
    "$__interval": "1m",
    "$__range": "3h",
    "$cluster": "eu",  # one cluster selected
    "$namespace": "rebalancer",
    "$job": "rebalancer",
    "$pool": "(l20|h100)",  # a multi-value variable in a regex matcher
}


Family = tuple[str, str, list[tuple[str, dict[str, str], float]]]  # name, type, samples


def telemetry_series() -> str:
    """OpenMetrics of each site's two replicas' ``Telemetry`` (their /metrics), one scrape a
    minute, with the target labels a fleet's Prometheus gives them."""
    families: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], list[str]]]] = {}

    def scrape(site: Site, pod: str, exported: Telemetry, when: datetime) -> None:
        ts = int(when.timestamp())
        up: Family = ("up", "gauge", [("up", {}, 1.0)])
        collected: list[Family] = [
            (f.name, f.type, [(x.name, x.labels, x.value) for x in f.samples])
            for f in exported.exposed.collect()
        ]
        target = {"job": "rebalancer", "namespace": site.namespace, "pod": pod}
        if site.cluster is not None:
            target["cluster"] = site.cluster
        for name, kind, samples in [up, *collected]:
            _, series = families.setdefault(name, (kind, {}))
            for sample, labels, value in samples:
                full = {**target, **labels}
                key = tuple(sorted((k, v) for k, v in full.items() if k != "le"))
                text = ",".join(f'{k}="{v}"' for k, v in full.items())
                number = "+Inf" if value == math.inf else repr(value)
                series.setdefault(key, []).append(f"{sample}{{{text}}} {number} {ts}")

    for site in SITES:
        exported = {pod: Telemetry(cluster=site.cluster or "default") for pod in PODS}
        for t in exported.values():
            t.prepare(dict.fromkeys(POOLS, "forecast"))  # as the controller does at start
        for k in range(prom.MINUTES):
            now = prom.scrape_time(k)
            for pod, t in exported.items():
                play(t, pod, k, now, site)
                scrape(site, pod, t, now)

    lines = []
    for name, (kind, series) in families.items():
        lines.append(f"# TYPE {name} {kind}")
        for samples in series.values():
            lines.extend(samples)
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


ZERO = timedelta(0)


def play(t: Telemetry, pod: str, k: int, now: datetime, site: Site) -> None:
    """What replica ``pod`` of ``site`` is told at minute ``k``."""
    leading = pod == site.leader
    t.set_leader(pod, leading)
    if site.idle:
        idle(t, now)
        return
    t.set_lent(
        {"l20": (k // 20) % 4 + site.more_lent, "h100": (1 if k >= 60 else 0) + site.more_lent}
    )
    t.set_overdue({"l20": 1 if 100 <= k < 110 else 0, "h100": 0})
    t.set_demand_age("l20", model.Sample(float(k), now - timedelta(seconds=40)), now)
    sampled = min(k, 150)  # h100's demand stops at minute 150: its age grows
    h100 = model.Sample(2.0, prom.scrape_time(sampled) - timedelta(seconds=40))
    t.set_demand_age("h100", h100, now)
    follower_says = site.follower_safety_only and not leading
    t.set_safety_only({"l20": 30 <= k < 40 or follower_says, "h100": False})
    t.set_frozen_under_pressure({"l20": False, "h100": 70 <= k < 75})
    t.set_demand_held({"l20": k % 50 == 7, "h100": False})
    t.set_unreadable({"node": 0, "pod": 1 if 80 <= k < 90 else 0})
    off = timedelta(seconds=40 if 60 <= k < 70 else 0.2)  # the API server's clock, for a while
    api_skew = clocks.Skew(clocks.Against.APISERVER, off, timedelta(seconds=0.5), 5, now)
    prom_skew = clocks.Skew(clocks.Against.PROMETHEUS, timedelta(seconds=0.01), ZERO, 5, now)
    measured = clocks.Clocks((api_skew, prom_skew))
    t.set_clocks({PoolName(pool): measured for pool in ("l20", "h100")})
    if leading:
        if 30 <= k < 40:
            t.strategy_failed("l20", "forecast", "raised")
        if k == 140:
            t.planner_failed("h100")
        t.decisions.labels("l20", "step", "lend", "strategy").inc()
        if k % 3 == 0:
            t.decisions.labels("h100", "refusal", "lend", "cooldown").inc()
        if k % 10 == 5:
            pool = POOLS[(k // 10) % 2]
            t.reclaim_done(pool, now - timedelta(seconds=20 + 9 * k), now)
            # half of them noticed five minutes ahead, answered in 90 s; one pod of 8 GPUs
            # evicted unanswered ten minutes past its checkpoint, one that never reported
            given = 300.0 if k % 20 == 5 else 0.0
            answers = (90.0,) if given else ()
            t.noticed(pool, Notice("r", given, 3, len(answers), answers, 8 * 600.0, 1, "why"))
        if 120 <= k < 130:
            t.audit_failed("tick")
        t.set_audit_store(120 <= k < 130, max(0, min(k, 130) - 119) * 3 if k < 131 else 0)
        if k == 128:
            t.spool_overflowed()
        # a node of l20 relabelled out of every pool for five minutes, then taken back
        t.node_drift.labels("l20", "orphaned").set(1 if 90 <= k < 95 else 0)
        decide(t, k, now)
        if 60 <= k < 66:  # six minutes of h100 queueing with a node lent
            t.borrowing_minute("h100")
        # h100 has an slo of 10 minutes a week; the six minutes stay in its window
        spent = min(6, max(0, k - 59))
        t.set_budgets({"h100": model.ErrorBudget(10, timedelta(days=7), spent)})
    elif k == 50:
        t.audit_failed("query")


def idle(t: Telemetry, now: datetime) -> None:
    """What a healthy replica with nothing to do is told each tick: fresh demand, nothing lent,
    nothing overdue or held, clocks in step, the store writing, a plan with no step (which
    counts no decision and sets each pool's drift to 0); no pool with an slo."""
    t.set_lent(dict.fromkeys(POOLS, 0))
    t.set_overdue(dict.fromkeys(POOLS, 0))
    for pool in POOLS:
        t.set_demand_age(pool, model.Sample(1.0, now - timedelta(seconds=20)), now)
    for flags in (t.set_safety_only, t.set_frozen_under_pressure, t.set_demand_held):
        flags(dict.fromkeys(POOLS, False))
    t.set_unreadable({"node": 0, "pod": 0})
    skew = clocks.Skew(clocks.Against.APISERVER, timedelta(seconds=0.1), ZERO, 5, now)
    t.set_clocks({PoolName(pool): clocks.Clocks((skew,)) for pool in POOLS})
    t.set_audit_store(False, 0)
    t.set_budgets({})
    quiet = {PoolName(p): model.PoolPlan(PoolName(p), (), (), (), (), "steady") for p in POOLS}
    t.count_decisions(model.Plan(now, quiet))


# The leader's decisions, as its audit log tells the telemetry: (minute, pool, node, action,
# origin, reason, the outcome or None for the intent, and the intent's id).
DECISIONS = (
    (100, "l20", "gpu-1", "reclaim", "safety", "demand_above_serving", None, "D100"),
    (101, "l20", "gpu-1", "reclaim", "safety", "demand_above_serving", "in_progress", "D100"),
    (103, "l20", "gpu-1", "reclaim", "safety", "demand_above_serving", "applied", "D100"),
    (160, "h100", "gpu-2", "lend", "strategy", "strategy", None, "D160"),  # no outcome yet
    (165, "l20", "gpu-1", "lend", "operator", "operator_lend_now", None, "D165"),
    (165, "l20", "gpu-1", "lend", "operator", "operator_lend_now", "applied", "D165"),
)


def decide(t: Telemetry, k: int, now: datetime) -> None:
    """The records of ``DECISIONS`` made at minute ``k``, told to the telemetry."""
    for minute, pool, node, action, origin, reason, outcome, intent in DECISIONS:
        if minute == k:
            kind = Kind.INTENT if outcome is None else Kind.OUTCOME
            t.audited(
                AuditRecord(
                    id=intent if outcome is None else f"{intent}-{outcome}",
                    time=now,
                    kind=kind,
                    pool=pool,
                    controller="rebalancer-0",
                    reason=reason,
                    message="",
                    node=node,
                    action=model.Action(action),
                    origin=model.Origin(origin),
                    outcome=None if outcome is None else Outcome(outcome),
                    intent_id=None if outcome is None else intent,
                )
            )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """tests/support/prometheus.py's Prometheus, its backfill extended with our series."""
    workdir = tmp_path_factory.mktemp("prometheus")
    store = workdir / "data"
    shutil.copytree(blocks(tmp_path_factory), store)
    with prom.serving(workdir, store) as (url, _, _):
        yield url


def blocks(factory: pytest.TempPathFactory) -> Path:
    """The TSDB blocks of the trace and of ``telemetry_series``: made once in a run of several
    workers, by whichever asks first, and copied by the others. The series are fixed (every
    time is from ``prom.START``), and making them takes tens of seconds: every pool's
    zero-started families, each scrape of three hours, for three sites' two replicas."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = factory.getbasetemp().parent / f"monitoring-{run}" if run else factory.mktemp("tsdb")
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        store = root / "data"
        if not (root / "made").exists():
            shutil.rmtree(store, ignore_errors=True)
            trace = prom.openmetrics(prom.generate()).removesuffix("# EOF\n")
            prom.backfill(root, trace + telemetry_series())
            (root / "series.om").unlink()
            (root / "made").touch()
        return store


def api(url: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}") as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def promql(expr: str, **chosen: str) -> str:
    """``expr`` as Grafana sends it, with ``chosen`` values (``cluster=".*"``) over ``GRAFANA``."""
    return grafana.promql(
        expr, {**GRAFANA, **{f"${name}": value for name, value in chosen.items()}}
    )


def test_promql_substitution_is_complete() -> None:
    with pytest.raises(AssertionError, match="does not substitute"):
        promql('up{x="$unknown"}')


def test_every_dashboard_expression_runs_and_returns_data(prometheus: str) -> None:
    dash = dashboard(POSTGRES)
    checked = 0
    for panel, target in targets(dash):
        if "expr" not in target:
            continue
        expr = promql(target["expr"])
        data = api(prometheus, "/api/v1/query", query=expr, time=AT.isoformat())
        assert data["resultType"] == "vector", (panel["title"], expr)
        assert data["result"], f"{panel['title']}: no data for {expr}"
        assert not [r for r in data["result"] if math.isnan(float(r["value"][1]))], expr
        checked += 1
    assert checked == sum(1 for _, t in targets(dash) if "expr" in t) >= 10


# What an idle release's dashboard leaves empty, each panel saying why in its noValue: the
# quantiles of reclaims that did not happen, the budgets of pools without an slo, the log of
# decisions not made. Every other target reads a number.
QUANTILES = "Reclaim duration quantiles (1 h window)"
NOTICE = (
    "Reclaim notice given to the borrowed pods, and how soon they answered (median, 1 h window)"
)
BUDGET = "Error budget: minutes spent in the rolling window, and allowed (leader)"
IDLE_EMPTY = {
    *((title, ref) for title in (QUANTILES, NOTICE, BUDGET) for ref in "AB"),
    ("Decisions in range (decision log)", "A"),
}


def test_an_idle_release_s_panels_read_a_number_or_say_why_not(prometheus: str) -> None:
    """A healthy release that has had nothing to do (namespace "idle"): no target reads NaN,
    and a target that yields nothing is on a panel whose noValue says why, and, where it is
    guarded by a count, that count in its window is 0."""
    empty = set()
    for p, target in targets(dashboard(ON)):
        title, ref = p["title"], target["refId"]
        found = at_instant(prometheus, promql(target["expr"], namespace="idle"))
        print(f"{title} [{ref}]: {sorted(found.values()) or grafana.no_value(p)}")
        assert not [v for v in found.values() if math.isnan(v)], (title, ref, found)
        if found:
            continue
        empty.add((title, ref))
        assert grafana.no_value(p), f"{title} [{ref}]: empty, and the panel says No data"
        count = grafana.guard(target["expr"])
        if count is not None:
            counted = at_instant(prometheus, promql(count, namespace="idle"))
            assert set(counted.values()) <= {0.0}, (title, ref, counted)
    assert empty == IDLE_EMPTY


def test_the_guard_names_the_count_and_leaves_the_quantile() -> None:
    quantile = "histogram_quantile(0.5, sum by (le, pool) (rate(x_bucket[1h])))"
    count = "sum by (cluster, pool) (increase(x_count[1h]))"
    guarded = f"{quantile} and on (cluster, pool) ({count} > 0)"
    assert (grafana.guard(guarded), grafana.unguarded(guarded)) == (count, quantile)
    assert (grafana.guard(quantile), grafana.unguarded(quantile)) == (None, quantile)
    assert grafana.guard(f"{guarded} or vector(0)") is None  # a guard is the whole tail


def at_instant(url: str, query: str) -> dict[str, float]:
    """``query``'s values at ``AT``, keyed by their labels."""
    data = api(url, "/api/v1/query", query=query, time=AT.isoformat())
    return {
        ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
        for r in data["result"]
    }


def panel(url: str, title: str, ref: str = "A", **chosen: str) -> dict[str, float]:
    """The values of a panel's query at ``AT``, keyed by their labels."""
    [target] = [
        t
        for p in dashboard(ON)["panels"]
        if p["title"] == title
        for t in p["targets"]
        if t["refId"] == ref
    ]
    return at_instant(url, promql(target["expr"], **chosen))


def test_dashboard_values_are_the_exported_ones(prometheus: str) -> None:
    """A few panels' values for one cluster, checked against what the Telemetry was told."""

    def query(title: str, ref: str = "A") -> dict[str, float]:
        return panel(prometheus, title, ref)

    minute = prom.MINUTES - 10
    assert query("Nodes lent per pool") == {
        "cluster=eu,pool=l20": (minute // 20) % 4,
        "cluster=eu,pool=h100": 1,
    }
    assert query("Leader") == {
        "cluster=eu,identity=rebalancer-0,pod=rebalancer-0": 1,
        "cluster=eu,identity=rebalancer-1,pod=rebalancer-1": 0,
    }
    assert query("Replicas up") == {"cluster=eu": 2}
    ages = query("Demand sample age (leader)")
    assert ages["cluster=eu,pool=l20"] == 40
    assert ages["cluster=eu,pool=h100"] == 40 + 60 * (minute - 150)
    budget = "Error budget: minutes spent in the rolling window, and allowed (leader)"
    assert (query(budget, "A"), query(budget, "B")) == (
        {"cluster=eu,pool=h100": 6},
        {"cluster=eu,pool=h100": 10},
    )
    decisions = query("Decisions by reason")
    step = "action=lend,cluster=eu,kind=step,pool=l20,reason=strategy"
    assert decisions[step] == pytest.approx(1 / 60)
    assert set(decisions) == {step, "action=lend,cluster=eu,kind=refusal,pool=h100,reason=cooldown"}
    assert set(panel(prometheus, "Decisions by reason", pool="(h100)")) == {
        "action=lend,cluster=eu,kind=refusal,pool=h100,reason=cooldown"
    }
    # one row per decision, at its time, with its latest outcome (the table hides the target)
    target = "job=rebalancer,namespace=rebalancer"
    log = query("Decisions in range (decision log)")
    assert log == {
        f"action=reclaim,cluster=eu,id=D100,{target},node=gpu-1,origin=safety,outcome=applied,"
        "pod=rebalancer-0,pool=l20,reason=demand_above_serving": at_minute(100),
        f"action=lend,cluster=eu,id=D160,{target},node=gpu-2,origin=strategy,outcome=pending,"
        "pod=rebalancer-0,pool=h100,reason=strategy": at_minute(160),
        f"action=lend,cluster=eu,id=D165,{target},node=gpu-1,origin=operator,outcome=applied,"
        "pod=rebalancer-0,pool=l20,reason=operator_lend_now": at_minute(165),
    }


def at_minute(k: int) -> float:
    """Minute ``k``'s scrape time as the decision log's table shows it: in milliseconds."""
    return prom.scrape_time(k).timestamp() * 1000


def test_across_a_fleet_each_cluster_keeps_its_own_series_and_its_own_leader(
    prometheus: str,
) -> None:
    """Every cluster (All): two clusters with the same namespace, job and pod names. In "us"
    the other replica leads, and its follower says l20 is safety-only: a join that did not
    match on the cluster would take eu's leader for us's follower."""
    minute = prom.MINUTES - 10
    lent = (minute // 20) % 4
    assert panel(prometheus, "Nodes lent per pool", cluster=".*") == {
        "cluster=eu,pool=l20": lent,
        "cluster=eu,pool=h100": 1,
        "cluster=us,pool=l20": lent + 5,
        "cluster=us,pool=h100": 6,
    }
    assert panel(prometheus, "Leader", cluster=".*") == {
        "cluster=eu,identity=rebalancer-0,pod=rebalancer-0": 1,
        "cluster=eu,identity=rebalancer-1,pod=rebalancer-1": 0,
        "cluster=us,identity=rebalancer-0,pod=rebalancer-0": 0,
        "cluster=us,identity=rebalancer-1,pod=rebalancer-1": 1,
    }
    assert panel(prometheus, "Replicas up", cluster=".*") == {"cluster=eu": 2, "cluster=us": 2}
    safety_only = panel(prometheus, "Pools not planned as usual (leader)", cluster=".*")
    assert safety_only == {f"cluster={c},pool={p}": 0 for c in ("eu", "us") for p in POOLS}
    # one cluster of the two, as a multi-value variable sends it
    assert set(panel(prometheus, "Nodes lent per pool", cluster="(us)")) == {
        "cluster=us,pool=l20",
        "cluster=us,pool=h100",
    }


def test_one_cluster_s_own_prometheus_needs_no_cluster_label(prometheus: str) -> None:
    """A Prometheus that adds no cluster label: the variable finds nothing, stays All, and
    every panel shows the controller's series as they are."""
    minute = prom.MINUTES - 10
    solo = {"cluster": ".*", "namespace": "solo"}
    assert panel(prometheus, "Nodes lent per pool", **solo) == {
        "pool=l20": (minute // 20) % 4,
        "pool=h100": 1,
    }
    assert panel(prometheus, "Replicas up", **solo) == {"": 2}
    budget = "Error budget: minutes spent in the rolling window, and allowed (leader)"
    assert panel(prometheus, budget, **solo) == {"pool=h100": 6}


def test_the_fleet_s_name_check_lists_the_replicas_whose_name_is_not_their_cluster_label(
    prometheus: str,
) -> None:
    """The query docs/design/fleet.md gives, on the sites above: eu and us call themselves what
    their Prometheus calls them; the third calls itself "default" under no cluster label."""
    doc = (Path(__file__).parents[2] / "docs" / "design" / "fleet.md").read_text()
    [check] = re.findall(r"```promql\n\s*(.+?)\n\s*```", doc, re.S)
    data = api(prometheus, "/api/v1/query", query=check, time=AT.isoformat())
    found = sorted(
        (r["metric"].get("cluster", ""), r["metric"]["cluster_name"], r["metric"]["pod"])
        for r in data["result"]
    )
    assert found == [("", "default", "rebalancer-0"), ("", "default", "rebalancer-1")]


def test_every_aggregation_keeps_the_cluster_and_every_join_matches_on_it() -> None:
    """What keeps two clusters' series apart when their namespace, job, pod and pool names
    are the same: the cluster in each selector, ``by`` and ``on``. The reclaim heatmap alone
    adds up its buckets across whatever is selected, as it adds up the pools."""
    exprs = [t["expr"] for _, t in targets(dashboard(ON)) if "expr" in t]
    selectors = 0
    for expr in exprs:
        for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
            labels = [label.strip() for label in clause.split(",")]
            assert "cluster" in labels or labels == ["le"], (clause, expr)
        for selector in re.findall(r"\{([^}]*)\}", expr):
            if "$job" in selector:
                assert selector.startswith('cluster=~"$cluster", '), (selector, expr)
                selectors += 1
    assert selectors >= len(exprs)
    variables = dashboard(ON)["templating"]["list"]
    queries = [v["query"]["query"] for v in variables if v["type"] == "query"]
    assert all("$cluster" in q for q in queries if "cluster)" not in q), queries


def test_dashboard_variables_run(prometheus: str) -> None:
    window = {"start": prom.START.isoformat(), "end": AT.isoformat()}
    found = {}
    for var in dashboard(ON)["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert m, var["query"]
        selector, label = promql(m[1]), m[2]
        found[var["name"]] = sorted(
            api(prometheus, f"/api/v1/label/{label}/values", **{"match[]": selector}, **window)
        )
    assert found == {
        "cluster": ["eu", "us"],  # the label the fleet's Prometheus servers add
        "namespace": ["idle", "rebalancer"],  # eu's two releases
        "job": ["rebalancer"],
        "pool": ["h100", "l20"],
    }


# ---------------------------------------------------------------------------------------------
# The audit table's SQL on a real PostgreSQL with the schema of the audit store's migrations


def record(n: int, minutes: int, kind: Kind, pool: str = "l20", **extra: Any) -> AuditRecord:
    return AuditRecord(
        id=f"01J{n:023d}",
        cluster=extra.pop("cluster", "prod-eu"),
        time=T0 + timedelta(minutes=minutes),
        kind=kind,
        pool=pool,
        controller="rebalancer-0",
        reason=extra.pop("reason", "strategy"),
        message=f"record {n}",
        **extra,
    )


RECORDS = [
    record(1, 1, Kind.INTENT, node="gpu-1", action="lend", origin="strategy", term=3),
    record(10, 2, Kind.INTENT, node="gpu-1", action="lend", cluster="prod-us"),  # another's
    record(
        2, 2, Kind.OUTCOME, node="gpu-1", action="lend", outcome="applied", intent_id=f"01J{1:023d}"
    ),
    record(3, 3, Kind.REFUSAL, pool="h100", action="lend", reason="cooldown", count=2),
    record(4, 4, Kind.SUMMARY, reason="steady", count=0),  # not a decision
    record(5, 5, Kind.FINDING, node="gpu-2", reason="bad_annotation"),  # not a decision
    record(6, 6, Kind.INTENT, pool="a100", node="gpu-9", action="lend"),  # pool not selected
    record(7, -120, Kind.INTENT, node="gpu-1", action="reclaim"),  # before the range
    record(8, 120, Kind.INTENT, node="gpu-1", action="reclaim"),  # after the range
    record(9, 3, Kind.OUTCOME, node="gpu-1", action="lend", outcome="failed", error="boom"),
]


async def test_decisions_sql_on_postgresql(postgres_server: PostgresServer) -> None:
    [table] = [p for p in dashboard(POSTGRES)["panels"] if "rawSql" in p["targets"][0]]
    assert table["targets"][0]["format"] == "table"
    url = await postgres_server.create_database(f"dash_{uuid.uuid4().hex[:12]}")
    store = await SqlAuditStore.open(url)  # the program's own migrations make the schema
    try:
        await store.append(RECORDS)
        text = table["targets"][0]["rawSql"]
        window = (T0, T0 + timedelta(hours=1), ["l20", "h100"])
        async with store.engine.connect() as conn:

            async def rows_of(clusters: str) -> tuple[list[str], list[dict[str, Any]]]:
                result = await conn.exec_driver_sql(grafana.sql(text, *window, clusters))
                columns = list(result.keys())
                return columns, [dict(zip(columns, row, strict=True)) for row in result.all()]

            everyone = await rows_of(".*")  # All
            columns, rows = await rows_of("prod\\-eu")  # one cluster, as Grafana escapes it
            both = await rows_of("(prod\\-eu|prod\\-us)")
            prefix = await rows_of("prod")  # the regex is anchored: a prefix is no match
    finally:
        await store.close()
    assert [r["id"] for r in everyone[1]] == [f"01J{n:023d}" for n in (9, 3, 10, 2, 1)]
    assert [r["id"] for r in both[1]] == [r["id"] for r in everyone[1]]
    assert prefix[1] == []  # an empty table: the panel says why rather than "No data"
    assert grafana.no_value(table) == (
        "no decision of the selected clusters and pools in the time range"
    )
    assert {r["cluster"] for r in rows} == {"prod-eu"}
    assert columns[:2] == ["time", "cluster"]
    assert {"kind", "pool", "node", "action", "origin", "reason", "outcome", "message"} <= set(
        columns
    )
    assert [r["id"] for r in rows] == [f"01J{n:023d}" for n in (9, 3, 2, 1)]  # newest first
    assert rows[0]["time"] == T0 + timedelta(minutes=3)
    assert (rows[0]["outcome"], rows[0]["error"]) == ("failed", "boom")
    assert (rows[1]["kind"], rows[1]["pool"], rows[1]["reason"]) == ("refusal", "h100", "cooldown")
    assert rows[1]["nodes"] == 2
    assert (rows[3]["kind"], rows[3]["node"], rows[3]["term"]) == ("intent", "gpu-1", 3)
    assert rows[3]["origin"] == "strategy"  # who asked: the strategy, an operator, a safety rule


def test_sql_macros_are_expanded_or_refused() -> None:
    sql = grafana.sql(
        "WHERE $__timeFilter(t) AND p IN ($pool) AND c ~ '^(${cluster:regex})$'",
        T0,
        T0,
        ["a", "b"],
        "(x|y)",
    )
    assert sql == (
        "WHERE t BETWEEN '2026-03-02T12:00:00Z' AND '2026-03-02T12:00:00Z' AND p IN ('a','b') "
        "AND c ~ '^((x|y))$'"
    )
    with pytest.raises(AssertionError, match="does not expand"):
        grafana.sql("WHERE $__unixEpochFilter(t)", T0, T0, [])


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PrometheusRule"])
def test_a_kind_the_cluster_has_no_crd_for_is_refused_naming_the_value(kind: str) -> None:
    """Helm's engine here knows no cluster, so it serves neither kind: as an install on a
    cluster without the Prometheus Operator would find."""
    value = "serviceMonitor" if kind == "ServiceMonitor" else "prometheusRule"
    monitoring = {
        "crdCheck": True,
        "serviceMonitor": {"enabled": kind == "ServiceMonitor"},
        "prometheusRule": {"enabled": kind == "PrometheusRule"},
    }
    with pytest.raises(helm_python.HelmError) as caught:
        render({"monitoring": monitoring})
    said = str(caught.value)
    assert (
        f"monitoring.{value}.enabled: this cluster serves no monitoring.coreos.com/v1 {kind}"
        in said
    )
    assert f"--api-versions monitoring.coreos.com/v1/{kind}" in said
