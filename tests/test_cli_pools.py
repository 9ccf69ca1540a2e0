"""``rebalancer pools apply``: one line per problem and exit 2 for a bad file or flag, before any
cluster is asked; then the command in process against the API emulator over HTTP (the default GPU
cluster, served on the wall clock in the test's loop, the command run in a thread as a person
runs it), its lines, its exit status and the PATCH requests it sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from rebalancer import cli
from rebalancer.adapters.actuator import Actuator
from rebalancer.adapters.writer import KubeWriter
from rebalancer.cli import common
from rebalancer.core.outcomes import Outcome
from rebalancer.runtime import wiring
from sandbox.emulator import cluster
from sandbox.emulator.server import serve, write_kubeconfig
from sandbox.emulator.store import Store
from tests.support.actuation import KEYS, MARKS, SPEC
from tests.support.emulated import Requests
from tests.support.processes import ROOT

EXAMPLE = ROOT / "examples" / "pools.yaml"


def write(tmp_path: Path, text: str, name: str = "pools.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def apply(*args: str) -> int:
    return cli.main(["pools", "apply", *args])


# ---------------------------------------------------------------------------------------------
# Bad input: one line each, exit 2, nothing asked of a cluster


def test_every_problem_of_the_file_is_one_line_naming_its_field_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(
        tmp_path,
        """
pools:
  - name: inference-l20
    selector: {matchLabels: {nvidia.com/gpu.product: NVIDIA-L20}}
    labels: {"gpu pool": inference, workload-type: 3}
    taints: ["workload=inference:NoScheduel"]
  - name: training
    selector: {matchExpressions: [{key: nvidia.com/gpu.product, operator: Has, values: [x]}]}
    taints: [{key: workload, value: training, effect: NoSchedule, timeAdded: now}]
""",
    )
    # No kubeconfig is given and none may be read: the file is refused before that.
    assert apply("-f", str(bad), "--kubeconfig", str(tmp_path / "none")) == common.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    at = f"rebalancer: {bad}: pools"
    assert err.splitlines() == [
        f"{at}[0].labels['gpu pool']: key 'gpu pool': a key is at most 63 letters, digits, '-', "
        "'_' or '.' (after an optional 'prefix/'), starting and ending with a letter or digit",
        f"{at}[0].labels['workload-type']=3: must be text; quote it in YAML: '3'",
        f"{at}[0].taints[0]='workload=inference:NoScheduel': write a taint as key=value:Effect "
        "or key:Effect, Effect one of NoSchedule, PreferNoSchedule, NoExecute",
        f"{at}[1].selector.matchExpressions[0].operator='Has': Input should be 'In', 'NotIn', "
        "'Exists' or 'DoesNotExist'",
        f"{at}[1].taints[0].timeAdded='now': unknown field",
    ]


def test_rules_across_pools_are_one_line_each_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(
        tmp_path,
        """
pools:
  - name: a
    selector: {matchLabels: {gpu-pool: inference}}
    labels: {gpu-pool: a}
  - name: a
    selector: {matchLabels: {nvidia.com/gpu.product: NVIDIA-L20}}
    taints: [rebalancer.io/lent=training:NoSchedule, "x:NoSchedule", "x=y:NoSchedule"]
""",
    )
    assert apply("-f", str(bad)) == common.EXIT_USAGE
    at = f"rebalancer: {bad}: pools"
    assert capsys.readouterr().err.splitlines() == [
        f"{at}[1].taints=['rebalancer.io/lent=training:NoSchedule', 'x:NoSchedule', "
        "'x=y:NoSchedule']: taints 1 and 2 both have key 'x' and effect NoSchedule; a node may "
        "have one"
    ]
    bad = write(tmp_path, bad.read_text().replace(', "x=y:NoSchedule"', ""))
    assert apply("-f", str(bad)) == common.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"{at}[0].selector.matchLabels['gpu-pool']: selects by label 'gpu-pool', which this file "
        "sets (pools[0].labels); select by labels the file does not write, e.g. "
        "nvidia.com/gpu.product",
        f"{at}[1].name='a': duplicate pool name; pools[0] has it already",
        f"{at}[1].taints[0].key: key 'rebalancer.io/lent': keys under 'rebalancer.io/' belong "
        "to the controller",
    ]


def test_the_key_prefix_comes_from_the_controllers_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, "key_prefix: gpu.example.com/\n", "config.yaml")
    pools = write(
        tmp_path,
        """
pools:
  - name: a
    selector: {matchLabels: {nvidia.com/gpu.product: NVIDIA-L20}}
    labels: {gpu.example.com/pool: a}
""",
    )
    assert apply("-f", str(pools), "--config", str(config)) == common.EXIT_USAGE
    assert capsys.readouterr().err == (
        f"rebalancer: {pools}: pools[0].labels['gpu.example.com/pool']: key "
        "'gpu.example.com/pool': keys under 'gpu.example.com/' belong to the controller\n"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "must be a mapping with a list of pools under 'pools:'"),
        ("- name: a\n", "must be a mapping with a list of pools under 'pools:'"),
        (
            "pools: [\n",
            "not valid YAML at line 2, column 1: expected the node content, but found "
            "'<stream end>'",
        ),
        ("pools: []\n", "pools=[]: names no pool; a file needs at least one"),
        ("pool: []\n", "pools: is required"),
    ],
)
def test_a_file_that_is_not_a_list_of_pools_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str
) -> None:
    path = write(tmp_path, text)
    assert apply("-f", str(path)) == common.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"rebalancer: {path}: ")
    assert why in err
    assert len(err.splitlines()) == 1 + (text == "pool: []\n")  # and pool: an unknown field


def test_a_missing_file_and_a_kubeconfig_that_cannot_be_read_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert apply("-f", str(tmp_path / "nope.yaml")) == common.EXIT_USAGE
    assert capsys.readouterr().err == f"rebalancer: {tmp_path / 'nope.yaml'}: does not exist\n"
    assert apply("-f", str(EXAMPLE), "--kubeconfig", str(tmp_path / "none")) == common.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"rebalancer: cannot configure the Kubernetes client from {tmp_path}")
    assert len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Against the emulator


@dataclass
class Served:
    store: Store
    kubeconfig: Path
    requests: Requests
    api: client.ApiClient

    @property
    def patches(self) -> int:
        return sum(1 for r in self.requests.seen if r.method == "PATCH")

    async def run(self, *args: str) -> int:
        """The command as a person runs it (its own event loop, in a thread)."""
        argv = ["pools", "apply", *args, "--kubeconfig", str(self.kubeconfig)]
        return await asyncio.to_thread(cli.main, argv)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    store = Store(seed=1)
    cluster.seed(store)
    requests = Requests()
    async with (
        serve(store, on_request=requests) as url,
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield Served(store, write_kubeconfig(url, tmp_path / "kubeconfig"), requests, api)


async def test_a_dry_run_then_an_apply_then_an_apply_that_finds_nothing_to_do(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await served.run("-f", str(EXAMPLE), "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert served.patches == 0
    assert out[0] == (
        "would change node/inference-0: pool inference-l20: +label gpu-pool=inference-l20 "
        "(was inference), +label workload-type=inference"
    )
    assert out[-1] == (
        "dry run: 12 would change, 0 unchanged, 0 refused, 0 matched by no pool; nothing written"
    )

    assert await served.run("-f", str(EXAMPLE)) == 0
    out = capsys.readouterr().out.splitlines()
    assert served.patches == 12
    assert out[8] == (
        "changed node/training-0: pool training-a100: +label batch-scheduling=enabled, "
        "+label gpu-pool=training-a100 (was training), +label workload-type=training"
    )
    assert out[-1] == "12 changed, 0 unchanged, 0 refused, 0 matched by no pool"

    assert await served.run("-f", str(EXAMPLE)) == 0
    assert capsys.readouterr().out == "0 changed, 12 unchanged, 0 refused, 0 matched by no pool\n"
    assert served.patches == 12


async def test_a_lent_node_is_refused_with_its_reason_and_the_exit_status_is_1(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    actuator = Actuator(KubeWriter(client.CoreV1Api(served.api)), KEYS, SPEC, MARKS, wiring.utc_now)
    assert (await actuator.lend("inference-3", "test-lend")).outcome is Outcome.APPLIED
    assert await served.run("-f", str(EXAMPLE)) == common.EXIT_INCOMPLETE
    out = capsys.readouterr().out.splitlines()
    assert (
        "refused node/inference-3: pool inference-l20: lent (rebalancer.io/state=lent: the "
        "controller has lent it or is moving it); not written"
    ) in out
    assert out[-1] == "11 changed, 0 unchanged, 1 refused (lent), 0 matched by no pool"


async def test_json_has_every_node_and_the_summary(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await served.run("-f", str(EXAMPLE), "--json", "--dry-run") == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 13
    assert docs[0] == {
        "node": "inference-0",
        "verdict": "change",
        "pools": ["inference-l20"],
        "edits": [
            "+label gpu-pool=inference-l20 (was inference)",
            "+label workload-type=inference",
        ],
        "written": False,
        "error": None,
        "refusal": None,
        "detail": None,
    }
    assert docs[-1]["summary"]["complete"] is True


async def test_two_pools_selecting_a_node_is_exit_2_and_nothing_is_written(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = EXAMPLE.read_text(encoding="utf-8") + (
        "  - name: big-memory\n"
        "    selector: {matchLabels: {nvidia.com/gpu.count: '8'}}\n"
        "    labels: {memory-tier: high}\n"
    )
    assert await served.run("-f", str(write(tmp_path, text))) == common.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == (
        "rebalancer: node/inference-0: matched by pools inference-l20 and big-memory; a node "
        "belongs to one pool"
    )
    assert lines[-1] == (
        "rebalancer: 12 nodes matched by more than one pool: nothing was written; make the "
        "pools' selectors disjoint"
    )
    assert served.patches == 0
