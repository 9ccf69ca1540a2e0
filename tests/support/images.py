"""The container images the suite's real nodes run, built here from files on this machine: no
registry is reached and no image is pulled (``imagePullPolicy: Never``).

Each image is one layer in a docker-archive tarball (what ``docker save`` writes and
``ctr images import`` reads): a manifest, a config, a layer. ``build`` writes them once per
directory and ``realnode.running`` imports them into the node's containerd.

- ``PAUSE``: the pod sandbox, a static Go program (``tests/kube/pause``, built by
  ``tests/kube/build.sh`` beside the control plane's binaries);
- ``TRAINING``: busybox (Debian's static build) and ``/bin/train``, a training process that
  records what happens to it (``TRAIN``);
- ``INFERENCE``: busybox's ``httpd`` serving ``ok``, for a readiness probe.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.image import docker_archive

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: no shared library to carry along
PAUSE = "rebalancer.test/pause:1"
TRAINING = "rebalancer.test/training:1"
INFERENCE = "rebalancer.test/inference:1"

# The training process. Its records go to ``$RECORDS/$POD_NAME.log``, one line per event:
# ``<event> <seconds since boot> [detail]``. /proc/uptime (CLOCK_BOOTTIME) is the clock: the same
# on the host, so a test puts the process's records and its own readings on one axis.
# - started: ``start``, or ``resume <bytes>`` when ``$CHECKPOINT`` exists (a run after an eviction;
#   by default ``$RECORDS/checkpoint-$JOB_COMPLETION_INDEX``: a Job's index keeps its checkpoint);
# - a line ``notice <text>`` each time ``/etc/podinfo/annotations`` (a downward-API volume,
#   when mounted) changes;
# - on SIGTERM: ``sigterm``, then a checkpoint of ``$CHECKPOINT_BYTES`` written over
#   ``$CHECKPOINT_SECONDS`` seconds to a temporary file renamed to ``$CHECKPOINT`` when whole
#   (``checkpoint``; a second SIGTERM meanwhile is ignored), then ``exit`` and exit 143
#   (128 + SIGTERM): a process that exits 0 has succeeded, and its Job would count the index
#   done rather than make the pod again. Killed before that, no checkpoint exists;
# - ``/bin/train prestop`` (the pod's preStop hook) records ``prestop``.
# Sleeps run in the background and are waited for, so a signal is handled at once.
TRAIN = r"""#!/bin/sh
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "$1 $(up)${2:+ $2}" >> "$RECORDS/$POD_NAME.log"; }
if [ "$1" = prestop ]; then say prestop; exit 0; fi
CHECKPOINT=${CHECKPOINT:-$RECORDS/checkpoint-${JOB_COMPLETION_INDEX:-0}}
checkpoint() {
  trap '' TERM
  say sigterm
  seconds=${CHECKPOINT_SECONDS:-0}; bytes=${CHECKPOINT_BYTES:-0}
  : > "$CHECKPOINT.part"
  i=0
  while [ "$i" -lt "$seconds" ]; do
    sleep 1 & wait $!
    i=$((i + 1))
    dd if=/dev/zero bs=$((bytes / seconds)) count=1 >> "$CHECKPOINT.part" 2>/dev/null
  done
  [ "$seconds" -gt 0 ] || dd if=/dev/zero bs="$bytes" count=1 >> "$CHECKPOINT.part" 2>/dev/null
  mv "$CHECKPOINT.part" "$CHECKPOINT"
  say checkpoint "$(wc -c < "$CHECKPOINT")"
  say exit
  exit 143
}
trap checkpoint TERM
if [ -f "$CHECKPOINT" ]; then say resume "$(wc -c < "$CHECKPOINT")"; else say start; fi
seen=""
while true; do
  if [ -f /etc/podinfo/annotations ]; then
    now=$(tr '\n' ' ' < /etc/podinfo/annotations)
    [ "$now" = "$seen" ] || { say notice "$now"; seen=$now; }
  fi
  sleep 1 & wait $!
done
"""

SERVE = """#!/bin/sh
mkdir -p /www && echo ok > /www/index.html
exec httpd -f -p "${PORT:-8080}" -h /www
"""


@dataclass(frozen=True)
class Image:
    ref: str
    files: Mapping[str, bytes]  # path in the image -> content (all executable)
    entrypoint: tuple[str, ...]
    busybox: bool = False  # with busybox and a link for each of its applets in /bin


def _busybox_links() -> list[str]:
    listed = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True)
    return [a for a in listed.stdout.split() if a != "busybox"]


def _layer(image: Image) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes | None = None, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = 0  # the same files make the same image
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for directory in ("bin", "dev", "etc", "proc", "sys", "tmp", "var"):
            add(directory)
        add("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n")
        add("etc/group", b"root:x:0:\n")
        if image.busybox:
            add("bin/busybox", BUSYBOX.read_bytes())
            for applet in _busybox_links():
                add(f"bin/{applet}", link="busybox")
        for path, data in sorted(image.files.items()):
            add(path.lstrip("/"), data)
    return out.getvalue()


def archive(image: Image, out: Path) -> Path:
    """``image`` as a docker-archive tarball at ``out``."""
    layer = out.with_suffix(".layer")
    layer.write_bytes(_layer(image))
    try:
        config = {"Entrypoint": list(image.entrypoint), "Env": ["PATH=/bin"]}
        return docker_archive(out, image.ref, layer, config)
    finally:
        layer.unlink()


def images(pause: Path) -> tuple[Image, ...]:
    """The three images; ``pause`` is the sandbox program ``tests/kube/build.sh`` built."""
    return (
        Image(PAUSE, {"bin/pause": pause.read_bytes()}, ("/bin/pause",)),
        Image(TRAINING, {"bin/train": TRAIN.encode()}, ("/bin/train",), busybox=True),
        Image(INFERENCE, {"bin/serve": SERVE.encode()}, ("/bin/serve",), busybox=True),
    )


def build(pause: Path, into: Path) -> list[Path]:
    """The images' tarballs in ``into``, each written unless already there."""
    into.mkdir(parents=True, exist_ok=True)
    made = []
    for image in images(pause):
        out = into / (image.ref.split("/")[-1].replace(":", "-") + ".tar")
        if not out.exists():
            archive(image, out.with_suffix(".part"))
            out.with_suffix(".part").rename(out)
        made.append(out)
    return made
