"""Kafka's RecordBatch v2 (magic 2): the one codec for the wire and the disk.

Layout of a batch (all integers big-endian)::

    offset  size  field
         0     8  base_offset              assigned by the broker on append
         8     4  batch_length             bytes after this field
        12     4  partition_leader_epoch   assigned by the broker on append
        16     1  magic                    always 2
        17     4  crc                      CRC-32C (Castagnoli) of bytes 21..end
        21     2  attributes               see the masks below
        23     4  last_offset_delta
        27     8  base_timestamp           (the delete horizon when that bit is set)
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  record_count
        61     -  records (compressed as one block when a codec is set)

Because the CRC starts at ``attributes``, the broker assigns offsets and the
leader epoch by patching bytes 0..15 in place; the CRC stays valid and the
records are never decoded on the append path.

A record::

    length: varint            bytes after this field
    attributes: int8          unused, 0
    timestamp_delta: varlong  from base_timestamp
    offset_delta: varint      from base_offset
    key_length: varint        -1 for a null key
    key: bytes
    value_length: varint      -1 for a null value (a tombstone)
    value: bytes
    header_count: varint
    headers: (key_length varint, key utf-8, value_length varint, value bytes)*

A control record (in a batch with the control bit) has key = (version int16,
type int16: 0 ABORT, 1 COMMIT) and value = (version int16, coordinator_epoch
int32).

Damaged bytes raise ``CorruptRecordError`` saying what is wrong and where
(offset, position, expected and actual CRC); nothing deeper (IndexError,
struct.error) escapes.

A fetched records section may end inside a batch: Apache Kafka answers a
Fetch with a byte slice of its log segment, so the last batch can be cut
anywhere, and clients ignore that partial tail and fetch it again from its
base offset. ``split_partial_tail`` finds where the whole batches end; on a
log or a produce request the same cut is damage, so ``iter_batches`` keeps
raising on it.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import os
import struct
from typing import Iterable, Iterator, Sequence

import attrs

from protocol.compression import Compression, codec_from_id, compress, decompress

__all__ = [
    "BATCH_HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "BatchHeader",
    "PartialBatch",
    "Compression",
    "ControlRecord",
    "ControlType",
    "CorruptRecordError",
    "Header",
    "Record",
    "RecordBatch",
    "TimestampType",
    "compute_crc",
    "decode_batch",
    "decode_control_record",
    "encode_batch",
    "encode_control_batch",
    "encode_one_record_batch",
    "iter_batches",
    "read_batch_header",
    "set_base_offset",
    "split_partial_tail",
]


def _hardware_crc32c():
    """The optional crc32c package's function (the CPU's CRC32 instruction,
    GB/s), or None when the package is not installed.

    Its C extension is loaded by itself: the package's ``__init__`` also
    imports its command line and reads its own version from the installed
    metadata (``importlib.metadata``, which brings email, zipfile and more),
    about 15 ms of a broker's 0.1-0.2 s of imports at every start. A layout
    other than the one this knows is imported the package's own way."""
    spec = importlib.util.find_spec("crc32c")  # finds; imports nothing
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(location, "_crc32c" + suffix)
            if os.path.exists(path):
                extension = importlib.util.spec_from_file_location("crc32c._crc32c", path)
                module = importlib.util.module_from_spec(extension)
                extension.loader.exec_module(module)
                return module.crc32c
    from crc32c import crc32c as packaged

    return packaged


def _table_crc32c():
    """crcmod's table-driven C code (about 400 MB/s): same polynomial, same result."""
    import crcmod.predefined

    return crcmod.predefined.mkCrcFun("crc-32c")


crc32c = _hardware_crc32c()
HARDWARE_CRC = crc32c is not None
if crc32c is None:
    crc32c = _table_crc32c()

BATCH_HEADER = struct.Struct(
    ">"
    "q"  # base_offset
    "i"  # batch_length
    "i"  # partition_leader_epoch
    "b"  # magic
    "I"  # crc
    "h"  # attributes
    "i"  # last_offset_delta
    "q"  # base_timestamp
    "q"  # max_timestamp
    "q"  # producer_id
    "h"  # producer_epoch
    "i"  # base_sequence
    "i"  # record_count
)
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
LOG_OVERHEAD = struct.calcsize(">qi")  # base_offset + batch_length = 12
MAGIC = 2

BASE_OFFSET_AND_LENGTH = struct.Struct(">qi")
BASE_OFFSET = struct.Struct(">q")
PARTITION_LEADER_EPOCH_OFFSET = struct.calcsize(">qi")  # 12
MAGIC_OFFSET = struct.calcsize(">qii")  # 16
CRC_OFFSET = struct.calcsize(">qiib")  # 17
ATTRIBUTES_OFFSET = struct.calcsize(">qiibI")  # 21
MAX_TIMESTAMP_OFFSET = struct.calcsize(">qiibIhiq")  # 35
# The smallest possible batch_length: the header after the length field, no records.
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


class CorruptRecordError(ValueError):
    """Bytes that are not a valid RecordBatch v2, with what and where."""

    def __init__(
        self,
        reason: str,
        *,
        offset: int | None = None,
        position: int | None = None,
        expected_crc: int | None = None,
        actual_crc: int | None = None,
    ):
        self.reason = reason
        self.offset = offset
        self.position = position
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc
        where = []
        if offset is not None:
            where.append(f"base offset {offset}")
        if position is not None:
            where.append(f"position {position}")
        message = reason if not where else f"{reason} (batch at {', '.join(where)})"
        if expected_crc is not None:
            message += f": expected crc {expected_crc:#010x}, computed {actual_crc:#010x}"
        super().__init__(message)


# ---------------------------------------------------------------------------
# varints


def write_varint(out: bytearray, value: int) -> None:
    """Append a zigzag varint (Kafka's signed varint and varlong)."""
    value = (value << 1) ^ (value >> 63)
    value &= 0xFFFFFFFFFFFFFFFF
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(buf, position: int) -> tuple[int, int]:
    """Read a zigzag varint at ``position``; return (value, next position).

    Raises IndexError at the end of ``buf`` and ValueError for an overlong
    encoding; callers turn both into CorruptRecordError with context.
    """
    shift = 0
    raw = 0
    while True:
        byte = buf[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
    return (raw >> 1) ^ -(raw & 1), position


# ---------------------------------------------------------------------------
# values


@attrs.frozen
class BatchHeader:
    """The 61 fixed bytes at the front of every batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @classmethod
    def parse(cls, buf, position: int = 0) -> "BatchHeader":
        """Parse the header at ``position`` (checks length and magic, not the CRC)."""
        if position < 0 or len(buf) - position < BATCH_HEADER_SIZE:
            available = max(0, len(buf) - position)
            raise CorruptRecordError(
                f"truncated: batch header needs {BATCH_HEADER_SIZE} bytes, {available} left",
                offset=_peek_base_offset(buf, position),
                position=position,
            )
        header = cls(*BATCH_HEADER.unpack_from(buf, position))
        if header.magic != MAGIC:
            raise CorruptRecordError(
                f"unsupported magic {header.magic} (only RecordBatch v2, magic 2, is supported)",
                offset=header.base_offset,
                position=position,
            )
        return header

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, headers included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_MASK) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at int32 max, as Kafka's DefaultRecordBatch does.
        return (self.base_sequence + self.last_offset_delta) % (2**31)


@attrs.frozen
class Header:
    key: str
    value: bytes | None


@attrs.frozen
class Record:
    """A decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


@attrs.frozen
class RecordBatch:
    header: BatchHeader
    records: tuple[Record, ...]

    def __iter__(self):
        return iter(self.records)

    def __len__(self):
        return len(self.records)


@attrs.frozen
class ControlRecord:
    type: ControlType
    version: int
    coordinator_epoch: int


# ---------------------------------------------------------------------------
# validation and in-place patching


def _peek_base_offset(buf, position: int) -> int | None:
    if 0 <= position and len(buf) - position >= 8:
        return BASE_OFFSET.unpack_from(buf, position)[0]
    return None


def compute_crc(buf, position: int, header: BatchHeader) -> int:
    start = position + ATTRIBUTES_OFFSET
    return crc32c(memoryview(buf)[start : position + header.size])


def read_batch_header(buf, position: int = 0, *, verify_crc: bool = True) -> BatchHeader:
    """Validate the whole batch at ``position`` and return its header.

    Checks that the batch is complete, its length is sane, the magic is 2, the
    record count is not negative and (unless told not to) the CRC matches.
    """
    available = len(buf) - position
    if available < LOG_OVERHEAD:
        raise CorruptRecordError(
            f"truncated: {available} bytes left, a batch needs at least {BATCH_HEADER_SIZE}",
            offset=_peek_base_offset(buf, position),
            position=position,
        )
    base_offset, batch_length = BASE_OFFSET_AND_LENGTH.unpack_from(buf, position)
    if batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch length {batch_length} is below the minimum {MIN_BATCH_LENGTH}",
            offset=base_offset,
            position=position,
        )
    if batch_length + LOG_OVERHEAD > available:
        raise CorruptRecordError(
            f"truncated: batch needs {batch_length + LOG_OVERHEAD} bytes, {available} left",
            offset=base_offset,
            position=position,
        )
    header = BatchHeader.parse(buf, position)
    if header.record_count < 0:
        raise CorruptRecordError(
            f"negative record count {header.record_count}", offset=base_offset, position=position
        )
    if header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"negative last offset delta {header.last_offset_delta}",
            offset=base_offset,
            position=position,
        )
    if verify_crc:
        actual = compute_crc(buf, position, header)
        if actual != header.crc:
            raise CorruptRecordError(
                "crc mismatch",
                offset=base_offset,
                position=position,
                expected_crc=header.crc,
                actual_crc=actual,
            )
    return header


def iter_batches(buf, *, verify_crc: bool = True, start: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each consecutive batch in ``buf``.

    Raises CorruptRecordError at the first damaged or partial batch, after
    yielding every good one before it.
    """
    position = start
    end = len(buf)
    while position < end:
        header = read_batch_header(buf, position, verify_crc=verify_crc)
        yield position, header
        position += header.size


@attrs.frozen
class PartialBatch:
    """The cut-off start of a batch at the end of a fetched records section."""

    position: int
    available: int  # bytes of it present
    base_offset: int | None  # None when fewer than 8 bytes arrived
    size: int | None  # the whole batch's size (length field + 12); None before the length field arrived


def split_partial_tail(buf, start: int = 0) -> tuple[int, PartialBatch | None]:
    """Where the whole batches of a fetched records section end, and the
    partial batch after them (None when the section ends on a batch boundary).

    Only the base offset and length fields are read, as Kafka's own client
    does: fewer than 12 bytes left, or a length running past the end, is a
    partial tail; a length below the minimum is damage and raises
    ``CorruptRecordError``. The whole batches before the tail are left for
    ``iter_batches`` to validate."""
    position = start
    end = len(buf)
    while position < end:
        available = end - position
        if available < LOG_OVERHEAD:
            return position, PartialBatch(position, available, _peek_base_offset(buf, position), None)
        base_offset, batch_length = BASE_OFFSET_AND_LENGTH.unpack_from(buf, position)
        if batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch length {batch_length} is below the minimum {MIN_BATCH_LENGTH}",
                offset=base_offset,
                position=position,
            )
        size = batch_length + LOG_OVERHEAD
        if size > available:
            return position, PartialBatch(position, available, base_offset, size)
        position += size
    return position, None


def set_base_offset(buf, position: int, base_offset: int, partition_leader_epoch: int | None = None) -> None:
    """Patch a batch's base offset (and leader epoch) in place; the CRC stays valid."""
    BASE_OFFSET.pack_into(buf, position, base_offset)
    if partition_leader_epoch is not None:
        _INT32.pack_into(buf, position + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_max_timestamp_and_type(buf, position: int, header: BatchHeader, timestamp: int) -> None:
    """Stamp LogAppendTime on a batch (this changes the CRC, so it is recomputed)."""
    attributes = (header.attributes & ~TIMESTAMP_TYPE_MASK) | TIMESTAMP_TYPE_MASK
    _INT16.pack_into(buf, position + ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">q", buf, position + MAX_TIMESTAMP_OFFSET, timestamp)
    header = attrs.evolve(header, attributes=attributes, max_timestamp=timestamp)
    struct.pack_into(">I", buf, position + CRC_OFFSET, compute_crc(buf, position, header))


# ---------------------------------------------------------------------------
# encoding


def _encode_record(
    out: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence,
) -> None:
    body = bytearray(b"\x00")  # attributes
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    if key is None:
        write_varint(body, -1)
    else:
        write_varint(body, len(key))
        body += key
    if value is None:
        write_varint(body, -1)
    else:
        write_varint(body, len(value))
        body += value
    write_varint(body, len(headers))
    for header in headers:
        header_key, header_value = (header.key, header.value) if isinstance(header, Header) else header
        encoded_key = header_key.encode("utf-8")
        write_varint(body, len(encoded_key))
        body += encoded_key
        if header_value is None:
            write_varint(body, -1)
        else:
            write_varint(body, len(header_value))
            body += header_value
    write_varint(out, len(body))
    out += body


def encode_batch(
    records: Iterable,
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: Compression | int = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    delete_horizon_ms: int | None = None,
    base_timestamp: int | None = None,
    last_offset_delta: int | None = None,
    allow_empty: bool = False,
) -> bytes:
    """Encode one batch.

    ``records`` holds ``Record`` objects (their offsets are absolute: the
    deltas are taken from ``base_offset``) or ``(key, value, headers,
    timestamp)`` tuples (offsets are consecutive from ``base_offset``).
    The compactor passes ``last_offset_delta`` (and ``allow_empty``) so a
    cleaned batch spans the same offsets, and sequences, as the original.
    """
    normalized: list[tuple[int, int, bytes | None, bytes | None, Sequence]] = []
    for index, item in enumerate(records):
        if isinstance(item, Record):
            normalized.append((item.offset - base_offset, item.timestamp, item.key, item.value, item.headers))
        else:
            key, value, headers, timestamp = item
            normalized.append((index, timestamp, key, value, headers or ()))
    if not normalized and not (is_control or allow_empty):
        raise ValueError("a record batch needs at least one record")
    timestamps = [entry[1] for entry in normalized]
    if delete_horizon_ms is not None:
        first_timestamp = delete_horizon_ms
    elif base_timestamp is not None:
        first_timestamp = base_timestamp
    else:
        first_timestamp = timestamps[0] if timestamps else 0
    max_timestamp = max(timestamps) if timestamps else first_timestamp
    if last_offset_delta is None:
        last_offset_delta = max((entry[0] for entry in normalized), default=0)

    body = bytearray()
    for offset_delta, timestamp, key, value, headers in normalized:
        _encode_record(body, offset_delta, timestamp - first_timestamp, key, value, headers)
    codec = Compression(compression)
    if codec != Compression.NONE:
        body = compress(codec, bytes(body))

    attributes = codec | (timestamp_type << 3)
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_MASK

    return frame_batch(
        body, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, attributes=attributes,
        last_offset_delta=last_offset_delta, first_timestamp=first_timestamp, max_timestamp=max_timestamp,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence, count=len(normalized),
    )


def frame_batch(
    body, *, base_offset: int, partition_leader_epoch: int, attributes: int, last_offset_delta: int, first_timestamp: int,
    max_timestamp: int, producer_id: int, producer_epoch: int, base_sequence: int, count: int,
) -> bytes:
    """A batch's header in front of its (compressed) records section, the
    CRC-32C written last over attributes..end."""
    out = bytearray(BATCH_HEADER_SIZE)
    out += body
    write_batch_header(
        out, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, attributes=attributes,
        last_offset_delta=last_offset_delta, first_timestamp=first_timestamp, max_timestamp=max_timestamp,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence, count=count,
    )
    return bytes(out)


def write_batch_header(
    out, *, base_offset: int, partition_leader_epoch: int, attributes: int, last_offset_delta: int, first_timestamp: int,
    max_timestamp: int, producer_id: int, producer_epoch: int, base_sequence: int, count: int,
) -> None:
    """Write a batch's header into the first ``BATCH_HEADER_SIZE`` bytes of
    ``out`` (a writable buffer whose other bytes are the records section),
    the CRC-32C last over attributes..end (``frame_batch``'s, and the
    columnar encoder's, which encodes records behind room for it)."""
    BATCH_HEADER.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, written last
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))


def encode_one_record_batch(key: bytes | None, value: bytes | None, timestamp: int) -> bytearray:
    """``encode_batch([(key, value, (), timestamp)])``, byte for byte, for the
    coordinators' records (one per batch, no headers, no producer), without
    the general encoder's normalizing: a transaction writes three or four of
    them. A bytearray, so that the log patches the offset into it in place
    rather than copying it first."""
    return _one_record_batch(key, value, timestamp, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, 0, NO_PARTITION_LEADER_EPOCH, 0)


def _one_record_batch(key: bytes | None, value: bytes | None, timestamp: int, producer_id: int, producer_epoch: int,
                      attributes: int, partition_leader_epoch: int, base_offset: int) -> bytearray:
    record = bytearray(b"\x00\x00\x00")  # attributes, timestamp delta 0, offset delta 0
    if key is None:
        record.append(1)  # zigzag -1: a null key
    else:
        write_varint(record, len(key))
        record += key
    if value is None:
        record.append(1)
    else:
        write_varint(record, len(value))
        record += value
    record.append(0)  # no headers
    out = bytearray(BATCH_HEADER_SIZE)
    write_varint(out, len(record))
    out += record
    write_batch_header(
        out, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, attributes=attributes, last_offset_delta=0,
        first_timestamp=timestamp, max_timestamp=timestamp, producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE, count=1,
    )
    return out


def encode_control_batch(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytearray:
    """A transaction marker: one control record in a transactional control
    batch (what ``encode_batch`` writes for it, by the one-record path). A
    bytearray, which the log patches its offset into in place."""
    key = _CONTROL_KEY.pack(0, control_type)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return _one_record_batch(key, value, timestamp, producer_id, producer_epoch, TRANSACTIONAL_MASK | CONTROL_MASK, partition_leader_epoch, base_offset)


# ---------------------------------------------------------------------------
# decoding


def _decode_records(data, header: BatchHeader, position: int) -> tuple[Record, ...]:
    # The hot loop of every consumer: one-byte varints (the common case) are
    # read inline, and error context is built only when something is wrong.
    data = bytes(data)
    records = []
    append = records.append
    cursor = 0
    end = len(data)
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    index = record_start = 0
    try:
        for index in range(header.record_count):
            record_start = cursor
            byte = data[cursor]
            if byte < 0x80:
                length, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                length, cursor = read_varint(data, cursor)
            record_end = cursor + length
            if length < 0 or record_end > end:
                raise ValueError(f"length {length} overruns the batch")
            attributes = data[cursor]
            byte = data[cursor + 1]
            if byte < 0x80:
                timestamp_delta, cursor = (byte >> 1) ^ -(byte & 1), cursor + 2
            else:
                timestamp_delta, cursor = read_varint(data, cursor + 1)
            byte = data[cursor]
            if byte < 0x80:
                offset_delta, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                offset_delta, cursor = read_varint(data, cursor)
            byte = data[cursor]
            if byte < 0x80:
                key_length, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                key_length, cursor = read_varint(data, cursor)
            if key_length == -1:
                key = None
            elif 0 <= key_length <= record_end - cursor:
                key, cursor = data[cursor : cursor + key_length], cursor + key_length
            else:
                raise ValueError(f"key length {key_length} overruns the record")
            value_length, cursor = read_varint(data, cursor)
            if value_length == -1:
                value = None
            elif 0 <= value_length <= record_end - cursor:
                value, cursor = data[cursor : cursor + value_length], cursor + value_length
            else:
                raise ValueError(f"value length {value_length} overruns the record")
            byte = data[cursor]
            if byte < 0x80:
                header_count, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
            else:
                header_count, cursor = read_varint(data, cursor)
            if header_count == 0:
                headers = ()
            else:
                if header_count < 0 or header_count > record_end - cursor:
                    raise ValueError(f"header count {header_count} is impossible")
                found = []
                for _ in range(header_count):
                    header_key_length, cursor = read_varint(data, cursor)
                    if header_key_length < 0:
                        raise ValueError("header key is null")
                    header_key, cursor = _read_nullable_bytes(data, cursor, header_key_length, record_end, "", "header key")
                    header_value_length, cursor = read_varint(data, cursor)
                    header_value, cursor = _read_nullable_bytes(data, cursor, header_value_length, record_end, "", "header value")
                    found.append(Header(header_key.decode("utf-8"), header_value))
                headers = tuple(found)
            if cursor != record_end:
                raise ValueError(f"record fields end at byte {cursor}, its length says {record_end}")
            append(Record(base_offset + offset_delta, base_timestamp + timestamp_delta, key, value, headers, attributes))
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        where = f"record {index} at byte {record_start} of the records section"
        raise CorruptRecordError(f"{where}: {exc}", offset=base_offset, position=position) from None
    if cursor != end:
        raise CorruptRecordError(
            f"{end - cursor} bytes left after the {header.record_count} records the header declares",
            offset=base_offset,
            position=position,
        )
    return tuple(records)


def _read_nullable_bytes(data, cursor: int, length: int, limit: int, where: str, what: str):
    if length == -1:
        return None, cursor
    if length < -1 or cursor + length > limit:
        raise ValueError(f"{what} length {length} overruns the record")
    return bytes(data[cursor : cursor + length]), cursor + length


def decode_batch(buf, position: int = 0, *, verify_crc: bool = True) -> RecordBatch:
    """Decode and validate the batch at ``position``, records included."""
    header = read_batch_header(buf, position, verify_crc=verify_crc)
    body = memoryview(buf)[position + BATCH_HEADER_SIZE : position + header.size]
    try:
        codec = codec_from_id(header.compression)
    except Exception as exc:
        raise CorruptRecordError(str(exc), offset=header.base_offset, position=position) from None
    if codec != Compression.NONE:
        try:
            body = decompress(codec, body)
        except ValueError as exc:
            raise CorruptRecordError(str(exc), offset=header.base_offset, position=position) from None
    return RecordBatch(header, _decode_records(body, header, position))


def decode_control_record(record: Record) -> ControlRecord:
    """Read a COMMIT/ABORT marker's key and value."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record at offset {record.offset} has a short key")
    version, control_type = _CONTROL_KEY.unpack_from(record.key)
    try:
        kind = ControlType(control_type)
    except ValueError:
        raise CorruptRecordError(f"unknown control record type {control_type} at offset {record.offset}") from None
    if record.value is None or len(record.value) < _CONTROL_VALUE.size:
        raise CorruptRecordError(f"control record at offset {record.offset} has a short value")
    _value_version, coordinator_epoch = _CONTROL_VALUE.unpack_from(record.value)
    return ControlRecord(type=kind, version=version, coordinator_epoch=coordinator_epoch)
