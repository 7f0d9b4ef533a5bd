"""The partition log: an ordered list of segments in one directory, with
offset assignment, appends and reads, retention and producer state.

Files in a partition directory::

    00000000000000000000.log         batches, as on the wire, offsets assigned
    00000000000000000000.index       sparse offset index          (storage.index)
    00000000000000000000.timeindex   sparse time index            (storage.index)
    00000000000000000000.txnindex    aborted transactions         (storage.txn_index)
    00000000000000001234.snapshot    producer state at offset 1234 (storage.producer_state)
    checkpoint                       recovery point and log start offset (storage.recovery)
    .clean_shutdown                  present while the files are as a clean close (or recovery) left them
    <base>.swap.range, *.cleaned, *.swap, *.deleted   a compaction swap in progress (storage.cleaner)

``PartitionLog`` owns the offsets (log start, log end, the high watermark and
the last stable offset), appends (a producer's batches, checked and given
offsets in place; control markers), rolling segments, reads, ListOffsets
lookups, retention and DeleteRecords, and the order of opening and closing.
The log start offset moves with retention and DeleteRecords and is
checkpointed before any segment is deleted.

``.clean_shutdown`` vouches that the files are whole and their indexes
right: ``close()`` writes it last, and so does ``open`` after recovering a
directory that had none. It stays while the log is only read, and goes
(durably: a directory fsync) before the first change to any file
(``begin_changes``), so a log opened and only read, or never opened at all,
needs no recovery after a crash however the broker stopped, and closing it
costs no fsync. A broker can therefore open its logs lazily: the ones that
lack the file are exactly those changed since they were last whole.

Its two other jobs live beside it:

- ``storage.recovery``: what ``open`` does after a stop, clean or not (the
  checkpoint file, the segment scan that truncates a torn or corrupt tail,
  producer state rebuilt from a snapshot and the log);
- ``storage.group_commit``: when appends become durable and acknowledged (the
  group committer, ``flush.policy``, ``wait_durable``, the failed state and
  ``LogFailedError``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import time

import attrs

from protocol.records import (
    CorruptRecordError,
    ControlType,
    decode_batch,
    decode_control_record,
    encode_control_batch,
    read_batch_header,
    set_base_offset,
    TIMESTAMP_TYPE_MASK,
    TimestampType,
    set_max_timestamp_and_type,
)
from storage import recovery
from storage.checksum import checked_batches
from storage.config import FLUSH_OS, LogConfig
from storage.group_commit import FsyncRounds, GroupCommitter, LogFailedError
from storage.durable import fsync_directory, replace_file
from storage.index import IndexBudget
from storage.producer_state import (
    DuplicateBatch,
    ProducerAppend,
    ProducerStateManager,
)
from storage.recovery import CLEAN_SHUTDOWN_FILE
from storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    SNAPSHOT_SUFFIX,
    SWAP_SUFFIX,
    DiskIO,
    LogSegment,
    file_stem,
)
from storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1


class OffsetOutOfRangeError(Exception):
    pass


class RecordTooLargeError(ValueError):
    pass


@attrs.frozen
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time: int = -1
    duplicate: bool = False


def now_ms() -> int:
    return int(time.time() * 1000)


class PartitionLog:
    def __init__(self, directory: str, config: LogConfig, *, io: DiskIO | None = None, index_budget: IndexBudget | None = None, clock=now_ms,
                 fsync_rounds: FsyncRounds | None = None):
        self.directory = directory
        self.config = config
        self.io = io or DiskIO()
        # Shared with the other logs of whoever opened this one (a broker), or its own.
        self.index_budget = IndexBudget() if index_budget is None else index_budget
        self.clock = clock
        self.segments: list[LogSegment] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.durable_offset = 0
        self.recovery_point = 0
        self.producer_state = ProducerStateManager()
        self.failed: Exception | None = None
        self.closed = False
        # Group commit shared with the other logs of whoever opened this one (a broker), or its own.
        self.committer = GroupCommitter(self, fsync_rounds)
        self.recovery_report: list[str] = []
        # True while .clean_shutdown is on disk: nothing changed since it was written.
        self.marked_clean = False
        self.changed = False  # since open (``begin_changes``)
        self.directory_unsynced = False  # a segment file created at open whose name no directory fsync has covered

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls, directory: str, config: LogConfig | None = None, *, io: DiskIO | None = None, index_budget: IndexBudget | None = None, clock=now_ms,
        fsync_rounds: FsyncRounds | None = None,
    ) -> "PartitionLog":
        os.makedirs(directory, exist_ok=True)
        partition_log = cls(directory, config or LogConfig(), io=io, index_budget=index_budget, clock=clock, fsync_rounds=fsync_rounds)
        partition_log._load()
        return partition_log

    def _load(self) -> None:
        from storage.cleaner import complete_interrupted_swaps

        complete_interrupted_swaps(self.directory)
        recovery.remove_leftovers(self.directory)
        clean = os.path.exists(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE))
        recovery_point, log_start = recovery.read_checkpoint(self.directory)
        for base in recovery.segment_bases(self.directory):
            self.segments.append(self._new_segment(base))
        if not self.segments:
            self.segments.append(self._new_segment(max(log_start, 0)))
            self.directory_unsynced = True
        # After a clean shutdown every segment is trusted (after a sanity
        # check of its indexes); otherwise those from the recovery point on
        # are scanned.
        self.recovery_report = recovery.recover_segments(self.directory, self.segments, None if clean else recovery_point)
        for segment in self.segments:
            if segment.created_ms is None:
                segment.created_ms = recovery.segment_created_ms(segment, self.clock)
        self.log_end_offset = max(self.segments[-1].next_offset, self.segments[-1].base_offset)
        self.log_start_offset = max(log_start, self.segments[0].base_offset)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self.durable_offset = self.log_end_offset
        self.recovery_point = self.log_end_offset
        self.producer_state = recovery.rebuild_producer_state(self.directory, self.segments, self.log_start_offset, self.log_end_offset)
        if clean:
            self.marked_clean = True
        elif self.size_bytes:
            # Recovery made everything up to the log end durable (segments,
            # indexes, removals): say so, then vouch for the files until
            # the first change (``begin_changes``).
            self._write_checkpoint()
            recovery.mark_clean(self.directory)
            self.marked_clean = True
        # else no data at all (a new partition): nothing to vouch for, and
        # nothing to recover after a crash before its first append
        # (``recovery.needs_recovery``), so no mark and no fsync.

    def begin_changes(self) -> None:
        """Called before anything changes a file of this log: the first time
        after open, remove ``.clean_shutdown`` durably, so that a crash from
        now on is seen as unclean and the changed files are recovered."""
        self.changed = True
        if self.directory_unsynced:
            # A new log's first segment: its name must be durable before
            # anything written into it is acknowledged.
            try:
                fsync_directory(self.directory)
            except OSError as error:
                self.mark_failed(error)
                raise LogFailedError(f"fsync of {self.directory} failed: {error}") from error
            self.directory_unsynced = False
        if not self.marked_clean:
            return
        try:
            recovery.unmark_clean(self.directory)
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"removing {CLEAN_SHUTDOWN_FILE} from {self.directory} failed: {error}") from error
        self.marked_clean = False

    def _new_segment(self, base_offset: int) -> LogSegment:
        return LogSegment(self.directory, base_offset, self.io, index_interval_bytes=self.config.index_interval_bytes, index_budget=self.index_budget)

    def _write_checkpoint(self) -> None:
        recovery.write_checkpoint(self.directory, self.recovery_point, self.log_start_offset)

    # ------------------------------------------------------------------ producer state

    def take_snapshot(self) -> None:
        """Write the producer state at the log end. The directory fsync is the
        caller's (a roll's, or the checkpoint's at close)."""
        offset = self.log_end_offset
        path = os.path.join(self.directory, file_stem(offset) + SNAPSHOT_SUFFIX)
        replace_file(path, self.producer_state.snapshot_bytes(), sync_directory=False)
        # Keep the two newest snapshots.
        for old in recovery.snapshot_offsets(self.directory)[:-2]:
            try:
                os.remove(os.path.join(self.directory, file_stem(old) + SNAPSHOT_SUFFIX))
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ appending

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    def _check_writable(self) -> None:
        if self.closed:
            raise LogFailedError(f"log {self.directory} is closed")
        if self.failed is not None:
            raise LogFailedError(f"log {self.directory} failed earlier ({self.failed}); it refuses appends until reopened")

    def append(self, data, *, assign_offsets: bool = True, flush: bool = True) -> AppendInfo:
        """Append one or more concatenated batches.

        With ``assign_offsets`` (a producer's batches) the log end offset and
        leader epoch are patched into each batch's bytes in place: the CRC does
        not cover them, so nothing is re-encoded and no record is decoded.
        Without it (batches that already carry offsets: a follower, a
        rewrite) the offsets must be increasing and start at or after the log
        end; gaps are allowed, as compaction leaves them.

        Every batch's CRC is verified first. Raises CorruptRecordError, a
        ProducerStateError, RecordTooLargeError or LogFailedError; nothing is
        written in any of those cases. The data is durable (and readable
        below the high watermark) once ``wait_durable(info.last_offset)``
        completes. Without ``flush`` no fsync round is asked for: the bytes
        wait for the next round of this log, which ``wait_durable`` asks for
        (the transaction coordinator's appends that nothing waits for yet).
        """
        self._check_writable()
        # Patch the caller's buffer when it is writable (the request's bytes,
        # which nobody reads after the append); copy read-only bytes once.
        writable = isinstance(data, bytearray) or (isinstance(data, memoryview) and not data.readonly and data.format == "B" and data.contiguous)
        buffer = data if writable else bytearray(data)
        headers = checked_batches(buffer)
        if not headers:
            raise CorruptRecordError("no record batches to append")
        producer_changes: list[ProducerAppend | None] = []
        base_offsets: list[int] = []
        next_offset = self.log_end_offset
        max_timestamp = -1
        append_time = self.clock() if self.config.message_timestamp_type == "LogAppendTime" else -1
        for index, (position, header) in enumerate(headers):
            if header.size > self.config.max_message_bytes:
                raise RecordTooLargeError(f"batch of {header.size} bytes exceeds max.message.bytes={self.config.max_message_bytes}")
            if assign_offsets and header.record_count != header.last_offset_delta + 1:
                # Kafka's check: the offsets a batch claims must match its
                # record count, or in-place assignment would leave holes.
                raise CorruptRecordError(
                    f"batch claims {header.last_offset_delta + 1} offsets but holds {header.record_count} records",
                    offset=header.base_offset,
                    position=position,
                )
            if not assign_offsets and header.base_offset < next_offset:
                raise CorruptRecordError(
                    f"batch offset {header.base_offset} is below {next_offset} (the log end or the previous batch's end)",
                    offset=header.base_offset,
                    position=position,
                )
            change = self.producer_state.check_append(header)
            if isinstance(change, DuplicateBatch):
                if len(headers) == 1:
                    return AppendInfo(change.first_offset, change.last_offset, change.timestamp, duplicate=True)
                raise CorruptRecordError("a duplicate batch inside a multi-batch request")
            if assign_offsets:
                set_base_offset(buffer, position, next_offset, 0)
                if append_time >= 0 and not header.is_control:
                    set_max_timestamp_and_type(buffer, position, header, append_time)
                    header = attrs.evolve(header, attributes=header.attributes | TIMESTAMP_TYPE_MASK, max_timestamp=append_time)
                    headers[index] = (position, header)
            else:
                next_offset = header.base_offset
            producer_changes.append(change)
            base_offsets.append(next_offset)
            max_timestamp = max(max_timestamp, header.max_timestamp)
            next_offset += header.last_offset_delta + 1
        first_offset = base_offsets[0]
        last_offset = next_offset - 1
        self.begin_changes()
        try:
            self._maybe_roll(len(buffer), first_offset, last_offset, max_timestamp)
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"rolling a new segment in {self.directory} failed: {error}") from error
        segment = self.active_segment
        try:
            segment.append(buffer, headers, base_offsets, zeros_ahead=self._zeros_ahead())
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"write to {segment.log_path} failed: {error}") from error
        for change, offset, (_position, header) in zip(producer_changes, base_offsets, headers):
            if change is not None:
                self.producer_state.apply_append(change, offset, offset + header.last_offset_delta)
        self.log_end_offset = last_offset + 1
        self.committer.wrote(segment, len(buffer), flush=flush)
        return AppendInfo(first_offset, last_offset, max_timestamp, log_append_time=append_time)

    def append_control(self, data, *, coordinator_epoch: int) -> tuple[AppendInfo, AbortedTxn | None]:
        """Append one COMMIT/ABORT marker batch handed in (its CRC checked and its record decoded first)."""
        self._check_writable()
        buffer = bytearray(data)
        _position, header = checked_batches(buffer)[0]
        if not header.is_control:
            raise ValueError("append_control needs a control batch")
        marker = decode_control_record(decode_batch(buffer).records[0])
        return self._append_marker(buffer, header, marker.type, coordinator_epoch)

    def append_marker(self, control: ControlType, *, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                      timestamp: int) -> tuple[AppendInfo, AbortedTxn | None]:
        """Append a COMMIT/ABORT marker encoded here (the transaction
        coordinator's): the same as ``append_control`` of its bytes, without
        checking and decoding again what was just encoded."""
        self._check_writable()
        buffer = encode_control_batch(control, producer_id=producer_id, producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch, timestamp=timestamp)
        return self._append_marker(buffer, read_batch_header(buffer, 0, verify_crc=False), control, coordinator_epoch)

    def _append_marker(self, buffer: bytearray, header, control: ControlType, coordinator_epoch: int) -> tuple[AppendInfo, AbortedTxn | None]:
        self.producer_state.check_marker(header.producer_id, header.producer_epoch, coordinator_epoch)
        offset = self.log_end_offset
        set_base_offset(buffer, 0, offset, 0)
        self.begin_changes()
        try:
            self._maybe_roll(len(buffer), offset, offset, header.max_timestamp)
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"rolling a new segment in {self.directory} failed: {error}") from error
        segment = self.active_segment
        try:
            segment.append(buffer, [(0, header)], [offset], zeros_ahead=self._zeros_ahead())
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"write to {segment.log_path} failed: {error}") from error
        completed = self.producer_state.apply_marker(header.producer_id, header.producer_epoch, coordinator_epoch, control, offset, header.max_timestamp)
        self.log_end_offset = offset + 1
        aborted = None
        if completed is not None and completed.is_aborted:
            unstable = self.producer_state.first_unstable_offset()
            aborted = AbortedTxn(completed.producer_id, completed.first_offset, offset, unstable if unstable is not None else offset + 1)
            try:
                segment.txn_index.append(aborted)
            except OSError as error:
                # The marker is in the log: recovery's replay indexes it again.
                self.mark_failed(error)
                raise LogFailedError(f"write to {segment.txn_index.path} failed: {error}") from error
        self.committer.wrote(segment, len(buffer))
        return AppendInfo(offset, offset, header.max_timestamp), aborted

    def _zeros_ahead(self) -> int:
        """How many bytes of zeros the active segment keeps written ahead of
        small appends (``storage.segment``): none when no fsync follows them
        (``flush.policy=os``)."""
        return 0 if self.config.flush_policy == FLUSH_OS else self.config.segment_zeros_ahead_bytes

    def _maybe_roll(self, size: int, first_offset: int, last_offset: int, max_timestamp: int) -> None:
        segment = self.active_segment
        if segment.size == 0:
            if segment.base_offset != first_offset and not segment.offset_index and first_offset >= segment.base_offset:
                # An empty active segment whose base is behind the log end (after
                # DeleteRecords or truncation): re-base it so names match content.
                self._replace_empty_active(first_offset)
            return
        config = self.config
        if (
            segment.size + size > config.segment_bytes
            or (segment.created_ms is not None and self.clock() - segment.created_ms >= config.segment_ms)
            or len(segment.offset_index) >= config.max_index_entries
            or len(segment.time_index) >= config.segment_index_bytes // 12
            or last_offset - segment.base_offset > INT32_MAX  # relative offsets are int32
        ):
            self.roll(first_offset)

    def _replace_empty_active(self, base_offset: int) -> None:
        old = self.segments.pop()
        old.delete()
        segment = self._new_segment(base_offset)
        segment.created_ms = self.clock()
        self.segments.append(segment)
        fsync_directory(self.directory)  # acknowledged data goes into the new file: its name must survive a crash

    def roll(self, next_base: int | None = None) -> LogSegment:
        """Start a new active segment at ``next_base`` (default: the log end).
        Raises LogFailedError (and fails the log) if a write or fsync fails."""
        self._check_writable()
        self.begin_changes()
        try:
            return self._roll(self.log_end_offset if next_base is None else next_base)
        except OSError as error:
            self.mark_failed(error)
            raise LogFailedError(f"rolling a new segment in {self.directory} failed: {error}") from error

    def _roll(self, base: int) -> LogSegment:
        old = self.active_segment
        # A barrier, whatever flush.policy says: the old segment is made
        # durable whole (.log, indexes) before the new one gets a byte. The
        # kernel writes pages back in any order, so without it a machine
        # crash could keep the new segment's batches and lose the old one's
        # unsynced tail; cut at a batch boundary, the old segment looks whole
        # to recovery and the log has a hole (the shared-round power-cut test
        # found one: offsets 492-564 missing, 565 on kept). With it, what a
        # crash leaves is a prefix. One fsync per segment.bytes.
        old.flush_indexes(fsync=True)
        old.txn_index.fsync()
        old.trim()  # a segment that is not active ends at its last batch: cut before its last fsync
        began = time.perf_counter()
        # Normally only ``old``: every segment below the recovery point was
        # made durable by its own roll (or by recovery).
        for segment in self.segments[self._segment_for(self.recovery_point):]:
            segment.fsync()
        self.committer.rolled(old, time.perf_counter() - began)
        segment = self._new_segment(base)
        segment.created_ms = self.clock()
        self.segments.append(segment)
        try:
            self.take_snapshot()
        except OSError as error:
            log.warning("producer snapshot at roll failed: %s", error)
        # The new segment's files, the snapshot and any .txnindex created
        # during the old segment's life are in the directory before the
        # checkpoint says recovery may trust everything below ``base``.
        fsync_directory(self.directory)
        self.recovery_point = max(self.recovery_point, base)
        self._write_checkpoint()
        return segment

    # ------------------------------------------------------------------ durability (storage.group_commit)

    def flush(self) -> None:
        """fsync everything written so far, synchronously, then acknowledge it."""
        self.committer.flush()

    def wait_durable(self, offset: int, *, ask: bool = True) -> asyncio.Future:
        """A future that completes when ``offset`` is durable (fails if it
        never will be). Without ``ask`` it asks for no fsync round: an
        append made without ``flush`` waits for someone else's."""
        return self.committer.wait_durable(offset, ask=ask)

    def is_durable(self, offset: int) -> bool:
        """Whether ``offset`` is durable now on a log that has not failed:
        ``wait_durable`` would answer a done future."""
        return self.failed is None and offset < self.durable_offset

    def mark_failed(self, error: Exception) -> None:
        """Refuse appends until the log is reopened (a write or fsync failed,
        here or in the group committer or the cleaner), and fail the waiters."""
        log.error("log %s failed: %s; refusing appends until it is reopened", self.directory, error)
        self.failed = error
        self.committer.fail_waiters(LogFailedError(f"not durable: {error}"))

    @property
    def high_watermark(self) -> int:
        return self.durable_offset

    @property
    def last_stable_offset(self) -> int:
        unstable = self.producer_state.first_unstable_offset()
        if unstable is None:
            return self.high_watermark
        return min(unstable, self.high_watermark)

    # ------------------------------------------------------------------ reading

    def _segment_for(self, offset: int) -> int:
        return max(0, bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1)

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True) -> bytes:
        """Whole batches from the one containing ``offset``, up to ``max_bytes``
        (the first batch may exceed it when ``min_one_batch``), none at or
        beyond ``max_offset`` (default: the high watermark)."""
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is outside [{self.log_start_offset}, {self.log_end_offset}]")
        limit = self.high_watermark if max_offset is None else max_offset
        if offset >= limit:
            return b""
        index = self._segment_for(offset)
        for segment in self.segments[index:]:
            if segment.base_offset >= limit:
                break
            data = segment.read(offset, max_bytes, max_offset=limit, min_one_batch=min_one_batch)
            if data:
                return data
        return b""

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[dict]:
        result = []
        for segment in self.segments:
            for entry in segment.txn_index.overlapping(start_offset, end_offset):
                result.append({"producer_id": entry.producer_id, "first_offset": entry.first_offset})
        return result

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start
        offset with timestamp >= ``timestamp`` (ListOffsets), found through
        the time index; None if there is none."""
        start_offset = self.log_start_offset
        for segment in self.segments:
            if segment.max_timestamp < timestamp or (segment.size and segment.next_offset <= start_offset):
                continue
            found = segment.find_position(max(segment.time_index.lookup(timestamp), start_offset))
            if found is None:
                continue
            for position, header in segment.iter_headers(found[0]):
                if header.max_timestamp < timestamp or header.last_offset < start_offset:
                    continue
                batch = decode_batch(segment.read_at(position, header.size))
                log_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
                for record in batch.records:
                    # With LogAppendTime every record's timestamp is the batch's.
                    record_timestamp = header.max_timestamp if log_append_time else record.timestamp
                    if record_timestamp >= timestamp and record.offset >= start_offset:
                        return record.offset, record_timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        best = None
        for segment in self.segments:
            if segment.max_timestamp >= 0 and (best is None or segment.max_timestamp > best[0]):
                best = (segment.max_timestamp, segment.max_timestamp_offset)
        return best

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # ------------------------------------------------------------------ retention

    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset to ``offset`` (DeleteRecords); returns it."""
        if offset > self.high_watermark:
            raise OffsetOutOfRangeError(f"offset {offset} is beyond the high watermark {self.high_watermark}")
        if offset <= self.log_start_offset:
            return self.log_start_offset
        self.begin_changes()
        self.log_start_offset = offset
        self._write_checkpoint()
        self._delete_segments_below(offset)
        self.producer_state.truncate_head(offset)
        return self.log_start_offset

    def _delete_segments_below(self, offset: int) -> None:
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            self._delete_oldest_segment()

    def _delete_oldest_segment(self) -> None:
        self.begin_changes()
        segment = self.segments.pop(0)
        self.committer.forget(segment)
        segment.delete()
        if self.log_start_offset < self.segments[0].base_offset:
            self.log_start_offset = self.segments[0].base_offset
        self._write_checkpoint()

    def enforce_retention(self) -> int:
        """Delete whole segments past ``retention.ms`` or over ``retention.bytes``
        (never the active one). Returns the number deleted."""
        if not self.config.delete:
            return 0
        deleted = 0
        now = self.clock()
        if self.config.retention_ms >= 0:
            while len(self.segments) > 1 and self.segments[0].next_offset <= self.high_watermark:
                oldest = self.segments[0]
                newest_timestamp = oldest.max_timestamp if oldest.max_timestamp >= 0 else oldest.created_ms or now
                if now - newest_timestamp <= self.config.retention_ms:
                    break
                self._delete_oldest_segment()
                deleted += 1
        if self.config.retention_bytes >= 0:
            while len(self.segments) > 1 and self.size_bytes - self.segments[0].size >= self.config.retention_bytes:
                if self.segments[0].next_offset > self.high_watermark:
                    break
                self._delete_oldest_segment()
                deleted += 1
        if deleted:
            self.producer_state.truncate_head(self.log_start_offset)
        return deleted

    def remove_expired_producers(self) -> list[int]:
        return self.producer_state.remove_expired(self.clock(), self.config.producer_id_expiration_ms)

    def update_config(self, config: LogConfig) -> None:
        self.config = config
        for segment in self.segments:
            segment.index_interval_bytes = config.index_interval_bytes

    # ------------------------------------------------------------------ closing

    async def aclose(self) -> None:
        """``close()`` for an owner under asyncio: first stop the group
        committer's flusher and wait for its fsync in flight, so that no
        worker thread fsyncs a file descriptor ``close()`` has closed."""
        if not self.closed:
            await self.committer.aclose()
        self.close()

    def close(self) -> None:
        """Flush, snapshot producer state, checkpoint, mark the shutdown
        clean; a log unchanged since it was opened, marked clean or empty,
        only closes its files."""
        if self.closed:
            return
        unchanged = self.failed is None and not self.changed and (self.marked_clean or not self.size_bytes)
        clean = self.failed is None and not unchanged
        if clean:
            try:
                # Opened after a clean stop, the active segment ends at its last
                # batch. The cut needs no fsync of its own: should a crash take
                # it back, the opening's check of the segment's tail finds the
                # zeros and recovery cuts them (``LogSegment.load_clean``).
                self.active_segment.trim()
                self.flush()
                for segment in self.segments:
                    segment.flush_indexes(fsync=True)
                # Rolled segments' .txnindex were fsynced at their roll; the
                # active one's entries (aborted transactions) are durable only
                # now, and the snapshot written next puts them past replay.
                self.active_segment.txn_index.fsync()
                self.recovery_point = self.log_end_offset
                self.take_snapshot()
                # One directory fsync for the snapshot's and the checkpoint's renames.
                recovery.write_checkpoint(self.directory, self.recovery_point, self.log_start_offset, sync_directory=False)
                fsync_directory(self.directory)
            except OSError as error:
                log.error("closing %s uncleanly: %s", self.directory, error)
                clean = False
        self.committer.stop()
        for segment in self.segments:
            try:
                segment.close()
            except OSError:
                clean = False
        if clean:
            # Everything it vouches for is durable now (see recovery.mark_clean).
            recovery.mark_clean(self.directory)
            self.marked_clean = True
        self.committer.fail_waiters(LogFailedError("log closed"))
        self.closed = True


__all__ = [
    "AppendInfo",
    "CLEANED_SUFFIX",
    "DELETED_SUFFIX",
    "LogFailedError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "RecordTooLargeError",
    "SWAP_SUFFIX",
    "ControlType",
]
