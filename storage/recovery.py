"""Opening a partition directory after a stop, clean or not: the files that
say how far the log is known good, and the scan that makes it whole again.

This module owns:

- the ``checkpoint`` file: two ASCII lines, ``recovery-point <offset>`` and
  ``log-start-offset <offset>``, replaced atomically and durably
  (``storage.durable.replace_file``, as every file the log rewrites:
  snapshots, indexes). Everything below the recovery point is known durable
  with its indexes; it moves at open, at a clean close, and when the group
  committer has fsynced the segments below a roll. ``.clean_shutdown``
  (``CLEAN_SHUTDOWN_FILE``) is the empty file that vouches for the files:
  a clean close writes it last, an open that recovered writes it after the
  checkpoint, and the first change after an open removes it, durably,
  before it writes (``mark_clean``, ``unmark_clean``);
- leftovers of interrupted writes (``*.tmp``: the original is intact; index
  files whose ``.log`` is gone), removed at open;
- the segment scan (``recover_segments``): after an unclean stop every
  segment from the one holding the recovery point is scanned, each batch's
  CRC and offsets validated (increasing, never overlapping the previous
  segment), the first torn or corrupt batch truncated (any later segments
  deleted), the indexes of what was scanned rebuilt, and what was dropped
  logged at WARNING. After a clean shutdown the files are trusted once their
  indexes pass a sanity check (present, entries increasing, nothing past the
  end of the .log); a segment that fails it is scanned as after a crash, and
  so is everything after it;
- producer state at open (``rebuild_producer_state``): the newest valid
  ``<offset>.snapshot`` plus a replay of the log after it; a replayed ABORT
  marker missing from its segment's ``.txnindex`` is indexed again.

``storage.log.PartitionLog.open`` runs these in order. What the scan did is
counted on its report (``RecoveryReport``), and ``log_summary`` logs the
counts of every log a broker opened as one line at INFO.
"""

from __future__ import annotations

import bisect
import logging
import os
from typing import Callable, Iterable

from protocol.records import decode_batch, decode_control_record
from storage.durable import TEMPORARY_SUFFIX, fsync_directory, replace_file
from storage.producer_state import CorruptSnapshotError, ProducerAppend, ProducerStateManager
from storage.segment import CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LogSegment, file_stem
from storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
# Leftovers of an interrupted replace_file or compaction swap (storage.cleaner).
INTERRUPTED_SUFFIXES = (TEMPORARY_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX, ".swap.range")
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"


# ------------------------------------------------------------------ the checkpoint


def read_checkpoint(directory: str) -> tuple[int, int]:
    """(recovery point, log start offset); zeros when the file is missing or unreadable."""
    path = os.path.join(directory, CHECKPOINT_FILE)
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


def write_checkpoint(directory: str, recovery_point: int, log_start_offset: int, *, sync_directory: bool = True) -> None:
    text = f"recovery-point {recovery_point}\nlog-start-offset {log_start_offset}\n"
    replace_file(os.path.join(directory, CHECKPOINT_FILE), text.encode("ascii"), sync_directory=sync_directory)


# ------------------------------------------------------------------ the clean-shutdown mark


def is_marked_clean(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))


def needs_recovery(directory: str) -> bool:
    """Whether a partition directory was changed since it was last whole:
    no ``.clean_shutdown`` and data in a segment (a directory whose
    segments are all empty has nothing to recover, nor one that is missing).
    A broker opens these at start after a stop that was not clean; opening
    any other recovers it anyway if its mark is missing."""
    return not is_marked_clean(directory) and holds_data(directory)


def holds_data(directory: str) -> bool:
    """Whether a partition directory may hold records: a segment with data,
    or an interrupted write or compaction swap (whose files opening the log
    puts right). False (every segment empty, none at all, no directory)
    means opening the log would find it empty, whatever its offsets."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(LOG_SUFFIX):
                    if entry.stat().st_size:
                        return True
                elif entry.name.endswith(INTERRUPTED_SUFFIXES):
                    return True  # a write or a compaction swap was interrupted
    except FileNotFoundError:
        return False
    return False


def mark_clean(directory: str) -> None:
    """Create ``.clean_shutdown`` once everything it vouches for is durable.
    Its own creation needs no fsync: an empty file either exists or not, and
    if a machine crash loses it the directory is only recovered once more."""
    with open(os.path.join(directory, CLEAN_SHUTDOWN_FILE), "wb"):
        pass


def unmark_clean(directory: str) -> None:
    """Remove ``.clean_shutdown`` and make the removal durable before the
    caller changes any file: were the mark to survive a crash that the
    change did not, recovery would trust files it must scan."""
    try:
        os.remove(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    except FileNotFoundError:
        pass
    fsync_directory(directory)


# ------------------------------------------------------------------ segments


class RecoveryReport(list):
    """What recovery dropped, one line each (a list of lines, as
    ``PartitionLog.recovery_report`` has always been), with the counts the
    broker's startup summary adds up."""

    def __init__(self, lines: Iterable[str] = (), *, clean_shutdown: bool = True):
        super().__init__(lines)
        self.clean_shutdown = clean_shutdown
        self.segments_trusted = 0  # after a clean shutdown: indexes sanity-checked, batches not read
        self.segments_scanned = 0  # every batch's CRC and offsets checked
        self.bytes_truncated = 0
        self.segments_deleted = 0  # after the damage


def remove_leftovers(directory: str) -> None:
    """Temporary files of an interrupted write (``*.tmp``: the original
    is intact) and index files whose ``.log`` is gone (a crash while
    retention deleted the segment)."""
    names = os.listdir(directory)
    logs = {name[: -len(LOG_SUFFIX)] for name in names if name.endswith(LOG_SUFFIX)}
    for name in names:
        stem, _dot, suffix = name.partition(".")
        orphan = stem.isdigit() and "." + suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX) and stem not in logs
        if name.endswith(TEMPORARY_SUFFIX) or orphan:
            log.warning("removing leftover %s from %s", name, directory)
            os.remove(os.path.join(directory, name))


def segment_bases(directory: str) -> list[int]:
    return sorted(
        int(name[: -len(LOG_SUFFIX)])
        for name in os.listdir(directory)
        if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit()
    )


def recover_segments(directory: str, segments: list[LogSegment], recovery_point: int | None) -> list[str]:
    """Load trusted segments, scan the rest (``recovery_point`` None: trust
    all). A trusted segment whose files fail the sanity check is scanned,
    and so is everything after it. Segments after damage are deleted and
    removed from ``segments``. Returns what was dropped, one line each, and
    the counts (``RecoveryReport``)."""
    report = RecoveryReport(clean_shutdown=recovery_point is None)
    if recovery_point is None:
        start_index = len(segments)
    else:
        start_index = max(0, bisect.bisect_right([s.base_offset for s in segments], recovery_point) - 1)
    for index, segment in enumerate(segments[:start_index]):
        problem = segment.load_clean()
        if problem is not None:
            message = f"{directory}: {problem}; rebuilding from {os.path.basename(segment.log_path)} on"
            log.warning("recovery %s", message)
            report.append(message)
            start_index = index
            break
        report.segments_trusted += 1
    previous_end = segments[start_index - 1].next_offset if start_index else None
    for index in range(start_index, len(segments)):
        segment = segments[index]
        truncated, reason = segment.recover(expected_start=previous_end)
        report.segments_scanned += 1
        if truncated:
            report.bytes_truncated += truncated
            message = f"{directory}: dropped {truncated} bytes of {os.path.basename(segment.log_path)} from position {segment.size}: {reason}"
            log.warning("recovery %s", message)
            report.append(message)
            for later in segments[index + 1 :]:
                message = f"{directory}: deleted segment {os.path.basename(later.log_path)} ({later.size} bytes) after the damage"
                log.warning("recovery %s", message)
                report.append(message)
                report.segments_deleted += 1
                later.delete()
            del segments[index + 1 :]
            break
        previous_end = segment.next_offset if segment.size else previous_end
    for segment in segments[start_index:]:
        segment.txn_index.truncate_to(segment.next_offset if segment.size else segment.base_offset)
    # A segment emptied by truncation keeps its base offset as next offset.
    for segment in segments:
        if segment.size == 0:
            segment.next_offset = segment.base_offset
    # What the scan kept may have been only in the page cache (a process
    # crash): make it durable before the recovery point and the high
    # watermark move past it.
    for segment in segments[start_index:]:
        if not segment.size:
            continue
        segment.fsync()
        segment.flush_indexes(fsync=True)
        segment.txn_index.fsync()
    return report


def segment_created_ms(segment: LogSegment, clock: Callable[[], int]) -> int:
    """When a segment was rolled, as far as the disk tells: an empty one's
    file time, else now (retention then counts from its max timestamp)."""
    try:
        return int(os.stat(segment.log_path).st_mtime * 1000) if segment.size == 0 else clock()
    except FileNotFoundError:
        return clock()


# ------------------------------------------------------------------ producer state


def snapshot_offsets(directory: str) -> list[int]:
    return sorted(
        int(name[: -len(SNAPSHOT_SUFFIX)])
        for name in os.listdir(directory)
        if name.endswith(SNAPSHOT_SUFFIX) and name[: -len(SNAPSHOT_SUFFIX)].isdigit()
    )


def rebuild_producer_state(directory: str, segments: list[LogSegment], log_start_offset: int, log_end_offset: int) -> ProducerStateManager:
    """The newest valid snapshot at or below the log end (newer ones describe
    data recovery removed, and go), then the log replayed after it."""
    state = None
    for offset in reversed(snapshot_offsets(directory)):
        path = os.path.join(directory, file_stem(offset) + SNAPSHOT_SUFFIX)
        if offset > log_end_offset:
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
        state.map_end_offset = log_start_offset
    replay_producer_state(state, segments, state.map_end_offset, log_end_offset)
    return state


def replay_producer_state(state: ProducerStateManager, segments: list[LogSegment], from_offset: int, log_end_offset: int) -> None:
    for segment in segments:
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
                    _ensure_aborted_indexed(state, segment, completed)
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
    state.map_end_offset = log_end_offset


def _ensure_aborted_indexed(state: ProducerStateManager, segment: LogSegment, completed) -> None:
    """Replay found an ABORT marker: make sure the segment's .txnindex has it
    (the entry may have been lost with the page cache in a machine crash)."""
    if any(entry.last_offset == completed.last_offset for entry in segment.txn_index.entries):
        return
    unstable = state.first_unstable_offset()
    segment.txn_index.append(
        AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset, unstable if unstable is not None else completed.last_offset + 1),
        fsync=True,  # the log is marked clean next: replay will not come this way again
    )


# ------------------------------------------------------------------ the startup summary


def log_summary(partition_logs: Iterable) -> dict:
    """Log one INFO line of what opening ``partition_logs`` (``PartitionLog``s,
    just opened) found and did, with the counts as fields; returns them."""
    counts = {"partitions": 0, "unclean": 0, "segments_checked": 0, "segments_scanned": 0, "bytes_truncated": 0, "segments_deleted": 0, "producer_states": 0, "open_transactions": 0}
    for partition_log in partition_logs:
        report = getattr(partition_log, "recovery_report", None)
        counts["partitions"] += 1
        if isinstance(report, RecoveryReport):
            counts["unclean"] += not report.clean_shutdown
            counts["segments_checked"] += report.segments_trusted + report.segments_scanned
            counts["segments_scanned"] += report.segments_scanned
            counts["bytes_truncated"] += report.bytes_truncated
            counts["segments_deleted"] += report.segments_deleted
        producer_state = getattr(partition_log, "producer_state", None)
        if producer_state is not None:
            counts["producer_states"] += len(producer_state.producers)
            counts["open_transactions"] += len(producer_state.ongoing)
    log.info(
        "recovery: opened %(partitions)d partition logs (%(unclean)d after an unclean stop): %(segments_checked)d segments checked "
        "(%(segments_scanned)d scanned batch by batch), %(bytes_truncated)d bytes truncated, %(segments_deleted)d segments deleted, "
        "%(producer_states)d producer states loaded, %(open_transactions)d transactions open in the logs",
        counts,
        extra={"event": "log_recovery", **counts},
    )
    return counts
