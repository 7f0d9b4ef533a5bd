"""onceflow's producer: idempotent by default, transactional on request.

Asyncio at the core (``AsyncProducer``, also ``txn.aio.Producer``);
``Producer`` is the synchronous facade that runs one on its own loop thread.

What it does, in Kafka's terms:

- ``InitProducerId`` (through the transaction coordinator when a
  ``transactional_id`` is set) gives the producer id and epoch; every
  partition gets its own sequence numbers, so the broker recognizes a
  retried batch and never writes it twice.
- Records are batched per partition (``linger_ms``, ``batch_size``); the
  default partitioner is Kafka's (murmur2 of the key, round robin without a
  key), so keys land where the Java client would put them.
- Up to ``max_in_flight_requests_per_connection`` (at most 5) batches per
  partition are in flight. Order survives retries because each batch's
  request is written only after its predecessor's, and a batch that fails
  waits for its predecessor's final outcome before it is sent again (the
  batches behind a failed one come back OUT_OF_ORDER_SEQUENCE_NUMBER, which
  is then expected and retried). A batch that fails for good takes the
  batches behind it along and the producer bumps its epoch (KIP-360) so
  sequences restart cleanly.
- Errors follow KIP-1050 (``txn.errors``): retriable ones are retried until
  ``delivery_timeout_ms``; in a transaction a failed send makes the
  transaction abortable (``commit_transaction`` raises
  ``TransactionAbortableError``); fencing is fatal for this instance; a
  commit whose answer never came raises ``CommitOutcomeUnknownError`` and
  the producer refuses to abort after it.
- For an external two-phase commit (the Spark sink): after ``flush()``,
  ``transaction_handle()`` names the open transaction (transactional id,
  producer id, epoch), and ``AsyncProducer.resume(handle)`` in another
  process commits or aborts it without re-initializing (which would abort).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections import defaultdict
from typing import Callable

import attrs

from protocol.constants import CoordinatorType
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import encode_batch
from protocol.tasks import cancel_and_wait
from txn.cluster import Cluster
from txn.config import ProducerConfig, build
from txn.errors import (
    ApplicationRecoverableError,
    CommitOutcomeUnknownError,
    FatalError,
    InvalidConfigurationError,
    KafkaError,
    ProducerFencedError,
    RetriableError,
    TransactionAbortableError,
    classify,
    is_retriable,
)
from txn.loop_thread import LoopThread
from txn.types import GroupMetadata, RecordMetadata, TopicPartition, as_topic_partition

RECORD_OVERHEAD = 20  # a record's framing bytes, roughly, for batch sizing


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as the Java client's Utils.murmur2), a signed int32."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def default_partition(key: bytes | None, partitions: int, counter) -> int:
    if key is None:
        return next(counter) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@attrs.frozen
class TransactionHandle:
    """Names an open transaction so another process can finish it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@attrs.define(eq=False)
class _Batch:
    partition: TopicPartition
    records: list
    futures: list
    created: float
    base_sequence: int = -1
    predecessor: "_Batch | None" = None
    written: asyncio.Event = attrs.field(factory=asyncio.Event)  # its request is on the wire (or it is finished)
    finished: asyncio.Event = attrs.field(factory=asyncio.Event)
    failed_attempt: bool = False  # some attempt failed: batches behind it see OUT_OF_ORDER
    error: BaseException | None = None


@attrs.define(eq=False)
class _PartitionQueue:
    records: list = attrs.field(factory=list)  # (record tuple, future)
    size: int = 0
    timer: asyncio.TimerHandle | None = None
    inflight: int = 0
    last_batch: _Batch | None = None
    next_sequence: int = 0
    retrying: int = 0  # batches between a failed attempt and their outcome
    calm: asyncio.Event = attrs.field(factory=lambda: _set(asyncio.Event()))  # set while retrying == 0


def no_crash_point(name: str) -> None:
    """The default crash point: never fires."""


class AsyncProducer:
    def __init__(
        self,
        bootstrap_servers=None,
        transactional_id: str | None = None,
        config: dict | ProducerConfig | None = None,
        *,
        crash_point: Callable[[str], None] = no_crash_point,
        **options,
    ):
        """``crash_point(name)`` is called at the client's named crash point
        (``txn.before_commit``: records produced, EndTxn not yet sent); the
        fault harness passes ``faults.points.point`` to kill the process there."""
        self.crash_point = crash_point
        if bootstrap_servers is not None:
            options["bootstrap_servers"] = bootstrap_servers
        if transactional_id is not None:
            options["transactional_id"] = transactional_id
        self.config = build(ProducerConfig, config, **options)
        self.transactional_id = self.config.transactional_id
        self.cluster = Cluster(self.config)
        self.producer_id, self.producer_epoch = -1, -1
        self._queues: dict[TopicPartition, _PartitionQueue] = defaultdict(_PartitionQueue)
        self._tasks: set[asyncio.Task] = set()
        self._round_robin = itertools.count()
        self._started = False
        self._in_transaction = False
        self._added: dict[TopicPartition, asyncio.Future] = {}
        self._offsets_added: set[str] = set()
        self._txn_error: BaseException | None = None
        self._fatal: BaseException | None = None
        self._needs_epoch_bump = False
        self._resumed = False

    def __reduce__(self):
        return (_rebuild, (type(self), self.config))

    @property
    def idempotent(self) -> bool:
        return self.config.idempotent

    async def __aenter__(self) -> "AsyncProducer":
        if self.transactional_id is None:
            await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- producer id ------------------------------------------------------------------------

    async def start(self) -> None:
        """Get a producer id (non-transactional producers call this on creation)."""
        if self.idempotent:
            await self._init_producer_id(-1, -1)
        self._started = True

    async def init_transactions(self) -> None:
        """Register the transactional id: fences older instances and finishes
        (commits or aborts, as decided) whatever transaction they left."""
        if self.transactional_id is None:
            raise FatalError(message="init_transactions needs a transactional_id")
        await self._init_producer_id(-1, -1)
        self._fatal = None
        self._started = True

    async def _init_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        body = {"transactional_id": self.transactional_id, "transaction_timeout_ms": self.config.transaction_timeout_ms, "producer_id": producer_id, "producer_epoch": producer_epoch}
        async for attempt in self.cluster.retrying(self.config.delivery_timeout_ms / 1000):
            with attempt:
                if self.transactional_id is not None:
                    response = await self.cluster.coordinator_request(self.transactional_id, CoordinatorType.TRANSACTION, ApiKey.INIT_PRODUCER_ID, body)
                else:
                    response = await (await self.cluster.any_broker()).request(ApiKey.INIT_PRODUCER_ID, body)
                if response["error_code"]:
                    raise classify(response["error_code"], "InitProducerId")
        self.producer_id, self.producer_epoch = response["producer_id"], response["producer_epoch"]
        for queue in self._queues.values():
            queue.next_sequence = 0
            queue.last_batch = None
        self._needs_epoch_bump = False

    async def _bump_epoch(self) -> None:
        """Restart sequences after a batch failed for good (KIP-360)."""
        await asyncio.gather(*[t for t in self._tasks if t is not asyncio.current_task()], return_exceptions=True)
        if self.transactional_id is not None:
            await self._init_producer_id(self.producer_id, self.producer_epoch)
        else:
            await self._init_producer_id(-1, -1)

    # -- transactions -------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def begin_transaction(self) -> None:
        self._check_usable()
        if self.transactional_id is None:
            raise FatalError(message="begin_transaction needs a transactional_id")
        if not self._started:
            raise FatalError(message="call init_transactions() first")
        if self._in_transaction:
            raise FatalError(message="a transaction is already open")
        self._in_transaction = True
        self._added = {}
        self._offsets_added = set()
        self._txn_error = None

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    def transaction_handle(self) -> TransactionHandle:
        """The open transaction's names, for another process to finish it
        (call ``flush()`` first so every record is in it)."""
        if not self._in_transaction:
            raise FatalError(message="no open transaction")
        if self._txn_error is not None:
            raise TransactionAbortableError(message=f"the transaction cannot commit: {self._txn_error}")
        return TransactionHandle(self.transactional_id, self.producer_id, self.producer_epoch)

    @classmethod
    def resume(cls, handle: TransactionHandle, bootstrap_servers=None, **options) -> "AsyncProducer":
        """A producer bound to another process's open transaction; it can only
        ``commit_transaction`` or ``abort_transaction`` it."""
        producer = cls(bootstrap_servers, transactional_id=handle.transactional_id, **options)
        producer.producer_id, producer.producer_epoch = handle.producer_id, handle.producer_epoch
        producer._started = producer._in_transaction = producer._resumed = True
        return producer

    async def _txn_request(self, api_key: int, body: dict, what: str, *, max_version: int | None = None) -> dict:
        async for attempt in self.cluster.retrying(self.config.delivery_timeout_ms / 1000):
            with attempt:
                response = await self.cluster.coordinator_request(self.transactional_id, CoordinatorType.TRANSACTION, api_key, body, max_version=max_version)
                code = _first_error(response)
                if code:
                    raise self._judge(classify(code, what, in_transaction=True))
        return response

    def _judge(self, error: KafkaError) -> KafkaError:
        """Remember what an error means for the producer and return it."""
        if isinstance(error, (ApplicationRecoverableError, InvalidConfigurationError, FatalError)):
            if self._fatal is None:
                self._fatal = error
        elif isinstance(error, TransactionAbortableError) and self._txn_error is None:
            self._txn_error = error
        return error

    async def _add_partition(self, partition: TopicPartition) -> None:
        pending = self._added.get(partition)
        if pending is None:
            pending = self._added[partition] = asyncio.ensure_future(
                self._txn_request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    {
                        "v3_and_below_transactional_id": self.transactional_id,
                        "v3_and_below_producer_id": self.producer_id,
                        "v3_and_below_producer_epoch": self.producer_epoch,
                        "v3_and_below_topics": [{"name": partition.topic, "partitions": [partition.partition]}],
                    },
                    f"AddPartitionsToTxn({partition})",
                    max_version=3,  # v4+ is the brokers' batched form (KIP-890)
                )
            )
        await asyncio.shield(pending)

    async def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        """Commit consumer positions with this transaction (KIP-447).

        ``offsets``: {TopicPartition or (topic, partition): next offset to
        read}; ``group_metadata``: ``consumer.group_metadata()`` (or a group
        id for a consumer outside any group)."""
        self._check_usable()
        if not self._in_transaction:
            raise FatalError(message="send_offsets_to_transaction outside a transaction")
        group = GroupMetadata.of(group_metadata)
        if group.group_id not in self._offsets_added:
            await self._txn_request(
                ApiKey.ADD_OFFSETS_TO_TXN,
                {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "group_id": group.group_id},
                "AddOffsetsToTxn",
            )
            self._offsets_added.add(group.group_id)
        by_topic: dict[str, list] = defaultdict(list)
        for partition, offset in offsets.items():
            partition = as_topic_partition(partition)
            offset, metadata = (offset.offset, offset.metadata) if hasattr(offset, "offset") else (offset, "")
            by_topic[partition.topic].append({"partition_index": partition.partition, "committed_offset": offset, "committed_metadata": metadata})
        body = {
            "transactional_id": self.transactional_id,
            "group_id": group.group_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "generation_id": group.generation_id,
            "member_id": group.member_id,
            "group_instance_id": group.group_instance_id,
            "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
        }
        async for attempt in self.cluster.retrying(self.config.delivery_timeout_ms / 1000):
            with attempt:
                response = await self.cluster.coordinator_request(group.group_id, CoordinatorType.GROUP, ApiKey.TXN_OFFSET_COMMIT, body)
                code = _first_error(response)
                if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                    self.cluster.forget_coordinator(group.group_id, 0)
                if code:
                    raise self._judge(classify(code, "TxnOffsetCommit", in_transaction=True))

    async def commit_transaction(self) -> None:
        self._check_usable()
        await self._end(commit=True)

    async def abort_transaction(self) -> None:
        self._check_usable()
        for queue in self._queues.values():  # unsent records of an aborted transaction are dropped
            for _record, future in queue.records:
                if not future.done():
                    _fail_quietly(future, TransactionAbortableError(message="the transaction was aborted"))
            queue.records, queue.size = [], 0
        await self._end(commit=False)

    async def _end(self, *, commit: bool) -> None:
        if not self._in_transaction:
            raise FatalError(message="no open transaction")
        await self.flush()
        if commit and self._txn_error is not None:
            raise TransactionAbortableError(message=f"cannot commit, abort instead: {self._txn_error}")
        if self._added or self._offsets_added or self._resumed:
            if commit:
                self.crash_point("txn.before_commit")
            body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "committed": commit}
            try:
                await self._txn_request(ApiKey.END_TXN, body, "EndTxn")
            except (RetriableError, ConnectionError, TimeoutError) as error:
                if commit:
                    # The commit may have happened: never follow it with an abort.
                    self._fatal = CommitOutcomeUnknownError(message=f"commit outcome unknown ({error}); call init_transactions() to resolve it")
                    raise self._fatal from error
                raise
        self._in_transaction = False
        self._added = {}
        self._offsets_added = set()
        self._txn_error = None
        if self._needs_epoch_bump:
            await self._bump_epoch()

    # -- sending ----------------------------------------------------------------------------------

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None, headers=None, timestamp: int | None = None, on_delivery=None) -> asyncio.Future:
        """Queue a record; the returned future resolves to its ``RecordMetadata``.

        ``on_delivery(error, metadata)`` is called once it is known."""
        self.check_can_send()
        if not self._started:
            await self.start()
        if partition is None:
            partition = default_partition(key, await self.cluster.partitions_for(topic), self._round_robin)
        return self.append(topic, partition, value, key, headers, timestamp, on_delivery)

    def check_can_send(self) -> None:
        self._check_usable()
        if self.transactional_id is not None and not self._in_transaction:
            raise FatalError(message="send outside a transaction (call begin_transaction)")
        if self._resumed:
            raise FatalError(message="a resumed transaction can only be committed or aborted")

    def can_append_now(self, topic: str, partition: int | None) -> bool:
        """Whether ``append`` may run without awaiting anything (the producer
        has its id and knows the topic)."""
        return self._started and (partition is not None or topic in self.cluster.partition_counts)

    def append(self, topic: str, partition: int | None, value, key=None, headers=None, timestamp=None, on_delivery=None) -> asyncio.Future:
        """The synchronous part of ``send``, on the loop (see ``can_append_now``)."""
        self.check_can_send()
        if partition is None:
            partition = default_partition(key, self.cluster.partition_counts[topic], self._round_robin)
        future = asyncio.get_running_loop().create_future()
        if on_delivery is not None:
            future.add_done_callback(lambda f: on_delivery(f.exception(), None) if f.exception() else on_delivery(None, f.result()))
        tp = TopicPartition(topic, partition)
        queue = self._queues[tp]
        queue.records.append(((key, value, tuple(headers or ()), int(time.time() * 1000) if timestamp is None else timestamp), future))
        queue.size += len(value or b"") + len(key or b"") + RECORD_OVERHEAD
        if queue.size >= self.config.batch_size:
            self._drain(tp)
        elif queue.timer is None:
            queue.timer = asyncio.get_running_loop().call_later(self.config.linger_ms / 1000, self._drain, tp)
        return future

    def _drain(self, tp: TopicPartition) -> None:
        """Turn queued records into batches while the in-flight limit allows."""
        queue = self._queues[tp]
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        while queue.records and queue.inflight < self.config.max_in_flight_requests_per_connection and not self._needs_epoch_bump:
            taken, size = 0, 0
            while taken < len(queue.records) and (size < self.config.batch_size or taken == 0):
                record = queue.records[taken][0]
                size += len(record[1] or b"") + len(record[0] or b"") + RECORD_OVERHEAD
                taken += 1
            chunk, queue.records = queue.records[:taken], queue.records[taken:]
            queue.size = max(0, queue.size - size)
            batch = _Batch(tp, [r for r, _f in chunk], [f for _r, f in chunk], time.monotonic(), predecessor=queue.last_batch)
            if self.idempotent:
                batch.base_sequence = queue.next_sequence
                queue.next_sequence = (queue.next_sequence + len(chunk)) % (2**31)
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

    async def _deliver(self, batch: _Batch) -> None:
        try:
            result = await self._deliver_with_retries(batch)
        except BaseException as error:
            batch.error = error if isinstance(error, Exception) else FatalError(message="cancelled")
            if self.idempotent and not isinstance(error, ProducerFencedError):
                self._needs_epoch_bump = True  # the sequence has a hole now
            if self.transactional_id is not None and not isinstance(error, (ProducerFencedError,)) and self._txn_error is None:
                self._txn_error = batch.error
            for future in batch.futures:
                if not future.done():
                    _fail_quietly(future, batch.error)
            if isinstance(error, asyncio.CancelledError):
                raise  # the producer is closing: its records failed above; the cancellation goes on
            return
        finally:
            batch.written.set()
            batch.finished.set()
        base, log_append_time = result
        for index, future in enumerate(batch.futures):
            if not future.done():
                future.set_result(RecordMetadata(batch.partition.topic, batch.partition.partition, base + index if base >= 0 else -1, log_append_time if log_append_time >= 0 else batch.records[index][3]))

    async def _deliver_with_retries(self, batch: _Batch):
        deadline = batch.created + self.config.delivery_timeout_ms / 1000
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
        delay = self.config.retry_backoff_ms / 1000
        try:
            return await self._attempts(batch, predecessor, deadline, delay)
        finally:
            if batch.failed_attempt:
                queue.retrying -= 1
                if queue.retrying == 0:
                    queue.calm.set()

    async def _attempts(self, batch: _Batch, predecessor: _Batch | None, deadline: float, delay: float):
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
                if time.monotonic() + delay > deadline:
                    raise RetriableError(getattr(error, "code", 0), f"delivery to {batch.partition} timed out", message=str(error)) from error
                batch.written.set()  # let the batches behind go out and fail fast too
                if predecessor is not None:
                    await predecessor.finished.wait()  # retry strictly after the batch before
                if isinstance(error, KafkaError) and error.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE):
                    self.cluster.forget_leader(batch.partition.topic, batch.partition.partition)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.retry_backoff_max_ms / 1000)

    async def _produce(self, batch: _Batch) -> tuple[int, int]:
        tp = batch.partition
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
        response_awaitable = await client.submit(ApiKey.PRODUCE, body, expect_response=self.config.acks != 0)
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
                for _record, future in queue.records:
                    if not future.done():
                        _fail_quietly(future, TransactionAbortableError(message="an earlier send failed; abort the transaction"))
                queue.records, queue.size = [], 0

    async def close(self) -> None:
        """Flush and close the connections (an open transaction is left to
        time out, or to whoever holds its handle)."""
        try:
            if self._fatal is None:
                await self.flush()
        finally:
            # What flush did not wait for (a fatal error stopped it, or flush
            # was cancelled) is the producer's to stop before its connections go.
            adding = [task for task in self._added.values() if not task.done()]
            try:
                await cancel_and_wait(*self._tasks, *adding)
            finally:
                await self.cluster.close()


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


def _is_code(error: BaseException, code: ErrorCode) -> bool:
    return isinstance(error, KafkaError) and error.code == code


def _first_error(body: dict) -> int:
    if body.get("error_code"):
        return body["error_code"]
    for topic in body.get("results_by_topic_v3_and_below", []) + [t for r in body.get("results_by_transaction", []) for t in r["topic_results"]]:
        for partition in topic["results_by_partition"]:
            if partition["partition_error_code"]:
                return partition["partition_error_code"]
    for topic in body.get("topics", []):
        for partition in topic.get("partitions", []):
            if partition.get("error_code"):
                return partition["error_code"]
    return 0


def _fail_quietly(future: asyncio.Future, error: BaseException) -> None:
    """Fail a record's future without asyncio's "exception was never
    retrieved" at exit for every record nobody looked at (the error still
    reaches whoever awaits the future, the on_delivery callback and, in a
    transaction, the commit)."""
    future.set_exception(error)
    future.exception()  # marks it retrieved; awaiting it still raises


def _rebuild(cls, config):
    return cls(config=config)


class DeliveryFuture:
    """The outcome of one ``Producer.send``, waited for from any thread.

    Lighter than ``concurrent.futures.Future`` (a send must cost little): it
    wraps the loop's own future, which exists once the loop has taken the
    record; ``result()`` and ``exception()`` ask the loop, which has always
    taken every earlier send by then (hand-offs run in call order)."""

    __slots__ = ("_thread", "inner")

    def __init__(self, thread: LoopThread):
        self._thread = thread
        self.inner: asyncio.Future | None = None

    async def _outcome(self):
        return await asyncio.shield(self.inner)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        return self._thread.call(self._outcome(), timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as error:
            return error
        return None

    def done(self) -> bool:
        inner = self.inner
        return inner is not None and inner.done()

    def add_done_callback(self, callback) -> None:
        """``callback(self)`` once the outcome is known (it runs on the producer's loop thread)."""

        def attach():
            self.inner.add_done_callback(lambda _inner: callback(self))

        self._thread.loop.call_soon_threadsafe(attach)


class Producer:
    """The synchronous producer: every call runs on the producer's own loop thread.

    ``Producer(bootstrap_servers="host:9092", transactional_id=None, **config)``;
    Kafka property names are accepted too: ``Producer({"bootstrap.servers": ...})``.
    """

    def __init__(
        self,
        bootstrap_servers=None,
        transactional_id: str | None = None,
        config: dict | ProducerConfig | None = None,
        *,
        crash_point: Callable[[str], None] = no_crash_point,
        _async: AsyncProducer | None = None,
        **options,
    ):
        if isinstance(bootstrap_servers, dict):
            config, bootstrap_servers = bootstrap_servers, None
        self._thread = LoopThread("onceflow-producer")
        self._handoff: collections.deque = collections.deque()  # sends on their way to the loop, in call order
        self._handoff_scheduled = False
        try:
            if _async is None:
                _async = self._thread.run(lambda: AsyncProducer(bootstrap_servers, transactional_id, config, crash_point=crash_point, **options))
            self._async = _async
            if self._async.transactional_id is None:
                self._thread.call(self._async.start())
        except BaseException:
            self._thread.stop()
            raise

    def __reduce__(self):
        return (_rebuild, (type(self), self._async.config))

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def config(self) -> ProducerConfig:
        return self._async.config

    @property
    def producer_id(self) -> int:
        return self._async.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._async.producer_epoch

    def init_transactions(self) -> None:
        self._thread.call(self._async.init_transactions())

    def begin_transaction(self) -> None:
        self._thread.run(self._async.begin_transaction)

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None, headers=None, timestamp: int | None = None, on_delivery=None) -> "DeliveryFuture":
        """Queue a record; the returned ``DeliveryFuture`` resolves to its
        RecordMetadata (``.result(timeout)``).

        Records are handed to the loop in call order, ahead of any later call
        (flush, commit), so a commit covers every send made before it. The
        first send to a topic waits for its metadata; later ones do not wait."""
        self._async.check_can_send()
        result = DeliveryFuture(self._thread)
        if not self._async.can_append_now(topic, partition):
            result.inner = self._thread.call(self._async.send(topic, value, key=key, partition=partition, headers=headers, timestamp=timestamp, on_delivery=on_delivery))
            return result
        self._handoff.append((result, topic, partition, value, key, headers, timestamp, on_delivery))
        if not self._handoff_scheduled:
            # One wake-up of the loop per burst of sends, not one per record.
            self._handoff_scheduled = True
            self._thread.loop.call_soon_threadsafe(self._take_handoff)
        return result

    def _take_handoff(self) -> None:
        self._handoff_scheduled = False
        while self._handoff:
            result, *args = self._handoff.popleft()
            try:
                result.inner = self._async.append(*args)
            except Exception as error:
                result.inner = failed = asyncio.get_running_loop().create_future()
                failed.set_exception(error)

    def flush(self, timeout: float | None = None) -> None:
        self._thread.call(self._async.flush(), timeout)

    def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        self._thread.call(self._async.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._thread.call(self._async.commit_transaction())

    def abort_transaction(self) -> None:
        self._thread.call(self._async.abort_transaction())

    def transaction_handle(self) -> TransactionHandle:
        return self._thread.run(self._async.transaction_handle)

    @classmethod
    def resume(cls, handle: TransactionHandle, bootstrap_servers=None, **options) -> "Producer":
        """Bind to another process's open transaction (see ``AsyncProducer.resume``)."""
        producer = cls.__new__(cls)
        producer._thread = LoopThread("onceflow-producer")
        producer._handoff, producer._handoff_scheduled = collections.deque(), False
        producer._async = producer._thread.run(lambda: AsyncProducer.resume(handle, bootstrap_servers, **options))
        return producer

    def transaction(self):
        """``with producer.transaction(): ...`` commits on success, aborts on error."""
        return _TransactionScope(self)

    def close(self, timeout: float | None = 60) -> None:
        try:
            self._thread.call(self._async.close(), timeout)
        finally:
            self._thread.stop()


class _TransactionScope:
    def __init__(self, producer: Producer):
        self.producer = producer

    def __enter__(self) -> Producer:
        self.producer.begin_transaction()
        return self.producer

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.producer.commit_transaction()
        elif not isinstance(exc, (ProducerFencedError, CommitOutcomeUnknownError, FatalError)):
            self.producer.abort_transaction()
        return False
