"""Record batches as columns: RecordBatch v2 bytes straight to and from Arrow arrays.

This module owns the columnar codec beside ``protocol/records.py`` (which
stays the one codec of the broker and of the per-record clients; it never
imports this module, so the broker never loads numpy or pyarrow):

- ``decode_fetched``: one partition's fetched records section (many batches,
  compressed or not, perhaps ending in a partial batch) into the columns of
  ``FETCHED_SCHEMA`` (key, value, offset, timestamp, timestamp_type,
  headers), keeping exactly the records ``txn.fetcher.committed_records``
  keeps: control batches never, the batches of aborted transactions not
  under read_committed, records before the fetch offset not at all; a
  LogAppendTime batch gives its records the batch's max timestamp.
- ``encode_columns``: key, value, timestamp and headers columns of one
  partition into one batch, byte for byte what ``records.encode_batch``
  makes of the same records.

No Python object is made per record. Decoding finds where each record
starts: in a batch of fixed-size values (records that grow only where the
offset delta's varint does) the starts are guessed by arithmetic, for all
such batches at once, and confirmed by the lengths read there; in other
batches runs of records of one size are found by numpy comparisons and the
rest by a Python loop that reads only the length varint of each record and
stores integer positions. Records of one size one after another that are
laid out alike (the same varint widths, key and value lengths, no headers:
fixed-size values) are the rows of byte matrices, checked together for all
such runs of a fetch (a gather per byte checked) and read by columns;
when keys and values have one length each and no record has headers (the
records outside the runs, a batch too short for one or the few after one,
read varint by varint, agree), the binary columns are filled by one
strided copy per run and one gather for the records outside. Otherwise
every other field is read by numpy at all the record positions at once,
and the binary columns are cut out of one buffer by Arrow's ``take`` over
offsets that point into it.
Encoding builds each record's varints as rows of a byte matrix. Records
without headers that come in a few runs of one size (fixed-size values:
the size changes only where the offset delta's varint grows) are laid out
as the rows of one byte matrix per run: the run's first record written to
every row where no field differs, then a numpy copy per field that differs
(offset deltas, key and value bytes straight from their Arrow buffers), each
row's bytes of a field copied as one numpy void value; the offset deltas
with the template's bytes around them are the same in every batch of a
size and layout, and are kept from one batch to the next. Any other
records: the unused varint bytes are squeezed out with one mask, and Arrow's
``binary_join_element_wise`` lays out prefix, key, value length, value and
headers of every record as one buffer. Either way the buffer is the records
section.

Damage raises ``CorruptRecordError`` as ``records.py`` does: when the
vectorised checks find something wrong, the damaged batch is decoded again
by ``records.decode_batch`` for its precise message. Varints are read modulo
2**64, so a timestamp or offset is the one ``records.read_varint``'s
unbounded integers give whenever that fits an int64, and a length with bits
past 64 (never valid) is damage.
"""

from __future__ import annotations

import heapq
from array import array

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol import records
from protocol.compression import Compression, codec_from_id, compress, decompress
from protocol.records import (
    BATCH_HEADER_SIZE,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TRANSACTIONAL_MASK,
    ControlType,
    CorruptRecordError,
    PartialBatch,
    TimestampType,
    decode_batch,
    decode_control_record,
    iter_batches,
    read_varint,
    split_partial_tail,
)

__all__ = ["FETCHED_SCHEMA", "HEADERS_TYPE", "EncodedRecords", "FetchedColumns", "decode_fetched", "encode_columns", "encode_records", "frame_records"]

HEADER_STRUCT_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_STRUCT_TYPE)
FETCHED_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),  # ms; a LogAppendTime batch's max timestamp
        pa.field("timestamp_type", pa.int32(), nullable=False),  # records.TimestampType
        pa.field("headers", HEADERS_TYPE, nullable=False),  # empty lists for records without headers
    ]
)

# Bytes of zeros after the joined records sections of compressed batches,
# so that reading a varint (at most 10 bytes) a few fields past a damaged
# record's end stays inside the buffer; such a record fails the checks before
# anything is kept. (Uncompressed records are read where they came: a read
# past the fetched bytes is an IndexError, damage too.)
_PADDING = 64
# Fewer records of one size than this are scanned by the loop (a run found
# by numpy costs a few numpy calls, more than the loop spends on a few
# records), and then the next _LOOP_RECORDS records are, before the next
# look for a run.
_RUN_MIN_RECORDS = 16
_LOOP_RECORDS = 256
_INT32_MAX = 2**31 - 1
# The encoder lays records out run by run when a call's records come in at
# most this many runs of one layout, or one run per this many records.
_MOST_RUNS = 16
_RECORDS_PER_RUN = 64
_OFFSET_DELTAS: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 1), dtype=np.uint8), np.zeros(0, dtype=np.int64))
# The empty byte string as an Arrow scalar, for the separators and fills of
# the compute functions: a Python b"" is turned into one by pyarrow.scalar,
# which imports pandas (when installed) on its first call.
_NOTHING = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, dtype=np.int32)), pa.py_buffer(b"")])[0]


class _Damaged(Exception):
    """Raised inside the vectorised decoder; the caller finds the precise error."""


@attrs.frozen
class FetchedColumns:
    """What one partition's fetched records section gives a columnar consumer."""

    columns: pa.RecordBatch  # visible records at or after the fetch offset, in FETCHED_SCHEMA
    end: int  # where the next fetch starts: after the last whole batch (the fetch offset at least)
    partial: PartialBatch | None  # the cut-off batch after the whole ones, if any


@attrs.frozen
class _KeptBatch:
    header: records.BatchHeader
    position: int  # of the batch in the fetched section
    start: int  # of its records in the buffer they are read from: the fetched bytes, or the joined (decompressed) sections
    end: int


# ---------------------------------------------------------------------------
# decoding


def decode_fetched(data, aborted_transactions: list[dict] | None = None, *, read_committed: bool = True, start_offset: int = 0) -> FetchedColumns:
    """The visible records of one partition's answer to a Fetch at
    ``start_offset``, as columns (see the module doc).

    ``aborted_transactions`` is the response's list of ``{"producer_id",
    "first_offset"}``. Only the whole batches count; the partial one after
    them, if any, is returned for the caller to fetch again (or to report
    as too large when nothing came whole). Each batch's CRC is checked once.
    """
    whole_end, partial = split_partial_tail(data)
    view = memoryview(data)[:whole_end]
    end = start_offset
    heap = [(entry["first_offset"], entry["producer_id"]) for entry in (aborted_transactions or [])] if read_committed else []
    heapq.heapify(heap)
    aborted_producers: set[int] = set()
    sections: list = []
    kept: list[_KeptBatch] = []
    joined_size = 0
    for position, header in iter_batches(view):
        end = max(end, header.next_offset)
        while heap and heap[0][0] <= header.last_offset:
            aborted_producers.add(heapq.heappop(heap)[1])
        if header.is_control:
            if read_committed:
                batch = decode_batch(view, position, verify_crc=False)
                if batch.records and decode_control_record(batch.records[0]).type == ControlType.ABORT:
                    aborted_producers.discard(header.producer_id)
            continue
        if read_committed and header.is_transactional and header.producer_id in aborted_producers:
            continue
        body = view[position + BATCH_HEADER_SIZE : position + header.size]
        if header.compression:  # errors as records.decode_batch raises them
            try:
                codec = codec_from_id(header.compression)
            except Exception as exc:
                raise CorruptRecordError(str(exc), offset=header.base_offset, position=position) from None
            try:
                body = decompress(codec, body)
            except ValueError as exc:
                raise CorruptRecordError(str(exc), offset=header.base_offset, position=position) from None
        sections.append(body)
        kept.append(_KeptBatch(header, position, joined_size, joined_size + len(body)))
        joined_size += len(body)
    if not kept:
        return FetchedColumns(_empty_columns(), end, partial)
    if any(batch.header.compression for batch in kept):
        sections.append(bytes(_PADDING))
        buf, limit = b"".join(sections), joined_size
    else:  # the records are read where they came, in the fetched bytes: no copy
        buf, limit = view, whole_end
        kept = [_KeptBatch(batch.header, batch.position, batch.position + BATCH_HEADER_SIZE, batch.position + batch.header.size) for batch in kept]
    try:
        columns = _decode_columns(buf, kept, start_offset, limit)
    except (_Damaged, IndexError):  # (a damaged record can send a read past the fetched bytes)
        _raise_precise_error(view, kept)
    return FetchedColumns(columns, end, partial)


def _raise_precise_error(view, kept: list[_KeptBatch]):
    for batch in kept:
        decode_batch(view, batch.position, verify_crc=False)  # raises CorruptRecordError saying where
    first = kept[0].header
    raise CorruptRecordError("records do not decode", offset=first.base_offset, position=kept[0].position)


def _empty_columns() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.nulls(0, field.type) for field in FETCHED_SCHEMA], schema=FETCHED_SCHEMA)


def _record_starts(buf: bytes, bytes_view: np.ndarray, kept: list[_KeptBatch], scanned: frozenset = frozenset()) -> tuple[np.ndarray, np.ndarray]:
    """Where each record (its length varint) starts, and which batches'
    starts are guesses (``_guessed_starts``) the caller must confirm.

    The one sequential step: a record's length varint says where the next
    record starts. A batch whose records differ in size only where the
    offset delta's varint grows (values of one size) has its starts
    guessed, all batches at once; the others (and those in ``scanned``,
    whose guess the caller refuted) are scanned: runs of records of equal
    size (a size changes where the offset delta's varint grows a byte, at 64
    and 8192 records into a batch, or where keys or values change size) are
    found by numpy (``_run_starts``), and what is not in a run by a loop
    that stores positions only; the lengths are read again, all at once, by
    the caller."""
    starts, guessed = _guessed_starts(buf, kept)
    if scanned:
        guessed[list(scanned)] = False
    first = 0
    for index, batch in enumerate(kept):
        count = batch.header.record_count
        if not guessed[index]:
            starts[first : first + count] = _scanned_starts(buf, bytes_view, batch)
        first += count
    return starts, guessed


def _guessed_starts(buf: bytes, kept: list[_KeptBatch]) -> tuple[np.ndarray, np.ndarray]:
    """Each batch's record starts if its records are those of the first
    made bigger only by the offset delta (record k's is k, whose varint
    grows at 64, 8192, ...) and so by their length varint, and which
    batches' sizes agree with that guess (the others' starts are left for
    ``_scanned_starts``). A guess is confirmed only when the lengths read
    at the guessed starts lead from each record to the next and the last
    to the batch's end (``_refuted``)."""
    counts = np.array([batch.header.record_count for batch in kept], dtype=np.int64)
    first_length = np.zeros(len(kept), dtype=np.int64)
    for index, batch in enumerate(kept):
        if batch.header.record_count:
            try:
                first_length[index] = read_varint(buf, batch.start)[0]
            except (IndexError, ValueError):
                pass
    first_length[first_length < 1] = -(1 << 40)  # no record is that short: no guess fits the batch
    index_in_batch = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    length = np.repeat(first_length, counts) + _varint_widths(2 * index_in_batch) - 1
    size = length + _varint_widths(2 * length)
    ends = np.concatenate([[0], np.cumsum(size)])  # of each record, counted from the first batch's start as if batches were end to end
    batch_begins, batch_ends = ends[np.cumsum(counts) - counts], ends[np.cumsum(counts)]
    guessed = (batch_ends - batch_begins == np.array([batch.end - batch.start for batch in kept], dtype=np.int64)) & (counts > 0)
    before = np.repeat(batch_begins, counts)
    starts = np.repeat(np.array([batch.start for batch in kept], dtype=np.int64), counts) + ends[:-1] - before
    return starts, guessed


def _varint_widths(unsigned: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each (non-negative) value."""
    widths = np.ones(len(unsigned), dtype=np.int64)
    for bits in range(7, 63, 7):
        over = unsigned >= (1 << bits)
        if not over.any():
            break
        widths += over
    return widths


def _refuted(record_start: np.ndarray, record_end: np.ndarray, kept: list[_KeptBatch], guessed: np.ndarray) -> frozenset:
    """The batches whose records do not lead from one to the next and the
    last to the batch's end, as ``_scanned_starts`` would have found them
    (only a guessed batch can: a scanned one is damaged)."""
    if len(record_start) == 0:
        return frozenset()
    counts = np.array([batch.header.record_count for batch in kept], dtype=np.int64)
    following = np.empty(len(record_start), dtype=np.int64)
    following[:-1] = record_start[1:]
    lasts = np.cumsum(counts)[counts > 0] - 1
    following[lasts] = np.array([batch.end for batch in kept], dtype=np.int64)[counts > 0]
    wrong = np.flatnonzero(record_end != following)
    if len(wrong) == 0:
        return frozenset()
    batches = np.unique(np.repeat(np.arange(len(kept)), counts)[wrong])
    if not guessed[batches].all():
        raise _Damaged
    return frozenset(batches.tolist())


def _scanned_starts(buf: bytes, bytes_view: np.ndarray, batch: _KeptBatch) -> np.ndarray:
    """One batch's record starts, found record after record (and run after run)."""
    parts: list[np.ndarray] = []
    starts = array("q")
    cursor = batch.start
    left = batch.header.record_count
    try:
        while left:
            run = _run_starts(buf, bytes_view, cursor, left, batch.end) if left >= _RUN_MIN_RECORDS else None
            if run is not None:
                if starts:
                    parts.append(np.frombuffer(starts, dtype=np.int64))
                    starts = array("q")
                parts.append(run[0])
                cursor = run[1]
                left -= len(run[0])
                continue
            cursor = _scan_starts(buf, cursor, min(left, _LOOP_RECORDS), starts.append)
            left -= min(left, _LOOP_RECORDS)
    except (IndexError, ValueError):
        raise _Damaged from None
    if cursor != batch.end:
        raise _Damaged
    if starts:
        parts.append(np.frombuffer(starts, dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _scan_starts(buf: bytes, cursor: int, count: int, add) -> int:
    """``add`` the starts of ``count`` records from ``cursor``; where the next begins."""
    for _ in range(count):
        add(cursor)
        byte = buf[cursor]
        if byte < 0x80:  # lengths below 64
            cursor += 1 + ((byte >> 1) ^ -(byte & 1))
            continue
        second = buf[cursor + 1]
        if second < 0x80:  # below 8192
            raw = (byte & 0x7F) | (second << 7)
            cursor += 2 + ((raw >> 1) ^ -(raw & 1))
        else:
            length, after = read_varint(buf, cursor)
            cursor = after + length
    return cursor


def _run_starts(buf: bytes, bytes_view: np.ndarray, cursor: int, left: int, end: int):
    """(starts, where the next record begins) of the records from ``cursor``
    on that have the same length varint as the first (so the same size),
    at most ``left`` of them and none past ``end``; None when fewer than
    ``_RUN_MIN_RECORDS`` do.

    Exact: candidate k is a record start if candidates 0..k-1 were records
    of that size, so the run is the candidates up to the first whose length
    varint differs. Candidates are checked in windows growing fourfold, so a
    short run costs little more than its own records."""
    length, body = read_varint(buf, cursor)
    prefix = body - cursor
    stride = prefix + length
    if length < 0 or stride <= 0:
        return None
    most = min(left, (end - cursor) // stride)
    if most < _RUN_MIN_RECORDS or buf[cursor + stride : cursor + stride + prefix] != buf[cursor:body]:
        return None
    found = 0
    window = _RUN_MIN_RECORDS * 4
    while found < most:
        candidates = cursor + stride * np.arange(found, min(most, found + window), dtype=np.int64)
        same = bytes_view[candidates] == buf[cursor]
        for k in range(1, prefix):
            same &= bytes_view[candidates + k] == buf[cursor + k]
        if not same.all():
            found += int(np.argmin(same))
            break
        found += len(candidates)
        window *= 4
    if found < _RUN_MIN_RECORDS:
        return None
    return cursor + stride * np.arange(found, dtype=np.int64), cursor + stride * found


def _read_varints(bytes_view: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Zigzag varints at every position at once: (values as int64, positions
    after them, which ones carry bits past 64 or None when none does).

    Values are exact modulo 2**64, so a sum with a base offset or timestamp
    lands where ``records.read_varint``'s unbounded integers land whenever
    that is an int64; a length with bits past 64 is never valid. Each
    further byte is read for the varints that go on: for all of them at once
    (masked) while most do, as a record length or a value length of 100
    bytes does, by index when few do."""
    byte = bytes_view[positions]
    raw = (byte & 0x7F).astype(np.uint64)
    following = positions + 1
    going_on = byte >= 0x80
    count = int(np.count_nonzero(going_on))
    top_bit = None  # bit 64 of the raw varint: bit 63 of the value
    too_wide = None
    shift = 7
    while count:
        if shift > 63:
            raise _Damaged  # longer than 10 bytes
        if 4 * count >= len(positions):
            byte = bytes_view[following * going_on] * going_on  # 0 for the varints that ended (read at 0: theirs may end the buffer)
            raw |= (byte & 0x7F).astype(np.uint64) << np.uint64(shift)
            following += going_on
        else:
            active = np.flatnonzero(going_on)
            byte = np.zeros(len(positions), dtype=np.uint8)
            byte[active] = bytes_view[following[active]]
            raw[active] |= (byte[active] & 0x7F).astype(np.uint64) << np.uint64(shift)
            following[active] += 1
        if shift == 63:
            top_bit = ((byte >> 1) & 1).astype(np.uint64)
            too_wide = (byte & 0x7E) != 0
        going_on = byte >= 0x80
        count = int(np.count_nonzero(going_on))
        shift += 7
    unsigned = raw >> np.uint64(1)
    if top_bit is not None:
        unsigned |= top_bit << np.uint64(63)
    values = unsigned.view(np.int64) ^ -(raw & np.uint64(1)).view(np.int64)
    return values, following, too_wide


def _decode_columns(buf, kept: list[_KeptBatch], start_offset: int, limit: int) -> pa.RecordBatch:
    """The columns of the ``kept`` batches' records, which lie in ``buf``
    (up to ``limit``) where ``kept`` says."""
    bytes_view = np.frombuffer(buf, dtype=np.uint8)

    record_start, guessed = _record_starts(buf, bytes_view, kept)
    try:
        length, body, too_wide = _read_varints(bytes_view, record_start)
        record_end = body + length
        refuted = _refuted(record_start, record_end, kept, guessed) if guessed.any() else frozenset()
    except (_Damaged, IndexError):
        if not guessed.any():
            raise _Damaged from None
        # A wrong guess can put a start inside a value, where the bytes
        # need not be a varint at all (a run of bytes >= 0x80 is "longer
        # than 10 bytes"): scan every guessed batch instead.
        refuted = frozenset(np.flatnonzero(guessed).tolist())
    if refuted:
        record_start, guessed = _record_starts(buf, bytes_view, kept, refuted)
        length, body, too_wide = _read_varints(bytes_view, record_start)
        record_end = body + length
    _check((length < 1) | (record_end > limit))  # at least the attributes byte
    if too_wide is not None:
        _check(too_wide)
    runs = _uniform_runs(buf, bytes_view, record_start, record_end)
    counts = np.array([batch.header.record_count for batch in kept], dtype=np.int64)
    outside = _outside_runs(runs, len(record_start))
    outside_fields = _fields_by_varints(bytes_view, body[outside], record_end[outside]) if len(outside) or not runs else None
    if _one_length_each(runs, outside_fields):
        return _uniform_columns(bytes_view, runs, outside, outside_fields, kept, counts, start_offset)
    timestamp_delta, offset_delta, key_start, key_length, value_start, value_length, header_count, headers_start = _record_fields(
        runs, outside, outside_fields, len(record_start)
    )
    without_headers = header_count == 0
    offset, timestamp, timestamp_type = _offsets_and_timestamps(kept, counts, offset_delta, timestamp_delta)

    header_entries = None
    if not without_headers.all():
        header_entries = _header_positions(buf, headers_start, record_end, header_count)

    visible = offset >= start_offset
    if not visible.all():
        header_count = header_count[visible]
        if header_entries is not None:
            header_entries = _keep_entries(header_entries, visible)
        offset, timestamp, timestamp_type = offset[visible], timestamp[visible], timestamp_type[visible]
        key_start, key_length = key_start[visible], key_length[visible]
        value_start, value_length = value_start[visible], value_length[visible]

    data = pa.py_buffer(buf)
    key = _binary_column(data, key_start, key_length, pa.binary())
    value = _binary_column(data, value_start, value_length, pa.binary())
    headers = _headers_column(data, header_count, header_entries)
    return pa.RecordBatch.from_arrays(
        [key, value, _numpy_array(offset, np.int64), _numpy_array(timestamp, np.int64), _numpy_array(timestamp_type, np.int32), headers],
        schema=FETCHED_SCHEMA,
    )


def _check(bad: np.ndarray) -> None:
    if bad.any():
        raise _Damaged


# A run of at least this many records laid out alike is read as a byte matrix.
_MATRIX_MIN_RECORDS = 32


@attrs.frozen
class _UniformRun:
    """Records one after another laid out alike (``_uniform_runs``): a byte
    matrix of one row per record, whose fields are its columns."""

    first: int  # the index of its first record
    count: int
    start: int  # where its first record starts in the buffer
    layout: "_Layout"
    timestamp_delta: np.ndarray
    offset_delta: np.ndarray

    def rows(self, bytes_view: np.ndarray) -> np.ndarray:
        stride = self.layout.stride
        return bytes_view[self.start : self.start + stride * self.count].reshape(self.count, stride)

    def fields(self) -> list[np.ndarray]:
        """As ``_record_fields`` gives them."""
        layout = self.layout
        row = self.start + layout.stride * np.arange(self.count, dtype=np.int64)
        return [
            self.timestamp_delta,
            self.offset_delta,
            row + layout.key_at,
            np.full(self.count, layout.key_length, dtype=np.int64),
            row + layout.value_at,
            np.full(self.count, layout.value_length, dtype=np.int64),
            np.zeros(self.count, dtype=np.int64),
            row + layout.stride,
        ]


@attrs.frozen
class _Layout:
    """Where each field of a record lies, relative to its start, for records
    whose varints all have the same widths and whose key and value lengths
    (and header count, zero) are the same bytes: one record's, read by
    ``_layout_of``."""

    stride: int
    length_bytes: int
    timestamp_at: int
    timestamp_width: int
    offset_at: int
    offset_width: int
    key_length_at: int
    key_at: int
    key_length: int
    value_length_at: int
    value_at: int
    value_length: int


def _layout_of(buf, start: int, stride: int) -> _Layout | None:
    """The layout of the record at ``start``, or None if it does not decode
    whole to exactly ``stride`` bytes with no headers and varints of at most
    9 bytes (such records are read varint by varint, which finds any damage)."""
    try:
        _length, at = read_varint(buf, start)
        timestamp_at = at + 1  # after the attributes byte
        _delta, offset_at = read_varint(buf, timestamp_at)
        _delta, key_length_at = read_varint(buf, offset_at)
        key_length, key_at = read_varint(buf, key_length_at)
        value_length_at = key_at + max(key_length, 0)
        value_length, value_at = read_varint(buf, value_length_at)
        header_count, end = read_varint(buf, value_at + max(value_length, 0))
    except (IndexError, ValueError):
        return None
    timestamp_width, offset_width = offset_at - timestamp_at, key_length_at - offset_at
    if header_count != 0 or end - start != stride or key_length < -1 or value_length < -1 or max(timestamp_width, offset_width) > 9:
        return None
    return _Layout(
        stride, at - start, timestamp_at - start, timestamp_width, offset_at - start, offset_width,
        key_length_at - start, key_at - start, key_length, value_length_at - start, value_at - start, value_length,
    )


def _uniform_runs(buf, bytes_view: np.ndarray, record_start: np.ndarray, record_end: np.ndarray) -> list[_UniformRun]:
    """The runs of records laid out alike, in order. Records of one size one
    after another often are (fixed-size values from one producer: the size
    changes where the offset or timestamp delta's varint grows a byte, so a
    batch is two or three runs). Stretches of at least
    ``_MATRIX_MIN_RECORDS`` records of one size are candidates; those of
    one size are checked together against the first one's layout
    (``_laid_out_as``: a few numpy operations for all of them, however many
    batches they come from), and none of a size is a run if one record of
    that size is laid out otherwise."""
    size = record_end - record_start
    alike = (size[1:] == size[:-1]) & (record_start[1:] == record_end[:-1])
    boundaries = np.flatnonzero(~alike) + 1
    firsts = np.concatenate([[0], boundaries])
    counts = np.concatenate([boundaries, [len(record_start)]]) - firsts
    long_enough = counts >= _MATRIX_MIN_RECORDS
    firsts, counts = firsts[long_enough], counts[long_enough]
    runs = []
    strides = size[firsts]
    for stride in np.unique(strides).tolist():
        of_stride = strides == stride
        group_firsts, group_counts = firsts[of_stride], counts[of_stride]
        layout = _layout_of(buf, int(record_start[group_firsts[0]]), stride)
        if layout is None:
            continue
        index = np.repeat(group_firsts - np.cumsum(group_counts) + group_counts, group_counts) + np.arange(int(group_counts.sum()))
        deltas = _laid_out_as(bytes_view, record_start[index], layout)
        if deltas is None:
            continue
        ends = np.cumsum(group_counts).tolist()
        for first, count, end in zip(group_firsts.tolist(), group_counts.tolist(), ends):
            runs.append(_UniformRun(first, count, int(record_start[first]), layout, deltas[0][end - count : end], deltas[1][end - count : end]))
    runs.sort(key=lambda run: run.first)
    return runs


def _laid_out_as(bytes_view: np.ndarray, starts: np.ndarray, layout: _Layout) -> tuple[np.ndarray, np.ndarray] | None:
    """The timestamp and offset deltas of the records at ``starts`` if every
    one is laid out as ``layout`` says (the first is: ``_layout_of`` read
    it), else None. Each byte that is checked or read is gathered once for
    all the records, as a column of its own (a 2-D gather of the bytes
    before the value, or a 2-D comparison with a broadcast row, is several
    times slower)."""

    def column(at: int) -> np.ndarray:
        return bytes_view.take(starts + at)

    for at in [*range(layout.length_bytes), *range(layout.key_length_at, layout.key_at), *range(layout.value_length_at, layout.value_at)]:
        values = column(at)
        if values.min() != values.max():
            return None
    if column(layout.stride - 1).max() != 0:  # the header count: zero, as the first's
        return None
    deltas = []
    for at, width in ((layout.timestamp_at, layout.timestamp_width), (layout.offset_at, layout.offset_width)):
        varint_bytes = [column(at + k) for k in range(width)]
        if any(byte.min() < 0x80 for byte in varint_bytes[:-1]) or varint_bytes[-1].max() >= 0x80:
            return None
        raw = (varint_bytes[0] & 0x7F).astype(np.int64)
        for k in range(1, width):  # at most 9 bytes: 63 bits, an int64 never negative
            raw |= (varint_bytes[k] & 0x7F).astype(np.int64) << (7 * k)
        deltas.append((raw >> 1) ^ -(raw & 1))
    return deltas[0], deltas[1]


def _outside_runs(runs: list[_UniformRun], count: int) -> np.ndarray:
    """The indices of the records in none of the ``runs``."""
    outside = np.ones(count, dtype=bool)
    for run in runs:
        outside[run.first : run.first + run.count] = False
    return np.flatnonzero(outside)


def _one_length_each(runs: list[_UniformRun], outside_fields: list[np.ndarray] | None) -> bool:
    """Whether every key has one length and every value one length (-1: all
    null) and no record has headers: the ``runs``' records (their layouts
    say so) and those outside them (``outside_fields``, read varint by
    varint: a batch too short for a run, the few records after a run)."""
    lengths = {(run.layout.key_length, run.layout.value_length) for run in runs}
    if len(lengths) != 1:
        return False
    if outside_fields is None:
        return True
    key_length, value_length = lengths.pop()
    _timestamp_delta, _offset_delta, _key_start, outside_key_length, _value_start, outside_value_length, header_count, _headers_start = outside_fields
    return bool((outside_key_length == key_length).all() and (outside_value_length == value_length).all() and not header_count.any())


def _record_fields(runs: list[_UniformRun], outside: np.ndarray, outside_fields: list[np.ndarray] | None, count: int) -> list[np.ndarray]:
    """Every record's fields after its length: timestamp delta, offset
    delta, key start and length, value start and length, header count and
    where the headers start; those of the ``runs`` from their matrices, of
    the records ``outside`` them from ``outside_fields`` (read varint by
    varint, ``_fields_by_varints``)."""
    if not runs:
        return outside_fields
    fields = [np.empty(count, dtype=np.int64) for _ in range(8)]
    for run in runs:
        for column, values in zip(fields, run.fields()):
            column[run.first : run.first + run.count] = values
    if len(outside):
        for column, values in zip(fields, outside_fields):
            column[outside] = values
    return fields


def _offsets_and_timestamps(kept: list[_KeptBatch], counts: np.ndarray, offset_delta: np.ndarray, timestamp_delta: np.ndarray):
    """Each record's offset, timestamp and timestamp type (a LogAppendTime
    batch's max timestamp for all its records)."""
    base_offset = np.repeat(np.array([batch.header.base_offset for batch in kept], dtype=np.int64), counts)
    log_append = np.array([batch.header.timestamp_type == TimestampType.LOG_APPEND_TIME for batch in kept])
    base_timestamp = np.array([batch.header.base_timestamp for batch in kept], dtype=np.int64)
    max_timestamp = np.array([batch.header.max_timestamp for batch in kept], dtype=np.int64)
    timestamp = np.where(np.repeat(log_append, counts), np.repeat(max_timestamp, counts), np.repeat(base_timestamp, counts) + timestamp_delta)
    return base_offset + offset_delta, timestamp, np.repeat(log_append.astype(np.int32), counts)


def _uniform_columns(
    bytes_view: np.ndarray, runs: list[_UniformRun], outside: np.ndarray, outside_fields: list[np.ndarray] | None,
    kept: list[_KeptBatch], counts: np.ndarray, start_offset: int,
) -> pa.RecordBatch:
    """The columns when every key and value has one length and no record
    has headers (``_one_length_each``): each binary column is one buffer
    filled by one copy of a matrix's columns per run, no record positions
    for those, and one gather for the few records ``outside`` the runs."""
    count = sum(run.count for run in runs) + len(outside)
    if len(outside):
        timestamp_delta, offset_delta = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
        for run in runs:
            timestamp_delta[run.first : run.first + run.count] = run.timestamp_delta
            offset_delta[run.first : run.first + run.count] = run.offset_delta
        timestamp_delta[outside], offset_delta[outside] = outside_fields[0], outside_fields[1]
        key_starts, value_starts = outside_fields[2], outside_fields[4]
    else:
        timestamp_delta = np.concatenate([run.timestamp_delta for run in runs])
        offset_delta = np.concatenate([run.offset_delta for run in runs])
        key_starts = value_starts = outside
    offset, timestamp, timestamp_type = _offsets_and_timestamps(kept, counts, offset_delta, timestamp_delta)
    key = _fixed_length_column(bytes_view, runs, [run.layout.key_at for run in runs], outside, key_starts, runs[0].layout.key_length, count)
    value = _fixed_length_column(bytes_view, runs, [run.layout.value_at for run in runs], outside, value_starts, runs[0].layout.value_length, count)
    list_offsets = pa.py_buffer(np.zeros(count + 1, dtype=np.int32))
    headers = pa.ListArray.from_buffers(HEADERS_TYPE, count, [None, list_offsets], children=[pa.StructArray.from_arrays([pa.nulls(0, pa.string()), pa.nulls(0, pa.binary())], fields=list(HEADER_STRUCT_TYPE))])
    columns = pa.RecordBatch.from_arrays(
        [key, value, _numpy_array(offset, np.int64), _numpy_array(timestamp, np.int64), _numpy_array(timestamp_type, np.int32), headers],
        schema=FETCHED_SCHEMA,
    )
    visible = offset >= start_offset
    return columns if visible.all() else columns.filter(pa.array(visible))


def _fixed_length_column(
    bytes_view: np.ndarray, runs: list[_UniformRun], positions: list[int], outside: np.ndarray, outside_starts: np.ndarray, length: int, count: int
) -> pa.Array:
    """Values of ``length`` bytes (-1: nulls): at ``positions[i]`` of every
    row of ``runs[i]``, and at ``outside_starts`` for the records ``outside``
    the runs."""
    if length < 0:
        return pa.nulls(count, pa.binary())
    if count * length > _INT32_MAX:
        raise ValueError(f"{count * length} bytes of one column in one fetch do not fit an Arrow binary column (2 GiB); fetch less at a time")
    values = np.empty(count * length, dtype=np.uint8)
    if length:
        # Each value copied as one numpy void value (a memcpy of its bytes;
        # a 2-D copy of uint8 columns goes byte by byte).
        laid_end_to_end = values.view(f"V{length}")
        for run, at in zip(runs, positions):
            laid_end_to_end[run.first : run.first + run.count] = _as_void(run.rows(bytes_view)[:, at : at + length])
        if len(outside):
            # every ``length`` bytes from each position of the buffer, as a
            # view: the rows at the outside records' starts are their values
            windows = np.lib.stride_tricks.as_strided(bytes_view, shape=(len(bytes_view) - length + 1, length), strides=(1, 1), writeable=False)
            values.reshape(count, length)[outside] = windows[outside_starts]
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(length)
    return pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def _fields_by_varints(bytes_view: np.ndarray, body: np.ndarray, record_end: np.ndarray) -> list[np.ndarray]:
    """``_record_fields`` read varint by varint (each for all the records at once), checked."""

    def length_at(positions: np.ndarray, smallest: int) -> tuple[np.ndarray, np.ndarray]:
        values, following, too_wide = _read_varints(bytes_view, positions)
        _check((values < smallest) | (values > record_end - following))
        if too_wide is not None:
            _check(too_wide)
        return values, following

    timestamp_delta, cursor, _ = _read_varints(bytes_view, body + 1)
    offset_delta, cursor, _ = _read_varints(bytes_view, cursor)
    _check(cursor > record_end)
    key_length, key_start = length_at(cursor, -1)
    value_length, value_start = length_at(key_start + np.maximum(key_length, 0), -1)
    header_count, headers_start = length_at(value_start + np.maximum(value_length, 0), 0)
    _check((header_count == 0) & (headers_start != record_end))
    return [timestamp_delta, offset_delta, key_start, key_length, value_start, value_length, header_count, headers_start]


def _header_positions(buf: bytes, headers_start: np.ndarray, record_end: np.ndarray, header_count: np.ndarray):
    """(record index, key start, key length, value start, value length) of every
    header: a loop over the records that have headers (few, usually)."""
    owners, key_starts, key_lengths, value_starts, value_lengths = (array("q") for _ in range(5))
    try:
        for index in np.flatnonzero(header_count).tolist():
            cursor = int(headers_start[index])
            end = int(record_end[index])
            for _ in range(int(header_count[index])):
                byte = buf[cursor]
                if byte < 0x80:
                    key_length, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
                else:
                    key_length, cursor = read_varint(buf, cursor)
                if key_length < 0 or cursor + key_length > end:
                    raise _Damaged
                owners.append(index)
                key_starts.append(cursor)
                key_lengths.append(key_length)
                cursor += key_length
                byte = buf[cursor]
                if byte < 0x80:
                    value_length, cursor = (byte >> 1) ^ -(byte & 1), cursor + 1
                else:
                    value_length, cursor = read_varint(buf, cursor)
                if value_length < -1 or cursor + value_length > end:
                    raise _Damaged
                value_starts.append(cursor)
                value_lengths.append(value_length)
                if value_length > 0:
                    cursor += value_length
            if cursor != end:
                raise _Damaged
    except (IndexError, ValueError):
        raise _Damaged from None
    return tuple(np.frombuffer(column, dtype=np.int64) if len(column) else np.zeros(0, np.int64)
                 for column in (owners, key_starts, key_lengths, value_starts, value_lengths))


def _keep_entries(entries, visible: np.ndarray):
    """The header entries of the visible records."""
    keep = visible[entries[0]]
    return tuple(column[keep] for column in entries)


def _binary_column(data: pa.Buffer, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Values cut out of ``data`` at (start, length), a length of -1 being
    null, with no Python object per value: an array whose offsets alternate
    value start, value end (the gaps between values are the odd elements)
    over the whole buffer, of which Arrow takes the even elements."""
    count = len(starts)
    present = lengths >= 0
    if count and not present.any():  # keyless records: nothing to cut out
        return pa.nulls(count, kind)
    ends = starts + np.maximum(lengths, 0)
    bounds = np.empty(2 * count + 1, dtype=np.int64)
    bounds[0:-1:2] = starts
    bounds[1::2] = ends
    bounds[-1] = ends[-1] if count else 0
    if count == 0:
        return pa.nulls(0, kind)
    large = bounds[-1] > _INT32_MAX
    scaffold_type = pa.large_binary() if large else pa.binary()
    scaffold = pa.Array.from_buffers(scaffold_type, 2 * count, [None, pa.py_buffer(bounds if large else bounds.astype(np.int32)), data])
    taken = scaffold.take(_numpy_array(np.arange(0, 2 * count, 2), np.int64))
    if large:
        total = int(np.maximum(lengths, 0).sum())
        if total > _INT32_MAX:
            raise ValueError(f"{total} bytes of one column in one fetch do not fit an Arrow binary column (2 GiB); fetch less at a time")
        taken = taken.cast(pa.binary())
    nulls = count - int(present.sum())
    validity = None if nulls == 0 else pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(kind, count, [validity, taken.buffers()[1], taken.buffers()[2]], null_count=nulls)


def _headers_column(data: pa.Buffer, header_count: np.ndarray, entries) -> pa.Array:
    list_offsets = np.zeros(len(header_count) + 1, dtype=np.int32)
    np.cumsum(header_count, out=list_offsets[1:])
    if entries is None or len(entries[0]) == 0:
        keys = pa.nulls(0, pa.string())
        values = pa.nulls(0, pa.binary())
    else:
        _owners, key_starts, key_lengths, value_starts, value_lengths = entries
        keys = _binary_column(data, key_starts, key_lengths, pa.string())
        try:
            keys.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            raise _Damaged from None
        values = _binary_column(data, value_starts, value_lengths, pa.binary())
    pairs = pa.StructArray.from_arrays([keys, values], fields=list(HEADER_STRUCT_TYPE))
    return pa.ListArray.from_arrays(_numpy_array(list_offsets, np.int32), pairs, type=HEADERS_TYPE)


# ---------------------------------------------------------------------------
# encoding


@attrs.frozen
class EncodedRecords:
    """One partition's records encoded ahead of their batch header: the
    records section (compressed by ``compression``) and what the header
    says of it. ``frame_records`` puts a header in front, so a producer
    encodes once and frames again only what a retry or an epoch bump
    changes (producer id, epoch, sequence). When the section was laid out
    behind room for the header (``batch``: header room and section, one
    buffer), the header is written into that room, in place, and the batch
    is that buffer: no copy of the section per attempt."""

    section: bytes | memoryview
    count: int
    first_timestamp: int
    max_timestamp: int
    compression: Compression = Compression.NONE
    timestamp_type: TimestampType = TimestampType.CREATE_TIME
    batch: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)


def encode_columns(
    *,
    key=None,
    value,
    timestamp,
    headers=None,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    compression: Compression | int = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One batch of one partition's records, given as columns (Arrow arrays
    or anything ``pyarrow.array`` takes): ``value`` binary (nulls are
    tombstones), ``key`` binary or None for all-null keys, ``timestamp`` int64
    ms (or an Arrow timestamp), ``headers`` as ``HEADERS_TYPE`` or None.
    Offsets are consecutive from ``base_offset``. The bytes are those of
    ``records.encode_batch`` for the same ``(key, value, headers, timestamp)``
    records and the same keyword arguments."""
    encoded = encode_records(key=key, value=value, timestamp=timestamp, headers=headers, compression=compression, timestamp_type=timestamp_type)
    return bytes(frame_records(
        encoded, base_offset=base_offset, producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        is_transactional=is_transactional, partition_leader_epoch=partition_leader_epoch,
    ))


def frame_records(
    encoded: EncodedRecords,
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes | memoryview:
    """The batch of ``encoded``'s records: header, CRC (computed once, here),
    section. A view of ``encoded.batch`` when it has one (its header
    rewritten: valid until the next framing of the same records)."""
    attributes_field = encoded.compression | (encoded.timestamp_type << 3)
    if is_transactional:
        attributes_field |= TRANSACTIONAL_MASK
    header = dict(
        base_offset=base_offset, partition_leader_epoch=partition_leader_epoch, attributes=attributes_field,
        last_offset_delta=encoded.count - 1, first_timestamp=encoded.first_timestamp, max_timestamp=encoded.max_timestamp,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence, count=encoded.count,
    )
    if encoded.batch is None:
        return records.frame_batch(encoded.section, **header)
    records.write_batch_header(encoded.batch, **header)
    return memoryview(encoded.batch)


def encode_records(
    *, key=None, value, timestamp, headers=None, compression: Compression | int = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> EncodedRecords:
    """The records section of one batch of one partition's records (the
    columns as ``encode_columns`` takes them), without its header."""
    value = _as_binary(value, "value")
    count = len(value)
    if count == 0:
        raise ValueError("a record batch needs at least one record")
    key = pa.nulls(count, pa.binary()) if key is None else _as_binary(key, "key")
    headers = None if headers is None else _column(headers, HEADERS_TYPE)
    timestamps = _as_timestamps(timestamp)
    if len(key) != count or len(timestamps) != count or (headers is not None and len(headers) != count):
        raise ValueError("the key, value, timestamp and headers columns differ in length")

    first_timestamp = int(timestamps[0])
    max_timestamp = int(timestamps.max())
    key_length = _lengths(key)
    value_length = _lengths(value)
    header_count, header_bytes = _encoded_headers(headers, count)
    timestamp_rows = _varint_rows(timestamps - first_timestamp)
    offset_rows = _offset_delta_rows(count)
    codec = Compression(compression)
    batch = None
    if header_bytes is None:
        batch = _section_by_runs(timestamp_rows, offset_rows, key, key_length, value, value_length)
    if batch is not None:
        section = memoryview(batch)[BATCH_HEADER_SIZE:]
    else:
        section = _section_joined(timestamp_rows, offset_rows, key, key_length, value, value_length, header_count, header_bytes)
    if codec != Compression.NONE:
        section, batch = compress(codec, bytes(section)), None
    return EncodedRecords(section, count, first_timestamp, max_timestamp, codec, TimestampType(timestamp_type), batch)


def _section_joined(timestamp_rows, offset_rows, key: pa.Array, key_length: np.ndarray, value: pa.Array, value_length: np.ndarray,
                    header_count: np.ndarray, header_bytes: pa.Array | None) -> memoryview:
    """The records section of any records: every record's varints as one
    binary value before the key, one before the value and one after it (the
    header count and headers), joined by Arrow."""
    key_rows, value_rows, count_rows = (_varint_rows(values) for values in (key_length, value_length, header_count))
    body_length = (1 + timestamp_rows[1] + offset_rows[1] + key_rows[1] + np.maximum(key_length, 0)
                   + value_rows[1] + np.maximum(value_length, 0) + count_rows[1])
    if header_bytes is not None:
        body_length += _lengths(header_bytes)
    attributes = _varint_rows(np.zeros(len(key_length), dtype=np.int64))  # always 0, and a varint of 0 is the byte 0
    prefix = _varint_binary([_varint_rows(body_length), attributes, timestamp_rows, offset_rows, key_rows])
    middle = _varint_binary([value_rows])
    suffix = _varint_binary([count_rows])
    if header_bytes is not None:
        suffix = pc.binary_join_element_wise(suffix, header_bytes, _NOTHING)
    joined = pc.binary_join_element_wise(prefix, _without_nulls(key), middle, _without_nulls(value), suffix, _NOTHING)
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=len(key_length) + 1, offset=joined.offset * 4)
    return memoryview(joined.buffers()[2])[int(offsets[0]) : int(offsets[-1])]


def _section_by_runs(timestamp_rows, offset_rows, key: pa.Array, key_length: np.ndarray, value: pa.Array, value_length: np.ndarray) -> np.ndarray | None:
    """The records section of records without headers, laid out run by run
    behind ``BATCH_HEADER_SIZE`` bytes of room for the batch's header, or
    None when the records do not come in a few runs of one layout.

    Within a run of records whose key and value lengths are the same and
    whose timestamp and offset deltas take the same bytes (a batch of
    fixed-size values changes only where the offset delta's varint grows,
    at 64 and 8192 records), every record has the same size and the same
    bytes but for its deltas, key and value: records are the rows of one
    byte matrix. The run's first record is written to every row at once
    (``_fill_rows``), but for the fields that differ from record to record,
    copied into their columns, a numpy copy each: the offset delta's
    varints (the timestamp delta's too unless all are equal), and the key
    and value bytes straight from their Arrow buffers (a run's values lie
    end to end there). Null keys and values take no bytes; a column whose
    null slots hold bytes (Arrow allows it) is left to the general path."""
    count = len(key_length)
    key_data, key_starts = _data_and_starts(key, key_length)
    value_data, value_starts = _data_and_starts(value, value_length)
    if key_starts is None or value_starts is None:
        return None
    varying_timestamps = timestamp_rows[0].strides[0] != 0 and count > 1  # not one row repeated
    changes = np.zeros(max(count - 1, 0), dtype=bool)
    for values in (offset_rows[1], key_length, value_length) + ((timestamp_rows[1],) if varying_timestamps else ()):
        changes |= values[1:] != values[:-1]
    bounds = np.concatenate([[0], np.flatnonzero(changes) + 1, [count]]).tolist()
    if len(bounds) - 1 > max(_MOST_RUNS, count // _RECORDS_PER_RUN):
        return None
    runs = []  # (records, the first one's bytes, the copies of what differs: (column, its bytes of every record))
    for first, stop in zip(bounds[:-1], bounds[1:]):
        timestamp_width, offset_width = int(timestamp_rows[1][first]), int(offset_rows[1][first])
        key_bytes, value_bytes = max(int(key_length[first]), 0), max(int(value_length[first]), 0)
        key_length_varint, value_length_varint = bytearray(), bytearray()
        records.write_varint(key_length_varint, int(key_length[first]))
        records.write_varint(value_length_varint, int(value_length[first]))
        head = bytearray()
        # the record's length counts from the attributes byte to the header count (0: no headers) at its end
        records.write_varint(head, 1 + timestamp_width + offset_width + len(key_length_varint) + key_bytes + len(value_length_varint) + value_bytes + 1)
        head.append(0)  # attributes
        deltas_at = len(head)
        head += timestamp_rows[0][first, :timestamp_width].tobytes() + offset_rows[0][first, :offset_width].tobytes() + key_length_varint
        key_at = len(head)
        value_at = key_at + key_bytes + len(value_length_varint)
        template = np.zeros(value_at + value_bytes + 1, dtype=np.uint8)
        template[:key_at] = np.frombuffer(head, dtype=np.uint8)
        template[key_at + key_bytes : value_at] = np.frombuffer(value_length_varint, dtype=np.uint8)
        copies, offsets = [], None
        if stop - first > 1:
            offsets = _OffsetDeltas(deltas_at + timestamp_width, offset_rows[0][first:stop, :offset_width], first)
            if varying_timestamps:
                copies.append((deltas_at, timestamp_rows[0][first:stop, :timestamp_width]))
        for at, size, data, starts in ((key_at, key_bytes, key_data, key_starts), (value_at, value_bytes, value_data, value_starts)):
            if size:
                start = int(starts[first])
                copies.append((at, data[start : start + (stop - first) * size].reshape(stop - first, size)))
        runs.append((stop - first, template, copies, offsets))
    out = np.empty(BATCH_HEADER_SIZE + sum(rows * len(template) for rows, template, _, _ in runs), dtype=np.uint8)
    position = BATCH_HEADER_SIZE
    for rows, template, copies, offsets in runs:
        _fill_rows(out[position : position + rows * len(template)], template, copies, offsets)
        position += rows * len(template)
    return out


@attrs.frozen(eq=False)  # (its bytes are an array: compared by identity)
class _OffsetDeltas:
    """A run's offset-delta varints: where they go in its rows, their bytes
    (a row per record), and the batch index of the run's first record,
    which with the bytes' shape says which they are (record k's is k's)."""

    column: int
    rows: np.ndarray
    first: int


# Stretches of a run's rows that are the same in every batch of the same
# layout and size (template bytes and offset deltas, ``_kept_stretch``),
# kept from one call to the next up to this many bytes in all.
_KEPT_STRETCHES: dict[tuple, np.ndarray] = {}
_KEPT_STRETCHES_MOST_BYTES = 4 << 20


def _fill_rows(section: np.ndarray, template: np.ndarray, copies: list[tuple[int, np.ndarray]], offsets: _OffsetDeltas | None = None) -> None:
    """Lay a run's records out in ``section``: rows of ``len(template)``
    bytes, each the template but for the ``copies`` (a column and the
    bytes of every row there) and the ``offsets`` (none of them overlap).

    Every byte is written once: the template goes only where no copy will
    write (the values are most of each row: filling them twice cost a sixth
    of the encoding). Each field is copied as one numpy void value per row
    (``_as_void``), a memcpy of the field's bytes, where a copy of uint8
    columns goes byte by byte (half the cost of a 2-D copy, for the values
    and for a 2-byte offset delta alike). The template's bytes after the
    last copy (the header count) and those before the first (length,
    attributes, timestamp delta when all are equal) lie end to end from one
    row to the next: they are written as one constant per row boundary.
    The offset deltas are the same in every batch of a size: the stretch of
    template between two copies (or around a row boundary) that holds them
    is kept with them, row by row (``_kept_stretch``), and copied as one
    value per row; where they lie elsewhere (no key, value or timestamp
    copy after them) they are one more copy."""
    stride = len(template)
    rows = len(section) // stride
    matrix = section.reshape(rows, stride)
    spans = sorted((column, column + source.shape[1], source) for column, source in copies)
    if offsets is not None and not (spans and offsets.column + offsets.rows.shape[1] <= spans[-1][0]):
        spans, offsets = sorted(spans + [(offsets.column, offsets.column + offsets.rows.shape[1], offsets.rows)]), None
    if rows == 1 or not spans:
        matrix[:] = template
        for column, end, source in spans:
            matrix[:, column:end] = source
        return
    offsets_end = offsets.column + offsets.rows.shape[1] if offsets is not None else -1
    for (_, end, _), (column, _, _) in zip(spans, spans[1:]):
        if column > end:
            if offsets is not None and end <= offsets.column and offsets_end <= column:
                kept = _kept_stretch(template[end:column], offsets.column - end, offsets, 0)
                _as_void(matrix[:, end:column])[:] = _as_void(kept)
            else:
                _as_void(matrix[:, end:column])[:] = _as_void(template[None, end:column])[0]
    first, last = spans[0][0], spans[-1][1]
    matrix[0, :first] = template[:first]
    matrix[-1, last:] = template[last:]
    # from the end of the last copy in one row to the first copy in the next
    around = section[last : last + (rows - 1) * stride].reshape(rows - 1, stride)[:, : stride - last + first]
    constant = np.concatenate([template[last:], template[:first]])
    if offsets is not None and offsets_end <= first:  # (the first row's offset delta is the template's: the run's first record's)
        _as_void(around)[:] = _as_void(_kept_stretch(constant, stride - last + offsets.column, offsets, 1))
    else:
        _as_void(around)[:] = _as_void(constant[None, :])[0]
    for column, end, source in spans:
        _as_void(matrix[:, column:end])[:] = _as_void(source)


def _kept_stretch(constant: np.ndarray, at: int, offsets: _OffsetDeltas, skip: int) -> np.ndarray:
    """``constant`` (a stretch of a run's template) in every row, with the
    run's offset deltas from its ``skip``-th record on at column ``at``:
    the same in every batch whose run is the same records laid out alike,
    so built once and kept (``_KEPT_STRETCHES``)."""
    identity = (constant.tobytes(), at, offsets.first + skip, offsets.rows.shape, skip)
    kept = _KEPT_STRETCHES.get(identity)
    if kept is None:
        deltas = offsets.rows[skip:]
        kept = np.empty((len(deltas), len(constant)), dtype=np.uint8)
        kept[:] = constant
        kept[:, at : at + deltas.shape[1]] = deltas
        kept.flags.writeable = False
        if kept.nbytes <= _KEPT_STRETCHES_MOST_BYTES:
            # (a list of the values first: another thread's encoder may add one meanwhile)
            if kept.nbytes + sum(stretch.nbytes for stretch in list(_KEPT_STRETCHES.values())) > _KEPT_STRETCHES_MOST_BYTES:
                _KEPT_STRETCHES.clear()
            _KEPT_STRETCHES[identity] = kept
    return kept


def _as_void(columns: np.ndarray) -> np.ndarray:
    """The rows of a 2-D byte array (consecutive bytes in each row) as one
    numpy void value each: a view, so assigning to it writes the rows
    (numpy refuses rows whose bytes are not consecutive)."""
    return columns.view(f"V{columns.shape[1]}")[:, 0]


def _offset_delta_rows(count: int) -> tuple[np.ndarray, np.ndarray]:
    """``_varint_rows`` of the offset deltas 0..count-1: the same for every
    batch of a size, so built once for the largest batch yet and sliced."""
    global _OFFSET_DELTAS
    rows, sizes = _OFFSET_DELTAS
    if len(sizes) < count:
        rows, sizes = _OFFSET_DELTAS = _varint_rows(np.arange(1 << max(count - 1, 1).bit_length(), dtype=np.int64))
    return rows[:count, : int(sizes[count - 1])], sizes[:count]


def _data_and_starts(column: pa.Array, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """A binary column's data buffer as bytes and where each value starts in
    it (``lengths`` as ``_lengths`` gives them); starts None when some null
    slot holds bytes (the values are then not end to end)."""
    buffers = column.buffers()
    data = np.frombuffer(buffers[2], dtype=np.uint8) if len(buffers) > 2 and buffers[2] is not None else np.zeros(0, dtype=np.uint8)
    if buffers[1] is None:  # an array of nulls
        return data, np.zeros(len(column), dtype=np.int64)
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)
    if column.null_count and not np.array_equal(np.diff(offsets), np.maximum(lengths, 0)):
        return data, None
    return data, offsets[:-1].astype(np.int64)


def _numpy_array(values: np.ndarray, dtype) -> pa.Array:
    """A numpy array of numbers as an Arrow array, through its buffer:
    ``pyarrow.array`` would import pandas (when installed) on its first call,
    a second of a streaming app's start-up."""
    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def _column(values, kind: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        return values
    return pa.array(values, kind)


def _as_binary(values, name: str) -> pa.Array:
    column = _column(values, pa.binary())
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), pa.binary())
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        return column.cast(pa.binary())
    raise TypeError(f"the {name} column must be binary (or string), not {column.type}")


def _as_timestamps(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu" and values.ndim == 1:
        return values.astype(np.int64, copy=False)
    column = _column(values, pa.int64())
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms")).cast(pa.int64())
    if column.null_count:
        raise ValueError("the timestamp column has nulls; every record needs its timestamp")
    column = column.cast(pa.int64())
    return np.frombuffer(column.buffers()[1], dtype=np.int64, count=len(column), offset=column.offset * 8)  # (to_numpy would import pandas)


def _lengths(column: pa.Array) -> np.ndarray:
    """Each value's length, -1 for a null (read from the offsets, for a binary column)."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)
    lengths = np.diff(offsets).astype(np.int64)
    if column.null_count:
        lengths[~_present(column)] = -1
    return lengths


def _present(column: pa.Array) -> np.ndarray:
    """Which values are not null, from the validity bitmap (``is_null().to_numpy()`` would import pandas)."""
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[column.offset : column.offset + len(column)].astype(bool)


def _without_nulls(column: pa.Array) -> pa.Array:
    return column.fill_null(_NOTHING) if column.null_count else column


def _zigzag(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64, copy=False)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def _varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's zigzag varint as a row of bytes (padded on the right) and its size."""
    zigzag = _zigzag(values)
    largest = int(zigzag.max()) if len(zigzag) else 0
    if len(zigzag) > 1 and int(zigzag.min()) == largest:  # one value: its row, repeated as a view (no bytes per record)
        row, size = _varint_rows(values[:1])
        return np.broadcast_to(row, (len(zigzag), row.shape[1])), np.broadcast_to(size, len(zigzag))
    if largest < 0x80:  # one byte each: the common case of small counts and deltas
        return zigzag.astype(np.uint8).reshape(-1, 1), np.ones(len(zigzag), dtype=np.int64)
    sizes = np.ones(len(zigzag), dtype=np.int64)
    width = 1
    while width < 10 and largest >= 1 << (7 * width):
        sizes += zigzag >= np.uint64(1 << (7 * width))
        width += 1
    rows = np.empty((len(zigzag), width), dtype=np.uint8)
    for k in range(width):
        group = ((zigzag >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        if k + 1 < width:
            group |= (sizes > k + 1).astype(np.uint8) << 7
        rows[:, k] = group
    return rows, sizes


def _varint_binary(parts: list[tuple[np.ndarray, np.ndarray]]) -> pa.Array:
    """One binary value per record: the varints of ``parts`` (each from
    ``_varint_rows``) one after the other."""
    if all(rows.shape[1] == 1 for rows, _ in parts):  # every varint one byte: no gaps to squeeze out
        data = np.concatenate([rows for rows, _ in parts], axis=1).ravel() if len(parts) > 1 else parts[0][0].ravel()
        row_sizes = np.full(len(parts[0][1]), len(parts), dtype=np.int64)
    else:
        matrix = np.concatenate([rows for rows, _ in parts], axis=1)
        used = np.concatenate([np.arange(rows.shape[1]) < sizes[:, None] for rows, sizes in parts], axis=1)
        data = np.compress(used.ravel(), matrix.ravel())
        row_sizes = sum(sizes for _, sizes in parts)
    offsets = np.zeros(len(row_sizes) + 1, dtype=np.int32)
    np.cumsum(row_sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(row_sizes), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _encoded_headers(headers, count: int) -> tuple[np.ndarray, pa.Array | None]:
    """Each record's header count and its headers' bytes (None when no record has any)."""
    if headers is None:
        return np.zeros(count, dtype=np.int64), None
    column = headers
    header_count = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if not header_count.any():
        return header_count, None
    if column.null_count:
        column = column.fill_null(pa.scalar([], column.type))
    pairs = column.flatten()
    header_key = _as_binary(pc.struct_field(pairs, "key"), "header key")
    if header_key.null_count:
        raise ValueError("a header key is null; Kafka header keys are strings")
    header_value = _as_binary(pc.struct_field(pairs, "value"), "header value")
    key_length = _lengths(header_key)
    value_length = _lengths(header_value)
    entries = pc.binary_join_element_wise(
        _varint_binary([_varint_rows(key_length)]), header_key, _varint_binary([_varint_rows(value_length)]), _without_nulls(header_value), _NOTHING
    )
    list_offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(header_count, out=list_offsets[1:])
    per_record = pa.ListArray.from_arrays(_numpy_array(list_offsets, np.int32), entries)
    return header_count, pc.binary_join(per_record, _NOTHING)
