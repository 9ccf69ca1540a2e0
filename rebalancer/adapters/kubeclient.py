"""The one Kubernetes API client of a controller process: configured, opened and closed here.

Where it sits: ``rebalancer run`` opens it once and hands the ``ApiClient`` to the informer, the
leader elector and the actuator, which each build the typed API they need on it. Why one place:
the client owns an aiohttp session (a connection pool); leaving it open warns at exit and leaks
sockets, so it lives in an async context manager that always closes it.

Configuration, in order: an explicit kubeconfig path; the in-cluster service account when the
process runs in a pod (``KUBERNETES_SERVICE_HOST`` is set); else the default kubeconfig
(``$KUBECONFIG`` or ``~/.kube/config``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from rebalancer.errors import ConfigError


async def configuration(kubeconfig: Path | None = None, context: str | None = None) -> Any:
    """A ``kubernetes_asyncio.client.Configuration`` for the cluster (see the module docstring)."""
    settings = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            # Re-reads the projected service-account token as it rotates.
            # kubernetes-asyncio ships no annotations for this loader.
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=settings, try_refresh_token=True
            )
        else:
            # persist_config=False: never write refreshed credentials back into a user's file.
            await config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                context=context,
                client_configuration=settings,
                persist_config=False,
            )
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "the in-cluster service account or the default kubeconfig"
        raise ConfigError(f"cannot configure the Kubernetes client from {where}: {exc}") from exc
    return settings


@asynccontextmanager
async def api_client(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[Any]:
    """An open ``ApiClient``, closed (with its connection pool) when the block ends."""
    settings = await configuration(kubeconfig, context)
    async with client.ApiClient(settings) as api:
        yield api
