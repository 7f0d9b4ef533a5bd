"""Zeros written ahead of small appends in the active segment
(``segment.zeros.ahead.bytes``, ``storage.segment``): where they are kept,
where they are cut (a roll, a clean close), what recovery and the fault
harness make of them after an unclean stop, and a disk that refuses them."""

from __future__ import annotations

import asyncio
import errno
import os
import random

import pytest

from faults.disk import FsyncJournalIO, cut_to_durable, durable_sizes, flip_byte, truncate_tail
from protocol.records import decode_batch, encode_batch, iter_batches
from storage.config import LogConfig
from storage.durable import DiskIO
from storage.log import PartitionLog
from storage.segment import SMALL_APPEND_BYTES

WINDOW = 64 * 1024


def batch(i: int, value_bytes: int = 40) -> bytes:
    return encode_batch([(b"key-%d" % i, b"v" * value_bytes, (), 1_000_000 + i) for _ in range(3)])


def five_batches(directory) -> PartitionLog:
    """A log (``config()``) holding five small batches: offsets 0..14."""
    partition_log = PartitionLog.open(str(directory), config())
    for i in range(5):
        partition_log.append(batch(i))
    return partition_log


def config(**overrides) -> LogConfig:
    values = {"segment_bytes": 1 << 20, "index_interval_bytes": 300, "flush_policy": "group", "segment_zeros_ahead_bytes": WINDOW}
    values.update(overrides)
    return LogConfig(**values)


def file_length(partition_log: PartitionLog, index: int = -1) -> int:
    return os.path.getsize(partition_log.segments[index].log_path)


def offsets(partition_log: PartitionLog) -> list[int]:
    data = partition_log.read(0, 1 << 24)
    return [record.offset for position, _header in iter_batches(data) for record in decode_batch(data, position).records]


def tail_bytes(path: str, start: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(start)
        return file.read()


def test_small_appends_keep_zeros_written_ahead_of_the_data(tmp_path):
    partition_log = five_batches(tmp_path)
    segment = partition_log.active_segment
    assert file_length(partition_log) >= segment.size + WINDOW // 2
    assert file_length(partition_log) % 4096 == 0
    assert not tail_bytes(segment.log_path, segment.size).strip(b"\0"), "past the data: zeros only"
    assert offsets(partition_log) == list(range(15)), "reads stop at the data"
    partition_log.close()


def test_the_zeros_are_extended_before_the_data_reaches_them(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    segment = partition_log.active_segment
    lengths = set()
    for i in range(400):  # ~50 KiB of data: more than half the window
        partition_log.append(batch(i))
        assert segment.allocated - segment.size >= WINDOW // 2
        lengths.add(file_length(partition_log))
    assert 1 < len(lengths) < 10, "extended a window at a time, not at every append"
    partition_log.close()


def test_large_appends_and_logs_without_fsync_rounds_write_no_zeros(tmp_path):
    large = PartitionLog.open(str(tmp_path / "large"), config())
    large.append(encode_batch([(None, b"x" * (SMALL_APPEND_BYTES + 1), (), 1)]))
    assert file_length(large) == large.active_segment.size
    large.close()
    for name, overrides in (("os", {"flush_policy": "os"}), ("off", {"segment_zeros_ahead_bytes": 0})):
        partition_log = PartitionLog.open(str(tmp_path / name), config(**overrides))
        partition_log.append(batch(0))
        assert file_length(partition_log) == partition_log.active_segment.size, name
        partition_log.close()


def test_a_roll_cuts_the_zeros_of_the_segment_it_leaves(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=2000))
    for i in range(40):
        partition_log.append(batch(i))
    assert len(partition_log.segments) > 3
    for segment in partition_log.segments[:-1]:
        assert os.path.getsize(segment.log_path) == segment.size, f"{segment} keeps zeros after its roll"
    assert file_length(partition_log) > partition_log.active_segment.size
    partition_log.close()


def test_a_clean_close_cuts_the_zeros_and_the_log_reopens_without_recovery(tmp_path, caplog):
    partition_log = five_batches(tmp_path)
    size = partition_log.active_segment.size
    partition_log.close()
    assert os.path.getsize(partition_log.active_segment.log_path) == size
    reopened = PartitionLog.open(str(tmp_path), config())
    assert reopened.recovery_report.clean_shutdown and not reopened.recovery_report.segments_scanned
    assert reopened.log_end_offset == 15 and offsets(reopened) == list(range(15))
    reopened.close()


def test_after_an_unclean_stop_recovery_cuts_the_zeros_without_calling_them_damage(tmp_path):
    partition_log = five_batches(tmp_path)
    partition_log.flush()
    path, size = partition_log.active_segment.log_path, partition_log.active_segment.size
    assert os.path.getsize(path) > size
    # No close: what a SIGKILL leaves (the page cache keeps every write).
    reopened = PartitionLog.open(str(tmp_path), config())
    report = reopened.recovery_report
    assert not report.clean_shutdown and report.segments_scanned == 1 and report.bytes_truncated == 0 and list(report) == []
    assert os.path.getsize(path) == size
    assert offsets(reopened) == list(range(15))
    reopened.append(batch(5))
    assert offsets(reopened) == list(range(18)), "appends go on at the data's end"
    reopened.close()


def test_a_batch_torn_over_the_zeros_is_damage_and_cut(tmp_path):
    partition_log = five_batches(tmp_path)
    partition_log.flush()
    segment = partition_log.active_segment
    last_start = segment.size - len(batch(4))
    with open(segment.log_path, "r+b") as file:  # the last batch's tail never reached the disk: zeros there
        file.seek(segment.size - 10)
        file.write(bytes(10))
    reopened = PartitionLog.open(str(tmp_path), config())
    report = reopened.recovery_report
    assert report.bytes_truncated > 0 and list(report), "a torn batch is damage, zeros around it or not"
    assert os.path.getsize(segment.log_path) == last_start
    assert offsets(reopened) == list(range(12))
    reopened.close()


def test_the_offline_damage_tools_tear_the_data_not_the_zeros(tmp_path):
    for tool in (truncate_tail, flip_byte):
        directory = tmp_path / tool.__name__
        partition_log = five_batches(directory)
        partition_log.flush()
        last_start = partition_log.active_segment.size - len(batch(4))
        damage = tool(str(directory), random.Random(7))
        assert last_start <= damage.position < partition_log.active_segment.size, (tool.__name__, damage)
        reopened = PartitionLog.open(str(directory), config())
        assert offsets(reopened) == list(range(12)), tool.__name__
        reopened.close()


@pytest.mark.parametrize("seed", range(12))
def test_a_power_cut_over_zeros_leaves_a_prefix_of_the_acknowledged_data(tmp_path, seed):
    journal = str(tmp_path / "journal")
    directory = tmp_path / "p0"
    io = FsyncJournalIO(DiskIO(), journal)
    # The first round at once, the next not for a minute: the run ends first.
    partition_log = PartitionLog.open(str(directory), config(flush_interval_ms=60_000), io=io)

    async def appends() -> None:
        for i in range(6):
            info = partition_log.append(batch(i))
        await partition_log.wait_durable(info.last_offset)  # offsets 0..17 acknowledged
        for i in range(6, 10):
            partition_log.append(batch(i))  # written; the run ends before their round

    asyncio.run(appends())
    path = partition_log.active_segment.log_path
    assert os.path.getsize(path) > partition_log.active_segment.size, "zeros were written ahead"
    durable = durable_sizes(journal)[os.path.realpath(path)]
    assert durable == partition_log.active_segment.size - 4 * len(batch(0)), "the journal names the data's end, not the file's"
    cut_to_durable(durable_sizes(journal), [str(directory)], random.Random(seed))
    reopened = PartitionLog.open(str(directory), config())
    kept = offsets(reopened)
    assert kept == list(range(len(kept))) and 18 <= len(kept) <= 30
    reopened.close()


def test_a_disk_that_refuses_the_zeros_loses_no_append(tmp_path, caplog):
    class NoRoomForZeros(DiskIO):
        def write_zeros(self, fd, position, length):
            super().write_zeros(fd, position, length // 2)
            raise OSError(errno.ENOSPC, "No space left on device")

    partition_log = PartitionLog.open(str(tmp_path), config(), io=NoRoomForZeros())
    for i in range(3):
        partition_log.append(batch(i))
    partition_log.flush()
    assert partition_log.failed is None
    assert not partition_log.active_segment.writes_zeros_ahead
    assert "writing zeros ahead" in caplog.text
    assert offsets(partition_log) == list(range(9))
    partition_log.close()
    reopened = PartitionLog.open(str(tmp_path), config())
    assert offsets(reopened) == list(range(9))
    reopened.close()
