"""``helm lint`` and ``helm template`` as a platform team's CI runs them on the chart: the
defaults lint, each values file of ``charts/rebalancer/ci/`` lints in strict mode and renders,
and a misspelt window day comes back as one line naming the field and the days it takes.

The Helm binary is the one the real-cluster tests install with (tests/support/helm.py); its
homes go under the test's directory.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import helm
from tests.support.chart import CHART, POOL

CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


def run_helm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm.binary()), *args],
        env=helm.environment(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_chart_s_defaults_lint_and_an_install_of_them_names_the_missing_pools(
    tmp_path: Path,
) -> None:
    linted = run_helm(tmp_path, "lint", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout
    rendered = run_helm(tmp_path, "template", "rebalancer", str(CHART))
    assert rendered.returncode == 1
    assert "config.pools: empty; name at least one inference pool" in rendered.stderr


def test_there_are_ci_values_files() -> None:
    assert {p.name for p in CI_VALUES} >= {
        "minimal-values.yaml",
        "postgresql-values.yaml",
        "monitoring-values.yaml",
        "prometheus-auth-values.yaml",
    }


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_each_ci_values_file_lints_strictly_and_renders(values: Path, tmp_path: Path) -> None:
    linted = run_helm(tmp_path, "lint", "--strict", str(CHART), "-f", str(values))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    rendered = run_helm(
        tmp_path, "template", "rebalancer", str(CHART), "-n", "rebalancer", "-f", str(values)
    )
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"Deployment", "ConfigMap", "ClusterRole"} <= kinds


@pytest.mark.parametrize("command", ["lint", "template"])
def test_a_misspelt_window_day_is_one_short_line_naming_the_field_and_the_days(
    command: str, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    pool = {**POOL, "window": "Mon-Fry 22:00-06:00"}
    values.write_text(yaml.safe_dump({"config": {"pools": [pool]}}))
    done = run_helm(
        tmp_path,
        command,
        *(["rebalancer"] * (command == "template")),
        str(CHART),
        "-f",
        str(values),
    )
    assert done.returncode == 1
    said = [line for line in (done.stdout + done.stderr).splitlines() if "/window" in line]
    assert said, done.stdout + done.stderr
    for line in said:
        # Helm's prefix (lint's "[ERROR] values.yaml: "), then the validator's message.
        message = line[line.index("at '") :]
        assert message.startswith("at '/config/pools/0/window': 'Mon-Fry 22:00-06:00' does not")
        assert "(mon|tue|wed|thu|fri|sat|sun)" in message
        assert len(line) <= 200, line
