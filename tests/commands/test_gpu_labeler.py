"""The GPU labeler's passes on a real API server: the emulator, then a real kube-apiserver
(``backend``), with a fake ``nvidia-smi`` process printing real cards' answers.

What is counted is what the labeler's client wrote (``Opened.requests``): a node already in
step costs one read and no write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rebalancer.adapters.nvidiasmi import NvidiaSmi
from rebalancer.adapters.writer import KubeWriter, NodeWriter
from rebalancer.commands import gpu_labeler
from rebalancer.core import gpulabels
from rebalancer.core.gpulabels import Gpu, Unreadable
from rebalancer.core.nodestate import NodeChange
from tests.support import nvidia_smi as smi
from tests.support import objects
from tests.support.backends import Backend, Opened
from tests.support.reads import node_obj

NODE = "gpu-a"
OTHERS = {"gpu-pool": "inference", "nvidia.com/gpu.present": "true"}


@pytest.fixture
async def opened(backend: Backend) -> AsyncIterator[Opened]:
    async with backend.open() as cluster:
        node = objects.node(NODE)
        node["metadata"]["labels"] = dict(OTHERS)
        objects.add(cluster.objects, node)
        yield cluster


def labels(opened: Opened) -> dict[str, str]:
    return dict(node_obj(opened.objects, NODE)["metadata"].get("labels") or {})


def writes(opened: Opened) -> int:
    """Node writes the server took (on the real server the log has no response bodies)."""
    seen = opened.requests.seen
    return sum(1 for r in seen if r.resource == "nodes" and r.is_write and 200 <= r.status < 300)


def answering(where: Path, stdout: str = "", **fake: Any) -> NvidiaSmi:
    """``NvidiaSmi`` running a fake in ``where`` (``tests.support.nvidia_smi.fake``)."""
    return NvidiaSmi(str(smi.fake(where, stdout, **fake)))


async def test_a_node_gets_its_gpu_labels_once_and_keeps_its_others(
    opened: Opened, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.H100, 8))))
    writer = KubeWriter(opened.core)
    with caplog.at_level(logging.INFO, "rebalancer.gpulabeler"):
        done = await gpu_labeler.label(writer, NODE, source)
    expected = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.family": "hopper",
    }
    assert done.changes == expected
    assert labels(opened) == {**OTHERS, **expected}
    assert writes(opened) == 1
    # Its own lines: a test before it in the process may have left the root logger at INFO
    # (the controller's wiring sets it), and the emulator's access log then shows here too.
    said = [r.getMessage() for r in caplog.records if r.name == "rebalancer.gpulabeler"]
    assert said == [f"node {NODE}: {key}: (none) -> {value}" for key, value in expected.items()]
    # The same hardware again: a read, no write.
    again = await gpu_labeler.label(writer, NODE, source)
    assert again.changes == {}
    assert writes(opened) == 1


async def test_a_gpu_gone_changes_only_the_count(opened: Opened, tmp_path: Path) -> None:
    writer = KubeWriter(opened.core)
    await gpu_labeler.label(
        writer, NODE, NvidiaSmi(str(smi.fake(tmp_path / "8", smi.node_of(smi.A100, 8))))
    )
    before = labels(opened)
    done = await gpu_labeler.label(
        writer, NODE, NvidiaSmi(str(smi.fake(tmp_path / "7", smi.node_of(smi.A100, 7))))
    )
    assert done.changes == {"nvidia.com/gpu.count": "7"}
    assert labels(opened) == {**before, "nvidia.com/gpu.count": "7"}
    assert writes(opened) == 2


@pytest.mark.parametrize(
    "broken",
    [
        {"stderr": smi.DRIVER_ERROR, "status": smi.DRIVER_ERROR_STATUS},
        {"stdout": "[Unknown Error], [Unknown Error], [Unknown Error]\n"},
        {"stdout": "\x1b[31mgarbage\n"},
        {"stdout": smi.NO_DEVICES + "\n", "status": smi.NO_DEVICES_STATUS},
    ],
    ids=["driver-error", "unknown-error-fields", "garbage", "no-gpu"],
)
async def test_an_nvidia_smi_error_changes_nothing_on_the_node(
    opened: Opened, tmp_path: Path, broken: dict[str, Any]
) -> None:
    writer = KubeWriter(opened.core)
    await gpu_labeler.label(
        writer, NODE, NvidiaSmi(str(smi.fake(tmp_path / "ok", smi.node_of(smi.L40S, 4))))
    )
    before = labels(opened)
    done = await gpu_labeler.label(
        writer, NODE, NvidiaSmi(str(smi.fake(tmp_path / "broken", **broken)))
    )
    assert done.error is not None
    assert labels(opened) == before
    assert writes(opened) == 1


async def test_a_hang_changes_nothing_on_the_node(opened: Opened, tmp_path: Path) -> None:
    writer = KubeWriter(opened.core)
    hung = NvidiaSmi(str(smi.fake(tmp_path, smi.T4, hang=True)), timeout=0.5)
    done = await gpu_labeler.label(writer, NODE, hung)
    assert done.error == "nvidia-smi did not answer within 0.5s and was killed"
    assert labels(opened) == OTHERS
    assert writes(opened) == 0


async def test_a_node_gpu_feature_discovery_labels_is_not_fought(
    opened: Opened, tmp_path: Path
) -> None:
    gfd = {
        gpulabels.GFD_TIMESTAMP: "1728238737",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
    }
    objects.label(opened.objects, NODE, dict(gfd))
    writer = KubeWriter(opened.core)
    source = NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.H100, 7) + smi.A100 + "\n")))
    done = await gpu_labeler.label(writer, NODE, source)
    assert done.stood_down
    assert labels(opened) == {**OTHERS, **gfd}
    assert writes(opened) == 0


async def test_a_mixed_node_is_labelled_for_its_weakest_gpu(opened: Opened, tmp_path: Path) -> None:
    source = NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.B200, 4) + smi.node_of(smi.H200, 4))))
    await gpu_labeler.label(KubeWriter(opened.core), NODE, source)
    got = labels(opened)
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert got["nvidia.com/gpu.memory"] == "143771"
    assert got["nvidia.com/gpu.family"] == "hopper"
    assert got["nvidia.com/gpu.count"] == "8"
    assert got["nvidia.com/gpu.mixed"] == "true"


@dataclass
class ChangedUnderneath:
    """A writer whose first patch finds the node changed since it was read (someone else
    labelled it in between): the patch's resourceVersion is stale, and the server says 409."""

    inner: NodeWriter
    opened: Opened
    patches: int = 0

    async def get_node(self, name: str) -> Any:
        return await self.inner.get_node(name)

    async def list_nodes(self, label_selector: str) -> Any:
        return await self.inner.list_nodes(label_selector)

    async def list_pods(self, node: str) -> Any:
        return await self.inner.list_pods(node)

    async def patch_node(self, name: str, change: NodeChange, resource_version: str) -> Any:
        self.patches += 1
        if self.patches == 1:
            objects.label(self.opened.objects, name, {"team": "ml"})
        return await self.inner.patch_node(name, change, resource_version)

    async def evict(self, namespace: str, name: str, uid: str) -> Any:
        raise AssertionError("the labeler never evicts")

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        raise AssertionError("the labeler never deletes")

    async def annotate_pod(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]
    ) -> bool:
        raise AssertionError("the labeler never writes a pod")

    async def set_pod_condition(
        self, namespace: str, name: str, uid: str, condition: Mapping[str, str]
    ) -> bool:
        raise AssertionError("the labeler never writes a pod")


async def test_a_conflict_is_met_by_reading_the_node_again(opened: Opened, tmp_path: Path) -> None:
    writer = ChangedUnderneath(KubeWriter(opened.core), opened)
    source = NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.T4, 1))))
    done = await gpu_labeler.label(writer, NODE, source)
    assert writer.patches == 2
    assert done.changes["nvidia.com/gpu.family"] == "turing"
    got = labels(opened)
    assert got["team"] == "ml"  # the other writer's label survived
    assert got["nvidia.com/gpu.product"] == "Tesla-T4"
    refused = [r for r in opened.requests.seen if r.resource == "nodes" and r.status == 409]
    assert len(refused) == 1


async def test_a_dry_run_writes_nothing(opened: Opened, tmp_path: Path) -> None:
    source = NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.L20, 2))))
    done = await gpu_labeler.label(KubeWriter(opened.core), NODE, source, dry_run=True)
    assert done.changes["nvidia.com/gpu.product"] == "NVIDIA-L20"
    assert labels(opened) == OTHERS
    assert writes(opened) == 0


@dataclass
class Recovering:
    """A driver that fails the first pass and answers from the second; the loop is stopped
    after ``passes`` passes."""

    good: NvidiaSmi
    stop: asyncio.Event
    passes: int
    asked: int = 0

    async def query(self) -> tuple[Gpu, ...] | Unreadable:
        self.asked += 1
        if self.asked == self.passes:
            self.stop.set()
        if self.asked == 1:
            return Unreadable(f"nvidia-smi exited with 9: {smi.DRIVER_ERROR}")
        return await self.good.query()


async def test_the_loop_tries_again_after_an_error(opened: Opened, tmp_path: Path) -> None:
    stop = asyncio.Event()
    source = Recovering(NvidiaSmi(str(smi.fake(tmp_path, smi.node_of(smi.B200, 8)))), stop, 3)
    await gpu_labeler.run(KubeWriter(opened.core), NODE, source, 0.0, stop)
    assert source.asked == 3
    assert labels(opened)["nvidia.com/gpu.family"] == "blackwell"
    assert writes(opened) == 1
