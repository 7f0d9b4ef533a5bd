"""Sparse segment indexes: ``.index`` (offset -> file position) and
``.timeindex`` (timestamp -> offset), in Kafka's byte layout.

    .index      entries of 8 bytes:  relative_offset int32, position int32
    .timeindex  entries of 12 bytes: timestamp int64, relative_offset int32

Relative offsets are from the segment's base offset. An offset-index entry is
added after at least ``index.interval.bytes`` of log since the previous one;
a time-index entry whenever a batch raises the segment's maximum timestamp.
Entries are kept in memory in typed arrays (4 or 8 bytes a field rather than
a Python int each: about 11x less memory; lookups are binary searches) and
appended to the file.

An ``IndexBudget`` bounds the entries held in memory by the indexes it
covers: the least recently used index is dropped (its pending entries
written out first) and read back from its file when it is next needed, so
memory does not grow with the data kept. Whoever composes the logs owns the
budget and passes it in: a broker gives one to all its logs; a log opened on
its own gets one of its own. A budget is used from one thread (its broker's
loop), so dropping an index never races with that index's own use.

Every file operation goes through the segment's ``DiskIO``
(``storage.durable``), so injected disk faults and the fsync journal of the
power-cut model (``faults.disk``) see the indexes as they see the log. The
files are never trusted after an unclean shutdown: recovery rebuilds them
from the log, and a torn trailing entry is ignored.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections import OrderedDict

from storage.durable import DiskIO, append_file, empty_file, read_file, replace_file

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


# Index entries a budget holds in memory unless told otherwise (about 8-12
# bytes each). Read when a budget is made, so a test run can lower it for
# every budget (``pytest --index-budget=1``, see tests/conftest.py).
DEFAULT_RESIDENT_ENTRIES = 2_000_000


class IndexBudget:
    """The loaded indexes of one owner (a broker, or a log opened alone),
    least recently used first, and their entry count, kept at or under
    ``max_entries`` (plus the index in use, which is never dropped)."""

    def __init__(self, max_entries: int | None = None):
        self.max_entries = DEFAULT_RESIDENT_ENTRIES if max_entries is None else max_entries
        if self.max_entries < 1:
            raise ValueError(f"an index budget holds at least 1 entry, not {self.max_entries}")
        self._order: OrderedDict[int, _IndexFile] = OrderedDict()
        self.entries = 0

    def __repr__(self) -> str:
        return f"IndexBudget(entries={self.entries}/{self.max_entries}, indexes={len(self._order)})"

    def add(self, index: "_IndexFile") -> None:
        self._order[id(index)] = index
        self.entries += index._count
        self._evict_beyond_budget(keep=index)

    def used(self, index: "_IndexFile") -> None:
        """Mark a loaded index most recently used (every lookup and append:
        kept to one dict operation)."""
        self._order.move_to_end(id(index))

    def grew(self, index: "_IndexFile", count: int) -> None:
        """``count`` entries were added to (or, negative, cut from) a loaded
        index, which is now the most recently used."""
        self.entries += count
        self._order.move_to_end(id(index))
        if self.entries > self.max_entries:
            self._evict_beyond_budget(keep=index)

    def forget(self, index: "_IndexFile") -> None:
        if self._order.pop(id(index), None) is not None:
            self.entries -= index._count

    def held(self) -> list["_IndexFile"]:
        """The loaded indexes, least recently used first."""
        return list(self._order.values())

    def _evict_beyond_budget(self, keep: "_IndexFile") -> None:
        while self.entries > self.max_entries and len(self._order) > 1:
            oldest_id = next(iter(self._order))
            if oldest_id == id(keep):
                self._order.move_to_end(oldest_id)
                oldest_id = next(iter(self._order))
            oldest = self._order.pop(oldest_id)
            self.entries -= oldest._count
            oldest._drop()


class _IndexFile:
    entry: struct.Struct

    def __init__(self, path: str, base_offset: int, *, io: DiskIO | None = None, budget: IndexBudget | None = None, load: bool = True):
        self.path = path
        self.io = DiskIO() if io is None else io
        self.base_offset = base_offset
        self.budget = IndexBudget() if budget is None else budget
        self._pending = bytearray()
        self._loaded = False
        self._count = 0
        data = b""
        self.missing = False  # True when a file to load was not there
        if load:
            try:
                data = read_file(path, io=self.io)
            except FileNotFoundError:
                self.missing = True
        size = self.entry.size
        whole = len(data) - len(data) % size
        self._set_entries(self.entry.iter_unpack(memoryview(data)[:whole]))
        if not load:
            self._start_empty()
        elif whole != len(data):
            self._rewrite()  # cut the torn trailing entry

    def _set_entries(self, entries) -> None:
        self.budget.forget(self)
        self._load(entries)
        self._loaded = True
        self._count = self._loaded_count()
        self.budget.add(self)

    def _ensure_loaded(self) -> None:
        """Read the entries back if the budget dropped them."""
        if self._loaded:
            self.budget.used(self)
            return
        data = read_file(self.path, io=self.io)
        whole = len(data) - len(data) % self.entry.size
        self._set_entries(self.entry.iter_unpack(memoryview(data)[:whole]))

    def _drop(self) -> None:
        # Write out what is pending, creating the file if it has no entries
        # yet, so that reading it back always finds it.
        append_file(self.path, self._pending, io=self.io)
        self._pending.clear()
        self._unload()
        self._loaded = False  # _count stays: the entries are in the file

    def _appended(self) -> None:
        self._count += 1
        self.budget.grew(self, 1)

    def _truncated(self) -> None:
        """Entries were cut: rewrite the file and give the count back."""
        self._rewrite()
        cut = self._count - self._loaded_count()
        self._count -= cut
        self.budget.grew(self, -cut)

    def _load(self, entries) -> None:
        raise NotImplementedError

    def _unload(self) -> None:
        raise NotImplementedError

    def _loaded_count(self) -> int:
        raise NotImplementedError

    def _entries_bytes(self) -> bytes:
        raise NotImplementedError

    def _queue(self, *fields) -> None:
        self._pending += self.entry.pack(*fields)

    def flush(self, fsync: bool = False) -> None:
        if self._pending or fsync:
            append_file(self.path, self._pending, io=self.io, fsync=fsync)
            self._pending.clear()

    def close(self) -> None:
        """Give this index's memory back (its segment is closed or deleted)."""
        self.budget.forget(self)
        self._drop()

    def _rewrite(self) -> None:
        """Replace the file with the entries held (a torn entry or truncated
        entries gone): atomically and durably, as every replaced file
        (``storage.durable``). Recovery only, never on the produce path."""
        self._ensure_loaded()
        replace_file(self.path, self._entries_bytes(), io=self.io)
        self._pending.clear()

    def _start_empty(self) -> None:
        """Empty the file in place for an index about to be rebuilt from its
        log (recovery scans the segment, compaction writes a new one). No
        replace is needed: nothing trusts the index until the rebuilt
        entries are fsynced (``flush(fsync=True)``) and the directory with
        them, and a crash before that rebuilds it again."""
        empty_file(self.path, io=self.io)
        self._pending.clear()


class OffsetIndex(_IndexFile):
    entry = OFFSET_ENTRY

    def _load(self, entries) -> None:
        self._relative_offsets, self._positions = array("i"), array("i")
        for relative, position in entries:
            self._relative_offsets.append(relative)
            self._positions.append(position)

    def _unload(self) -> None:
        self._relative_offsets = self._positions = None

    def _loaded_count(self) -> int:
        return len(self._positions)

    @property
    def relative_offsets(self) -> array:
        self._ensure_loaded()
        return self._relative_offsets

    @property
    def positions(self) -> array:
        self._ensure_loaded()
        return self._positions

    def _entries_bytes(self) -> bytes:
        return b"".join(OFFSET_ENTRY.pack(r, p) for r, p in zip(self.relative_offsets, self.positions))

    def __len__(self) -> int:
        return self._count

    def append(self, offset: int, position: int) -> None:
        # The produce path: the arrays directly (``_appended`` marks the use).
        if not self._loaded:
            self._ensure_loaded()
        relative = offset - self.base_offset
        relative_offsets = self._relative_offsets
        if relative_offsets and relative <= relative_offsets[-1]:
            return
        relative_offsets.append(relative)
        self._positions.append(position)
        self._queue(relative, position)
        self._appended()

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
        relative_offsets = self.relative_offsets
        index = bisect.bisect_right(relative_offsets, offset - self.base_offset) - 1
        if index < 0:
            return self.base_offset, 0
        return self.base_offset + relative_offsets[index], self._positions[index]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or after ``position`` (log truncation)."""
        positions = self.positions
        keep = bisect.bisect_left(positions, position)
        if keep < len(positions):
            del positions[keep:]
            del self._relative_offsets[keep:]
            self._truncated()

    def reset(self) -> None:
        self._set_entries(())
        self._start_empty()


class TimeIndex(_IndexFile):
    entry = TIME_ENTRY

    def _load(self, entries) -> None:
        self._timestamps, self._relative_offsets = array("q"), array("i")
        for timestamp, relative in entries:
            self._timestamps.append(timestamp)
            self._relative_offsets.append(relative)

    def _unload(self) -> None:
        self._timestamps = self._relative_offsets = None

    def _loaded_count(self) -> int:
        return len(self._timestamps)

    @property
    def timestamps(self) -> array:
        self._ensure_loaded()
        return self._timestamps

    @property
    def relative_offsets(self) -> array:
        self._ensure_loaded()
        return self._relative_offsets

    def _entries_bytes(self) -> bytes:
        return b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self.timestamps, self.relative_offsets))

    def __len__(self) -> int:
        return self._count

    @property
    def max_timestamp(self) -> int:
        timestamps = self.timestamps
        return timestamps[-1] if timestamps else -1

    def problem(self, next_offset: int) -> str | None:
        timestamps, relative_offsets = self.timestamps, self.relative_offsets
        if any(b <= a for a, b in zip(timestamps, timestamps[1:])):
            return f"{self.path}: timestamps are not increasing"
        if any(b < a for a, b in zip(relative_offsets, relative_offsets[1:])) or (relative_offsets and relative_offsets[0] < 0):
            return f"{self.path}: offsets go backwards"
        if relative_offsets and self.base_offset + relative_offsets[-1] >= next_offset:
            return f"{self.path}: last entry is past the end of the log"
        return None

    def maybe_append(self, timestamp: int, offset: int) -> None:
        # The produce path: the arrays directly (``_appended`` marks the use).
        if not self._loaded:
            self._ensure_loaded()
        timestamps = self._timestamps
        if timestamps and timestamp <= timestamps[-1]:
            return
        relative = offset - self.base_offset
        timestamps.append(timestamp)
        self._relative_offsets.append(relative)
        self._queue(timestamp, relative)
        self._appended()

    def lookup(self, timestamp: int) -> int:
        """An offset at or before the first batch with max timestamp >= ``timestamp``."""
        index = bisect.bisect_left(self.timestamps, timestamp) - 1
        if index < 0:
            return self.base_offset
        return self.base_offset + self._relative_offsets[index]

    def truncate_to_offset(self, offset: int) -> None:
        relative_offsets = self.relative_offsets
        keep = bisect.bisect_left(relative_offsets, offset - self.base_offset)
        if keep < len(relative_offsets):
            del self._timestamps[keep:]
            del relative_offsets[keep:]
            self._truncated()

    def reset(self) -> None:
        self._set_entries(())
        self._start_empty()
