"""Resource quantities (``500m``, ``8``, ``16Gi``, ``1e3``) as exact decimals.

The scheduler stand-in adds pod requests and compares them with node allocatable; floats would
round ``0.1 + 0.2`` the wrong way, so quantities are ``Decimal`` throughout.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_FORM = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))((?:[eE][+-]?\d+)|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?")


def parse(value: object) -> Decimal:
    """A quantity's value; raises ``ValueError`` for anything the API would reject."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        raise ValueError(f"quantity {value!r} is not a string or a number")
    match = _FORM.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"quantities must match the regular expression {_FORM.pattern!r}")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        base = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the pattern already guards this
        raise ValueError(f"bad quantity {value!r}") from exc
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return base * (Decimal(10) ** int(suffix[1:]))
    return base * _DECIMAL[suffix]
