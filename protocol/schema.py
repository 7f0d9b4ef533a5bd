"""The schema-driven codec: Kafka's primitive types and the rules that turn a
message table (``protocol.messages``) plus a version into bytes and back.

A message value is a plain dict with snake_case keys; arrays are lists;
nested structs are dicts. Missing keys take the field's default, so handlers
build responses sparsely. Fields absent in a version are skipped; in
flexible versions strings, bytes and arrays use compact (unsigned varint)
lengths and every struct ends with a tagged-field section, where tagged
fields are written only when they differ from their default and unknown
tags are skipped.

For speed each (message, version) is compiled once into a tree of small
closures (``encoder(out, value)`` / ``decoder(buf, pos) -> (value, pos)``),
cached; nothing is generated with exec.

An encoder writes into a bytearray. Into a ``SpillingBuffer`` (a bytearray
that knows what it left out) a bytes or records value of at least
``SPILL_BYTES`` is not copied: the buffer notes where it belongs and
``parts()`` hands out the encoding as buffers in order, so a Fetch answer's
records (a segment's bytes, MiBs) and a Produce request's batches go to the
socket as they are, not gathered into one frame first.

Decoding never raises anything but ``MalformedFrameError`` (the peer sent
garbage: short buffers, negative or absurd lengths, bad UTF-8), and that
error names the field where it happened.
"""

from __future__ import annotations

import struct
import uuid

import attrs

from protocol.errors import MalformedFrameError

Range = tuple[int, int | None] | None


def in_range(version: int, versions: Range) -> bool:
    if versions is None:
        return False
    low, high = versions
    return version >= low and (high is None or version <= high)


# ---------------------------------------------------------------------------
# primitive types


@attrs.frozen
class Primitive:
    name: str

    def __repr__(self) -> str:
        return self.name


BOOL = Primitive("bool")
INT8 = Primitive("int8")
INT16 = Primitive("int16")
UINT16 = Primitive("uint16")
INT32 = Primitive("int32")
INT64 = Primitive("int64")
FLOAT64 = Primitive("float64")
STRING = Primitive("string")
BYTES = Primitive("bytes")
RECORDS = Primitive("records")
UUID = Primitive("uuid")

_FIXED = {
    BOOL: struct.Struct(">?"),
    INT8: struct.Struct(">b"),
    INT16: struct.Struct(">h"),
    UINT16: struct.Struct(">H"),
    INT32: struct.Struct(">i"),
    INT64: struct.Struct(">q"),
    FLOAT64: struct.Struct(">d"),
}
_INT16 = _FIXED[INT16]
_INT32 = _FIXED[INT32]
ZERO_UUID = uuid.UUID(int=0)


@attrs.frozen
class ArrayOf:
    element: object


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()  # the field takes its type's default


@attrs.frozen
class Field:
    name: str
    type: object
    versions: Range
    nullable: Range = None
    tagged: Range = None
    tag: int | None = None
    default: object = NO_DEFAULT
    ignorable: bool = False


@attrs.frozen
class Struct:
    name: str
    fields: tuple


@attrs.frozen
class Message:
    name: str
    valid: Range
    flexible: Range
    body: Struct

    def is_flexible(self, version: int) -> bool:
        return in_range(version, self.flexible)

    def supports(self, version: int) -> bool:
        return in_range(version, self.valid)


@attrs.frozen
class Api:
    key: int
    name: str
    request: Message
    response: Message


# ---------------------------------------------------------------------------
# varints


def write_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise MalformedFrameError("unsigned varint runs past the end of the frame")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise MalformedFrameError("unsigned varint longer than 5 bytes")


# ---------------------------------------------------------------------------
# compilation


def _default_for(field: Field, kind, version: int):
    if field.default is not NO_DEFAULT:
        return field.default
    if in_range(version, field.nullable) and kind in (RECORDS,):
        return None
    if isinstance(kind, ArrayOf):
        return []
    if isinstance(kind, Struct):
        return None  # built lazily from its own defaults
    return {
        BOOL: False,
        INT8: 0,
        INT16: 0,
        UINT16: 0,
        INT32: 0,
        INT64: 0,
        FLOAT64: 0.0,
        STRING: "",
        BYTES: b"",
        RECORDS: None,
        UUID: ZERO_UUID,
    }[kind]


def _fixed_codec(kind):
    packer = _FIXED[kind]
    size = packer.size
    pack = packer.pack
    unpack_from = packer.unpack_from

    def encode(out, value):
        out += pack(value)

    def decode(buf, pos):
        end = pos + size
        if end > len(buf):
            raise MalformedFrameError(f"{kind.name} needs {size} bytes, {len(buf) - pos} left")
        return unpack_from(buf, pos)[0], end

    return encode, decode


def _length_codec(flexible: bool):
    """(write_length, read_length) where a length of -1 means null."""
    if flexible:
        def write_length(out, length):
            write_uvarint(out, length + 1)

        def read_length(buf, pos):
            raw, pos = read_uvarint(buf, pos)
            return raw - 1, pos
    else:
        def write_length(out, length):
            out += _INT32.pack(length)

        def read_length(buf, pos):
            if pos + 4 > len(buf):
                raise MalformedFrameError("length needs 4 bytes")
            return _INT32.unpack_from(buf, pos)[0], pos + 4

    return write_length, read_length


def _string_codec(flexible: bool, nullable: bool, what: str):
    if flexible:
        def write_length(out, length):
            write_uvarint(out, length + 1)

        def read_length(buf, pos):
            raw, pos = read_uvarint(buf, pos)
            return raw - 1, pos
    else:
        def write_length(out, length):
            out += _INT16.pack(length)

        def read_length(buf, pos):
            if pos + 2 > len(buf):
                raise MalformedFrameError("string length needs 2 bytes")
            return _INT16.unpack_from(buf, pos)[0], pos + 2

    def encode(out, value):
        if value is None:
            if not nullable:
                raise ValueError(f"{what} is not nullable in this version")
            write_length(out, -1)
            return
        data = value.encode("utf-8")
        write_length(out, len(data))
        out += data

    def decode(buf, pos):
        length, pos = read_length(buf, pos)
        if length < 0:
            if length == -1 and nullable:
                return None, pos
            raise MalformedFrameError(f"string length {length} is invalid here")
        end = pos + length
        if end > len(buf):
            raise MalformedFrameError(f"string of {length} bytes runs past the end of the frame")
        try:
            return str(buf[pos:end], "utf-8"), end
        except UnicodeDecodeError:
            raise MalformedFrameError("string is not valid UTF-8") from None

    return encode, decode


SPILL_BYTES = 64 * 1024  # a bytes value this large is kept out of a SpillingBuffer, not copied in


class SpillingBuffer(bytearray):
    """An encoding whose large bytes values stay where they are: the buffer
    holds everything else, ``spilled`` says where each left-out value goes
    (its position in the buffer, the value), and ``parts()`` puts them back
    in order as a list of buffers whose concatenation is the encoding."""

    def __init__(self, *args):
        super().__init__(*args)
        self.spilled: list[tuple[int, object]] = []

    @property
    def total_size(self) -> int:
        return len(self) + sum(len(value) for _, value in self.spilled)

    def parts(self) -> list:
        if not self.spilled:
            return [self]
        view = memoryview(self)
        parts, at = [], 0
        for position, value in self.spilled:
            if position > at:
                parts.append(view[at:position])
            parts.append(value)
            at = position
        if at < len(self):
            parts.append(view[at:])
        return parts


def _bytes_codec(flexible: bool, nullable: bool, what: str, zero_copy: bool):
    write_length, read_length = _length_codec(flexible)

    def encode(out, value):
        if value is None:
            if not nullable:
                raise ValueError(f"{what} is not nullable in this version")
            write_length(out, -1)
            return
        size = len(value)
        write_length(out, size)
        if size >= SPILL_BYTES and out.__class__ is SpillingBuffer:
            out.spilled.append((len(out), value))
        else:
            out += value

    def decode(buf, pos):
        length, pos = read_length(buf, pos)
        if length < 0:
            if length == -1 and nullable:
                return None, pos
            raise MalformedFrameError(f"bytes length {length} is invalid here")
        end = pos + length
        if end > len(buf):
            raise MalformedFrameError(f"{length} bytes run past the end of the frame")
        if zero_copy:
            return buf[pos:end], end  # a memoryview slice of the frame: no copy
        return bytes(buf[pos:end]), end

    return encode, decode


def _uuid_codec():
    def encode(out, value):
        if value is None:
            value = ZERO_UUID
        out += value.bytes if isinstance(value, uuid.UUID) else bytes(value)

    def decode(buf, pos):
        end = pos + 16
        if end > len(buf):
            raise MalformedFrameError("uuid needs 16 bytes")
        return uuid.UUID(bytes=bytes(buf[pos:end])), end

    return encode, decode


def _type_codec(kind, version: int, flexible: bool, nullable: bool, what: str):
    if kind in _FIXED:
        return _fixed_codec(kind)
    if kind is STRING:
        return _string_codec(flexible, nullable, what)
    if kind is BYTES:
        return _bytes_codec(flexible, nullable, what, zero_copy=False)
    if kind is RECORDS:
        return _bytes_codec(flexible, True, what, zero_copy=True)
    if kind is UUID:
        return _uuid_codec()
    if isinstance(kind, ArrayOf):
        return _array_codec(kind, version, flexible, nullable, what)
    if isinstance(kind, Struct):
        return _struct_codec(kind, version, flexible, nullable, what)
    raise TypeError(f"unknown schema type {kind!r}")


def _array_codec(kind: ArrayOf, version: int, flexible: bool, nullable: bool, what: str):
    write_length, read_length = _length_codec(flexible)
    if kind.element in _FIXED:
        return _fixed_array_codec(kind.element, write_length, read_length, nullable, what)
    encode_element, decode_element = _type_codec(kind.element, version, flexible, False, what + "[]")

    def encode(out, value):
        if value is None:
            if not nullable:
                raise ValueError(f"{what} is not nullable in this version")
            write_length(out, -1)
            return
        write_length(out, len(value))
        for element in value:
            encode_element(out, element)

    def decode(buf, pos):
        count, pos = read_length(buf, pos)
        if count < 0:
            if count == -1 and nullable:
                return None, pos
            raise MalformedFrameError(f"array length {count} is invalid here")
        if count > len(buf) - pos:
            raise MalformedFrameError(f"array of {count} elements cannot fit in the {len(buf) - pos} bytes left")
        items = []
        append = items.append
        for _ in range(count):
            item, pos = decode_element(buf, pos)
            append(item)
        return items, pos

    return encode, decode


def _fixed_array_codec(element, write_length, read_length, nullable: bool, what: str):
    """An array of fixed-size elements (partition ids, replica lists): packed
    and unpacked whole by one struct format, the bytes of element by element."""
    code = _FIXED[element].format.lstrip(">")
    size = _FIXED[element].size

    def encode(out, value):
        if value is None:
            if not nullable:
                raise ValueError(f"{what} is not nullable in this version")
            write_length(out, -1)
            return
        write_length(out, len(value))
        out += struct.pack(f">{len(value)}{code}", *value)

    def decode(buf, pos):
        count, pos = read_length(buf, pos)
        if count < 0:
            if count == -1 and nullable:
                return None, pos
            raise MalformedFrameError(f"array length {count} is invalid here")
        left = len(buf) - pos
        if count > left:
            raise MalformedFrameError(f"array of {count} elements cannot fit in the {left} bytes left")
        if count * size > left:
            raise MalformedFrameError(f"{element.name} needs {size} bytes, {left % size} left")
        return list(struct.unpack_from(f">{count}{code}", buf, pos)), pos + count * size

    return encode, decode


def _struct_codec(schema: Struct, version: int, flexible: bool, nullable: bool, what: str):
    # (name, default, encode, decode, size): a fixed-size field (size > 0)
    # has its ``struct.Struct``'s own pack and unpack_from, called from the
    # loops below with no closure between (most fields are fixed-size).
    regular = []
    fixed_kinds = {}  # name -> kind, of the fixed-size regular fields (for errors)
    tagged = {}  # tag -> (name, default, encode, decode)
    for field in schema.fields:
        # A field exists in a version by its versions, or (tagged-only fields,
        # which declare no versions) by its tagged versions in flexible ones.
        if not (in_range(version, field.versions) or (flexible and in_range(version, field.tagged))):
            continue
        is_nullable = in_range(version, field.nullable)
        encode, decode = _type_codec(field.type, version, flexible, is_nullable, field.name)
        default = _default_for(field, field.type, version)
        if isinstance(field.type, Struct) and default is None and not is_nullable:
            default = _StructDefault(field.type, version, flexible)
            encode = _struct_default_as_empty(encode)
        entry = (field.name, default, encode, decode)
        if flexible and in_range(version, field.tagged):
            tagged[field.tag] = entry
        elif field.type in _FIXED:
            packer = _FIXED[field.type]
            regular.append((field.name, default, packer.pack, packer.unpack_from, packer.size))
            fixed_kinds[field.name] = field.type
        else:
            regular.append((*entry, 0))
    tags_in_order = sorted(tagged.items())

    def encode(out, value):
        if value is None:
            if nullable:
                out.append(0xFF)  # nullable struct: int8 -1
                return
            value = {}
        elif nullable:
            out.append(1)
        get = value.get
        for name, default, encode_field, _, size in regular:
            field_value = get(name, default)
            try:
                if size:
                    out += encode_field(field_value)
                else:
                    encode_field(out, field_value)
            except (ValueError, TypeError, struct.error, AttributeError) as error:
                raise ValueError(f"{schema.name}.{name}: cannot encode {field_value!r}: {error}") from None
        if flexible:
            present = []
            for tag, (name, default, encode_field, _) in tags_in_order:
                field_value = get(name, default)
                if isinstance(field_value, _StructDefault) or field_value == default:
                    continue
                buffer = bytearray()
                encode_field(buffer, field_value)
                present.append((tag, buffer))
            write_uvarint(out, len(present))
            for tag, buffer in present:
                write_uvarint(out, tag)
                write_uvarint(out, len(buffer))
                out += buffer

    def decode(buf, pos):
        if nullable:
            if pos >= len(buf):
                raise MalformedFrameError(f"{what}: struct marker runs past the end")
            marker = buf[pos]
            pos += 1
            if marker == 0xFF:
                return None, pos
        value = {}
        for name, _default, _, decode_field, size in regular:
            if size:
                end = pos + size
                if end > len(buf):
                    raise MalformedFrameError(f"{schema.name}.{name}: {fixed_kinds[name].name} needs {size} bytes, {len(buf) - pos} left")
                value[name] = decode_field(buf, pos)[0]
                pos = end
                continue
            try:
                value[name], pos = decode_field(buf, pos)
            except MalformedFrameError as error:
                raise MalformedFrameError(f"{schema.name}.{name}: {error}") from None
        if flexible:
            count, pos = read_uvarint(buf, pos)
            if count > len(buf) - pos:
                raise MalformedFrameError(f"{schema.name}: {count} tagged fields cannot fit")
            for _ in range(count):
                tag, pos = read_uvarint(buf, pos)
                size, pos = read_uvarint(buf, pos)
                end = pos + size
                if end > len(buf):
                    raise MalformedFrameError(f"{schema.name}: tagged field {tag} runs past the end")
                known = tagged.get(tag)
                if known is not None:
                    name, _default, _, decode_field = known
                    field_value, used = decode_field(buf[:end], pos)
                    if used != end:
                        raise MalformedFrameError(f"{schema.name}.{name}: tagged field size {size} does not match its content")
                    value[name] = field_value
                pos = end
            for tag, (name, default, _, _) in tags_in_order:
                if name not in value:
                    value[name] = {} if isinstance(default, _StructDefault) else default
        return value, pos

    return encode, decode


def _struct_default_as_empty(encode_struct):
    """A non-nullable nested struct's encoder that takes its placeholder
    default for an empty value (so the fields loop need not look)."""

    def encode(out, value):
        encode_struct(out, {} if value.__class__ is _StructDefault else value)

    return encode


class _StructDefault:
    """Placeholder default for a non-nullable nested struct field."""

    __slots__ = ("schema", "version", "flexible")

    def __init__(self, schema, version, flexible):
        self.schema = schema
        self.version = version
        self.flexible = flexible

    def __eq__(self, other):
        return isinstance(other, _StructDefault) or other == {}

    def __hash__(self):
        return 0


_CACHE: dict[tuple[int, int], tuple] = {}


def codec(message: Message, version: int):
    """The compiled (encode, decode) pair for ``message`` at ``version``."""
    key = (id(message), version)
    compiled = _CACHE.get(key)
    if compiled is None:
        if not message.supports(version):
            raise ValueError(f"{message.name} has no version {version}")
        compiled = _struct_codec(message.body, version, message.is_flexible(version), False, message.name)
        _CACHE[key] = compiled
    return compiled


def encode(message: Message, version: int, value: dict) -> bytes:
    out = bytearray()
    codec(message, version)[0](out, value)
    return bytes(out)


def encode_into(out: bytearray, message: Message, version: int, value: dict) -> None:
    codec(message, version)[0](out, value)


def decode(message: Message, version: int, buf, pos: int = 0, *, exact: bool = True) -> tuple[dict, int]:
    """Decode ``message`` from ``buf`` at ``pos``. With ``exact`` the body must
    end where the buffer does (Kafka tolerates trailing bytes only in
    ignorable fields; we are strict about requests)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    try:
        value, end = codec(message, version)[1](view, pos)
    except MalformedFrameError as error:
        raise MalformedFrameError(f"{message.name} v{version}: {error}") from None
    except (struct.error, IndexError, ValueError, OverflowError) as error:  # defensive: never leak these
        raise MalformedFrameError(f"{message.name} v{version}: {error}") from None
    if exact and end != len(view):
        raise MalformedFrameError(f"{message.name} v{version}: {len(view) - end} unexpected bytes after the body")
    return value, end
