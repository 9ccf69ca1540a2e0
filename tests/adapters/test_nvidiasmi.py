"""``NvidiaSmi`` runs a real process: a fake ``nvidia-smi`` written for each test
(``tests.support.nvidia_smi.fake``) that prints a real card's answer, fails as a broken driver
does, refuses compute_cap as an old driver does, or hangs past its deadline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rebalancer.adapters.nvidiasmi import NvidiaSmi
from rebalancer.core.gpulabels import Capability, Gpu, Unreadable
from tests.support import nvidia_smi as smi


async def test_a_real_answer_is_read_into_gpus(tmp_path: Path) -> None:
    script = smi.fake(tmp_path, smi.node_of(smi.H100, 2))
    assert (
        await NvidiaSmi(str(script)).query()
        == (Gpu("NVIDIA-H100-80GB-HBM3", 81559, Capability(9, 0)),) * 2
    )
    assert smi.calls(script) == [
        "--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits"
    ]


async def test_a_driver_that_cannot_be_reached_is_one_line_with_its_exit_status(
    tmp_path: Path,
) -> None:
    script = smi.fake(tmp_path, stderr=smi.DRIVER_ERROR + "\n", status=smi.DRIVER_ERROR_STATUS)
    answer = await NvidiaSmi(str(script)).query()
    assert answer == Unreadable(f"nvidia-smi exited with 9: {smi.DRIVER_ERROR}")


async def test_no_gpu_is_an_error_not_an_empty_node(tmp_path: Path) -> None:
    script = smi.fake(tmp_path, smi.NO_DEVICES + "\n", status=smi.NO_DEVICES_STATUS)
    answer = await NvidiaSmi(str(script)).query()
    assert answer == Unreadable("nvidia-smi exited with 6: No devices were found")
    empty = await NvidiaSmi(str(smi.fake(tmp_path / "empty", ""))).query()
    assert empty == Unreadable("nvidia-smi listed no GPU")


async def test_garbage_on_stdout_is_an_error_naming_the_line(tmp_path: Path) -> None:
    script = smi.fake(tmp_path, f"{smi.A100}\nwhat is this\n")
    answer = await NvidiaSmi(str(script)).query()
    assert isinstance(answer, Unreadable)
    assert answer.reason.startswith("line 2: expected 3 fields")


async def test_a_hang_is_killed_at_the_deadline(tmp_path: Path) -> None:
    script = smi.fake(tmp_path, smi.A100, hang=True)
    started = time.monotonic()
    answer = await NvidiaSmi(str(script), timeout=0.5).query()
    assert answer == Unreadable("nvidia-smi did not answer within 0.5s and was killed")
    assert time.monotonic() - started < 10  # not the fake's 600 s sleep


async def test_an_old_driver_is_asked_again_without_compute_cap(tmp_path: Path) -> None:
    script = smi.fake(tmp_path, "Tesla T4, 15109\n", old_driver=True)
    assert await NvidiaSmi(str(script)).query() == (Gpu("Tesla-T4", 15109, None),)
    assert smi.calls(script) == [
        "--query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits",
        "--query-gpu=name,memory.total --format=csv,noheader,nounits",
    ]


@pytest.mark.parametrize("missing", ["no-such-nvidia-smi", "/nonexistent/nvidia-smi"])
async def test_a_missing_program_is_an_error(missing: str, tmp_path: Path) -> None:
    answer = await NvidiaSmi(missing).query()
    assert isinstance(answer, Unreadable)
    assert answer.reason.startswith(f"nvidia-smi {missing!r} cannot be run:")
