"""The ``prometheus:`` block's ways in: each bad value is one line naming the field and the
value (never a secret), and what is accepted reaches the metrics adapter as given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rebalancer import settings
from rebalancer.adapters import promclient
from rebalancer.runtime import adapterconfig

POOL: dict[str, Any] = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 10}
RECIPES = sorted((Path(__file__).parents[1] / "examples" / "prometheus").glob("*.yaml"))


def load(tmp_path: Path, env: dict[str, str] | None = None, **prometheus: Any) -> settings.Settings:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"prometheus": prometheus, "pools": [POOL]}), encoding="utf-8")
    return settings.load(path, env or {})


def refusal(tmp_path: Path, env: dict[str, str] | None = None, **prometheus: Any) -> list[str]:
    with pytest.raises(settings.InvalidSettings) as caught:
        load(tmp_path, env, **prometheus)
    return caught.value.lines


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "bearer and basic",
        {"bearer_token_file": "/t", "basic_auth": {"username": "u", "password_file": "/p"}},
        "prometheus: bearer_token_file and basic_auth are both set: a request carries one "
        "Authorization header; keep one",
    ),
    (
        "authorization header with a token file",
        {"bearer_token_file": "/t", "headers": {"authorization": "Bearer s3cret"}},
        "prometheus: headers has Authorization, and bearer_token_file or basic_auth sets it "
        "too; keep one",
    ),
    (
        "header name",
        {"headers": {"X Scope OrgID": "team-a"}},
        "prometheus.headers: 'X Scope OrgID' is not a header name: letters, digits and "
        "!#$%&'*+-.^_`|~ only",
    ),
    (
        "header value",
        {"headers": {"X-Scope-OrgID": "team-a\r\nX-Other: 1"}},
        "prometheus.headers: the value of X-Scope-OrgID has a control character",
    ),
    (
        "a header the client writes",
        {"headers": {"Content-Type": "application/json"}},
        "prometheus.headers: Content-Type is set by the client for each request (a POST's body "
        "is a form); leave it out",
    ),
    (
        "header value not text",
        {"headers": {"X-Scope-OrgID": 7}},
        "prometheus.headers.X-Scope-OrgID=7: must be text; quote it in YAML: '7'",
    ),
    (
        "empty token path",
        {"bearer_token_file": ""},
        "prometheus.bearer_token_file='': write a file's path, e.g. "
        "/etc/rebalancer/prometheus/token",
    ),
    (
        "password file missing",
        {"basic_auth": {"username": "u"}},
        "prometheus.basic_auth.password_file: is required",
    ),
    (
        "user name with a colon",
        {"basic_auth": {"username": "u:x", "password_file": "/p"}},
        "prometheus.basic_auth.username='u:x': a basic-auth user name has no ':' and no "
        "control character",
    ),
    (
        "certificate without its key",
        {"tls": {"cert_file": "/c"}},
        "prometheus.tls: cert_file is set but key_file is not: a client certificate needs its key",
    ),
    (
        "skip verify with a CA",
        {"tls": {"insecure_skip_verify": True, "ca_file": "/ca"}},
        "prometheus.tls: insecure_skip_verify is set with ca_file or server_name, which it "
        "would ignore: keep the check (unset insecure_skip_verify) or drop them",
    ),
    (
        "server name",
        {"tls": {"server_name": "prometheus monitoring"}},
        "prometheus.tls.server_name='prometheus monitoring': write a DNS name, e.g. "
        "prometheus.monitoring.svc",
    ),
    (
        "unknown tls key",
        {"tls": {"ca": "/ca"}},
        "prometheus.tls.ca='/ca': unknown setting; known: ca_file, cert_file, key_file, "
        "server_name, insecure_skip_verify",
    ),
    ("method", {"method": "PUT"}, "prometheus.method='PUT': Input should be 'POST' or 'GET'"),
]


@pytest.mark.parametrize(("block", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_bad_value_is_one_line_naming_the_field(
    tmp_path: Path, block: dict[str, Any], expected: str
) -> None:
    assert refusal(tmp_path, **block) == [expected]


def test_no_line_shows_an_authorization_header_value(tmp_path: Path) -> None:
    lines = refusal(tmp_path, bearer_token_file="/t", headers={"Authorization": "Bearer s3cret"})
    assert not any("s3cret" in line for line in lines)


def test_the_defaults_send_nothing_but_the_query_and_post_it(tmp_path: Path) -> None:
    access = adapterconfig.metrics_settings(load(tmp_path)).access

    assert access == promclient.Access(method="POST")


def test_every_way_in_reaches_the_adapter_as_written(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        url="https://prometheus.monitoring.svc:9090",
        basic_auth={"username": "rebalancer", "password_file": "/etc/p/password"},
        tls={
            "ca_file": "/etc/p/ca.crt",
            "cert_file": "/etc/p/tls.crt",
            "key_file": "/etc/p/tls.key",
            "server_name": "prometheus.internal",
        },
        headers={"X-Scope-OrgID": "team-a"},
        method="get",
    )

    access = adapterconfig.metrics_settings(loaded, loaded.pools[0]).access

    assert access == promclient.Access(
        basic_username="rebalancer",
        basic_password_file=Path("/etc/p/password"),
        tls=promclient.Tls(
            ca_file=Path("/etc/p/ca.crt"),
            cert_file=Path("/etc/p/tls.crt"),
            key_file=Path("/etc/p/tls.key"),
            server_name="prometheus.internal",
        ),
        headers=(("X-Scope-OrgID", "team-a"),),
        method="GET",
        credentials="prometheus.basic_auth",
    )


def test_a_token_file_is_set_from_the_environment_and_kept_with_another_url(
    tmp_path: Path,
) -> None:
    env = {"REBALANCER_PROMETHEUS__BEARER_TOKEN_FILE": "/var/run/secrets/tokens/prometheus"}
    loaded = load(tmp_path, env, headers={"X-Scope-OrgID": "team-a"})

    # ``simulate --prometheus URL`` lays its URL over the block as it is: the rest stays.
    moved = settings.PrometheusSettings.model_validate(
        {**loaded.prometheus.model_dump(), "url": "https://elsewhere:9090"}
    )

    assert moved.bearer_token_file == Path("/var/run/secrets/tokens/prometheus")
    assert moved.headers == {"X-Scope-OrgID": "team-a"}
    assert moved.credentials() == "prometheus.bearer_token_file"


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_recipe_of_docs_prometheus_is_accepted_as_written(
    recipe: Path, tmp_path: Path
) -> None:
    block = yaml.safe_load(recipe.read_text())["config"]["prometheus"]

    loaded = load(tmp_path, **block)

    assert loaded.prometheus.url == block["url"]
    assert dict(loaded.prometheus.headers) == block.get("headers", {})


def test_the_recipes_are_the_ones_docs_prometheus_shows() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "prometheus.md").read_text()
    assert len(RECIPES) == 4
    for recipe in RECIPES:
        assert f"examples/prometheus/{recipe.name}" in doc
