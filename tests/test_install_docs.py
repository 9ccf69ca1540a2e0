"""Every install command in the documentation works as written against this checkout.

The install commands are the ``sh`` blocks marked with ``MARK`` on the line before them, in the
pages a newcomer installs from (``DOCS``). A block that installs, upgrades or uninstalls, builds a
release or loads an image must be marked, so a new one cannot escape. Each marked block is run
in order, per page, in a scratch directory laid out as the checkout after ``make release`` (the
chart really packaged by Helm there, the other artifacts under the names ``tools/release.py``
gives them), each command as far as it can be without a cluster:

- ``helm install`` and ``helm upgrade``: ``helm template`` with the same release, chart, namespace
  and values (an upgrade with ``--reset-then-reuse-values``: the new chart's defaults, then the
  values installed before, then the command's; ``--reuse-values`` fails it), by the Helm the
  suite builds; the chart's schema and templates refuse what the cluster would, and the rendered
  image is the one ``make release`` builds when the command names it. The cluster is a bare one
  (no ``--api-versions``): values that need the Prometheus Operator fail, as they would on a
  cluster without it. ``helm test`` and ``helm uninstall``: the release and namespace are the
  ones installed;
- ``make``: the target exists; ``make check-config`` is run for real (``rebalancer check``);
  ``make release`` is not (``tests/chart/test_release.py`` runs its script);
- ``cp``: run; ``ctr``, ``kind`` and ``skopeo``: the file they load is the image ``make release``
  writes, by its link without the platform (so the command works on amd64 and arm64), the tag
  is the version; ``git clone``: the project's own address;
- anything else fails the test until it is taught to check it.

No cluster is reached and nothing is pushed: a few seconds.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import helm
from tests.support.processes import ROOT
from tools import release, settings_of

MARK = "<!-- install-commands: each is run by tests/test_install_docs.py -->"
DOCS = (
    "README.md",
    "docs/getting-started.md",
    "docs/upgrade-uninstall.md",
    "charts/rebalancer/README.md",
)
RELEASE = NAMESPACE = "rebalancer"
# What a block must be marked for: it installs, builds a release or loads an image.
INSTALLING = re.compile(
    r"helm (install|upgrade|uninstall|package|push|pull)\b|make release|\bctr |skopeo |"
    r"kind load|oci://|docker (run|load|pull|push)"
)
# The chart is rendered for a bare cluster, as the pages' own commands give it: no API beyond
# Kubernetes' own (no Prometheus Operator), so values that need more fail here as on the cluster.
# The pages read after an install: they start where getting-started ends, its values.yaml
# written and installed with the image make release builds.
AFTER_INSTALL = ("docs/upgrade-uninstall.md",)
INSTALLED = ("-f", "values.yaml", "--set", "image.repository=rebalancer.local/rebalancer")


def version() -> str:
    found: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return found


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # where it starts, for the failure message
    marked: bool
    text: str


def blocks(doc: str, text: str | None = None) -> Iterator[Block]:
    """The ``sh`` blocks of ``doc`` (its ``text``, by default the file's), fenced (indented or
    not), and whether each is marked."""
    lines = (ROOT / doc).read_text().splitlines() if text is None else text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            body = "\n".join(line.strip() for line in lines[i + 1 : end])
            yield Block(doc, i + 1, before == MARK, body)
            i = end
        i += 1


def commands(text: str) -> Iterator[list[str]]:
    """The commands of a block: continuation lines joined, comments dropped, ``&&`` split."""
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            yield words[:cut]
            words = words[cut + 1 :]


@dataclass
class Checkout:
    """The scratch checkout a page's commands run in, and what they have installed so far."""

    root: Path
    home: Path
    installed: list[str] | None = None  # the values of the install, as helm template takes them
    release: str = RELEASE
    namespace: str = NAMESPACE
    pushed: set[str] = field(default_factory=set)  # repositories an image was pushed to

    def path(self, given: str) -> Path:
        """``given`` in the checkout (a glob matches exactly one file); it must exist."""
        matches = sorted(self.root.glob(given)) if any(c in given for c in "*?[") else []
        found = matches if matches else [self.root / given]
        assert len(found) == 1, f"{given} matches {len(found)} files"
        assert found[0].exists(), f"{given}: no such file in the checkout after make release"
        return found[0]


def artifacts(into: Path) -> None:
    """What ``make release`` leaves: the chart packaged by Helm for real, the others by name."""
    v = version()
    into.mkdir(parents=True)
    subprocess.run(
        [str(helm.binary()), "package", str(ROOT / "charts" / "rebalancer"), "-d", str(into)],
        check=True,
        capture_output=True,
    )
    for name in (
        f"rebalancer-{v}-py3-none-any.whl",
        f"rebalancer-{v}.tar.gz",
        release.image_name(v),
        "SHA256SUMS",
    ):
        (into / name).touch()
    (into / release.image_link(v)).symlink_to(release.image_name(v))


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    root = tmp_path / "rebalancer"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml", "charts", "examples", "sandbox", "tools"):
        (root / name).symlink_to(ROOT / name)
    artifacts(root / "out" / "release")
    return Checkout(root, tmp_path / "helm")


def check_git(c: Checkout, words: list[str]) -> None:
    source = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Source"]
    assert words in (["git", "clone", source], ["git", "pull"]), words


def check_cd(c: Checkout, words: list[str]) -> None:
    assert words == ["cd", c.root.name], words


def check_cp(c: Checkout, words: list[str]) -> None:
    _, source, target = words
    shutil.copy(c.path(source), c.root / target)


def check_make(c: Checkout, words: list[str]) -> None:
    targets = [w for w in words[1:] if "=" not in w]
    assert targets, words
    if targets == ["release"]:
        dry = subprocess.run(
            ["make", "-n", *words[1:]], cwd=c.root, capture_output=True, text=True, check=False
        )
        assert dry.returncode == 0, dry.stderr
        return
    # Run, on the suite's environment: its interpreter's directory as the Makefile's .venv/bin.
    stamp = c.root / "stamp"
    stamp.touch()
    bin_dir = Path(sys.executable).parent
    run = subprocess.run(
        ["make", *words[1:], f"BIN={bin_dir}", f"STAMP={stamp}", f"RUN={stamp}", "OUT=out"],
        cwd=c.root,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, f"{shlex.join(words)}:\n{run.stdout}{run.stderr}"


def check_image_load(c: Checkout, words: list[str]) -> None:
    """``ctr``, ``kind`` and ``skopeo``: the file is the image ``make release`` writes."""
    image = f"out/release/{release.image_link(version())}"  # the same on amd64 and arm64
    if words[0] == "skopeo":
        assert words[:2] == ["skopeo", "copy"], words
        source, target = words[2:]
        assert source == f"oci-archive:{image}:{version()}", source
        repository, _, tag = target.removeprefix("docker://").rpartition(":")
        assert target.startswith("docker://"), target
        assert tag == version(), target
        c.pushed.add(repository)
    elif words[0] == "ctr":
        assert words == ["ctr", "-n", "k8s.io", "images", "import", image], words
    else:
        assert words[:4] == ["kind", "load", "image-archive", image], words
    c.path(image)


def options(c: Checkout, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Helm's install and upgrade flags: those ``helm template`` takes (paths made absolute) and
    the ``--set`` values given."""
    kept: list[str] = []
    sets: dict[str, str] = {}
    given = iter(args)
    for arg in given:
        if arg in ("-f", "--values"):
            kept += ["-f", str(c.path(next(given)))]
        elif arg == "--set":
            value = next(given)
            kept += ["--set", value]
            key, _, setting = value.partition("=")
            sets[key] = setting
        elif arg in ("-n", "--namespace"):
            c.namespace = next(given)
        elif arg == "--create-namespace":
            kept.append(arg)
        else:
            raise AssertionError(f"helm flag {arg}: no check for it here; teach the test")
    return kept, sets


def check_helm(c: Checkout, words: list[str]) -> None:
    verb, *args = words[1:]
    if verb in ("test", "uninstall"):
        name, *rest = args
        assert name == c.release, words
        assert rest[:2] in (["-n", c.namespace], ["--namespace", c.namespace]), words
        assert set(rest[2:]) <= {"--logs"}, words
        return
    assert verb in ("install", "upgrade"), words
    name, chart, *flags = args
    assert "--reuse-values" not in flags, (
        f"{shlex.join(words)}: --reuse-values drops the new chart's defaults; "
        "--reset-then-reuse-values keeps them"
    )
    reuse = "--reset-then-reuse-values" in flags
    if reuse:
        flags.remove("--reset-then-reuse-values")
    kept, sets = options(c, flags)
    if verb == "upgrade":
        assert reuse, f"{shlex.join(words)}: an upgrade that drops the installed values"
        assert c.installed is not None, f"{shlex.join(words)}: an upgrade before any install"
        kept = c.installed + kept
    c.installed = kept  # what --reset-then-reuse-values reuses next
    c.release = name
    assert (name, c.namespace) == (RELEASE, NAMESPACE), words
    rendered = helm.helm(
        c.home, c.home / "no-kubeconfig", "template", name, str(c.path(chart)),
        "--namespace", c.namespace, *kept,
    )  # fmt: skip
    check_rendered(c, list(yaml.safe_load_all(rendered)), sets)


def check_rendered(c: Checkout, docs: list[Any], sets: dict[str, str]) -> None:
    """The release's objects are in its namespace, and it runs the image the command names."""
    objects = [d for d in docs if d]
    assert objects
    namespaced = {d["metadata"]["namespace"] for d in objects if "namespace" in d["metadata"]}
    # The release's namespace, and the Role that lets it write Events on Nodes (in default).
    assert c.namespace in namespaced
    assert namespaced <= {c.namespace, "default"}
    repository = sets.get("image.repository")
    if repository is not None:
        assert repository == release.IMAGE_REPOSITORY or repository in c.pushed, repository
        (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
        images = {x["image"] for x in deployment["spec"]["template"]["spec"]["containers"]}
        assert images == {f"{repository}:{version()}"}


def check_kubectl(c: Checkout, words: list[str]) -> None:
    assert words[1:3] == ["-n", c.namespace], words


CHECKS = {
    "git": check_git,
    "cd": check_cd,
    "cp": check_cp,
    "make": check_make,
    "ctr": check_image_load,
    "kind": check_image_load,
    "skopeo": check_image_load,
    "helm": check_helm,
    "kubectl": check_kubectl,
}


def test_every_install_command_is_marked_and_each_page_has_some() -> None:
    unmarked = [
        f"{b.doc}:{b.line}"
        for doc in DOCS
        for b in blocks(doc)
        if INSTALLING.search(b.text) and not b.marked
    ]
    assert unmarked == [], "install commands the test would not run: mark them"
    for doc in DOCS:
        marked = [b for b in blocks(doc) if b.marked]
        assert marked, doc
        # Nothing is published: no command fetches from a registry.
        assert not [b for b in marked if "oci://" in b.text or "ghcr.io" in b.text], doc


def run_page(checkout: Checkout, doc: str, text: str | None = None) -> None:
    """Every marked command of ``doc``, in order, on ``checkout``."""
    if doc in AFTER_INSTALL:
        shutil.copy(ROOT / "examples" / "helm-values.yaml", checkout.root / "values.yaml")
        checkout.installed = options(checkout, list(INSTALLED))[0]
    for block in blocks(doc, text):
        if not block.marked:
            continue
        for words in commands(block.text):
            check = CHECKS.get(words[0])
            assert check is not None, f"{doc}:{block.line}: no check for {words[0]}; teach the test"
            check(checkout, words)


@pytest.mark.parametrize("doc", DOCS)
def test_each_install_command_works_on_the_checkout(checkout: Checkout, doc: str) -> None:
    run_page(checkout, doc)


@pytest.mark.parametrize(
    ("doc", "text", "broken"),
    [
        pytest.param(
            "README.md", "rebalancer-0.1.0.tgz", "rebalancer-0.2.0.tgz", id="a chart not built"
        ),
        pytest.param("README.md", "make release", "make relase", id="a make target misspelt"),
        pytest.param(
            "docs/getting-started.md",
            "--set config.dry_run=false",
            "--set config.dry_rn=false",
            id="a value the chart's schema refuses",
        ),
        pytest.param(
            "docs/getting-started.md",
            "--set image.repository=rebalancer.local/rebalancer",
            "--set image.repository=rebalancer.local/controller",
            id="an image make release does not build",
        ),
        pytest.param(
            "charts/rebalancer/README.md",
            "oci-archive:out/release/rebalancer-image-0.1.0.oci.tar:0.1.0",
            "oci-archive:out/release/rebalancer-image-0.1.0-linux-amd64.oci.tar:0.1.0",
            id="an image tarball of one platform only",
        ),
        pytest.param(
            "docs/upgrade-uninstall.md",
            "-n rebalancer --reset-then-reuse-values",
            "-n rebalancer --reuse-values",
            id="an upgrade that drops the new chart's defaults",
        ),
        pytest.param(
            "docs/upgrade-uninstall.md",
            "helm uninstall rebalancer -n rebalancer",
            "helm uninstall rebalancer -n default",
            id="another namespace than the install's",
        ),
    ],
)
def test_a_command_that_no_longer_works_fails(
    checkout: Checkout, doc: str, text: str, broken: str
) -> None:
    original = (ROOT / doc).read_text()
    assert text in original
    with pytest.raises(AssertionError):
        run_page(checkout, doc, original.replace(text, broken))


@pytest.mark.parametrize(
    ("content", "said"),
    [
        pytest.param(None, "No such file", id="no file"),
        pytest.param("config: [unclosed", "while parsing", id="not YAML"),
        pytest.param("image: {}\n", "no config: block", id="no config block"),
    ],
)
def test_make_check_config_refuses_a_values_file_it_cannot_read_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, said: str
) -> None:
    values = tmp_path / "values.yaml"
    if content is not None:
        values.write_text(content)
    assert settings_of.main([str(values)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"check-config: VALUES={values}: ")
    assert said in line


def test_make_check_config_hands_rebalancer_check_the_config_block_as_it_is() -> None:
    values = ROOT / "examples" / "helm-values.yaml"
    assert (
        yaml.safe_load(settings_of.settings_of(values))
        == yaml.safe_load(values.read_text())["config"]
    )


def rebalancer_check(config: Path) -> subprocess.CompletedProcess[str]:
    """``rebalancer check --config CONFIG``, as the docs run it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "rebalancer"), "check", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_getting_started_shows_what_check_config_prints_on_the_copied_example(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(settings_of.settings_of(ROOT / "examples" / "helm-values.yaml"))
    check = rebalancer_check(config)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"```\n{check.stdout}```" in (ROOT / "docs" / "getting-started.md").read_text()


@pytest.mark.parametrize(
    ("base", "over", "expected"),
    [
        pytest.param({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}, id="maps"),
        pytest.param({"a": [1, 2]}, {"a": [3]}, {"a": [3]}, id="a list replaced whole"),
        pytest.param({"a": {"b": 1}, "d": 4}, {"a": None}, {"d": 4}, id="null removes"),
        pytest.param({"a": {"b": 1}}, {"a": 5}, {"a": 5}, id="a scalar replaces a map"),
    ],
)
def test_values_files_merge_as_helm_merges_a_later_f_file(
    base: dict[str, Any], over: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert settings_of.merged(base, over) == expected


PROMETHEUS_OVERLAYS = sorted((ROOT / "examples" / "prometheus").glob("*.yaml"))


@pytest.mark.parametrize("overlay", PROMETHEUS_OVERLAYS, ids=lambda p: p.name)
def test_a_prometheus_overlay_checks_with_the_values_it_is_laid_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overlay: Path
) -> None:
    """``make check-config VALUES="values.yaml OVERLAY"``, as docs/prometheus.md gives it: the
    settings are those Helm renders from ``-f values.yaml -f OVERLAY``, and they check."""
    base = ROOT / "examples" / "helm-values.yaml"
    assert settings_of.main([str(base), str(overlay)]) == 0
    ours = yaml.safe_load(capsys.readouterr().out)
    assert ours["prometheus"] == yaml.safe_load(overlay.read_text())["config"]["prometheus"]
    rendered = helm.helm(
        tmp_path / "helm", tmp_path / "no-kubeconfig", "template", RELEASE,
        str(ROOT / "charts" / "rebalancer"), "-f", str(base), "-f", str(overlay),
    )  # fmt: skip
    (configmap,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ConfigMap" and "config.yaml" in d["data"]
    ]
    theirs = yaml.safe_load(configmap["data"]["config.yaml"])
    assert {key: theirs[key] for key in ours} == ours
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(ours))
    check = rebalancer_check(config)
    assert check.returncode == 0, check.stdout + check.stderr
