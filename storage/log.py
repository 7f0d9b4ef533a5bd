"""The partition log: an ordered list of segments in one directory, with
offset assignment, durability, crash recovery, retention and producer state.

Files in a partition directory::

    00000000000000000000.log         batches, as on the wire, offsets assigned
    00000000000000000000.index       sparse offset index          (storage.index)
    00000000000000000000.timeindex   sparse time index            (storage.index)
    00000000000000000000.txnindex    aborted transactions         (storage.txn_index)
    00000000000000001234.snapshot    producer state at offset 1234 (storage.producer_state)
    checkpoint                       "recovery-point N" and "log-start-offset M" lines
    .clean_shutdown                  present only between a clean close and the next open

Durability (``flush.policy``): "group" (default) fsyncs at most every
``flush.interval.ms`` covering every append since the last fsync; "always"
fsyncs before any append is acknowledged (appends that arrive during an fsync
share the next one); "os" never fsyncs. The high watermark is the end of the
durable data: consumers never see what a crash could take back, and
``wait_durable(offset)`` is how a Produce with acks=all waits for its fsync.
If a write or fsync fails, nothing after the last durable offset is ever
acknowledged, the log goes into a failed state and refuses appends until it
is reopened (which runs recovery and truncates whatever is not whole).

Recovery after an unclean stop scans every segment from the one holding the
recovery point, validates each batch's CRC and offsets, truncates at the
first torn or corrupt batch (deleting any later segments), rebuilds the
indexes of what it scanned, and logs what it dropped. Producer state is
rebuilt from the newest valid snapshot plus the log after it.
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
    iter_batches,
    set_base_offset,
)
from storage.config import FLUSH_ALWAYS, FLUSH_OS, LogConfig
from storage.producer_state import (
    CorruptSnapshotError,
    DuplicateBatch,
    ProducerAppend,
    ProducerStateManager,
)
from storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    SWAP_SUFFIX,
    DiskIO,
    LogSegment,
    file_stem,
)
from storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
INT32_MAX = 2**31 - 1


class LogFailedError(Exception):
    """The log hit a disk error and refuses appends until reopened (KAFKA_STORAGE_ERROR)."""


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
    def __init__(self, directory: str, config: LogConfig, *, io: DiskIO | None = None, clock=now_ms):
        self.directory = directory
        self.config = config
        self.io = io or DiskIO()
        self.clock = clock
        self.segments: list[LogSegment] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.durable_offset = 0
        self.recovery_point = 0
        self.producer_state = ProducerStateManager()
        self.failed: Exception | None = None
        self.closed = False
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._flush_task: asyncio.Task | None = None
        self._flush_scheduled = False
        self._last_flush = float("-inf")
        self._unflushed: list[LogSegment] = []
        self.recovery_report: list[str] = []

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, directory: str, config: LogConfig | None = None, *, io: DiskIO | None = None, clock=now_ms) -> "PartitionLog":
        os.makedirs(directory, exist_ok=True)
        partition_log = cls(directory, config or LogConfig(), io=io, clock=clock)
        partition_log._load()
        return partition_log

    def _load(self) -> None:
        from storage.cleaner import complete_interrupted_swaps

        complete_interrupted_swaps(self.directory)
        clean = os.path.exists(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE))
        recovery_point, log_start = self._read_checkpoint()
        bases = sorted(
            int(name[: -len(LOG_SUFFIX)])
            for name in os.listdir(self.directory)
            if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit()
        )
        for base in bases:
            self.segments.append(LogSegment(self.directory, base, self.io, index_interval_bytes=self.config.index_interval_bytes))
        if not self.segments:
            self.segments.append(LogSegment(self.directory, max(log_start, 0), self.io, index_interval_bytes=self.config.index_interval_bytes))
        if clean:
            for segment in self.segments:
                segment.load_clean()
                if segment.size == 0:
                    segment.next_offset = segment.base_offset
        else:
            self._recover(recovery_point)
        for segment in self.segments:
            if segment.created_ms is None:
                segment.created_ms = self._segment_created_ms(segment)
        self.log_end_offset = max(self.segments[-1].next_offset, self.segments[-1].base_offset)
        self.log_start_offset = max(log_start, self.segments[0].base_offset)
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        self.durable_offset = self.log_end_offset
        self.recovery_point = self.log_end_offset
        self._rebuild_producer_state(clean)
        # From now on a crash is unclean until close() says otherwise.
        try:
            os.remove(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE))
        except FileNotFoundError:
            pass
        self._write_checkpoint()

    def _recover(self, recovery_point: int) -> None:
        start_index = max(0, bisect.bisect_right([s.base_offset for s in self.segments], recovery_point) - 1)
        for segment in self.segments[:start_index]:
            segment.load_clean()
        previous_end = self.segments[start_index - 1].next_offset if start_index else None
        for index in range(start_index, len(self.segments)):
            segment = self.segments[index]
            truncated, reason = segment.recover(expected_start=previous_end)
            if truncated:
                message = f"{self.directory}: dropped {truncated} bytes of {os.path.basename(segment.log_path)} from position {segment.size}: {reason}"
                log.warning("recovery %s", message)
                self.recovery_report.append(message)
                for later in self.segments[index + 1 :]:
                    message = f"{self.directory}: deleted segment {os.path.basename(later.log_path)} ({later.size} bytes) after the damage"
                    log.warning("recovery %s", message)
                    self.recovery_report.append(message)
                    later.delete()
                del self.segments[index + 1 :]
                break
            previous_end = segment.next_offset if segment.size else previous_end
        for segment in self.segments[start_index:]:
            segment.txn_index.truncate_to(segment.next_offset if segment.size else segment.base_offset)
        # A segment emptied by truncation keeps its base offset as next offset.
        for segment in self.segments:
            if segment.size == 0:
                segment.next_offset = segment.base_offset

    def _segment_created_ms(self, segment: LogSegment) -> int:
        try:
            return int(os.stat(segment.log_path).st_mtime * 1000) if segment.size == 0 else self.clock()
        except FileNotFoundError:
            return self.clock()

    # ------------------------------------------------------------------ checkpoints

    def _read_checkpoint(self) -> tuple[int, int]:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        recovery_point, log_start = 0, 0
        try:
            with open(path, encoding="ascii") as file:
                for line in file:
                    key, _, value = line.strip().partition(" ")
                    if key == "recovery-point":
                        recovery_point = int(value)
                    elif key == "log-start-offset":
                        log_start = int(value)
        except (FileNotFoundError, ValueError):
            pass
        return recovery_point, log_start

    def _write_checkpoint(self) -> None:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="ascii") as file:
            file.write(f"recovery-point {self.recovery_point}\nlog-start-offset {self.log_start_offset}\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        _fsync_dir(self.directory)

    # ------------------------------------------------------------------ producer state

    def _snapshot_offsets(self) -> list[int]:
        return sorted(
            int(name[: -len(SNAPSHOT_SUFFIX)])
            for name in os.listdir(self.directory)
            if name.endswith(SNAPSHOT_SUFFIX) and name[: -len(SNAPSHOT_SUFFIX)].isdigit()
        )

    def _rebuild_producer_state(self, clean: bool) -> None:
        state = None
        for offset in reversed(self._snapshot_offsets()):
            path = os.path.join(self.directory, file_stem(offset) + SNAPSHOT_SUFFIX)
            if offset > self.log_end_offset:
                os.remove(path)  # describes data that recovery removed
                continue
            try:
                with open(path, "rb") as file:
                    state = ProducerStateManager.from_snapshot(file.read(), offset)
                break
            except (OSError, CorruptSnapshotError) as error:
                log.warning("ignoring producer snapshot %s: %s", path, error)
                os.remove(path)
        if state is None:
            state = ProducerStateManager()
            state.map_end_offset = self.log_start_offset
        self.producer_state = state
        self._replay_producer_state(state.map_end_offset)

    def _replay_producer_state(self, from_offset: int) -> None:
        state = self.producer_state
        for segment in self.segments:
            if segment.next_offset <= from_offset or segment.size == 0:
                continue
            found = segment.find_position(from_offset)
            if found is None:
                continue
            for position, header in segment.iter_headers(found[0]):
                if header.last_offset < from_offset or header.producer_id < 0:
                    continue
                if header.is_control:
                    batch = decode_batch(segment.read_at(position, header.size))
                    marker = decode_control_record(batch.records[0])
                    completed = state.apply_marker(
                        header.producer_id, header.producer_epoch, marker.coordinator_epoch, marker.type, header.base_offset, header.max_timestamp
                    )
                    if completed is not None and completed.is_aborted:
                        self._ensure_aborted_indexed(segment, completed)
                else:
                    change = ProducerAppend(
                        header.producer_id,
                        header.producer_epoch,
                        header.base_sequence,
                        header.last_sequence,
                        header.is_transactional,
                        header.max_timestamp,
                        header.last_offset_delta,
                    )
                    state.apply_append(change, header.base_offset, header.last_offset)
        state.map_end_offset = self.log_end_offset

    def _ensure_aborted_indexed(self, segment: LogSegment, completed) -> None:
        """Replay found an ABORT marker: make sure the segment's .txnindex has it
        (the entry may have been lost with the page cache in a machine crash)."""
        if any(entry.last_offset == completed.last_offset for entry in segment.txn_index.entries):
            return
        unstable = self.producer_state.first_unstable_offset()
        segment.txn_index.append(
            AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset, unstable if unstable is not None else completed.last_offset + 1)
        )

    def take_snapshot(self) -> None:
        offset = self.log_end_offset
        path = os.path.join(self.directory, file_stem(offset) + SNAPSHOT_SUFFIX)
        data = self.producer_state.snapshot_bytes()
        temporary = path + ".tmp"
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        # Keep the two newest snapshots.
        for old in self._snapshot_offsets()[:-2]:
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

    def append(self, data, *, assign_offsets: bool = True) -> AppendInfo:
        """Append client batches (one or more, concatenated). Validates CRCs,
        checks producer state, assigns offsets in place, writes.

        Raises CorruptRecordError, a ProducerStateError, RecordTooLargeError or
        LogFailedError; nothing is written in any of those cases."""
        self._check_writable()
        buffer = bytearray(data)
        headers = list(iter_batches(buffer))
        if not headers:
            raise CorruptRecordError("no record batches to append")
        producer_changes: list[tuple[ProducerAppend | None, int]] = []
        next_offset = self.log_end_offset
        first_offset = next_offset
        max_timestamp = -1
        for position, header in headers:
            if header.size > self.config.max_message_bytes:
                raise RecordTooLargeError(f"batch of {header.size} bytes exceeds max.message.bytes={self.config.max_message_bytes}")
            change = self.producer_state.check_append(header)
            if isinstance(change, DuplicateBatch):
                if len(headers) == 1:
                    return AppendInfo(change.first_offset, change.last_offset, change.timestamp, duplicate=True)
                raise CorruptRecordError("a duplicate batch inside a multi-batch request")
            if assign_offsets:
                set_base_offset(buffer, position, next_offset, 0)
            else:
                next_offset = header.base_offset
            producer_changes.append((change, next_offset))
            max_timestamp = max(max_timestamp, header.max_timestamp)
            next_offset += header.last_offset_delta + 1
        if not assign_offsets:
            first_offset = headers[0][1].base_offset
            if first_offset < self.log_end_offset:
                raise ValueError(f"offset {first_offset} is below the log end {self.log_end_offset}")
        last_offset = next_offset - 1
        self._maybe_roll(len(buffer), first_offset, last_offset, max_timestamp)
        base_offsets = [offset for _change, offset in producer_changes]
        segment = self.active_segment
        try:
            segment.append(buffer, headers, base_offsets)
        except OSError as error:
            self._fail(error)
            raise LogFailedError(f"write to {segment.log_path} failed: {error}") from error
        for (change, offset), (_position, header) in zip(producer_changes, headers):
            if change is not None:
                self.producer_state.apply_append(change, offset, offset + header.last_offset_delta)
        self.log_end_offset = last_offset + 1
        self._after_write(segment)
        return AppendInfo(first_offset, last_offset, max_timestamp)

    def append_control(self, data, *, coordinator_epoch: int) -> tuple[AppendInfo, AbortedTxn | None]:
        """Append one COMMIT/ABORT marker batch (written by the transaction coordinator)."""
        self._check_writable()
        buffer = bytearray(data)
        _position, header = next(iter_batches(buffer))
        if not header.is_control:
            raise ValueError("append_control needs a control batch")
        marker = decode_control_record(decode_batch(buffer).records[0])
        self.producer_state.check_marker(header.producer_id, header.producer_epoch, coordinator_epoch)
        offset = self.log_end_offset
        set_base_offset(buffer, 0, offset, 0)
        self._maybe_roll(len(buffer), offset, offset, header.max_timestamp)
        segment = self.active_segment
        try:
            segment.append(buffer, [(0, header)], [offset])
        except OSError as error:
            self._fail(error)
            raise LogFailedError(f"write to {segment.log_path} failed: {error}") from error
        completed = self.producer_state.apply_marker(header.producer_id, header.producer_epoch, coordinator_epoch, marker.type, offset, header.max_timestamp)
        self.log_end_offset = offset + 1
        aborted = None
        if completed is not None and completed.is_aborted:
            unstable = self.producer_state.first_unstable_offset()
            aborted = AbortedTxn(completed.producer_id, completed.first_offset, offset, unstable if unstable is not None else offset + 1)
            segment.txn_index.append(aborted)
        self._after_write(segment)
        return AppendInfo(offset, offset, header.max_timestamp), aborted

    def _maybe_roll(self, size: int, first_offset: int, last_offset: int, max_timestamp: int) -> None:
        segment = self.active_segment
        if segment.size == 0:
            if segment.base_offset != first_offset and not segment.offset_index and first_offset >= segment.base_offset:
                # An empty active segment whose base is behind the log end (after
                # DeleteRecords or truncation): re-base it so names match content.
                self._replace_empty_active(first_offset)
            return
        reasons = []
        if segment.size + size > self.config.segment_bytes:
            reasons.append("segment.bytes")
        if segment.created_ms is not None and self.clock() - segment.created_ms >= self.config.segment_ms:
            reasons.append("segment.ms")
        if len(segment.offset_index) >= self.config.max_index_entries or len(segment.time_index) >= self.config.segment_index_bytes // 12:
            reasons.append("index full")
        if last_offset - segment.base_offset > INT32_MAX:
            reasons.append("offset overflow")
        if reasons:
            self.roll(first_offset)

    def _replace_empty_active(self, base_offset: int) -> None:
        old = self.segments.pop()
        old.delete()
        segment = LogSegment(self.directory, base_offset, self.io, index_interval_bytes=self.config.index_interval_bytes)
        segment.created_ms = self.clock()
        self.segments.append(segment)

    def roll(self, next_base: int | None = None) -> LogSegment:
        base = self.log_end_offset if next_base is None else next_base
        old = self.active_segment
        old.flush_indexes()
        if old not in self._unflushed and old.size:
            self._unflushed.append(old)
        segment = LogSegment(self.directory, base, self.io, index_interval_bytes=self.config.index_interval_bytes)
        segment.created_ms = self.clock()
        self.segments.append(segment)
        _fsync_dir(self.directory)
        try:
            self.take_snapshot()
        except OSError as error:
            log.warning("producer snapshot at roll failed: %s", error)
        return segment

    def _after_write(self, segment: LogSegment) -> None:
        if segment not in self._unflushed:
            self._unflushed.append(segment)
        if self.config.flush_policy == FLUSH_OS:
            self.durable_offset = self.log_end_offset
            self._release_waiters()
            return
        self._schedule_flush()

    # ------------------------------------------------------------------ durability

    def _schedule_flush(self) -> None:
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not under asyncio (tools, benchmarks): fsync now, synchronously.
            self.flush()
            return
        self._flush_scheduled = True
        if self.config.flush_policy == FLUSH_ALWAYS:
            delay = 0.0
        else:
            # At most one fsync per interval, but no waiting when the last one
            # is older than that: sparse writes (a transaction's few records)
            # are acknowledged at fsync speed, busy logs share fsyncs.
            delay = max(0.0, self._last_flush + self.config.flush_interval_ms / 1000.0 - loop.time())
        self._flush_task = loop.create_task(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            while self._flush_scheduled:
                target = self.log_end_offset
                segments = list(self._unflushed)
                self._unflushed.clear()
                self._flush_scheduled = False
                loop = asyncio.get_running_loop()
                try:
                    for segment in segments:
                        if not segment.closed:
                            await loop.run_in_executor(None, segment.fsync)
                except OSError as error:
                    self._fail(error)
                    return
                if self.failed is not None:
                    return
                self._last_flush = loop.time()
                self.durable_offset = max(self.durable_offset, target)
                self._release_waiters()
                if self._unflushed and self.config.flush_policy == FLUSH_ALWAYS:
                    self._flush_scheduled = True  # appends that came during the fsync
        finally:
            self._flush_task = None

    def flush(self) -> None:
        """fsync everything written so far, synchronously."""
        if self.failed is not None or self.closed:
            return
        target = self.log_end_offset
        segments = list(self._unflushed)
        self._unflushed.clear()
        try:
            for segment in segments:
                if not segment.closed:
                    segment.fsync()
        except OSError as error:
            self._fail(error)
            raise LogFailedError(f"fsync failed: {error}") from error
        self.durable_offset = max(self.durable_offset, target)
        self._release_waiters()

    def _fail(self, error: Exception) -> None:
        log.error("log %s failed: %s; refusing appends until it is reopened", self.directory, error)
        self.failed = error
        for _offset, future in self._waiters:
            if not future.done():
                future.set_exception(LogFailedError(f"not durable: {error}"))
        self._waiters.clear()

    def _release_waiters(self) -> None:
        if not self._waiters:
            return
        remaining = []
        for offset, future in self._waiters:
            if offset < self.durable_offset:
                if not future.done():
                    future.set_result(None)
            else:
                remaining.append((offset, future))
        self._waiters = remaining

    def wait_durable(self, offset: int) -> asyncio.Future:
        """A future that completes when ``offset`` is durable (fails if it never will be)."""
        future = asyncio.get_running_loop().create_future()
        if self.failed is not None:
            future.set_exception(LogFailedError(f"not durable: {self.failed}"))
        elif offset < self.durable_offset:
            future.set_result(None)
        else:
            self._waiters.append((offset, future))
        return future

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
        """(offset, timestamp) of the first record with timestamp >= ``timestamp``."""
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            header = segment.first_batch_at_or_after_timestamp(timestamp)
            if header is None:
                continue
            found = segment.find_position(header.base_offset)
            batch = decode_batch(segment.read_at(found[0], header.size))
            for record in batch.records:
                if record.timestamp >= timestamp and record.offset >= self.log_start_offset:
                    return record.offset, record.timestamp
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
        self.log_start_offset = offset
        self._write_checkpoint()
        self._delete_segments_below(offset)
        self.producer_state.truncate_head(offset)
        return self.log_start_offset

    def _delete_segments_below(self, offset: int) -> None:
        while len(self.segments) > 1 and self.segments[1].base_offset <= offset:
            self._delete_oldest_segment()

    def _delete_oldest_segment(self) -> None:
        segment = self.segments.pop(0)
        if segment in self._unflushed:
            self._unflushed.remove(segment)
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

    def close(self) -> None:
        """Flush, snapshot producer state, checkpoint, mark the shutdown clean."""
        if self.closed:
            return
        clean = self.failed is None
        if clean:
            try:
                self.flush()
                for segment in self.segments:
                    segment.flush_indexes(fsync=True)
                self.recovery_point = self.log_end_offset
                self.take_snapshot()
                self._write_checkpoint()
            except OSError as error:
                log.error("closing %s uncleanly: %s", self.directory, error)
                clean = False
        if self._flush_task is not None:
            self._flush_task.cancel()
        for segment in self.segments:
            try:
                segment.close()
            except OSError:
                clean = False
        if clean:
            path = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
            with open(path, "w") as file:
                file.flush()
                os.fsync(file.fileno())
            _fsync_dir(self.directory)
        for _offset, future in self._waiters:
            if not future.done():
                future.set_exception(LogFailedError("log closed"))
        self._waiters.clear()
        self.closed = True


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
