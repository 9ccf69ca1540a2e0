"""The Kubernetes client's generated packages, each name imported when first used.

``kubernetes_asyncio.client``, ``.client.api`` and ``.client.models`` are generated
``__init__`` files that import every API and model class the OpenAPI document names, 841
``from ... import ...`` lines: 832 modules and 38 MB of the controller's resident set at start,
for the eight APIs and the few models it uses (docs/design/scale.md, "The client's models,
imported when used"). The library has no switch for it. The package itself imports its
``config``, ``dynamic``, ``stream``, ``utils`` and ``watch`` (``import kubernetes_asyncio.dynamic
as dynamic``; ``dynamic`` a JSON Schema validator too, where one is installed), of which the
controller uses ``config`` alone.

``install()`` (run by ``rebalancer/__init__``, before anything of ours imports the client) puts
a finder first on ``sys.meta_path`` for those four packages. Each is loaded from its own
``__init__`` as shipped, read as a table instead of run: a name is imported from the module the
file names for it (the module itself, for ``import <module> as <name>``) the first time it is
looked up (a module ``__getattr__``, PEP 562), then kept on the package, so every later look-up
is an attribute like any other. The literal assignments (``__version__``, ``__all__``) are set
as written. A name the file does not list is looked up as a submodule, as the import the file
would have run leaves them on the package.

A file that is anything but its docstring, those two forms of import and literal assignments
is imported as shipped: the table is only used where it says all the file does. A process that
imported the client before ``install()`` keeps it as it was.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGES = frozenset(
    {
        "kubernetes_asyncio",
        "kubernetes_asyncio.client",
        "kubernetes_asyncio.client.api",
        "kubernetes_asyncio.client.models",
    }
)


@dataclass(frozen=True)
class Table:
    """What a package's ``__init__`` does: each name it imports, from where, and the
    constants it sets."""

    # name -> (module, attr), or (module, None) for the module itself
    names: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)


def table_of(source: str) -> Table | None:
    """The ``__init__``'s ``source`` as a table; None when it does anything else."""
    table = Table()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name == "*":
                    return None
                table.names[alias.asname or alias.name] = (node.module, alias.name)
            continue
        if isinstance(node, ast.Import) and all(alias.asname for alias in node.names):
            for alias in node.names:
                table.names[str(alias.asname)] = (alias.name, None)
            continue
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                table.constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                return None
            continue
        return None
    return table


class _Loader(importlib.abc.Loader):
    def __init__(self, table: Table) -> None:
        self.table = table

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module, with the spec's path for its submodules

    def exec_module(self, module: ModuleType) -> None:
        names = self.table.names
        module.__dict__.update(self.table.constants)

        def __getattr__(name: str) -> Any:
            if name in names:
                source, attr = names[name]
                value = importlib.import_module(source)
                if attr is not None:
                    value = getattr(value, attr)
            elif not name.startswith("__") and _has_submodule(module.__name__, name):
                value = importlib.import_module(f"{module.__name__}.{name}")
            else:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
            setattr(module, name, value)
            return value

        def __dir__() -> list[str]:
            return sorted(set(module.__dict__) | set(names))

        module.__dict__["__getattr__"] = __getattr__
        module.__dict__["__dir__"] = __dir__


def _has_submodule(package: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except (ImportError, ValueError):
        return False


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the three packages as the path does, and loads each from its table."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or spec.submodule_search_locations is None:
            return None
        try:
            table = table_of(Path(spec.origin).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            table = None
        if table is None:
            return None  # the next finder imports it as shipped
        spec.loader = _Loader(table)
        return spec


def install() -> None:
    """The finder first on ``sys.meta_path``, once per process."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
