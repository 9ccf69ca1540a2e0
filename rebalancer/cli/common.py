"""What several ``rebalancer`` commands share: their flags (the settings, the cluster, ``-o``),
the settings they load, duration flags, documents printed as ``-o json`` or ``-o yaml``, and the
controller built to read the cluster once and write nothing (``explain``, ``check``).

Where it sits: each command module registers its parser with these flags and calls these from
its handler; ``rebalancer.cli.main`` dispatches to the handler. Nothing here imports the runtime
at module level: the Kubernetes client is loaded by the commands that talk to a cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rebalancer.errors import ConfigError
from rebalancer.settings import Settings

if TYPE_CHECKING:  # the runtime is imported by the commands that use it, not at start
    from rebalancer.adapters.audit import AuditStore
    from rebalancer.runtime.wiring import Controller

EXIT_USAGE = 2
EXIT_INCOMPLETE = 1


# The flags kubectl and helm take before the command as after it: ``rebalancer --config x
# check`` is ``rebalancer check --config x``. The top parser and each command's parser declare
# them with no default (argparse.SUPPRESS): a command's parser writes its defaults over what the
# top parser read, so a default there would undo the flag given before the command. ``settle``
# gives each its default once parsing is done, and refuses one the command does not read.
GLOBAL_DEFAULTS: dict[str, Any] = {
    "config": None,
    "kubeconfig": None,
    "context": None,
    "namespace": None,
    "verbose": False,
}
GLOBAL_FLAGS = {
    "config": ("--config",),
    "kubeconfig": ("--kubeconfig",),
    "context": ("--context",),
    "namespace": ("-n", "--namespace"),
    "verbose": ("-v", "--verbose"),
}
SWITCHES = frozenset({"verbose"})  # the global flags that take no value
_TAKES = "_globals_taken"  # the global flags the command that was parsed reads
PROG = "_command_prog"  # the prog of the command that was parsed (``rebalancer check``)
CONFIG_HELP = "settings file (default: $REBALANCER_CONFIG, else none)"
_HELP = {
    "config": CONFIG_HELP,
    "kubeconfig": "kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    "context": "kubeconfig context (default: its current one)",
    "namespace": "the controller's namespace: its Lease, and the Deployment reclaim "
    "--stop-controller scales (default: leader_election.lease_namespace)",
    "verbose": "log at DEBUG (over the settings' log_level)",
}
_TYPES: dict[str, Callable[[str], Any]] = {"config": Path, "kubeconfig": Path}


def global_flag(p: argparse.ArgumentParser, name: str, help: str | None = None) -> None:
    """Declare the global flag ``name`` on ``p``; on a command's parser, also that the command
    reads it."""
    if name in SWITCHES:
        kind: dict[str, Any] = {"action": "store_true"}
    else:
        kind = {"type": _TYPES.get(name, str)}
    p.add_argument(
        *GLOBAL_FLAGS[name], dest=name, default=argparse.SUPPRESS, help=help or _HELP[name], **kind
    )
    if p.get_default(PROG) is not None:
        taken = tuple(p.get_default(_TAKES) or ())
        p.set_defaults(**{_TAKES: (*taken, name)})


def command_parser(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser, marked as one (``global_flag`` records what it reads)."""
    p: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    p.set_defaults(**{PROG: p.prog, _TAKES: ()})
    return p


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every global flag not given set to its default; a global flag given
    before a command that does not read it is a ConfigError naming the flag and the command."""
    taken = getattr(args, _TAKES, ())
    for name in GLOBAL_DEFAULTS:
        if name in vars(args) and name not in taken:
            flag = GLOBAL_FLAGS[name][-1]
            if name not in SWITCHES:
                flag += f"={getattr(args, name)}"
            reads = ", ".join(GLOBAL_FLAGS[t][-1] for t in taken) or "none"
            raise ConfigError(
                f"{flag}: {getattr(args, PROG)} does not read it (the "
                f"global flags it reads: {reads})"
            )
    for name, default in GLOBAL_DEFAULTS.items():
        vars(args).setdefault(name, default)
    return args


def controller_flags(p: argparse.ArgumentParser, kube: bool = True) -> None:
    """The flags every controller command takes: the settings, and the cluster it reads."""
    global_flag(p, "config")
    if kube:
        cluster_flags(p)


def cluster_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a command that talks to a cluster, as kubectl spells them."""
    global_flag(p, "kubeconfig")
    global_flag(p, "context")


OUTPUTS = ("text", "json", "yaml")


def output_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``-o text|json|yaml``, as kubectl's ``-o``; ``--json`` stays as ``-o json``."""
    p.add_argument(
        "-o", "--output", choices=OUTPUTS, default="text", help=f"{what} (default: text)"
    )
    p.add_argument(
        "--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS
    )


def documents(docs: Sequence[Mapping[str, Any]], output: str) -> list[str]:
    """``docs`` as ``-o json`` (one object a line) or ``-o yaml`` (one document each) prints
    them."""
    import json

    import yaml

    if output == "json":
        return [json.dumps(d) for d in docs]
    return [f"---\n{yaml.safe_dump(dict(d), sort_keys=False).rstrip()}" for d in docs]


def print_document(doc: Mapping[str, Any], output: str, text: Callable[[], list[str]]) -> None:
    """One document as ``-o json`` or ``-o yaml`` prints it, or as ``text()``'s lines."""
    import json

    import yaml

    if output == "json":
        print(json.dumps(doc, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(dict(doc), sort_keys=False), end="")
    else:
        print("\n".join(text()))


def load_settings(args: argparse.Namespace) -> Settings:
    """The settings ``--config`` names, with ``-n/--namespace`` over their lease namespace."""
    from rebalancer import settings

    over = flags_over_settings(args)
    return over(settings.load(settings.config_path(args.config)))


def flags_over_settings(args: argparse.Namespace) -> Callable[[Settings], Settings]:
    """What the command line sets over the settings file (``-n/--namespace``: the lease's
    namespace), as a function of the file's settings: ``rebalancer run`` applies it again to
    every reload of the file (docs/design/live-settings.md). A bad flag is refused here, once."""
    from rebalancer.settings.values import NAME

    namespace = getattr(args, "namespace", None)
    if namespace is None:
        return _as_given
    if not NAME.fullmatch(namespace):
        raise ConfigError(
            f"--namespace={namespace!r}: not a namespace name; write a DNS label such as rebalancer"
        )

    def over(config: Settings) -> Settings:
        election = config.leader_election.model_copy(update={"lease_namespace": namespace})
        return config.model_copy(update={"leader_election": election})

    return over


def _as_given(config: Settings) -> Settings:
    return config


def duration(flag: str, text: str) -> float:
    """A positive duration flag (``90s``, ``2m``; a bare number refused) in seconds, or a
    one-line ConfigError."""
    from rebalancer.settings import flag_duration

    return flag_duration(flag, text).total_seconds()


@contextlib.asynccontextmanager
async def reading(
    args: argparse.Namespace, config: Settings, timeout: float
) -> AsyncIterator[Controller]:
    """The controller built to read the cluster and Prometheus once and write nothing (explain,
    check): the operator's role, the budgets' store (``budget_store``, its note on stderr),
    the informer's first list done within ``timeout`` (a line naming ``--timeout`` if not)."""
    from rebalancer.runtime import wiring

    store, note = await budget_store(config)
    if note is not None:
        print(f"rebalancer: {note}", file=sys.stderr)
    seams = wiring.Seams(
        kubeconfig=args.kubeconfig,
        context=args.context,
        sink=None,
        serve_http=False,
        audit_store=store,
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)  # handed in: wiring leaves it open
        controller = await stack.enter_async_context(
            wiring.Controller.open(config, seams, wiring.Role.OPERATOR)
        )
        listed = False
        try:
            async with controller.informed(timeout):
                listed = True
                yield controller
        except TimeoutError:
            if listed:  # the caller's own, not the list's
                raise
            raise ConfigError(
                f"--timeout={args.timeout}: the cluster's nodes and pods were not all listed in "
                "time"
            ) from None


async def budget_store(config: Settings) -> tuple[AuditStore, str | None]:
    """The store ``explain`` reads the error budgets' minutes from (the only thing it reads the
    audit log for), and a note for stderr when it reads none that the controller would.

    Every pool has a budget unless its settings say ``slo: none`` (``settings.DEFAULT_SLO``), so
    "open the store when a pool has an slo" now means on nearly every explain. Decided:
    explain reads the store where there is one to read, and never needs one to answer.

    - No pool with a budget: nothing to read; an empty store, as before.
    - A SQLite file that does not exist (the default ``audit.url`` run away from the
      controller, or the chart's path on an operator's machine) is not made: opening it would
      create the file and its schema, a write explain does not make, and it would hold no
      minute. The budgets are read as unspent, and the note says so.
    - Otherwise the configured store, opened as ``rebalancer run`` opens it. One that cannot be
      opened (a database not reachable from here) is not a reason to refuse the explanation
      either: the budgets are read as unspent, and the note says why. A store a newer release
      migrated stays refused (``NewerSchema``), as for every command.
    """
    from rebalancer.adapters import audit as audit_store

    if not any(p.slo is not None for p in config.pools):
        return audit_store.MemoryAuditStore(), None
    unspent = "the error budgets are read as unspent"
    path = audit_store.sqlite_file(config.audit.url)
    if path is not None and not path.exists():
        note = f"audit.url names {path}, which does not exist here: {unspent}"
        return audit_store.MemoryAuditStore(), note
    try:
        return await audit_store.SqlAuditStore.open(config.audit.url), None
    except audit_store.NewerSchema:
        raise
    except audit_store.UnopenedStore as exc:
        return audit_store.MemoryAuditStore(), f"{exc}; {unspent}"
