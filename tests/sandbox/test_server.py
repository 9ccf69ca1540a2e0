"""The server itself: kubeconfig, unknown paths, the ``rebalancer sandbox`` entry point."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from kubernetes_asyncio import client, config

from tests.sandbox.conftest import Sandbox, raw


async def test_a_written_kubeconfig_loads_with_load_kube_config(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    from sandbox.emulator.server import write_kubeconfig

    path = write_kubeconfig(sandbox.url, tmp_path / "kubeconfig")
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        nodes = await client.CoreV1Api(api).list_node()
    assert configuration.host == sandbox.url
    assert nodes.items == []


async def test_an_unknown_resource_gets_a_404_status(sandbox: Sandbox) -> None:
    response = await sandbox.api.call_api(
        "/apis/apps/v1/namespaces/x/deployments", "GET", _preload_content=False
    )
    assert response.status == 404
    assert (await raw(response))["reason"] == "NotFound"


async def test_a_cluster_scoped_resource_has_no_namespaced_path(sandbox: Sandbox) -> None:
    response = await sandbox.api.call_api(
        "/api/v1/namespaces/x/nodes", "GET", _preload_content=False
    )
    assert response.status == 404
    await raw(response)


async def test_the_sandbox_command_serves_a_seeded_cluster_until_stopped(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from sandbox.emulator.server import main; sys.exit(main(sys.argv[1:]))",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        serving = await asyncio.wait_for(process.stdout.readline(), 20)
        written = await asyncio.wait_for(process.stdout.readline(), 20)
        assert serving.startswith(b"rebalancer sandbox: serving http://127.0.0.1:")
        assert str(kubeconfig).encode() in written
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        async with client.ApiClient(configuration) as api:
            nodes = await client.CoreV1Api(api).list_node(label_selector="gpu-pool=inference")
        assert len(nodes.items) == 8
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
