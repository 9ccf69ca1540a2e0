"""The node-state keys read from the directory the chart mounts its Secret in
(docs/design/node-state-integrity.md): ``current`` signs, ``previous`` is still accepted, a
missing or short key is one clear error naming the file, and no directory at all gives a key of
the process's own, said once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rebalancer.adapters import sealkeys
from rebalancer.errors import ConfigError

CURRENT, PREVIOUS = "c" * 64, "p" * 64


def keys_in(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_the_current_key_signs_and_the_previous_one_is_still_accepted(tmp_path: Path) -> None:
    seal = sealkeys.load(keys_in(tmp_path, current=CURRENT + "\n", previous=PREVIOUS))

    assert seal.current.secret == CURRENT.encode()
    assert [k.secret for k in seal.previous] == [PREVIOUS.encode()]
    assert seal.ids == (seal.current.id, seal.previous[0].id)


def test_an_empty_previous_key_is_no_rotation(tmp_path: Path) -> None:
    """The chart's Secret holds an empty ``previous`` when no rotation is under way."""
    seal = sealkeys.load(keys_in(tmp_path, current=CURRENT, previous=""))

    assert seal.previous == ()


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({}, "current does not exist"),
        ({"current": "short"}, "needs at least 32 bytes, not 5"),
        ({"current": CURRENT, "previous": "short"}, "previous: a node-state key needs at least"),
    ],
)
def test_a_missing_or_short_key_is_one_error_naming_its_file(
    tmp_path: Path, files: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        sealkeys.load(keys_in(tmp_path, **files))

    assert str(raised.value).startswith("node_state_keys: ")
    assert len(str(raised.value).splitlines()) == 1
    assert CURRENT not in str(raised.value)


def test_no_directory_gives_a_key_of_the_process_own_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        one, two = sealkeys.load(None), sealkeys.load(None)

    assert one.current.id != two.current.id  # made at start, kept nowhere
    assert "no node_state_keys directory is configured" in caplog.text


def test_a_command_that_is_not_the_controller_is_not_told_of_the_key_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # ``rebalancer status`` and ``explain`` exit after one read: the warning is the loop's.
    with caplog.at_level(logging.WARNING):
        sealkeys.load(None, warn=False)
    assert caplog.text == ""
