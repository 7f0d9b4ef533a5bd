"""The ``onceflow`` data source's streaming sink: every microbatch written to
Kafka exactly once, through Kafka transactions, by any Kafka-protocol broker.

``make_stream_writer(options, schema, overwrite)`` (called by the data
source's ``streamWriter``) validates the options and the columns the way
Spark's Kafka sink does and returns the writer:

- executors (``write``): one transaction per Spark task on transactional id
  ``{prefix}-{query}-{run}-{partition}``: send every row of the task's Arrow
  batches, flush, and return the transaction's handle, left open;
- the driver (``commit``): the two-phase commit of ``streaming.spark.decision``:
  a durable decision record first (a one-partition compacted topic
  ``onceflow.decisions.{prefix}``, written with acks=all), then EndTxn(commit)
  for every decided handle, then abort every other open transaction of the
  query. A batch re-run after a crash re-commits what was decided before.
  The commit runner (a long-lived Python worker) keeps its clients from
  batch to batch (``DriverClients``).
- ``deliveryGuarantee=at_least_once``: an idempotent producer per task, no
  transaction; ``commit`` has nothing to do.

Options (Spark's Kafka sink names where Spark has one):

| option | default | meaning |
| --- | --- | --- |
| kafka.bootstrap.servers | required | brokers |
| topic | none | overrides the ``topic`` column |
| deliveryGuarantee | exactly_once | or at_least_once |
| transactionalIdPrefix | derived from checkpointLocation | unique per query (per checkpoint); required for exactly_once without a checkpointLocation option |
| kafka.transaction.timeout.ms | 900000 | must exceed a batch plus the longest restart |
| commitOffsetsToGroup | none | group id: the source's end offsets of the batch are committed to it in the batch's decision |
| decisionTopic | onceflow.decisions.{prefix} | where decisions are recorded |
| kafka.* | | any other producer setting (``kafka.linger.ms``) |
| crashPointHook | none | ``module:function`` called at the named crash points (the fault harness's seam) |

The timeout rule: every transaction of a batch stays open from the task's
first send until the driver's commit, and after a driver crash until the
restarted query re-commits it. If the broker aborts a decided transaction
first (``transaction.timeout.ms`` passed), its records are lost; the sink then
fails the query with ``DecidedTransactionsLostError`` naming them, never
silently. So ``kafka.transaction.timeout.ms`` > batch duration + the longest
restart; the default is 15 minutes (Kafka's and our broker's
``transaction.max.timeout.ms``). Open transactions hold the last stable
offset of the partitions they wrote: after a driver crash, read_committed
readers of the output wait until the restarted query's first commit.

Crash points (``CRASH_POINTS``) are a seam, never an import of ``faults``:
the process that composes the query names a ``module:function`` in the
``crashPointHook`` option, and the sink calls it with each point's name in
whichever Spark process passes there (the test driver's hook arms points
from the environment with ``faults.points``' syntax and SIGKILLs the
driver's process group). Without the option the points cost one call to a
no-op.

Limits: ``commitOffsetsToGroup`` needs the checkpoint on a file system the
driver's Python can open (it reads Spark's offset log); a second driver
running the same checkpoint at the same time (Spark does not prevent that
across clusters) is not fenced; on a broker without ListTransactions
(Kafka before 3.0) a crashed run's open transactions are not found, so they
end at their timeout and hold the output's LSO until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import re
import threading
import uuid

import attrs
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, DoubleType, IntegerType, StringType, StructType, TimestampType

from streaming.spark import options as opts
from streaming.spark.decision import (
    BatchTransactionsNotOpenError,
    Decision,
    DecidedTransactionsLostError,
    DriverFencedError,
    HandleState,
    PrefixInUseError,
    SinkError,
    SinkTransaction,
    all_aborted,
    dead_handles,
    driver_transactional_id,
    leftovers,
    lost_message,
    not_open_message,
    plan_abort,
    plan_commit,
    query_prefix,
    transactional_id,
)
from txn.admin import AsyncAdmin
from txn.config import AdminConfig, ConsumerConfig, ProducerConfig
from txn.consumer import AsyncConsumer
from protocol.errors import ErrorCode
from protocol.loop_thread import LoopThread
from protocol.messages import ApiKey
from txn.errors import InvalidProducerEpochError, KafkaError, ProducerFencedError
from txn.producer import AsyncProducer, Producer, TransactionHandle
from txn.types import TopicPartition

log = logging.getLogger(__name__)

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly_once", "at_least_once"
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
OFFSETS_PARTITION = "__consumer_offsets"

# Named crash points (the hook is called with these names).
TASK_BEFORE_HANDLE = "spark_sink.task_before_handle"  # executor: rows sent, transaction open, no handle returned
BEFORE_DECISION = "spark_sink.before_decision"  # driver: tasks done, nothing decided
AFTER_DECISION = "spark_sink.after_decision"  # driver: decision durable, nothing committed
AFTER_COMMIT = "spark_sink.after_commit"  # driver: after each decided transaction's commit (hit k: k of n committed)
AFTER_ALL_COMMITS = "spark_sink.after_all_commits"  # driver: all committed, Spark's commit log not yet written
CRASH_POINTS = (TASK_BEFORE_HANDLE, BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT, AFTER_ALL_COMMITS)

# Besides Spark's own refusals (streaming.spark.options), what the sink sets itself.
FORBIDDEN_SINK_OWNED_PARAMS = {
    "transactional.id": "Kafka option 'transactional.id' is not supported: set transactionalIdPrefix, the sink names one transactional id per task",
    "enable.idempotence": "Kafka option 'enable.idempotence' is not supported: the sink's producers are always idempotent (deliveryGuarantee chooses transactions)",
}
HEADERS_TYPE = "array<struct<key:string,value:binary>>"
TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class SinkSchemaError(SinkError):
    """The query's columns do not fit the sink (Spark's own messages)."""


@attrs.frozen
class SinkOptions:
    kafka_params: dict = attrs.field(eq=False)  # Kafka client properties (kafka.* without the prefix)
    topic: str | None
    delivery_guarantee: str
    transactional_id_prefix: str | None
    decision_topic: str | None
    commit_offsets_to_group: str | None
    checkpoint_location: str | None
    crash_point_hook: str | None

    @property
    def exactly_once(self) -> bool:
        return self.delivery_guarantee == EXACTLY_ONCE

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_params["bootstrap.servers"]

    @classmethod
    def parse(cls, options) -> "SinkOptions":
        """From Spark's options (a case-insensitive mapping of strings);
        every problem is an ``OptionError`` raised here, on the driver."""
        lowered = opts.lowercase(options)
        params = opts.kafka_params(lowered)
        opts.require_bootstrap_servers(params, "producer")
        opts.reject_forbidden_sink_params(params)
        for name, message in FORBIDDEN_SINK_OWNED_PARAMS.items():
            if name in params:
                raise opts.OptionError(message)
        params.setdefault("transaction.timeout.ms", str(DEFAULT_TRANSACTION_TIMEOUT_MS))
        guarantee = str(lowered.get("deliveryguarantee", EXACTLY_ONCE)).lower()
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise opts.OptionError(f"deliveryGuarantee must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, not {guarantee!r}")
        prefix = lowered.get("transactionalidprefix") or None
        checkpoint = lowered.get("checkpointlocation") or None
        if guarantee == EXACTLY_ONCE and not prefix:
            if checkpoint is None:
                raise opts.OptionError(
                    "deliveryGuarantee=exactly_once needs option 'transactionalIdPrefix' (a name unique to this query: its "
                    "transactions and its decision record are named after it) or a checkpointLocation option to derive one "
                    "from; deliveryGuarantee=at_least_once needs neither"
                )
            prefix = default_prefix(checkpoint)
        decision_topic = lowered.get("decisiontopic") or (f"onceflow.decisions.{prefix}" if prefix else None)
        if guarantee == EXACTLY_ONCE and not TOPIC_NAME.match(decision_topic):
            raise opts.OptionError(f"decision topic {decision_topic!r} is not a legal topic name: use letters, digits, '.', '_' and '-' in transactionalIdPrefix, or set decisionTopic")
        group = lowered.get("commitoffsetstogroup") or None
        if group is not None:
            if guarantee != EXACTLY_ONCE:
                raise opts.OptionError("commitOffsetsToGroup needs deliveryGuarantee=exactly_once (the offsets commit in the batch's transactions)")
            if checkpoint is None:
                raise opts.OptionError(
                    "commitOffsetsToGroup needs .option('checkpointLocation', ...) on this writeStream: the sink reads the batch's "
                    "source end offsets from the checkpoint's offset log"
                )
        parsed = cls(params, lowered.get("topic") or None, guarantee, prefix, decision_topic, group, checkpoint, lowered.get("crashpointhook") or None)
        parsed.producer_config(transactional_id=prefix and f"{prefix}-check")  # unknown or bad kafka.* settings fail here
        return parsed

    def producer_config(self, transactional_id: str | None = None) -> ProducerConfig:
        return opts.client_config(ProducerConfig, self.kafka_params, transactional_id=transactional_id)

    def admin_config(self) -> AdminConfig:
        return opts.client_config(AdminConfig, self.kafka_params, only_known=True)

    def consumer_config(self) -> ConsumerConfig:
        """The decision reader's: read_committed, so a decision counts only
        once the driver's transaction that wrote it committed."""
        return opts.client_config(ConsumerConfig, self.kafka_params, only_known=True, isolation_level="read_committed")


def default_prefix(checkpoint_location: str) -> str:
    """``transactionalIdPrefix`` when none is given: stable for a checkpoint
    (a query's identity in Spark) and different for every other, so a job
    ported from ``format("kafka")`` needs no new option. Moving or renaming
    the checkpoint changes it: set the option to keep a query's name."""
    import hashlib

    path = checkpoint_location[len("file:"):] if checkpoint_location.startswith("file:") else checkpoint_location
    if "://" not in path:
        path = os.path.abspath(path)
    return "onceflow-" + hashlib.sha256(path.encode()).hexdigest()[:16]


@attrs.frozen
class Columns:
    """Which of Spark's sink columns the query has (validated)."""

    names: tuple[str, ...]
    key: bool
    topic: bool
    partition: bool
    headers: bool
    timestamp: str | None  # "timestamp" or "double"


def validate_schema(schema: StructType, topic_option: str | None) -> Columns:
    """Spark's KafkaWriter.validateQuery, with its messages."""
    fields = {f.name: f.dataType for f in schema.fields}

    def check(name: str, allowed: tuple, wanted: str) -> bool:
        if name not in fields:
            return False
        data_type = fields[name]
        ok = any(isinstance(data_type, t) for t in allowed) if allowed else data_type.simpleString() == wanted
        if not ok:
            raise SinkSchemaError(f"{name} attribute unsupported type {data_type.simpleString()}. {name} must be a(n) {wanted}")
        return True

    has_topic = False
    if topic_option is None:
        if "topic" not in fields:
            raise SinkSchemaError("topic option required when no 'topic' attribute is present. Use the topic option for setting a topic.")
        has_topic = check("topic", (StringType,), "string")
    has_key = check("key", (StringType, BinaryType), "string or binary")
    if "value" not in fields:
        raise SinkSchemaError("Required attribute 'value' not found")
    check("value", (StringType, BinaryType), "string or binary")
    has_headers = check("headers", (), HEADERS_TYPE)
    has_partition = check("partition", (IntegerType,), "int")
    timestamp = None
    if check("timestamp", (DoubleType, TimestampType), "double or timestamp"):
        timestamp = "double" if isinstance(fields["timestamp"], DoubleType) else "timestamp"
    return Columns(tuple(schema.names), has_key, has_topic, has_partition, has_headers, timestamp)


def make_stream_writer(options, schema: StructType, overwrite: bool = False) -> "OnceflowStreamWriter":
    """The data source's ``streamWriter``: options and columns checked here,
    on the driver, before any task runs."""
    sink_options = SinkOptions.parse(options)
    return OnceflowStreamWriter(sink_options, validate_schema(schema, sink_options.topic))


@attrs.frozen
class TaskIdentity:
    """Which Spark task is writing (from its TaskContext)."""

    query_id: str
    run_id: str
    batch_id: int
    partition: int
    attempt: int
    stage_attempt: int = 0

    @classmethod
    def current(cls) -> "TaskIdentity":
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise SinkError("write() runs only inside a Spark task")
        query_id = context.getLocalProperty("sql.streaming.queryId") or ""
        # The job group is the run id (StreamExecution sets it per start); without it, a fresh name per task stays safe.
        run_id = context.getLocalProperty("spark.jobGroup.id") or uuid.uuid4().hex
        batch = context.getLocalProperty("streaming.sql.batchId")
        return cls(query_id, run_id, int(batch) if batch is not None else -1, context.partitionId(), context.attemptNumber(), context.stageAttemptNumber())


@attrs.frozen
class SinkCommitMessage(WriterCommitMessage):
    """What a task hands the driver: its open transaction (None when it had
    no rows or the sink is at-least-once) and who it was."""

    task: TaskIdentity
    transaction: SinkTransaction | None
    records: int


def resolve_hook(spec: str | None):
    """``module:function`` -> the function; None -> a no-op."""
    if not spec:
        return _no_crash
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SinkError(f"crashPointHook must be module:function, not {spec!r}")
    return getattr(importlib.import_module(module), name)


def _no_crash(name: str) -> None:
    pass


class OnceflowStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, columns: Columns):
        self.options = options
        self.columns = columns

    # -- executors ----------------------------------------------------------------------

    def write(self, iterator) -> SinkCommitMessage:
        return write_task(self.options, self.columns, iterator, TaskIdentity.current(), resolve_hook(self.options.crash_point_hook))

    # -- driver ---------------------------------------------------------------------------

    def commit(self, messages, batchId: int) -> None:
        if not self.options.exactly_once:
            return  # every task flushed with acks=all: its records are there
        hook = resolve_hook(self.options.crash_point_hook)
        on_kept_clients(self.options, lambda clients: DriverCommit(self.options, hook, clients).commit([m for m in messages if m is not None], batchId))

    def abort(self, messages, batchId: int) -> None:
        if not self.options.exactly_once:
            return
        on_kept_clients(self.options, lambda clients: DriverCommit(self.options, _no_crash, clients).abort([m for m in messages if m is not None], batchId))


# -- the task's side -------------------------------------------------------------------------


def _column(batch, name: str):
    index = batch.schema.get_field_index(name)
    return batch.column(index)


def _bytes_list(column) -> list:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _timestamps(column, kind: str) -> list:
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "double":
        return [None if v is None else int(v * 1000) for v in column.to_pylist()]
    micros = pc.cast(column, pa.int64())
    return [None if v is None else v // 1000 for v in micros.to_pylist()]


def rows_of(batch, columns: Columns, topic_option: str | None):
    """(topic, value, key, partition, headers, timestamp) per row of an Arrow batch."""
    count = batch.num_rows
    values = _bytes_list(_column(batch, "value"))
    keys = _bytes_list(_column(batch, "key")) if columns.key else [None] * count
    topics = [topic_option] * count if topic_option is not None else _column(batch, "topic").to_pylist()
    partitions = _column(batch, "partition").to_pylist() if columns.partition else [None] * count
    if columns.headers:
        headers = [None if h is None else [(entry["key"], entry["value"]) for entry in h] for h in _column(batch, "headers").to_pylist()]
    else:
        headers = [None] * count
    timestamps = _timestamps(_column(batch, "timestamp"), columns.timestamp) if columns.timestamp else [None] * count
    for i in range(count):
        if topics[i] is None:
            raise SinkError("null topic present in the data. Use the topic option for setting a topic.")
        yield topics[i], values[i], keys[i], partitions[i], headers[i], timestamps[i]


def write_task(options: SinkOptions, columns: Columns, batches, task: TaskIdentity, crash_point=_no_crash) -> SinkCommitMessage:
    """One Spark task: its rows in one open transaction (exactly_once) or
    sent and acknowledged (at_least_once)."""
    producer = None
    records = 0
    written: set[str] = set()  # "topic-partition", from the delivery reports
    failures: list[BaseException] = []

    def delivered(error, metadata) -> None:  # on the producer's loop thread
        if error is not None:
            failures.append(error)
        else:
            written.add(f"{metadata.topic}-{metadata.partition}")

    try:
        if options.exactly_once:
            producer = _task_producer(options, task)  # at task start: its id is this attempt's alone, fenced before any row
        for batch in batches:
            for topic, value, key, partition, headers, timestamp in rows_of(batch, columns, options.topic):
                if producer is None:
                    producer = _task_producer(options, task)
                producer.send(topic, value, key=key, partition=partition, headers=headers, timestamp=timestamp, on_delivery=delivered)
                records += 1
        if records == 0:
            return SinkCommitMessage(task, None, 0)  # an open transaction with nothing in it has no partition: nothing to end
        crash_point(TASK_BEFORE_HANDLE)
        producer.flush()
        if failures:
            raise SinkError(f"{len(failures)} of {records} records were not written: {failures[0]}")  # the task fails; Spark retries it
        if not options.exactly_once:
            return SinkCommitMessage(task, None, records)
        handle = producer.transaction_handle()
        transaction = SinkTransaction(handle.transactional_id, handle.producer_id, handle.producer_epoch, tuple(sorted(written)), records)
        return SinkCommitMessage(task, transaction, records)
    except BaseException:
        if producer is not None and options.exactly_once:
            try:
                producer.abort_transaction()
            except Exception as error:  # the driver's cleanup aborts it anyway
                log.warning("could not abort the failed task's transaction: %s", error)
        elif producer is not None:
            _IDEMPOTENT_PRODUCERS.pop(producer.config, None)  # a fresh one for the next task
            producer.close()
        raise
    finally:
        if producer is not None and options.exactly_once:
            producer.close()


# at_least_once: one idempotent producer per Python worker, kept across the
# tasks it runs (Spark reuses workers), which saves a connection and an
# InitProducerId per task. Transactional producers are not kept: each task
# fences its name's earlier holder with an InitProducerId. Keeping them
# (txn's detach_transaction / begin_after_detached, one DescribeTransactions
# instead) was measured and dropped: Spark gives a partition's next batch to
# whichever Python worker is free, so in local[2] 18 of 20 batches found
# their id taken by the other worker since and paid both. It would pay off
# with transactional ids per worker instead of per partition.
_IDEMPOTENT_PRODUCERS: dict[ProducerConfig, Producer] = {}


def _task_producer(options: SinkOptions, task: TaskIdentity) -> Producer:
    if not options.exactly_once:
        config = options.producer_config()
        producer = _IDEMPOTENT_PRODUCERS.get(config)
        if producer is None:
            producer = _IDEMPOTENT_PRODUCERS[config] = Producer(config=config)
        return producer
    name = transactional_id(options.transactional_id_prefix, task.query_id, task.run_id, task.batch_id, task.partition, task.stage_attempt, task.attempt)
    producer = Producer(config=options.producer_config(transactional_id=name))
    try:
        producer.init_transactions()  # fences an earlier holder of the name and finishes what it left
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer


# -- the driver's side -----------------------------------------------------------------------


_ENSURED_DECISION_TOPICS: set[tuple[str, str]] = set()


class DriverClients:
    """The driver's clients for commits: an admin client, the query's
    transactional decision writer and the read_committed consumer that reads
    the latest decision.

    Spark runs every commit of a query in one long-lived Python worker, so
    ``on_kept_clients`` keeps them from batch to batch: connections stay
    open. The decision writer is initialised again at every commit (which
    fences any other driver of the query), and the latest decision is read
    after that, never remembered: another driver, or a recreated topic,
    shows there."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self.admin = AsyncAdmin(config=options.admin_config())
        self.decision_reader = AsyncConsumer(config=options.consumer_config())
        self.decision_writers: dict[str, AsyncProducer] = {}  # query id -> its transactional decision writer

    def decision_writer(self, query_id: str) -> AsyncProducer:
        writer = self.decision_writers.get(query_id)
        if writer is None:
            name = driver_transactional_id(self.options.transactional_id_prefix, query_id)
            writer = self.decision_writers[query_id] = AsyncProducer(config=self.options.producer_config(transactional_id=name))
        return writer

    async def close(self) -> None:
        try:
            for writer in self.decision_writers.values():
                await writer.close()
            await self.decision_reader.close()
        finally:
            await self.admin.close()


# The commit runner's clients, by connection settings and decision topic,
# on one loop thread of this process; a commit that raises drops them (the
# next one starts afresh).
_KEPT_CLIENTS: dict[tuple[ProducerConfig, str], DriverClients] = {}
_KEPT_CLIENTS_LOCK = threading.Lock()
_driver_loop: LoopThread | None = None
# (query, run) pairs whose first commit in this process cleaned up other runs' leftovers.
_CLEANED_RUNS: set[tuple[str, str]] = set()


def on_kept_clients(options: SinkOptions, work):
    """Run ``work(clients)`` (a coroutine function) on this process's kept
    ``DriverClients`` for ``options`` and return its result."""
    global _driver_loop
    key = (options.producer_config(), options.decision_topic)
    with _KEPT_CLIENTS_LOCK:
        if _driver_loop is None:
            _driver_loop = LoopThread("onceflow-spark-driver")
        clients = _KEPT_CLIENTS.get(key)
        if clients is None:
            clients = _KEPT_CLIENTS[key] = _driver_loop.run(DriverClients, options)
        try:
            return _driver_loop.call(work(clients))
        except BaseException:
            del _KEPT_CLIENTS[key]
            try:
                _driver_loop.call(clients.close(), 30)
            except Exception as error:  # the error being raised is the one that matters
                log.info("closing the driver's clients after a failed commit: %s", error)
            raise


class DecisionLog:
    """The sink's decisions: a one-partition compacted topic keyed by the
    prefix (several prefixes may share a ``decisionTopic``: each reads only
    its own key), written by the query's transactional decision writer and
    read read_committed: a decision exists once its transaction committed."""

    SCAN_BACK = 64  # records read back from the end before scanning the whole partition for this prefix's latest

    def __init__(self, options: SinkOptions, clients: DriverClients):
        self.options = options
        self.clients = clients
        self.topic = options.decision_topic
        self.partition = TopicPartition(self.topic, 0)
        self.key = options.transactional_id_prefix.encode()

    async def ensure(self) -> None:
        key = (self.options.bootstrap_servers, self.topic)
        if key in _ENSURED_DECISION_TOPICS:
            return  # Spark reuses the Python worker that commits: once per process
        await self.clients.admin.create_topics({self.topic: 1}, configs={self.topic: {"cleanup.policy": "compact"}}, exist_ok=True)
        _ENSURED_DECISION_TOPICS.add(key)

    async def latest(self) -> Decision | None:
        """This prefix's last committed decision (or None when it has none)."""
        consumer, tp = self.clients.decision_reader, self.partition
        ends, starts = await asyncio.gather(consumer.end_offsets([tp]), consumer.beginning_offsets([tp]))
        end, start = ends[tp], starts[tp]  # end: the last stable offset (read_committed)
        if end <= start:
            return None
        found = await self._last_of_mine(max(start, end - self.SCAN_BACK), end)
        if found is None and end - self.SCAN_BACK > start:
            found = await self._last_of_mine(start, end)
        return None if found is None else Decision.from_bytes(found)

    async def _last_of_mine(self, first: int, end: int) -> bytes | None:
        consumer, tp = self.clients.decision_reader, self.partition
        if tp not in consumer.assignment():
            consumer.assign([tp])
        consumer.seek(tp, first)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        mine = None
        while await consumer.position(tp) < end:
            if loop.time() > deadline:
                raise SinkError(f"could not read the decisions at {self.topic}-0 up to offset {end}")
            for record in await consumer.poll(1.0):
                if record.offset < end and record.key == self.key:
                    mine = record.value
        return mine

    async def write(self, writer: AsyncProducer, decision: Decision) -> None:
        """Durable and visible when this returns: the decision writer's
        transaction committed (acks=all)."""
        try:
            writer.begin_transaction()
            await writer.send(self.topic, decision.to_bytes(), key=self.key, partition=0)
            await writer.commit_transaction()
        except KafkaError as error:  # fenced shows as such, or inside an abortable error of the send
            if isinstance(error, (ProducerFencedError, InvalidProducerEpochError)) or await self._taken_over(writer):
                raise fenced(decision.query_id, error) from error
            raise

    async def _taken_over(self, writer: AsyncProducer) -> bool:
        """Whether another instance holds the decision writer's id now."""
        try:
            now = (await self.clients.admin.describe_transactions([writer.transactional_id]))[0]
        except (KafkaError, OSError):
            return False
        return (now.producer_id, now.producer_epoch) != (writer.producer_id, writer.producer_epoch)


def fenced(query_id: str, error: BaseException) -> DriverFencedError:
    return DriverFencedError(
        f"another driver took over query {query_id}'s decisions ({error}): a second driver runs the same checkpoint "
        f"(a stale one after a network partition, or one started twice); this one stops without deciding"
    )


class DriverCommit:
    """commit(messages, N) and abort(messages, N) of one microbatch, on the
    given clients (or its own, closed at the end)."""

    def __init__(self, options: SinkOptions, crash_point=_no_crash, clients: DriverClients | None = None):
        self.options = options
        self.crash_point = crash_point
        self.clients = clients

    async def commit(self, messages: list[SinkCommitMessage], batch_id: int) -> None:
        if not messages:
            return
        async with self._clients() as clients:
            await self._commit(clients, messages, batch_id)

    async def abort(self, messages: list[SinkCommitMessage], batch_id: int) -> None:
        async with self._clients() as clients:
            await self._abort_batch(clients, messages, batch_id)

    @contextlib.asynccontextmanager
    async def _clients(self):
        if self.clients is not None:
            yield self.clients
            return
        clients = self.clients = DriverClients(self.options)
        try:
            yield clients
        finally:
            self.clients = None
            await clients.close()

    async def _take_over(self, clients: DriverClients, query_id: str) -> AsyncProducer:
        """Initialise the query's decision writer: any other driver is fenced
        from here on, and a decision write of its still in flight is aborted
        (or, if it was already being committed, completed) before we read."""
        writer = clients.decision_writer(query_id)
        try:
            await writer.init_transactions()
        except (ProducerFencedError, InvalidProducerEpochError) as error:
            raise fenced(query_id, error) from error
        return writer

    async def _states(self, transactions) -> dict[str, HandleState]:
        described = await self.clients.admin.describe_transactions_by_coordinator([t.transactional_id for t in transactions])
        return {name: HandleState("Unknown") if d is None else HandleState(d.state, d.producer_id, d.producer_epoch) for name, d in described.items()}

    async def _commit(self, clients: DriverClients, messages: list[SinkCommitMessage], batch_id: int) -> None:
        query_id, run_id = messages[0].task.query_id, messages[0].task.run_id
        transactions = [m.transaction for m in messages if m.transaction is not None]
        decisions = DecisionLog(self.options, clients)
        await decisions.ensure()
        writer = await self._take_over(clients, query_id)
        latest = await decisions.latest()
        try:
            plan = plan_commit(latest, query_id, batch_id, run_id, transactions)
        except PrefixInUseError:
            await self._abort_each(transactions)
            raise
        decided = plan.commit
        decision = plan.decide
        if plan.reason == "recommit" and transactions and all_aborted(decided, await self._states(decided)):
            # Every decided transaction of this batch is verified aborted, none committed: the re-run recomputed the whole batch.
            log.warning("batch %s: its decided transactions were all aborted (none committed); deciding the re-run's instead", batch_id)
            decision = Decision(query_id, batch_id, run_id, tuple(transactions))
        if decision is not None:
            if self.options.commit_offsets_to_group:
                decision = await self._with_offsets_transaction(decision)
            await self._verify_open(decision, batch_id)
            decided = decision.transactions
            self.crash_point(BEFORE_DECISION)
            await decisions.write(writer, decision)
            self.crash_point(AFTER_DECISION)
        lost = await self._commit_each(decided, batch_id)
        first_of_run = (query_id, run_id) not in _CLEANED_RUNS
        await self._abort_leftovers(clients.admin, query_id, None if first_of_run else run_id, messages, decided)
        _CLEANED_RUNS.add((query_id, run_id))
        if lost:
            raise DecidedTransactionsLostError(lost_message(batch_id, [t for t, _ in lost], len(decided) - len(lost), len(decided), "; ".join(f"{t.transactional_id}: {why}" for t, why in lost)))
        self.crash_point(AFTER_ALL_COMMITS)

    async def _verify_open(self, decision: Decision, batch_id: int) -> None:
        """Right before the decision: every handle must be open with the
        producer id and epoch its task reported. If one is not (the broker
        aborted it on its timeout, a fence, anything), abort the rest and
        decide nothing: the batch can still be re-run whole."""
        states = await self._states(decision.transactions)
        dead = dead_handles(decision.transactions, states)
        if not dead:
            return
        dead_names = {t.transactional_id for t, _ in dead}
        await self._abort_each(t for t in decision.transactions if t.transactional_id not in dead_names)
        timeout_ms = int(self.options.kafka_params.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        raise BatchTransactionsNotOpenError(not_open_message(batch_id, dead, len(decision.transactions), timeout_ms))

    async def _abort_batch(self, clients: DriverClients, messages: list[SinkCommitMessage], batch_id: int) -> None:
        """Never undoes a decision: finish a decided batch, abort the rest.
        The decision writer is initialised first, so a decision write of
        this batch whose outcome was unknown is settled before the read."""
        transactions = [m.transaction for m in messages if m.transaction is not None]
        query_id = messages[0].task.query_id if messages else ""
        try:
            if query_id:
                await self._take_over(clients, query_id)
            latest = await DecisionLog(self.options, clients).latest()
        except (KafkaError, SinkError, OSError) as error:
            log.warning("abort of batch %s: decisions unreadable (%s); leaving its transactions to the next commit's cleanup", batch_id, error)
            return
        plan = plan_abort(latest, query_id, batch_id, transactions)
        if plan.finish:
            lost = await self._commit_each(plan.finish, batch_id)
            for transaction, why in lost:
                log.error("abort of decided batch %s: %s could not be committed (%s)", batch_id, transaction.transactional_id, why)
        await self._abort_each(plan.abort)

    async def _commit_each(self, transactions, batch_id: int) -> list[tuple[SinkTransaction, str]]:
        """Commit in order; returns the decided transactions that cannot
        commit any more (aborted by a timeout), with what the broker said."""
        lost = []
        for transaction in transactions:
            producer = AsyncProducer.resume(transaction.handle, config=self.options.producer_config(transactional_id=transaction.transactional_id))
            try:
                await producer.commit_transaction()
            except KafkaError as error:
                if isinstance(error, (ProducerFencedError, InvalidProducerEpochError)) or getattr(error, "code", None) in _LOST_CODES:
                    lost.append((transaction, f"{error} ({await self._describe(transaction.transactional_id)})"))
                else:
                    raise
            finally:
                await producer.cluster.close()
            self.crash_point(AFTER_COMMIT)
        return lost

    async def _describe(self, name: str) -> str:
        try:
            state = (await self.clients.admin.describe_transactions([name]))[0]
            return f"now {state.state} at producer {state.producer_id} epoch {state.producer_epoch}"
        except Exception as error:  # only for the message
            return f"state unknown: {error}"

    async def _abort_each(self, transactions) -> None:
        for transaction in transactions:
            await self._abort(transaction.handle)

    async def _abort(self, handle: TransactionHandle) -> None:
        producer = AsyncProducer.resume(handle, config=self.options.producer_config(transactional_id=handle.transactional_id))
        try:
            await producer.abort_transaction()
        except KafkaError as error:  # finished or fenced by someone else: nothing of ours is open there
            log.info("abort of %s: %s", handle.transactional_id, error)
        finally:
            await producer.cluster.close()

    async def _abort_leftovers(self, admin: AsyncAdmin, query_id: str, run_id: str | None, messages: list[SinkCommitMessage], decided) -> None:
        """Abort this run's open transactions (``run_id`` None: every run's
        of this query, at a run's first commit): failed attempts, the re-run
        of a batch decided earlier, zombie task attempts, a crashed run's.
        Called after every decided transaction is committed, so none of them
        is open; later commits touch only their own run's ids, so a stale
        second driver cannot abort the live one's batch."""
        if not await lists_transactions(admin):
            await self._abort_known_leftovers(messages, decided)
            return
        listed = await admin.list_transactions(states=["Ongoing"])
        names = leftovers([t.transactional_id for t in listed], self.options.transactional_id_prefix, query_id, run_id=run_id)
        if not names:
            return
        for state in await admin.describe_transactions(names):
            if state.state == "Ongoing":
                await self._abort(TransactionHandle(state.transactional_id, state.producer_id, state.producer_epoch))

    async def _abort_known_leftovers(self, messages: list[SinkCommitMessage], decided) -> None:
        """For a broker without ListTransactions (Kafka before 3.0, Tansu):
        abort the undecided transactions the messages name, and fence the
        earlier attempts of this batch's tasks (InitProducerId on their
        names aborts what they left). A crashed run's transactions cannot be
        found this way: they end at their timeout (and hold the LSO until then)."""
        decided_names = {t.transactional_id for t in decided}
        await self._abort_each(m.transaction for m in messages if m.transaction is not None and m.transaction.transactional_id not in decided_names)
        for message in messages:
            task = message.task
            for attempt in range(task.attempt):
                name = transactional_id(self.options.transactional_id_prefix, task.query_id, task.run_id, task.batch_id, task.partition, task.stage_attempt, attempt)
                fence = AsyncProducer(config=self.options.producer_config(transactional_id=name))
                try:
                    await fence.init_transactions()
                finally:
                    await fence.cluster.close()

    async def _with_offsets_transaction(self, decision: Decision) -> Decision:
        """Add a transaction carrying the source's end offsets of this batch
        to the consumer group, decided with the data."""
        offsets = read_source_offsets(self.options.checkpoint_location, decision.batch_id)
        name = f"{query_prefix(self.options.transactional_id_prefix, decision.query_id)}{decision.run_id.replace('-', '')[:8]}-{decision.batch_id}-offsets"
        producer = AsyncProducer(config=self.options.producer_config(transactional_id=name))
        try:
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.send_offsets_to_transaction(offsets, self.options.commit_offsets_to_group)
            handle = producer.transaction_handle()
        finally:
            await producer.cluster.close()
        carried = SinkTransaction(handle.transactional_id, handle.producer_id, handle.producer_epoch, (OFFSETS_PARTITION,), 0)
        as_json = {f"{tp[0]}-{tp[1]}": offset for tp, offset in offsets.items()}
        return attrs.evolve(decision, transactions=decision.transactions + (carried,), offsets=as_json)


async def lists_transactions(admin: AsyncAdmin) -> bool:
    """Whether the broker serves ListTransactions (KIP-664, Kafka 3.0)."""
    broker = await admin.cluster.any_broker()
    return ApiKey.LIST_TRANSACTIONS in broker.versions


# What a re-commit of a transaction the broker aborted (it timed out) gets back.
_LOST_CODES = {ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED}


def read_source_offsets(checkpoint_location: str, batch_id: int) -> dict[tuple[str, int], int]:
    """The end offsets of batch ``batch_id`` of every onceflow-shaped source
    (``{"topic": {"partition": next offset}}``), from Spark's offset log
    ``<checkpoint>/offsets/<batch>`` (written before the batch runs). The
    checkpoint must be on a file system this process can open."""
    path = checkpoint_location[len("file:") :] if checkpoint_location.startswith("file:") else checkpoint_location
    if "://" in path:
        raise SinkError(f"commitOffsetsToGroup reads the checkpoint's offset log, which needs a local or mounted checkpointLocation, not {checkpoint_location!r}")
    log_file = os.path.join(path, "offsets", str(batch_id))
    try:
        with open(log_file, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as error:
        raise SinkError(f"commitOffsetsToGroup: cannot read {log_file}: {error}") from error
    offsets: dict[tuple[str, int], int] = {}
    for line in lines[2:]:  # "v1", the batch metadata, then one line per source
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if not isinstance(source, dict):
            continue
        for topic, partitions in source.items():
            if not isinstance(partitions, dict):
                break
            for partition, offset in partitions.items():
                if isinstance(offset, int) and str(partition).lstrip("-").isdigit():
                    offsets[(topic, int(partition))] = offset
    if not offsets:
        raise SinkError(f"commitOffsetsToGroup: no Kafka-shaped source offsets in {log_file} (it needs the onceflow source)")
    return offsets
