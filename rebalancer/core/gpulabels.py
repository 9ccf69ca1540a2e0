"""What a GPU node's ``nvidia.com/gpu.*`` labels should say, from what ``nvidia-smi`` printed.

Where it sits: ``rebalancer gpu-labeler`` (``commands.gpu_labeler``) runs ``nvidia-smi
--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits`` on its node
(``adapters.nvidiasmi``), hands the text to ``read``, and hands the GPUs and the node's labels
to ``decide``; what comes back is the few label changes to send as one merge patch. Nothing
here runs a process or talks to the API, so every rule below is tested on values alone.

The keys and units are NVIDIA GPU Feature Discovery's (docs/design/gpu-labels.md says why), so
one job's nodeAffinity (``nvidia.com/gpu.memory Gt 70000``, ``nvidia.com/gpu.family In
[hopper]``) means the same on a node GFD labels and on one this labels:

| key | value |
|---|---|
| ``nvidia.com/gpu.product`` | the name, spaces as dashes (``NVIDIA-H100-80GB-HBM3``) |
| ``nvidia.com/gpu.memory`` | total memory in MiB, as nvidia-smi reports it |
| ``nvidia.com/gpu.count`` | how many GPUs nvidia-smi listed |
| ``nvidia.com/gpu.compute.major`` / ``.minor`` | the CUDA compute capability |
| ``nvidia.com/gpu.family`` | turing, ampere, ada, hopper or blackwell |
| ``nvidia.com/gpu.mixed`` | ``true`` when the GPUs are not all the same model (ours alone) |

Safety first: on a node with mixed GPUs a pod that selects on a label may get any of them, so
the weakest speaks for the node: the smallest memory, the lowest compute capability, and that
GPU's product and family. A label never promises more than the weakest GPU. A fact that cannot
be known for every GPU (a capability an old driver does not report, a family outside the five)
gives no label rather than a guess.

Errors are values: ``read`` returns ``Unreadable`` with one line naming the line, the field and
the value; the labeler then changes nothing on the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

PREFIX = "nvidia.com/gpu."
PRODUCT = PREFIX + "product"
MEMORY = PREFIX + "memory"
COUNT = PREFIX + "count"
MAJOR = PREFIX + "compute.major"
MINOR = PREFIX + "compute.minor"
FAMILY = PREFIX + "family"
MIXED = PREFIX + "mixed"
# Every key the labeler writes, and so the only keys it ever removes.
OWNED = (PRODUCT, MEMORY, COUNT, MAJOR, MINOR, FAMILY, MIXED)
# GPU Feature Discovery stamps every node it labels with this; there the labeler stands down.
GFD_TIMESTAMP = "nvidia.com/gfd.timestamp"

QUERY = ("name", "memory.total", "compute_cap")
# What an old driver is asked instead: it refuses compute_cap as a field it does not know.
QUERY_WITHOUT_CAPABILITY = ("name", "memory.total")


class Family(StrEnum):
    """The families the labeler names, weakest first (their order is the order of strength)."""

    TURING = "turing"
    AMPERE = "ampere"
    ADA = "ada"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"


_RANK = {f: i for i, f in enumerate(Family)}


@dataclass(frozen=True, slots=True, order=True)
class Capability:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One line of nvidia-smi's answer. ``capability`` is None when the driver did not say."""

    product: str  # as a label value: the name with its spaces as dashes
    memory_mib: int
    capability: Capability | None


@dataclass(frozen=True, slots=True)
class Unreadable:
    """nvidia-smi's answer could not be read; ``reason`` is one line naming field and value."""

    reason: str


# ---------------------------------------------------------------------------------------------
# Reading nvidia-smi's answer

# What nvidia-smi prints in place of a value it could not get: [N/A], [Unknown Error],
# [GPU requires reset], [Insufficient Permissions], [Not Supported]...
_PLACEHOLDER = re.compile(r"\[[^\]]*\]|N/A")
# A capability a driver does not report is missing, not broken.
_ABSENT = {"[n/a]", "n/a", "[not supported]"}
_MEMORY = re.compile(r"(\d+)(?:\s*MiB)?")
_CAPABILITY = re.compile(r"(\d{1,2})\.(\d{1,2})")
# A label value: at most 63 characters, alphanumerics, '-', '_', '.', alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def read(stdout: str, fields: Sequence[str] = QUERY) -> tuple[Gpu, ...] | Unreadable:
    """The GPUs of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``'s output,
    one a line, or why it cannot be read. ``fields`` is ``QUERY`` or
    ``QUERY_WITHOUT_CAPABILITY``."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return Unreadable("nvidia-smi listed no GPU")
    gpus = []
    for number, line in enumerate(lines, start=1):
        gpu = _gpu(line, fields)
        if isinstance(gpu, str):
            return Unreadable(f"line {number}: {gpu}")
        gpus.append(gpu)
    return tuple(gpus)


def _gpu(line: str, fields: Sequence[str]) -> Gpu | str:
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields):
        names = ", ".join(fields)
        return f"expected {len(fields)} fields ({names}), got {len(values)}: {line[:120]!r}"
    name, memory = values[0], values[1]
    if not name or _PLACEHOLDER.fullmatch(name):
        return f"name {name!r}: not a GPU name (the driver could not read it)"
    product = name.replace(" ", "-")
    if not _LABEL_VALUE.fullmatch(product):
        return f"name {name!r}: not a label value once spaces are dashes"
    found = _MEMORY.fullmatch(memory)
    if not found or int(found.group(1)) == 0:
        return f"memory.total {memory!r}: not a number of MiB"
    capability = _capability(values[2]) if len(values) > 2 else None
    if isinstance(capability, str):
        return capability
    return Gpu(product, int(found.group(1)), capability)


def _capability(text: str) -> Capability | str | None:
    if text.lower() in _ABSENT:
        return None
    found = _CAPABILITY.fullmatch(text)
    if not found:
        return f"compute_cap {text!r}: not a compute capability such as 8.0"
    return Capability(int(found.group(1)), int(found.group(2)))


# ---------------------------------------------------------------------------------------------
# From GPUs to labels


def family(gpu: Gpu) -> Family | None:
    """From the compute capability (7.5 turing; 8.0 and 8.6 ampere; 8.9 ada; 9.0 hopper; 10.x and
    12.x blackwell); from the product name only when the driver gave no capability. Anything
    else: None, no family label rather than a guess."""
    if gpu.capability is not None:
        return _BY_CAPABILITY.get((gpu.capability.major, gpu.capability.minor)) or (
            Family.BLACKWELL if gpu.capability.major in (10, 12) else None
        )
    for pattern, named in _BY_NAME:
        if pattern.search(gpu.product):
            return named
    return None


_BY_CAPABILITY = {
    (7, 5): Family.TURING,
    (8, 0): Family.AMPERE,
    (8, 6): Family.AMPERE,
    (8, 9): Family.ADA,
    (9, 0): Family.HOPPER,
}
# Data-centre and workstation names, as nvidia-smi prints them with spaces made dashes. Only for
# drivers too old to report compute_cap, so the newest parts are here for completeness only.
_BY_NAME = [
    (re.compile(p, re.IGNORECASE), f)
    for p, f in (
        (r"(^|-)(B100|B200|B300|GB200|GB300)(-|$)|Blackwell", Family.BLACKWELL),
        (r"(^|-)(H100|H200|H800|H20|GH200)(-|$)", Family.HOPPER),
        (r"(^|-)(L4|L20|L40|L40S)(-|$)|Ada-Generation|RTX-40\d\d", Family.ADA),
        (r"(^|-)(A100|A800|A10|A10G|A16|A2|A30|A40)(-|$)|RTX-A\d{4}|RTX-30\d\d", Family.AMPERE),
        (r"(^|-)T4(-|$)|RTX-20\d\d|Quadro-RTX", Family.TURING),
    )
]


def node_labels(gpus: Sequence[Gpu]) -> dict[str, str]:
    """The labels ``gpus`` (at least one) give their node: the weakest speaks for it."""
    weakest = min(gpus, key=_strength)
    labels = {
        PRODUCT: weakest.product,
        MEMORY: str(min(g.memory_mib for g in gpus)),
        COUNT: str(len(gpus)),
    }
    capabilities = [g.capability for g in gpus]
    if all(c is not None for c in capabilities):
        lowest = min(c for c in capabilities if c is not None)
        labels[MAJOR], labels[MINOR] = str(lowest.major), str(lowest.minor)
    families = [family(g) for g in gpus]
    if all(f is not None for f in families):
        labels[FAMILY] = min((f for f in families if f is not None), key=_RANK.__getitem__).value
    if len({g.product for g in gpus}) > 1:
        labels[MIXED] = "true"
    return labels


def _strength(gpu: Gpu) -> tuple[tuple[int, int], int, int]:
    """Weakest first: by compute capability (an unknown one below every known one), then by
    family (which the name gives when the capability is unknown), then by memory."""
    known = gpu.capability
    named = family(gpu)
    return (
        (known.major, known.minor) if known is not None else (-1, -1),
        _RANK[named] if named is not None else -1,
        gpu.memory_mib,
    )


# ---------------------------------------------------------------------------------------------
# Against what the node says now


class Stand(StrEnum):
    LABEL = "label"  # write what changed
    GFD = "gfd"  # GPU Feature Discovery labels this node: write nothing


@dataclass(frozen=True, slots=True)
class Decision:
    """What to send: ``changes`` maps each owned key that differs to its new value, or to None
    to remove it; empty when the node already says it."""

    stand: Stand
    changes: Mapping[str, str | None]


def decide(current: Mapping[str, str], gpus: Sequence[Gpu]) -> Decision:
    """The changes that bring the node's owned labels in step with ``gpus``.

    A node GFD labels is left alone entirely (its keys are ours too, and two writers of one key
    would take turns overwriting each other). Elsewhere every owned key is set to what the
    hardware says, and an owned key the hardware no longer gives (a capability the driver stopped
    reporting, ``mixed`` on a node now uniform) is removed: a stale label is a promise nobody keeps.
    No other label is read or written."""
    if GFD_TIMESTAMP in current:
        return Decision(Stand.GFD, {})
    wanted = node_labels(gpus)
    changes: dict[str, str | None] = {}
    for key in OWNED:
        value = wanted.get(key)
        if current.get(key) != value:
            changes[key] = value
    return Decision(Stand.LABEL, changes)
