"""The real ``kubectl``, run against a server as a person would run it.

The binary is built with kube-apiserver by ``tests/kube/build.sh`` (``k8s.io/kubernetes``'s
``cmd/kubectl`` at the pinned release) and found where ``kube.binaries`` finds the servers.
``Kubectl.run`` starts it as a child process without blocking the event loop (the emulator a
test talks to is served by that same loop), with the test's kubeconfig and a discovery cache of
its own, and returns what it printed; a non-zero exit fails with kubectl's own words.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support import kube


def binary() -> Path:
    return kube.binaries() / "kubectl"


@dataclass(frozen=True)
class Kubectl:
    executable: Path
    kubeconfig: Path
    cache: Path  # --cache-dir: discovery and OpenAPI cached per test, not in ~/.kube

    async def run(self, *args: str, within: float = 60.0) -> str:
        """``kubectl ARGS``: what it printed on standard output."""
        process = await asyncio.create_subprocess_exec(
            str(self.executable),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.cache}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), within)
        if process.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {process.returncode}: {err.decode().strip()}"
            )
        return out.decode()


def columns(table: str) -> list[dict[str, str]]:
    """``kubectl get``'s table as one mapping per row, by header; cells are read at the
    header's offsets, so an empty cell (a node without the state label) is ``""``."""
    header, *lines = table.splitlines()
    found = list(re.finditer(r"\S+(?: \S+)*", header))  # ``LAST SEEN`` is one header
    names = [match.group() for match in found]
    starts = [match.start() for match in found]
    bounds: list[int | None] = [*starts[1:], None]
    return [
        {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, bounds, strict=True)
        }
        for line in lines
    ]
