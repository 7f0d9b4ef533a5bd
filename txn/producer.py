"""onceflow's producer: idempotent by default, transactional on request.

Asyncio at the core (``AsyncProducer``); ``Producer`` is a thin synchronous
facade that runs one on its own event-loop thread.

What it does, in Kafka's terms:

- ``InitProducerId`` (through the transaction coordinator when a
  ``transactional_id`` is set) gives the producer id and epoch; each
  partition gets its own sequence numbers, so a retried batch is recognized
  by the broker and never written twice.
- Records are batched per partition (``linger_ms``, ``batch_size``) and the
  default partitioner is Kafka's (murmur2 of the key; round robin without a
  key), so keys land where the Java client would put them.
- One batch per partition is in flight at a time, which keeps order through
  retries trivially (Kafka allows up to five; that is left for later).
  Retriable errors are retried with backoff (tenacity) until
  ``delivery_timeout_ms``.
- Transactions: ``begin_transaction``, ``send_offsets_to_transaction``
  (AddOffsetsToTxn, then TxnOffsetCommit with the consumer's group metadata),
  ``commit_transaction``, ``abort_transaction``. Errors follow KIP-1050:
  ``ProducerFencedError`` is fatal, ``TransactionAbortableError`` means abort
  and go on, ``CommitOutcomeUnknownError`` means the commit may or may not
  have happened: the producer refuses to abort after it (an abort could hit
  the next transaction) and must be re-initialized.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict

import attrs
import tenacity

from protocol.compression import Compression
from protocol.errors import ErrorCode, error_name
from protocol.records import encode_batch
from txn.connection import BrokerClient

PRODUCE, METADATA, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 3, 10, 22
ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28


class KafkaError(Exception):
    def __init__(self, code: int, context: str = ""):
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        super().__init__(f"{context}{': ' if context else ''}{error_name(code)}")

    @property
    def retriable(self) -> bool:
        return isinstance(self.code, ErrorCode) and self.code.is_retriable


class ProducerFencedError(KafkaError):
    """Another instance with the same transactional id took over: fatal."""


class TransactionAbortableError(Exception):
    """The transaction cannot commit; abort it and continue."""


class CommitOutcomeUnknownError(Exception):
    """EndTxn(commit) was sent but its answer never came: do not abort."""


@attrs.frozen
class RecordMetadata:
    topic: str
    partition: int
    offset: int


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


FENCING = {ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


class AsyncProducer:
    def __init__(
        self,
        bootstrap: str,
        *,
        transactional_id: str | None = None,
        enable_idempotence: bool = True,
        acks: int = -1,
        linger_ms: int = 5,
        batch_size: int = 16384,
        compression: Compression = Compression.NONE,
        transaction_timeout_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        client_id: str = "onceflow-producer",
    ):
        host, _, port = bootstrap.rpartition(":")
        self.bootstrap = (host or "127.0.0.1", int(port))
        self.transactional_id = transactional_id
        self.idempotent = enable_idempotence or transactional_id is not None
        self.acks = -1 if self.idempotent else acks
        self.linger = linger_ms / 1000.0
        self.batch_size = batch_size
        self.compression = compression
        self.transaction_timeout_ms = transaction_timeout_ms
        self.delivery_timeout = delivery_timeout_ms / 1000.0
        self.client_id = client_id
        self.producer_id, self.producer_epoch = -1, -1
        self._brokers: dict[tuple[str, int], BrokerClient] = {}
        self._leaders: dict[tuple[str, int], tuple[str, int]] = {}
        self._partition_counts: dict[str, int] = {}
        self._sequences: dict[tuple[str, int], int] = defaultdict(int)
        self._buffers: dict[tuple[str, int], list] = defaultdict(list)
        self._buffer_bytes: dict[tuple[str, int], int] = defaultdict(int)
        self._inflight: dict[tuple[str, int], asyncio.Task] = {}
        self._flush_timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._round_robin = itertools.count()
        self._coordinator: BrokerClient | None = None
        self._in_transaction = False
        self._txn_partitions: set[tuple[str, int]] = set()
        self._txn_failed: Exception | None = None
        self._fatal: Exception | None = None
        self._metadata_lock = asyncio.Lock()
        self._offsets_added = False

    # -- connections and metadata -----------------------------------------------------

    async def _broker(self, address: tuple[str, int]) -> BrokerClient:
        client = self._brokers.get(address)
        if client is None:
            client = self._brokers[address] = BrokerClient(*address, client_id=self.client_id)
        if not client.connected:
            await client.connect()
        return client

    async def _refresh_metadata(self, topics: list[str]) -> None:
        client = await self._broker(self.bootstrap)
        body = await client.request(METADATA, {"topics": [{"name": t} for t in topics], "allow_auto_topic_creation": True})
        brokers = {b["node_id"]: (b["host"], b["port"]) for b in body["brokers"]}
        for topic in body["topics"]:
            if topic["error_code"]:
                raise KafkaError(topic["error_code"], f"metadata for {topic['name']}")
            self._partition_counts[topic["name"]] = len(topic["partitions"])
            for partition in topic["partitions"]:
                self._leaders[(topic["name"], partition["partition_index"])] = brokers[partition["leader_id"]]

    async def _find_coordinator(self, key: str, key_type: int) -> BrokerClient:
        client = await self._broker(self.bootstrap)
        version = client.version_for(FIND_COORDINATOR)
        body = await client.request(FIND_COORDINATOR, {"key": key, "key_type": key_type, "coordinator_keys": [key]}, version=version)
        entry = body["coordinators"][0] if version >= 4 else body
        if entry["error_code"]:
            raise KafkaError(entry["error_code"], f"FindCoordinator({key})")
        return await self._broker((entry["host"], entry["port"]))

    def _retrying(self):
        return tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, ConnectionError) or (isinstance(e, KafkaError) and e.retriable)),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            stop=tenacity.stop_after_delay(self.delivery_timeout),
            reraise=True,
        )

    # -- producer id and transactions ------------------------------------------------------

    async def start(self) -> None:
        if not self.idempotent:
            return
        async for attempt in self._retrying():
            with attempt:
                if self.transactional_id is not None:
                    client = await self._find_coordinator(self.transactional_id, 1)
                    self._coordinator = client
                else:
                    client = await self._broker(self.bootstrap)
                body = await client.request(INIT_PRODUCER_ID, {"transactional_id": self.transactional_id, "transaction_timeout_ms": self.transaction_timeout_ms, "producer_id": -1, "producer_epoch": -1})
                if body["error_code"]:
                    raise KafkaError(body["error_code"], "InitProducerId")
        self.producer_id, self.producer_epoch = body["producer_id"], body["producer_epoch"]
        self._sequences.clear()

    init_transactions = start

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def begin_transaction(self) -> None:
        self._check_usable()
        if self.transactional_id is None:
            raise RuntimeError("begin_transaction needs a transactional_id")
        if self._in_transaction:
            raise RuntimeError("a transaction is already open")
        self._in_transaction = True
        self._txn_partitions = set()
        self._offsets_added = False
        self._txn_failed = None

    async def _coordinator_request(self, api_key: int, body: dict, what: str, max_version: int | None = None) -> dict:
        async for attempt in self._retrying():
            with attempt:
                if self._coordinator is None or not self._coordinator.connected:
                    self._coordinator = await self._find_coordinator(self.transactional_id, 1)
                version = self._coordinator.version_for(api_key)
                if max_version is not None:
                    version = min(version, max_version)
                response = await self._coordinator.request(api_key, body, version=version)
                code = self._first_error(response)
                if code in FENCING:
                    self._fatal = ProducerFencedError(code, what)
                    raise self._fatal
                if code:
                    raise KafkaError(code, what)
        return response

    @staticmethod
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

    async def _add_partition(self, key: tuple[str, int]) -> None:
        if key in self._txn_partitions:
            return
        await self._coordinator_request(
            ADD_PARTITIONS,
            {
                "v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.producer_epoch,
                "v3_and_below_topics": [{"name": key[0], "partitions": [key[1]]}],
            },
            f"AddPartitionsToTxn({key[0]}-{key[1]})",
            max_version=3,  # v4+ is the brokers' batched form (KIP-890)
        )
        self._txn_partitions.add(key)

    async def send_offsets_to_transaction(self, offsets: dict[tuple[str, int], int], group_metadata: dict) -> None:
        """Commit consumer positions with this transaction. ``group_metadata``:
        group_id, generation_id, member_id, group_instance_id (KIP-447)."""
        self._check_usable()
        group_id = group_metadata["group_id"]
        await self._coordinator_request(
            ADD_OFFSETS,
            {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "group_id": group_id},
            "AddOffsetsToTxn",
        )
        self._offsets_added = True
        by_topic: dict[str, list] = defaultdict(list)
        for (topic, partition), offset in offsets.items():
            by_topic[topic].append({"partition_index": partition, "committed_offset": offset, "committed_metadata": ""})
        body = {
            "transactional_id": self.transactional_id,
            "group_id": group_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "generation_id": group_metadata.get("generation_id", -1),
            "member_id": group_metadata.get("member_id", ""),
            "group_instance_id": group_metadata.get("group_instance_id"),
            "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
        }
        async for attempt in self._retrying():
            with attempt:
                group_coordinator = await self._find_coordinator(group_id, 0)
                response = await group_coordinator.request(TXN_OFFSET_COMMIT, body)
                code = self._first_error(response)
                if code in FENCING:
                    self._fatal = ProducerFencedError(code, "TxnOffsetCommit")
                    raise self._fatal
                if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                    self._txn_failed = TransactionAbortableError(f"TxnOffsetCommit: {error_name(code)} (the group moved on)")
                    raise self._txn_failed
                if code:
                    raise KafkaError(code, "TxnOffsetCommit")

    async def _end(self, commit: bool) -> None:
        await self.flush()
        if commit and self._txn_failed is not None:
            raise TransactionAbortableError(f"cannot commit: {self._txn_failed}")
        if not self._txn_partitions and not self._offsets_added:
            # Nothing reached the coordinator: there is no transaction to end.
            self._in_transaction = False
            return
        try:
            await self._coordinator_request(
                END_TXN,
                {"transactional_id": self.transactional_id, "producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "committed": commit},
                "EndTxn",
            )
        except (ConnectionError, asyncio.TimeoutError) as error:
            if commit:
                # The commit may have happened: never follow it with an abort.
                self._fatal = CommitOutcomeUnknownError(f"commit outcome unknown: {error}")
                raise self._fatal from error
            raise
        self._in_transaction = False
        self._txn_partitions = set()
        self._offsets_added = False

    async def commit_transaction(self) -> None:
        self._check_usable()
        await self._end(True)

    async def abort_transaction(self) -> None:
        self._check_usable()
        self._buffers.clear()  # unsent records of an aborted transaction are dropped
        await self._end(False)

    # -- sending -------------------------------------------------------------------------------

    async def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, headers=(), partition: int | None = None, timestamp: int | None = None) -> asyncio.Future:
        """Queue a record; the returned future resolves to its RecordMetadata."""
        self._check_usable()
        if self.transactional_id is not None and not self._in_transaction:
            raise RuntimeError("send outside a transaction (call begin_transaction)")
        if topic not in self._partition_counts:
            async with self._metadata_lock:  # FIFO: records keep their send order
                if topic not in self._partition_counts:
                    await self._refresh_metadata([topic])
        if partition is None:
            partition = default_partition(key, self._partition_counts[topic], self._round_robin)
        future = asyncio.get_running_loop().create_future()
        key_tp = (topic, partition)
        record = (key, value, tuple(headers), int(time.time() * 1000) if timestamp is None else timestamp)
        self._buffers[key_tp].append((record, future))
        self._buffer_bytes[key_tp] += len(value or b"") + len(key or b"") + 20
        if self._buffer_bytes[key_tp] >= self.batch_size:
            self._drain(key_tp)
        elif key_tp not in self._flush_timers:
            self._flush_timers[key_tp] = asyncio.get_running_loop().call_later(self.linger, self._drain, key_tp)
        return future

    def _drain(self, key_tp) -> None:
        timer = self._flush_timers.pop(key_tp, None)
        if timer is not None:
            timer.cancel()
        if key_tp in self._inflight or not self._buffers.get(key_tp):
            return
        batch = self._buffers.pop(key_tp)
        self._buffer_bytes.pop(key_tp, None)
        task = asyncio.get_running_loop().create_task(self._send_batch(key_tp, batch))
        self._inflight[key_tp] = task

        def done(_task, key_tp=key_tp):
            self._inflight.pop(key_tp, None)
            if self._buffers.get(key_tp):
                self._drain(key_tp)

        task.add_done_callback(done)

    async def _send_batch(self, key_tp, batch) -> None:
        topic, partition = key_tp
        futures = [future for _record, future in batch]
        sequence = self._sequences[key_tp] if self.idempotent else -1
        data = encode_batch(
            [record for record, _future in batch],
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=sequence,
            is_transactional=self.transactional_id is not None,
            compression=self.compression,
        )
        try:
            if self.transactional_id is not None:
                await self._add_partition(key_tp)
            async for attempt in self._retrying():
                with attempt:
                    leader = self._leaders.get(key_tp) or self.bootstrap
                    client = await self._broker(leader)
                    body = {"transactional_id": self.transactional_id, "acks": self.acks, "timeout_ms": 30_000, "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}]}
                    response = await client.request(PRODUCE, body, expect_response=self.acks != 0)
                    if response is None:
                        result = {"error_code": 0, "base_offset": -1}
                    else:
                        result = response["responses"][0]["partition_responses"][0]
                    code = result["error_code"]
                    if code in FENCING:
                        self._fatal = ProducerFencedError(code, f"produce to {topic}-{partition}")
                        raise self._fatal
                    if code:
                        raise KafkaError(code, f"produce to {topic}-{partition}")
        except Exception as error:
            if self.transactional_id is not None and self._txn_failed is None:
                self._txn_failed = error
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        if self.idempotent:
            self._sequences[key_tp] = (sequence + len(batch)) % (2**31)
        base = result["base_offset"]
        for index, future in enumerate(futures):
            if not future.done():
                future.set_result(RecordMetadata(topic, partition, base + index if base >= 0 else -1))

    async def flush(self) -> None:
        for key_tp in list(self._buffers):
            self._drain(key_tp)
        while self._inflight or any(self._buffers.values()):
            await asyncio.gather(*list(self._inflight.values()), return_exceptions=True)
            for key_tp in list(self._buffers):
                self._drain(key_tp)

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            for client in self._brokers.values():
                await client.close()


class Producer:
    """The synchronous facade: every call runs on the producer's own loop thread."""

    def __init__(self, bootstrap: str, **options):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="onceflow-producer", daemon=True)
        self._thread.start()
        self._async = AsyncProducer(bootstrap, **options)
        if self._async.transactional_id is None:
            self._call(self._async.start())

    def _call(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    @property
    def producer_id(self) -> int:
        return self._async.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._async.producer_epoch

    def init_transactions(self) -> None:
        self._call(self._async.init_transactions())

    def begin_transaction(self) -> None:
        async def begin():
            self._async.begin_transaction()

        self._call(begin())

    def send(self, topic: str, value: bytes | None, **kwargs):
        """Queue a record (returns once it is queued, so a later commit covers
        it); the returned concurrent.futures.Future resolves to RecordMetadata."""
        inner = self._call(self._async.send(topic, value, **kwargs))

        async def delivered():
            return await inner

        return asyncio.run_coroutine_threadsafe(delivered(), self._loop)

    def flush(self, timeout: float | None = None) -> None:
        self._call(self._async.flush(), timeout)

    def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        self._call(self._async.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._call(self._async.commit_transaction())

    def abort_transaction(self) -> None:
        self._call(self._async.abort_transaction())

    def transaction(self):
        """``with producer.transaction(): ...`` commits on success, aborts on error."""
        producer = self

        class _Transaction:
            def __enter__(self_inner):
                producer.begin_transaction()
                return producer

            def __exit__(self_inner, exc_type, exc, tb):
                if exc_type is None:
                    producer.commit_transaction()
                elif not isinstance(exc, (ProducerFencedError, CommitOutcomeUnknownError)):
                    producer.abort_transaction()
                return False

        return _Transaction()

    def close(self) -> None:
        try:
            self._call(self._async.close(), 60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
