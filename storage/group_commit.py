"""Durability of one partition log: when written bytes become durable, and
who waits for that (``flush.policy``).

"group" (default) is group commit: an fsync starts as soon as there is
unflushed data and no fsync is running, and covers every append made before
it started; appends that arrive during an fsync share the next one.
``flush.interval.ms`` (default 0) spaces the rounds at least that far apart,
trading acknowledgement latency for fewer fsyncs. "always" runs the rounds
back to back whatever the interval; "os" never fsyncs (a machine crash loses
what the page cache held; a process crash loses nothing).

The log's high watermark is the end of the durable data (``durable_offset``):
consumers never see what a crash could take back, and ``wait_durable(offset)``
is how a Produce with acks=all waits for its fsync. Under asyncio one flusher
task per log runs the fsyncs: a round of at most ``INLINE_FSYNC_BYTES`` right
on the loop (two thread hand-offs would cost as much as the fsync), larger
ones on the default executor; every state change (high watermark, waiters,
checkpoint) stays on the loop. Without a running loop appends fsync
synchronously. If a write or fsync fails, nothing after the last durable
offset is ever acknowledged: the log goes into a failed state and refuses
appends (``LogFailedError``) until it is reopened, which runs recovery and
truncates whatever is not whole.

The recovery point moves here too: once an fsync has covered every segment
below the last roll, it moves to that roll's base offset and is
checkpointed, so recovery after a crash scans only from the active segment.

``GroupCommitter`` is the log's (``PartitionLog.committer``); it reads and
moves the log's ``log_end_offset``, ``durable_offset`` and ``recovery_point``
and nothing else.

What it measures goes to ``observer`` (a ``FlushObserver``, None by default):
each round's fsync time, bytes and appends, as plain numbers. The broker
sets one on every log it opens and turns them into its metrics; storage
knows nothing of how they are exported.

Stopping the flusher: an fsync on a worker thread cannot be interrupted, so
a cancelled flusher first waits for the one it started (then fails the log
if it failed) and only then ends; ``aclose()`` cancels it and waits for
that. The log's files must not be closed before (the thread would fsync a
closed, or reused, descriptor), so an owner under asyncio closes a log with
``PartitionLog.aclose()``; the synchronous ``close()`` cannot wait for a
task and is for callers without a running loop, where no flusher exists.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from protocol.tasks import cancel_and_wait
from storage.config import FLUSH_ALWAYS, FLUSH_OS
from storage.segment import LogSegment

if TYPE_CHECKING:
    from storage.log import PartitionLog

# Rounds covering at most this many bytes fsync on the loop (see GroupCommitter.run).
INLINE_FSYNC_BYTES = 16 * 1024


class FlushObserver(Protocol):
    """Told after every fsync round that succeeded (a seam the composition
    root fills: ``broker.storage_adapter``)."""

    def flushed(self, seconds: float, round_bytes: int, round_appends: int) -> None: ...


class LogFailedError(Exception):
    """The log hit a disk error and refuses appends until reopened (KAFKA_STORAGE_ERROR)."""


class GroupCommitter:
    def __init__(self, partition_log: "PartitionLog"):
        self.log = partition_log
        self.waiters: list[tuple[int, asyncio.Future]] = []
        self.task: asyncio.Task | None = None
        self.last_flush = float("-inf")
        self.unflushed: list[LogSegment] = []  # written since the last fsync
        self.unflushed_bytes = 0
        self.unflushed_appends = 0
        self.observer: FlushObserver | None = None
        self.syncing: list[LogSegment] = []  # being fsynced by the flusher now
        self.next_recovery_point: int | None = None  # a roll's base, once what is below it is durable

    # -------------------------------------------------------------- what the log tells it

    def wrote(self, segment: LogSegment, size: int) -> None:
        """``size`` bytes were appended to ``segment`` (the log end has moved)."""
        self.unflushed_bytes += size
        self.unflushed_appends += 1
        if segment not in self.unflushed:
            self.unflushed.append(segment)
        if self.log.config.flush_policy == FLUSH_OS:
            self.log.durable_offset = self.log.log_end_offset
            self.release_waiters()
            return
        self.schedule()

    def rolled(self, old: LogSegment, base: int) -> None:
        """A new segment starts at ``base``: the recovery point may move there
        once ``old`` (whose indexes the log has made durable) is fsynced."""
        if old not in self.unflushed and old.size:
            self.unflushed.append(old)
        self.next_recovery_point = base

    def forget(self, segment: LogSegment) -> None:
        """``segment`` is gone (retention, a compaction swap): nothing to fsync."""
        if segment in self.unflushed:
            self.unflushed.remove(segment)

    # -------------------------------------------------------------- fsync rounds

    def schedule(self) -> None:
        if self.task is not None:
            return  # the running flusher picks up this append (it loops while data is unflushed)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not under asyncio (tools, tests of the sync API): fsync now.
            self.flush()
            return
        self.task = loop.create_task(self.run())

    async def run(self) -> None:
        """The group committer's task: one at a time, each round one fsync
        (on a worker thread) covering every append made before it started;
        rounds start at most every ``flush.interval.ms`` ("group") or back to
        back ("always"). Appends made during an fsync wait for the next
        round. State (high watermark, waiters) changes only here, on the
        loop, never on the worker thread."""
        partition_log = self.log
        loop = asyncio.get_running_loop()
        interval = partition_log.config.flush_interval_ms / 1000.0
        try:
            while self.unflushed and partition_log.failed is None and not partition_log.closed:
                if partition_log.config.flush_policy != FLUSH_ALWAYS:
                    # At most one fsync per interval, but no wait when the last
                    # one is older than that: a lone append is acknowledged at
                    # fsync speed, a busy log shares fsyncs.
                    delay = self.last_flush + interval - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                if partition_log.closed or partition_log.failed is not None:
                    return
                target = partition_log.log_end_offset
                self.syncing = [segment for segment in self.unflushed if not segment.closed]
                self.unflushed.clear()
                # A small round (a commit's control records, a lone small
                # batch) is fsynced right here: it takes about as long as the
                # two thread hand-offs of the executor would add. Larger ones
                # go to a worker thread so the loop keeps serving.
                inline = self.unflushed_bytes <= INLINE_FSYNC_BYTES and len(self.syncing) == 1
                round_bytes, round_appends = self.unflushed_bytes, self.unflushed_appends
                self.unflushed_bytes = self.unflushed_appends = 0
                self.last_flush = loop.time()
                began = time.perf_counter()
                try:
                    for segment in self.syncing:
                        if inline:
                            segment.fsync_unless_closed()
                        else:
                            await self._fsync_on_a_worker(loop, segment)
                except OSError as error:
                    if not partition_log.closed:  # close() fsyncs itself; a late EBADF is no failure
                        partition_log._fail(error)
                    return
                finally:
                    self.syncing = []
                if partition_log.failed is not None or partition_log.closed:
                    return
                if self.observer is not None:
                    self.observer.flushed(time.perf_counter() - began, round_bytes, round_appends)
                self._made_durable(target)
        finally:
            self.task = None

    async def _fsync_on_a_worker(self, loop: asyncio.AbstractEventLoop, segment: LogSegment) -> None:
        """fsync ``segment`` on a worker thread. Cancelled meanwhile, wait for
        the thread to finish (it cannot be stopped) before ending, and fail
        the log if its fsync failed: whoever waits for this task may then
        close the files."""
        fsync = loop.run_in_executor(None, segment.fsync_unless_closed)
        try:
            await asyncio.shield(fsync)
        except asyncio.CancelledError:
            await asyncio.wait([fsync])
            error = None if fsync.cancelled() else fsync.exception()
            if isinstance(error, OSError) and not self.log.closed:
                self.log._fail(error)
            raise

    def flush(self) -> None:
        """fsync everything written so far, synchronously (also what an
        in-flight group commit is still syncing), then acknowledge it."""
        partition_log = self.log
        if partition_log.failed is not None or partition_log.closed:
            return
        target = partition_log.log_end_offset
        segments = list(dict.fromkeys(self.syncing + self.unflushed))
        self.unflushed.clear()
        round_bytes, round_appends = self.unflushed_bytes, self.unflushed_appends
        self.unflushed_bytes = self.unflushed_appends = 0
        began = time.perf_counter()
        try:
            for segment in segments:
                segment.fsync_unless_closed()
        except OSError as error:
            partition_log._fail(error)
            raise LogFailedError(f"fsync failed: {error}") from error
        if self.observer is not None and segments:
            self.observer.flushed(time.perf_counter() - began, round_bytes, round_appends)
        self._made_durable(target)

    def _made_durable(self, target: int) -> None:
        self.log.durable_offset = max(self.log.durable_offset, target)
        self._advance_recovery_point(target)
        self.release_waiters()

    def _advance_recovery_point(self, synced_to: int) -> None:
        """After an fsync that covered every segment below the last roll, the
        recovery point moves to that roll's base offset and is checkpointed:
        recovery after a crash then scans only from the active segment on
        (Kafka flushes a rolled segment and moves its recovery point the
        same way). Under "os" nothing is fsynced, so it moves only on close."""
        partition_log = self.log
        point = self.next_recovery_point
        if point is None or synced_to < point or point <= partition_log.recovery_point:
            return
        self.next_recovery_point = None
        partition_log.recovery_point = point
        try:
            partition_log._write_checkpoint()
        except OSError as error:
            partition_log._fail(error)

    # -------------------------------------------------------------- waiters

    def wait_durable(self, offset: int) -> asyncio.Future:
        """A future that completes when ``offset`` is durable (fails if it never will be)."""
        future = asyncio.get_running_loop().create_future()
        if self.log.failed is not None:
            future.set_exception(LogFailedError(f"not durable: {self.log.failed}"))
        elif offset < self.log.durable_offset:
            future.set_result(None)
        else:
            self.waiters.append((offset, future))
        return future

    def release_waiters(self) -> None:
        if not self.waiters:
            return
        durable = self.log.durable_offset
        remaining = []
        for offset, future in self.waiters:
            if offset < durable:
                if not future.done():
                    future.set_result(None)
            else:
                remaining.append((offset, future))
        self.waiters = remaining

    def fail_waiters(self, error: Exception) -> None:
        """Nothing waiting will become durable (the log failed or closed)."""
        for _offset, future in self.waiters:
            if not future.done():
                future.set_exception(error)
        self.waiters.clear()

    def stop(self) -> None:
        """The log is closing (it has flushed): the flusher task is not
        needed. Only tells it to stop; ``aclose()`` also waits."""
        if self.task is not None:
            self.task.cancel()

    async def aclose(self) -> None:
        """Stop the flusher and wait until it has ended (with any fsync it
        had started on a worker thread)."""
        await cancel_and_wait(self.task)
