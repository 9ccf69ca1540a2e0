"""What the end-to-end test runs beside the controller: a fake vLLM exporter and a real Prometheus.

``Exporter`` serves, on 127.0.0.1, what vLLM and kube-state-metrics would: per inference pod
``vllm:request_success_total`` (a counter advanced on the wall clock at ``rps`` requests per
second in all, split evenly over the pods), ``vllm:num_requests_waiting`` (``waiting`` in all),
``vllm:num_requests_running``, and ``kube_pod_info`` joining each pod to its node, with the
``namespace``/``pod``/``node`` labels the default queries of ``rebalancer.adapters.metrics``
join on. ``prometheus`` starts Debian's ``prometheus`` scraping it every second.

The RBAC helpers put the Helm chart's ServiceAccount, ClusterRole(s), Role(s) and bindings into
the emulator through its API as an admin (``system:masters``), so the controller can run as the
chart's service account under exactly the rendered rules, and compare what it was granted
(``grants``) with what it used (the emulator's ``Access.decisions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rebalancer.adapters.audit import AuditQuery, SqlAuditStore
from rebalancer.core.audit import AuditRecord
from sandbox.emulator.auth import Access, Decision, admin, service_account
from sandbox.emulator.rbac import User

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "admin-token"  # a system:masters user: the test itself, applying manifests
CONTROLLER_TOKEN = "controller-token"  # the chart's service account: the controller
RBAC_GROUP = "rbac.authorization.k8s.io"
# Where each applied kind is created (all namespaced ones in their own namespace).
_COLLECTIONS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": f"/apis/{RBAC_GROUP}/v1/clusterroles",
    "ClusterRoleBinding": f"/apis/{RBAC_GROUP}/v1/clusterrolebindings",
    "Role": f"/apis/{RBAC_GROUP}/v1/namespaces/{{ns}}/roles",
    "RoleBinding": f"/apis/{RBAC_GROUP}/v1/namespaces/{{ns}}/rolebindings",
}
Doc = dict[str, Any]


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("REBALANCER_") and k != "KUBERNETES_SERVICE_HOST"
    }
    env["PYTHONPATH"] = str(ROOT)
    return env


def service_account_of(docs: Iterable[Doc]) -> User:
    """The user the chart's ServiceAccount authenticates as."""
    (account,) = [d for d in docs if d.get("kind") == "ServiceAccount"]
    meta = account["metadata"]
    return service_account(meta["namespace"], meta["name"])


def chart_access(docs: Iterable[Doc]) -> Access:
    """Tokens for an admin and for the chart's service account."""
    return Access({ADMIN_TOKEN: admin(), CONTROLLER_TOKEN: service_account_of(docs)})


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def apply_rbac(url: str, docs: Iterable[Doc]) -> list[Doc]:
    """Create the chart's ServiceAccount and RBAC objects in the emulator at ``url``, as the
    admin, through the API (a 201 each); returns what was applied."""
    applied = [d for d in docs if d.get("kind") in _COLLECTIONS]
    async with aiohttp.ClientSession(headers=admin_headers()) as session:
        for doc in applied:
            path = _COLLECTIONS[doc["kind"]].format(ns=doc["metadata"].get("namespace", ""))
            async with session.post(url + path, json=doc) as response:
                assert response.status == 201, await response.text()
    return applied


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource (``pods/eviction`` for a subresource) of one API group, granted
    cluster-wide (``namespace`` empty: a ClusterRole) or in one namespace (a Role), limited to
    ``names`` when the rule lists resourceNames."""

    verb: str
    group: str
    resource: str
    namespace: str = ""
    names: tuple[str, ...] = ()

    def covers(self, d: Decision) -> bool:
        resource = d.resource + (f"/{d.subresource}" if d.subresource else "")
        return (
            (self.verb, self.group, self.resource) == (d.verb, d.group, resource)
            and (not self.namespace or self.namespace == d.namespace)
            and (not self.names or d.name in self.names)
        )


def grants(docs: Iterable[Doc]) -> set[Grant]:
    """Every grant of the rendered ClusterRoles (cluster-wide) and Roles (in their namespace)."""
    out: set[Grant] = set()
    for doc in docs:
        if doc.get("kind") not in ("ClusterRole", "Role"):
            continue
        namespace = doc["metadata"].get("namespace", "") if doc["kind"] == "Role" else ""
        for rule in doc.get("rules") or ():
            names = tuple(rule.get("resourceNames") or ())
            for verb in rule["verbs"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out.add(Grant(verb, group, resource, namespace, names))
    return out


def unused(granted: Iterable[Grant], decisions: Iterable[Decision]) -> set[Grant]:
    """The grants no allowed request among ``decisions`` needed."""
    allowed = [d for d in decisions if d.allowed]
    return {g for g in granted if not any(g.covers(d) for d in allowed)}


def used(decisions: Iterable[Decision]) -> set[tuple[str, str, str, str]]:
    """(verb, group, resource[/subresource], namespace or '*') of every allowed request."""
    return {
        (
            d.verb,
            d.group,
            d.resource + (f"/{d.subresource}" if d.subresource else ""),
            d.namespace or "*",
        )
        for d in decisions
        if d.allowed
    }


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


@dataclass
class Exporter:
    """The fake exporter's state; change ``rps`` and ``waiting`` while it runs."""

    pods: Mapping[str, str]  # "namespace/pod" -> node
    rps: float = 0.0
    waiting: int = 0
    total: float = 0.0  # requests completed so far, all pods together
    scrapes: int = 0
    _at: float = field(default_factory=time.monotonic)

    def advance(self) -> None:
        now = time.monotonic()
        self.total += self.rps * (now - self._at)
        self._at = now

    def set_load(self, rps: float, waiting: int) -> None:
        self.advance()  # the old rate holds up to now
        self.rps, self.waiting = rps, waiting

    def text(self) -> str:
        self.advance()
        self.scrapes += 1
        n = len(self.pods)
        families: dict[str, tuple[str, list[str]]] = {
            "vllm:request_success_total": ("counter", []),
            "vllm:num_requests_waiting": ("gauge", []),
            "vllm:num_requests_running": ("gauge", []),
            "kube_pod_info": ("gauge", []),
        }
        running = min(self.rps, 64.0)
        for i, (key, node) in enumerate(sorted(self.pods.items())):
            namespace, pod = key.split("/")
            who = f'namespace="{namespace}",pod="{pod}"'
            vllm = f'{who},model_name="llm"'
            share = self.waiting // n + (1 if i < self.waiting % n else 0)
            families["vllm:request_success_total"][1].append(f"{{{vllm}}} {self.total / n:.3f}")
            families["vllm:num_requests_waiting"][1].append(f"{{{vllm}}} {share}")
            families["vllm:num_requests_running"][1].append(f"{{{vllm}}} {running / n:.3f}")
            families["kube_pod_info"][1].append(f'{{{who},node="{node}",uid="uid-{pod}"}} 1')
        lines = []
        for name, (kind, series) in families.items():
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(name + s for s in series)
        return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def serve_exporter(exporter: Exporter) -> AsyncIterator[str]:
    """Serve ``/metrics`` until the block ends; yields ``host:port``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=exporter.text(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _ready(url: str, proc: asyncio.subprocess.Process, log: Path, within: float) -> None:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + within
        while True:
            if proc.returncode is not None:
                pytest.fail(f"prometheus exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{url}/-/ready") as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready in {within} s:\n{log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)


@dataclass
class Prometheus:
    """A real Prometheus scraping ``target`` every second, on one port and one data directory,
    that a test can ``stop`` (connection refused, as an outage looks) and ``start`` again."""

    workdir: Path
    target: str
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("`prometheus` is not installed (Debian: apt-get install prometheus)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: vllm\n    static_configs: [{{targets: ['{self.target}']}}]\n",
            encoding="utf-8",
        )
        log = self.workdir / "prometheus.log"
        with log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        await _ready(self.url, self.proc, log, within=20)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def prometheus(workdir: Path, target: str) -> AsyncIterator[str]:
    """A real Prometheus scraping ``target`` every second; yields its URL, stops it on exit."""
    async with running_prometheus(workdir, target) as server:
        yield server.url


@contextlib.asynccontextmanager
async def running_prometheus(workdir: Path, target: str) -> AsyncIterator[Prometheus]:
    server = Prometheus(workdir, target)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------
# The chart's Deployment, run as a local process


@dataclass(frozen=True)
class Pod:
    """The chart's controller container as a local process: what ``start_pod`` runs.

    ``argv`` and ``env`` are the container's ``args`` and ``env`` as the kubelet would give them
    (downward API fields resolved, mount paths moved under ``root``); ``port`` its ``http`` port;
    ``liveness`` and ``readiness`` its probes' paths.
    """

    root: Path
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    liveness: str
    readiness: str


def as_pod(
    docs: Iterable[Doc],
    root: Path,
    *,
    name: str,
    namespace: str,
    secrets: Mapping[tuple[str, str], str] | None = None,
) -> Pod:
    """Lay out the rendered Deployment's volumes under ``root`` and resolve its container.

    Every volume is a directory ``root/<mountPath>``; a ConfigMap volume gets the rendered
    ConfigMap's files. Any text naming a mount path (an env value, a settings file) names the
    directory under ``root`` instead, like a chroot. The service account token mount is not
    emulated: the test gives the process a kubeconfig with the account's token. ``secrets``
    holds what ``secretKeyRef`` variables read: (Secret name, key) -> value.
    """
    docs = list(docs)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = deployment["spec"]["template"]["spec"]
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
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "http"]
    return Pod(
        root=root,
        argv=tuple(container["args"]),
        env=env,
        port=port,
        liveness=container["livenessProbe"]["httpGet"]["path"],
        readiness=container["readinessProbe"]["httpGet"]["path"],
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


# ---------------------------------------------------------------------------------------------
# Waiting on processes and probes


async def until(
    what: str,
    check: Callable[[], Awaitable[bool]],
    proc: asyncio.subprocess.Process | None,
    within: float,
) -> float:
    """Poll ``check()`` every 0.2 s until it is true; returns the seconds it took. Fails if
    ``proc`` (the process being waited on, if one) exits first, or after ``within`` seconds."""
    began = time.monotonic()
    try:
        async with asyncio.timeout(within):
            while not await check():
                if proc is not None:
                    assert proc.returncode is None, f"the controller exited early while {what}"
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"not done in {within} s: {what}") from None
    return time.monotonic() - began


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
        out: list[AuditRecord] = []
        query = AuditQuery(limit=500)
        while True:
            page = await store.query(query)
            out.extend(page.records)
            if page.next is None:
                return out
            query = AuditQuery(limit=500, after=page.next)
    finally:
        await store.close()
