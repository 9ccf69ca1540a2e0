"""The one Kubernetes API client of a controller process: configured, opened and closed here.

Where it sits: ``rebalancer run`` opens it once and hands the ``ApiClient`` to the informer, the
leader elector and the actuator, which each build the typed API they need on it. Why one place:
the client owns an aiohttp session (a connection pool); leaving it open warns at exit and leaks
sockets, so it lives in an async context manager that always closes it.

Configuration, in order: an explicit kubeconfig path; the in-cluster service account when the
process runs in a pod (``KUBERNETES_SERVICE_HOST`` is set); else the default kubeconfig
(``$KUBECONFIG`` or ``~/.kube/config``).

A kubeconfig given by path that is not one (missing, not text, not YAML, no clusters) is a
``ConfigError`` of one line naming the path: the client library would otherwise raise whatever
its parser tripped on (a ``UnicodeDecodeError``, a ``TypeError``), as a traceback.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config

from rebalancer.errors import ConfigError


async def configuration(kubeconfig: Path | None = None, context: str | None = None) -> Any:
    """A ``kubernetes_asyncio.client.Configuration`` for the cluster (see the module docstring)."""
    settings = client.Configuration()
    if kubeconfig is not None:
        _check(kubeconfig)
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
    # Beyond its own ConfigException, the library's parser raises whatever it trips on (a
    # UnicodeDecodeError, a TypeError on a list where it wants a mapping, a YAMLError).
    except (
        config.ConfigException,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        yaml.YAMLError,
    ) as exc:
        where = kubeconfig or "the in-cluster service account or the default kubeconfig"
        why = " ".join(f"{exc}".split())
        raise ConfigError(f"cannot configure the Kubernetes client from {where}: {why}") from exc
    return settings


def _check(path: Path) -> None:
    """Refuse, in one line naming ``path``, a file that cannot be a kubeconfig."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _unusable(path, "does not exist") from None
    except IsADirectoryError:
        raise _unusable(path, "is a directory, not a file") from None
    except UnicodeDecodeError:
        raise _not_one(path, "not UTF-8 text") from None
    except OSError as exc:
        raise _unusable(path, f"cannot be read ({exc.strerror})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise _not_one(path, f"not valid YAML{where}") from None
    if doc is None:
        raise _not_one(path, "an empty file")
    if not isinstance(doc, dict):
        kind = "list" if isinstance(doc, list) else "string" if isinstance(doc, str) else "value"
        raise _not_one(path, f"a YAML {kind}, not a mapping")
    for key in ("clusters", "contexts"):
        if not doc.get(key) or not isinstance(doc[key], list):
            raise _not_one(path, f"no list of {key}")


def _not_one(path: Path, why: str) -> ConfigError:
    return _unusable(
        path,
        f"not a kubeconfig ({why}); give a file with clusters, users and contexts, as kubectl "
        "writes it",
    )


def _unusable(path: Path, why: str) -> ConfigError:
    return ConfigError(f"cannot configure the Kubernetes client from {path}: {why}")


@asynccontextmanager
async def api_client(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[Any]:
    """An open ``ApiClient``, closed (with its connection pool) when the block ends."""
    settings = await configuration(kubeconfig, context)
    async with client.ApiClient(settings) as api:
        yield api
