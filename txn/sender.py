"""The sending half of ``txn.producer.AsyncProducer``: the record
accumulator (records queued per partition, cut into batches by
``batch_size`` and ``linger_ms``) and the sender (Produce requests, retries,
ordering, outcomes).

Up to ``max_in_flight_requests_per_connection`` (at most 5) batches per
partition are in flight. Order survives retries because each batch's
request is written only after its predecessor's, and a batch that fails
waits for its predecessor's final outcome before it is sent again (the
batches behind a failed one come back OUT_OF_ORDER_SEQUENCE_NUMBER, which is
then expected and retried). While a batch is being retried, new ones wait,
so the broker never sees more than five batches past it. A batch that fails
for good takes the batches behind it along and the producer bumps its epoch
(KIP-360) so sequences restart cleanly; an idempotent producer does that by
itself, a transactional one when its transaction ends. Retriable errors are
retried until ``delivery_timeout_ms``.

Two kinds of entries share a partition's queue, in call order: single
records (``append``, cut into batches here) and runs of records encoded
ahead from columns (``append_encoded``, from ``AsyncProducer.send_columns``:
each is one batch, framed again per attempt with the producer id, epoch and
sequence of the moment, with one future for the whole run). The encoded
runs and the single records both count against ``buffer_memory`` until
their batch has its outcome; ``wait_for_room`` makes a sender wait for
room (at most ``max_block_ms``), ``reserve_buffer`` counts a run ahead.

``Sender`` is a base class of ``AsyncProducer``, whose ``__init__`` sets
the state it works on (``_queues``, ``_topic_partitions``, ``_tasks``, ``_round_robin``,
``_needs_epoch_bump``, ``_txn_error``, ``_fatal``, ``_buffered``, ``_buffer_freed``,
the producer id and epoch, ``produce_max_version``)
and which provides what it calls back (``check_can_send``,
``_add_partition``, ``_bump_epoch``).
"""

from __future__ import annotations

import asyncio
import collections
import time

import attrs

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.partitioning import default_partition
from protocol.records import encode_batch
from protocol.retry import Backoff, client_request
from txn.errors import (
    ApplicationRecoverableError,
    FatalError,
    KafkaError,
    ProducerFencedError,
    RetriableError,
    TransactionAbortableError,
    BufferExhaustedError,
    classify,
    is_retriable,
)
from txn.types import BatchMetadata, RecordMetadata, TopicPartition

RECORD_OVERHEAD = 20  # a record's framing bytes, roughly, for batch sizing


@attrs.define(eq=False)
class Batch:
    partition: TopicPartition
    records: list  # (key, value, headers, timestamp) tuples; or one EncodedRecords (see ``encoded``)
    futures: list  # per record: its future, or None (appended with report=False)
    created: float
    base_sequence: int = -1
    predecessor: "Batch | None" = None
    written: asyncio.Event = attrs.field(factory=asyncio.Event)  # its request is on the wire (or it is finished)
    finished: asyncio.Event = attrs.field(factory=asyncio.Event)
    failed_attempt: bool = False  # some attempt failed: batches behind it see OUT_OF_ORDER
    error: BaseException | None = None
    encoded: object = None  # protocol.columnar.EncodedRecords: the batch's records, encoded ahead
    size: int = 0  # bytes it holds of buffer_memory, given back when it has its outcome

    @property
    def count(self) -> int:
        return self.encoded.count if self.encoded is not None else len(self.records)


@attrs.define(eq=False)
class PartitionQueue:
    # (record tuple, future or None), or (EncodedRecords, its future)
    records: collections.deque = attrs.field(factory=collections.deque)
    size: int = 0
    timer: asyncio.TimerHandle | None = None
    inflight: int = 0
    last_batch: Batch | None = None
    next_sequence: int = 0
    retrying: int = 0  # batches between a failed attempt and their outcome
    calm: asyncio.Event = attrs.field(factory=lambda: _set(asyncio.Event()))  # set while retrying == 0


class Sender:
    def can_append_now(self, topic: str, partition: int | None) -> bool:
        """Whether ``append`` may run without awaiting anything (the producer
        has its id and knows the topic)."""
        return self._started and (partition is not None or topic in self.cluster.partition_counts)

    def append(self, topic: str, partition: int | None, value, key=None, headers=None, timestamp=None, on_delivery=None, *, report: bool = True) -> asyncio.Future | None:
        """The synchronous part of ``send``, on the loop (see ``can_append_now``).

        ``report=False`` (transactions only): no future, ``None`` returned.
        A record that fails then fails its transaction, and the caller hears
        of it from ``commit_transaction``; a pipeline that never looks at its
        outputs' offsets saves a future and a ``RecordMetadata`` per record."""
        self.check_can_send()
        if partition is None:
            partition = default_partition(key, self.cluster.partition_counts[topic], self._round_robin)
        loop = asyncio.get_running_loop()
        if report:
            future = loop.create_future()
            if on_delivery is not None:
                future.add_done_callback(lambda f: on_delivery(f.exception(), None) if f.exception() else on_delivery(None, f.result()))
        elif self.transactional_id is None or on_delivery is not None:
            raise FatalError(message="append(report=False) is for transactions, whose commit reports a failed record, and takes no on_delivery")
        else:
            future = None
        tp = self._topic_partitions.get((topic, partition))
        if tp is None:
            tp = self._topic_partitions[(topic, partition)] = TopicPartition(topic, partition)
        queue = self._queues[tp]
        queue.records.append(((key, value, tuple(headers) if headers else (), int(time.time() * 1000) if timestamp is None else timestamp), future))
        size = len(value or b"") + len(key or b"") + RECORD_OVERHEAD
        queue.size += size
        self._buffered += size  # never waits here: ``AsyncProducer.send`` and ``Producer.send`` wait for room before
        if queue.size >= self.config.records_batch_size:
            self._drain(tp)
        elif queue.timer is None:
            queue.timer = loop.call_later(self.config.linger_ms / 1000, self._drain, tp)
        return future

    def append_encoded(self, tp: TopicPartition, encoded) -> asyncio.Future:
        """Queue a run of records encoded ahead (``protocol.columnar.EncodedRecords``)
        as one batch, behind what is queued; its room in ``buffer_memory``
        is taken already (``reserve_buffer``). The future resolves to a
        ``BatchMetadata``."""
        self.check_can_send()
        future = asyncio.get_running_loop().create_future()
        queue = self._queues[tp]
        queue.records.append((encoded, future))
        queue.size += len(encoded.section)
        self._drain(tp)  # a batch already: no lingering
        return future

    async def reserve_buffer(self, size: int) -> None:
        """Wait until ``size`` more bytes of encoded records fit in
        ``buffer_memory`` (``wait_for_room``); then count them."""
        await self.wait_for_room(size)
        self._buffered += size

    async def wait_for_room(self, size: int) -> None:
        """Wait until ``size`` more bytes fit in ``buffer_memory`` (what is
        queued or in flight, records and encoded runs alike; anything fits
        an empty buffer), at most ``max_block_ms``: then
        ``BufferExhaustedError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.max_block_ms / 1000
        while self._buffered and self._buffered + size > self.config.buffer_memory:
            self._buffer_freed.clear()
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(self._buffer_freed.wait(), remaining)
            except TimeoutError:
                raise BufferExhaustedError(message=f"{self._buffered} bytes waiting to be sent fill buffer_memory ({self.config.buffer_memory}) after max_block_ms ({self.config.max_block_ms})") from None
            self.check_can_send()

    def _release_buffer(self, size: int) -> None:
        self._buffered -= size
        self._buffer_freed.set()

    def _drop_queued(self, queue: PartitionQueue, error: BaseException) -> None:
        """Fail and forget what a queue holds (nothing of it can be sent any more)."""
        for record, future in queue.records:
            self._release_buffer(len(record.section) if type(record) is not tuple else len(record[1] or b"") + len(record[0] or b"") + RECORD_OVERHEAD)
            if future is not None and not future.done():
                fail_quietly(future, error)
        queue.records.clear()
        queue.size = 0

    def _drain(self, tp: TopicPartition) -> None:
        """Turn queued records into batches while the in-flight limit allows."""
        queue = self._queues[tp]
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        while queue.records and queue.inflight < self.config.max_in_flight_requests_per_connection and not self._needs_epoch_bump:
            if type(queue.records[0][0]) is not tuple:  # encoded ahead: a batch of its own
                encoded, future = queue.records.popleft()
                queue.size = max(0, queue.size - len(encoded.section))
                batch = Batch(tp, [], [future], time.monotonic(), predecessor=queue.last_batch, encoded=encoded, size=len(encoded.section))
            else:
                records, futures, size = [], [], 0
                while queue.records and type(queue.records[0][0]) is tuple and (size < self.config.records_batch_size or not records):
                    record, future = queue.records.popleft()
                    size += len(record[1] or b"") + len(record[0] or b"") + RECORD_OVERHEAD
                    records.append(record)
                    futures.append(future)
                queue.size = max(0, queue.size - size)
                batch = Batch(tp, records, futures, time.monotonic(), predecessor=queue.last_batch, size=size)
            if self.idempotent:
                batch.base_sequence = queue.next_sequence
                queue.next_sequence = (queue.next_sequence + batch.count) % (2**31)
            queue.last_batch = batch
            queue.inflight += 1
            task = asyncio.get_running_loop().create_task(self._deliver(batch))
            self._tasks.add(task)
            task.add_done_callback(lambda t, tp=tp: self._delivered(t, tp))

    def _delivered(self, task: asyncio.Task, tp: TopicPartition) -> None:
        self._tasks.discard(task)
        self._queues[tp].inflight -= 1
        if task.cancelled():
            return  # the producer is closing: nothing new starts
        if self._needs_epoch_bump and self.transactional_id is None and not self._tasks and self._fatal is None:
            # An idempotent producer recovers by itself: new epoch, then the queue moves on.
            recovery = asyncio.get_running_loop().create_task(self._recover())
            self._tasks.add(recovery)
            recovery.add_done_callback(self._tasks.discard)
        elif self._queues[tp].records:
            self._drain(tp)

    async def _recover(self) -> None:
        try:
            await self._bump_epoch()
        except Exception as error:
            self._fatal = error if isinstance(error, KafkaError) else FatalError(message=f"cannot restart sequences: {error}")
            return
        for tp, queue in self._queues.items():
            if queue.records:
                self._drain(tp)

    async def _deliver(self, batch: Batch) -> None:
        try:
            result = await self._deliver_with_retries(batch)
        except BaseException as error:
            self._release_buffer(batch.size)
            batch.error = error if isinstance(error, Exception) else FatalError(message="cancelled")
            if self.idempotent and not isinstance(error, ProducerFencedError):
                self._needs_epoch_bump = True  # the sequence has a hole now
            if self.transactional_id is not None and not isinstance(error, (ProducerFencedError,)) and self._txn_error is None:
                self._txn_error = batch.error
            for future in batch.futures:
                if future is not None and not future.done():
                    fail_quietly(future, batch.error)
            if isinstance(error, asyncio.CancelledError):
                raise  # the producer is closing: its records failed above; the cancellation goes on
            return
        finally:
            batch.written.set()
            batch.finished.set()
        base, log_append_time = result
        self._release_buffer(batch.size)
        if batch.encoded is not None:
            future = batch.futures[0]
            if not future.done():
                future.set_result(BatchMetadata(batch.partition.topic, batch.partition.partition, base, batch.encoded.count))
            return
        for index, future in enumerate(batch.futures):
            if future is not None and not future.done():
                future.set_result(RecordMetadata(batch.partition.topic, batch.partition.partition, base + index if base >= 0 else -1, log_append_time if log_append_time >= 0 else batch.records[index][3]))

    async def _deliver_with_retries(self, batch: Batch):
        if self.transactional_id is not None:
            await self._add_partition(batch.partition)
        predecessor = batch.predecessor
        if predecessor is not None:
            await predecessor.written.wait()  # requests go out in sequence order
        queue = self._queues[batch.partition]
        # While an earlier batch is being retried, a new one waits: were it
        # written first, the broker could move more than five batches past the
        # retried one, out of its duplicate window.
        await queue.calm.wait()
        policy = client_request(self.config.retry_backoff_ms, self.config.retry_backoff_max_ms).within(self.config.delivery_timeout_ms / 1000)
        try:
            return await self._attempts(batch, predecessor, Backoff(policy, started=batch.created))
        finally:
            if batch.failed_attempt:
                queue.retrying -= 1
                if queue.retrying == 0:
                    queue.calm.set()

    async def _attempts(self, batch: Batch, predecessor: Batch | None, backoff: Backoff):
        """Produce ``batch`` until it is written, under ``backoff`` (the
        client's request policy, within the delivery timeout from the batch's
        creation). Not ``protocol.retry.retry``: between tries the batch lets
        the ones behind it out and waits for the one before it."""
        queue = self._queues[batch.partition]
        while True:
            if predecessor is not None and predecessor.finished.is_set() and predecessor.error is not None:
                raise FatalError(message=f"an earlier batch to {batch.partition} failed: {predecessor.error}")
            try:
                return await self._produce(batch)
            except Exception as error:
                if not batch.failed_attempt:
                    batch.failed_attempt = True
                    queue.retrying += 1
                    queue.calm.clear()
                collateral = _is_code(error, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER) and predecessor is not None and (predecessor.failed_attempt or not predecessor.finished.is_set())
                if not (is_retriable(error) or collateral):
                    raise
                delay = backoff.failed()
                if delay is None:
                    raise RetriableError(getattr(error, "code", 0), f"delivery to {batch.partition} timed out", message=str(error)) from error
                batch.written.set()  # let the batches behind go out and fail fast too
                if predecessor is not None:
                    await predecessor.finished.wait()  # retry strictly after the batch before
                if isinstance(error, KafkaError) and error.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE):
                    self.cluster.forget_leader(batch.partition.topic, batch.partition.partition)
                await asyncio.sleep(delay)

    async def _produce(self, batch: Batch) -> tuple[int, int]:
        tp = batch.partition
        if batch.encoded is not None:
            from protocol.columnar import frame_records  # numpy and pyarrow: only for producers sending columns

            data = frame_records(
                batch.encoded,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=batch.base_sequence,
                is_transactional=self.transactional_id is not None,
            )
        else:
            data = encode_batch(
                batch.records,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=batch.base_sequence,
                is_transactional=self.transactional_id is not None,
                compression=self.config.compression_type,
            )
        client = await self.cluster.leader(tp.topic, tp.partition)
        body = {"transactional_id": self.transactional_id, "acks": self.config.acks, "timeout_ms": self.config.request_timeout_ms, "topic_data": [{"name": tp.topic, "partition_data": [{"index": tp.partition, "records": data}]}]}
        version = min(client.version_for(ApiKey.PRODUCE), self.produce_max_version)
        response_awaitable = await client.submit(ApiKey.PRODUCE, body, version=version, expect_response=self.config.acks != 0)
        batch.written.set()
        response = await response_awaitable
        if response is None:
            return -1, -1
        result = response["responses"][0]["partition_responses"][0]
        code = result["error_code"]
        if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            return -1, -1  # written before: success, offset unknown
        if code:
            raise self._judge_produce(classify(code, f"produce to {tp}", in_transaction=self.transactional_id is not None))
        return result["base_offset"], result.get("log_append_time_ms", -1)

    def _judge_produce(self, error: KafkaError) -> KafkaError:
        if isinstance(error, ApplicationRecoverableError):
            self._fatal = self._fatal or error
        return error

    async def flush(self) -> None:
        """Send everything queued and wait until every batch has its outcome."""
        while True:
            for tp in list(self._queues):
                if self._queues[tp].records:
                    self._drain(tp)
            if not self._tasks:
                if self._needs_epoch_bump and self.transactional_id is None:
                    await self._bump_epoch()
                    continue
                if not any(q.records for q in self._queues.values()) or self._needs_epoch_bump:
                    break
                continue
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._needs_epoch_bump and self.transactional_id is not None:
            for queue in self._queues.values():  # nothing more can be sent in this transaction
                self._drop_queued(queue, TransactionAbortableError(message="an earlier send failed; abort the transaction"))


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


def _is_code(error: BaseException, code: ErrorCode) -> bool:
    return isinstance(error, KafkaError) and error.code == code


def fail_quietly(future: asyncio.Future, error: BaseException) -> None:
    """Fail a record's future without asyncio's "exception was never
    retrieved" at exit for every record nobody looked at (the error still
    reaches whoever awaits the future, the on_delivery callback and, in a
    transaction, the commit)."""
    future.set_exception(error)
    future.exception()  # marks it retrieved; awaiting it still raises
