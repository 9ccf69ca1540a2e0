"""The controller's container image for the suite's real nodes, built with no Docker engine and
no registry by ``tools/image.py`` (as ``make release`` builds it): a docker-archive tarball that
``ctr images import`` reads (``build``), and the build stage's virtual environment it is made of
(``replayed``), which ``tests/chart/test_image.py`` holds to what the image may carry.

Both are kept per user, keyed by what goes into them, and built under a lock, so that parallel
test workers build them once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path

from tests.support.processes import ROOT, locked
from tools import image
from tools.image import UNUSED, controller_entries, interpreter, replay_build_stage, write_layer

REF = "rebalancer.test/controller:dev"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rebalancer" / "images"
# What the image is made of besides the interpreter: the build's inputs, and the code that builds.
INPUTS = (*image.SOURCES, "tools")


def _key() -> str:
    """What the image is made of: the build's inputs and the interpreter under it."""
    digest = hashlib.sha256(sys.version.encode() + sys.base_prefix.encode())
    for name in INPUTS:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def _version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def replayed() -> Path:
    """The build stage's virtual environment (``replay_build_stage``), replayed unless the
    cache has it for these sources: the image is made from it, and ``tests/chart/test_image.py``
    holds it to what the image may carry. A virtual environment cannot be moved, so it stays
    where it was made."""
    return _replayed(_key())


def _replayed(key: str) -> Path:
    done = CACHE / f"venv-{key}"
    with locked(CACHE / "build.lock"):
        ready = done / "ready"
        if not (ready.exists() and (Path(ready.read_text()) / "bin" / "python").exists()):
            # Missing, half made, or made through an interpreter that is gone.
            shutil.rmtree(done, ignore_errors=True)
            venv = replay_build_stage(done)
            (done / "ready").write_text(str(venv))
        for old in CACHE.glob("venv-*"):
            if old != done:
                shutil.rmtree(old, ignore_errors=True)  # of older sources
        return Path((done / "ready").read_text())


def build() -> Path:
    """The image's tarball, built unless the cache has it for these sources."""
    key = _key()
    out = CACHE / f"controller-{key}.tar"
    venv = _replayed(key)
    with locked(CACHE / "build.lock"):
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            layer = Path(work) / "layer.tar"
            write_layer(controller_entries(venv), layer, venv)
            config = image.controller_config(_version())
            image.docker_archive(out.with_suffix(".part"), REF, layer, config).rename(out)
        for old in CACHE.glob("controller-*.tar"):
            if old != out:
                old.unlink()  # an image of older sources
    return out


PYTHON = "rebalancer.test/python:3.11"


def python() -> Path:
    """An image of this machine's Python alone, ``python`` on its PATH as in the official
    ``python`` images: for a script a pod mounts from a ConfigMap (``examples/reclaim-notice``).
    Less than the controller's base: no static library or build configuration, no compiled
    bytecode (compiled at import): 70 MB, which a node imports in 2-4 s where the controller's
    (then 343 MB) took 13-15 s. Kept per user under a key of the interpreter (built in 7 s),
    under the controller image's lock."""
    key = hashlib.sha256(sys.version.encode() + sys.base_prefix.encode()).hexdigest()[:16]
    out = CACHE / f"python-{key}.tar"
    with locked(CACHE / "build.lock"):
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(dir=CACHE) as work:
            layer = Path(work) / "layer.tar"
            static = Path(sysconfig.get_config_var("LIBPL")).name  # config-3.11-<platform>
            executable = os.path.realpath(sys.executable)
            links = {"/usr/local/bin/python": executable}
            write_layer(interpreter(UNUSED | {static, "__pycache__"}), layer, links=links)
            config = {
                "Entrypoint": ["python"],
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED=1"],
            }
            image.docker_archive(out.with_suffix(".part"), PYTHON, layer, config).rename(out)
        for old in CACHE.glob("python-*.tar"):
            if old != out:
                old.unlink()  # of another interpreter
    return out
