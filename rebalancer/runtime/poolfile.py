"""The pools file of ``rebalancer pools apply``: read, validated, and made a ``nodepools.Layout``.

Where it sits: the command's first step; nothing is asked of the cluster until the whole file is
good. Why pydantic here and not in the core: this is a boundary (a person's YAML), and the core
keeps frozen values. The shape is Kubernetes' own words (``matchLabels``, ``matchExpressions``,
a taint's ``key``, ``value``, ``effect``), so a selector can be copied from a manifest.

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

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from rebalancer.core import model, nodepools, nodestate
from rebalancer.settings import InvalidSettings, Unreadable, read_yaml, taint_text


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
