"""The chart's Alertmanager receiver: who may post (a bound ServiceAccount, or behind a proxy a
shared token from a Secret), and the notes that say where to point a webhook."""

from __future__ import annotations

from typing import Any

from tests.support.chart import of_kind, render, rendered


def token_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    (deployment,) = [d for d in render(values) if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [e for e in container["env"] if e["name"] == "REBALANCER_ALERTMANAGER__TOKEN"]


def test_without_a_token_secret_no_token_is_asked_for() -> None:
    assert token_env({}) == []


def test_a_token_secret_becomes_the_controllers_alertmanager_token() -> None:
    values = {
        "http": {"authentication": "none"},
        "alertmanager": {"tokenSecret": {"name": "rebalancer-alertmanager"}},
    }

    assert token_env(values) == [
        {
            "name": "REBALANCER_ALERTMANAGER__TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "rebalancer-alertmanager", "key": "token"}},
        }
    ]


def test_the_notes_give_the_webhook_url_of_the_service() -> None:
    notes = next(t for p, t in rendered({}).items() if p.endswith("NOTES.txt"))

    assert "https://rebalancer.rebalancer.svc:8443/api/v1/alertmanager" in notes
    assert 'projected for the\n  audience "rebalancer"' in notes
    assert "alertmanager.serviceAccount.name binds it" in notes
    opened = next(
        t
        for p, t in rendered({"http": {"authentication": "none"}}).items()
        if p.endswith("NOTES.txt")
    )
    assert "No token is asked for" in opened
    assert "WARNING: http.authentication is none" in opened


def test_alertmanager_s_account_is_bound_to_create_alerts_and_nothing_else() -> None:
    docs = render({"alertmanager": {"serviceAccount": {"name": "alertmanager-main"}}})
    (binding,) = [
        d
        for d in of_kind(docs, "ClusterRoleBinding")
        if d["metadata"]["name"] == "rebalancer-alertmanager"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "alertmanager-main", "namespace": "monitoring"}
    ]
    (role,) = [
        d
        for d in of_kind(docs, "ClusterRole")
        if d["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    assert role["rules"] == [
        {"apiGroups": ["rebalancer.io"], "resources": ["alerts"], "verbs": ["create"]}
    ]
    unbound = render({})
    assert "rebalancer-alertmanager" not in [
        d["metadata"]["name"] for d in of_kind(unbound, "ClusterRoleBinding")
    ]
