"""CRC-32C verification on the storage paths that touch every byte: append
(Kafka checks every batch a producer sends) and recovery (every batch after
the recovery point).

``protocol.records`` computes CRC-32C with crcmod's table-driven C code, about
400 MB/s, which by itself keeps appends under half of raw sequential write
speed. When the optional ``crc32c`` package (the CPU's CRC32 instruction,
gigabytes per second) is installed, these paths use it instead; it is the
same polynomial with the same result, and protocol.records stays the one
codec: structure checks and the error raised are its own.
"""

from __future__ import annotations

from protocol.records import ATTRIBUTES_OFFSET, BatchHeader, CorruptRecordError, compute_crc, read_batch_header

try:  # pragma: no cover - depends on the environment
    from crc32c import crc32c as _hardware_crc32c
except ImportError:  # pragma: no cover
    _hardware_crc32c = None


def batch_crc(buf, position: int, header: BatchHeader) -> int:
    if _hardware_crc32c is None:
        return compute_crc(buf, position, header)
    return _hardware_crc32c(memoryview(buf)[position + ATTRIBUTES_OFFSET : position + header.size])


def verify_crc(buf, position: int, header: BatchHeader) -> None:
    actual = batch_crc(buf, position, header)
    if actual != header.crc:
        raise CorruptRecordError(
            "crc mismatch",
            offset=header.base_offset,
            position=position,
            expected_crc=header.crc,
            actual_crc=actual,
        )


def checked_header(buf, position: int = 0) -> BatchHeader:
    """``read_batch_header`` with the CRC check, on the fast CRC when present."""
    header = read_batch_header(buf, position, verify_crc=False)
    verify_crc(buf, position, header)
    return header


def checked_batches(buf) -> list[tuple[int, BatchHeader]]:
    """Every (position, header) of ``buf``; CorruptRecordError at the first bad one."""
    batches = []
    position, end = 0, len(buf)
    while position < end:
        header = read_batch_header(buf, position, verify_crc=False)
        verify_crc(buf, position, header)
        batches.append((position, header))
        position += header.size
    return batches
