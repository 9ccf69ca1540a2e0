"""The controller's container image, built with no Docker engine and no registry: the
Dockerfile's build stage replayed on this machine (``replay_build_stage``: its COPY and RUN as
written, the project's wheel installed into a virtual environment), laid out as the image lays
it out (``/opt/rebalancer``), over this machine's Python and the shared libraries it and the
installed packages load (``write_layer``), written as a docker-archive tarball that
``ctr images import`` reads (``docker_archive``) or an OCI image layout tarball
(``oci_archive``) that containerd, Docker, skopeo and crane read.

What differs from the image the Dockerfile builds: the base is this machine's interpreter and C
library, not ``python:3.11-slim-bookworm`` (which no registry reached here serves), and the one
platform is this machine's; everything the image runs is the project's own install.
``make release`` (``tools/release.py``) writes it into ``out/release``; the suite builds the same
image, cached per user (``tests/support/controller_image.py``), and runs it on real nodes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
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

ROOT = Path(__file__).resolve().parents[1]
USER = 65532  # the Dockerfile's USER, which the chart's security context demands
VENV = "/opt/rebalancer"
# The base interpreter's library, less what a controller never imports.
UNUSED = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages"}
)
# What the build stage copies (the build context, .dockerignore): the image is made of these.
SOURCES = ("Dockerfile", "pyproject.toml", "README.md", "LICENSE", "rebalancer", "strategies")
# The image's platform: this machine's, as an OCI config names it.
ARCHITECTURE = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


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
            if run.returncode != 0:
                raise RuntimeError(f"{line}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    return venv


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


def controller_entries(venv: Path) -> Iterator[tuple[str, Path]]:
    """(path in the image, path here) for every file, link and directory of the image."""
    yield from interpreter()
    for path in sorted(venv.rglob("*")):
        yield VENV + "/" + str(path.relative_to(venv)), path
    yield from _loaded([*venv.rglob("*.so"), *venv.rglob("*.so.*")])
    for path in sorted(Path("/usr/share/zoneinfo").rglob("*")):  # the windows' time zones
        yield str(path), path


class _Layer:
    """A layer's tar being written: each path once, its parent directories made first."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.made: set[str] = set()

    def directory(self, name: str, mode: int = 0o755, owner: int = 0) -> None:
        parts = Path(name.lstrip("/")).parts
        for i in range(1, len(parts) + 1):
            path = "/".join(parts[:i])
            if path not in self.made:
                self.made.add(path)
                info = tarfile.TarInfo(path)
                info.type = tarfile.DIRTYPE
                info.mode, info.uid, info.gid = mode, owner, owner
                self.tar.addfile(info)

    def data(self, name: str, content: bytes, mode: int = 0o644) -> None:
        self.directory(str(Path(name).parent))
        self.made.add(name.lstrip("/"))
        info = tarfile.TarInfo(name.lstrip("/"))
        info.size, info.mode = len(content), mode
        self.tar.addfile(info, io.BytesIO(content))

    def link(self, name: str, target: str) -> None:
        self.directory(str(Path(name).parent))
        self.made.add(name.lstrip("/"))
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.linkname = tarfile.SYMTYPE, target
        self.tar.addfile(info)


def write_layer(
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
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        layer = _Layer(tar)
        directory, data, link, made = layer.directory, layer.data, layer.link, layer.made

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


def controller_config(version: str) -> dict[str, object]:
    """The image's runtime configuration, the Dockerfile's final stage's: its entry point and
    command, environment, user, working directory, ports and labels."""
    return {
        "Entrypoint": [f"{VENV}/bin/rebalancer"],
        "Cmd": ["run"],
        "Env": [
            f"PATH={VENV}/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
        ],
        "User": f"{USER}:{USER}",
        "WorkingDir": "/var/lib/rebalancer",
        "ExposedPorts": {"8443/tcp": {}, "8081/tcp": {}},
        "Labels": {
            "org.opencontainers.image.title": "rebalancer",
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    }


def _image_config(layer_diff_id: str, config: Mapping[str, object]) -> bytes:
    """The image's configuration blob: its platform, runtime ``config`` and one layer."""
    return json.dumps(
        {
            "architecture": ARCHITECTURE,
            "os": "linux",
            "config": dict(config),
            "rootfs": {"type": "layers", "diff_ids": [layer_diff_id]},
        }
    ).encode()


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def docker_archive(out: Path, ref: str, layer: Path, config: Mapping[str, object]) -> Path:
    """A docker-archive tarball at ``out`` (what ``docker save`` writes): the one-layer image
    ``ref`` whose layer is the tar file ``layer`` and whose runtime ``config`` (Entrypoint, Env,
    User...) is given."""
    diff_id = _sha256_of(layer)
    described = _image_config(diff_id, config)
    config_name = hashlib.sha256(described).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}])
    with tarfile.open(out, "w") as tar:
        tar.add(layer, layer_name)
        for name, data in ((config_name, described), ("manifest.json", manifest.encode())):
            _add_bytes(tar, name, data)
    return out


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _gzipped(layer: Path, out: Path) -> tuple[str, str]:
    """``layer`` compressed into ``out`` (no time stamp in it: the same layer, the same bytes);
    the digests of the layer (its diff id) and of the compressed blob."""
    plain = hashlib.sha256()
    with (
        layer.open("rb") as src,
        out.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as squeezed,
    ):
        while chunk := src.read(1 << 20):
            plain.update(chunk)
            squeezed.write(chunk)
    return "sha256:" + plain.hexdigest(), _sha256_of(out)


def _descriptor(media_type: str, digest: str, size: int) -> dict[str, object]:
    return {"mediaType": media_type, "digest": digest, "size": size}


def oci_archive(out: Path, ref: str, layer: Path, config: Mapping[str, object]) -> Path:
    """An OCI image layout (image-spec v1.1), as a tar file at ``out``: the one-layer image
    ``ref`` (``REPOSITORY:TAG``) whose layer is the tar file ``layer``, gzip-compressed, and
    whose runtime ``config`` is given. The index names the image both ways its readers look:
    ``org.opencontainers.image.ref.name`` (the tag: skopeo's ``oci-archive:FILE:TAG``) and
    ``io.containerd.image.name`` (the whole reference: ``ctr images import``, ``docker load``).
    """
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        blob = Path(work) / "layer.tar.gz"
        diff_id, layer_digest = _gzipped(layer, blob)
        described = _image_config(diff_id, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": _descriptor(
                    "application/vnd.oci.image.config.v1+json",
                    "sha256:" + hashlib.sha256(described).hexdigest(),
                    len(described),
                ),
                "layers": [
                    _descriptor(
                        "application/vnd.oci.image.layer.v1.tar+gzip",
                        layer_digest,
                        blob.stat().st_size,
                    )
                ],
            }
        ).encode()
        manifest_descriptor = _descriptor(
            "application/vnd.oci.image.manifest.v1+json",
            "sha256:" + hashlib.sha256(manifest).hexdigest(),
            len(manifest),
        )
        manifest_descriptor["annotations"] = {
            "org.opencontainers.image.ref.name": ref.rpartition(":")[2],
            "io.containerd.image.name": ref,
        }
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_descriptor],
        }
        with tarfile.open(out, "w") as tar:
            _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add_bytes(tar, "index.json", json.dumps(index).encode())
            for data in (manifest, described):
                _add_bytes(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data)
            info = tar.gettarinfo(blob, "blobs/sha256/" + layer_digest.removeprefix("sha256:"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with blob.open("rb") as f:
                tar.addfile(info, f)
    return out


def controller(out: Path, ref: str, version: str) -> Path:
    """The controller's image ``ref`` as an OCI layout tarball at ``out``: the build stage
    replayed afresh under a temporary directory beside ``out``, then laid out and written."""
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        venv = replay_build_stage(Path(work) / "build")
        layer = Path(work) / "layer.tar"
        write_layer(controller_entries(venv), layer, venv)
        return oci_archive(out, ref, layer, controller_config(version))
