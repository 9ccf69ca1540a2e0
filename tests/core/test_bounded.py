"""``core.bounded``: an outside value is kept whole when short, and cut with its size and digest
when long, wherever it is copied."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from rebalancer.core import bounded, model, nodestate, overrides


def test_a_short_value_is_kept_as_it_is() -> None:
    assert bounded.cut("Mon-Fri 22:00-06:00") == "Mon-Fri 22:00-06:00"
    assert bounded.cut("x" * bounded.KEPT) == "x" * bounded.KEPT
    assert bounded.quoted("sometimes") == "'sometimes'"


def test_a_long_value_keeps_its_start_its_size_and_its_digest() -> None:
    value = "é" * 102_400  # 204,800 bytes in UTF-8
    digest = hashlib.sha256(value.encode()).hexdigest()[: bounded.DIGEST]

    assert bounded.cut(value) == "é" * bounded.KEPT + f"… (204800 bytes, sha256:{digest})"
    assert (
        bounded.quoted(value) == repr("é" * bounded.QUOTED) + f"… (204800 bytes, sha256:{digest})"
    )


def test_two_long_values_with_the_same_start_are_told_apart_by_their_digest() -> None:
    same = "a" * 1000
    assert bounded.cut(same + "b") != bounded.cut(same + "c")


def test_a_lone_surrogate_from_a_json_body_is_measured_not_refused() -> None:
    assert bounded.cut("\ud800" * 300).endswith(
        "(900 bytes, sha256:" + _digest("\ud800" * 300) + ")"
    )


@given(st.text(max_size=2000), st.integers(min_value=0, max_value=500))
def test_a_cut_is_never_longer_than_its_limit_and_what_it_says(text: str, limit: int) -> None:
    cut = bounded.cut(text, limit)
    assert len(cut) <= limit + len("…  (") + 20 + len(" bytes, sha256:)") + bounded.DIGEST
    assert cut == text or cut.startswith(text[:limit])


def test_a_finding_keeps_a_big_value_once_cut_and_quotes_it_short_in_its_message() -> None:
    value = "y" * 204_800
    parsed = overrides.parse({"rebalancer.io/window": value}, nodestate.Keys())
    (problem,) = parsed.problems
    finding = model.Finding(
        model.NodeName("n"), problem.key, problem.value, model.Reason.BAD_OVERRIDE, str(problem)
    )

    assert finding.value == bounded.cut(value)
    assert len(finding.message) < 400
    assert finding.message.count("y" * bounded.QUOTED) == 1  # the window's why quotes it no more
    assert "(204800 bytes, sha256:" in finding.message


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[: bounded.DIGEST]


def test_a_long_override_value_is_parsed_each_time_not_kept_in_the_parse_cache() -> None:
    cached = overrides.parse_cached.cache_info().currsize
    for i in range(50):  # another writer changing a 200 KB annotation, over and over
        parsed = overrides.parse({"rebalancer.io/lend": f"{i}" + "z" * 204_800}, nodestate.Keys())
        assert parsed.problems
    assert overrides.parse_cached.cache_info().currsize == cached
