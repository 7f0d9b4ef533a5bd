"""Group commit shared by many logs (``storage.group_commit.FsyncRounds``):
appends waiting on different logs share one fsync round, a failed fsync
fails only its own log, and a machine crash at any moment (the files cut
back to what was fsynced, or torn anywhere past it) loses no acknowledged
record of any log."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import pytest

from faults.disk import cut_to_durable
from protocol.records import decode_batch, encode_batch, iter_batches
from storage.config import LogConfig
from storage.group_commit import SETTLE_TURNS, FsyncRounds
from storage.log import LogFailedError, PartitionLog
from storage.segment import DiskIO
from tests.storage.worker_fsync import HoldableWorkerFsync


def batch(i: int, records: int = 3) -> bytes:
    return encode_batch([(b"key-%d" % i, b"v" * 40, (), 1_000_000 + i) for _ in range(records)])


def group(**overrides) -> LogConfig:
    values = {"segment_bytes": 1 << 20, "flush_policy": "group"}
    values.update(overrides)
    return LogConfig(**values)


class CountingIO(DiskIO):
    """Counts fsyncs, and fails those of the files whose path contains ``fail_in``."""

    def __init__(self):
        self.fsyncs = 0
        self.fail_in: str | None = None

    def fsync(self, fd):
        if self.fail_in and self.fail_in in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        self.fsyncs += 1
        super().fsync(fd)


def test_an_append_without_flush_waits_for_a_round_someone_asks_for_and_then_shares_it(tmp_path):
    """``append(flush=False)`` (the transaction coordinator's AddPartitionsToTxn
    record, answered once appended) starts no round; ``wait_durable`` asks for
    one, and asked right after another log's append both share that round."""
    rounds = FsyncRounds()
    io = CountingIO()
    state, data = (PartitionLog.open(str(tmp_path / name), group(), io=io, fsync_rounds=rounds) for name in ("state", "data"))

    async def scenario():
        unflushed = state.append(batch(0), flush=False)
        for _ in range(20):
            await asyncio.sleep(0)
        assert rounds.rounds == 0 and state.durable_offset == 0, "no round until someone waits"
        appended = data.append(batch(1))
        waiters = [data.wait_durable(appended.last_offset), state.wait_durable(unflushed.last_offset)]
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert rounds.rounds == 1 and io.fsyncs == 2, "one round for both logs"
        assert state.durable_offset == unflushed.last_offset + 1
        await state.aclose()
        await data.aclose()

    asyncio.run(scenario())


def test_a_waiter_that_does_not_ask_starts_no_round_and_is_released_by_the_next_one(tmp_path):
    """``wait_durable(ask=False)`` (a fetcher's wake-up for a transactional
    batch under ``transaction.durable.at.end``) starts no round: the bytes
    stay unsynced until someone asks, and that round releases it too."""
    rounds = FsyncRounds()
    io = CountingIO()
    partition_log = PartitionLog.open(str(tmp_path / "data"), group(), io=io, fsync_rounds=rounds)

    async def scenario():
        appended = partition_log.append(batch(0), flush=False)
        quiet = partition_log.wait_durable(appended.last_offset, ask=False)
        for _ in range(20):
            await asyncio.sleep(0)
        assert rounds.rounds == 0 and not quiet.done(), "no round asked for"
        await asyncio.wait_for(partition_log.wait_durable(appended.last_offset), 10)
        assert quiet.done() and rounds.rounds == 1
        await partition_log.aclose()

    asyncio.run(scenario())


def test_appends_waiting_on_many_logs_share_one_round(tmp_path):
    rounds = FsyncRounds()
    io = CountingIO()
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), group(), io=io, fsync_rounds=rounds) for i in range(8)]

    async def scenario():
        appended = [partition_log.append(batch(i)) for i, partition_log in enumerate(logs)]
        waiters = [partition_log.wait_durable(info.last_offset) for partition_log, info in zip(logs, appended)]
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert rounds.rounds == 1, "eight logs waiting at once share one round"
        assert rounds.fsyncs == 8 and io.fsyncs == 8
        assert [partition_log.high_watermark for partition_log in logs] == [3] * 8
        # What is appended during a round waits for the next one.
        first = logs[0].append(batch(9))
        await asyncio.sleep(0)
        second = logs[1].append(batch(10))
        await asyncio.wait_for(asyncio.gather(logs[0].wait_durable(first.last_offset), logs[1].wait_durable(second.last_offset)), 10)
        assert logs[0].high_watermark == 6 and logs[1].high_watermark == 6
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()
        assert rounds.task is None

    asyncio.run(scenario())


def _pipelined(tmp_path, on_its_way: bool) -> FsyncRounds:
    """A request's append asks for a round while the next request of the same
    client is on its way (its bytes read, its task not yet at its append):
    the second request appends two turns of the loop later, to the same log
    or to another one."""
    rounds = FsyncRounds()
    logs = [PartitionLog.open(str(tmp_path / name), group(), io=CountingIO(), fsync_rounds=rounds) for name in ("a", "b")]

    async def scenario():
        token = object()  # what a broker's server puts there: a connection, a request's task
        if on_its_way:
            rounds.arriving.add(token)
        first = logs[0].append(batch(0))

        async def next_request():
            await asyncio.sleep(0)  # its bytes are read
            await asyncio.sleep(0)  # its frame is cut
            rounds.arriving.discard(token)  # its task starts ...
            return [partition_log.append(batch(1)) for partition_log in logs]  # ... and appends

        second = await next_request()
        waits = [logs[0].wait_durable(first.last_offset)] + [partition_log.wait_durable(info.last_offset) for partition_log, info in zip(logs, second)]
        await asyncio.wait_for(asyncio.gather(*waits), 10)
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
    return rounds


def test_a_round_lets_a_request_on_its_way_join_it(tmp_path):
    """With a request on its way (``FsyncRounds.arriving`` not empty), the
    round waits the turns its append takes and covers both requests; with
    nothing on its way it starts after its one turn and the second request
    waits for a round of its own (what a client with requests in flight met
    before: one fsync per request)."""
    joined = _pipelined(tmp_path / "joined", on_its_way=True)
    assert joined.rounds == 1 and 1 <= joined.settle_turns < SETTLE_TURNS
    alone = _pipelined(tmp_path / "alone", on_its_way=False)
    assert alone.rounds == 2 and alone.settle_turns == 0


def test_a_round_waits_at_most_settle_turns_for_what_never_comes(tmp_path):
    """Something that stays on its way (a connection whose reader is muted by
    a quota, a request task never started) holds a round back by at most
    ``SETTLE_TURNS`` turns of the loop, each time."""
    rounds = FsyncRounds()
    partition_log = PartitionLog.open(str(tmp_path / "data"), group(), io=CountingIO(), fsync_rounds=rounds)
    rounds.arriving.add(object())

    async def scenario():
        for i in range(3):
            appended = partition_log.append(batch(i))
            await asyncio.wait_for(partition_log.wait_durable(appended.last_offset), 10)
        await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
    assert rounds.rounds == 3 and rounds.settle_turns == 3 * (SETTLE_TURNS - 1)  # the first turn of each is every round's


def test_a_failed_fsync_fails_only_its_own_log(tmp_path):
    rounds = FsyncRounds()
    io = CountingIO()
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), group(), io=io, fsync_rounds=rounds) for i in range(4)]
    io.fail_in = f"{os.sep}p2{os.sep}"

    async def scenario():
        appended = [partition_log.append(batch(i)) for i, partition_log in enumerate(logs)]
        results = await asyncio.wait_for(
            asyncio.gather(*(partition_log.wait_durable(info.last_offset) for partition_log, info in zip(logs, appended)), return_exceptions=True), 10)
        assert isinstance(results[2], LogFailedError)
        assert [r for i, r in enumerate(results) if i != 2] == [None, None, None]
        assert logs[2].failed is not None and logs[2].high_watermark == 0
        assert all(logs[i].failed is None and logs[i].high_watermark == 3 for i in (0, 1, 3))
        with pytest.raises(LogFailedError):
            logs[2].append(batch(5))
        more = logs[3].append(batch(6))  # the others go on
        await asyncio.wait_for(logs[3].wait_durable(more.last_offset), 10)
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())


def test_aclose_of_one_log_waits_out_a_shared_round_covering_it(tmp_path):
    rounds = FsyncRounds()
    io = HoldableWorkerFsync(hold=True)
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), group(), io=io, fsync_rounds=rounds) for i in range(3)]

    async def scenario():
        for i, partition_log in enumerate(logs):
            partition_log.append(batch(i))  # three files: the round goes to worker threads
        assert await asyncio.get_running_loop().run_in_executor(None, io.entered.wait, 10), "no worker fsync started"
        closing = asyncio.create_task(logs[0].aclose())
        await asyncio.sleep(0.1)
        assert not closing.done() and not logs[0].closed, "aclose waits while the round fsyncs its files"
        io.release.set()
        await asyncio.wait_for(closing, 10)
        for partition_log in logs[1:]:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
    assert io.closed_during_fsync == []
    assert all(PartitionLog.open(str(tmp_path / f"p{i}"), group()).log_end_offset == 3 for i in range(3))


class PowerCutIO(DiskIO):
    """Remembers, per segment file, how long it was at its last fsync: what a
    machine crash cannot take back. Everything past it may be lost or torn."""

    def __init__(self):
        self.durable_size: dict[str, int] = {}
        self.lock = threading.Lock()

    def fsync(self, fd):
        size = os.fstat(fd).st_size
        path = os.readlink(f"/proc/self/fd/{fd}")
        time.sleep(0.002)  # a slow disk: appends made meanwhile are not covered by this fsync's size
        super().fsync(fd)
        with self.lock:
            self.durable_size[path] = max(size, self.durable_size.get(path, 0))

    def stop_the_machine(self) -> dict[str, int]:
        """What is durable at this instant (an fsync still running may not be)."""
        with self.lock:
            return dict(self.durable_size)


class WriteOrderIO(DiskIO):
    """Records every write to a segment made while an older segment of the
    same log held bytes no fsync had covered: after a machine crash the
    kernel may have written the newer file back and not the older one.
    A segment's bytes are its data, up to where the last write ended (zeros
    written ahead of it, past the data, are not written through ``write``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.written: dict[str, int] = {}
        self.durable: dict[str, int] = {}
        self.out_of_order: list[tuple[str, str]] = []

    def write(self, fd, data):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".log"):
            with self.lock:
                self.out_of_order += [
                    (older, path) for older, size in self.written.items()
                    if os.path.dirname(older) == os.path.dirname(path) and older < path and self.durable.get(older, 0) < size
                ]
        super().write(fd, data)
        if path.endswith(".log"):
            with self.lock:
                self.written[path] = max(self.written.get(path, 0), os.lseek(fd, 0, os.SEEK_CUR))

    def truncate(self, fd, size):
        path = os.readlink(f"/proc/self/fd/{fd}")
        super().truncate(fd, size)
        with self.lock:
            if path in self.written:
                self.written[path] = min(self.written[path], size)

    def fsync(self, fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        with self.lock:
            size = self.written.get(path, os.fstat(fd).st_size)
        super().fsync(fd)
        with self.lock:
            self.durable[path] = max(size, self.durable.get(path, 0))


def test_a_new_segment_gets_no_byte_before_the_old_one_is_durable_whole(tmp_path):
    """A roll is a barrier: the rolled segment is fsynced to its end before
    the new one is written, so what a crash leaves of a log is a prefix
    (never the new segment's batches without the old one's tail)."""
    io = WriteOrderIO()
    rounds = FsyncRounds()
    logs = [PartitionLog.open(str(tmp_path / f"p{i}"), group(segment_bytes=4096), io=io, fsync_rounds=rounds) for i in range(4)]

    async def scenario():
        waits = []
        for i in range(300):
            partition_log = logs[i % len(logs)]
            waits.append(partition_log.wait_durable(partition_log.append(batch(i, records=5)).last_offset))
            if i % 7 == 0:
                await asyncio.sleep(0)  # let some rounds start in between
        await asyncio.wait_for(asyncio.gather(*waits), 30)
        for partition_log in logs:
            await partition_log.aclose()
        await rounds.aclose()

    asyncio.run(scenario())
    assert all(len(partition_log.segments) > 5 for partition_log in logs), "every log rolled"
    assert io.out_of_order == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_a_machine_crash_loses_no_acknowledged_record_of_any_log(tmp_path, seed):
    """Writers on eight logs sharing rounds (small segments: rolls happen,
    rounds mix small and large, on the loop and on workers), cut at a random
    moment; every file then loses or tears what it had not fsynced. Each
    log, reopened (recovery), holds every batch acknowledged before the cut,
    whole and in order."""
    rng = random.Random(seed)
    directories = [str(tmp_path / f"p{i}") for i in range(8)]
    io = PowerCutIO()
    rounds = FsyncRounds()
    logs = [PartitionLog.open(d, group(segment_bytes=32 * 1024, flush_interval_ms=rng.choice([0, 0, 2])), io=io, fsync_rounds=rounds) for d in directories]
    acknowledged: list[list[int]] = [[] for _ in logs]  # last offsets of acknowledged batches

    async def writer(index: int) -> None:
        """A client that keeps appending while earlier appends wait for
        their round (as producers with requests in flight do)."""
        partition_log = logs[index]
        i = 0
        while True:
            info = partition_log.append(batch(i, records=rng.randint(1, 30)))
            waiter = partition_log.wait_durable(info.last_offset)
            waiter.add_done_callback(
                lambda done, last=info.last_offset: None if done.cancelled() or done.exception() else acknowledged[index].append(last))
            i += 1
            await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002]))

    async def scenario():
        tasks = [asyncio.create_task(writer(i)) for i in range(len(logs))]
        await asyncio.sleep(rng.uniform(0.05, 0.4))
        # On a loaded machine a short draw may come before some writer's first
        # round: cut only once every writer has something acknowledged.
        deadline = asyncio.get_running_loop().time() + 30
        while not all(acknowledged) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        # The machine stops at this instant: what was acknowledged so far, and
        # what was durable (a worker's fsync still running does not count).
        acknowledged_then = [list(offsets) for offsets in acknowledged]
        durable_then = io.stop_the_machine()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rounds.aclose()  # let the worker threads end before the files are cut
        return acknowledged_then, durable_then

    acknowledged_then, durable_then = asyncio.run(scenario())
    assert all(acknowledged_then), "every writer had something acknowledged"
    cut_to_durable(durable_then, directories, rng)
    for directory, acked in zip(directories, acknowledged_then):
        reopened = PartitionLog.open(directory, group())
        assert reopened.log_end_offset > max(acked), f"{directory}: acknowledged up to {max(acked)}, recovered to {reopened.log_end_offset}"
        offsets = []
        while not offsets or offsets[-1] + 1 < reopened.log_end_offset:
            data = reopened.read(offsets[-1] + 1 if offsets else 0, 1 << 20)
            assert data, f"{directory}: nothing readable after offset {offsets[-1] if offsets else None} below the log end {reopened.log_end_offset}"
            for position, _header in iter_batches(data):
                offsets += [record.offset for record in decode_batch(data, position).records]
        assert offsets == list(range(reopened.log_end_offset)), "whole batches, in order, nothing half-written"
        reopened.close()
