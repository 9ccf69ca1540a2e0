"""``rebalancer pools apply``: make every node's labels and taints what its pool says.

Where it sits: the node pools, as a file says (docs/operations.md, docs/design/pools.md). The
file is read and each node written by ``commands.pools``, each node planned by
``core.nodepools``; this module prints the diff per node and the summary, or one document per
node.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rebalancer.cli import common

if TYPE_CHECKING:  # the command's body is imported by the handler, not at start
    from rebalancer.commands.pools import Report
    from rebalancer.core.nodepools import NodePlan


def register(commands: Any) -> None:
    """`rebalancer pools apply`: its flags and handler."""
    pools = commands.add_parser(
        "pools",
        help="assign nodes to pools: labels and taints by selector",
        description="Node pools as a file says: each pool selects nodes by labels and sets "
        "labels and taints on them (docs/operations.md, docs/design/pools.md).",
    )
    verbs = pools.add_subparsers(required=True, metavar="VERB")
    apply = common.command_parser(
        verbs,
        "apply",
        help="make every node's labels and taints what its pool says",
        description="List every node, plan each one against the pools file and write what "
        "differs, one merge patch per node locked to the version read (a 409 reads the node "
        "again). A node the controller has lent or is moving is never written. Prints a diff "
        "per node and a summary. Exits 0 when every node a pool selects is as its pool says, 1 "
        "when a node was refused or a write failed, 2 when nothing was done (a bad file or "
        "flag, a cluster that cannot be read, or a node that two pools select).",
    )
    apply.add_argument("-f", "--file", type=Path, required=True, help="the pools file (YAML)")
    apply.add_argument(
        "--dry-run", action="store_true", help="print what would change, write nothing"
    )
    common.output_flag(apply, "json or yaml: one object per node, then a summary")
    common.global_flag(
        apply,
        "config",
        help="the controller's settings file, for its key_prefix (default: $REBALANCER_CONFIG, "
        "else rebalancer.io/)",
    )
    common.cluster_flags(apply)
    apply.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """``rebalancer pools apply``."""
    import asyncio

    from rebalancer.commands import pools

    keys = common.load_settings(args).keys()
    layout = pools.load(args.file, keys)

    async def go() -> pools.Report:
        async with pools.open_writer(args.kubeconfig, args.context) as writer:
            return await pools.apply(writer, layout, keys, dry_run=args.dry_run)

    report = asyncio.run(go())
    if report.overlap:
        for line in overlap_lines(report):
            print(f"rebalancer: {line}", file=sys.stderr)
        return common.EXIT_USAGE
    lines = pools_lines(report) if args.output == "text" else pools_docs(report, args.output)
    for line in lines:
        print(line)
    return 0 if report.complete else common.EXIT_INCOMPLETE


def _node_pools(plan: NodePlan) -> str:
    return " and ".join(plan.pools)


def overlap_lines(report: Report) -> list[str]:
    """Why an apply wrote nothing: each node two pools select, then what to do."""
    lines = [
        f"node/{p.node}: matched by pools {_node_pools(p)}; a node belongs to one pool"
        for p in report.overlap
    ]
    count = len(report.overlap)
    lines.append(
        f"{count} node{'s' * (count != 1)} matched by more than one pool: nothing was written; "
        "make the pools' selectors disjoint"
    )
    return lines


def pools_lines(report: Report) -> list[str]:
    """A line per node that changed (or would), was refused, failed or is in no pool; then the
    summary. Nodes already as their pool says are only counted."""
    from rebalancer.core.nodepools import Verdict

    changed = "would change" if report.dry_run else "changed"
    lines = []
    for r in report.results:
        p = r.plan
        head = f"node/{p.node}: pool {_node_pools(p)}"
        diff = ", ".join(p.edits)
        if r.error:
            lines.append(f"failed {head}: {r.error} (to do: {diff})")
        elif p.verdict is Verdict.CHANGE:
            lines.append(f"{changed} {head}: {diff}")
        elif p.verdict is Verdict.REFUSED:
            lines.append(f"refused {head}: {p.refusal} ({p.detail}); not written")
        elif p.verdict is Verdict.UNMATCHED:
            lines.append(f"unmatched node/{p.node}: matched by no pool; not touched")
        elif p.verdict is Verdict.AMBIGUOUS:  # only after a 409's read: the node had changed
            lines.append(
                f"ambiguous node/{p.node}: matched by pools {_node_pools(p)} once it "
                "changed; not written"
            )
    lines.append(pools_summary(report))
    return lines


def pools_summary(report: Report) -> str:
    """``3 changed, 5 unchanged, 1 refused (lent), 2 matched by no pool``; a dry run says
    ``would change`` and that nothing was written."""
    from rebalancer.commands import pools
    from rebalancer.core.nodepools import Verdict

    results = report.results
    refused = [r.plan for r in results if r.plan.verdict is Verdict.REFUSED]
    why = ", ".join(
        reason if len(refused) == 1 else f"{n} {reason}"
        for reason, n in pools.refusals(refused).items()
    )
    if report.dry_run:
        moving = sum(r.plan.verdict is Verdict.CHANGE for r in results)
        parts = [f"{moving} would change"]
    else:
        parts = [f"{sum(r.written for r in results)} changed"]
    parts.append(f"{sum(r.plan.verdict is Verdict.UNCHANGED for r in results)} unchanged")
    parts.append(f"{len(refused)} refused" + (f" ({why})" if why else ""))
    failed = len(report.failed)
    if failed:
        parts.append(f"{failed} failed")
    both = sum(r.plan.verdict is Verdict.AMBIGUOUS for r in results)
    if both:
        parts.append(f"{both} matched by more than one pool")
    parts.append(f"{sum(r.plan.verdict is Verdict.UNMATCHED for r in results)} matched by no pool")
    text = ", ".join(parts)
    return f"dry run: {text}; nothing written" if report.dry_run else text


def pools_docs(report: Report, output: str) -> list[str]:
    """One object per node (every node, unchanged ones too), then ``{"summary": ...}``, as
    ``-o json`` or ``-o yaml`` prints them."""
    docs: list[dict[str, Any]] = []
    for r in report.results:
        p = r.plan
        doc = {
            "node": p.node,
            "verdict": p.verdict.value,
            "pools": list(p.pools),
            "edits": p.edits,
            "written": r.written,
            "error": r.error or None,
            "refusal": p.refusal or None,
            "detail": p.detail or None,
        }
        docs.append(doc)
    summary = {
        "dry_run": report.dry_run,
        "complete": report.complete,
        "line": pools_summary(report),
    }
    docs.append({"summary": summary})
    return common.documents(docs, output)
