"""Append details (in-place offset assignment, LogAppendTime, batch checks,
batches that carry offsets), the group committer's sequencing through the
DiskIO seam, index sanity checks after a clean shutdown, and ListOffsets
lookups around the log start offset."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import threading

import pytest

from protocol.records import (
    CorruptRecordError,
    TimestampType,
    compute_crc,
    decode_batch,
    encode_batch,
    iter_batches,
    read_batch_header,
)
from storage import checksum
from storage.config import LogConfig
from storage import log as log_module
from storage.log import LogFailedError, PartitionLog
from storage.segment import DiskIO, LogSegment


def batch(i: int, records: int = 3, ts: int | None = None, **kwargs) -> bytes:
    timestamp = 1_000_000 + i if ts is None else ts
    return encode_batch([(b"key-%d" % i, b"v" * 40, (), timestamp) for _ in range(records)], **kwargs)


def config(**overrides) -> LogConfig:
    values = {"segment_bytes": 1500, "index_interval_bytes": 300, "flush_policy": "os"}
    values.update(overrides)
    return LogConfig(**values)


def test_offsets_are_patched_in_place_and_the_crc_stays_valid(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20))
    partition_log.append(batch(0))
    sent = bytearray(batch(1) + batch(2))
    crcs = [header.crc for _position, header in iter_batches(sent)]
    info = partition_log.append(sent)
    assert (info.first_offset, info.last_offset) == (3, 8)
    # The producer's own buffer carries the offsets now: patched, not re-encoded.
    headers = [header for _position, header in iter_batches(sent)]
    assert [h.base_offset for h in headers] == [3, 6]
    assert [h.crc for h in headers] == crcs
    assert partition_log.read(3, 1 << 20) == bytes(sent)


def test_the_fast_crc_agrees_with_the_codec():
    data = bytearray(batch(5, records=20))
    header = read_batch_header(data)
    assert checksum.batch_crc(data, 0, header) == compute_crc(data, 0, header) == header.crc
    data[100] ^= 1
    with pytest.raises(CorruptRecordError, match="crc"):
        checksum.checked_batches(data)


def test_a_batch_whose_offset_range_disagrees_with_its_record_count_is_refused(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    data = bytearray(batch(0, records=3))
    struct.pack_into(">i", data, 23, 10)  # last_offset_delta 10 for 3 records
    header = read_batch_header(data, verify_crc=False)
    struct.pack_into(">I", data, 17, compute_crc(data, 0, header))
    with pytest.raises(CorruptRecordError, match="offsets"):
        partition_log.append(bytes(data))
    assert partition_log.log_end_offset == 0


def test_log_append_time_stamps_the_batch(tmp_path):
    now = [1_700_000_000_000]
    partition_log = PartitionLog.open(str(tmp_path), config(message_timestamp_type="LogAppendTime"), clock=lambda: now[0])
    info = partition_log.append(batch(0, ts=5))
    assert info.log_append_time == now[0]
    data = partition_log.read(0, 1 << 20)
    header = read_batch_header(data)  # the CRC was recomputed
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == now[0]
    assert partition_log.offset_for_timestamp(now[0]) == (0, now[0])


def test_batches_that_carry_offsets_are_appended_as_they_are(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20))
    info = partition_log.append(batch(0, base_offset=10) + batch(1, base_offset=20), assign_offsets=False)
    assert (info.first_offset, info.last_offset) == (10, 22)
    assert partition_log.log_end_offset == 23
    assert [read_batch_header(partition_log.read(o, 1)).base_offset for o in (10, 21)] == [10, 20]
    with pytest.raises(CorruptRecordError, match="below"):
        partition_log.append(batch(2, base_offset=22), assign_offsets=False)
    with pytest.raises(CorruptRecordError, match="below"):
        partition_log.append(batch(3, base_offset=30) + batch(4, base_offset=31), assign_offsets=False)
    assert partition_log.log_end_offset == 23


def test_offset_for_timestamp_skips_what_is_below_the_log_start(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20))
    for i in range(10):
        partition_log.append(batch(i, ts=1000))  # all the same timestamp
    partition_log.delete_records_before(7)
    assert partition_log.offset_for_timestamp(1000) == (7, 1000)
    assert partition_log.offset_for_timestamp(500) == (7, 1000)


class GatedIO(DiskIO):
    """fsync blocks (on its worker thread) until the test opens the gate."""

    def __init__(self):
        self.gate = threading.Semaphore(0)
        self.started = threading.Semaphore(0)
        self.running = 0
        self.most_at_once = 0
        self.fsyncs = 0
        self.fail_next = False
        self._lock = threading.Lock()

    def fsync(self, fd):
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.release()
        opened = self.gate.acquire(timeout=10)  # a bug shows as a failure, not a hang
        try:
            if not opened:
                raise OSError(5, "test gate never opened")
            if self.fail_next:
                raise OSError(5, "Input/output error")
            super().fsync(fd)
            self.fsyncs += 1
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def fsyncs_on_a_worker(monkeypatch):
    """GatedIO holds an fsync until the test, running on the log's own loop,
    opens the gate: that needs every fsync on a worker thread, not the small
    rounds that are fsynced on the loop."""
    import storage.group_commit

    monkeypatch.setattr(storage.group_commit, "INLINE_FSYNC_BYTES", -1)


async def _started(io: GatedIO) -> None:
    started = await asyncio.get_running_loop().run_in_executor(None, lambda: io.started.acquire(timeout=10))
    assert started, "no fsync started"


@pytest.mark.parametrize("policy", ["group", "always"])
def test_group_commit_sequencing(tmp_path, policy, fsyncs_on_a_worker):
    io = GatedIO()
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20, flush_policy=policy, flush_interval_ms=1), io=io)

    async def scenario():
        first = [partition_log.append(batch(i)) for i in range(3)]
        first_waiters = [partition_log.wait_durable(info.last_offset) for info in first]
        await _started(io)  # fsync #1 is running, covering offsets 0..8
        second = partition_log.append(batch(3))
        second_waiter = partition_log.wait_durable(second.last_offset)
        await asyncio.sleep(0.01)
        assert partition_log.high_watermark == 0, "nothing is acknowledged before its fsync returns"
        assert not any(w.done() for w in first_waiters + [second_waiter])
        io.gate.release()
        await asyncio.wait_for(asyncio.gather(*first_waiters), 5)
        assert partition_log.high_watermark == 9
        assert not second_waiter.done(), "an append made during an fsync waits for the next one"
        await _started(io)  # fsync #2
        io.gate.release()
        await asyncio.wait_for(second_waiter, 5)
        assert partition_log.high_watermark == 12
        assert io.most_at_once == 1
        # A failing fsync: its appends are never acknowledged, later ones refused.
        third = partition_log.append(batch(4))
        third_waiter = partition_log.wait_durable(third.last_offset)
        await _started(io)
        io.fail_next = True
        io.gate.release()
        with pytest.raises(LogFailedError):
            await asyncio.wait_for(third_waiter, 5)
        assert partition_log.high_watermark == 12
        with pytest.raises(LogFailedError):
            partition_log.append(batch(5))

    asyncio.run(scenario())
    partition_log.close()
    assert not os.path.exists(tmp_path / ".clean_shutdown"), "a failed log never closes clean"
    reopened = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20))
    # The unacknowledged batch may survive (it was written) but never in part.
    assert reopened.log_end_offset in (12, 15)
    assert [r.offset for p, _h in iter_batches(reopened.read(0, 1 << 20)) for r in decode_batch(reopened.read(0, 1 << 20), p).records] == list(range(reopened.log_end_offset))


def test_close_during_an_fsync_in_flight_is_clean(tmp_path, fsyncs_on_a_worker):
    io = GatedIO()
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20, flush_policy="group"), io=io)

    async def scenario():
        partition_log.append(batch(0))
        await _started(io)  # the flusher's fsync is blocked
        partition_log.append(batch(1))
        closer = asyncio.get_running_loop().run_in_executor(None, partition_log.close)
        await _started(io)  # close() fsyncs everything itself, in-flight data included
        for _ in range(4):  # the flusher's fsync, then close's: the .log, .index and .timeindex
            io.gate.release()
        await closer
        await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert partition_log.failed is None
    assert os.path.exists(tmp_path / ".clean_shutdown")
    assert PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20)).log_end_offset == 6


class SlowWorkerFsync(DiskIO):
    """An fsync on a worker thread (the flusher's) waits for ``release``;
    closing a descriptor while a worker still fsyncs it is recorded."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.in_fsync: set[int] = set()
        self.closed_during_fsync: list[int] = []

    def fsync(self, fd):
        if threading.current_thread() is threading.main_thread():
            return super().fsync(fd)  # the loop's own fsyncs (close's flush) pass
        self.in_fsync.add(fd)
        self.entered.set()
        try:
            assert self.release.wait(10), "the test never released the fsync"
            super().fsync(fd)
        finally:
            self.in_fsync.discard(fd)
            self.finished.set()

    def close(self, fd):
        if fd in self.in_fsync:
            self.closed_during_fsync.append(fd)
        super().close(fd)


def test_aclose_waits_for_the_flushers_fsync_before_closing_the_files(tmp_path, fsyncs_on_a_worker):
    io = SlowWorkerFsync()
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20, flush_policy="group"), io=io)

    async def scenario():
        info = partition_log.append(batch(0))
        waiter = partition_log.wait_durable(info.last_offset)
        assert await asyncio.get_running_loop().run_in_executor(None, io.entered.wait, 10), "the flusher's fsync never started"
        closing = asyncio.create_task(partition_log.aclose())
        await asyncio.sleep(0.1)
        assert not closing.done(), "aclose waits while the flusher's fsync runs"
        assert not partition_log.closed
        io.release.set()
        await asyncio.wait_for(closing, 10)
        assert io.finished.is_set() and partition_log.closed
        await asyncio.wait_for(waiter, 1)  # durable: acknowledged, not failed
        assert partition_log.committer.task is None

    asyncio.run(scenario())
    assert io.closed_during_fsync == [], "a file was closed under a worker's fsync"
    assert partition_log.failed is None
    assert os.path.exists(tmp_path / ".clean_shutdown")
    assert PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20)).log_end_offset == 3


@pytest.mark.parametrize("damage", ["delete-timeindex", "index-past-end", "index-not-increasing"])
def test_untrustworthy_indexes_after_a_clean_shutdown_are_rebuilt(tmp_path, damage, caplog):
    partition_log = PartitionLog.open(str(tmp_path), config(index_interval_bytes=100))
    for i in range(30):
        partition_log.append(batch(i, ts=5_000 + i))
    partition_log.close()
    live = {n: (tmp_path / n).read_bytes() for n in sorted(os.listdir(tmp_path)) if n.endswith((".index", ".timeindex"))}
    name = sorted(n for n in live if n.endswith(".index"))[1]
    if damage == "delete-timeindex":
        os.remove(tmp_path / name.replace(".index", ".timeindex"))
    elif damage == "index-past-end":
        (tmp_path / name).write_bytes(live[name] + struct.pack(">ii", 1000, 10**6))
    else:
        (tmp_path / name).write_bytes(live[name][:8] + live[name][:8])
    with caplog.at_level(logging.WARNING, logger="storage"):
        reopened = PartitionLog.open(str(tmp_path), config(index_interval_bytes=100))
    assert any("rebuilding" in r.message for r in caplog.records)
    assert reopened.log_end_offset == 90
    assert reopened.offset_for_timestamp(5_029) == (87, 5_029)
    reopened.close()
    assert {n: (tmp_path / n).read_bytes() for n in live} == live


def test_segment_bytes_is_limited_to_what_an_index_can_address():
    with pytest.raises(ValueError, match="segment.bytes"):
        LogConfig.from_properties({"segment.bytes": str(2**31)})
    assert LogConfig.from_properties({"segment.bytes": str(2**31 - 1)}).segment_bytes == 2**31 - 1


def test_the_recovery_point_follows_durable_rolls(tmp_path, monkeypatch):
    partition_log = PartitionLog.open(str(tmp_path), config(flush_policy="group", flush_interval_ms=1))

    async def scenario():
        for i in range(40):
            info = partition_log.append(batch(i))
        await asyncio.wait_for(partition_log.wait_durable(info.last_offset), 5)

    asyncio.run(scenario())
    active = partition_log.active_segment.base_offset
    assert len(partition_log.segments) > 3
    assert open(tmp_path / "checkpoint").read().splitlines()[0] == f"recovery-point {active}"
    # SIGKILL now: no close. Only the active segment needs a scan.
    scanned = []
    original = LogSegment.recover

    def spy(self, **kwargs):
        scanned.append(self.base_offset)
        return original(self, **kwargs)

    monkeypatch.setattr(LogSegment, "recover", spy)
    reopened = PartitionLog.open(str(tmp_path), config())
    assert scanned == [active]
    assert reopened.log_end_offset == 120
    assert [read_batch_header(reopened.read(o, 1)).base_offset for o in range(0, 120, 3)] == list(range(0, 120, 3))


def test_leftovers_of_interrupted_writes_are_removed_at_open(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config())
    for i in range(20):
        partition_log.append(batch(i))
    partition_log.close()
    # A crash while retention deleted a segment (its .log went first) and
    # while a checkpoint and an index were being replaced.
    (tmp_path / "00000000000000000007.index").write_bytes(b"\0" * 8)
    (tmp_path / "00000000000000000007.timeindex").write_bytes(b"\0" * 12)
    (tmp_path / "checkpoint.tmp").write_text("recovery-point 99\n")
    (tmp_path / "00000000000000000000.index.tmp").write_bytes(b"junk")
    reopened = PartitionLog.open(str(tmp_path), config())
    names = set(os.listdir(tmp_path))
    assert not {"00000000000000000007.index", "00000000000000000007.timeindex", "checkpoint.tmp", "00000000000000000000.index.tmp"} & names
    assert reopened.log_end_offset == 60


def test_recovery_makes_what_it_kept_durable_before_it_is_visible(tmp_path):
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20))
    for i in range(5):
        partition_log.append(batch(i))
    # SIGKILL: no close; the data may be only in the page cache.
    fsynced = []

    class CountingIO(DiskIO):
        def fsync(self, fd):
            fsynced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else fd)
            super().fsync(fd)

    reopened = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 20), io=CountingIO())
    assert reopened.high_watermark == 15
    # The scanned segment and the indexes rebuilt from it (no abort: no .txnindex).
    assert [os.path.basename(path) for path in fsynced] == ["00000000000000000000" + suffix for suffix in (".log", ".index", ".timeindex")]


class ThreadRecordingIO(DiskIO):
    """Notes the thread of every fsync."""

    def __init__(self):
        self.fsync_threads: list[int] = []

    def fsync(self, fd):
        self.fsync_threads.append(threading.get_ident())
        super().fsync(fd)


def test_small_rounds_fsync_on_the_loop_and_large_ones_on_a_worker(tmp_path):
    """A round of a few KiB (a commit's markers, a lone small batch) is fsynced
    on the loop thread: two thread hand-offs cost as much as the fsync. A
    large round goes to a worker so the loop keeps serving."""
    from storage.group_commit import INLINE_FSYNC_BYTES

    io = ThreadRecordingIO()
    partition_log = PartitionLog.open(str(tmp_path), config(segment_bytes=1 << 24, flush_policy="group"), io=io)

    async def scenario():
        loop_thread = threading.get_ident()
        small = partition_log.append(batch(0))
        await asyncio.wait_for(partition_log.wait_durable(small.last_offset), 5)
        assert io.fsync_threads == [loop_thread]
        big = [partition_log.append(batch(i, records=60)) for i in range(1, 12)]
        assert sum(len(batch(i, records=60)) for i in range(1, 12)) > INLINE_FSYNC_BYTES
        await asyncio.wait_for(partition_log.wait_durable(big[-1].last_offset), 5)
        assert len(io.fsync_threads) == 2 and io.fsync_threads[1] != loop_thread
        assert partition_log.high_watermark == big[-1].last_offset + 1

    asyncio.run(scenario())
    partition_log.close()


def test_a_new_log_names_its_first_segment_durably_before_writing_into_it(tmp_path, monkeypatch):
    """A new partition's first segment file is created at open; its name is
    fsynced into the directory on the first change, before any byte of an
    acknowledged batch goes into it (a machine crash could otherwise drop
    the file with its fsynced data). Opening and only reading costs nothing."""
    events = []
    real_fsync_directory = log_module.fsync_directory
    monkeypatch.setattr(log_module, "fsync_directory", lambda directory, **kw: (events.append(("fsync dir", directory)), real_fsync_directory(directory, **kw))[1])

    class WriteRecordingIO(DiskIO):
        def write(self, fd, data):
            events.append(("write", os.readlink(f"/proc/self/fd/{fd}")))
            super().write(fd, data)

    directory = str(tmp_path / "fresh-0")
    partition_log = PartitionLog.open(directory, config(), io=WriteRecordingIO())
    assert partition_log.read(0, 1000) == b"" and events == []
    partition_log.append(batch(0))
    partition_log.append(batch(1))
    assert events[0] == ("fsync dir", directory)
    assert [kind for kind, _path in events].count("fsync dir") == 1, events
    assert events[1][0] == "write" and events[1][1].endswith("00000000000000000000.log")
    partition_log.close()


def test_a_clean_close_makes_the_active_segments_aborted_transactions_durable(tmp_path, monkeypatch):
    """The close's snapshot puts the ABORT marker past any replay, so the
    active segment's .txnindex entry must be on disk by then (recovery
    could not restore it after a machine crash)."""
    from protocol.records import ControlType, encode_control_batch

    partition_log = PartitionLog.open(str(tmp_path), config(flush_policy="os"))
    partition_log.append(encode_batch([(b"k", b"v", (), 1000)], producer_id=4, producer_epoch=0, base_sequence=0, is_transactional=True))
    partition_log.append_control(encode_control_batch(ControlType.ABORT, producer_id=4, producer_epoch=0, coordinator_epoch=0, timestamp=2000), coordinator_epoch=0)
    txnindex = partition_log.active_segment.txn_index.path
    assert os.path.exists(txnindex)
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    partition_log.close()
    assert txnindex in fsynced
