"""Label and field selectors, parsed and matched as ``k8s.io/apimachinery`` does.

Label selectors come in two forms: the query-string syntax (``a=b,c!=d,e in (f,g),!h,i``) and the
``metav1.LabelSelector`` object (``matchLabels`` and ``matchExpressions``) of a PodDisruptionBudget.
Both become one ``Selector``. Note the negative operators: ``!=`` and ``notin`` also match an
object that lacks the key, as in the real server. ``None`` (a nil selector) matches nothing; an
empty selector matches everything.

Field selectors support ``=``, ``==`` and ``!=`` over the fields each resource declares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_QUALIFIED = re.compile(rf"({_PREFIX}/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")


class SelectorError(ValueError):
    """A selector the server would answer with 400 BadRequest."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # in, notin, =, ==, !=, exists, !, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case "in" | "=" | "==":
                return has and value in self.values
            case "notin" | "!=":
                return not has or value not in self.values
            case "exists":
                return has
            case "!":
                return not has
            case "gt" | "lt":
                return has and _compare(value, self.values[0], self.operator)
        return False


def _compare(value: str, bound: str, operator: str) -> bool:
    try:
        left, right = int(value), int(bound)
    except ValueError:
        return False
    return left > right if operator == "gt" else left < right


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


EVERYTHING = Selector()


# ---------------------------------------------------------------------------------------------
# The query-string syntax

_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s=!(),<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:  # pragma: no cover - the pattern accepts every character class
            raise SelectorError(f"unable to parse requirement: {text[position:]!r}")
        out.append(match.group(1))
        position = match.end()
    return out


def parse_labels(text: str | None) -> Selector:
    """Parse ``labelSelector``; raises ``SelectorError`` as the server would answer 400."""
    if not text or not text.strip():
        return EVERYTHING
    tokens = _tokens(text)
    requirements: list[Requirement] = []
    position = 0
    while position < len(tokens):
        requirement, position = _requirement(tokens, position)
        requirements.append(requirement)
        if position < len(tokens):
            if tokens[position] != ",":
                raise SelectorError(f"found '{tokens[position]}', expected: ',' or 'end of string'")
            position += 1
            if position == len(tokens):
                raise SelectorError("found 'end of string', expected: identifier")
    return Selector(tuple(requirements))


def _requirement(tokens: list[str], position: int) -> tuple[Requirement, int]:
    if tokens[position] == "!":
        key = _key(tokens, position + 1)
        return Requirement(key, "!"), position + 2
    key = _key(tokens, position)
    position += 1
    if position == len(tokens) or tokens[position] == ",":
        return Requirement(key, "exists"), position
    operator = tokens[position]
    position += 1
    if operator in ("in", "notin"):
        values, position = _set(tokens, position)
        if not values:
            raise SelectorError(f"for 'in', 'notin' operators, values set can't be empty ({key})")
        return Requirement(key, operator, values), position
    if operator in ("=", "==", "!="):
        value, position = _single_value(tokens, position)
        return Requirement(key, operator, (value,)), position
    if operator in ("<", ">"):
        value, position = _single_value(tokens, position)
        try:
            int(value)
        except ValueError:
            raise SelectorError(
                f"for 'Gt', 'Lt' operators, the value must be an integer: {value!r}"
            ) from None
        return Requirement(key, "gt" if operator == ">" else "lt", (value,)), position
    raise SelectorError(f"found '{operator}', expected: in, notin, =, ==, !=, gt, lt")


def _key(tokens: list[str], position: int) -> str:
    if position >= len(tokens) or tokens[position] in ("=", "==", "!=", "!", "(", ")", ","):
        found = tokens[position] if position < len(tokens) else "end of string"
        raise SelectorError(f"found '{found}', expected: identifier")
    key = tokens[position]
    if not valid_qualified_name(key):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _single_value(tokens: list[str], position: int) -> tuple[str, int]:
    if position == len(tokens) or tokens[position] == ",":
        return "", position
    value = tokens[position]
    if not valid_label_value(value):
        raise SelectorError(f"unable to parse requirement: invalid label value: {value!r}")
    return value, position + 1


def _set(tokens: list[str], position: int) -> tuple[tuple[str, ...], int]:
    if position == len(tokens) or tokens[position] != "(":
        raise SelectorError("found 'end of string', expected: '('")
    position += 1
    values: list[str] = []
    expect_value = True
    while position < len(tokens) and tokens[position] != ")":
        token = tokens[position]
        if token == ",":
            if expect_value:
                values.append("")
            expect_value = True
        else:
            if not valid_label_value(token):
                raise SelectorError(f"unable to parse requirement: invalid label value: {token!r}")
            values.append(token)
            expect_value = False
        position += 1
    if position == len(tokens):
        raise SelectorError("found 'end of string', expected: ')'")
    return tuple(sorted(set(values))), position + 1


# ---------------------------------------------------------------------------------------------
# metav1.LabelSelector objects


def from_object(selector: Mapping[str, Any] | None) -> Selector | None:
    """A ``metav1.LabelSelector``; ``None`` (nil) selects nothing, ``{}`` everything."""
    if selector is None:
        return None
    requirements = [
        Requirement(key, "=", (str(value),))
        for key, value in sorted((selector.get("matchLabels") or {}).items())
    ]
    operators = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expression in selector.get("matchExpressions") or []:
        operator = operators.get(expression.get("operator", ""))
        if operator is None:
            raise SelectorError(f"{expression.get('operator')!r} is not a valid label selector")
        values = tuple(sorted(str(v) for v in expression.get("values") or []))
        requirements.append(Requirement(str(expression.get("key", "")), operator, values))
    return Selector(tuple(requirements))


# ---------------------------------------------------------------------------------------------
# Field selectors


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    negate: bool
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        equal = fields.get(self.field, "") == self.value
        return not equal if self.negate else equal


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(r.matches(fields) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


NO_FIELDS = FieldSelector()


def parse_fields(text: str | None, supported: frozenset[str]) -> FieldSelector:
    """Parse ``fieldSelector``; a field the resource does not index is a 400 BadRequest."""
    if not text or not text.strip():
        return FieldSelector()
    requirements: list[FieldRequirement] = []
    for part in _split_unescaped(text):
        operator = next((o for o in ("!=", "==", "=") if o in part), None)
        if operator is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, value = part.split(operator, 1)
        negate = operator == "!="
        field = field.strip()
        if field not in supported:
            raise SelectorError(f"field label not supported: {field}")
        requirements.append(FieldRequirement(field, negate, _unescape(value)))
    return FieldSelector(tuple(requirements))


def _split_unescaped(text: str) -> list[str]:
    parts, current, escaped = [], "", False
    for char in text:
        if escaped:
            current += "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


# ---------------------------------------------------------------------------------------------
# Name checks shared with validation


def valid_qualified_name(key: str) -> bool:
    """``IsQualifiedName``: an optional DNS-subdomain prefix and a 63-character name."""
    if not _QUALIFIED.fullmatch(key):
        return False
    prefix, _, name = key.rpartition("/")
    return len(name) <= 63 and len(prefix) <= 253


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_VALUE.fullmatch(value))
