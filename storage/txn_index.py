"""The aborted-transaction index (``.txnindex``), one per segment.

Kafka's format, 34 bytes per entry, appended when an ABORT marker lands in
the segment::

    version: int16            0
    producer_id: int64
    first_offset: int64       first offset of the aborted transaction
    last_offset: int64        offset of its ABORT marker
    last_stable_offset: int64 the LSO right after the marker

A read_committed Fetch asks for the aborted transactions that overlap the
range it returns; the consumer drops their records. The file goes through
the segment's ``DiskIO`` (``storage.durable``), as the log does. Recovery
cuts a torn tail entry off and entries past the recovered log end, and the
producer-state replay indexes again an ABORT marker whose entry was lost
(``storage.recovery``).
"""

from __future__ import annotations

import os
import struct

import attrs

from storage.durable import DiskIO, append_file, read_file, replace_file

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
VERSION = 0


@attrs.frozen
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        return ENTRY.pack(VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


def parse_entries(data: bytes) -> list[AbortedTxn]:
    """Every whole entry in ``data`` (a torn trailing entry is ignored)."""
    entries = []
    for position in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, producer_id, first, last, lso = ENTRY.unpack_from(data, position)
        if version != VERSION:
            break
        entries.append(AbortedTxn(producer_id, first, last, lso))
    return entries


class TransactionIndex:
    """The ``.txnindex`` file of one segment, cached in memory."""

    def __init__(self, path: str, *, io: DiskIO | None = None):
        self.path = path
        self.io = DiskIO() if io is None else io
        try:
            data = read_file(path, io=self.io)
        except FileNotFoundError:
            data = b""
        self.entries = parse_entries(data)
        if len(data) != len(self.entries) * ENTRY_SIZE:
            self._rewrite()

    def append(self, entry: AbortedTxn, *, fsync: bool = False) -> None:
        append_file(self.path, entry.to_bytes(), io=self.io, fsync=fsync)
        self.entries.append(entry)

    def overlapping(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """Aborted transactions with data in [start_offset, end_offset)."""
        return [e for e in self.entries if e.last_offset >= start_offset and e.first_offset < end_offset]

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or after ``offset`` (log truncation)."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def replace(self, entries: list[AbortedTxn], *, sync_directory: bool = True) -> None:
        self.entries = list(entries)
        self._rewrite(sync_directory=sync_directory)

    def fsync(self) -> None:
        try:
            fd = self.io.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # no aborted transaction in this segment
        try:
            self.io.fsync(fd)
        finally:
            self.io.close(fd)

    def delete(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        self.entries = []

    def _rewrite(self, *, sync_directory: bool = True) -> None:
        replace_file(self.path, b"".join(e.to_bytes() for e in self.entries), io=self.io, sync_directory=sync_directory)
