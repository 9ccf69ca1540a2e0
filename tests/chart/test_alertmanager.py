"""The chart's Alertmanager receiver: the token from a Secret, and the notes that say where to
point a webhook."""

from __future__ import annotations

from typing import Any

from tests.support.chart import render, rendered


def token_env(values: dict[str, Any]) -> list[dict[str, Any]]:
    (deployment,) = [d for d in render(values) if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [e for e in container["env"] if e["name"] == "REBALANCER_ALERTMANAGER__TOKEN"]


def test_without_a_token_secret_no_token_is_asked_for() -> None:
    assert token_env({}) == []


def test_a_token_secret_becomes_the_controllers_alertmanager_token() -> None:
    values = {"alertmanager": {"tokenSecret": {"name": "rebalancer-alertmanager"}}}

    assert token_env(values) == [
        {
            "name": "REBALANCER_ALERTMANAGER__TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "rebalancer-alertmanager", "key": "token"}},
        }
    ]


def test_the_notes_give_the_webhook_url_of_the_service() -> None:
    notes = next(t for p, t in rendered({}).items() if p.endswith("NOTES.txt"))

    assert "svc:8080/api/v1/alertmanager" in notes
    assert "No token is asked for" in notes
