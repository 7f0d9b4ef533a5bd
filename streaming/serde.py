"""Serialization formats of record keys and values, by name.

A processor names a format for its source and sink keys and values:

| format | to bytes | from bytes |
| --- | --- | --- |
| ``"bytes"`` (default) | passed through (``bytes``, ``bytearray``, ``memoryview``) | as read |
| ``"str"`` | UTF-8 | UTF-8 (strict: bad bytes are a deserialization error) |
| ``"json"`` | compact JSON, UTF-8 | ``json.loads`` |
| ``"auto"`` (a sink's default for values) | bytes as they are, str as UTF-8, anything else as compact JSON | JSON if it parses, else UTF-8 text, else the bytes |
| ``(serialize, deserialize)`` | your function | your function |

A sink whose value format is not given writes values with ``"auto"``, so
what a processor emits decides: a dict becomes JSON whatever the source's
format. (Keys keep the source's key format: the same key must keep its
bytes, hence its partition.)

``None`` (a null key, a tombstone value) passes through every format
untouched, so a null never becomes ``b"null"``.

``INTERNAL_FORMAT`` is the format of the runner's own topics (the dataflow
layer's repartition topics): Python values through JSON with their types
kept (str, bytes, int, float, bool, None, tuples, lists, dicts with str
keys), sorted keys so one key is one byte string, hence one partition.

``resolve(fmt)`` turns any of these into a ``Serde``; the runner and the
dataflow layer share it. A failure either way raises ``SerializationError``
naming the format, so the runner can route the record by ``on_error``.
"""

from __future__ import annotations

import base64
import json
import json.encoder
import json.scanner
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
# And its C encoding function made once (JSONEncoder.encode makes one per
# call, with a dict for circular references: a circular value fails here by
# recursion instead, a SerializationError all the same). None where the C
# accelerator is missing.
_ENCODE_C = (json.encoder.c_make_encoder(None, COMPACT_JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
             if json.encoder.c_make_encoder is not None else None)
# The C scanner json.loads ends in, without its detection of the encoding and its whitespace look-ups.
_SCAN = json.scanner.make_scanner(json.JSONDecoder())


def json_bytes(value) -> bytes:
    """Compact UTF-8 JSON (``COMPACT_JSON``), through the C encoder when it is there."""
    if _ENCODE_C is None or isinstance(value, str):
        return COMPACT_JSON.encode(value).encode("utf-8")
    return "".join(_ENCODE_C(value, 0)).encode("utf-8")


def json_value(data):
    """``json.loads(data)``: the scanner straight on the UTF-8 text when that
    is one JSON value from its first byte to its last (what compact JSON
    writers write); anything else (whitespace around it, a BOM, UTF-16 or 32,
    damage) goes through ``json.loads`` itself, so values and errors are its own."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    except (ValueError, StopIteration):
        pass
    return json.loads(data)


def _auto_out(value) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json_bytes(value)


def _auto_in(data: bytes):
    data = bytes(data)
    try:
        return json_value(data)
    except ValueError:
        pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


FORMATS: dict[str, Serde] = {
    "bytes": Serde("bytes", _bytes_out, bytes),
    "str": Serde("str", _str_out, lambda data: bytes(data).decode("utf-8")),
    "json": Serde("json", json_bytes, json_value),
    "auto": Serde("auto", _auto_out, _auto_in),
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


# -- the internal topics' format: Python values through JSON, types kept -----------------


def _to_tree(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [_to_tree(item) for item in value]
    if isinstance(value, tuple):
        return {"t": [_to_tree(item) for item in value]}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("a dict crossing a repartition topic needs str keys")
        return {"d": {key: _to_tree(item) for key, item in value.items()}}
    raise TypeError(f"a {type(value).__name__} cannot cross a repartition topic (use str, bytes, numbers, None, tuples, lists, dicts)")


def _from_tree(tree):
    if isinstance(tree, list):
        return [_from_tree(item) for item in tree]
    if isinstance(tree, dict):
        if "t" in tree:
            return tuple(_from_tree(item) for item in tree["t"])
        if "b" in tree:
            return base64.b64decode(tree["b"])
        return {key: _from_tree(item) for key, item in tree["d"].items()}
    return tree


def encode_internal(value) -> bytes:
    # sort_keys: one key, one byte string, so one partition.
    return json.dumps(_to_tree(value), separators=(",", ":"), sort_keys=True, allow_nan=False).encode("utf-8")


def decode_internal(data: bytes):
    return _from_tree(json.loads(data))


INTERNAL_FORMAT = (encode_internal, decode_internal)
