"""The Kubernetes client's generated packages loaded from their tables (``rebalancer.lazyclient``):
in fresh interpreters, every name the packages have as shipped is the same object through the
tables, the API and model modules are imported only once used, and a file the table cannot
say all of is imported as shipped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from rebalancer.lazyclient import PACKAGES, table_of

# Each package's public names, described (a class by where it is defined, a module by its name).
DESCRIBE = """
import importlib, json, sys, types

def describe(value):
    if isinstance(value, types.ModuleType):
        return "module " + value.__name__
    if isinstance(value, type):
        return value.__module__ + "." + value.__qualname__
    return repr(value)

def names(eager):
    out = {}
    for package in sorted(PACKAGES):
        module = importlib.import_module(package)
        listed = [n for n in (eager[package] if eager else dir(module)) if n[0] != "_"]
        out[package] = {n: describe(getattr(module, n)) for n in listed}
        out[package]["__version__"] = repr(getattr(module, "__version__", None))
        out[package]["__all__"] = repr(getattr(module, "__all__", None))
    return out
"""


def run(script: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_every_name_of_the_packages_as_shipped_is_the_same_object_through_the_tables() -> None:
    shipped = run(
        f"PACKAGES = {sorted(PACKAGES)!r}\n{DESCRIBE}\n"
        "import kubernetes_asyncio.client\n"
        "print(json.dumps(names(None)))\n"
    )
    listed = {package: sorted(described) for package, described in shipped.items()}
    lazy = run(
        "import rebalancer, sys\n"
        f"PACKAGES = {sorted(PACKAGES)!r}\n{DESCRIBE}\n"
        "import kubernetes_asyncio.client\n"
        "before = sum(m.startswith('kubernetes_asyncio.client.') for m in sys.modules)\n"
        "loader = type(sys.modules['kubernetes_asyncio.client'].__spec__.loader).__name__\n"
        f"out = names({listed!r})\n"
        "out['before'] = before\n"
        "out['loader'] = loader\n"
        "print(json.dumps(out))\n"
    )
    assert lazy.pop("loader") == "_Loader"
    before = lazy.pop("before")
    assert before < 20, f"{before} of the client's modules imported before any is used"
    assert len(listed["kubernetes_asyncio.client.models"]) > 700
    assert lazy == shipped


def test_the_controller_imports_only_the_client_modules_it_uses() -> None:
    loaded = run(
        """
        import json, sys
        import rebalancer.cli, rebalancer.runtime.wiring
        client = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.")]
        print(json.dumps({"models": sum(".models." in m for m in client), "all": len(client),
                          "dynamic": "kubernetes_asyncio.dynamic" in sys.modules}))
        """
    )
    assert loaded["models"] == 0  # a model is imported when an answer is read into one
    assert loaded["all"] < 40  # of the 838 the eager import loads
    assert not loaded["dynamic"]  # nor the package's other parts it does not use


def test_an_answer_is_read_into_its_model_through_the_tables() -> None:
    loaded = run(
        """
        import asyncio, json, rebalancer
        from kubernetes_asyncio import client

        class Answer:
            data = json.dumps({"metadata": {"name": "gpu-1", "labels": {"pool": "a"}},
                               "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})

        async def read():
            async with client.ApiClient() as api:
                return api.deserialize(Answer(), "V1Node")

        node = asyncio.run(read())
        print(json.dumps({"type": type(node).__name__, "name": node.metadata.name,
                          "taint": type(node.spec.taints[0]).__name__}))
        """
    )
    assert loaded == {"type": "V1Node", "name": "gpu-1", "taint": "V1Taint"}


@pytest.mark.parametrize(
    "source",
    [
        "from a import b\nimport c\n",  # binds a name the table would not know the use of
        "from a import *\n",  # names the table cannot list
        "from a import b\nx = b()\n",  # an assignment that runs code
        "from a import b\nif b:\n    pass\n",
    ],
)
def test_a_file_that_does_more_than_import_names_is_imported_as_shipped(source: str) -> None:
    assert table_of(source) is None


def test_a_table_says_where_each_name_comes_from_and_what_is_set() -> None:
    table = table_of(
        '"""doc"""\nfrom __future__ import annotations\n'
        "from p.m import A\nfrom p.n import B as C\nimport p.o as o\n"
        "__version__ = '1'\n__all__ = ['A', 'C']\n"
    )
    assert table is not None
    assert table.names == {
        "annotations": ("__future__", "annotations"),  # bound by the import, as any name
        "A": ("p.m", "A"),
        "C": ("p.n", "B"),
        "o": ("p.o", None),  # the module itself
    }
    assert table.constants == {"__version__": "1", "__all__": ["A", "C"]}
