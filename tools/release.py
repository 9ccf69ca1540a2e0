"""``make release``: every artifact of this version, built from the checkout into ``out/release``.

- the Python wheel and sdist (``python -m build``: the sdist, then the wheel built from it);
- the Helm chart, packaged with ``helm package`` (``rebalancer-X.Y.Z.tgz``);
- the controller's image, built here with no container engine (``tools/image.py``) for this
  machine's platform, as an OCI image layout tarball named ``rebalancer.local/rebalancer:X.Y.Z``
  (``rebalancer-image-X.Y.Z-linux-ARCH.oci.tar``, and a link to it without the platform,
  ``rebalancer-image-X.Y.Z.oci.tar``, that the install commands name; ``--skip-image`` leaves
  both out: the release workflow builds the image from the Dockerfile);
- ``SHA256SUMS`` over them, as ``sha256sum -c`` reads it.

It first checks that the package's version (``pyproject.toml``), the chart's ``version`` and its
``appVersion`` (the image tag the chart installs) are one version, and with ``--tag`` that the tag
is ``v`` and that version; otherwise it refuses with one line and builds nothing. ``--check``
prints the version and stops there. Nothing is pushed anywhere: docs/design/release.md.

Run from a checkout: ``python -m tools.release``. Standard library only (and the ``build``
package, and Helm), so that a bare runner's Python runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "rebalancer"
# The image's name: not a registry's. Load it into a node or push it under your registry's name
# (docs/getting-started.md); the chart is told with image.repository.
IMAGE_REPOSITORY = "rebalancer.local/rebalancer"


class Refused(Exception):
    """A release that must not be built, with the one line that says why."""


def versions(root: Path = ROOT) -> dict[str, str]:
    """The three versions that must agree: the package's, the chart's and its appVersion."""
    package = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    chart = (root / "charts" / "rebalancer" / "Chart.yaml").read_text()
    found = {"pyproject.toml version": str(package)}
    for key in ("version", "appVersion"):
        match = re.search(rf"(?m)^{key}:\s*['\"]?([^'\"\s#]+)", chart)
        found[f"Chart.yaml {key}"] = match.group(1) if match else "(none)"
    return found


def agreed(found: Mapping[str, str], tag: str | None = None) -> str:
    """The one version ``found`` names, which ``tag`` (when given) must be as ``vX.Y.Z``."""
    if len(set(found.values())) != 1:
        said = ", ".join(f"{where} {version}" for where, version in found.items())
        raise Refused(f"release: the versions disagree: {said}")
    (version,) = set(found.values())
    if tag is not None and tag != f"v{version}":
        raise Refused(f"release: tag {tag} is not v{version}, the version of pyproject.toml")
    return version


def pinned_helm() -> Path:
    """Where the suite keeps the Helm it builds from its Go module (tests/kube/build.sh)."""
    go_mod = (ROOT / "tests" / "kube" / "helm" / "go.mod").read_text()
    match = re.search(r"(?m)^require helm\.sh/helm/v4 (\S+)$", go_mod)
    version = match.group(1) if match else "unknown"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rebalancer"
    return cache / "kube" / f"helm-{version}" / "helm"


def helm() -> str:
    """``$HELM``, else ``helm`` on the PATH, else the Helm the suite built."""
    found = os.environ.get("HELM") or shutil.which("helm")
    if found:
        return found
    if pinned_helm().exists():
        return str(pinned_helm())
    raise Refused("release: no helm: put Helm 3.14 or later on the PATH, or set HELM=/path/to/helm")


def run(command: Sequence[str], what: str) -> None:
    """Run ``command`` from the checkout's root; refuse with its last words when it fails."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise Refused(f"release: {what} failed: {said[0]}")


def python_packages(out: Path) -> None:
    """The sdist, and the wheel built from it, as the release workflow builds them."""
    if importlib.util.find_spec("build") is None:
        raise Refused("release: no 'build' package: pip install build (make release installs it)")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], "python -m build")


def chart(out: Path, helm_binary: str) -> None:
    run([helm_binary, "package", str(CHART), "--destination", str(out)], "helm package")


def image_name(version: str) -> str:
    """The image tarball's file name: the version and the one platform it is built for."""
    from tools.image import ARCHITECTURE

    return f"rebalancer-image-{version}-linux-{ARCHITECTURE}.oci.tar"


def image_link(version: str) -> str:
    """A link to the image tarball under a name without the platform, so that one install
    command loads it whichever machine built it (amd64 or arm64)."""
    return f"rebalancer-image-{version}.oci.tar"


def image(out: Path, version: str) -> None:
    from tools import image as images

    images.controller(out / image_name(version), f"{IMAGE_REPOSITORY}:{version}", version)
    (out / image_link(version)).symlink_to(image_name(version))


def checksums(out: Path) -> Path:
    """``SHA256SUMS`` of every file in ``out``, in ``sha256sum``'s format."""
    lines = []
    # The link is the same bytes under a second name: summed once, under the platform's name.
    files = (p for p in out.iterdir() if p.is_file() and not p.is_symlink())
    for path in sorted(p for p in files if p.name != "SHA256SUMS"):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    sums = out / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def clear(out: Path) -> None:
    """Make ``out``, and remove what an earlier release left in it (and nothing else)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in out.iterdir():
        ours = path.name.startswith("rebalancer") or path.name == "SHA256SUMS"
        if (path.is_file() or path.is_symlink()) and ours:
            path.unlink()


def build(out: Path, version: str, with_image: bool) -> None:
    """Every artifact into ``out``, then their checksums; each step's time and each file's size
    said as it goes."""
    clear(out)
    helm_binary = helm()
    steps: list[tuple[str, Callable[[], None]]] = [
        ("wheel and sdist", lambda: python_packages(out)),
        ("chart", lambda: chart(out, helm_binary)),
    ]
    if with_image:
        steps.append(("image", lambda: image(out, version)))
    for what, step in steps:
        started = time.monotonic()
        step()
        print(f"release: {what} built in {time.monotonic() - started:.0f}s", file=sys.stderr)
    checksums(out)
    for path in sorted(p for p in out.iterdir() if p.is_file()):
        link = f" -> {path.readlink()}" if path.is_symlink() else ""
        print(f"{path.stat().st_size:>12}  {path}{link}")


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "release")
    parser.add_argument("--tag", help="refuse unless the tag is vVERSION (the release workflow)")
    parser.add_argument("--check", action="store_true", help="check the versions, print, stop")
    parser.add_argument("--skip-image", action="store_true", help="no image (the workflow's)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    given = arguments(argv)
    try:
        version = agreed(versions(), given.tag)
        if given.check:
            print(version)
            return 0
        build(given.out.resolve(), version, with_image=not given.skip_image)
    except Refused as refused:
        print(refused, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
