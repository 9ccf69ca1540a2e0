"""Node pools: which nodes belong to which pool, and what each node's labels and taints become.

Where it sits: ``rebalancer pools apply`` (``commands.pools``) reads a pools file into a
``Layout``, lists the nodes, and asks ``plan_node`` of each one what to write; it sends the
writes under an optimistic lock and asks again on a 409.
Everything here is a pure value, so the diff a dry run prints is the very change a run writes,
and both are tested on values (docs/design/pools.md).

The rules, in one place:

- A pool selects nodes by a Kubernetes label selector (``matchLabels`` and ``matchExpressions``
  with In, NotIn, Exists, DoesNotExist), by labels another actor writes (a GPU labeler's
  ``nvidia.com/gpu.product``), never by one the file sets: then a write cannot move a node out
  of its pool or into another, and a second apply finds nothing to do (``problems`` refuses
  such a file).
- The file owns every label key and every taint key that appears in its pools' ``labels`` and
  ``taints``. For a node of pool P: P's labels are set; a label key the file owns that P does
  not set is removed; P's taints are added; a taint whose key the file owns that is not one of
  P's is removed. Keys the file does not own (``node.kubernetes.io/unreachable``, the
  controller's own ``<prefix>lent``) are never touched, and the taints kept stay where they were
  in the list, with their ``timeAdded``.
- A node matched by two pools is ``AMBIGUOUS`` and a node matched by none ``UNMATCHED``; neither
  is written. A node the controller has lent or is moving (its state is any phase but serving),
  or whose state cannot be read, is ``REFUSED``: its taints and labels are the lend's, and a
  write would undo the lend under the controller's feet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rebalancer.core import model, nodestate

# Kubernetes' own syntax (k8s.io/apimachinery/pkg/util/validation): a qualified name with an
# optional DNS-subdomain prefix, and a label value. Used with fullmatch.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")
_QUALIFIED = re.compile(_NAME)
_VALUE = re.compile(rf"({_NAME})?")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a label or taint key Kubernetes accepts; None when it is one."""
    prefix, slash, name = key.rpartition("/")
    if slash and not _SUBDOMAIN.fullmatch(prefix):
        return "its prefix (before '/') must be a lower-case DNS subdomain, e.g. nvidia.com"
    if not _QUALIFIED.fullmatch(name):
        return (
            "a key is at most 63 letters, digits, '-', '_' or '.' (after an optional "
            "'prefix/'), starting and ending with a letter or digit"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why ``value`` is not a label (or taint) value Kubernetes accepts; None when it is one."""
    if not _VALUE.fullmatch(value):
        return (
            "a value is empty or at most 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Selectors and pools


class Operator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True, slots=True)
class Expression:
    """One ``matchExpressions`` entry, as ``metav1.LabelSelectorRequirement`` means it."""

    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.operator is Operator.IN:
            return labels.get(self.key) in self.values
        if self.operator is Operator.NOT_IN:  # a node without the label is not in the set
            return labels.get(self.key) not in self.values
        if self.operator is Operator.EXISTS:
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True, slots=True)
class Selector:
    """A label selector: every ``match_labels`` pair and every expression must hold."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Expression, ...] = ()

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            e.holds(labels) for e in self.match_expressions
        )

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.match_labels) | {e.key for e in self.match_expressions}


@dataclass(frozen=True, slots=True)
class NodePool:
    name: str
    selector: Selector
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[model.Taint, ...] = ()


@dataclass(frozen=True)
class Layout:
    """Every pool of a file, in the file's order, and the keys the file owns."""

    pools: tuple[NodePool, ...]

    @property
    def label_keys(self) -> frozenset[str]:
        return frozenset(k for p in self.pools for k in p.labels)

    @property
    def taint_keys(self) -> frozenset[str]:
        return frozenset(t.key for p in self.pools for t in p.taints)


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with a layout as a whole, at ``path`` (``pools[1].name``)."""

    path: str
    why: str
    value: object = None  # None: the path names it already (a key of a mapping)

    def __str__(self) -> str:
        shown = "" if self.value is None else f"={self.value!r}"
        return f"{self.path}{shown}: {self.why}"


def problems(layout: Layout, keys: nodestate.Keys) -> list[Problem]:
    """What makes ``layout`` unsafe to apply, beyond each field's own syntax (the loader checks
    that): a pool name given twice; a selector that reads a label the file sets (a write could
    move the node between pools, and a second apply would write again); any key under the
    controller's prefix (its state, its lend taint: the controller's alone)."""
    found: list[Problem] = []
    first: dict[str, int] = {}
    owned = layout.label_keys
    setters = {k: i for i, p in reversed(list(enumerate(layout.pools))) for k in p.labels}
    for i, pool in enumerate(layout.pools):
        at = f"pools[{i}]"
        if pool.name in first:
            why = f"duplicate pool name; pools[{first[pool.name]}] has it already"
            found.append(Problem(f"{at}.name", why, pool.name))
        first.setdefault(pool.name, i)
        read = [
            *((f"{at}.selector.matchLabels[{k!r}]", k) for k in pool.selector.match_labels),
            *(
                (f"{at}.selector.matchExpressions[{j}].key", e.key)
                for j, e in enumerate(pool.selector.match_expressions)
            ),
        ]
        for where, key in read:
            if key in owned:
                why = (
                    f"selects by label {key!r}, which this file sets (pools[{setters[key]}]"
                    ".labels); select by labels the file does not write, e.g. "
                    "nvidia.com/gpu.product"
                )
                found.append(Problem(where, why))
        written = [
            *((f"{at}.labels[{k!r}]", k) for k in pool.labels),
            *((f"{at}.taints[{j}].key", t.key) for j, t in enumerate(pool.taints)),
        ]
        for where, key in [*read, *written]:
            if key.startswith(keys.prefix):
                why = f"key {key!r}: keys under {keys.prefix!r} belong to the controller"
                found.append(Problem(where, why))
    return found


# ---------------------------------------------------------------------------------------------
# The plan of one node


class Verdict(StrEnum):
    CHANGE = "change"  # in one pool, and its labels or taints differ from the pool's
    UNCHANGED = "unchanged"  # in one pool, and already as the pool wants it
    REFUSED = "refused"  # lent or moving, or its state cannot be read: never written
    UNMATCHED = "unmatched"  # no pool selects it: never written
    AMBIGUOUS = "ambiguous"  # two pools or more select it: never written


@dataclass(frozen=True, slots=True)
class LabelEdit:
    key: str
    old: str | None
    new: str | None  # None: removed

    def __str__(self) -> str:
        if self.new is None:
            return f"-label {self.key}"
        was = "" if self.old is None else f" (was {self.old})"
        return f"+label {self.key}={self.new}{was}"


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What one node's line says, and what would be written to it.

    ``pools``: the pool that selects it (two or more when ``AMBIGUOUS``, none when
    ``UNMATCHED``). ``change`` is set exactly when the verdict is ``CHANGE``. ``refusal`` names
    why a ``REFUSED`` node is left alone: the phase it is in (``lent``), or ``unreadable
    state``; ``detail`` says more.
    """

    node: str
    verdict: Verdict
    pools: tuple[str, ...] = ()
    labels: tuple[LabelEdit, ...] = ()
    added: tuple[model.Taint, ...] = ()
    removed: tuple[model.Taint, ...] = ()
    change: nodestate.NodeChange | None = None
    refusal: str = ""
    detail: str = ""

    @property
    def edits(self) -> list[str]:
        """The diff, in the order it reads best: labels set, labels removed, taints in, out."""
        set_first = sorted(self.labels, key=lambda e: (e.new is None, e.key))
        return [
            *(str(e) for e in set_first),
            *(f"+taint {t}" for t in self.added),
            *(f"-taint {t}" for t in self.removed),
        ]


UNREADABLE = "unreadable state"


def members(labels: Mapping[str, str], layout: Layout) -> tuple[NodePool, ...]:
    return tuple(p for p in layout.pools if p.selector.selects(labels))


def plan_node(node: model.NodeView, layout: Layout, keys: nodestate.Keys) -> NodePlan:
    """The plan for ``node`` under ``layout`` (see the module docstring for the rules)."""
    name = str(node.name)
    found = members(node.labels, layout)
    if not found:
        return NodePlan(name, Verdict.UNMATCHED)
    if len(found) > 1:
        return NodePlan(name, Verdict.AMBIGUOUS, tuple(p.name for p in found))
    pool = found[0]
    state = nodestate.read(node, keys)
    if isinstance(state, nodestate.StateError):
        return NodePlan(name, Verdict.REFUSED, (pool.name,), refusal=UNREADABLE, detail=str(state))
    if state.phase is not nodestate.Phase.SERVING:
        detail = f"{keys.state}={state.phase.value}: the controller has lent it or is moving it"
        return NodePlan(
            name, Verdict.REFUSED, (pool.name,), refusal=state.phase.value, detail=detail
        )
    labels = _label_edits(node.labels, pool, layout)
    kept, added, removed = _taints(node.taints, pool, layout)
    if not labels and not added and not removed:
        return NodePlan(name, Verdict.UNCHANGED, (pool.name,))
    change = nodestate.NodeChange(
        taints=(*kept, *added) if added or removed else None,
        labels={e.key: e.new for e in labels},
        annotations={},
    )
    return NodePlan(name, Verdict.CHANGE, (pool.name,), labels, added, removed, change)


def plan(
    nodes: Iterable[model.NodeView], layout: Layout, keys: nodestate.Keys
) -> tuple[NodePlan, ...]:
    """Every node's plan, by node name."""
    return tuple(sorted((plan_node(n, layout, keys) for n in nodes), key=lambda p: p.node))


def _label_edits(
    labels: Mapping[str, str], pool: NodePool, layout: Layout
) -> tuple[LabelEdit, ...]:
    edits = [LabelEdit(k, labels.get(k), v) for k, v in pool.labels.items() if labels.get(k) != v]
    stale = sorted(k for k in layout.label_keys - set(pool.labels) if k in labels)
    edits.extend(LabelEdit(k, labels[k], None) for k in stale)
    return tuple(edits)


def _same(a: model.Taint, b: model.Taint) -> bool:
    """The same taint to the scheduler: an absent value is the empty one, ``timeAdded`` aside."""
    return (a.key, a.effect, a.value or "") == (b.key, b.effect, b.value or "")


def _taints(
    current: Sequence[model.Taint], pool: NodePool, layout: Layout
) -> tuple[tuple[model.Taint, ...], tuple[model.Taint, ...], tuple[model.Taint, ...]]:
    """The taints kept (in their order, as written), the pool's taints to add, those removed."""
    owned = layout.taint_keys
    kept: list[model.Taint] = []
    removed: list[model.Taint] = []
    for taint in current:
        wanted = taint.key not in owned or any(_same(taint, t) for t in pool.taints)
        (kept if wanted else removed).append(taint)
    added = tuple(t for t in pool.taints if not any(_same(t, k) for k in kept))
    return tuple(kept), added, tuple(removed)


def summary(plans: Sequence[NodePlan]) -> dict[Verdict, int]:
    """How many nodes each verdict has, every verdict present (zeros too)."""
    counts = dict.fromkeys(Verdict, 0)
    for p in plans:
        counts[p.verdict] += 1
    return counts
