"""The body of ``rebalancer pools apply``: every node's labels and taints made what its pool
says, once.

Where it sits: ``rebalancer.cli.pools`` reads the flags and prints the diff per node and the
summary; this module reads the pools file (``load``) and hands the layout and a ``NodeWriter``
(``open_writer``: the ``KubeWriter`` the actuator writes through) to ``apply``, which

1. lists every node (one list, paged), and plans each one (``nodepools.plan_node``, pure);
2. stops before any write when two pools select one node: which pool it belongs to is the
   file's to say, and applying the others first would leave half a layout to undo;
3. with ``dry_run``, stops there: the plans are what would be written;
4. writes each change as one merge patch locked to the resourceVersion it was planned from
   (``KubeWriter.patch_node``: transport errors, 5xx and 429 retried with backoff, as for the
   actuator), at most ``concurrency`` at once.

A 409 means the node changed after it was read: it is read again and planned again, at most
``ATTEMPTS`` times in all, never written blindly. The lock is also what keeps a lend safe: a
node the controller starts lending between our list and our write has a new resourceVersion, so
the write is refused, and the node planned again is refused as lent. A node whose change did
not land is reported with why, and the others go on.

The pools file is read, validated and made a ``nodepools.Layout`` first; nothing is asked of the
cluster until the whole file is good. Why pydantic here and not in the core: this is a boundary
(a person's YAML), and the core keeps frozen values. The shape is Kubernetes' own words
(``matchLabels``, ``matchExpressions``, a taint's ``key``, ``value``, ``effect``), so a selector
can be copied from a manifest.

```yaml
pools:
  - name: inference-l20
    selector:
      matchLabels: {nvidia.com/gpu.product: NVIDIA-L20}
    labels: {gpu-pool: inference-l20, workload-type: inference}
    taints: [workload=inference:NoSchedule]        # or {key: ..., value: ..., effect: ...}
```

As with the controller's settings (``rebalancer.settings``), every problem is ONE line naming
the field path and the value (``pools[0].taints[0]='workload=x:Never': ...``), all of them
collected into one ``InvalidPoolFile``, which the command prints and exits 2 on; the rules
that span pools (a duplicate name, a selector on a label the file sets, a key of the
controller's) are ``nodepools.problems``, reported the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from kubernetes_asyncio import client
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from rebalancer.adapters import convert, kubeclient
from rebalancer.adapters.writer import Conflict, KubeWriter, NodeWriter, WriteError
from rebalancer.core import model, nodepools, nodestate
from rebalancer.core.nodepools import NodePlan, Verdict
from rebalancer.settings import InvalidSettings, Unreadable, read_yaml, taint_text

# ---------------------------------------------------------------------------------------------
# The pools file


class InvalidPoolFile(InvalidSettings):
    """Every problem of a pools file, one line each (``lines``): printed as the settings' are."""


def _key(value: str) -> str:
    why = nodepools.key_problem(value)
    if why is not None:
        raise PydanticCustomError("key", "{why}", {"why": why})
    return value


def _value(value: str) -> str:
    why = nodepools.value_problem(value)
    if why is not None:
        raise PydanticCustomError("value", "{why}", {"why": why})
    return value


Key = Annotated[str, Field(strict=True), pydantic.AfterValidator(_key)]
Value = Annotated[str, Field(strict=True), pydantic.AfterValidator(_value)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpressionModel(_Model):
    key: Key
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[Value, ...] = ()

    @pydantic.model_validator(mode="after")
    def _values_fit(self) -> ExpressionModel:
        listed = self.operator in ("In", "NotIn")
        if listed and not self.values:
            raise PydanticCustomError(
                "values", "{op} needs at least one value", {"op": self.operator}
            )
        if not listed and self.values:
            raise PydanticCustomError("values", "{op} takes no values", {"op": self.operator})
        return self


class SelectorModel(_Model):
    match_labels: dict[Key, Value] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[ExpressionModel, ...] = Field(default=(), alias="matchExpressions")

    @pydantic.model_validator(mode="after")
    def _selects_something(self) -> SelectorModel:
        if not self.match_labels and not self.match_expressions:
            # An empty selector selects every node: a typo away from retainting a cluster.
            raise PydanticCustomError(
                "selector", "needs matchLabels or matchExpressions; an empty one selects every node"
            )
        return self


class TaintModel(_Model):
    """A taint, as a mapping or as ``key=value:Effect`` (``key:Effect`` without a value)."""

    key: Key
    value: Value | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return taint_text(data)

    def taint(self) -> model.Taint:
        return model.Taint(key=self.key, effect=self.effect, value=self.value)


class PoolModel(_Model):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    selector: SelectorModel
    labels: dict[Key, Value] = Field(default_factory=dict)
    taints: tuple[TaintModel, ...] = ()

    @pydantic.field_validator("taints")
    @classmethod
    def _one_per_key_and_effect(cls, value: tuple[TaintModel, ...]) -> tuple[TaintModel, ...]:
        seen: dict[tuple[str, str], int] = {}
        for index, taint in enumerate(value):
            first = seen.setdefault((taint.key, taint.effect), index)
            if first != index:
                # The API refuses a node with two taints of one key and effect.
                raise PydanticCustomError(
                    "taints",
                    "taints {first} and {index} both have key '{key}' and effect {effect}; "
                    "a node may have one",
                    {"first": first, "index": index, "key": taint.key, "effect": taint.effect},
                )
        return value

    def pool(self) -> nodepools.NodePool:
        sel = self.selector
        expressions = tuple(
            nodepools.Expression(e.key, nodepools.Operator(e.operator), frozenset(e.values))
            for e in sel.match_expressions
        )
        return nodepools.NodePool(
            name=self.name,
            selector=nodepools.Selector(dict(sel.match_labels), expressions),
            labels=dict(self.labels),
            taints=tuple(t.taint() for t in self.taints),
        )


class PoolFileModel(_Model):
    pools: tuple[PoolModel, ...]

    @pydantic.model_validator(mode="after")
    def _some(self) -> PoolFileModel:
        if not self.pools:
            raise PydanticCustomError("pools", "names no pool; a file needs at least one")
        return self


def load(path: Path, keys: nodestate.Keys) -> nodepools.Layout:
    """The layout in ``path``, or ``InvalidPoolFile`` with every problem, one line each."""
    where = str(path)
    doc = read_yaml(path)
    if isinstance(doc, Unreadable):
        raise InvalidPoolFile([f"{where}: {doc.why}"])
    if not isinstance(doc, dict):
        raise InvalidPoolFile([f"{where}: must be a mapping with a list of pools under 'pools:'"])
    try:
        parsed = PoolFileModel.model_validate(doc)
    except pydantic.ValidationError as exc:
        raise InvalidPoolFile([f"{where}: {line}" for line in _lines(exc)]) from None
    layout = nodepools.Layout(tuple(p.pool() for p in parsed.pools))
    found = nodepools.problems(layout, keys)
    if found:
        raise InvalidPoolFile([f"{where}: {p}" for p in found])
    return layout


_MAPPINGS = ("labels", "matchLabels")  # the next part of a path is a key of the mapping


def _path(loc: Sequence[int | str]) -> tuple[str, bool]:
    """``pools[0].labels['gpu pool']``, and whether the error is about that key itself."""
    out, about_key, previous = "", False, None
    for part in loc:
        if part == "[key]":
            about_key = True
        elif isinstance(part, int):
            out += f"[{part}]"
        elif previous in _MAPPINGS:
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
        previous = part
    return out or "(file)", about_key


def _lines(exc: pydantic.ValidationError) -> list[str]:
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        path, about_key = _path(error["loc"])
        kind, value = error["type"], error.get("input")
        if kind == "pools":
            lines.append(f"pools=[]: {error['msg']}")
        elif kind == "missing":
            lines.append(f"{path}: is required")
        elif kind == "extra_forbidden":
            lines.append(f"{path}={value!r}: unknown field")
        elif about_key:
            lines.append(f"{path}: key {value!r}: {error['msg']}")
        elif kind == "string_type" and isinstance(value, bool | int | float):
            lines.append(f"{path}={value!r}: must be text; quote it in YAML: '{json.dumps(value)}'")
        elif kind == "string_pattern_mismatch":
            why = "a pool name is lower-case letters, digits and '-', e.g. inference-l20"
            lines.append(f"{path}={value!r}: {why}")
        else:
            msg = error["msg"].removeprefix("Value error, ").replace("valid tuple", "valid list")
            lines.append(f"{path}={value!r}: {msg}")
    return list(dict.fromkeys(lines))


# ---------------------------------------------------------------------------------------------
# The writes

DEFAULT_CONCURRENCY = 16
ATTEMPTS = 3  # writes of one node, each after a fresh read, before it is reported as failed


@dataclass(frozen=True, slots=True)
class NodeResult:
    """One node: its last plan (made again after each 409), whether its change was stored, and
    why not when it was not (``error``)."""

    plan: NodePlan
    written: bool = False
    error: str = ""
    attempts: int = 0  # patches sent


@dataclass(frozen=True, slots=True)
class Report:
    results: tuple[NodeResult, ...]  # by node name
    dry_run: bool
    # Nodes two pools select, found before any write: when there are any, nothing was written.
    overlap: tuple[NodePlan, ...] = ()

    @property
    def plans(self) -> list[NodePlan]:
        return [r.plan for r in self.results]

    @property
    def failed(self) -> list[NodeResult]:
        return [r for r in self.results if r.error]

    @property
    def complete(self) -> bool:
        """Every node matched by a pool is as its pool says (or would be, on a dry run)."""
        left = (Verdict.REFUSED, Verdict.AMBIGUOUS)
        return not (self.overlap or self.failed or any(p.verdict in left for p in self.plans))


@asynccontextmanager
async def open_writer(
    kubeconfig: Path | None = None, context: str | None = None
) -> AsyncIterator[NodeWriter]:
    """The bare ``KubeWriter`` on a client of its own: a command, not the controller, so no
    lease gates it (every node write still carries the resourceVersion it was planned from)."""
    async with kubeclient.api_client(kubeconfig, context) as api:
        yield KubeWriter(client.CoreV1Api(api))


async def apply(
    writer: NodeWriter,
    layout: nodepools.Layout,
    keys: nodestate.Keys,
    *,
    dry_run: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> Report:
    """Plan every node and write the changes (see the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency}: must be at least 1")
    views = {str(v.name): v for v in map(convert.node_view, await writer.list_nodes(""))}
    plans = nodepools.plan(views.values(), layout, keys)
    overlap = tuple(p for p in plans if p.verdict is Verdict.AMBIGUOUS)
    if overlap or dry_run:
        return Report(tuple(NodeResult(p) for p in plans), dry_run, overlap)
    limit = asyncio.Semaphore(concurrency)
    settled = await asyncio.gather(
        *(_settle(writer, views[p.node], p, layout, keys, limit) for p in plans)
    )
    return Report(tuple(settled), dry_run)


async def _settle(
    writer: NodeWriter,
    view: model.NodeView,
    plan: NodePlan,
    layout: nodepools.Layout,
    keys: nodestate.Keys,
    limit: asyncio.Semaphore,
) -> NodeResult:
    """Write ``plan``'s change; on a 409 read the node again and plan again."""
    sent = 0
    while plan.change is not None:
        sent += 1
        try:
            async with limit:
                await writer.patch_node(plan.node, plan.change, view.resource_version)
            return NodeResult(plan, written=True, attempts=sent)
        except Conflict:
            if sent >= ATTEMPTS:
                why = f"changed by another writer before each of {sent} writes; run again"
                return NodeResult(plan, error=why, attempts=sent)
        except WriteError as exc:  # refused, gone, or the API kept failing: this node alone
            return NodeResult(plan, error=str(exc), attempts=sent)
        try:
            async with limit:
                view = convert.node_view(await writer.get_node(plan.node))
        except WriteError as exc:
            return NodeResult(plan, error=f"read again after a 409: {exc}", attempts=sent)
        plan = nodepools.plan_node(view, layout, keys)
    return NodeResult(plan, attempts=sent)


def refusals(plans: Sequence[NodePlan]) -> dict[str, int]:
    """How many nodes were refused for each reason (``lent``, ``unreadable state``...)."""
    counts: dict[str, int] = {}
    for p in plans:
        if p.verdict is Verdict.REFUSED:
            counts[p.refusal] = counts.get(p.refusal, 0) + 1
    return dict(sorted(counts.items()))
