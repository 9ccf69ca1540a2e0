"""Helm, as a platform team runs it: ``helm install`` of the chart against a real control plane.

Built from its Go module by ``tests/kube/build.sh`` (the version ``tests/kube/helm/go.mod``
pins) beside the servers' directory. Its cache, configuration and data go under the test's
directory (``HELM_*_HOME``), not the user's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support import kube
from tests.support.chart import CHART
from tests.support.processes import ROOT

HERE = ROOT / "tests" / "kube" / "helm"
MODULE = "helm.sh/helm/v4"


def version() -> str:
    return kube.pinned(HERE / "go.mod", MODULE)


def binary() -> Path:
    built = kube.binaries().parent / f"helm-{version()}" / "helm"
    if not built.exists():
        subprocess.run([str(kube.BUILD)], check=True, capture_output=True, timeout=3600)
    return built


def environment(home: Path) -> dict[str, str]:
    """Helm's environment: its cache, configuration and data under ``home``, not the user's."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(home: Path, kubeconfig: Path, *args: str) -> str:
    """Run ``helm ARGS`` against ``kubeconfig``'s cluster; its output. Fails with Helm's own
    message when it fails."""
    env = {**environment(home), "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run(
        [str(binary()), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout


def install(
    home: Path, kubeconfig: Path, release: str, namespace: str, values: Mapping[str, Any]
) -> str:
    """``helm install`` of the repository's chart with ``values`` (as a values file)."""
    home.mkdir(parents=True, exist_ok=True)
    given = home / "values.json"  # JSON is YAML
    given.write_text(json.dumps(values))
    return helm(
        home, kubeconfig, "install", release, str(CHART), "--namespace", namespace, "-f", str(given)
    )
