"""Which Alertmanager alerts speak for a pool: label matchers in Alertmanager's own syntax.

Where it sits: the settings parse each pool's ``wake_on`` selectors with ``parse_selector`` at
load (a bad matcher is one line naming it); ``runtime.alerts`` asks ``first_match`` of every
alert a webhook notification carries, and a firing one that matches reaches the planner as a
``model.FiringAlert`` on the pool's snapshot (docs/design/alertmanager.md).

Why Alertmanager's syntax: the people who write these selectors write route ``matchers`` every
day. A selector is what one route's ``matchers`` list holds: one or more matchers, every one of
which must hold (``alertname="InferenceQueueHigh", service=~"llm|chat"``, braces optional,
several strings joined as one). A pool's several selectors are several routes: any one admits.

Matching follows Alertmanager (``pkg/labels``): ``=`` and ``!=`` compare the whole value;
``=~`` and ``!~`` take a regular expression anchored at both ends; an absent label reads as
the empty string, so ``team=""`` matches an alert without ``team`` and ``team!="x"`` does too.
Regular expressions are Python's, which agree with Go's RE2 on the constructs matchers use
(classes, alternation, repetition); a construct one of them lacks is refused at load here or
never written there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Op(StrEnum):
    EQUAL = "="
    NOT_EQUAL = "!="
    REGEX = "=~"
    NOT_REGEX = "!~"


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: ``name``, ``op``, ``value`` (a pattern for the two regex ops)."""

    name: str
    op: Op
    value: str
    pattern: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.name, "")
        if self.op is Op.EQUAL:
            return got == self.value
        if self.op is Op.NOT_EQUAL:
            return got != self.value
        assert self.pattern is not None, "made by parse_selector"
        found = self.pattern.fullmatch(got) is not None
        return found if self.op is Op.REGEX else not found

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op.value}"{escaped}"'


@dataclass(frozen=True, slots=True)
class Selector:
    """Matchers that must all hold: one route's ``matchers``."""

    matchers: tuple[Matcher, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def __str__(self) -> str:
        """The selector in Alertmanager's syntax: ``{alertname="X", service=~"llm"}``."""
        return "{" + ", ".join(str(m) for m in self.matchers) + "}"


@dataclass(frozen=True, slots=True)
class MatcherError:
    """Why a selector cannot be read. A value, never raised."""

    text: str
    why: str

    def __str__(self) -> str:
        return self.why


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_MATCHER = re.compile(
    rf'\s*(?P<name>{_NAME})\s*(?P<op>=~|!~|!=|=)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^,"{{}}]*?)\s*'
    r"(?P<end>,|$)",
    re.DOTALL,
)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_selector(texts: str | Sequence[str]) -> Selector | MatcherError:
    """The selector ``texts`` write: one string or several (a route's ``matchers`` list), each
    one or more comma-separated matchers, braces optional. An empty selector, which would
    admit every alert, is refused."""
    parts = [texts] if isinstance(texts, str) else list(texts)
    matchers: list[Matcher] = []
    for text in parts:
        found = _parse_one(text)
        if isinstance(found, MatcherError):
            return found
        matchers.extend(found)
    if not matchers:
        shown = texts if isinstance(texts, str) else ", ".join(texts)
        return MatcherError(shown, "no matcher: a selector must name at least one label")
    return Selector(tuple(matchers))


def _parse_one(text: str) -> list[Matcher] | MatcherError:
    body = text.strip()
    if body.startswith("{") != body.endswith("}"):
        return MatcherError(text, 'unbalanced braces: write {a="b"} or a="b"')
    if body.startswith("{"):
        body = body[1:-1]
    matchers: list[Matcher] = []
    position = 0
    while body[position:].strip():
        found = _MATCHER.match(body, position)
        if found is None:
            rest = body[position:].strip()
            return MatcherError(
                text,
                f'cannot read a matcher at {rest!r}: write label="value", label!="value", '
                'label=~"regex" or label!~"regex"',
            )
        made = _matcher(found["name"], Op(found["op"]), found["value"])
        if isinstance(made, MatcherError):
            return MatcherError(text, made.why)
        matchers.append(made)
        position = found.end()
        if found["end"] == "," and not body[position:].strip():
            break  # a trailing comma, as Alertmanager allows
    return matchers


def _matcher(name: str, op: Op, raw: str) -> Matcher | MatcherError:
    value = _unquote(raw) if raw.startswith('"') else raw
    if isinstance(value, MatcherError):
        return value
    pattern = None
    if op in (Op.REGEX, Op.NOT_REGEX):
        try:
            pattern = re.compile(value)
        except re.error as exc:
            return MatcherError(raw, f"{name}{op.value}{raw}: not a regular expression ({exc})")
    return Matcher(name, op, value, pattern)


def _unquote(raw: str) -> str | MatcherError:
    out, escaped = [], False
    for char in raw[1:-1]:
        if escaped:
            if char not in _ESCAPES:
                return MatcherError(raw, f'{raw}: unknown escape \\{char} (use \\\\, \\" or \\n)')
            out.append(_ESCAPES[char])
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append(char)
    return "".join(out)


def first_match(selectors: Iterable[Selector], labels: Mapping[str, str]) -> Selector | None:
    """The first of ``selectors`` the ``labels`` satisfy, or None."""
    for selector in selectors:
        if selector.matches(labels):
            return selector
    return None
