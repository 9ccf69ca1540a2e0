"""pytest's rewritten test modules written once, over every core, before the suite's workers start
(``make test``: ``python -m tests.support.rewritten``).

pytest rewrites the asserts of every test module, conftest and module of ``tests.support`` as it
imports it, and keeps what it made in a pyc of its own (``__pycache__/*-pytest-<version>.pyc``,
checked against its source's hash), but writes none where Python is told to write no bytecode
(``PYTHONDONTWRITEBYTECODE``, which the machines here set). Then each of the four workers
rewrote the same 215 modules, and 86 of the pytest plugins' (``plugins``): 9.5 of the 15 s of
CPU its collection took, four times over while no test ran. pytest reads such a pyc whatever
``PYTHONDONTWRITEBYTECODE`` says, so this writes them ahead with pytest's own rewriter, and
each worker only reads them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _pytest.assertion.rewrite import (
    PYC_TAIL,
    _read_pyc,
    _write_pyc_fp,
    get_cache_dir,
    rewrite_asserts,
)
from _pytest.config import _iter_rewritable_modules


def rewritten_by_pytest(root: Path) -> Iterator[Path]:
    """The modules under ``root`` (the suite's ``tests``) pytest rewrites as it imports them:
    the test modules (``python_files``' default, ``test_*.py``), the conftests, and every
    module of ``tests.support``, which ``tests/conftest.py`` registers for rewriting."""
    for path in sorted(root.rglob("*.py")):
        test = path.name.startswith("test_") or path.name == "conftest.py"
        if test or path.relative_to(root).parts[0] == "support":
            yield path


def plugins() -> Iterator[Path]:
    """The modules of every installed distribution that brings a pytest plugin (Hypothesis,
    pytest-asyncio, pytest-xdist), which pytest rewrites as well, all of them, as it marks
    them (``Config._mark_plugins_for_rewrite``): more than a run imports, written once."""
    names = {
        name
        for dist in importlib.metadata.distributions()
        if any(ep.group == "pytest11" for ep in dist.entry_points)
        for name in _iter_rewritable_modules(str(file) for file in dist.files or [])
    }
    for name in sorted(names):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        origin = Path(spec.origin)
        yield from (
            sorted(origin.parent.rglob("*.py")) if spec.submodule_search_locations else [origin]
        )


def pyc_of(source: Path) -> Path:
    """Where pytest looks for the rewritten module of ``source``."""
    return get_cache_dir(source) / (source.name[:-3] + PYC_TAIL)


def write(source: Path) -> bool:
    """The rewritten pyc of ``source``, as pytest writes it, unless an up-to-date one is there
    already; whether one was written. Written aside and renamed, as pytest does, so that a
    reader never sees half of one. Where it cannot be written (a plugin installed read-only),
    nothing is: pytest then rewrites that module itself, as it does."""
    pyc = pyc_of(source)
    if _read_pyc(source, pyc) is not None:
        return False
    text = source.read_bytes()
    try:
        tree = ast.parse(text, filename=str(source))
    except (SyntaxError, ValueError):
        return False  # pytest says what is wrong with it when it collects it
    rewrite_asserts(tree, text, str(source))
    code = compile(tree, str(source), "exec", dont_inherit=True)
    aside = pyc.with_name(f"{pyc.name}.{os.getpid()}")
    try:
        pyc.parent.mkdir(exist_ok=True)
        with aside.open("wb") as out:
            _write_pyc_fp(out, importlib.util.source_hash(text), code)
        aside.replace(pyc)
    except OSError:
        aside.unlink(missing_ok=True)
        return False
    return True


def write_all(sources: Iterable[Path]) -> int:
    """``write`` over every core; how many were written."""
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        return sum(pool.map(write, sources, chunksize=8))


if __name__ == "__main__":
    tests = Path(sys.argv[1] if len(sys.argv) > 1 else "tests").resolve()
    write_all([*rewritten_by_pytest(tests), *plugins()])
