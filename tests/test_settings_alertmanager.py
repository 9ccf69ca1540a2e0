"""The settings of the Alertmanager receiver: each pool's ``wake_on``, the token, the max age."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebalancer import settings


def load(tmp_path: Path, env: dict[str, str] | None = None, **pool: Any) -> settings.Settings:
    doc = {
        "pools": [{"name": "l20", "node_selector": {"gpu-pool": "inference"}, "rps_per_node": 10}]
    }
    doc["pools"][0].update(pool)
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return settings.load(path, env=env or {})


def refusal(tmp_path: Path, env: dict[str, str] | None = None, **pool: Any) -> list[str]:
    with pytest.raises(settings.InvalidSettings) as caught:
        load(tmp_path, env, **pool)
    return caught.value.lines


def test_each_wake_on_entry_is_one_selector_of_alertmanager_matchers(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        wake_on=[
            {"matchers": ['alertname="InferenceQueueHigh"', 'service="llm"']},
            {"matchers": ['{alertname=~"Inference.*Latency", severity!="info"}']},
        ],
    )

    assert [str(s) for s in loaded.pools[0].alert_selectors()] == [
        '{alertname="InferenceQueueHigh", service="llm"}',
        '{alertname=~"Inference.*Latency", severity!="info"}',
    ]
    assert loaded.alertmanager.token is None
    assert loaded.alertmanager.max_age.total_seconds() == 3600
    assert loaded.alertmanager.max_life.total_seconds() == 12 * 3600


def test_a_bad_matcher_is_one_line_naming_the_pool_entry_and_why(tmp_path: Path) -> None:
    lines = refusal(tmp_path, wake_on=[{"matchers": ['alertname=~"(Inference"']}])

    assert lines == [
        'pools[0].wake_on[0].matchers=[\'alertname=~"(Inference"\']: alertname=~"(Inference": '
        "not a regular expression (missing ), unterminated subpattern at position 0)"
    ]


def test_a_selector_without_a_matcher_is_refused_since_it_would_match_every_alert(
    tmp_path: Path,
) -> None:
    (line,) = refusal(tmp_path, wake_on=[{"matchers": []}])

    assert line.startswith("pools[0].wake_on[0].matchers=[]: no matcher")


def test_the_token_comes_from_the_environment_and_is_never_shown(tmp_path: Path) -> None:
    # A shared token is for a port the cluster does not guard (docs/http.md#alertmanager).
    env = {"REBALANCER_ALERTMANAGER__TOKEN": "s3cret", "REBALANCER_HTTP__AUTHENTICATION": "none"}
    loaded = load(tmp_path, env)

    assert loaded.alertmanager.token is not None
    assert loaded.alertmanager.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(loaded)


def test_a_max_age_of_zero_is_refused(tmp_path: Path) -> None:
    (line,) = refusal(tmp_path, {"REBALANCER_ALERTMANAGER__MAX_AGE": "0"})

    assert line.startswith("alertmanager.max_age=")


def test_the_longest_life_an_alert_may_hold_a_pool_is_set_in_the_environment(
    tmp_path: Path,
) -> None:
    loaded = load(tmp_path, {"REBALANCER_ALERTMANAGER__MAX_LIFE": "36h"})

    assert loaded.alertmanager.max_life.total_seconds() == 36 * 3600
