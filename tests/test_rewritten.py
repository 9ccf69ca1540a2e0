"""The rewritten modules written ahead of the workers (tests/support/rewritten.py) are the ones
pytest would write, where pytest looks for them, for every module it rewrites."""

from __future__ import annotations

import sys
from pathlib import Path

import hypothesis
import pytest
from _pytest.assertion.rewrite import AssertionRewritingHook, _read_pyc, _rewrite_test

from tests.support.rewritten import plugins, pyc_of, rewritten_by_pytest, write

TESTS = Path(__file__).parent


def test_pytest_reads_what_is_written_as_its_own_and_it_is_written_again_once_changed(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    source = tmp_path / "test_one.py"
    source.write_text("def test_it() -> None:\n    assert [1, 2] == [1, 3]\n")
    assert write(source)
    read = _read_pyc(source, pyc_of(source))
    assert read is not None
    _, own = _rewrite_test(source, pytestconfig)
    assert read == own
    assert not write(source), "up to date: left as it is"
    source.write_text("def test_it() -> None:\n    assert [1, 2] == [1, 2]\n")
    assert _read_pyc(source, pyc_of(source)) is None
    assert write(source)
    assert _read_pyc(source, pyc_of(source)) is not None


def test_a_module_that_does_not_parse_is_left_to_pytest_to_report(tmp_path: Path) -> None:
    source = tmp_path / "test_broken.py"
    source.write_text("def test_it(:\n    assert True\n")
    assert not write(source)
    assert not pyc_of(source).exists()


def test_every_module_pytest_rewrote_in_this_run_is_one_written_ahead() -> None:
    ahead = {*rewritten_by_pytest(TESTS), *plugins()}
    rewrote = {
        Path(m.__file__)
        for m in list(sys.modules.values())
        if isinstance(getattr(m, "__loader__", None), AssertionRewritingHook)
        and m.__file__ is not None
    }
    assert Path(__file__) in rewrote
    assert TESTS / "support" / "rewritten.py" in rewrote
    assert Path(hypothesis.__file__) in rewrote, "a plugin's modules are rewritten too"
    assert rewrote <= ahead, sorted(map(str, rewrote - ahead))
    assert TESTS / "__init__.py" not in ahead
