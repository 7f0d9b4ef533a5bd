"""The runner's transaction: one Kafka transaction covering the records the
processors emitted, their stores' changes (to the changelogs) and the input
offsets they reach, and what becomes of it (``Outcome``).

``Transaction`` owns the instance's transactional producer and the open
transaction's bookkeeping (records in, records out, next offsets, the
emitted records not yet handed to the producer). Emits are gathered
(``add``) and go to the producer as column batches (``send_columns``: one
encoding, one future per topic and call, not one per record) when the
runner has processed a poll's records (``send_pending``) and before the
commit; the changelog writes go the same way. The idempotent and
transactional sequencing is the producer's, unchanged: a failed batch fails
the commit as a failed record did. Its ``commit`` does, in order:

    the emits not yet sent -> the producer
    the dirty stores' pending writes -> their changelogs (one record per key)
    flush, and send_offsets_to_transaction(next offsets, group metadata)   (together)
    commit_transaction
    [crash point streaming.after_commit_before_store_apply]
    the writes -> each store's committed layer and its SQLite file, with the
                  changelog offset they reach

and answers with an outcome, never leaving the producer in doubt:

| outcome | when | what the caller does |
| --- | --- | --- |
| ``COMMITTED`` | the broker committed it | carry on |
| ``ABORTED`` | an abortable error (TransactionAbortable, CommitFailed, retries exhausted, connection): aborted here, the stores' pending writes dropped | rewind every partition to its committed offset |
| ``UNKNOWN`` | the commit's answer was lost: a new producer's init_transactions settled it (committed or aborted, as the coordinator had decided) | rewind, catch every shard up with its changelog, then ``settled(...)`` tells whether it committed |

A fenced producer (its transactional id taken, or its transaction aborted by
the broker's timeout) raises ``InstanceFencedError`` from any of these, after
``on_fenced`` (the runner's lifecycle) has heard of it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Callable

import attrs
import pyarrow as pa

from protocol.columnar import HEADERS_TYPE
from streaming.app import App
from streaming.errors import InstanceFencedError
from streaming.store import Store, StoreFile
from txn.errors import GROUP_FENCING, TRANSIENT_ERRORS, ApplicationRecoverableError, CommitFailedError, CommitOutcomeUnknownError, KafkaError, RetriableError, TransactionAbortableError
from txn.column_batches import binary_array, int64_array
from txn.producer import AsyncProducer
from txn.types import OffsetAndMetadata, TopicPartition

log = logging.getLogger("streaming.runner")

CRASH_AFTER_COMMIT = "streaming.after_commit_before_store_apply"
DEFAULTS_PRODUCER = {"transaction_timeout_ms": 10_000, "linger_ms": 5}
ABORTABLE = (TransactionAbortableError, CommitFailedError, *TRANSIENT_ERRORS)


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


@attrs.frozen
class CommitResult:
    outcome: Outcome
    error: BaseException | None = None
    # UNKNOWN only: what the settled transaction did, counted if it committed.
    offsets: dict = attrs.field(factory=dict)
    outputs: int = 0
    counts: dict = attrs.field(factory=dict)


def abort_cause(error: BaseException) -> str:
    """Why an abortable error aborted the transaction, in a few bounded words (a metric's label)."""
    if getattr(error, "code", None) in GROUP_FENCING:
        return "group_fenced"
    if isinstance(error, CommitFailedError):
        return "commit_failed"
    if isinstance(error, TransactionAbortableError):
        return "transaction_abortable"
    if isinstance(error, RetriableError):
        return "retries_exhausted"
    if isinstance(error, TimeoutError):
        return "timeout"
    return "connection"


class Transaction:
    """The producer and its open transaction. ``task`` (``streaming.task``)
    holds the counters and dirty stores the processors filled; ``shard_file``
    gives the SQLite file of a store shard still held (None once released)."""

    def __init__(self, app: App, task, shard_file: Callable[[Store], StoreFile | None], on_fenced: Callable[[], None]):
        self.app = app
        self.metrics = app.metrics
        self.task = task
        self.shard_file = shard_file
        self.on_fenced = on_fenced
        self.producer: AsyncProducer | None = None
        self.open = False
        self.started = 0.0
        self.records = 0
        self.outputs = 0
        self.offsets: dict[TopicPartition, int] = {}
        # Emitted, not yet handed to the producer: (topic, key, value, headers, timestamp, processor).
        self.pending: list[tuple] = []

    # -- the producer ------------------------------------------------------------------------------

    def _new_producer(self) -> AsyncProducer:
        app = self.app
        return AsyncProducer(app.bootstrap_servers, transactional_id=app.transactional_id, **{**DEFAULTS_PRODUCER, **app.producer_options})

    async def start(self) -> None:
        self.producer = self._new_producer()
        await self.producer.init_transactions()

    async def renew_producer(self) -> None:
        """Replace the producer: init_transactions finishes (commit or abort,
        as the coordinator decided) whatever the old one left open."""
        self.open = False
        self._discard_pending()
        self.pending = []
        old, self.producer = self.producer, self._new_producer()
        await old.cluster.abandon()
        try:
            await self.producer.init_transactions()
        except ApplicationRecoverableError as error:
            raise self.fenced(error) from error

    async def close(self) -> None:
        if self.producer is not None:
            try:
                await self.producer.close()
            except Exception as error:
                log.warning("closing the producer: %s", error)

    def fenced(self, error: Exception) -> InstanceFencedError:
        self.open = False
        self.on_fenced()
        app = self.app
        message = (f"instance {app.instance_id} of {app.application_id} was fenced ({error}): another producer "
                   f"took transactional id {app.transactional_id}, or the broker aborted this instance's transaction after "
                   "it stalled past transaction_timeout_ms; it writes nothing more and stops")
        log.error(message)
        return InstanceFencedError(message)

    # -- the open transaction ------------------------------------------------------------------------

    def begin(self) -> None:
        if not self.open:
            self.producer.begin_transaction()
            self.open = True
            self.started = time.monotonic()

    def add(self, outputs: list[tuple]) -> None:
        """Records the processors emitted in the open transaction, to send with
        the next ``send_pending``: (topic, key, value, headers, timestamp, processor)."""
        self.pending += outputs
        self.outputs += len(outputs)

    async def send_pending(self) -> None:
        """Hand the emits gathered so far to the producer, a column batch per topic."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        by_topic: dict[str, list[tuple]] = {}
        if all(output[0] == pending[0][0] for output in pending):
            by_topic[pending[0][0]] = pending
        else:
            for output in pending:
                by_topic.setdefault(output[0], []).append(output)
        for topic, outputs in by_topic.items():
            _topics, keys, values, headers, timestamps, _processors = zip(*outputs)
            await self.producer.send_columns(topic, binary_array(values), binary_array(keys), headers=_headers_column(headers), timestamp=int64_array(timestamps))

    def processed(self, tp: TopicPartition, next_offset: int) -> None:
        """One more input record is in the transaction; ``tp`` reaches ``next_offset``."""
        self.offsets[tp] = next_offset
        self.records += 1

    def _forget(self) -> None:
        self.records = self.outputs = 0
        self.offsets = {}
        self.pending = []
        self.task.forget()

    def _discard_pending(self) -> None:
        for store in self.task.take_dirty():
            store.discard_pending()

    async def abort(self, cause: str) -> None:
        self.metrics.aborted(cause)
        self.open = False
        self._forget()
        self._discard_pending()
        try:
            await self.producer.abort_transaction()
        except ApplicationRecoverableError as error:
            raise self.fenced(error) from error
        except (KafkaError, OSError) as error:
            log.warning("abort failed (%s): a new producer aborts it instead", error)
            await self.renew_producer()

    async def abort_quietly(self, cause: str) -> None:
        """On the way out after an error: abort if the broker lets us (else
        the coordinator's timeout aborts it)."""
        if not self.open or self.producer is None:
            return
        self.open = False
        self.metrics.aborted(cause)
        try:
            await self.producer.abort_transaction()
        except Exception as error:
            log.warning("could not abort the open transaction on the way out: %s", error)

    # -- commit ---------------------------------------------------------------------------------------

    async def commit(self, group_metadata) -> CommitResult:
        """Commit the open transaction (see the module's table)."""
        try:
            await self._commit(group_metadata)
            return CommitResult(Outcome.COMMITTED)
        except ApplicationRecoverableError as error:
            raise self.fenced(error) from error
        except CommitOutcomeUnknownError as error:
            log.warning("commit outcome unknown (%s): settling it with a new producer, then rewinding", error)
            self.metrics.add("commits_unknown")
            result = CommitResult(Outcome.UNKNOWN, error, self.offsets, self.outputs, self.task.counts)
            self._forget()  # the next transaction starts from what is committed
            await self.renew_producer()
            return result
        except ABORTABLE as error:
            log.warning("transaction aborted: %s: %s; rewinding to the committed offsets", type(error).__name__, error)
            await self.abort(abort_cause(error))
            return CommitResult(Outcome.ABORTED, error)

    def settled(self, result: CommitResult, committed_offsets: dict[TopicPartition, int]) -> bool:
        """After an UNKNOWN outcome and the rewind: it committed iff the
        group's offsets (``committed_offsets`` of the partitions rewound)
        reached the transaction's; only then is what it did counted."""
        if result.offsets and all(tp in committed_offsets and committed_offsets[tp] >= offset for tp, offset in result.offsets.items()):
            self._count_committed(result.outputs, result.counts)
            return True
        return False

    def _count_committed(self, outputs: int, counts: dict[str, int]) -> None:
        self.metrics.add("commits")
        self.metrics.add("records_out", outputs)
        for name, n in counts.items():
            self.metrics.add(name, n)

    async def _commit(self, group_metadata) -> None:
        producer = self.producer
        began = time.monotonic()
        await self.send_pending()
        written: list[tuple[Store, dict, object]] = []
        for store in self.task.take_dirty():
            changes = store.take_pending()
            if not changes:
                continue
            topic = self.app.changelog_topic(store.name)
            outcome = await producer.send_columns(topic, binary_array(list(changes.values())), binary_array(list(changes.keys())), partition=store.partition)
            written.append((store, changes, outcome))
        # The offsets' round trips (AddOffsetsToTxn, TxnOffsetCommit) overlap
        # the records' flush; both finish (no orphan task) before any error counts.
        steps = [producer.flush()]
        if self.offsets:
            offsets = {tp: OffsetAndMetadata(offset) for tp, offset in self.offsets.items()}
            steps.append(producer.send_offsets_to_transaction(offsets, group_metadata()))
        for outcome in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        await producer.commit_transaction()
        self.open = False
        self.metrics.observe("commit_seconds", time.monotonic() - began)
        self._count_committed(self.outputs, self.task.counts)
        self._forget()
        self.app.crash_point(CRASH_AFTER_COMMIT)
        for store, changes, last in written:
            # The changelog offset after this transaction's last record of the
            # shard (its last batch's). An offset the broker did not report (a
            # retried duplicate) leaves the shard's position where it was:
            # re-reading from there replays writes it already has, which changes nothing.
            batch = last.result()[-1]
            reached = batch.offset + batch.count if batch.offset >= 0 else 0
            next_offset = max(store.next_offset, reached)
            store.apply_committed(changes, next_offset)
            file = self.shard_file(store)
            if file is not None:
                await file.apply(changes, next_offset)


def _headers_column(headers: tuple):
    """The emits' headers ((key, value) pairs each) as an Arrow column; None when no emit has any."""
    if not any(headers):
        return None
    return pa.array([[{"key": key, "value": value} for key, value in pairs] for pairs in headers], HEADERS_TYPE)
