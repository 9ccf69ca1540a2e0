"""Values from outside, bounded wherever they are copied: the one cut every copy goes through.

Where it sits: what the controller reads from others (a node's annotations and labels, an
Alertmanager alert's fields, a query's answer, an override's value) reaches findings, audit
records, Events, log lines and HTTP answers. Each place that copies such a value into one of
those passes it through ``cut`` (a value kept as a field) or ``quoted`` (a value said inside a
sentence) first (docs/design/bounded-copies.md).

Why: an annotation may hold 256 KiB and a request body a megabyte. Copied whole, one bad
override made every audit row of its node about 1 MB, and ``explain`` answered a megabyte. Cut,
a copy keeps the value's start (enough to recognise it), its size, and a digest that tells two
big values apart and finds the original (``kubectl get node -o json | sha256sum`` of the value).

Pure: strings in, strings out; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

KEPT = 256  # characters of an outside value kept where it is copied as a field of its own
QUOTED = 64  # characters of one quoted inside a sentence (a message, a note, a reason)
SENTENCE = 1024  # characters of a sentence built around outside values: a backstop
DIGEST = 16  # hex digits of the SHA-256 a cut value carries: 64 bits tell values apart
LISTED = 20  # items of a list from outside (the alerts holding a pool) copied one by one


def cut(text: str, limit: int = KEPT) -> str:
    """``text`` itself when it has at most ``limit`` characters; else its first ``limit``,
    then ``… (<size> bytes, sha256:<digest>)`` of the whole (UTF-8)."""
    if len(text) <= limit:
        return text
    return text[:limit] + "… " + measure(text)


def quoted(value: object, limit: int = QUOTED) -> str:
    """``value`` quoted as ``repr`` quotes it, cut as ``cut`` does: ``'abc'… (<size> bytes,
    sha256:<digest>)`` when a text is longer than ``limit`` (another value: its ``repr``)."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "… " + measure(text)
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… {measure(value)}"


def measure(text: str) -> str:
    """``(<size> bytes, sha256:<digest>)``: what a cut says of the whole value."""
    # A JSON body may carry a lone surrogate (``"\\ud800"``): its bytes are counted as
    # Python holds them rather than refused here.
    data = text.encode("utf-8", "surrogatepass")
    return f"({len(data)} bytes, sha256:{hashlib.sha256(data).hexdigest()[:DIGEST]})"


def listed(items: Sequence[T], limit: int = LISTED) -> tuple[Sequence[T], int]:
    """The first ``limit`` of ``items``, and how many more there are: a copy names those and
    counts the rest."""
    return items[:limit], max(0, len(items) - limit)
