"""The Dockerfile agrees with the chart that runs it.

No Docker engine runs here, so the image is not built in the suite (docs/design/chart.md says
what was checked instead); what can drift silently between the two files is checked here: the
user the image runs as is the one the chart's security context demands, the port it exposes is
the chart's, the final stage installs nothing, and the build context admits what the package
needs. The build stage itself is replayed on this machine: its COPY and RUN instructions as
written, with no compiler on the PATH (the slim base image has none), and the environment it
leaves is held to what the image may carry. For each platform the release builds, pip resolves
the same install from wheels alone, as the base image's Python and C library would accept them:
the arm64 build, which runs only on the hosting CI, needs no compiler either.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support import controller_image
from tests.support.chart import CHART
from tools.image import HOW_THIS_MACHINE_REACHES_PYPI, stages

ROOT = CHART.parents[1]
# The oldest glibc a manylinux wheel may ask for, and the base image's (Debian's release).
MANYLINUX_SINCE = 17
GLIBC_OF_DEBIAN = {"bookworm": 36}
MACHINE_OF_PLATFORM = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# What builds packages from source; none of it may be left in the image.
BUILD_TOOLS = {
    "pip", "setuptools", "wheel", "cython", "meson", "meson-python", "ninja", "cmake",
    "maturin", "scikit-build-core", "hatchling", "flit-core", "poetry-core",
}  # fmt: skip


def test_two_stages_and_the_last_installs_nothing() -> None:
    build, final = stages()
    assert any(line.startswith("RUN ") and "pip install ." in line for line in build)
    runs = " ".join(line for line in final if line.startswith("RUN "))
    assert "apt-get install" not in runs
    assert "pip install" not in runs
    assert any(line.startswith("COPY --from=build ") for line in final)


def test_the_image_runs_as_the_user_the_chart_demands_on_the_chart_port() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    final = stages()[-1]
    (user,) = [line.split()[1] for line in final if line.startswith("USER ")]
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0
    assert (uid, gid) == (
        values["podSecurityContext"]["runAsUser"],
        values["podSecurityContext"]["runAsGroup"],
    )
    (expose,) = [line.split()[1:] for line in final if line.startswith("EXPOSE ")]
    # The API's port, then the probes'.
    assert [int(port) for port in expose] == [
        values["service"]["port"],
        values["http"]["healthPort"],
    ]
    assert 'ENTRYPOINT ["rebalancer"]' in final
    assert 'CMD ["run"]' in final


def test_the_build_context_admits_what_the_build_copies() -> None:
    admitted = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = {
        word.rstrip("/").removeprefix("./")
        for stage in stages()
        for line in stage
        if line.startswith("COPY ") and "--from=" not in line
        for word in line.split()[1:-1]
    }
    assert copied == admitted


# Run by the environment's own interpreter, away from the source tree: what it can import and
# what is installed in it.
PROBE = """
import json
from importlib import metadata, util
import rebalancer.cli, strategies
print(json.dumps({
    "product": [rebalancer.cli.__file__, strategies.__file__],
    "harness": [m for m in ("sandbox", "rebalancer_sandbox", "tests") if util.find_spec(m)],
    "distributions": [d.metadata["Name"] for d in metadata.distributions()],
    "commands": [e.name for e in metadata.entry_points(group="rebalancer.commands")],
}))
"""


def normalized(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_build_stage_installs_the_controller_and_no_harness_or_build_tool(
    tmp_path: Path,
) -> None:
    venv = controller_image.replayed()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    help_ = subprocess.run(
        [str(venv / "bin" / "rebalancer"), "--help"],
        check=False,
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert help_.returncode == 0, help_.stderr
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE],
        check=False,
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert all(Path(path).is_relative_to(venv) for path in found["product"]), found["product"]
    assert found["harness"] == []
    assert found["commands"] == []  # the harness plugs simulate, sandbox and demo in

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    harness = tomllib.loads((ROOT / "sandbox" / "pyproject.toml").read_text())["project"]
    dev = {
        normalized(re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0])
        for requirement in project["optional-dependencies"]["dev"]
    }
    distributions = {normalized(name) for name in found["distributions"]}
    assert normalized(project["name"]) in distributions
    assert distributions & (dev | {normalized(harness["name"])} | BUILD_TOOLS) == set()
    assert not (venv / "bin" / "pip").exists()


def release_platforms() -> list[str]:
    """The platforms the release workflow builds the image for."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    (job,) = workflow["jobs"].values()
    (build,) = [
        s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push-action@")
    ]
    platforms: list[str] = build["with"]["platforms"].split(",")
    return platforms


def wheel_tags(platform: str) -> list[str]:
    """pip's options for the wheels the base image's Python would install on ``platform``."""
    (base,) = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "ARG " in line]
    found = re.fullmatch(r"ARG PYTHON_IMAGE=python:3\.(\d+)-slim-(\w+)", base)
    assert found is not None, base
    minor, debian = found.groups()
    machine = MACHINE_OF_PLATFORM[platform]
    return [
        f"--python-version=3.{minor}",
        "--implementation=cp",
        f"--abi=cp3{minor}",
        *(
            f"--platform=manylinux_2_{glibc}_{machine}"
            for glibc in range(GLIBC_OF_DEBIAN[debian], MANYLINUX_SINCE - 1, -1)
        ),
    ]


@pytest.mark.parametrize("platform", release_platforms())
def test_every_dependency_comes_as_a_wheel_for_each_platform_the_release_builds(
    tmp_path: Path, platform: str
) -> None:
    # What the build context admits, copied: pip builds a local project where it lies.
    source = tmp_path / "src"
    source.mkdir()
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        if line.startswith("!") and (ROOT / line[1:]).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / line[1:], source / line[1:], ignore=ignore)
        elif line.startswith("!"):
            shutil.copy(ROOT / line[1:], source / line[1:])
    report = tmp_path / "report.json"
    resolve = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "."),
            *("--only-binary=:all:", *wheel_tags(platform)),
            *("--ignore-installed", f"--target={tmp_path / 'target'}", f"--report={report}"),
        ],
        check=False,
        cwd=source,
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "PIP_NO_CACHE_DIR": "1",
            **{k: os.environ[k] for k in HOW_THIS_MACHINE_REACHES_PYPI if k in os.environ},
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resolve.returncode == 0, resolve.stderr
    urls = [item["download_info"]["url"] for item in json.loads(report.read_text())["install"]]
    assert len(urls) > 10
    assert [url for url in urls if not url.endswith(".whl")] == [source.as_uri()]
