"""Alertmanager matchers as a pool's ``wake_on`` selectors: the syntax and its matching."""

from __future__ import annotations

import pytest

from rebalancer.core import alerts


def selector(*texts: str) -> alerts.Selector:
    parsed = alerts.parse_selector(list(texts))
    assert isinstance(parsed, alerts.Selector), parsed
    return parsed


def refused(text: str) -> str:
    parsed = alerts.parse_selector(text)
    assert isinstance(parsed, alerts.MatcherError), parsed
    return parsed.why


@pytest.mark.parametrize(
    "text",
    [
        'alertname="InferenceQueueHigh", service="llm"',
        '{alertname="InferenceQueueHigh",service="llm"}',
        "alertname=InferenceQueueHigh, service=llm,",
        ' { alertname = "InferenceQueueHigh" , service = "llm" } ',
    ],
)
def test_a_selector_is_read_in_each_form_alertmanager_accepts(text: str) -> None:
    assert str(selector(text)) == '{alertname="InferenceQueueHigh", service="llm"}'


def test_the_strings_of_a_route_matchers_list_are_one_selector_all_of_which_must_hold() -> None:
    both = selector('alertname="InferenceQueueHigh"', 'service="llm"')

    assert both.matches({"alertname": "InferenceQueueHigh", "service": "llm"})
    assert not both.matches({"alertname": "InferenceQueueHigh", "service": "chat"})


def test_a_regex_is_anchored_at_both_ends() -> None:
    inference = selector('alertname=~"Inference.*"')

    assert inference.matches({"alertname": "InferenceLatencyHigh"})
    assert not inference.matches({"alertname": "HighInferenceLatency"})


def test_negative_matchers_and_absent_labels_follow_alertmanager() -> None:
    # An absent label reads as the empty string.
    assert selector('team=""').matches({"alertname": "X"})
    assert selector('team!="ml"').matches({"alertname": "X"})
    assert not selector('team!=""').matches({"alertname": "X"})
    assert selector('severity!~"info|none"').matches({"severity": "critical"})
    assert not selector('severity!~"info|none"').matches({"severity": "info"})


def test_a_quoted_value_keeps_its_commas_braces_and_escapes() -> None:
    quoted = selector(r'summary="a, {b} \"c\""')

    assert quoted.matches({"summary": 'a, {b} "c"'})
    assert str(quoted) == r'{summary="a, {b} \"c\""}'


def test_the_first_selector_that_matches_is_the_one_named() -> None:
    first, second = selector('service="llm"'), selector('alertname=~"Inference.*"')
    labels = {"alertname": "InferenceQueueHigh", "service": "llm"}

    assert alerts.first_match([first, second], labels) is first
    assert alerts.first_match([second, first], labels) is second
    assert alerts.first_match([first], {"service": "chat"}) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("alertname", "cannot read a matcher at 'alertname'"),
        ('alertname~"X"', "cannot read a matcher"),
        ('{alertname="X"', "unbalanced braces"),
        ('alertname=~"(Inference"', 'alertname=~"(Inference": not a regular expression'),
        (r'alertname="\q"', "unknown escape \\q"),
        ("", "no matcher: a selector must name at least one label"),
        ("{}", "no matcher"),
    ],
)
def test_a_bad_selector_is_refused_with_what_is_wrong(text: str, why: str) -> None:
    assert why in refused(text)
