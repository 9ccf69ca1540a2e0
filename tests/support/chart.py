"""Render the Helm chart with Helm's own engine (helm-python-sdk embeds Helm v4, offline).

``render(values)`` gives the manifests of one install as parsed documents, in the order Helm
would print them (by template path); ``rendered(values)`` the raw text per template, for the
tests that look at what Helm prints (NOTES.txt) or feed a file to another tool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "rebalancer"
RELEASE = "rebalancer"
NAMESPACE = "rebalancer"

Doc = dict[str, Any]


# The chart refuses an install that names no pool: a test that is not about pools gets this one.
POOL: dict[str, Any] = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 4}


def with_a_pool(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """``values``, with ``POOL`` as ``config.pools`` when they name none, and the monitoring
    CRD check off unless they set it: Helm's engine here renders without a cluster, whose API
    versions it cannot know (tests/chart/test_monitoring.py checks the check)."""
    given = dict(values or {})
    config = dict(given.get("config") or {})
    config.setdefault("pools", [POOL])
    monitoring = {"crdCheck": False, **(given.get("monitoring") or {})}
    return {**given, "config": config, "monitoring": monitoring}


def rendered(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Template path -> rendered text, for an install of ``name`` into ``namespace`` (with a
    pool unless the values name theirs)."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(
            with_a_pool(values),
            name=name,
            namespace=namespace,
            is_install=True,
            revision=1,
        )


HOOK = "helm.sh/hook"  # the annotation that makes an object a hook's, not the install's


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    hook: str | None = None,
) -> list[Doc]:
    """The objects ``helm install`` creates, parsed (NOTES.txt, empty templates and hooks left
    out); with ``hook`` ("pre-delete", "test"), the objects Helm creates for that hook."""
    docs: list[Doc] = []
    for path, text in sorted(rendered(values, name=name, namespace=namespace).items()):
        if path.endswith("NOTES.txt"):
            continue
        # libyaml's parser under PyYAML's safe constructor: the same documents (checked on every
        # template of tests/chart/test_chart.py's combinations) in 11 ms a render where PyYAML's
        # own parser took 76, and tests/chart alone renders the chart some 200 times.
        docs.extend(d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d)
    return [d for d in docs if _hook_of(d) == hook]


def hooks_and_install(values: Mapping[str, Any] | None = None) -> list[Doc]:
    """Every object the chart renders for a release, its hooks' too."""
    return [*render(values), *render(values, hook="pre-delete"), *render(values, hook="test")]


def _hook_of(doc: Doc) -> str | None:
    hook: str | None = ((doc.get("metadata") or {}).get("annotations") or {}).get(HOOK)
    return hook


def of_kind(docs: list[Doc], kind: str) -> Iterator[Doc]:
    return (d for d in docs if d.get("kind") == kind)


def one(docs: list[Doc], kind: str) -> Doc:
    """The single object of ``kind``; fails the test if there is none or more than one."""
    found = list(of_kind(docs, kind))
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]
