"""What ``nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits``
prints on real GPUs, and a fake ``nvidia-smi`` that prints it.

The captures. A line is ``name, memory.total (MiB), compute_cap``. No one public page printed
this exact query for every card, so each line is put together from what nvidia-smi printed in
the public sources below (the name as nvidia-smi spells it, the total in MiB), and the compute
capability from NVIDIA's table of CUDA GPUs (https://developer.nvidia.com/cuda-gpus, as
huggingface/huggingface.js#2010 tabulates it: 7.5 T4, 8.0 A100, 8.9 L40S/L4, 9.0 H100/H200,
10.0 B200). Where a value is seen only in public repositories' notes with no address to cite,
the list says so; where nothing was found, it says what the value is taken from.

- A100, ``NVIDIA A100-SXM4-80GB, 81920, 8.0``: the name and the line as seen in public notes
  (``4, NVIDIA A100-SXM4-80GB, 81920 MiB, 8.0`` for the same query with ``index``, no address to
  cite); 81920 also in modal-labs/modal-client#2797 (nvidia-smi's totals across Modal's GPUs).
- H100, ``NVIDIA H100 80GB HBM3, 81559, 9.0``: the name as public benchmark reports print it
  (no address to cite); 81559 in modal-labs/modal-client#2797; 9.0 from NVIDIA's table.
- H200, ``NVIDIA H200, 143771, 9.0``: seen in a public run book as ``NVIDIA H200, 143771 MiB,
  9.0, 5, 16`` (no address to cite); 143771 also in
  https://thundergolfer.com/blog/nvidia-gpu-memory-capacity (Modal's table of NVML totals).
- L20, ``NVIDIA L20, 46068, 8.9``: no capture found. Named as NVIDIA names its L-series; the
  card is documented as 48 GB of GDDR6 on AD102, the L40S's memory on the L40S's chip, so the
  L40S's total is assumed; 8.9 as every Ada Lovelace part.
- L40S, ``NVIDIA L40S, 46068, 8.9``: the name is ``nvidia-smi -q``'s Product Name in
  isaac-sim/IsaacSim#228; 46068 in modal-labs/modal-client#2797; 8.9 from NVIDIA's table.
- T4, ``Tesla T4, 15360, 7.5``: the name is ``nvidia-smi -q``'s Product Name in
  NVIDIA/nvidia-docker#1628; 15360 in modal-labs/modal-client#2797; 7.5 from NVIDIA's table.
- B200, ``NVIDIA B200, 183359, 10.0``: name and total from nvidia-smi's table in
  NVIDIA/TensorRT-LLM#10278 (``166593MiB / 183359MiB``); 10.0 from pytorch/ao#4002.

The driver error is what nvidia-smi prints when it cannot reach the driver (exit status 9); the
old driver's refusal is huggingface/candle#733's (driver 470, before compute_cap existed).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

A100 = "NVIDIA A100-SXM4-80GB, 81920, 8.0"
H100 = "NVIDIA H100 80GB HBM3, 81559, 9.0"
H200 = "NVIDIA H200, 143771, 9.0"
L20 = "NVIDIA L20, 46068, 8.9"
L40S = "NVIDIA L40S, 46068, 8.9"
T4 = "Tesla T4, 15360, 7.5"
B200 = "NVIDIA B200, 183359, 10.0"

CARDS = {"A100": A100, "H100": H100, "H200": H200, "L20": L20, "L40S": L40S, "T4": T4, "B200": B200}

DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
DRIVER_ERROR_STATUS = 9
NO_DEVICES = "No devices were found"
NO_DEVICES_STATUS = 6
NO_CAPABILITY_FIELD = 'Field "compute_cap" is not a valid field to query.'


def node_of(line: str, count: int) -> str:
    """What a node of ``count`` GPUs of one card prints: the card's line, once a GPU."""
    return "\n".join([line] * count) + "\n"


def fake(
    where: Path,
    stdout: str = "",
    *,
    stderr: str = "",
    status: int = 0,
    hang: bool = False,
    old_driver: bool = False,
) -> Path:
    """An executable ``nvidia-smi`` in ``where`` that prints ``stdout`` (and ``stderr``) and exits
    with ``status``; with ``hang``, sleeps far past any deadline instead; with ``old_driver``,
    refuses ``compute_cap`` as a driver 470 does and prints ``stdout`` to a query without it.
    Each run appends its arguments to ``calls.log`` beside it."""
    where.mkdir(parents=True, exist_ok=True)
    out, err = where / "stdout.txt", where / "stderr.txt"
    out.write_text(stdout, encoding="utf-8")
    err.write_text(stderr, encoding="utf-8")
    script = where / "nvidia-smi"
    lines = [
        "#!/bin/sh",
        f'echo "$*" >> {shlex.quote(str(where / "calls.log"))}',
    ]
    if old_driver:
        lines += [
            'case "$*" in *compute_cap*)',
            f"  echo {shlex.quote(NO_CAPABILITY_FIELD)}; exit 2;;",
            "esac",
        ]
    if hang:
        lines.append("exec sleep 600")
    lines += [
        f"cat {shlex.quote(str(out))}",
        f"cat {shlex.quote(str(err))} >&2",
        f"exit {status}",
    ]
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def calls(script: Path) -> list[str]:
    """The argument lines of every run of the fake at ``script``."""
    log = script.parent / "calls.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def on_path(script: Path) -> dict[str, str]:
    """An environment in which ``nvidia-smi`` is the fake."""
    return {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
