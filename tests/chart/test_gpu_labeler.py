"""The chart's GPU labeler (``gpuLabeler``): rendered, and its least privilege enforced.

What is rendered: off by default; on, a DaemonSet whose pods know their node from the downward
API, its own ServiceAccount granted only ``get`` and ``patch`` on nodes, and a
ValidatingAdmissionPolicy with its binding.

What is enforced, on a real kube-apiserver only: RBAC cannot say "the node this pod runs on", so
the policy does, and the policy is kube-apiserver's own admission (CEL); the API emulator
implements no admission policies, so these tests take the ``real`` server and not ``backend``.
A pod's bound service-account token carries its node's name, which kube-apiserver puts in
``request.userInfo.extra['authentication.kubernetes.io/node-name']``; the tests, having no
kubelet to mint such a token, impersonate the labeler's ServiceAccount with that extra
(``Impersonate-Extra-authentication.kubernetes.io%2Fnode-name``), as the admin may.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.nvidiasmi import NvidiaSmi
from rebalancer.adapters.writer import KubeWriter, WriteError
from rebalancer.commands import gpu_labeler
from tests.support import kube, objects
from tests.support import nvidia_smi as smi
from tests.support.backends import Opened, Real
from tests.support.chart import NAMESPACE, Doc, one, render
from tests.support.rbac import apply_to, grants, service_account_of

ON: dict[str, Any] = {"gpuLabeler": {"enabled": True}}
NAME = "rebalancer-gpu-labeler"
USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
MERGE = "application/merge-patch+json"
MINE, OTHER = "gpu-node-a", "gpu-node-b"


def labeler_docs(values: dict[str, Any] | None = None) -> list[Doc]:
    return [d for d in render(values or ON) if d["metadata"]["name"] == NAME]


# ---------------------------------------------------------------------------------------------
# Rendered


def test_the_labeler_is_off_by_default() -> None:
    assert not [d for d in render({}) if "gpu-labeler" in d["metadata"]["name"]]


def test_the_labeler_renders_its_own_account_role_policy_and_daemonset() -> None:
    docs = labeler_docs()
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert service_account_of(docs).name == USER
    assert {(g.verb, g.group, g.resource) for g in grants(docs)} == {
        ("get", "", "nodes"),
        ("patch", "", "nodes"),
    }
    dry = labeler_docs({"gpuLabeler": {"enabled": True, "dryRun": True}})
    assert {(g.verb, g.resource) for g in grants(dry)} == {("get", "nodes")}
    policy = one(docs, "ValidatingAdmissionPolicy")["spec"]
    assert policy["matchConditions"] == [
        {"name": "the-gpu-labeler", "expression": f'request.userInfo.username == "{USER}"'}
    ]
    binding = one(docs, "ValidatingAdmissionPolicyBinding")["spec"]
    assert binding == {"policyName": NAME, "validationActions": ["Deny"]}


def test_the_daemonset_knows_its_node_and_reaches_nvidia_smi_through_the_nvidia_runtime() -> None:
    daemonset = one(labeler_docs(), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == NAME
    assert container["args"][0] == "gpu-labeler"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Every NoSchedule taint: nvidia.com/gpu, the pools' serving taints and the lent taint.
    assert {"operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # No selector of the controller's matches the labeler's pods.
    everything = render(ON)
    controller = one(everything, "Deployment")["spec"]["selector"]["matchLabels"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert not controller.items() <= labels.items()
    # Without the runtime class: no NVIDIA variables, a mounted nvidia-smi instead.
    plain = {
        "gpuLabeler": {
            "enabled": True,
            "runtimeClassName": "",
            "nvidiaSmiPath": "/host/usr/bin/nvidia-smi",
            "extraVolumes": [{"name": "host", "hostPath": {"path": "/usr/bin"}}],
            "extraVolumeMounts": [{"name": "host", "mountPath": "/host/usr/bin"}],
        }
    }
    pod = one(labeler_docs(plain), "DaemonSet")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    assert {e["name"] for e in pod["containers"][0]["env"]} == {"NODE_NAME"}
    assert "--nvidia-smi=/host/usr/bin/nvidia-smi" in pod["containers"][0]["args"]


# ---------------------------------------------------------------------------------------------
# Enforced by kube-apiserver


def as_labeler(node: str | None) -> dict[str, str]:
    """Headers that make the admin's request the labeler's, from a pod on ``node`` (None: from
    credentials that name no node)."""
    headers = {"Impersonate-User": USER, "Impersonate-Group": "system:serviceaccounts"}
    if node is not None:
        headers["Impersonate-Extra-authentication.kubernetes.io%2Fnode-name"] = node
    return headers


@dataclass
class Policed:
    """A real cluster with two nodes, the labeler's RBAC, and its admission policy in force."""

    opened: Opened
    server: kube.KubeServer

    def patch(
        self, node: str, body: Any, on: str | None = MINE, dry: bool = False
    ) -> tuple[int, Any]:
        query = "?dryRun=All" if dry else ""
        where = f"/api/v1/nodes/{urllib.parse.quote(node)}{query}"
        return self.server.request("PATCH", where, body, content_type=MERGE, headers=as_labeler(on))

    def labels(self, node: str) -> dict[str, str]:
        code, answer = self.server.request("GET", f"/api/v1/nodes/{node}")
        assert code == 200
        return dict(answer["metadata"].get("labels") or {})


ADMISSION = "/apis/admissionregistration.k8s.io/v1"


@pytest.fixture
async def policed(real: kube.KubeServer, tmp_path: Path) -> AsyncIterator[Policed]:
    docs = labeler_docs()
    async with Real(real, tmp_path).open() as opened:
        for name in (MINE, OTHER):
            node = objects.node(name)
            node["metadata"]["labels"] = {"gpu-pool": "inference"}
            objects.add(opened.objects, node)
        apply_to(opened.objects, docs)  # waits until the authorizer allows the grants
        made = []
        try:
            for kind, plural in (
                ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
                ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
            ):
                code, answer = real.request("POST", f"{ADMISSION}/{plural}", one(docs, kind))
                assert code == 201, answer
                made.append(f"{ADMISSION}/{plural}/{NAME}")
            policed = Policed(opened, real)
            in_force(policed)
            yield policed
        finally:
            for where in made:
                real.request("DELETE", where)


def in_force(policed: Policed, within: float = 30.0) -> None:
    """Wait until kube-apiserver applies the new policy (it loads policies asynchronously): a
    dry-run patch of another node's GPU label is refused."""
    deadline = time.monotonic() + within
    body = {"metadata": {"labels": {"nvidia.com/gpu.count": "1"}}}
    while policed.patch(OTHER, body, dry=True)[0] != 403:
        if time.monotonic() > deadline:
            raise TimeoutError("the GPU labeler's admission policy never came into force")
        time.sleep(0.1)


def message(answer: Any) -> str:
    return str(answer.get("message", "")) if isinstance(answer, dict) else str(answer)


async def test_its_own_nodes_gpu_labels_are_allowed(policed: Policed) -> None:
    body = {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
    code, answer = policed.patch(MINE, body)
    assert code == 200, answer
    assert policed.labels(MINE)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    code, answer = policed.patch(MINE, {"metadata": {"labels": {"nvidia.com/gpu.product": None}}})
    assert code == 200, answer
    assert "nvidia.com/gpu.product" not in policed.labels(MINE)


@pytest.mark.parametrize(
    ("node", "on", "body", "says"),
    [
        (OTHER, MINE, {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}},
         f"only change the node it runs on ({MINE}), not {OTHER}"),
        (MINE, None, {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}},
         "its credentials name no node"),
        (MINE, MINE, {"metadata": {"labels": {"gpu-pool": "training"}}},
         "only change labels under nvidia.com/gpu."),
        (MINE, MINE, {"metadata": {"labels": {"gpu-pool": None}}},
         "only change labels under nvidia.com/gpu."),
        (MINE, MINE, {"metadata": {"labels": {"nvidia.com/gfd.timestamp": "1"}}},
         "only change labels under nvidia.com/gpu."),
        (MINE, MINE, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}},
         "only change a node's labels"),
        (MINE, MINE, {"spec": {"unschedulable": True}}, "only change a node's labels"),
        (MINE, MINE, {"metadata": {"annotations": {"a": "b"}}}, "only change a node's labels"),
    ],
    ids=["another-node", "no-node-name", "another-label", "another-label-removed",
         "gfd-label", "a-taint", "cordon", "an-annotation"],
)  # fmt: skip
async def test_anything_else_is_refused_with_its_reason(
    policed: Policed, node: str, on: str | None, body: Any, says: str
) -> None:
    before = policed.labels(node)
    code, answer = policed.patch(node, body, on=on)
    assert code == 403, answer
    assert says in message(answer)
    assert policed.labels(node) == before


async def test_the_labeler_itself_labels_its_node_and_no_other(
    policed: Policed, tmp_path: Path
) -> None:
    """The labeler's own requests (a merge patch carrying the resourceVersion) pass the policy on
    its node, and are refused on another."""
    source = NvidiaSmi(str(smi.fake(tmp_path / "smi", smi.node_of(smi.H200, 8))))
    config = policed.server.kubeconfig(tmp_path / "kubeconfig")
    async with kubeclient.api_client(config) as api:
        for header, value in as_labeler(MINE).items():
            api.set_default_header(header, value)
        writer = KubeWriter(client.CoreV1Api(api))
        done = await gpu_labeler.label(writer, MINE, source)
        assert done.changes["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert policed.labels(MINE)["nvidia.com/gpu.memory"] == "143771"
        with pytest.raises(WriteError) as refused:
            await gpu_labeler.label(writer, OTHER, source)
    assert refused.value.code == 403
    assert "not gpu-node-b" in refused.value.message
    assert not any(k.startswith("nvidia.com/") for k in policed.labels(OTHER))
