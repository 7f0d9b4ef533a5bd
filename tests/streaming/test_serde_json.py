"""The ``"json"`` and ``"auto"`` formats' fast paths (the C scanner and
encoder called directly, ``streaming.serde``) give what ``json.loads`` and
``json.dumps`` give: every value, every byte string, every error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.serde import SerializationError, resolve

JSON_FORMAT = resolve("json")
AUTO = resolve("auto")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def loads_or_error(data):
    try:
        return json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        return "error"


def deserialize_or_error(serde, data):
    try:
        return serde.deserialize(data)
    except SerializationError:
        return "error"


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_values_serialize_as_json_dumps_writes_them(value):
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert JSON_FORMAT.to_bytes(value) == expected  # serialize(None) is None: a null passes every format untouched
    assert repr(JSON_FORMAT.from_bytes(expected)) == repr(value)


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\r\n"]), st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32"]))
def test_text_reads_as_json_loads_reads_it(value, before, after, encoding):
    data = (before + json.dumps(value, ensure_ascii=bool(len(before) % 2)) + after).encode(encoding)
    assert repr(deserialize_or_error(JSON_FORMAT, data)) == repr(loads_or_error(data))


@settings(max_examples=250, deadline=None)
@given(st.binary(max_size=24) | st.sampled_from([b"12", b"1 2", b"[1,", b'"\xed\xa0\x80"', b"NaN", b"-Infinity", b"\x00", b"{}x", b"\xef\xbb\xbf{}"]))
def test_any_bytes_read_as_json_loads_reads_them(data):
    assert repr(deserialize_or_error(JSON_FORMAT, data)) == repr(loads_or_error(data))  # repr: nan is nan
    fallback = loads_or_error(data)
    if fallback == "error":
        try:
            fallback = data.decode("utf-8")
        except UnicodeDecodeError:
            fallback = data
    assert repr(AUTO.deserialize(data)) == repr(fallback)


def test_what_json_refuses_is_a_serialization_error():
    circular: list = []
    circular.append(circular)
    for value in (float("nan"), {(1,): 2}, object(), circular):
        with pytest.raises(SerializationError):
            JSON_FORMAT.serialize(value)
    assert JSON_FORMAT.serialize({1: "é"}) == '{"1":"é"}'.encode()  # as json.dumps: int keys become strings
