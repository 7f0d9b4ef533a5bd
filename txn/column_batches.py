"""Column batches on their way into the producer's queues: which partition
each row goes to, and where the rows of one partition are cut into record
batches. Pure functions over numpy and Arrow arrays (no I/O), used by
``AsyncProducer.send_columns``; the records themselves are encoded by
``protocol.columnar.encode_records``.

- ``murmur2_partitions``: Kafka's default partitioner (murmur2 of the key
  bytes, positive part, modulo the partition count) over a whole key column
  at once: keys are grouped by length, and each group's 4-byte blocks are
  mixed as uint32 columns (numpy's uint32 arithmetic wraps as Java's int
  does). Equal, key for key, to ``protocol.partitioning.murmur2``.
- ``binary_array``, ``int64_array``, ``numpy_array``, ``present_mask``: Arrow arrays built
  from Python lists and numpy arrays through their buffers, and a column's
  validity as numpy. ``pyarrow.array`` (and ``to_numpy``) import pandas,
  when installed, on their first call (they look whether their argument is
  a pandas object): a second of start-up, for a streaming app that never
  uses pandas.
- ``plan_batches``: rows grouped by partition (a stable sort: a partition's
  rows keep their order) and cut into runs whose estimated size stays under
  a byte limit, at least one row each.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyarrow as pa

_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C
RECORD_OVERHEAD = 20  # a record's framing bytes, roughly (varints, attributes), for cutting batches


@attrs.frozen
class PlannedBatch:
    """Rows ``start:stop`` of the (partition-ordered) columns, all for ``partition``."""

    partition: int
    start: int
    stop: int


def binary_offsets(column: pa.Array) -> np.ndarray:
    """The int64 value offsets of a binary (or large binary) column, relative to its first value."""
    width = np.int64 if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype=width, count=len(column) + 1, offset=column.offset * np.dtype(width).itemsize)
    return offsets.astype(np.int64) - int(offsets[0])


def binary_array(values: list) -> pa.Array:
    """A binary column of ``values`` (bytes, or None for a null)."""
    count = len(values)
    validity = None
    if None in values:
        present = np.fromiter((value is not None for value in values), dtype=bool, count=count)
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        values = [b"" if value is None else value for value in values]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=count), out=offsets[1:])
    if offsets[-1] > 2**31 - 1:
        raise ValueError(f"{int(offsets[-1])} bytes do not fit one Arrow binary column (2 GiB)")
    return pa.Array.from_buffers(pa.binary(), count, [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))])


def int64_array(values: list) -> pa.Array:
    """An int64 column of ``values`` (ints, or None for a null)."""
    if None in values:
        present = [value is not None for value in values]
        column = numpy_array(np.array([0 if value is None else value for value in values], dtype=np.int64))
        return pa.Array.from_buffers(pa.int64(), len(values), [pa.py_buffer(np.packbits(present, bitorder="little")), column.buffers()[1]])
    return numpy_array(np.array(values, dtype=np.int64))


def numpy_array(values: np.ndarray) -> pa.Array:
    """A one-dimensional numpy array of fixed-width numbers as an Arrow array (no nulls)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def present_mask(column: pa.Array) -> np.ndarray:
    """Which values of ``column`` are not null, read from its validity bitmap."""
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[column.offset : column.offset + len(column)].astype(bool)


def murmur2_partitions(key: pa.Array, partition_count: int) -> np.ndarray:
    """Each key's partition by Kafka's default partitioner (int32; a null
    key's entry is meaningless: the caller decides those)."""
    count = len(key)
    if count == 0:
        return np.zeros(0, dtype=np.int32)
    offsets = binary_offsets(key)
    data_buffer = key.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    base = _first_value_position(key)
    starts = offsets[:-1] + base
    lengths = np.diff(offsets)
    hashes = np.zeros(count, dtype=np.uint32)
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        length = int(length)
        matrix = data[starts[rows, None] + np.arange(length)] if length else np.zeros((len(rows), 0), dtype=np.uint8)
        hashes[rows] = _murmur2_same_length(matrix, length)
    positive = (hashes & np.uint32(0x7FFFFFFF)).astype(np.int64)
    return (positive % partition_count).astype(np.int32)


def _first_value_position(column: pa.Array) -> int:
    width = 8 if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type) else 4
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64 if width == 8 else np.int32, count=1, offset=column.offset * width)
    return int(offsets[0])


def _murmur2_same_length(matrix: np.ndarray, length: int) -> np.ndarray:
    """murmur2 of every row of ``matrix`` (uint8, ``length`` columns), as uint32."""
    with np.errstate(over="ignore"):
        h = np.full(len(matrix), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
        blocks = length // 4
        if blocks:
            words = np.ascontiguousarray(matrix[:, : blocks * 4]).view("<u4").astype(np.uint32)
            for i in range(blocks):
                k = words[:, i] * _M
                k ^= k >> np.uint32(24)
                k *= _M
                h = (h * _M) ^ k
        tail = blocks * 4
        extra = length % 4
        if extra == 3:
            h ^= matrix[:, tail + 2].astype(np.uint32) << np.uint32(16)
        if extra >= 2:
            h ^= matrix[:, tail + 1].astype(np.uint32) << np.uint32(8)
        if extra >= 1:
            h ^= matrix[:, tail].astype(np.uint32)
            h = h * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return h


def record_sizes(key: pa.Array | None, value: pa.Array, header_bytes: np.ndarray | None) -> np.ndarray:
    """Each row's estimated encoded size (key, value, headers and framing)."""
    sizes = np.diff(binary_offsets(value)) + RECORD_OVERHEAD
    if key is not None:
        sizes += np.diff(binary_offsets(key))
    if header_bytes is not None:
        sizes += header_bytes
    return sizes


def plan_batches(partitions: np.ndarray, sizes: np.ndarray, limit: int) -> list[PlannedBatch]:
    """Cut rows, already ordered by partition, into batches of one partition
    each whose summed ``sizes`` stay within ``limit`` (a row larger than
    ``limit`` makes a batch of its own)."""
    count = len(partitions)
    if count == 0:
        return []
    change = np.flatnonzero(partitions[1:] != partitions[:-1]) + 1
    bounds = np.concatenate([[0], change, [count]])
    cumulative = np.concatenate([[0], np.cumsum(sizes)])
    planned = []
    for first, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        partition = int(partitions[first])
        start = first
        while start < end:
            # the last row whose running size from ``start`` is within the limit
            stop = int(np.searchsorted(cumulative, cumulative[start] + limit, side="right")) - 1
            stop = min(max(stop, start + 1), end)
            planned.append(PlannedBatch(partition, start, stop))
            start = stop
    return planned
