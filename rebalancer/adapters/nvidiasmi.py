"""``nvidia-smi``, asked what GPUs its node has, as a process with a deadline.

Where it sits: the GPU labeler (``commands.gpu_labeler``) asks ``NvidiaSmi.query`` once a pass
and hands what comes back to ``core.gpulabels.decide``. The reading itself is
``core.gpulabels.read``; this module only runs the process and turns what can go wrong with it
into the same
``Unreadable`` value: a program that cannot be started, a driver that does not answer (nvidia-smi
exits 9 with "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"), no
GPU (exit 6, "No devices were found"), a hang.

Why a process group: a hung nvidia-smi (a GPU falling off the bus makes NVML block) must not
outlive its deadline, and neither may anything it started; the process runs in a session of its
own and the whole group is killed at the deadline.

Old drivers (before compute_cap existed as a query field) refuse the whole query with
``Field "compute_cap" is not a valid field to query.``; the query is then asked again without it,
and the labeler names the family from the product name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Protocol

from rebalancer.core import gpulabels
from rebalancer.core.gpulabels import Gpu, Unreadable


class GpuSource(Protocol):
    async def query(self) -> tuple[Gpu, ...] | Unreadable: ...


@dataclass(frozen=True, slots=True)
class NvidiaSmi:
    """``GpuSource`` from the ``nvidia-smi`` at ``path``, each run given ``timeout`` seconds."""

    path: str = "nvidia-smi"
    timeout: float = 10.0

    async def query(self) -> tuple[Gpu, ...] | Unreadable:
        answer = await self._run(gpulabels.QUERY)
        if isinstance(answer, Unreadable) and _no_capability_field(answer.reason):
            fields = gpulabels.QUERY_WITHOUT_CAPABILITY
            retried = await self._run(fields)
            return retried if isinstance(retried, Unreadable) else gpulabels.read(retried, fields)
        return answer if isinstance(answer, Unreadable) else gpulabels.read(answer)

    async def _run(self, fields: tuple[str, ...]) -> str | Unreadable:
        """stdout of a run that exited 0, or why there is none."""
        args = [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            process = await asyncio.create_subprocess_exec(
                self.path,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return Unreadable(f"nvidia-smi {self.path!r} cannot be run: {exc.strerror or exc}")
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            _kill_group(process.pid)
            await process.communicate()
            return Unreadable(f"nvidia-smi did not answer within {self.timeout:g}s and was killed")
        finally:
            if process.returncode is None:  # cancelled from outside: leave nothing behind
                _kill_group(process.pid)
        if process.returncode != 0:
            said = _first_line(err) or _first_line(out) or "(nothing on stdout or stderr)"
            return Unreadable(f"nvidia-smi exited with {process.returncode}: {said}")
        return out.decode("utf-8", "replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _first_line(raw: bytes) -> str:
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _no_capability_field(reason: str) -> bool:
    return "compute_cap" in reason and "not a valid field" in reason
