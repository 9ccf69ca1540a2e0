"""Kueue's Workload CRD on a real kube-apiserver, Workloads as Kueue writes them, and Kueue's
manager itself (``running``).

``tests/kube/kueue/kueue.x-k8s.io_workloads.yaml`` is Kueue v0.17.0's own CRD, copied verbatim
from the module (``sigs.k8s.io/kueue@v0.17.0/config/components/crd/bases``; Apache-2.0, see
``tests/kube/kueue/README.md``), so the tests need no network: ``install_workloads`` creates it
and waits until it is Established and its v1beta2 endpoint answers.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support import kube
from tests.support.processes import ROOT, free_port

Obj = dict[str, Any]
HERE = ROOT / "tests" / "kube" / "kueue"
WORKLOAD_CRD = HERE / "kueue.x-k8s.io_workloads.yaml"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
LENT_TOLERATION = {
    "key": "rebalancer.io/lent",
    "operator": "Equal",
    "value": "training",
    "effect": "NoSchedule",
}


def crd(path: Path = WORKLOAD_CRD) -> Obj:
    """A CRD as the YAML file has it (libyaml's loader when there is one: the file is 1.4 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as f:
        doc: Obj = yaml.load(f, Loader=loader)
    return doc


def install_workloads(server: kube.KubeServer, within: float = 60.0) -> None:
    """Kueue's Workload CRD on ``server`` (again: no error), Established and served."""
    code, doc = server.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd()
    )
    assert code in (201, 409), doc
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        code, listed = server.request("GET", f"/apis/{GROUP}/{VERSION}/workloads?limit=1")
        if code == 200:
            return
        time.sleep(0.1)
    raise TimeoutError(f"workloads.{GROUP}/{VERSION} not served within {within:.0f} s: {listed}")


def workload(
    name: str,
    namespace: str,
    *,
    workers: int = 2,
    gpus: int = 1,
    tolerate_lent: bool = True,
    priority: int | None = None,
    active: bool | None = None,
) -> Obj:
    """A v1beta2 Workload as Kueue's Job integration makes one for a suspended Job: a launcher
    pod set of one and a worker pod set of ``workers`` pods of ``gpus`` GPUs each."""
    tolerations = [copy.deepcopy(LENT_TOLERATION)] if tolerate_lent else []

    def template(gpu: int) -> Obj:
        limits = {"nvidia.com/gpu": str(gpu)} if gpu else {}
        return {
            "spec": {
                "restartPolicy": "Never",
                "tolerations": tolerations,
                "containers": [
                    {
                        "name": "train",
                        "image": "example.com/train:1",
                        "resources": {"limits": limits, "requests": {"cpu": "1"}},
                    }
                ],
            }
        }

    spec: Obj = {
        "queueName": "user-queue",
        "podSets": [
            {"name": "launcher", "count": 1, "template": template(0)},
            {"name": "workers", "count": workers, "template": template(gpus)},
        ],
    }
    if priority is not None:
        spec["priority"] = priority
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def admission(workload: Obj, cluster_queue: str = "cluster-queue", flavor: str = "lent") -> Obj:
    """The ``status.admission`` Kueue writes when it reserves quota for ``workload``."""
    return {
        "clusterQueue": cluster_queue,
        "podSetAssignments": [
            {
                "name": podset["name"],
                "count": podset["count"],
                "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor},
                "resourceUsage": {"cpu": str(podset["count"])},
            }
            for podset in workload["spec"]["podSets"]
        ],
    }


def path(namespace: str, name: str = "") -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/workloads"
    return f"{base}/{name}" if name else base


# ---------------------------------------------------------------------------------------------
# Kueue itself: its manager (cmd/kueue), built by tests/kube/build.sh, beside a real server

MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
WEBHOOK_SERVICE, WEBHOOK_SECRET = "kueue-webhook-service", "kueue-webhook-server-cert"
# The CRDs whose versions Kueue converts by its webhook: its certificate rotator injects its CA
# into each and is not ready until it has (it refuses a CRD without a conversion webhook).
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")


def version() -> str:
    """The Kueue release tests/kube/kueue/go.mod pins (``v0.17.0``)."""
    return kube.pinned(HERE / "go.mod", MODULE)


def manager() -> Path:
    """Kueue's manager: built by tests/kube/build.sh beside the servers' directory."""
    built = kube.binaries().parent / f"kueue-{version()}" / "kueue"
    if not built.exists():
        subprocess.run([str(kube.BUILD)], check=True, capture_output=True, timeout=3600)
    return built


def crds() -> list[Obj]:
    """Every CRD of the pinned Kueue, from its module (in the Go module cache since the build;
    ``go mod download`` fetches it otherwise), the converted ones with their conversion
    webhook pointed at Kueue's Service, as Kueue's own kustomization patches them."""
    bases = _module_dir() / "config" / "components" / "crd" / "bases"
    docs = []
    for path in sorted(bases.glob("*.yaml")):
        doc = WORKLOAD_CRD if path.name == WORKLOAD_CRD.name else path
        made = crd(doc)
        if made["spec"]["names"]["plural"] in CONVERTED:
            made["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {
                            "namespace": NAMESPACE,
                            "name": WEBHOOK_SERVICE,
                            "path": "/convert",
                        }
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        docs.append(made)
    return docs


def _module_dir() -> Path:
    """The pinned Kueue module's source, from the Go module cache (``go mod download``)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version()}"],
        cwd=HERE,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Path(json.loads(out.stdout)["Dir"])


def _ask(server: kube.KubeServer, method: str, path: str, body: Obj, ok: tuple[int, ...]) -> Obj:
    code, doc = server.request(method, path, body)
    assert code in ok, (method, path, doc)
    return dict(doc)


@contextlib.contextmanager
def running(
    server: kube.KubeServer,
    home: Path,
    config: Obj | None = None,
    within: float = 120.0,
    webhooks: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Kueue's manager against ``server`` until the block ends: its CRDs, its namespace and
    the empty Secret its certificate rotator fills, then the manager as the admin, with
    ``config`` over a configuration of loopback ports, no leader election and the batch/v1 Job
    integration only. What the kubelet would do for it, this does: the rotator writes the
    webhook server's certificate into the Secret, and the manager waits for it to be mounted
    in its certificate directory, so it is written there. The visibility API server is off (it
    needs in-cluster configuration).

    Webhooks: without ``webhooks``, no Validating or MutatingWebhookConfiguration is created,
    so the API server never calls Kueue (a Job is then created suspended, as Kueue's
    defaulting webhook would make it). With ``webhooks``, a non-loopback address of this
    machine (``host_address``), Kueue's webhook server listens there and its webhooks for
    Jobs, Workloads and its queues are registered (``_register_webhooks``), until the block
    ends; the server must run with ``--enable-aggregator-routing=true``."""
    for doc in crds():
        _ask(
            server,
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            doc,
            (201, 409),
        )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _ask(server, "POST", "/api/v1/namespaces", namespace, (201, 409))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WEBHOOK_SECRET}}
    _ask(server, "POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", secret, (201, 409))
    home.mkdir(parents=True, exist_ok=True)
    certs, health = home / "certs", f"127.0.0.1:{free_port()}"
    settings: Obj = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": health},
        "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
        "webhook": {"host": webhooks or "127.0.0.1", "port": free_port(), "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "integrations": {"frameworks": ["batch/job"]},
        **(config or {}),
    }
    (home / "config.yaml").write_text(json.dumps(settings), encoding="utf-8")
    registered = (
        _register_webhooks(server, webhooks, settings["webhook"]["port"]) if webhooks else []
    )
    kubeconfig = server.kubeconfig(home / "kubeconfig")
    command = [
        str(manager()),
        f"--config={home / 'config.yaml'}",
        "--feature-gates=VisibilityOnDemand=false",
    ]
    with (home / "kueue.log").open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
        try:
            _mount_certificates(server, process, certs, home, within)
            _wait_ready(process, f"http://{health}/readyz", home, within)
            yield process
        finally:
            for path in registered:  # failurePolicy Fail: not left to refuse the next test's
                _ask(server, "DELETE", path, {}, (200, 404))
            kube.stop(process)


# The webhooks of the kinds the tests use. Kueue registers others (Pods, Deployments...) whose
# integrations these tests leave off: with ``failurePolicy: Fail`` they would refuse every Pod.
HOOKED = {"jobs", "workloads", "clusterqueues", "localqueues", "resourceflavors"}


def host_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one: the API server reaches a
    webhook through its Service's endpoints, and an endpoint may not be a loopback address."""
    out = subprocess.run(["hostname", "-I"], check=True, capture_output=True, text=True, timeout=10)
    found = [w for w in out.stdout.split() if "." in w and not w.startswith("127.")]
    return found[0] if found else None


def _register_webhooks(server: kube.KubeServer, address: str, port: int) -> list[str]:
    """Kueue's Service (no selector) with endpoints at ``address:port`` (an Endpoints and an
    EndpointSlice, as the endpoint controllers would write them), and its webhook
    configurations of the ``HOOKED`` kinds, as Kueue's kustomization names them (the rotator
    injects its CA into them). The paths to delete them all by, once Kueue stops."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": WEBHOOK_SERVICE},
        "spec": {"ports": [{"port": 443, "protocol": "TCP", "targetPort": port}]},
    }
    base = f"/api/v1/namespaces/{NAMESPACE}"
    _ask(server, "POST", f"{base}/services", service, (201,))
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": WEBHOOK_SERVICE},
        "subsets": [{"addresses": [{"ip": address}], "ports": [{"port": port}]}],
    }
    _ask(server, "POST", f"{base}/endpoints", endpoints, (201,))
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": WEBHOOK_SERVICE,
            "labels": {"kubernetes.io/service-name": WEBHOOK_SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"port": port, "protocol": "TCP", "name": ""}],
    }
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    _ask(server, "POST", slices, slice_, (201,))
    manifests = _module_dir() / "config" / "components" / "webhook" / "manifests.yaml"
    paths = [
        f"{base}/services/{WEBHOOK_SERVICE}",
        f"{base}/endpoints/{WEBHOOK_SERVICE}",
        f"{slices}/{WEBHOOK_SERVICE}",
    ]
    for doc in yaml.safe_load_all(manifests.read_text(encoding="utf-8")):
        if not doc:
            continue
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        doc["webhooks"] = [h for h in doc["webhooks"] if _hooked(h)]
        for hook in doc["webhooks"]:
            hook["clientConfig"]["service"].update(name=WEBHOOK_SERVICE, namespace=NAMESPACE)
        kind = "mutating" if doc["kind"].startswith("Mutating") else "validating"
        where = f"/apis/admissionregistration.k8s.io/v1/{kind}webhookconfigurations"
        _ask(server, "POST", where, doc, (201,))
        paths.append(f"{where}/{doc['metadata']['name']}")
    return paths


def _hooked(hook: Obj) -> bool:
    return any(set(rule["resources"]) & HOOKED for rule in hook["rules"])


def _mount_certificates(
    server: kube.KubeServer,
    process: subprocess.Popen[bytes],
    certs: Path,
    home: Path,
    within: float,
) -> None:
    where = f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited with {process.returncode}: see {home}/kueue.log")
        code, secret = server.request("GET", where)
        data = (secret or {}).get("data") or {} if code == 200 else {}
        if {"tls.crt", "tls.key", "ca.crt"} <= set(data):
            certs.mkdir(exist_ok=True)
            for name in ("tls.crt", "tls.key", "ca.crt"):
                (certs / name).write_bytes(base64.b64decode(data[name]))
            return
        time.sleep(0.2)
    raise TimeoutError(f"kueue wrote no certificate within {within:.0f} s: see {home}/kueue.log")


def _wait_ready(process: subprocess.Popen[bytes], url: str, home: Path, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kueue exited with {process.returncode}: see {home}/kueue.log")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"kueue not ready within {within:.0f} s: see {home}/kueue.log")
