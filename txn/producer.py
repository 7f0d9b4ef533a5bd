"""onceflow's producer: idempotent by default, transactional on request.

Asyncio at the core (``AsyncProducer``, also ``txn.aio.Producer``);
``Producer`` is the synchronous facade (a ``txn.sync_client.SyncClient``)
that runs one on its own loop thread.

What it does, in Kafka's terms:

- ``InitProducerId`` (through the transaction coordinator when a
  ``transactional_id`` is set) gives the producer id and epoch; every
  partition gets its own sequence numbers, so the broker recognizes a
  retried batch and never writes it twice.
- Records are batched per partition (``linger_ms``, ``batch_size``) and sent
  with up to five batches in flight per partition, in order through retries
  (``txn.sender``, the accumulator and sender); the default partitioner is
  Kafka's (``protocol.partitioning``: murmur2 of the key, round robin
  without a key), so keys land where the Java client would put them.
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
  A producer that keeps its producer id for the next transaction (the
  sink's executors, once per batch) ``detach_transaction()`` instead and
  later ``begin_after_detached()``, which begins only once the coordinator
  says the other process ended the detached transaction.

- Transaction version 2 (KIP-890 part 2), where the transaction
  coordinator's broker finalizes the ``transaction.version`` feature at 2
  (and ``transaction_version`` is left at 2): no AddPartitionsToTxn or
  AddOffsetsToTxn (the first Produce v12 or TxnOffsetCommit v5 to a
  partition adds it), and every EndTxn v5 answers with the epoch of the
  next transaction, whose sequences start again at 0. Elsewhere (Tansu,
  older Kafka) the classic protocol.

This module owns the producer id, the transaction protocol (AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, the transaction version) and the two facades.
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
from protocol.loop_thread import LoopThread
from protocol.messages import ApiKey
from protocol.partitioning import default_partition
from protocol.tasks import cancel_and_wait
from txn.cluster import Cluster
from txn.config import ProducerConfig, build
from txn.errors import (
    TRANSIENT_ERRORS,
    ApplicationRecoverableError,
    CommitOutcomeUnknownError,
    FatalError,
    InvalidConfigurationError,
    KafkaError,
    ProducerFencedError,
    TransactionAbortableError,
    classify,
)
from txn.sender import RECORD_OVERHEAD, PartitionQueue, Sender, fail_quietly
from txn.sync_client import SyncClient, properties_first, rebuild
from txn.types import GroupMetadata, RecordMetadata, TopicPartition, as_topic_partition


# The versions of KIP-890 part 2 (transaction version 2); a broker that
# offers them all and finalizes transaction.version 2 gets them.
TRANSACTION_V2_VERSIONS = {ApiKey.PRODUCE: 12, ApiKey.TXN_OFFSET_COMMIT: 5, ApiKey.END_TXN: 5}
TRANSACTION_VERSION_FEATURE = "transaction.version"


def offers_transaction_v2(client) -> bool:
    """Whether a broker connection (``txn.connection.BrokerClient``) offers
    transaction version 2."""
    if client.features.get(TRANSACTION_VERSION_FEATURE, 0) < 2:
        return False
    return all(client.versions.get(key, (0, -1))[1] >= version for key, version in TRANSACTION_V2_VERSIONS.items())


@attrs.frozen
class TransactionHandle:
    """Names an open transaction so another process can finish it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def no_crash_point(name: str) -> None:
    """The default crash point: never fires."""


class AsyncProducer(Sender):
    """The asyncio producer. The accumulator and sender
    (``txn.sender.Sender``) are its base class; the state it shares is set
    here."""

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
        self._queues: dict[TopicPartition, PartitionQueue] = defaultdict(PartitionQueue)
        self._topic_partitions: dict[tuple[str, int], TopicPartition] = {}  # append's, made once
        self._tasks: set[asyncio.Task] = set()
        self._round_robin = itertools.count()
        self._started = False
        self._in_transaction = False
        self._added: dict[TopicPartition, asyncio.Future] = {}  # done once the partition is in the transaction
        self._to_add: list[tuple[TopicPartition, asyncio.Future]] = []  # for the next AddPartitionsToTxn
        self._adder: asyncio.Task | None = None  # sends AddPartitionsToTxn requests, one at a time
        # The coordinator takes one state change of a transactional id at a
        # time and answers another one meanwhile CONCURRENT_TRANSACTIONS,
        # which costs a retry backoff: AddPartitionsToTxn and AddOffsetsToTxn
        # take turns here instead.
        self._coordinator_turn = asyncio.Lock()
        self._offsets_added: set[str] = set()
        self._txn_error: BaseException | None = None
        self._fatal: BaseException | None = None
        self._needs_epoch_bump = False
        self._buffered = 0  # bytes of records encoded ahead (send_columns), queued or in flight
        self._buffer_freed = asyncio.Event()
        self._resumed = False
        self._detached: TransactionHandle | None = None  # handed to another process, not yet seen ended
        # KIP-890 part 2 with this coordinator (chosen at init_transactions, or
        # at a resumed producer's end); the sender caps its Produce at v11 without it.
        self._transaction_v2 = False
        self.produce_max_version = TRANSACTION_V2_VERSIONS[ApiKey.PRODUCE] - 1

    def __reduce__(self):
        return (rebuild, (type(self), self.config))

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
        self._detached = None  # the new epoch fenced it: ended or ending, never joined
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
        if self.transactional_id is not None:
            await self._choose_transaction_version()
        self._new_epoch(response["producer_id"], response["producer_epoch"])

    def _new_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """Go on as this producer id and epoch: every partition's sequences start at 0."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        for queue in self._queues.values():
            queue.next_sequence = 0
            queue.last_batch = None
        self._needs_epoch_bump = False

    async def _choose_transaction_version(self) -> None:
        """Transaction version 2 if configured and the coordinator offers it."""
        coordinator = await self.cluster.coordinator(self.transactional_id, CoordinatorType.TRANSACTION)
        self._transaction_v2 = self.config.transaction_version >= 2 and offers_transaction_v2(coordinator)
        self.produce_max_version = TRANSACTION_V2_VERSIONS[ApiKey.PRODUCE] - (0 if self._transaction_v2 else 1)

    def _max_version(self, api_key: int) -> int | None:
        """The cap on a transaction request's version: none with transaction
        version 2, else below the version that would mean it."""
        return None if self._transaction_v2 else TRANSACTION_V2_VERSIONS[api_key] - 1

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
        if self._detached is not None:
            raise FatalError(message="a detached transaction may still be open: call begin_after_detached()")
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

    async def seal_transaction(self) -> TransactionHandle:
        """Flush, then seal the open transaction for another process to
        finish: an onceflow broker with ``transaction.durable.at.end`` makes
        every record of it durable and records where each partition's data
        ends, so that an unclean stop of the broker (which aborts the
        transactions left open) spares it; what the transaction is sent
        after its seal is answered only once durable. Returns its handle.
        Sent as an AddPartitionsToTxn (v3) of the partitions already added,
        with onceflow's tagged field: to a broker without the seal it changes
        nothing. A transaction with no record sent has nothing to seal
        (``FatalError``)."""
        await self.flush()
        handle = self.transaction_handle()
        partitions = sorted(tp for tp, added in self._added.items() if added.done() and not added.cancelled() and added.exception() is None)
        if not partitions:
            raise FatalError(message="no record was sent in this transaction: nothing to seal")
        body = {**self._add_partitions_body(partitions), "onceflow_seal": True}
        async with self._coordinator_turn:
            await self._txn_request(ApiKey.ADD_PARTITIONS_TO_TXN, body, "seal (AddPartitionsToTxn)", max_version=3)
        return handle

    def detach_transaction(self) -> TransactionHandle:
        """Hand the open transaction to another process (which commits or
        aborts it with ``resume(handle)``) and keep this producer, its id and
        epoch for the next transaction: no InitProducerId per transaction.

        Call after ``flush()`` (refused while records are queued or in
        flight). Nothing can be sent until ``begin_after_detached()``: the
        same producer id and epoch would join the detached transaction if
        it were still open."""
        handle = self.transaction_handle()
        if self._tasks or any(queue.records for queue in self._queues.values()):
            raise FatalError(message="records are still queued or in flight: flush() before detach_transaction()")
        self._in_transaction = False
        self._added = {}
        self._offsets_added = set()
        self._detached = handle
        return handle

    async def begin_after_detached(self) -> None:
        """Begin the next transaction once the coordinator says the detached
        one has ended (DescribeTransactions, Kafka 3.0+). A Prepare state
        counts as ended: its outcome is fixed, and AddPartitionsToTxn waits
        for its markers.

        Raises, leaving the producer detached: ``FatalError`` with
        INVALID_TXN_STATE while the detached transaction is still open (call
        again later, or ``init_transactions()``, which aborts it), or with
        UNSUPPORTED_VERSION from a broker without DescribeTransactions;
        ``ProducerFencedError`` if another instance has taken the
        transactional id since (the epoch moved, or a timeout bumped it):
        this producer can then only be closed, or re-initialized."""
        handle = self._detached
        if handle is None:
            raise FatalError(message="no detached transaction: call begin_transaction()")
        async for attempt in self.cluster.retrying(self.config.delivery_timeout_ms / 1000):
            with attempt:
                coordinator = await self.cluster.coordinator(self.transactional_id, CoordinatorType.TRANSACTION)
                if ApiKey.DESCRIBE_TRANSACTIONS not in coordinator.versions:
                    raise FatalError(ErrorCode.UNSUPPORTED_VERSION, "DescribeTransactions", message="the broker cannot describe transactions (Kafka before 3.0): init_transactions() instead")
                response = await self.cluster.coordinator_request(self.transactional_id, CoordinatorType.TRANSACTION, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [self.transactional_id]})
                state = response["transaction_states"][0]
                if state["error_code"]:
                    raise classify(state["error_code"], f"DescribeTransactions({self.transactional_id})")
        bumped = (handle.producer_id, handle.producer_epoch + 1)
        if self._transaction_v2 and state["transaction_state"] in _ENDED_STATES and (state["producer_id"], state["producer_epoch"]) == bumped:
            # Transaction version 2: the EndTxn that ended it bumped the epoch; go on with that one.
            self._new_epoch(*bumped)
        elif (state["producer_id"], state["producer_epoch"]) != (handle.producer_id, handle.producer_epoch):
            raise ProducerFencedError(
                ErrorCode.PRODUCER_FENCED, f"transactional id {self.transactional_id}",
                message=f"now producer {state['producer_id']} epoch {state['producer_epoch']}, was {handle.producer_id} epoch {handle.producer_epoch}",
            )
        if state["transaction_state"] not in _ENDED_STATES:
            raise FatalError(ErrorCode.INVALID_TXN_STATE, f"transactional id {self.transactional_id}", message=f"the detached transaction is {state['transaction_state']}, not ended")
        self._detached = None
        self.begin_transaction()

    @classmethod
    def resume(cls, handle: TransactionHandle, bootstrap_servers=None, *, cluster: Cluster | None = None, **options) -> "AsyncProducer":
        """A producer bound to another process's open transaction; it can only
        ``commit_transaction`` or ``abort_transaction`` it. ``cluster``: the
        connections (and known coordinators) of a client to share, which the
        caller keeps and closes; many resumed producers can end their
        transactions at once over it (the Spark sink's driver)."""
        producer = cls(bootstrap_servers, transactional_id=handle.transactional_id, **options)
        if cluster is not None:
            producer.cluster = cluster
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
        """Return once ``partition`` is part of the open transaction.

        Partitions asked for while an AddPartitionsToTxn is out go together
        in the next one (as Kafka's producer does): a request per partition
        made every transaction with N new partitions pay N-1 rounds of
        CONCURRENT_TRANSACTIONS and backoff (100 ms, 200 ms, ...)."""
        added = self._added.get(partition)
        if added is None and self._transaction_v2:
            # The Produce adds the partition itself (KIP-890 part 2): in the
            # transaction from now on, as far as this producer can know.
            added = self._added[partition] = asyncio.get_running_loop().create_future()
            added.set_result(None)
            return
        if added is None:
            loop = asyncio.get_running_loop()
            added = self._added[partition] = loop.create_future()
            self._to_add.append((partition, added))
            if self._adder is None or self._adder.done():
                self._adder = loop.create_task(self._add_partitions())
        await asyncio.shield(added)

    def _add_partitions_body(self, partitions) -> dict:
        """An AddPartitionsToTxn (v3 and below) of ``partitions`` for this producer."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        return {
            "v3_and_below_transactional_id": self.transactional_id,
            "v3_and_below_producer_id": self.producer_id,
            "v3_and_below_producer_epoch": self.producer_epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": indexes} for topic, indexes in by_topic.items()],
        }

    async def _add_partitions(self) -> None:
        while self._to_add:
            waiting, self._to_add = self._to_add, []
            body = self._add_partitions_body(tp for tp, _added in waiting)
            try:
                async with self._coordinator_turn:
                    # v4+ is the brokers' batched form (KIP-890)
                    await self._txn_request(ApiKey.ADD_PARTITIONS_TO_TXN, body, f"AddPartitionsToTxn({', '.join(str(tp) for tp, _ in waiting)})", max_version=3)
            except BaseException as error:
                failed = waiting + (self._to_add if isinstance(error, asyncio.CancelledError) else [])
                outcome = FatalError(message="the producer closed before the partition was added") if isinstance(error, asyncio.CancelledError) else error
                for _tp, added in failed:
                    if not added.done():
                        fail_quietly(added, outcome)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for _tp, added in waiting:
                if not added.done():
                    added.set_result(None)

    async def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        """Commit consumer positions with this transaction (KIP-447).

        ``offsets``: {TopicPartition or (topic, partition): next offset to
        read}; ``group_metadata``: ``consumer.group_metadata()`` (or a group
        id for a consumer outside any group)."""
        self._check_usable()
        if not self._in_transaction:
            raise FatalError(message="send_offsets_to_transaction outside a transaction")
        group = GroupMetadata.of(group_metadata)
        if group.group_id not in self._offsets_added and not self._transaction_v2:
            async with self._coordinator_turn:
                await self._txn_request(
                    ApiKey.ADD_OFFSETS_TO_TXN,
                    {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "group_id": group.group_id},
                    "AddOffsetsToTxn",
                )
        self._offsets_added.add(group.group_id)  # with version 2, TxnOffsetCommit adds it
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
                response = await self.cluster.coordinator_request(group.group_id, CoordinatorType.GROUP, ApiKey.TXN_OFFSET_COMMIT, body, max_version=self._max_version(ApiKey.TXN_OFFSET_COMMIT))
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
            self._drop_queued(queue, TransactionAbortableError(message="the transaction was aborted"))
        await self._end(commit=False)

    async def _end(self, *, commit: bool) -> None:
        if not self._in_transaction:
            raise FatalError(message="no open transaction")
        await self.flush()
        if commit and self._txn_error is not None:
            raise TransactionAbortableError(message=f"cannot commit, abort instead: {self._txn_error}")
        # Only what the coordinator accepted makes a transaction there (as in
        # Kafka): partitions whose AddPartitionsToTxn failed, e.g. together
        # with an unknown one, leave it Empty, and an EndTxn would be refused.
        partitions_added = any(added.done() and not added.cancelled() and added.exception() is None for added in self._added.values())
        if partitions_added or self._offsets_added or self._resumed:
            if commit:
                self.crash_point("txn.before_commit")
            body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "committed": commit}
            if self._resumed:
                await self._choose_transaction_version()
            try:
                response = await self._txn_request(ApiKey.END_TXN, body, "EndTxn", max_version=self._max_version(ApiKey.END_TXN))
            except TRANSIENT_ERRORS as error:
                if commit:
                    # The commit may have happened: never follow it with an abort.
                    self._fatal = CommitOutcomeUnknownError(message=f"commit outcome unknown ({error}); call init_transactions() to resolve it")
                    raise self._fatal from error
                raise
            except TransactionAbortableError as error:
                if error.code == ErrorCode.UNKNOWN_PRODUCER_ID:
                    # The coordinator aborted the transaction under us with an
                    # epoch bump (after an unclean stop): the abort that follows
                    # goes on at a new epoch (KIP-360).
                    self._needs_epoch_bump = True
                raise
            if self._transaction_v2 and response.get("producer_epoch", -1) >= 0:
                self._new_epoch(response["producer_id"], response["producer_epoch"])  # also what a failed send needed
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
        await self.wait_for_room(len(value or b"") + len(key or b"") + RECORD_OVERHEAD)
        return self.append(topic, partition, value, key, headers, timestamp, on_delivery)

    async def send_columns(self, topic: str, value, key=None, *, partition=None, headers=None, timestamp=None) -> asyncio.Future:
        """Queue a batch of records given as columns (Arrow arrays, or what
        ``pyarrow.array`` takes); the one returned future resolves, once every
        record is acknowledged, to a list of ``BatchMetadata`` (one per record
        batch sent).

        ``value`` binary or string (nulls are tombstones); ``key`` the same,
        or None; ``partition`` an int for every row, an int column, or None
        for Kafka's default partitioner (murmur2 of the key; the keyless rows
        of one call go to one partition, round robin from call to call);
        ``headers`` ``protocol.columnar.HEADERS_TYPE``; ``timestamp`` int64 ms
        or an Arrow timestamp (nulls, or None: now). Rows go out in order per
        partition, in batches of ``config.columns_batch_size``, after whatever
        was sent before. The encoded batches wait in ``buffer_memory``:
        when it is full this waits for room, at most ``max_block_ms``
        (``BufferExhaustedError``). Bad columns raise before anything is queued."""
        import numpy as np

        from protocol.columnar import HEADERS_TYPE, encode_records
        from txn.column_batches import numpy_array, plan_batches, record_sizes

        self.check_can_send()
        if not self._started:
            await self.start()
        partition_count = await self.cluster.partitions_for(topic)
        value = _binary_column(value, "value")
        count = len(value)
        key = None if key is None else _binary_column(key, "key")
        if key is not None and key.null_count == count:
            key = None
        headers = None if headers is None else _arrow_column(headers, HEADERS_TYPE)
        if (key is not None and len(key) != count) or (headers is not None and len(headers) != count):
            raise ValueError("the key, value and headers columns differ in length")
        timestamps = self._timestamp_column(timestamp, count)
        if count == 0:
            done = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        partitions = self._partitions_of(partition, key, count, partition_count)
        order = None
        if len(partitions) > 1 and (partitions[1:] < partitions[:-1]).any():
            order = np.argsort(partitions, kind="stable")
            partitions = partitions[order]
            indices = numpy_array(order)
            value = value.take(indices)
            key = None if key is None else key.take(indices)
            headers = None if headers is None else headers.take(indices)
            timestamps = timestamps[order]
        header_sizes = None
        if headers is not None:
            import pyarrow.compute as pc

            flat = headers.flatten()
            entry_sizes = pc.add(pc.binary_length(pc.struct_field(flat, "key")).fill_null(0), pc.binary_length(pc.struct_field(flat, "value")).fill_null(0))
            per_list = np.concatenate([[0], np.cumsum(entry_sizes.to_numpy(zero_copy_only=False).astype(np.int64) + 10)])
            list_offsets = headers.offsets.to_numpy() - headers.offsets[0].as_py()
            header_sizes = per_list[list_offsets[1:]] - per_list[list_offsets[:-1]]
        limit = self.config.columns_batch_size
        futures = []
        for planned in plan_batches(partitions, record_sizes(key, value, header_sizes), limit):
            rows = slice(planned.start, planned.stop)
            for encoded in _encoded_within(encode_records, limit, planned.stop - planned.start, lambda first, last, rows=rows: dict(
                key=None if key is None else key[rows][first:last],
                value=value[rows][first:last],
                headers=None if headers is None else headers[rows][first:last],
                timestamp=timestamps[rows][first:last],
                compression=self.config.compression_type,
            )):
                await self.reserve_buffer(len(encoded.section))
                try:
                    futures.append(self.append_encoded(self._topic_partition(topic, planned.partition), encoded))
                except BaseException:
                    self._release_buffer(len(encoded.section))
                    raise
        outcome = asyncio.gather(*futures)
        outcome.add_done_callback(lambda f: f.cancelled() or f.exception())  # failures reach the commit, or whoever awaits
        return outcome

    def _topic_partition(self, topic: str, partition: int) -> TopicPartition:
        tp = self._topic_partitions.get((topic, partition))
        if tp is None:
            tp = self._topic_partitions[(topic, partition)] = TopicPartition(topic, partition)
        return tp

    @staticmethod
    def _timestamp_column(timestamp, count: int):
        import numpy as np
        import pyarrow as pa

        now = int(time.time() * 1000)
        if timestamp is None:
            return np.full(count, now, dtype=np.int64)
        column = _arrow_column(timestamp, pa.int64())
        if len(column) != count:
            raise ValueError("the timestamp column's length differs from the value column's")
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        elif not pa.types.is_integer(column.type):
            raise TypeError(f"the timestamp column must be int64 ms or an Arrow timestamp, not {column.type}")
        column = column.cast(pa.int64())
        if column.null_count:
            column = column.fill_null(now)
        # Read from the buffer: to_numpy and fill_null's scalar have pyarrow import pandas (when installed).
        return np.frombuffer(column.buffers()[1], dtype=np.int64, count=len(column), offset=column.offset * 8)

    def _partitions_of(self, partition, key, count: int, partition_count: int):
        import numpy as np
        import pyarrow as pa

        if partition is not None and not isinstance(partition, (pa.Array, pa.ChunkedArray, np.ndarray, list, tuple)):
            partitions = np.full(count, int(partition), dtype=np.int32)
        elif partition is not None:
            column = _arrow_column(partition, pa.int32())
            if len(column) != count:
                raise ValueError("the partition column's length differs from the value column's")
            if column.null_count:
                chosen = self._default_partitions(key, count, partition_count)
                partitions = np.where(column.is_null().to_numpy(zero_copy_only=False), chosen, column.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int32)
            else:
                partitions = column.to_numpy(zero_copy_only=False).astype(np.int32)
        else:
            partitions = self._default_partitions(key, count, partition_count)
        if count and (int(partitions.min()) < 0 or int(partitions.max()) >= partition_count):
            raise ValueError(f"partition {int(partitions.min()) if int(partitions.min()) < 0 else int(partitions.max())} is not one of the topic's {partition_count}")
        return partitions

    def _default_partitions(self, key, count: int, partition_count: int):
        import numpy as np

        from txn.column_batches import murmur2_partitions, present_mask

        keyless = next(self._round_robin) % partition_count  # sticky for the call
        if key is None:
            return np.full(count, keyless, dtype=np.int32)
        partitions = murmur2_partitions(key, partition_count)
        if key.null_count:
            partitions[~present_mask(key)] = keyless
        return partitions

    def check_can_send(self) -> None:
        self._check_usable()
        if self.transactional_id is not None and not self._in_transaction:
            raise FatalError(message="send outside a transaction (call begin_transaction)")
        if self._resumed:
            raise FatalError(message="a resumed transaction can only be committed or aborted")

    async def close(self) -> None:
        """Flush and close the connections (an open transaction is left to
        time out, or to whoever holds its handle)."""
        try:
            if self._fatal is None:
                await self.flush()
        finally:
            # What flush did not wait for (a fatal error stopped it, or flush
            # was cancelled) is the producer's to stop before its connections go.
            try:
                await cancel_and_wait(*self._tasks, self._adder if self._adder is not None and not self._adder.done() else None)
            finally:
                await self.cluster.close()


def _arrow_column(values, kind):
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    return pa.array(values, kind)


def _binary_column(values, name: str):
    import pyarrow as pa

    column = _arrow_column(values, pa.binary())
    if pa.types.is_null(column.type):
        return pa.nulls(len(column), pa.binary())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        column = column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise TypeError(f"the {name} column must be binary or string, not {column.type}")
    return column


def _encoded_within(encode, limit: int, count: int, columns_of):
    """``encode(**columns_of(first, last))`` over rows ``0:count``, halved
    where a run's encoding came out above ``limit`` (the sizes it was cut
    by are estimates); a single row is sent whatever its size."""
    pending = [(0, count)]
    while pending:
        first, last = pending.pop()
        encoded = encode(**columns_of(first, last))
        if len(encoded.section) > limit and last - first > 1:
            middle = (first + last) // 2
            pending += [(middle, last), (first, middle)]  # popped first half first: order kept
            continue
        yield encoded


# DescribeTransactions states after which the same producer id and epoch
# start a new transaction, never join the old one.
_ENDED_STATES = {"Empty", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"}


def _first_error(body: dict) -> int:
    if body.get("error_code"):
        return body["error_code"]
    not_attempted = 0
    for topic in body.get("results_by_topic_v3_and_below", []) + [t for r in body.get("results_by_transaction", []) for t in r["topic_results"]]:
        for partition in topic["results_by_partition"]:
            code = partition["partition_error_code"]
            if code == ErrorCode.OPERATION_NOT_ATTEMPTED:
                not_attempted = code  # the others' answer when one partition failed: that one's error says why
            elif code:
                return code
    if not_attempted:
        return not_attempted
    for topic in body.get("topics", []):
        for partition in topic.get("partitions", []):
            if partition.get("error_code"):
                return partition["error_code"]
    return 0


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


class Producer(SyncClient):
    """The synchronous producer: every call runs on the producer's own loop thread.

    ``Producer(bootstrap_servers="host:9092", transactional_id=None, **config)``;
    Kafka property names are accepted too: ``Producer({"bootstrap.servers": ...})``.
    """

    thread_name = "onceflow-producer"

    def __init__(
        self,
        bootstrap_servers=None,
        transactional_id: str | None = None,
        config: dict | ProducerConfig | None = None,
        *,
        crash_point: Callable[[str], None] = no_crash_point,
        **options,
    ):
        bootstrap_servers, config = properties_first(bootstrap_servers, config)
        super().__init__(lambda: AsyncProducer(bootstrap_servers, transactional_id, config, crash_point=crash_point, **options))
        self._handoff: collections.deque = collections.deque()  # sends on their way to the loop, in call order
        # Bytes of them put in (by senders) and taken out (by the loop), each
        # written by one side, so buffer_memory counts what is on its way too.
        self._handed_bytes = 0
        self._taken_bytes = 0
        self._handoff_scheduled = False
        if self._async.transactional_id is None:
            try:
                self._call(self._async.start())
            except BaseException:
                self._thread.stop()
                raise

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
        first send to a topic waits for its metadata; later ones do not wait,
        unless what waits to be sent fills ``buffer_memory``: then this
        waits for room, at most ``max_block_ms`` (``BufferExhaustedError``).
        Records on their way to the loop count as well."""
        self._async.check_can_send()
        size = len(value or b"") + len(key or b"") + RECORD_OVERHEAD
        waiting = self._async._buffered + self._handed_bytes - self._taken_bytes
        if waiting and waiting + size > self._async.config.buffer_memory:
            self._thread.call(self._async.wait_for_room(size))  # runs after the loop took what is on its way
        result = DeliveryFuture(self._thread)
        if not self._async.can_append_now(topic, partition):
            result.inner = self._thread.call(self._async.send(topic, value, key=key, partition=partition, headers=headers, timestamp=timestamp, on_delivery=on_delivery))
            return result
        self._handed_bytes += size
        self._handoff.append((result, size, (topic, partition, value, key, headers, timestamp, on_delivery)))
        if not self._handoff_scheduled:
            # One wake-up of the loop per burst of sends, not one per record.
            self._handoff_scheduled = True
            self._thread.loop.call_soon_threadsafe(self._take_handoff)
        return result

    def _take_handoff(self) -> None:
        self._handoff_scheduled = False
        while self._handoff:
            result, size, args = self._handoff.popleft()
            self._taken_bytes += size
            try:
                result.inner = self._async.append(*args)
            except Exception as error:
                result.inner = failed = asyncio.get_running_loop().create_future()
                failed.set_exception(error)

    def flush(self, timeout: float | None = None) -> None:
        self._thread.call(self._async.flush(), timeout)

    def send_columns(self, topic: str, value, key=None, *, partition=None, headers=None, timestamp=None) -> "DeliveryFuture":
        """Queue a batch of records given as columns (``AsyncProducer.send_columns``):
        returns once they are encoded and queued (waiting for room in
        ``buffer_memory`` first), with one ``DeliveryFuture`` for them all,
        which resolves to their ``BatchMetadata`` list. Ordered with
        ``send``: after every send made before it."""
        self._async.check_can_send()
        result = DeliveryFuture(self._thread)
        result.inner = self._thread.call(self._async.send_columns(topic, value, key, partition=partition, headers=headers, timestamp=timestamp))
        return result

    def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        self._thread.call(self._async.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._thread.call(self._async.commit_transaction())

    def abort_transaction(self) -> None:
        self._thread.call(self._async.abort_transaction())

    def transaction_handle(self) -> TransactionHandle:
        return self._thread.run(self._async.transaction_handle)

    def seal_transaction(self) -> TransactionHandle:
        """Flush and seal the open transaction (see ``AsyncProducer.seal_transaction``)."""
        return self._thread.call(self._async.seal_transaction())

    def detach_transaction(self) -> TransactionHandle:
        return self._thread.run(self._async.detach_transaction)

    def begin_after_detached(self) -> None:
        self._thread.call(self._async.begin_after_detached())

    @classmethod
    def resume(cls, handle: TransactionHandle, bootstrap_servers=None, **options) -> "Producer":
        """Bind to another process's open transaction (see ``AsyncProducer.resume``)."""
        producer = cls.__new__(cls)
        SyncClient.__init__(producer, lambda: AsyncProducer.resume(handle, bootstrap_servers, **options))
        producer._handoff, producer._handoff_scheduled = collections.deque(), False
        return producer

    def transaction(self):
        """``with producer.transaction(): ...`` commits on success, aborts on error."""
        return _TransactionScope(self)


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
