"""The ``rebalancer`` command as a process: its environment, a cluster and settings to run it
against, the chart's Deployment laid out locally, and what it leaves behind.

``setup`` serves the default cluster on the wall clock (the process reads the wall clock too)
and writes a kubeconfig and a settings file (``config_text``: leader election as asked,
Prometheus pointed at a closed port so demand is unknown and nothing is lent, the audit log in a
SQLite file). ``as_pod`` lays out the rendered Deployment's volumes under a directory and
resolves its container; ``start_pod`` runs it as the kubelet would. ``Cluster`` reads the
emulator through its API; ``probe`` is a kubelet's HTTP probe; ``read_audit`` reads an audit
store back. ``start`` runs ``rebalancer ARGS`` with its output piped, ``run_cli`` to its end.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from rebalancer.adapters import kubeclient
from rebalancer.adapters.audit import SqlAuditStore, every_record
from rebalancer.core.audit import AuditRecord
from sandbox.emulator import cluster
from sandbox.emulator.server import RequestObserver, serve, write_kubeconfig
from sandbox.emulator.store import Store

ROOT = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """The block holds an exclusive lock on the file ``path`` (made if missing), which parallel
    test workers wait for; released if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def free_port(*taken: int) -> int:
    """A port nothing listens on (bound, then closed), none of ``taken``: once a port is closed
    the kernel may hand it out again at once, so two calls can answer the same port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def child_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("REBALANCER_") and k != "KUBERNETES_SERVICE_HOST"
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


@dataclass
class Cluster:
    """The emulator read through its API, as the test reads it (an admin where RBAC is on)."""

    url: str
    session: aiohttp.ClientSession

    async def get(self, path: str) -> Any:
        async with self.session.get(self.url + path) as r:
            assert r.status == 200, await r.text()
            return await r.json()

    async def nodes(self) -> dict[str, Any]:
        listed = await self.get("/api/v1/nodes")
        return {n["metadata"]["name"]: n for n in listed["items"]}

    async def pods(self) -> list[Any]:
        listed = await self.get("/api/v1/pods")
        items: list[Any] = listed["items"]
        return items


# ---------------------------------------------------------------------------------------------
# The chart's Deployment, run as a local process


@dataclass(frozen=True)
class Pod:
    """A container of the chart as a local process: what ``start_pod`` runs.

    ``argv`` and ``env`` are the container's ``args`` and ``env`` as the kubelet would give them
    (downward API fields resolved, mount paths moved under ``root``); ``port`` its API's
    (``https``) port and ``health_port`` its probes' (plain http); ``liveness`` and
    ``readiness`` its probes' paths (0 and "" for a Job's, which has none).
    """

    root: Path
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    health_port: int
    liveness: str
    readiness: str


def as_pod(
    docs: Iterable[Doc],
    root: Path,
    *,
    name: str,
    namespace: str,
    secrets: Mapping[tuple[str, str], str] | None = None,
    kind: str = "Deployment",
) -> Pod:
    """Lay out the rendered Deployment's (or Job's: ``kind``) volumes under ``root`` and
    resolve its container.

    Every volume is a directory ``root/<mountPath>``; a ConfigMap volume gets the rendered
    ConfigMap's files, a Secret volume the rendered Secret's (the node-state key). Any text
    naming a mount path (an env value, a settings file) names the directory under ``root``
    instead, like a chroot. The service account token mount is not
    emulated: the test gives the process a kubeconfig with the account's token. ``secrets``
    holds what ``secretKeyRef`` variables read: (Secret name, key) -> value.
    """
    docs = list(docs)
    (workload,) = [d for d in docs if d["kind"] == kind]
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    rendered_secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    pod = workload["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}

    # One pass, longest path first, whole path segments only: "/tmp" is not in "/tmpfoo".
    any_mount = re.compile(
        "(?:"
        + "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
        + ")(?=/|$|[^\\w.-])",
        re.MULTILINE,
    )

    def moved(text: str) -> str:
        return any_mount.sub(lambda m: str(root) + m.group(0), text)

    for path, volume in mounts.items():
        directory = root / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = configmaps[volume["configMap"]["name"]]["data"]
            for key, text in data.items():
                (directory / key).write_text(moved(text))
        elif "secret" in volume and volume["secret"]["secretName"] in rendered_secrets:
            data = rendered_secrets[volume["secret"]["secretName"]].get("data") or {}
            for key, encoded in data.items():
                (directory / key).write_bytes(base64.b64decode(encoded))
    fields = {"metadata.name": name, "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = moved(var["value"])
        elif "fieldRef" in source:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            env[var["name"]] = (secrets or {})[ref["name"], ref["key"]]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    probes = {
        name: container[name]["httpGet"]["path"] if name in container else ""
        for name in ("livenessProbe", "readinessProbe")
    }
    return Pod(
        root=root,
        argv=tuple(container["args"]),
        env=env,
        port=ports.get("https", 0),
        health_port=ports.get("health", 0),
        liveness=probes["livenessProbe"],
        readiness=probes["readinessProbe"],
    )


async def start_pod(pod: Pod, kubeconfig: Path) -> asyncio.subprocess.Process:
    """``rebalancer <args>`` with the container's environment (and ``KUBECONFIG``, standing in
    for the in-cluster service account), the way the image's entrypoint runs it."""
    env = {**child_env(), **pod.env, "KUBECONFIG": str(kubeconfig)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rebalancer",
        *pod.argv,
        cwd=pod.root,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def start(*args: str) -> asyncio.subprocess.Process:
    """``rebalancer ARGS`` as a process of its own, its output piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rebalancer",
        *args,
        cwd=ROOT,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_cli(*args: str, within: float = 20.0) -> tuple[int, str, str]:
    """``rebalancer ARGS`` to its end: exit code, stdout, stderr."""
    proc = await start(*args)
    async with asyncio.timeout(within):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# ---------------------------------------------------------------------------------------------
# Waiting on processes and probes


async def probe(session: aiohttp.ClientSession, url: str) -> bool:
    """An HTTP probe as the kubelet sends it: any status from 200 to 399 is success."""
    with contextlib.suppress(aiohttp.ClientError):
        async with session.get(url) as response:
            return 200 <= response.status < 400
    return False


async def read_audit(url: str) -> list[AuditRecord]:
    """Every record of the audit store at ``url``, oldest first, page by page."""
    store = await SqlAuditStore.open(url)
    try:
        return await every_record(store)
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------------
# A cluster and settings for one command


@dataclass
class Setup:
    store: Store
    url: str
    api: Any
    kubeconfig: Path
    config: Path
    audit_db: Path
    http_port: int  # the API: https, a self-signed certificate, open (see ``config_text``)
    health_port: int  # the probes: plain http


NODE_STATE_KEY = "a-test-key-the-processes-of-one-test-share-" * 2


def node_state_keys(home: Path) -> Path:
    """A directory in ``home`` holding the node-state key ``current``, as the chart mounts its
    Secret: the processes of one test (a restart, a second replica, ``rebalancer reclaim``)
    sign and verify with one key, as the pods of one release do."""
    directory = home / "node-state-keys"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "current").write_text(NODE_STATE_KEY, encoding="utf-8")
    return directory


def config_text(
    audit_db: Path,
    http_port: int,
    election: bool = False,
    health_port: int | None = None,
    authentication: str = "none",
) -> str:
    """Settings of one pool; the node-state key beside ``audit_db``. The HTTP API is open
    (``authentication: none``) by default: the emulator reviews no token (a test that wants the
    cluster's reviews runs on a real server)."""
    health = health_port if health_port is not None else free_port(http_port)
    return f"""
tick_interval: 2s
node_state_keys: {node_state_keys(audit_db.parent)}
leader_election: {{enabled: {str(election).lower()}}}
prometheus:
  url: http://127.0.0.1:{free_port(http_port, health)}
  timeout: 1s
  attempts: 1
  retry_budget: 1s
audit: {{url: "sqlite+aiosqlite:///{audit_db}"}}
http:
  {{host: 127.0.0.1, port: {http_port}, health_port: {health}, authentication: {authentication}}}
pools:
  - name: inference
    node_selector: {{gpu-pool: inference}}
    inference_selector: {{app: llm-serving}}
    rps_per_node: 100
    strategy: reactive
"""


@contextlib.asynccontextmanager
async def setup(
    tmp_path: Path, election: bool = False, on_request: RequestObserver | None = None
) -> AsyncIterator[Setup]:
    """The default cluster served over HTTP (every request told to ``on_request``), a
    kubeconfig for it and settings with one pool."""
    store = Store(seed=1)
    cluster.seed(store)
    served = serve(store, on_request=on_request)
    async with served as url, kubeclient.opened(client.Configuration(host=url)) as api:
        kubeconfig = write_kubeconfig(url, tmp_path / "kubeconfig")
        audit_db = tmp_path / "audit.sqlite3"
        port, health = free_port(), free_port()
        config = tmp_path / "config.yaml"
        config.write_text(config_text(audit_db, port, election, health), encoding="utf-8")
        yield Setup(store, url, api, kubeconfig, config, audit_db, port, health)
