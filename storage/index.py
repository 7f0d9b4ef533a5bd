"""Sparse segment indexes: ``.index`` (offset -> file position) and
``.timeindex`` (timestamp -> offset), in Kafka's byte layout.

    .index      entries of 8 bytes:  relative_offset int32, position int32
    .timeindex  entries of 12 bytes: timestamp int64, relative_offset int32

Relative offsets are from the segment's base offset. An offset-index entry is
added after at least ``index.interval.bytes`` of log since the previous one;
a time-index entry whenever a batch raises the segment's maximum timestamp.
Entries are kept in memory in typed arrays (4 or 8 bytes a field rather than
a Python int each: about 11x less memory, so a broker holding many small
batches stays small; lookups are binary searches) and appended to the file; the files are never trusted after an unclean shutdown: recovery
rebuilds them from the log, and a torn trailing entry is ignored.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


class _IndexFile:
    entry: struct.Struct

    def __init__(self, path: str, base_offset: int, *, load: bool = True):
        self.path = path
        self.base_offset = base_offset
        self._pending = bytearray()
        data = b""
        self.missing = False  # True when a file to load was not there
        if load:
            try:
                with open(path, "rb") as file:
                    data = file.read()
            except FileNotFoundError:
                self.missing = True
        size = self.entry.size
        whole = len(data) - len(data) % size
        self._load(self.entry.iter_unpack(memoryview(data)[:whole]))
        if whole != len(data) or not load:
            self._rewrite()

    def _load(self, entries) -> None:
        raise NotImplementedError

    def _entries_bytes(self) -> bytes:
        raise NotImplementedError

    def _queue(self, *fields) -> None:
        self._pending += self.entry.pack(*fields)

    def flush(self, fsync: bool = False) -> None:
        if self._pending or fsync:
            with open(self.path, "ab") as file:
                file.write(self._pending)
                file.flush()
                if fsync:
                    os.fsync(file.fileno())
            self._pending.clear()

    def _rewrite(self) -> None:
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(self._entries_bytes())
        os.replace(temporary, self.path)
        self._pending.clear()

    def file_bytes(self) -> bytes:
        self.flush()
        with open(self.path, "rb") as file:
            return file.read()


class OffsetIndex(_IndexFile):
    entry = OFFSET_ENTRY

    def _load(self, entries) -> None:
        self.relative_offsets, self.positions = array("i"), array("i")
        for relative, position in entries:
            self.relative_offsets.append(relative)
            self.positions.append(position)

    def _entries_bytes(self) -> bytes:
        return b"".join(OFFSET_ENTRY.pack(r, p) for r, p in zip(self.relative_offsets, self.positions))

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if self.relative_offsets and relative <= self.relative_offsets[-1]:
            return
        self.relative_offsets.append(relative)
        self.positions.append(position)
        self._queue(relative, position)

    def problem(self, log_size: int) -> str | None:
        """What makes this index unusable for a log of ``log_size`` bytes, or
        None (the checks Kafka makes on the indexes of a clean shutdown)."""
        for relatives, name in ((self.relative_offsets, "offsets"), (self.positions, "positions")):
            if any(b <= a for a, b in zip(relatives, relatives[1:])) or (relatives and relatives[0] < 0):
                return f"{self.path}: {name} are not increasing"
        if self.positions and self.positions[-1] >= log_size:
            return f"{self.path}: last entry points at {self.positions[-1]}, the log has {log_size} bytes"
        return None

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry at or before ``offset``: (offset, position); (base, 0) if none."""
        index = bisect.bisect_right(self.relative_offsets, offset - self.base_offset) - 1
        if index < 0:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[index], self.positions[index]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or after ``position`` (log truncation)."""
        keep = bisect.bisect_left(self.positions, position)
        if keep < len(self.positions):
            del self.positions[keep:]
            del self.relative_offsets[keep:]
            self._rewrite()

    def reset(self) -> None:
        self.relative_offsets, self.positions = array("i"), array("i")
        self._rewrite()


class TimeIndex(_IndexFile):
    entry = TIME_ENTRY

    def _load(self, entries) -> None:
        self.timestamps, self.relative_offsets = array("q"), array("i")
        for timestamp, relative in entries:
            self.timestamps.append(timestamp)
            self.relative_offsets.append(relative)

    def _entries_bytes(self) -> bytes:
        return b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self.timestamps, self.relative_offsets))

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def max_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def problem(self, next_offset: int) -> str | None:
        if any(b <= a for a, b in zip(self.timestamps, self.timestamps[1:])):
            return f"{self.path}: timestamps are not increasing"
        if any(b < a for a, b in zip(self.relative_offsets, self.relative_offsets[1:])) or (self.relative_offsets and self.relative_offsets[0] < 0):
            return f"{self.path}: offsets go backwards"
        if self.relative_offsets and self.base_offset + self.relative_offsets[-1] >= next_offset:
            return f"{self.path}: last entry is past the end of the log"
        return None

    def maybe_append(self, timestamp: int, offset: int) -> None:
        if self.timestamps and timestamp <= self.timestamps[-1]:
            return
        relative = offset - self.base_offset
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative)
        self._queue(timestamp, relative)

    def lookup(self, timestamp: int) -> int:
        """An offset at or before the first batch with max timestamp >= ``timestamp``."""
        index = bisect.bisect_left(self.timestamps, timestamp) - 1
        if index < 0:
            return self.base_offset
        return self.base_offset + self.relative_offsets[index]

    def truncate_to_offset(self, offset: int) -> None:
        keep = bisect.bisect_left(self.relative_offsets, offset - self.base_offset)
        if keep < len(self.relative_offsets):
            del self.timestamps[keep:]
            del self.relative_offsets[keep:]
            self._rewrite()

    def reset(self) -> None:
        self.timestamps, self.relative_offsets = array("q"), array("i")
        self._rewrite()
