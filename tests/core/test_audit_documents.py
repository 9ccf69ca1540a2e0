"""``documents.jsonable``: the exact-type fast path writes what the full path writes."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rebalancer.core.audit.documents import jsonable, time_doc


class Colour(enum.StrEnum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 2


def reference(value: Any) -> Any:
    """``jsonable`` as it was written before its fast path: every check by ``isinstance``."""
    if isinstance(value, enum.Enum):
        return reference(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, datetime):
        return time_doc(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): reference(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [reference(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return str(value)


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.datetimes(timezones=st.just(UTC)),
    st.timedeltas(),
    st.sampled_from([Colour.RED, Size.BIG]),
    st.just(b"bytes"),  # anything else is written as its str
)
keys = st.one_of(st.text(max_size=3), st.integers(), st.sampled_from([Colour.RED, Size.BIG]))
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(keys, inner, max_size=4).map(MappingProxyType),
        st.frozensets(st.one_of(st.integers(), st.text(max_size=3)), max_size=4),
    ),
    max_leaves=20,
)


@given(values)
def test_the_fast_path_writes_what_the_full_path_wrote(value: Any) -> None:
    written, expected = jsonable(value), reference(value)
    assert repr(written) == repr(expected)  # repr: a NaN is not equal to itself
    assert [type(v) for v in _leaves(written)] == [type(v) for v in _leaves(expected)]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def test_an_enum_is_written_as_its_value_not_as_the_str_or_int_it_also_is() -> None:
    assert type(jsonable(Colour.RED)) is str
    assert jsonable(Colour.RED) == "red"
    assert type(jsonable(Size.BIG)) is int
    assert jsonable({"s": Size.BIG}) == {"s": 2}
    assert jsonable(True) is True  # a bool is not written as the int it also is
