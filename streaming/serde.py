"""Serialization formats of record keys and values, by name.

A processor names a format for its source and sink keys and values:

| format | to bytes | from bytes |
| --- | --- | --- |
| ``"bytes"`` (default) | passed through (``bytes``, ``bytearray``, ``memoryview``) | as read |
| ``"str"`` | UTF-8 | UTF-8 (strict: bad bytes are a deserialization error) |
| ``"json"`` | compact JSON, UTF-8 | ``json.loads`` |
| ``(serialize, deserialize)`` | your function | your function |

``None`` (a null key, a tombstone value) passes through every format
untouched, so a null never becomes ``b"null"``.

``resolve(fmt)`` turns any of these into a ``Serde``; the runner and the
dataflow layer share it. A failure either way raises ``SerializationError``
naming the format, so the runner can route the record by ``on_error``.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import attrs


class SerializationError(ValueError):
    """A key or value could not be turned into bytes, or back."""


@attrs.frozen
class Serde:
    name: str
    to_bytes: Callable[[Any], bytes]
    from_bytes: Callable[[bytes], Any]

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        try:
            data = self.to_bytes(value)
        except Exception as error:
            raise SerializationError(f"cannot serialize {type(value).__name__} as {self.name}: {error}") from error
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SerializationError(f"format {self.name} turned a {type(value).__name__} into {type(data).__name__}, not bytes")
        return bytes(data)

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return self.from_bytes(data)
        except Exception as error:
            raise SerializationError(f"cannot deserialize {len(data)} bytes as {self.name}: {error}") from error


def _bytes_out(value) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"format 'bytes' takes bytes, not {type(value).__name__} (name a format such as 'str' or 'json')")


def _str_out(value) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"format 'str' takes str, not {type(value).__name__}")
    return value.encode("utf-8")


# One encoder for every value: json.dumps with options builds a new
# JSONEncoder per call, which was half the cost of a small value.
COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_out(value) -> bytes:
    return COMPACT_JSON.encode(value).encode("utf-8")


FORMATS: dict[str, Serde] = {
    "bytes": Serde("bytes", _bytes_out, bytes),
    "str": Serde("str", _str_out, lambda data: bytes(data).decode("utf-8")),
    "json": Serde("json", _json_out, json.loads),
}


def resolve(fmt) -> Serde:
    """A ``Serde`` for a format name, a ``(serialize, deserialize)`` pair, or a ``Serde``."""
    if isinstance(fmt, Serde):
        return fmt
    if isinstance(fmt, str):
        try:
            return FORMATS[fmt]
        except KeyError:
            raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(map(repr, FORMATS))} or a (serialize, deserialize) pair") from None
    if isinstance(fmt, (tuple, list)) and len(fmt) == 2 and all(callable(f) for f in fmt):
        serialize, deserialize = fmt
        return Serde(getattr(serialize, "__name__", "custom"), serialize, deserialize)
    raise ValueError(f"a format is 'bytes', 'str', 'json' or a (serialize, deserialize) pair, not {fmt!r}")
