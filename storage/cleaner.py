"""Log compaction (``cleanup.policy=compact``): keep the last value of every key.

One cleaning pass over a partition log:

1. Choose the cleanable range: every segment before the active one that lies
   wholly below the last stable offset (open transactions are never cleaned).
2. Build the offset map: key -> offset of its latest record in that range,
   skipping records of aborted transactions (they must never win over a
   committed value).
3. Rewrite each cleanable segment into ``<base>.log.cleaned`` (+ indexes):
   a record survives if it is the latest for its key; a tombstone (null
   value) survives until its batch's delete horizon (set to now +
   ``delete.retention.ms`` the first time the cleaner sees it) has passed;
   records of aborted transactions are dropped. Batch headers are kept as
   Kafka keeps them: same base offset, last offset delta, producer id, epoch,
   base sequence, transactional and control bits, compression codec; a batch
   left with no records is kept as an empty batch when it is its producer's
   last one (so idempotence state survives), dropped otherwise. Control
   batches are always kept. Offsets never change.
4. Swap, crash-safely, the way Kafka does. Files of a segment are renamed
   indexes first and the ``.log`` last, so the ``.log`` file's name tells
   where a swap stands:
   a. write and fsync the four ``.cleaned`` files (``.log``, ``.index``,
      ``.timeindex``, ``.txnindex``) and a ``<base>.swap.range`` note naming
      the segment they replace;
   b. rename each ``.cleaned`` -> ``.swap``, fsync the directory; the
      ``.log.swap`` rename is the point of no return;
   c. rename the old segment's files to ``.deleted``;
   d. rename each ``.swap`` -> its live name (``.log`` last), remove the note
      and the ``.deleted`` files, fsync the directory.

``complete_interrupted_swaps()`` runs before a log opens. For a note whose
``<base>.log.swap`` exists the swap is past its point of no return: every
remaining ``.swap`` file replaces its live file (all four exist until step d
moves them, index files before the log). Otherwise the swap either never
reached it (the old files are intact) or finished: leftover ``.cleaned``,
``.swap`` and ``.deleted`` files are removed. Either way each segment is
exactly its before or its after.
"""

from __future__ import annotations

import logging
import os

from protocol.records import decode_batch, encode_batch, read_batch_header
from storage.durable import fsync_directory, replace_file
from storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    file_stem,
)
from storage.txn_index import TransactionIndex

log = logging.getLogger(__name__)

RANGE_NOTE_SUFFIX = ".swap.range"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
# Rename order in a swap: the .log last, so that "<base>.log.swap exists"
# means every other file of the swap is a .swap (or already in place).
SWAP_ORDER = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)


def _no_crash(stage: str) -> None:
    return None


def complete_interrupted_swaps(directory: str) -> None:
    names = os.listdir(directory)
    if not any(name.endswith((RANGE_NOTE_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)) for name in names):
        return  # nothing was interrupted (every open but after a crash mid-compaction)
    for name in names:
        if not name.endswith(RANGE_NOTE_SUFFIX):
            continue
        stem = name[: -len(RANGE_NOTE_SUFFIX)]
        if os.path.exists(os.path.join(directory, stem + LOG_SUFFIX + SWAP_SUFFIX)):
            for suffix in SWAP_ORDER:
                swapped = os.path.join(directory, stem + suffix + SWAP_SUFFIX)
                if os.path.exists(swapped):
                    os.replace(swapped, os.path.join(directory, stem + suffix))
            fsync_directory(directory)
            log.warning("finished an interrupted compaction swap of segment %s in %s", stem, directory)
        else:
            log.warning("rolled back (or tidied) an interrupted compaction of segment %s in %s", stem, directory)
    # Whatever is left is from before a point of no return, or after a swap
    # completed: the live files are right either way. The note goes last.
    for name in os.listdir(directory):
        if name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)):
            os.remove(os.path.join(directory, name))
    for name in os.listdir(directory):
        if name.endswith(RANGE_NOTE_SUFFIX):
            os.remove(os.path.join(directory, name))
    fsync_directory(directory)


class Cleaner:
    def __init__(self, partition_log, *, crash_point=_no_crash):
        self.log = partition_log
        self.crash_point = crash_point

    def cleanable_segments(self) -> list[LogSegment]:
        limit = self.log.last_stable_offset
        return [s for s in self.log.segments[:-1] if s.size and s.next_offset <= limit]

    def _aborted_ranges(self) -> dict[int, list[tuple[int, int]]]:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for segment in self.log.segments:
            for entry in segment.txn_index.entries:
                ranges.setdefault(entry.producer_id, []).append((entry.first_offset, entry.last_offset))
        return ranges

    @staticmethod
    def _is_aborted(ranges, producer_id: int, offset: int) -> bool:
        return any(first <= offset <= last for first, last in ranges.get(producer_id, ()))

    def build_offset_map(self, segments: list[LogSegment], aborted) -> dict[bytes, int]:
        offsets: dict[bytes, int] = {}
        for segment in segments:
            for position, header in segment.iter_headers():
                if header.is_control:
                    continue
                batch = decode_batch(segment.read_at(position, header.size))
                aborted_batch = header.is_transactional and self._is_aborted(aborted, header.producer_id, header.base_offset)
                if aborted_batch:
                    continue
                for record in batch.records:
                    if record.key is not None:
                        offsets[record.key] = record.offset
        return offsets

    def clean(self) -> int:
        """One pass; returns the number of bytes removed."""
        if not self.log.config.compact:
            return 0
        segments = self.cleanable_segments()
        if not segments:
            return 0
        self.log.begin_changes()
        aborted = self._aborted_ranges()
        offset_map = self.build_offset_map(segments, aborted)
        now = self.log.clock()
        last_batch_of_producer = {pid: entry.last_offset for pid, entry in self.log.producer_state.producers.items()}
        removed = 0
        for segment in segments:
            removed += self._clean_segment(segment, offset_map, aborted, now, last_batch_of_producer)
        return removed

    def _clean_segment(self, segment: LogSegment, offset_map, aborted, now: int, last_batch_of_producer) -> int:
        directory = self.log.directory
        stem = file_stem(segment.base_offset)
        for suffix in SEGMENT_SUFFIXES:  # left by an earlier pass that failed
            stale = os.path.join(directory, stem + suffix + CLEANED_SUFFIX)
            if os.path.exists(stale):
                os.remove(stale)
        cleaned = LogSegment(directory, segment.base_offset, segment.io, index_interval_bytes=segment.index_interval_bytes, index_budget=segment.index_budget, suffix=CLEANED_SUFFIX, rebuild_indexes=True)
        delete_retention = self.log.config.delete_retention_ms
        for position, header in segment.iter_headers():
            raw = segment.read_at(position, header.size)
            if header.is_control:
                cleaned.append(raw, [(0, header)])
                continue
            batch = decode_batch(raw)
            aborted_batch = header.is_transactional and self._is_aborted(aborted, header.producer_id, header.base_offset)
            horizon = header.delete_horizon_ms
            kept = []
            has_tombstone = False
            for record in batch.records:
                if aborted_batch:
                    continue
                superseded = record.key is not None and offset_map.get(record.key, -1) > record.offset
                if superseded:
                    continue
                if record.value is None:
                    if horizon is not None and now >= horizon:
                        continue
                    has_tombstone = True
                kept.append(record)
            if len(kept) == len(batch.records) and not (has_tombstone and horizon is None):
                cleaned.append(raw, [(0, header)])
                continue
            if not kept and last_batch_of_producer.get(header.producer_id) != header.last_offset:
                continue
            new_horizon = horizon if horizon is not None else (now + delete_retention if has_tombstone else None)
            data = encode_batch(
                kept,
                base_offset=header.base_offset,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                is_transactional=header.is_transactional,
                compression=header.compression,
                timestamp_type=header.timestamp_type,
                partition_leader_epoch=header.partition_leader_epoch,
                delete_horizon_ms=new_horizon,
                base_timestamp=None if new_horizon is not None else header.base_timestamp,
                last_offset_delta=header.last_offset_delta,
                allow_empty=True,
            )
            cleaned.append(data, [(0, read_batch_header(data))])
        # Aborted transactions stay indexed while their markers remain.
        cleaned_txn = TransactionIndex(cleaned.txn_index.path, io=cleaned.io)
        # The swap note's directory fsync below covers its name.
        cleaned_txn.replace(segment.txn_index.entries, sync_directory=False)
        cleaned.fsync()
        cleaned.flush_indexes(fsync=True)
        removed = segment.size - cleaned.size
        cleaned.close()
        self.crash_point("cleaner.cleaned_written")

        note = os.path.join(directory, stem + RANGE_NOTE_SUFFIX)
        replace_file(note, f"{segment.base_offset}\n".encode("ascii"))
        self.crash_point("cleaner.note_written")
        committed = False  # past the point of no return (the .log.swap rename)
        try:
            for suffix in SWAP_ORDER:
                source = os.path.join(directory, stem + suffix + CLEANED_SUFFIX)
                os.replace(source, os.path.join(directory, stem + suffix + SWAP_SUFFIX))
                committed = suffix == LOG_SUFFIX
                self.crash_point(f"cleaner.swap_renamed{suffix}")
            fsync_directory(directory)
            self.crash_point("cleaner.swap_renamed")
            # Past the point of no return: replace the live segment.
            return self._replace(segment, stem, note, removed)
        except BaseException as error:
            if committed:
                # Half swapped: the files are right only after
                # complete_interrupted_swaps, which runs when the log is
                # reopened; until then it takes no appends.
                self.log.mark_failed(error if isinstance(error, Exception) else RuntimeError(repr(error)))
            raise

    def _replace(self, segment: LogSegment, stem: str, note: str, removed: int) -> int:
        directory = self.log.directory
        index = self.log.segments.index(segment)
        segment.close()
        for suffix in SEGMENT_SUFFIXES:
            live = os.path.join(directory, stem + suffix)
            if os.path.exists(live):
                os.replace(live, live + DELETED_SUFFIX)
                self.crash_point(f"cleaner.old_renamed{suffix}")
        self.crash_point("cleaner.old_renamed_deleted")
        for suffix in SWAP_ORDER:
            os.replace(os.path.join(directory, stem + suffix + SWAP_SUFFIX), os.path.join(directory, stem + suffix))
            self.crash_point(f"cleaner.live_renamed{suffix}")
        os.remove(note)
        self.crash_point("cleaner.note_removed")
        for suffix in SEGMENT_SUFFIXES:
            deleted = os.path.join(directory, stem + suffix + DELETED_SUFFIX)
            if os.path.exists(deleted):
                os.remove(deleted)
        fsync_directory(directory)
        replacement = LogSegment(directory, segment.base_offset, segment.io, index_interval_bytes=segment.index_interval_bytes, index_budget=segment.index_budget)
        if replacement.load_clean() is not None:
            replacement.recover()
        replacement.created_ms = segment.created_ms
        self.log.segments[index] = replacement
        self.log.committer.forget(segment)
        return removed
