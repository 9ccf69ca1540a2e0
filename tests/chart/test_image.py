"""The Dockerfile agrees with the chart that runs it.

No Docker engine runs here, so the image is not built in the suite (docs/design/chart.md says
what was checked instead); what can drift silently between the two files is checked here: the
user the image runs as is the one the chart's security context demands, the port it exposes is
the chart's, the final stage installs nothing, and the build context admits what the package
needs.
"""

from __future__ import annotations

import re

import yaml

from tests.support.chart import CHART

ROOT = CHART.parents[1]


def stages() -> list[list[str]]:
    """The Dockerfile's instructions, continuation lines joined, split into build stages."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    out: list[list[str]] = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


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
    (expose,) = [line.split()[1] for line in final if line.startswith("EXPOSE ")]
    assert int(expose) == values["service"]["port"]
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
