"""Segment files printed the way Kafka's DumpLogSegments prints them (what
``onceflow dump-log`` shows).

Reads ``.log`` files batch by batch (and ``.index``/``.timeindex`` files entry
by entry) straight from disk, without opening the partition log, so it works on
a damaged or live directory. Damage does not crash it: it prints every valid
batch, then one line saying where and why the file stops being valid.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import TextIO

from protocol.compression import Compression
from protocol.records import (
    LOG_OVERHEAD,
    CorruptRecordError,
    decode_batch,
    decode_control_record,
    read_batch_header,
)

_CODEC_NAMES = {codec.value: codec.name.lower() for codec in Compression}
_OFFSET_INDEX_ENTRY = struct.Struct(">ii")
_TIME_INDEX_ENTRY = struct.Struct(">qi")


def _base_offset_from_name(path: str) -> int:
    stem = os.path.basename(path).split(".", 1)[0]
    try:
        return int(stem)
    except ValueError:
        return 0


def dump_log_file(path: str, out: TextIO, *, print_data_log: bool = False) -> bool:
    """Print every batch of ``path``; return False if the file has damage."""
    with open(path, "rb") as file:
        data = file.read()
    out.write(f"Dumping {path}\n")
    out.write(f"Log starting offset: {_base_offset_from_name(path)}\n")
    position = 0
    while position < len(data):
        if not any(data[position : position + 12]) and not data[position:].strip(b"\0"):
            # Zeros written ahead of the data by a broker that stopped
            # before cutting them (storage.segment): the end, no damage.
            out.write(f"Zeros written ahead of the data from position {position} ({len(data) - position} bytes)\n")
            break
        try:
            header = read_batch_header(data, position, verify_crc=False)
        except CorruptRecordError as error:
            out.write(f"Found invalid bytes at position {position}: {error.reason}; {len(data) - position} bytes not read\n")
            return False
        try:
            read_batch_header(data, position)
            valid = True
        except CorruptRecordError:
            valid = False
        out.write(
            f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.record_count} "
            f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
            f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
            f"partitionLeaderEpoch: {header.partition_leader_epoch} isTransactional: {str(header.is_transactional).lower()} "
            f"isControl: {str(header.is_control).lower()} deleteHorizonMs: {header.delete_horizon_ms or 'OptionalLong.empty'} "
            f"position: {position} {'CreateTime' if header.timestamp_type == 0 else 'LogAppendTime'}: {header.max_timestamp} "
            f"size: {header.size} magic: {header.magic} compresscodec: {_CODEC_NAMES.get(header.compression, header.compression)} "
            f"crc: {header.crc} isvalid: {str(valid).lower()}\n"
        )
        if print_data_log and valid:
            _print_records(data, position, header, out)
        if not valid:
            out.write(f"Batch at position {position} fails its CRC check; stopping here\n")
            return False
        position += header.size
    return True


def _print_records(data: bytes, position: int, header, out: TextIO) -> None:
    try:
        batch = decode_batch(data, position)
    except CorruptRecordError as error:
        out.write(f"| records do not decode: {error}\n")
        return
    for record in batch.records:
        line = (
            f"| offset: {record.offset} {'CreateTime' if header.timestamp_type == 0 else 'LogAppendTime'}: "
            f"{record.timestamp} keySize: {-1 if record.key is None else len(record.key)} "
            f"valueSize: {-1 if record.value is None else len(record.value)} "
            f"sequence: {-1 if header.base_sequence < 0 else header.base_sequence + record.offset - header.base_offset} "
            f"headerKeys: [{','.join(h.key for h in record.headers)}]"
        )
        if header.is_control:
            try:
                marker = decode_control_record(record)
                line += f" endTxnMarker: {marker.type.name} coordinatorEpoch: {marker.coordinator_epoch}"
            except CorruptRecordError as error:
                line += f" control record does not decode: {error}"
        else:
            line += f" key: {_show(record.key)} payload: {_show(record.value)}"
        out.write(line + "\n")


def _show(value: bytes | None) -> str:
    if value is None:
        return "null"
    return value.decode("utf-8", errors="backslashreplace")


def dump_index_file(path: str, out: TextIO) -> bool:
    base = _base_offset_from_name(path)
    with open(path, "rb") as file:
        data = file.read()
    out.write(f"Dumping {path}\n")
    if path.endswith(".timeindex"):
        entry, size = _TIME_INDEX_ENTRY, _TIME_INDEX_ENTRY.size
        for position in range(0, len(data) - size + 1, size):
            timestamp, relative = entry.unpack_from(data, position)
            if timestamp == 0 and relative == 0 and position > 0:
                break  # preallocated, unused tail
            out.write(f"timestamp: {timestamp} offset: {base + relative}\n")
    else:
        entry, size = _OFFSET_INDEX_ENTRY, _OFFSET_INDEX_ENTRY.size
        for position in range(0, len(data) - size + 1, size):
            relative, file_position = entry.unpack_from(data, position)
            if relative == 0 and file_position == 0 and position > 0:
                break
            out.write(f"offset: {base + relative} position: {file_position}\n")
    if len(data) % size:
        out.write(f"Index has {len(data) % size} trailing bytes that are not a whole entry\n")
        return False
    return True


def dump(paths: list[str], *, print_data_log: bool = False, out: TextIO | None = None) -> int:
    """Dump each file (to stdout by default); the exit status is 1 if any was damaged or missing."""
    out = out or sys.stdout
    status = 0
    for path in paths:
        try:
            if path.endswith((".index", ".timeindex")):
                ok = dump_index_file(path, out)
            else:
                ok = dump_log_file(path, out, print_data_log=print_data_log)
        except OSError as error:
            out.write(f"Cannot read {path}: {error.strerror}\n")
            ok = False
        status |= 0 if ok else 1
    return status


__all__ = ["dump", "dump_log_file", "dump_index_file", "LOG_OVERHEAD"]
