"""Durability of partition logs: when written bytes become durable, and
who waits for that (``flush.policy``).

"group" (default) is group commit: an fsync starts as soon as there is
unflushed data and no fsync is running, and covers every append made before
it started; appends that arrive during an fsync share the next one.
``flush.interval.ms`` (default 0) spaces a log's rounds at least that far
apart, trading acknowledgement latency for fewer fsyncs. "always" runs the
rounds back to back whatever the interval; "os" fsyncs only at a segment
roll (a machine crash loses what the page cache held; a process crash loses
nothing).

A round is shared by every log of one owner (``FsyncRounds``; a broker has
one for all its partitions: data, ``__transaction_state``,
``__consumer_offsets``): one flusher task takes every log with unflushed data,
fsyncs all their files at once and then acknowledges each log up to where
it stood when the round began. N clients waiting on N partitions thus share
one round instead of queueing N rounds on the loop one after the other (a
round per log, fsynced on the loop, held the loop for each fsync in turn:
with 16 producers a py-spy profile had 59% of the loop's time in those
fsyncs). A round of at most ``INLINE_FSYNC_FILES`` files and
``INLINE_FSYNC_BYTES`` bytes is fsynced right on the loop (two thread
hand-offs would cost as much as the fsync: a lone client, a commit's
markers); a larger one goes to at most ``WORKER_FSYNCS`` worker threads, so
the loop keeps reading and appending the requests that will share the next
round (and the kernel commits the files' journal entries together). Sending
small rounds to a worker too while fsyncs were slow (a moving average above
0.3 ms) was tried: on the loaded shared machine it doubled the 4 KiB-batch
producer and one-record transactions in one A/B and cut a lone copier's
transactions to a third in another, so the rule stays this simple one.

Before a round starts, the flusher lets requests already on their way join
it (``FsyncRounds.arriving``, filled by the owner's network edge: a
connection whose reader was waiting when a whole request came, until it has
taken it; an appending request whose task has not started), for at most
``SETTLE_TURNS`` turns of the loop, and only before a round small enough to
fsync on the loop (a larger one runs on workers while the loop appends). A
client with requests in flight sends the next as an answer reaches it, so
that request's bytes come in just after the append that asked for the round;
started at once, every round covered one request (a librdkafka idempotent
producer with 4 KiB batches: 16,646 rounds for 16,667 requests), and with
the wait two requests share one. With nothing on its way (a lone client
waiting for this very round) a round starts after one turn (``_settle``). Every state change (high watermark,
waiters, checkpoint) stays on the loop. Without a running loop appends
fsync synchronously. A log opened on its own gets rounds of its own.

The log's high watermark is the end of the durable data (``durable_offset``):
consumers never see what a crash could take back, and ``wait_durable(offset)``
is how a Produce with acks=all waits for its fsync. If a write or fsync fails,
nothing after the last durable offset is ever acknowledged: that log (only
that one) goes into a failed state and refuses appends (``LogFailedError``)
until it is reopened, which runs recovery and truncates whatever is not whole.

A roll is a barrier (``PartitionLog.roll``): the old segment is fsynced
whole before the new one gets a byte, and everything below the new base
is then durable (``rolled``), so the recovery point moves there and
recovery after a crash scans only the active segment.

``GroupCommitter`` is the log's (``PartitionLog.committer``); it reads the
log's ``log_end_offset``, moves its ``durable_offset`` and nothing else.

What it measures goes to ``observer`` (a ``FlushObserver``, None by default):
each round's fsync time, bytes and appends (over every log in it), as plain
numbers. The broker sets one on every log it opens and turns them into its
metrics; storage knows nothing of how they are exported.

Stopping: an fsync on a worker thread cannot be interrupted, so a cancelled
flusher first waits for the ones it started (then fails each log whose fsync
failed) and only then ends. A log's files must not be closed under such an
fsync (the thread would fsync a closed, or reused, descriptor), so an owner
under asyncio closes a log with ``PartitionLog.aclose()``, which waits out a
round that covers the log (and stops the log's own flusher if it has one);
a segment closed synchronously meanwhile (retention, DeleteRecords, a
compaction swap) keeps its descriptor open until the worker returns
(``LogSegment.pin_for_fsync``);
the owner of shared rounds stops them with ``FsyncRounds.aclose()`` after its
logs. The synchronous ``close()`` cannot wait for a task and is for callers
without a running loop, where no flusher exists.
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

# A round of at most this many files and bytes fsyncs on the loop (see FsyncRounds).
INLINE_FSYNC_FILES = 2
INLINE_FSYNC_BYTES = 16 * 1024
# A larger round's files are split among at most this many worker threads.
WORKER_FSYNCS = 4
# A round waits at most this many turns of the loop for requests on their way
# to an append (``FsyncRounds.arriving``).
SETTLE_TURNS = 4


def fsyncs_on_the_loop(files: int, nbytes: int) -> bool:
    """Whether a round of ``files`` files and ``nbytes`` bytes is fsynced
    right on the loop (else on worker threads)."""
    return files <= INLINE_FSYNC_FILES and nbytes <= INLINE_FSYNC_BYTES


class FlushObserver(Protocol):
    """Told after every fsync round that succeeded (a seam the composition
    root fills: ``broker.storage_adapter``)."""

    def flushed(self, seconds: float, round_bytes: int, round_appends: int) -> None: ...


class LogFailedError(Exception):
    """The log hit a disk error and refuses appends until reopened (KAFKA_STORAGE_ERROR)."""


class GroupCommitter:
    def __init__(self, partition_log: PartitionLog, rounds: FsyncRounds | None = None):
        self.log = partition_log
        self.owns_rounds = rounds is None  # a log opened on its own has rounds of its own
        self.rounds = FsyncRounds() if rounds is None else rounds
        self.waiters: list[tuple[int, asyncio.Future]] = []
        self.last_flush = float("-inf")
        self.unflushed: list[LogSegment] = []  # written since the last fsync
        self.unflushed_bytes = 0
        self.unflushed_appends = 0
        self.observer: FlushObserver | None = None
        self.syncing: list[LogSegment] = []  # being fsynced by a round now
        self.durable_after_round = 0  # made durable by a roll during that round: acknowledged once it succeeds

    @property
    def task(self) -> asyncio.Task | None:
        """The flusher of this log's rounds (shared with the other logs of its owner)."""
        return self.rounds.task

    # -------------------------------------------------------------- what the log tells it

    def wrote(self, segment: LogSegment, size: int, *, flush: bool = True) -> None:
        """``size`` bytes were appended to ``segment`` (the log end has moved);
        without ``flush`` they wait for a round someone else asks for (a
        later append's, or ``wait_durable``'s)."""
        self.unflushed_bytes += size
        self.unflushed_appends += 1
        if segment not in self.unflushed:
            self.unflushed.append(segment)
        if self.log.config.flush_policy == FLUSH_OS:
            self.log.durable_offset = self.log.log_end_offset
            self.release_waiters()
            return
        if flush:
            self.schedule()

    def rolled(self, old: LogSegment, seconds: float) -> None:
        """The log fsynced every segment up to ``old`` (taking ``seconds``)
        at a roll: everything written so far is durable. If a round is
        fsyncing this log on a worker meanwhile, the acknowledgement waits
        for that round: had its fsync failed, the roll's fsync of the same
        descriptor could return 0 (the kernel reports a writeback error
        once), and the round's failure must win."""
        round_bytes, round_appends = self.unflushed_bytes, self.unflushed_appends
        self.unflushed.clear()
        self.unflushed_bytes = self.unflushed_appends = 0
        if self.observer is not None:
            self.observer.flushed(seconds, round_bytes, round_appends)
        if self.syncing:
            self.durable_after_round = self.log.log_end_offset
        else:
            self._made_durable(self.log.log_end_offset)

    def forget(self, segment: LogSegment) -> None:
        """``segment`` is gone (retention, a compaction swap): nothing to fsync."""
        if segment in self.unflushed:
            self.unflushed.remove(segment)

    # -------------------------------------------------------------- fsync rounds

    def schedule(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            # Not under asyncio (tools, tests of the sync API): fsync now.
            self.flush()
            return
        self.rounds.request(self)

    def has_work(self) -> bool:
        return bool(self.unflushed) and self.log.failed is None and not self.log.closed

    def delay(self, now: float) -> float:
        """Seconds until this log may start a round: at most one fsync per
        ``flush.interval.ms`` ("group"), but no wait when the last one is
        older than that (a lone append is acknowledged at fsync speed)."""
        if self.log.config.flush_policy == FLUSH_ALWAYS:
            return 0.0
        return self.last_flush + self.log.config.flush_interval_ms / 1000.0 - now

    def begin_round(self, now: float) -> tuple[int, int, int]:
        """This log joins the round starting now: its unflushed segments move
        to ``syncing``. Returns (the offset the round makes durable, bytes,
        appends)."""
        target = self.log.log_end_offset
        self.syncing = [segment for segment in self.unflushed if not segment.closed]
        self.unflushed.clear()
        size, appends = self.unflushed_bytes, self.unflushed_appends
        self.unflushed_bytes = self.unflushed_appends = 0
        self.last_flush = now
        return target, size, appends

    def end_round(self, target: int, error: OSError | None) -> None:
        """The round's fsyncs of this log's segments returned (``error`` if one failed)."""
        self.syncing = []
        partition_log = self.log
        if error is not None:
            if not partition_log.closed:  # close() fsyncs itself; a late EBADF is no failure
                partition_log.mark_failed(error)
            return
        if partition_log.failed is None and not partition_log.closed:
            self._made_durable(max(target, self.durable_after_round))

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
            partition_log.mark_failed(error)
            raise LogFailedError(f"fsync failed: {error}") from error
        if self.observer is not None and segments:
            self.observer.flushed(time.perf_counter() - began, round_bytes, round_appends)
        self._made_durable(target)

    def _made_durable(self, target: int) -> None:
        self.log.durable_offset = max(self.log.durable_offset, target)
        self.release_waiters()

    # -------------------------------------------------------------- waiters

    def wait_durable(self, offset: int, *, ask: bool = True) -> asyncio.Future:
        """A future that completes when ``offset`` is durable (fails if it
        never will be); without ``ask``, appends made without ``flush`` stay
        waiting for a round someone else asks for."""
        future = asyncio.get_running_loop().create_future()
        if self.log.failed is not None:
            future.set_exception(LogFailedError(f"not durable: {self.log.failed}"))
        elif self.log.is_durable(offset):
            future.set_result(None)
        else:
            self.waiters.append((offset, future))
            if ask and self.unflushed and self not in self.rounds.pending:
                self.rounds.request(self)  # appended without asking for a round (``wrote(flush=False)``)
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
        """The log is closing (it has flushed): it leaves its rounds, and
        rounds of its own stop (``aclose()`` also waits)."""
        self.rounds.discard(self)
        if self.owns_rounds:
            self.rounds.stop()

    async def aclose(self) -> None:
        """Leave the rounds and wait until none is fsyncing this log's files
        (on a worker thread); rounds of its own are stopped and waited for."""
        self.rounds.discard(self)
        if self.owns_rounds:
            await self.rounds.aclose()
        else:
            await self.rounds.wait_out(self)


class FsyncRounds:
    """The group-commit flusher of a set of logs (a broker's: all of them).

    A log with unflushed data asks for a round (``request``); the one flusher
    task takes every log whose ``flush.interval.ms`` allows it, fsyncs all
    their segments in one go (on the loop when it is small, else on worker
    threads) and acknowledges each log up to its end when the round began.
    Logs that ask meanwhile wait for the next round. A failed fsync fails
    only the log it belongs to."""

    def __init__(self):
        self.pending: dict[GroupCommitter, None] = {}  # an ordered set: logs asking for a round
        # Requests on their way to an append, filled by the owner's network
        # edge (the broker's servers: a connection with a whole request its
        # reader has yet to take, a request whose task has not started): a round lets them
        # join it, for at most SETTLE_TURNS turns of the loop (``_settle``).
        self.arriving: set = set()
        self.task: asyncio.Task | None = None
        self.asked: asyncio.Event | None = None  # wakes a flusher waiting out an interval
        self.round_over: asyncio.Future | None = None  # done when the running round's fsyncs have returned
        self.in_round: set[GroupCommitter] = set()
        self.rounds = 0  # rounds run, and fsyncs made by them (tests, benchmarks)
        self.fsyncs = 0
        self.inline_rounds = 0
        self.settle_turns = 0  # turns rounds waited for requests on their way (beyond the first)

    def request(self, committer: GroupCommitter) -> None:
        self.pending[committer] = None
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())
        elif self.asked is not None:
            self.asked.set()

    def discard(self, committer: GroupCommitter) -> None:
        self.pending.pop(committer, None)

    async def run(self) -> None:
        """One round at a time while any log asks for one."""
        loop = asyncio.get_running_loop()
        try:
            while self.pending:
                await self._settle()
                due, wait = self._due(loop.time())
                if due:
                    await self._round(loop, due)
                elif wait is not None:
                    self.asked = asyncio.Event()
                    try:
                        await asyncio.wait_for(self.asked.wait(), wait)
                    except TimeoutError:
                        pass
                    finally:
                        self.asked = None
        finally:
            self.task = None

    async def _settle(self) -> None:
        """Let requests already on their way join the coming round. A client
        with several requests in flight sends its next one as an answer
        reaches it, so that request's bytes are often read just after the
        append that asked for this round, and its append comes a turn or two
        later (its frame is cut at the next turn, its handler starts at the
        one after). Started at once, the round would cover one request each
        time, and the next request would wait for a round of its own; waiting
        those turns lets both share one fsync. Nothing on its way (a lone
        client waiting for this very round): one turn and no more. Only before a
        round small enough to run on the loop, which holds every request
        behind it while it fsyncs: a larger one runs on worker threads while
        the loop goes on appending what comes, for the round after."""
        pending = self.pending
        if not fsyncs_on_the_loop(sum(len(committer.unflushed) for committer in pending), sum(committer.unflushed_bytes for committer in pending)):
            return  # a round for worker threads: the loop appends what comes meanwhile, for the next one
        # One turn first whatever the set holds: asyncio's own loop runs the
        # I/O callbacks of a poll after what was already queued (this step),
        # so a request its last poll read is not in the set yet (uvloop reads
        # before it runs the queue: the turn costs a few microseconds there).
        await asyncio.sleep(0)
        turns = 1
        while self.arriving and turns < SETTLE_TURNS:
            await asyncio.sleep(0)
            turns += 1
        self.settle_turns += turns - 1

    def _due(self, now: float) -> tuple[list[GroupCommitter], float | None]:
        """The logs that join a round now (removed from ``pending``), and how
        long until the next of the others may."""
        due, wait = [], None
        for committer in list(self.pending):
            if not committer.has_work():
                del self.pending[committer]
                continue
            delay = committer.delay(now)
            if delay <= 0:
                del self.pending[committer]
                due.append(committer)
            else:
                wait = delay if wait is None else min(wait, delay)
        return due, wait

    async def _round(self, loop: asyncio.AbstractEventLoop, due: list[GroupCommitter]) -> None:
        now = loop.time()
        targets, sizes = [], []
        for committer in due:
            target, size, appends = committer.begin_round(now)
            targets.append(target)
            sizes.append((size, appends))
        total_bytes = sum(size for size, _appends in sizes)
        work = [(committer, segment) for committer in due for segment in committer.syncing]
        errors: dict[GroupCommitter, OSError] = {}
        self.in_round = set(due)
        self.round_over = loop.create_future()
        self.rounds += 1
        self.fsyncs += len(work)
        began = time.perf_counter()
        try:
            if fsyncs_on_the_loop(len(work), total_bytes):
                self.inline_rounds += 1
                for committer, segment in work:
                    try:
                        segment.fsync_unless_closed()
                    except OSError as error:
                        errors.setdefault(committer, error)
            else:
                await self._fsync_on_workers(loop, work, errors)
        finally:
            self.round_over.set_result(None)
            self.round_over = None
            self.in_round = set()
        seconds = time.perf_counter() - began
        for committer, target in zip(due, targets):
            committer.end_round(target, errors.get(committer))
        succeeded = [(committer, size) for committer, size in zip(due, sizes) if committer not in errors]
        observer = next((committer.observer for committer, _size in succeeded if committer.observer is not None), None)
        if observer is not None:
            observer.flushed(seconds, sum(size for _c, (size, _a) in succeeded), sum(appends for _c, (_s, appends) in succeeded))

    async def _fsync_on_workers(self, loop, work: list[tuple[GroupCommitter, LogSegment]], errors: dict) -> None:
        """fsync ``work`` on up to ``WORKER_FSYNCS`` worker threads. Cancelled
        meanwhile, wait for the threads (they cannot be stopped) before
        ending, and fail every log whose fsync failed: whoever waits for this
        task may then close the files."""

        def fsync_all(share):
            failed = {}
            for committer, segment in share:
                try:
                    segment.fsync_unless_closed()
                except OSError as error:
                    failed.setdefault(committer, error)
            return failed

        def unpin(share):
            for _committer, segment in share:
                segment.unpin_for_fsync()

        shares = [work[i::WORKER_FSYNCS] for i in range(min(WORKER_FSYNCS, len(work)))]
        threads = []
        for share in shares:
            # Each segment's descriptor stays open until its thread returns,
            # whoever closes the segment meanwhile (a deleted topic, retention,
            # DeleteRecords, a compaction swap): see LogSegment.close.
            for _committer, segment in share:
                segment.pin_for_fsync()
            try:
                thread = loop.run_in_executor(None, fsync_all, share)
            except BaseException:
                unpin(share)
                raise
            thread.add_done_callback(lambda _thread, share=share: unpin(share))
            threads.append(thread)
        try:
            results = await asyncio.shield(asyncio.gather(*threads))
        except asyncio.CancelledError:
            await asyncio.wait(threads)
            for thread in threads:
                for committer, error in ({} if thread.cancelled() or thread.exception() else thread.result()).items():
                    if not committer.log.closed:
                        committer.log.mark_failed(error)
            raise
        for failed in results:
            for committer, error in failed.items():
                errors.setdefault(committer, error)

    async def wait_out(self, committer: GroupCommitter) -> None:
        """Return once no running round is fsyncing ``committer``'s files."""
        while committer in self.in_round and self.round_over is not None:
            await asyncio.shield(self.round_over)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def aclose(self) -> None:
        """Stop the flusher and wait until it has ended (with any fsync it
        had started on a worker thread)."""
        await cancel_and_wait(self.task)
