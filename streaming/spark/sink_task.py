"""The sink's task half, on executors: one Spark task's rows written in one
Kafka transaction left open for the driver (exactly_once), or sent and
acknowledged by an idempotent producer (at_least_once).

``write_task`` initialises the task's transactional producer first, on an id
of this task attempt's alone (``decision.transactional_id``: run, batch,
stage attempt, partition and task attempt), sends every row of the task's
Arrow batches, flushes, and returns the transaction's handle in a
``SinkCommitMessage``. The driver half (``sink_driver``) decides and commits.
"""

from __future__ import annotations

import logging
import uuid

import attrs
from pyspark.sql.datasource import WriterCommitMessage

from streaming.spark.crashpoints import TASK_BEFORE_HANDLE, no_crash
from streaming.spark.decision import SinkError, SinkTransaction, transactional_id
from streaming.spark.options import SinkOptions
from txn.config import ProducerConfig
from txn.producer import Producer

log = logging.getLogger(__name__)


@attrs.frozen
class Columns:
    """Which of Spark's sink columns the query has (validated)."""

    names: tuple[str, ...]
    key: bool
    topic: bool
    partition: bool
    headers: bool
    timestamp: str | None  # "timestamp" or "double"


@attrs.frozen
class TaskIdentity:
    """Which Spark task is writing (from its TaskContext)."""

    query_id: str
    run_id: str
    batch_id: int
    partition: int
    attempt: int
    task_attempt_id: int = -1  # Spark's taskAttemptId; -1 outside Spark

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
        return cls(query_id, run_id, int(batch) if batch is not None else -1, context.partitionId(), context.attemptNumber(), context.taskAttemptId())


@attrs.frozen
class SinkCommitMessage(WriterCommitMessage):
    """What a task hands the driver: its open transaction (None when it had
    no rows or the sink is at-least-once) and who it was."""

    task: TaskIdentity
    transaction: SinkTransaction | None
    records: int


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


def write_task(options: SinkOptions, columns: Columns, batches, task: TaskIdentity, crash_point=no_crash) -> SinkCommitMessage:
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
    name = transactional_id(options.transactional_id_prefix, task.query_id, task.run_id, task.batch_id, task.partition, task.attempt, task.task_attempt_id)
    producer = Producer(config=options.producer_config(transactional_id=name))
    try:
        producer.init_transactions()  # fences an earlier holder of the name and finishes what it left
        producer.begin_transaction()
    except BaseException:
        producer.close()
        raise
    return producer


