"""CRC-32C verification on the storage paths that touch every byte: append
(Kafka checks every batch a producer sends) and recovery (every batch after
the recovery point).

The CRC itself is ``protocol.records``' (hardware CRC-32C when the optional
``crc32c`` package is installed, crcmod otherwise); this module only puts the
check where storage needs it, with protocol's structure checks and error.
"""

from __future__ import annotations

from protocol.records import BatchHeader, CorruptRecordError, compute_crc, read_batch_header


def batch_crc(buf, position: int, header: BatchHeader) -> int:
    return compute_crc(buf, position, header)


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
