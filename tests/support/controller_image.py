"""The controller's container image, built on this machine with no Docker engine and no registry:
the Dockerfile's build stage replayed here (``replay_build_stage``: its COPY and RUN as written,
the project's wheel installed into a virtual environment), laid out as the image lays it out
(``/opt/rebalancer``), over this machine's Python and the shared libraries it and the installed
packages load: a docker-archive tarball that ``ctr images import`` reads (``build``).

What differs from the released image: the base is this machine's interpreter and C library,
not ``python:3.11-slim-bookworm`` (which no registry here serves); everything the image runs
is the project's own install. The tarball is kept per user, keyed by what goes into it, and built
under a lock, so that parallel test workers build it once.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from tests.support import images
from tests.support.processes import ROOT, locked

REF = "rebalancer.test/controller:dev"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rebalancer" / "images"
USER = 65532  # the Dockerfile's USER, which the chart's security context demands
VENV = "/opt/rebalancer"
# The base interpreter's library, less what a controller never imports.
UNUSED = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages"}
)
SOURCES = ("Dockerfile", "pyproject.toml", "README.md", "rebalancer", "strategies")


# What lets pip reach PyPI from this machine (a proxy, its certificate, a mirror); the build's
# own settings come from the Dockerfile. The machine's other pip settings (a local wheel
# directory) are left out: the image is built from what the index serves.
HOW_THIS_MACHINE_REACHES_PYPI = (
    "PIP_INDEX_URL", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
)  # fmt: skip


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


def replay_build_stage(into: Path) -> Path:
    """Run the Dockerfile's build stage here, under ``into``; return its virtual environment.

    Its ENV, WORKDIR, COPY and RUN instructions are carried out as written, the image's paths
    moved under ``into``. ``python`` on the PATH is the suite's interpreter and nothing else is:
    a dependency that had to be compiled fails here as it would in the slim base image.
    """
    build = stages()[0]
    (venv_in_image,) = [
        m.group(1) for line in build if (m := re.fullmatch(r"RUN python -m venv (\S+)", line))
    ]
    venv = into / venv_in_image.lstrip("/")
    tools = into / "tools"
    tools.mkdir(parents=True)
    # The interpreter itself, not the path this checkout reaches it by (its own virtual
    # environment's link): the environment made here is cached and outlives the checkout.
    (tools / "python").symlink_to(os.path.realpath(sys.executable))
    (into / "home").mkdir()
    env = {
        "PATH": str(tools),
        "HOME": str(into / "home"),
        **{name: os.environ[name] for name in HOW_THIS_MACHINE_REACHES_PYPI if name in os.environ},
    }
    workdir = into
    for line in build[1:]:
        instruction, _, rest = line.partition(" ")
        if instruction == "ENV":
            env.update(word.partition("=")[::2] for word in shlex.split(rest))
        elif instruction == "WORKDIR":
            workdir = into / rest.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif instruction == "COPY":
            *sources, target = rest.split()
            for source in sources:
                destination = workdir / target
                if target.endswith("/"):
                    destination /= source
                if (ROOT / source).is_dir():
                    ignore = shutil.ignore_patterns("__pycache__")
                    shutil.copytree(ROOT / source, destination, ignore=ignore)
                else:
                    shutil.copy(ROOT / source, destination)
        elif instruction == "RUN":
            command = rest.replace(venv_in_image, str(venv))
            run = subprocess.run(
                ["/bin/sh", "-c", command],
                check=False,
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert run.returncode == 0, f"{line}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return venv


def _key() -> str:
    """What the image is made of: the build's inputs and the interpreter under it."""
    digest = hashlib.sha256(sys.version.encode() + sys.base_prefix.encode())
    for name in SOURCES:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def _libraries(files: list[Path]) -> set[str]:
    """The shared libraries ``files`` (executables and extension modules) load, as ``ldd``
    names them, and the dynamic loader itself."""
    found: set[str] = set()
    for chunk in range(0, len(files), 200):
        out = subprocess.run(
            ["ldd", *map(str, files[chunk : chunk + 200])],
            check=False,
            capture_output=True,
            text=True,
        ).stdout
        found.update(re.findall(r"(?:=> )?(/\S+) \(0x", out))
    return found


def interpreter(unused: AbstractSet[str] = UNUSED) -> Iterator[tuple[str, Path]]:
    """(path in an image, path here) for this machine's Python, at the paths it has here: the
    interpreter, its shared library, its standard library less the directories ``unused`` names,
    and the shared libraries ``ldd`` finds for the interpreter and its extension modules."""
    prefix = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"])
    executable = Path(os.path.realpath(sys.executable))
    yield str(executable), executable
    for library in prefix.glob("lib/libpython*.so*"):
        yield str(library), library
    for path in sorted(stdlib.rglob("*")):
        if not set(path.relative_to(stdlib).parts) & unused:
            yield str(path), path
    yield from _loaded([executable, *stdlib.rglob("*.so")])


def _loaded(files: list[Path]) -> Iterator[tuple[str, Path]]:
    for name in sorted(_libraries([p for p in files if p.is_file()])):
        yield name, Path(os.path.realpath(name))


def _entries(venv: Path) -> Iterator[tuple[str, Path]]:
    """(path in the image, path here) for every file, link and directory of the image."""
    yield from interpreter()
    for path in sorted(venv.rglob("*")):
        yield VENV + "/" + str(path.relative_to(venv)), path
    yield from _loaded([*venv.rglob("*.so"), *venv.rglob("*.so.*")])
    for path in sorted(Path("/usr/share/zoneinfo").rglob("*")):  # the windows' time zones
        yield str(path), path


def _layer(
    entries: Iterable[tuple[str, Path]],
    out: Path,
    venv: Path | None = None,
    links: Mapping[str, str] | None = None,
) -> None:
    """The image's one layer, a tar file at ``out``: ``entries`` (the first of a path wins), the
    symbolic ``links`` (path -> target), the users and ``/tmp``; and for the controller's
    (``venv`` is the environment replayed here), its scripts' interpreter line moved to the
    image's path and the working directory its user owns."""
    executable = os.path.realpath(sys.executable)
    made: set[str] = set()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:

        def directory(name: str, mode: int = 0o755, owner: int = 0) -> None:
            parts = Path(name.lstrip("/")).parts
            for i in range(1, len(parts) + 1):
                path = "/".join(parts[:i])
                if path not in made:
                    made.add(path)
                    info = tarfile.TarInfo(path)
                    info.type = tarfile.DIRTYPE
                    info.mode, info.uid, info.gid = mode, owner, owner
                    tar.addfile(info)

        def data(name: str, content: bytes, mode: int = 0o644) -> None:
            directory(str(Path(name).parent))
            made.add(name.lstrip("/"))
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))

        def link(name: str, target: str) -> None:
            directory(str(Path(name).parent))
            made.add(name.lstrip("/"))
            info = tarfile.TarInfo(name.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)

        for name, here in entries:
            if name.lstrip("/") in made:
                continue
            if here.is_symlink():
                target = os.readlink(here)
                if os.path.realpath(here) == executable:
                    target = executable  # the venv's python: the image's interpreter
                link(name, target)
            elif here.is_dir():
                directory(name)
            elif here.is_file():
                content = here.read_bytes()
                shebang = b"#!" + str(venv).encode()
                if venv and name.startswith(VENV + "/bin/") and content.startswith(shebang):
                    content = b"#!" + VENV.encode() + content[len(shebang) :]  # a script's
                data(name, content, here.stat().st_mode & 0o777)
        for name, target in (links or {}).items():
            link(name, target)
        data(
            "/etc/passwd",
            f"root:x:0:0::/:/bin/false\nnonroot:x:{USER}:{USER}::/:/bin/false\n".encode(),
        )
        data("/etc/group", f"root:x:0:\nnonroot:x:{USER}:\n".encode())
        directory("/tmp", 0o1777)
        if venv:
            directory("/var/lib/rebalancer", 0o755, USER)


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
            _layer(_entries(venv), layer, venv)
            config = {
                "Entrypoint": [f"{VENV}/bin/rebalancer"],
                "Env": [
                    f"PATH={VENV}/bin:/usr/bin:/bin",
                    "PYTHONDONTWRITEBYTECODE=1",
                    "PYTHONUNBUFFERED=1",
                ],
                "User": f"{USER}:{USER}",
                "WorkingDir": "/var/lib/rebalancer",
            }
            images.docker_archive(out.with_suffix(".part"), REF, layer, config).rename(out)
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
            _layer(interpreter(UNUSED | {static, "__pycache__"}), layer, links=links)
            config = {
                "Entrypoint": ["python"],
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED=1"],
            }
            images.docker_archive(out.with_suffix(".part"), PYTHON, layer, config).rename(out)
        for old in CACHE.glob("python-*.tar"):
            if old != out:
                old.unlink()  # of another interpreter
    return out
