"""One real kube-apiserver (with etcd) for the whole session: starting it takes seconds, so the
tests share it and keep to objects of their own (each its own node and namespace names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import kube


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    with kube.running(tmp_path_factory.mktemp("kube")) as server:
        yield server
