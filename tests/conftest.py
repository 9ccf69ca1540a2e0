"""Suite-wide settings.

Hypothesis: no per-example deadline. CI machines are small and shared; a slow example is not a
wrong one, and a timing failure would be a flaky test. Failures print the blob to reproduce them.

``tests.support`` holds checks too (``reads``, ``actuation``, ``harness``...): its asserts are
rewritten like a test module's, so a failing one shows the values it compared. This runs before
any test module imports it.

The suite imports the Kubernetes client as the product does, each generated name when first
used (``rebalancer.lazyclient``): installed before ``tests.support`` imports the client.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import settings

import rebalancer.lazyclient
from sandbox.emulator.clock import ManualClock

rebalancer.lazyclient.install()  # as importing ``rebalancer`` did: said here, where it matters

pytest.register_assert_rewrite("tests.support")

# Imported only after register_assert_rewrite, or the asserts of tests.support would not be
# rewritten (pytest rewrites a module only if it is registered before its first import).
from tests.support import backends, chart, control_plane, kube, postgres, rbac, training_cluster  # noqa: E402  (must follow register_assert_rewrite)

settings.register_profile("rebalancer", deadline=None, print_blob=True)
settings.load_profile("rebalancer")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With parallel workers, the longest modules first (``tests/support/ordering.py``). Every
    worker collects and orders alike, as pytest-xdist requires."""
    from tests.support.ordering import longest_first  # after register_assert_rewrite, as above

    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers > 1:
        items[:] = longest_first(items, workers)


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.KubeServer]:
    """One real kube-apiserver (with etcd) for the whole session: starting it takes seconds, so
    the tests share it; each leaves it as it found it (``backends.Real`` sweeps)."""
    with kube.running(tmp_path_factory.mktemp("kube")) as server:
        yield server


@pytest.fixture(params=["emulator", "real"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> backends.Backend:
    """The server a test runs against: the API emulator, then a real kube-apiserver. The real
    one starts only when a test asks for it."""
    if request.param == "emulator":
        return backends.EMULATOR
    return backends.Real(request.getfixturevalue("real"), tmp_path)


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[control_plane.ControlPlane]:
    """A real control plane of the session's own: kube-apiserver and etcd, kube-scheduler,
    kube-controller-manager and KWOK for kubelets (``real``'s server runs the tests' stand-ins
    instead, which these would fight). The chart's RBAC and training's priority class are
    there, as a cluster has them before any job; each test leaves it as it found it."""
    with (
        kube.running(tmp_path_factory.mktemp("plane")) as server,
        control_plane.running(server) as started,
    ):
        rbac.apply_to(
            backends.RealCluster(server, ManualClock(datetime.now(UTC))),
            rbac.rbac_of(chart.render({})),
        )
        code, doc = server.request(
            "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", training_cluster.priority_class()
        )
        assert code == 201, doc
        yield started


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.PostgresServer]:
    """One throwaway PostgreSQL for the whole session, whichever modules use it. Here, not
    imported into each of them: a fixture a module imports is that module's own, and each of
    the four started a server of its own on a worker that ran them."""
    with postgres.running_postgres() as server:
        yield server
