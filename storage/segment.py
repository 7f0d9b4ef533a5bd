"""One log segment: ``<base offset, 20 digits>.log`` with its ``.index``,
``.timeindex`` and ``.txnindex``.

The ``.log`` file is a plain concatenation of RecordBatch v2 batches exactly
as they travel on the wire (offsets already assigned), written at ``size``
(the end of the data). The active segment of a log whose appends are small
may run on past it with zeros written ahead (``append``'s ``zeros_ahead``):
an fsync after an append that changes a file's length must commit the
file system's journal too (ext4, XFS: the new size, the blocks allocated),
one that only overwrites blocks already written need not, which measured
0.23 -> 0.14 ms per fsync of a 4 KiB append on this project's machines (as
databases zero-fill their write-ahead logs ahead). The zeros are cut at a
roll and at a clean close (``trim``), so every other segment, and the
active one after a clean stop, ends at its last batch; after an unclean stop
recovery finds the zeros where a batch would start and cuts them without
calling it damage (``recover``). Every operation on
it, and on its index files (``storage.index``, ``storage.txn_index``), goes
through one ``DiskIO`` object (``storage.durable``), the seam tests and the
fault harness replace to make a write or an fsync fail and to journal what
an fsync made durable (recovery rebuilds an index it cannot trust from the
``.log``).
"""

from __future__ import annotations

import logging
import os

from protocol.records import BATCH_HEADER_SIZE, LOG_OVERHEAD, BatchHeader, CorruptRecordError
from storage.checksum import checked_header
from storage.durable import DiskIO
from storage.index import IndexBudget, OffsetIndex, TimeIndex
from storage.txn_index import TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
READ_CHUNK = 64 * 1024
# Zeros are written ahead only of appends up to this size: for larger ones
# the fsync's journal commit is a small part of its cost, and the zeros
# would double the bytes written to the device.
SMALL_APPEND_BYTES = 64 * 1024
PAGE_BYTES = 4096


def file_stem(base_offset: int) -> str:
    return f"{base_offset:020d}"


class LogSegment:
    def __init__(
        self,
        directory: str,
        base_offset: int,
        io: DiskIO,
        *,
        index_interval_bytes: int,
        index_budget: IndexBudget | None = None,
        suffix: str = "",
        rebuild_indexes: bool = False,
    ):
        self.directory = directory
        self.base_offset = base_offset
        self.io = io
        self.index_budget = IndexBudget() if index_budget is None else index_budget
        self.index_interval_bytes = index_interval_bytes
        stem = os.path.join(directory, file_stem(base_offset))
        self.log_path = stem + LOG_SUFFIX + suffix
        # Written at ``size`` (not O_APPEND: the file may run on past it with
        # zeros written ahead). Until load_clean() or recover() has found the
        # end of the data, ``size`` is the file's length.
        self.fd = io.open(self.log_path, os.O_RDWR | os.O_CREAT)
        self.size = os.fstat(self.fd).st_size
        self.allocated = self.size  # the file's length: ``size`` and any zeros written ahead
        self.writes_zeros_ahead = True  # False once writing zeros failed (a full disk): not tried again
        self.offset_index = OffsetIndex(stem + INDEX_SUFFIX + suffix, base_offset, io=io, budget=self.index_budget, load=not rebuild_indexes)
        self.time_index = TimeIndex(stem + TIME_INDEX_SUFFIX + suffix, base_offset, io=io, budget=self.index_budget, load=not rebuild_indexes)
        self.txn_index = TransactionIndex(stem + TXN_INDEX_SUFFIX + suffix, io=io)
        self.bytes_since_index_entry = 0
        self.next_offset = base_offset  # set by load()/recover()
        self.max_timestamp = -1
        self.max_timestamp_offset = -1
        self.created_ms: int | None = None
        self.closed = False
        # Worker-thread fsyncs running on ``fd`` (storage.group_commit pins
        # and unpins on the loop); a close meanwhile leaves the descriptor
        # open until the last one returns, so it is never closed (or reused
        # by another file) under an fsync.
        self.fsyncs_running = 0
        self.fd_close_deferred = False

    # -- writing -----------------------------------------------------------------

    def append(self, data, headers: list[tuple[int, BatchHeader]], base_offsets: list[int] | None = None, *, zeros_ahead: int = 0) -> None:
        """Write ``data`` (whole batches) at the end. ``headers`` are the
        batches' (position in data, header); ``base_offsets`` the offsets
        assigned to them, when they differ from the headers' own.
        ``zeros_ahead`` (the active segment's, from its log): after an
        append of at most ``SMALL_APPEND_BYTES``, keep at least half that
        many bytes of zeros written past the data (see the module's doc).

        Raises OSError if the write of ``data`` fails; the caller then stops
        the log. A failed write of zeros is not an error (nothing depends on
        them): the segment stops writing ahead."""
        start = self.size
        self.io.write_at(self.fd, data, start)
        self.size += len(data)
        self.allocated = max(self.allocated, self.size)
        if zeros_ahead and self.writes_zeros_ahead and len(data) <= SMALL_APPEND_BYTES and self.allocated - self.size < zeros_ahead // 2:
            self._write_zeros_ahead(zeros_ahead)
        for index, (relative_position, header) in enumerate(headers):
            base = header.base_offset if base_offsets is None else base_offsets[index]
            self._index_batch(start + relative_position, header, base)

    def _index_batch(self, position: int, header: BatchHeader, base_offset: int | None = None) -> None:
        if base_offset is None:
            base_offset = header.base_offset
        if self.bytes_since_index_entry >= self.index_interval_bytes:
            self.offset_index.append(base_offset, position)
            self.bytes_since_index_entry = 0
        self.bytes_since_index_entry += header.size
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.max_timestamp_offset = base_offset
            self.time_index.maybe_append(header.max_timestamp, base_offset)
        self.next_offset = base_offset + header.last_offset_delta + 1

    def _write_zeros_ahead(self, zeros_ahead: int) -> None:
        target = -(-(self.size + zeros_ahead) // PAGE_BYTES) * PAGE_BYTES
        try:
            self.io.write_zeros(self.fd, self.allocated, target - self.allocated)
            self.allocated = target
        except OSError as error:
            self.writes_zeros_ahead = False
            self.allocated = max(self.size, os.fstat(self.fd).st_size)
            log.warning("%s: writing zeros ahead of the data failed (%s); appends go on without", self.log_path, error)

    def trim(self) -> bool:
        """Cut the zeros written ahead: the file ends at its last batch
        again (at a roll, before the segment's last fsync, and at a clean
        close). Whether there were any (the cut is durable at the next
        fsync). Raises OSError if the truncation fails."""
        if self.allocated <= self.size:
            return False
        self.io.truncate(self.fd, self.size)
        self.allocated = self.size
        return True

    def fsync(self) -> None:
        self.io.fsync(self.fd)

    def fsync_unless_closed(self) -> None:
        # A segment deleted by retention or replaced by the cleaner after it
        # was queued for fsync needs none (it was durable before either).
        if not self.closed:
            self.io.fsync(self.fd)

    def flush_indexes(self, fsync: bool = False) -> None:
        self.offset_index.flush(fsync)
        self.time_index.flush(fsync)

    # -- reading -------------------------------------------------------------------

    def read_at(self, position: int, size: int) -> bytes:
        return self.io.pread(self.fd, size, position)

    def find_position(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= ``offset``."""
        _indexed_offset, position = self.offset_index.lookup(offset)
        while position < self.size:
            header = self._header_at(position)
            if header.last_offset >= offset:
                return position, header
            position += header.size
        return None

    def _header_at(self, position: int) -> BatchHeader:
        data = self.io.pread(self.fd, BATCH_HEADER_SIZE, position)
        return BatchHeader.parse(data)

    def iter_headers(self, position: int = 0):
        """Yield (position, header) of each batch from ``position`` (no CRC checks)."""
        while position < self.size:
            header = self._header_at(position)
            yield position, header
            position += header.size

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None, min_one_batch: bool) -> bytes:
        found = self.find_position(offset)
        if found is None:
            return b""
        start, header = found
        end = start
        position = start
        total = 0
        while position < self.size:
            header = self._header_at(position) if position != start else header
            if max_offset is not None and header.base_offset >= max_offset:
                break
            if total + header.size > max_bytes and not (min_one_batch and total == 0):
                break
            total += header.size
            position += header.size
            end = position
        if end == start:
            return b""
        return self.io.pread(self.fd, end - start, start)

    # -- recovery --------------------------------------------------------------------

    def recover(self, *, expected_start: int | None = None) -> tuple[int, str | None]:
        """Validate every batch, rebuild the indexes, truncate at the first bad
        batch. Returns (bytes truncated, reason or None)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.bytes_since_index_entry = 0
        self.max_timestamp = -1
        self.max_timestamp_offset = -1
        self.next_offset = self.base_offset if expected_start is None else expected_start
        position = 0
        reason = None
        previous_next = expected_start  # offsets never overlap the previous segment's
        while position < self.size:
            head = self.io.pread(self.fd, LOG_OVERHEAD, position)
            if len(head) < LOG_OVERHEAD:
                reason = f"truncated batch header at position {position}"
                break
            whole = int.from_bytes(head[8:12], "big", signed=True) + LOG_OVERHEAD
            if whole < BATCH_HEADER_SIZE or position + whole > self.size:
                reason = f"batch at position {position} claims {whole} bytes, {self.size - position} remain (torn write)"
                break
            try:
                header = checked_header(self.io.pread(self.fd, whole, position), 0)
            except CorruptRecordError as error:
                reason = f"position {position}: {error}"
                break
            if header.base_offset < self.base_offset or (previous_next is not None and header.base_offset < previous_next):
                reason = f"position {position}: offset {header.base_offset} goes backwards"
                break
            previous_next = header.next_offset
            self._index_batch(position, header)
            position += whole
        truncated = self.size - position
        if truncated and self.size % PAGE_BYTES == 0 and self._zeros_from(position):
            # Zeros written ahead of the data (an unclean stop before the
            # segment was trimmed; they always end on a page): the end of
            # the data, nothing lost. (A torn batch whose surviving bytes
            # are zeros, its base offset's high bytes, leaves a file that
            # does not end on a page, and is reported.)
            reason, truncated = None, 0
        if position < self.size:
            self.truncate_to_position(position)
        self.flush_indexes()
        return truncated, reason

    def _zeros_from(self, position: int) -> bool:
        """Whether every byte from ``position`` to the end of the file is zero."""
        while position < self.size:
            chunk = self.io.pread(self.fd, min(READ_CHUNK * 16, self.size - position), position)
            if not chunk or chunk.strip(b"\0"):
                return False
            position += len(chunk)
        return True

    def load_clean(self) -> str | None:
        """After a clean shutdown (or for a segment below the recovery point):
        trust the indexes and find the end by scanning only from the last
        offset-index entry. Returns None, or why the files cannot be trusted
        (an index missing or inconsistent, a header past the end); the caller
        then runs ``recover()`` on this segment."""
        if self.size and (self.offset_index.missing or self.time_index.missing):
            return f"{os.path.basename(self.log_path)}: index files are missing"
        problem = self.offset_index.problem(self.size)
        if problem:
            return problem
        _offset, position = self.offset_index.lookup(2**62)
        last = None
        try:
            for _position, header in self.iter_headers(position):
                if _position + header.size > self.size or header.size < BATCH_HEADER_SIZE:
                    return f"{os.path.basename(self.log_path)}: batch at {_position} runs past the end of the file"
                last = header
        except CorruptRecordError as error:
            return f"{os.path.basename(self.log_path)}: {error}"
        self.next_offset = last.next_offset if last is not None else self.base_offset
        problem = self.time_index.problem(self.next_offset)
        if problem:
            return problem
        self.bytes_since_index_entry = self.size - position
        self.max_timestamp = self.time_index.max_timestamp
        if len(self.time_index):
            self.max_timestamp_offset = self.time_index.base_offset + self.time_index.relative_offsets[-1]
        return None

    def truncate_to_position(self, position: int) -> None:
        self.io.truncate(self.fd, position)
        self.size = self.allocated = position
        self.offset_index.truncate_to_position(position)

    def truncate_to_offset(self, offset: int) -> None:
        """Remove every batch at or after ``offset``."""
        found = self.find_position(offset)
        if found is None:
            return
        position, header = found
        if header.base_offset < offset:
            position += header.size  # offset falls inside this batch: keep the batch
        self.truncate_to_position(position)
        self.time_index.truncate_to_offset(offset)
        self.txn_index.truncate_to(offset)
        self.next_offset = max(self.base_offset, min(self.next_offset, offset))
        self.max_timestamp = self.time_index.max_timestamp
        self.max_timestamp_offset = self.time_index.base_offset + self.time_index.relative_offsets[-1] if len(self.time_index) else -1

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True  # first: a worker that has not started its fsync skips it
        self.flush_indexes()
        self.offset_index.close()  # their memory goes back to the budget
        self.time_index.close()
        if self.fsyncs_running:
            self.fd_close_deferred = True  # unpin_for_fsync closes it
        else:
            self.io.close(self.fd)

    def pin_for_fsync(self) -> None:
        """A worker thread is about to fsync ``fd``: keep it open until ``unpin_for_fsync``."""
        self.fsyncs_running += 1

    def unpin_for_fsync(self) -> None:
        """The worker's fsync returned; close the descriptor if a close waited for it."""
        self.fsyncs_running -= 1
        if not self.fsyncs_running and self.fd_close_deferred:
            self.fd_close_deferred = False
            self.io.close(self.fd)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment({self.base_offset}, size={self.size}, next_offset={self.next_offset})"
