"""Compaction keeps the last value per key, keeps offsets and batch headers,
removes tombstones after delete.retention.ms, and survives a crash at any
stage of its segment swap."""

from __future__ import annotations

import os
import shutil

import pytest

from protocol.records import Compression, ControlType, decode_batch, encode_batch, encode_control_batch, iter_batches
from storage.cleaner import Cleaner
from storage.config import LogConfig
from storage.log import LogFailedError, PartitionLog


def config(**overrides):
    values = {"segment_bytes": 600, "flush_policy": "os", "cleanup_policy": frozenset({"compact"}), "delete_retention_ms": 1000, "retention_ms": -1}
    values.update(overrides)
    return LogConfig(**values)


def records(partition_log):
    out = []
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, 1 << 30)
        if not data:
            break
        for position, header in iter_batches(data):
            batch = decode_batch(data, position)
            out.extend((batch.header, r) for r in batch.records)
            offset = header.next_offset
    return out


def write_history(partition_log):
    """keys a..e rewritten several times; 'c' deleted (tombstone)."""
    expected = {}
    for round_ in range(6):
        for key in b"abcde":
            key = bytes([key])
            value = b"%s-%d" % (key, round_)
            if key == b"c" and round_ == 4:
                value = None
            if key == b"c" and round_ == 5:
                continue
            info = partition_log.append(encode_batch([(key, value, (), 1000 + round_)], producer_id=7, producer_epoch=0, base_sequence=len(expected) and 0))
            expected[key] = (info.first_offset, value)
    return expected


def test_last_value_per_key_survives_with_offsets_unchanged(tmp_path):
    now = [10_000]
    partition_log = PartitionLog.open(str(tmp_path), config(), clock=lambda: now[0])
    for i in range(40):
        key = b"k%d" % (i % 5)
        partition_log.append(encode_batch([(key, b"v%d" % i, (), 1000 + i)]))
    before = {r.offset: r for _h, r in records(partition_log)}
    active_base = partition_log.active_segment.base_offset
    removed = Cleaner(partition_log).clean()
    assert removed > 0
    after = records(partition_log)
    for header, record in after:
        assert before[record.offset] == record, "offsets and contents never change"
    cleaned_keys = [r.key for _h, r in after if r.offset < active_base]
    assert len(cleaned_keys) == len(set(cleaned_keys)), "one value per key in the cleaned part"
    latest = {}
    for offset, record in sorted(before.items()):
        latest[record.key] = record
    final = {}
    for _h, record in after:
        final[record.key] = record
    assert final == latest, "the latest value of every key is kept"


def test_tombstones_stay_until_the_delete_horizon_then_go(tmp_path):
    now = [50_000]
    partition_log = PartitionLog.open(str(tmp_path), config(), clock=lambda: now[0])
    partition_log.append(encode_batch([(b"x", b"1", (), 1)]))
    partition_log.append(encode_batch([(b"x", None, (), 2)]))
    for i in range(20):
        partition_log.append(encode_batch([(b"y", b"%d" % i, (), 3 + i)]))
    Cleaner(partition_log).clean()
    kept = [(h, r) for h, r in records(partition_log) if r.key == b"x"]
    assert [r.value for _h, r in kept] == [None], "the tombstone is kept, the old value is not"
    assert kept[0][0].delete_horizon_ms == 51_000
    now[0] = 51_001
    Cleaner(partition_log).clean()
    assert [r for _h, r in records(partition_log) if r.key == b"x"] == []


def test_batch_headers_are_kept(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    for i in range(30):
        partition_log.append(encode_batch([(b"k", b"%d" % i, (), 1), (b"k%d" % i, b"x", (), 1)], producer_id=42, producer_epoch=3, base_sequence=2 * i))
    Cleaner(partition_log).clean()
    offset = 0
    data = partition_log.read(0, 1 << 30)
    seen = 0
    offset = 0
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, 1 << 30)
        for _position, header in iter_batches(data):
            assert (header.producer_id, header.producer_epoch) == (42, 3)
            assert header.base_sequence == header.base_offset, "sequence still matches the batch's original offsets"
            assert header.last_offset_delta == 1
            offset = header.next_offset
            seen += 1
    assert seen == 30


def test_aborted_transaction_never_wins_over_a_committed_value(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    partition_log.append(encode_batch([(b"k", b"committed", (), 1)]))
    partition_log.append(encode_batch([(b"k", b"aborted", (), 2)], producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True))
    partition_log.append_control(encode_control_batch(ControlType.ABORT, producer_id=5, producer_epoch=0, coordinator_epoch=0, timestamp=3), coordinator_epoch=0)
    for i in range(20):
        partition_log.append(encode_batch([(b"other", b"%d" % i, (), 4)]))
    Cleaner(partition_log).clean()
    values = [r.value for _h, r in records(partition_log) if r.key == b"k"]
    assert values == [b"committed"]
    markers = [h for h, _r in records(partition_log) if h.is_control]
    assert len(markers) == 1, "control batches are kept"


SWAP_STAGES = [
    "cleaner.cleaned_written",
    "cleaner.note_written",
    "cleaner.swap_renamed.index",
    "cleaner.swap_renamed.timeindex",
    "cleaner.swap_renamed.txnindex",
    "cleaner.swap_renamed.log",
    "cleaner.swap_renamed",
    "cleaner.old_renamed.log",
    "cleaner.old_renamed.index",
    "cleaner.old_renamed.timeindex",
    "cleaner.old_renamed_deleted",
    "cleaner.live_renamed.index",
    "cleaner.live_renamed.timeindex",
    "cleaner.live_renamed.txnindex",
    "cleaner.live_renamed.log",
    "cleaner.note_removed",
]


def rebuilt_index_files(directory) -> dict[str, bytes]:
    """The index files a full recovery scan builds from the .log files alone."""
    scratch = str(directory) + "-rebuilt"
    shutil.copytree(directory, scratch)
    for name in os.listdir(scratch):
        if name.endswith((".index", ".timeindex")) or name in ("checkpoint", ".clean_shutdown"):
            os.remove(os.path.join(scratch, name))
    PartitionLog.open(scratch, config()).close()
    return index_files(scratch)


def index_files(directory) -> dict[str, bytes]:
    return {
        name: open(os.path.join(directory, name), "rb").read()
        for name in sorted(os.listdir(directory))
        if name.endswith((".index", ".timeindex"))
    }


@pytest.mark.parametrize("restarted_before", [False, True], ids=["fresh", "after-clean-restart"])
@pytest.mark.parametrize("stage", SWAP_STAGES)
def test_crash_during_compaction_leaves_before_or_after(tmp_path, stage, restarted_before):
    directory = tmp_path / "log"
    partition_log = PartitionLog.open(str(directory), config())
    for i in range(40):
        partition_log.append(encode_batch([(b"k%d" % (i % 3), b"v%d" % i, (), 1000 + i)]))
    if restarted_before:
        # The recovery point is then past every segment: after the crash the
        # swapped segments are trusted, not rescanned, so their index files
        # must be right by themselves.
        partition_log.close()
        partition_log = PartitionLog.open(str(directory), config())
    partition_log.flush()
    before = records(partition_log)
    reference = PartitionLog.open(str(tmp_path / "reference"), config())
    for i in range(40):
        reference.append(encode_batch([(b"k%d" % (i % 3), b"v%d" % i, (), 1000 + i)]))
    Cleaner(reference).clean()
    after = records(reference)

    class Crash(Exception):
        pass

    def crash_point(name):
        if name == stage:
            raise Crash(name)

    with pytest.raises(Crash):
        Cleaner(partition_log, crash_point=crash_point).clean()
    # The process dies here: no close. Reopen from the files alone.
    for segment in partition_log.segments:
        if not segment.closed:
            segment.flush_indexes()
    reopened = PartitionLog.open(str(directory), config())
    result = records(reopened)
    # Each segment swaps atomically, so the log holds, segment by segment,
    # either the old records or the cleaned ones: every record is one it had
    # before, at its offset, and every record the full clean keeps is there.
    before_by_offset = {r.offset: r for _h, r in before}
    assert all(before_by_offset[r.offset] == r for _h, r in result)
    assert {r.offset for _h, r in after} <= {r.offset for _h, r in result}
    latest = lambda rows: {r.key: r.value for _h, r in rows}
    assert latest(result) == latest(before)
    leftovers = [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted", ".range"))]
    assert leftovers == []
    # Every segment's indexes match its .log, whichever state it is in.
    assert reopened.offset_for_timestamp(1039) == (39, 1039)
    reopened.close()
    assert index_files(directory) == rebuilt_index_files(directory)
    # A later clean still works and reaches the same result.
    reopened = PartitionLog.open(str(directory), config())
    Cleaner(reopened).clean()
    assert {r.key: r.value for _h, r in records(reopened)} == {r.key: r.value for _h, r in after}


def test_a_failure_past_the_point_of_no_return_stops_appends_until_reopened(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    for i in range(40):
        partition_log.append(encode_batch([(b"k%d" % (i % 3), b"v%d" % i, (), 1000 + i)]))

    def crash_point(name):
        if name == "cleaner.old_renamed_deleted":
            raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        Cleaner(partition_log, crash_point=crash_point).clean()
    with pytest.raises(LogFailedError):
        partition_log.append(encode_batch([(b"k", b"v", (), 2000)]))
    reopened = PartitionLog.open(str(tmp_path), config())
    assert reopened.append(encode_batch([(b"k", b"v", (), 2000)])).first_offset == 40


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD])
def test_compressed_batches_are_re_encoded_with_their_codec(tmp_path, codec):
    if codec != Compression.GZIP:
        pytest.importorskip("cramjam")
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=2000))
    for i in range(30):
        rows = [(b"k%d" % (j % 4), b"value-%d-%d" % (i, j) * 5, (), 1000 + i) for j in range(8)]
        partition_log.append(encode_batch(rows, compression=codec))
    before = {r.offset: r for _h, r in records(partition_log)}
    Cleaner(partition_log).clean()
    after = records(partition_log)
    active_base = partition_log.active_segment.base_offset
    for header, record in after:
        assert header.compression == codec
        assert before[record.offset] == record
    cleaned = [r.key for _h, r in after if r.offset < active_base]
    assert len(cleaned) == len(set(cleaned))


def test_emptied_batches_go_except_each_producers_last(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    # Producer 9 writes key "a" many times; producer -1 (no idempotence) too.
    for i in range(12):
        partition_log.append(encode_batch([(b"a", b"%d" % i, (), 1)], producer_id=9, producer_epoch=0, base_sequence=i))
        partition_log.append(encode_batch([(b"b", b"%d" % i, (), 1)]))
    partition_log.append(encode_batch([(b"a", b"final", (), 1)]))  # supersedes producer 9's last record
    for i in range(20):
        partition_log.append(encode_batch([(b"pad", b"%d" % i, (), 1)]))
    Cleaner(partition_log).clean()
    batches = []
    offset = 0
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, 1 << 30)
        for position, header in iter_batches(data):
            batches.append(decode_batch(data, position))
            offset = header.next_offset
    of_producer_9 = [b for b in batches if b.header.producer_id == 9]
    assert len(of_producer_9) == 1, "only the producer's last batch survives, emptied"
    assert of_producer_9[0].records == () and of_producer_9[0].header.base_sequence == 11
    assert partition_log.producer_state.producers[9].last_sequence == 11
    assert all(b.records for b in batches if b.header.producer_id != 9), "other emptied batches are dropped"
