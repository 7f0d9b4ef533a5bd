"""The partition log on real files: appends, reads, rolls, recovery from torn
and corrupt files, durability failures, retention and DeleteRecords."""

from __future__ import annotations

import asyncio
import errno
import logging
import os

import pytest

from protocol.records import decode_batch, encode_batch, iter_batches, read_batch_header
from storage import recovery
from storage.config import LogConfig
from storage.log import LogFailedError, OffsetOutOfRangeError, PartitionLog
from storage.segment import DiskIO


def batch(i: int, records: int = 3, size: int = 40, ts: int | None = None) -> bytes:
    timestamp = 1_000_000 + i if ts is None else ts
    return encode_batch([(b"key-%d" % i, b"v" * size, (), timestamp) for _ in range(records)])


def fill(partition_log: PartitionLog, count: int, records: int = 3) -> list[int]:
    firsts = []
    for i in range(count):
        firsts.append(partition_log.append(batch(i, records)).first_offset)
    return firsts


def small_config(**overrides) -> LogConfig:
    values = {"segment_bytes": 1500, "index_interval_bytes": 300, "flush_policy": "os"}
    values.update(overrides)
    return LogConfig(**values)


def all_batches(partition_log: PartitionLog) -> list:
    data = partition_log.read(partition_log.log_start_offset, 1 << 30)
    out = []
    offset = partition_log.log_start_offset
    while offset < partition_log.high_watermark:
        data = partition_log.read(offset, 1 << 30)
        if not data:
            break
        for position, header in iter_batches(data):
            out.append(decode_batch(data, position))
            offset = header.next_offset
    return out


def index_files(directory: str) -> dict[str, bytes]:
    files = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".index", ".timeindex")):
            with open(os.path.join(directory, name), "rb") as file:
                files[name] = file.read()
    return files


def test_append_assigns_offsets_and_read_finds_every_offset(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    firsts = fill(partition_log, 60)
    assert firsts == [3 * i for i in range(60)]
    assert len(partition_log.segments) > 5, "small segment.bytes must roll"
    for offset in range(0, 180):
        data = partition_log.read(offset, 1)  # max_bytes 1: still one whole batch
        header = read_batch_header(data)
        assert header.base_offset <= offset <= header.last_offset
        assert len(data) == header.size
    assert partition_log.read(180, 1000) == b""
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(181, 1000)
    batches = all_batches(partition_log)
    assert [r.offset for b in batches for r in b.records] == list(range(180))


def test_segment_files_are_named_by_base_offset(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    fill(partition_log, 30)
    logs = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))
    assert logs[0] == "00000000000000000000.log"
    for segment, name in zip(partition_log.segments, logs):
        assert name == f"{segment.base_offset:020d}.log"


def test_read_respects_max_bytes_and_max_offset(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20))
    fill(partition_log, 10)
    one = len(batch(0))
    assert len(partition_log.read(0, one * 3 + 5)) == one * 3
    assert len(partition_log.read(0, 10 ** 6, max_offset=6)) == one * 2


def test_offset_for_timestamp(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    for i in range(40):
        partition_log.append(batch(i, ts=10_000 + 10 * i))
    assert partition_log.offset_for_timestamp(10_000) == (0, 10_000)
    assert partition_log.offset_for_timestamp(10_205) == (63, 10_210)
    assert partition_log.offset_for_timestamp(99_999) is None


def test_clean_restart_keeps_everything(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    fill(partition_log, 50)
    before = all_batches(partition_log)
    partition_log.close()
    indexes = index_files(str(tmp_path))
    assert os.path.exists(tmp_path / ".clean_shutdown")
    reopened = PartitionLog.open(str(tmp_path), small_config())
    assert all_batches(reopened) == before
    assert reopened.recovery_report == []
    assert index_files(str(tmp_path)) == indexes
    # Only read: the files are still as the clean close left them.
    assert os.path.exists(tmp_path / ".clean_shutdown")
    reopened.append(batch(99))
    assert not os.path.exists(tmp_path / ".clean_shutdown"), "the first change removes the mark"


class MarkWatchingIO(DiskIO):
    """Records, at every write to a .log file, whether .clean_shutdown was still there."""

    def __init__(self, directory):
        self.mark = os.path.join(directory, ".clean_shutdown")
        self.log_fds: set[int] = set()
        self.marked_at_write: list[bool] = []

    def open(self, path, flags):
        fd = super().open(path, flags)
        if path.endswith(".log"):
            self.log_fds.add(fd)
        return fd

    def write(self, fd, data):
        if fd in self.log_fds:
            self.marked_at_write.append(os.path.exists(self.mark))
        super().write(fd, data)


def test_a_log_only_read_needs_no_recovery_after_a_crash_and_a_changed_one_does(tmp_path, monkeypatch):
    from storage.segment import LogSegment

    scans = []
    real_recover = LogSegment.recover
    monkeypatch.setattr(LogSegment, "recover", lambda segment, **kw: scans.append(segment.base_offset) or real_recover(segment, **kw))
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    fill(partition_log, 20)
    partition_log.close()
    checkpoint = (tmp_path / "checkpoint").read_bytes()
    # Opened, read, then the process dies (no close): nothing to recover.
    reader = PartitionLog.open(str(tmp_path), small_config())
    before = all_batches(reader)
    _crash_copy(reader)
    scans.clear()
    reopened = PartitionLog.open(str(tmp_path), small_config())
    assert scans == [], "a log that was only read is trusted as a clean one"
    assert all_batches(reopened) == before
    assert (tmp_path / "checkpoint").read_bytes() == checkpoint, "opening a clean log rewrites nothing"
    # Changed, then the process dies with a torn tail: scanned and cut back.
    io = MarkWatchingIO(str(tmp_path))
    writer = PartitionLog.open(str(tmp_path), small_config(), io=io)
    end = writer.log_end_offset
    writer.append(batch(50))
    writer.append(batch(51))
    assert io.marked_at_write == [False, False], "the mark is gone before the first byte is written"
    _crash_copy(writer)
    active = writer.segments[-1].log_path
    os.truncate(active, os.path.getsize(active) - 5)
    scans.clear()
    recovered = PartitionLog.open(str(tmp_path), small_config())
    assert scans, "a changed log is scanned from its recovery point"
    assert recovered.log_end_offset == end + 3
    assert [r.offset for b in all_batches(recovered) for r in b.records] == list(range(end + 3))
    # Recovery leaves it whole and marked: the next crash costs no scan.
    assert os.path.exists(tmp_path / ".clean_shutdown")
    _crash_copy(recovered)
    scans.clear()
    assert PartitionLog.open(str(tmp_path), small_config()).log_end_offset == end + 3
    assert scans == []


def _crash_copy(partition_log: PartitionLog) -> None:
    """Simulate SIGKILL: flush what the OS would have, but no clean close."""
    for segment in partition_log.segments:
        segment.flush_indexes()


@pytest.mark.slow
def test_torn_tail_at_every_byte_of_the_last_batch(tmp_path):
    source = tmp_path / "source"
    partition_log = PartitionLog.open(str(source), small_config(segment_bytes=1 << 20))
    fill(partition_log, 8)
    last_size = len(batch(7))
    _crash_copy(partition_log)
    log_file = source / "00000000000000000000.log"
    full = log_file.read_bytes()
    for cut in range(1, last_size + 1):
        target = tmp_path / f"cut{cut}"
        target.mkdir()
        for name in os.listdir(source):
            if not name.startswith("."):
                (target / name).write_bytes((source / name).read_bytes())
        (target / "00000000000000000000.log").write_bytes(full[: len(full) - cut])
        recovered = PartitionLog.open(str(target), small_config(segment_bytes=1 << 20))
        offsets = [r.offset for b in all_batches(recovered) for r in b.records]
        assert offsets == list(range(21)), f"cut {cut}: every earlier batch, nothing after"
        assert recovered.log_end_offset == 21
        assert os.path.getsize(target / "00000000000000000000.log") == len(full) - last_size
        assert bool(recovered.recovery_report) == (cut < last_size), "a partial batch is reported"
        # New appends continue cleanly after the truncation point.
        assert recovered.append(batch(99)).first_offset == 21
        recovered.close()


def test_flipped_byte_in_an_earlier_segment_truncates_there(tmp_path, caplog):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    fill(partition_log, 40)
    _crash_copy(partition_log)
    # Every roll moved the recovery point (segments below it are trusted,
    # not scanned, as Kafka trusts them); scan from the start, as after a
    # crash before the first roll was made durable.
    recovery.write_checkpoint(str(tmp_path), 0, 0)
    segments = [(s.base_offset, s.log_path) for s in partition_log.segments]
    assert len(segments) >= 4
    damaged_base, damaged_path = segments[1]
    data = bytearray(open(damaged_path, "rb").read())
    one = len(batch(0))
    data[one + 30] ^= 0x55  # inside the second batch of segment 1
    open(damaged_path, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING, logger="storage.log"):
        recovered = PartitionLog.open(str(tmp_path), small_config())
    dropped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.getMessage()]
    assert len(dropped) == 1 and f"position {one}" in dropped[0] and "crc" in dropped[0], dropped
    assert recovered.log_end_offset == damaged_base + 3
    assert len(recovered.segments) == 2
    for _base, path in segments[2:]:
        assert not os.path.exists(path)
    assert any("crc" in line for line in recovered.recovery_report)
    offsets = [r.offset for b in all_batches(recovered) for r in b.records]
    assert offsets == list(range(damaged_base + 3))


def test_indexes_rebuilt_by_recovery_equal_the_live_ones(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20, index_interval_bytes=200))
    for i in range(30):
        partition_log.append(batch(i, ts=5_000 + (i * 7) % 50))
    partition_log.close()
    live = index_files(str(tmp_path))
    assert any(len(v) > 8 for v in live.values())
    os.remove(tmp_path / ".clean_shutdown")
    for name in live:
        os.remove(tmp_path / name)
    with open(tmp_path / "checkpoint", "w") as file:
        file.write("recovery-point 0\nlog-start-offset 0\n")
    recovered = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20, index_interval_bytes=200))
    recovered.close()
    assert index_files(str(tmp_path)) == live


class FailingIO(DiskIO):
    def __init__(self):
        self.fail_write = False
        self.fail_fsync = False
        self.fsyncs = 0

    def write(self, fd, data):
        if self.fail_write:
            # A partial write then the error: the worst case for a log.
            os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(fd, data)

    def fsync(self, fd):
        if self.fail_fsync:
            raise OSError(errno.EIO, "Input/output error")
        self.fsyncs += 1
        super().fsync(fd)


def test_failed_write_is_not_acknowledged_and_the_log_refuses_appends(tmp_path):
    io = FailingIO()
    partition_log = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20, flush_policy="always"), io=io)
    fill(partition_log, 5)
    io.fail_write = True
    with pytest.raises(LogFailedError):
        partition_log.append(batch(5))
    io.fail_write = False
    with pytest.raises(LogFailedError, match="refuses appends"):
        partition_log.append(batch(6))
    assert partition_log.high_watermark == 15
    partition_log.close()  # unclean: the log failed
    reopened = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20))
    assert reopened.log_end_offset == 15, "the half-written batch is cut away"
    assert reopened.append(batch(7)).first_offset == 15


def test_group_commit_acknowledges_only_after_fsync(tmp_path):
    io = FailingIO()
    partition_log = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20, flush_policy="group", flush_interval_ms=20), io=io)

    async def scenario():
        infos = [partition_log.append(batch(i)) for i in range(5)]
        waiters = [partition_log.wait_durable(info.last_offset) for info in infos]
        assert partition_log.high_watermark == 0, "nothing visible before the fsync"
        assert not any(w.done() for w in waiters)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert io.fsyncs == 1, "five appends share one fsync"
        assert partition_log.high_watermark == 15
        # Now the fsync fails: the waiter fails, the high watermark stays.
        io.fail_fsync = True
        info = partition_log.append(batch(9))
        with pytest.raises(LogFailedError):
            await asyncio.wait_for(partition_log.wait_durable(info.last_offset), 5)
        assert partition_log.high_watermark == 15
        with pytest.raises(LogFailedError):
            partition_log.append(batch(10))

    asyncio.run(scenario())


def test_time_retention_deletes_whole_old_segments(tmp_path):
    now = [10_000_000]
    config = small_config(retention_ms=1000)
    partition_log = PartitionLog.open(str(tmp_path), config, clock=lambda: now[0])
    for i in range(30):
        partition_log.append(batch(i, ts=now[0] - 5000 if i < 15 else now[0]))
    segments_before = len(partition_log.segments)
    deleted = partition_log.enforce_retention()
    assert deleted > 0 and len(partition_log.segments) == segments_before - deleted
    assert partition_log.log_start_offset == partition_log.segments[0].base_offset
    assert partition_log.log_start_offset <= 45  # nothing new was deleted
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(0, 100)


def test_size_retention(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config(retention_bytes=3000, retention_ms=-1))
    fill(partition_log, 60)
    partition_log.enforce_retention()
    assert partition_log.size_bytes - partition_log.segments[0].size < 3000
    assert partition_log.size_bytes >= 1500


def test_delete_records_moves_the_start_and_survives_restart(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), small_config())
    fill(partition_log, 40)
    segments_before = len(partition_log.segments)
    assert partition_log.delete_records_before(61) == 61
    assert len(partition_log.segments) < segments_before
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(60, 100)
    assert read_batch_header(partition_log.read(61, 1)).base_offset == 60  # the batch holding 61
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.delete_records_before(10_000)
    partition_log.close()
    reopened = PartitionLog.open(str(tmp_path), small_config())
    assert reopened.log_start_offset == 61
    os.remove(tmp_path / ".clean_shutdown") if os.path.exists(tmp_path / ".clean_shutdown") else None


@pytest.mark.parametrize("clean", [True, False])
def test_appends_after_a_reopen_land_at_the_end(tmp_path, clean):
    partition_log = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20))
    fill(partition_log, 10)
    if clean:
        partition_log.close()
    else:
        _crash_copy(partition_log)
    reopened = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20))
    for i in range(10, 20):
        reopened.append(batch(i))
    offsets = [r.offset for b in all_batches(reopened) for r in b.records]
    assert offsets == list(range(60))
    keys = [r.key for b in all_batches(reopened) for r in b.records[:1]]
    assert keys == [b"key-%d" % i for i in range(20)]
    reopened.close()
    again = PartitionLog.open(str(tmp_path), small_config(segment_bytes=1 << 20))
    assert again.recovery_report == [] and again.log_end_offset == 60


def test_index_memory_stays_within_the_budget_and_dropped_indexes_read_back(tmp_path):
    """With a budget of 40 entries and a log of many segments, the least
    recently used indexes are dropped and read back from their files on the
    next lookup: every answer is the one a log holding all its indexes gives."""
    from storage.index import IndexBudget

    def fill(directory, budget=None):
        log = PartitionLog.open(str(directory), small_config(index_interval_bytes=1), index_budget=budget)
        for i in range(300):
            log.append(encode_batch([(b"k", b"v" * 20, (), 1_000_000 + i)]))
        return log

    reference = fill(tmp_path / "reference")  # a budget of its own, of the default size: holds everything
    expected_reads = [reference.read(offset, 200) for offset in range(0, 300, 7)]
    expected_times = [reference.offset_for_timestamp(1_000_000 + i) for i in range(0, 300, 11)]
    expected_entries = [list(s.offset_index.relative_offsets) for s in reference.segments]
    reference.close()

    resident = IndexBudget(40)
    budgeted = fill(tmp_path / "budgeted", resident)
    assert len(budgeted.segments) > 15  # 16 offset and 16 time entries each: 600 in all
    assert resident.entries <= 40 + 16, "the budget (plus the index in use) bounds the entries held"
    assert resident.entries == sum(index._count for index in resident.held()), "the count is what is held"
    assert [list(s.offset_index.relative_offsets) for s in budgeted.segments] == expected_entries, "dropped entries read back"
    assert resident.entries <= 40 + 16
    assert [budgeted.read(offset, 200) for offset in range(0, 300, 7)] == expected_reads
    assert [budgeted.offset_for_timestamp(1_000_000 + i) for i in range(0, 300, 11)] == expected_times
    assert resident.entries <= 40 + 16
    assert resident.entries == sum(index._count for index in resident.held()), "read-back indexes are counted"
    budgeted.close()
    assert resident.entries == 0 and resident.held() == [], "a closed log gives its indexes back"
    again = IndexBudget(40)
    reopened = PartitionLog.open(str(tmp_path / "budgeted"), small_config(index_interval_bytes=1), index_budget=again)
    assert [reopened.read(offset, 200) for offset in range(0, 300, 7)] == expected_reads
    assert [reopened.offset_for_timestamp(1_000_000 + i) for i in range(0, 300, 11)] == expected_times
    assert again.entries <= 40 + 16
    reopened.close()


def test_each_budget_drops_only_its_own_indexes(tmp_path):
    """Two owners (two brokers) with budgets of their own: filling one log far
    past its budget never drops an index of the other's log."""
    from storage.index import IndexBudget

    small, large = IndexBudget(10), IndexBudget(10_000)
    quiet = PartitionLog.open(str(tmp_path / "quiet"), small_config(index_interval_bytes=1), index_budget=large)
    for i in range(40):
        quiet.append(encode_batch([(b"k", b"v" * 20, (), 1_000_000 + i)]))
    quiet_indexes = large.held()
    busy = PartitionLog.open(str(tmp_path / "busy"), small_config(index_interval_bytes=1), index_budget=small)
    for i in range(300):
        busy.append(encode_batch([(b"k", b"v" * 20, (), 1_000_000 + i)]))
    assert small.entries <= 10 + 16 and len(busy.segments) > 15
    assert large.held() == quiet_indexes and all(index._loaded for index in quiet_indexes), "the other budget's indexes stay loaded"
    assert all(segment.index_budget is small for segment in busy.segments)
    busy.close()
    quiet.close()


def test_an_index_budget_holds_at_least_one_entry():
    from storage.index import IndexBudget

    with pytest.raises(ValueError, match="at least 1"):
        IndexBudget(0)


def test_an_index_without_entries_is_dropped_and_read_back(tmp_path):
    """A segment with one batch has no index entry and, until then, no index
    file: dropping its index must leave a file to read back."""
    from storage.index import OffsetIndex

    index = OffsetIndex(str(tmp_path / "00000000000000000010.index"), 10)
    assert index.missing and len(index) == 0
    index._drop()
    assert index.lookup(12) == (10, 0)
    index.append(13, 4096)
    index._drop()
    assert index.lookup(14) == (13, 4096)
    index.close()


def test_needs_recovery_names_exactly_the_directories_changed_since_they_were_last_whole(tmp_path):
    from storage.recovery import needs_recovery

    directory = tmp_path / "p"
    assert not needs_recovery(str(directory)), "a partition directory not made yet"
    directory.mkdir()
    assert not needs_recovery(str(directory)), "an empty one"
    fresh = PartitionLog.open(str(directory), small_config())
    assert fresh.read(0, 100) == b""
    fresh.close()
    assert not os.path.exists(directory / "checkpoint"), "a new log opened and closed unwritten writes nothing"
    assert not needs_recovery(str(directory)), "segments without data: nothing to recover"
    written = PartitionLog.open(str(directory), small_config())
    fill(written, 3)
    _crash_copy(written)
    assert needs_recovery(str(directory)), "data written, then a crash"
    PartitionLog.open(str(directory), small_config())
    assert not needs_recovery(str(directory)), "recovered at open, and marked whole"
    (directory / "00000000000000000000.index.tmp").write_bytes(b"")
    os.remove(directory / ".clean_shutdown")
    assert needs_recovery(str(directory))
    PartitionLog.open(str(directory), small_config()).close()
    assert not os.path.exists(directory / "00000000000000000000.index.tmp") and not needs_recovery(str(directory))
