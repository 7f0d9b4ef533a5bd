"""A segment closed synchronously (DeleteRecords, retention, a compaction
swap: ``LogSegment.delete``/``close``) while a group-commit round fsyncs it
on a worker thread keeps its descriptor open until that fsync returns: the
thread never fsyncs a closed descriptor, or one the kernel gave to another file."""

from __future__ import annotations

import asyncio
import errno
import threading

import pytest

from protocol.records import encode_batch
from storage.config import LogConfig
from storage.group_commit import FsyncRounds, LogFailedError
from storage.log import OffsetOutOfRangeError, PartitionLog
from tests.storage.worker_fsync import HoldableWorkerFsync


def batch(i: int) -> bytes:
    return encode_batch([(b"key-%d" % i, b"v" * 40, (), 1_000_000 + i) for _ in range(3)])


def test_delete_records_of_a_segment_a_worker_is_fsyncing_waits_for_the_fsync(tmp_path):
    """A roll during a worker round fsyncs the old segment itself, but what
    it made durable is acknowledged only when that round succeeds: until
    then the high watermark stays, so DeleteRecords (bounded by it) cannot
    delete the segment under the worker's fsync; afterwards it can."""
    rounds = FsyncRounds()
    io = HoldableWorkerFsync()
    config = LogConfig(segment_bytes=1 << 20, flush_policy="group")
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), config, io=io, fsync_rounds=rounds) for i in range(3)]
    doomed = logs[0]

    async def scenario():
        io.hold.set()
        # Three files: the round goes to worker threads, and is held there.
        waits = [partition_log.wait_durable(partition_log.append(batch(i)).last_offset) for i, partition_log in enumerate(logs)]
        assert await asyncio.get_running_loop().run_in_executor(None, io.entered.wait, 10), "no worker fsync started"
        old_segment = doomed.segments[0]
        assert rounds.in_round and old_segment in doomed.committer.syncing, "the held round covers segment 0"
        doomed.roll()  # fsyncs segment 0 itself, on the loop
        assert doomed.high_watermark == 0, "acknowledged only once the held round succeeds"
        with pytest.raises(OffsetOutOfRangeError):
            doomed.delete_records_before(3)
        waits.append(doomed.wait_durable(doomed.append(batch(9)).last_offset))
        io.release.set()
        await asyncio.wait_for(asyncio.gather(*waits), 10)
        assert doomed.high_watermark == 6
        doomed.delete_records_before(3)  # now segment 0 goes
        assert old_segment.closed and doomed.segments[0] is not old_segment
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
    assert io.closed_during_fsync == [], "a descriptor was closed under a worker's fsync"
    assert io.fsync_errors == []
    assert all(partition_log.failed is None for partition_log in logs)
    reopened = PartitionLog.open(str(tmp_path / "p0"), config)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (3, 6)
    reopened.close()


class FailingWorkerFsync(HoldableWorkerFsync):
    """Worker threads' fsyncs wait for ``release`` and then fail (EIO); the
    loop's own fsyncs succeed, as a second fsync of a descriptor whose
    writeback error the worker already took does."""

    def fsync(self, fd):
        if self.hold.is_set() and threading.current_thread() is not threading.main_thread():
            self.entered.set()
            assert self.release.wait(10), "the test never released the fsync"
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_a_roll_during_a_round_whose_fsync_fails_acknowledges_nothing(tmp_path):
    rounds = FsyncRounds()
    io = FailingWorkerFsync(hold=True)
    config = LogConfig(segment_bytes=1 << 20, flush_policy="group")
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), config, io=io, fsync_rounds=rounds) for i in range(3)]
    rolled = logs[0]

    async def scenario():
        waits = [partition_log.wait_durable(partition_log.append(batch(i)).last_offset) for i, partition_log in enumerate(logs)]
        assert await asyncio.get_running_loop().run_in_executor(None, io.entered.wait, 10), "no worker fsync started"
        rolled.roll()  # its own fsync of segment 0 succeeds
        io.release.set()
        results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 10)
        assert all(isinstance(result, LogFailedError) for result in results), results
        assert rolled.failed is not None and rolled.high_watermark == 0
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
