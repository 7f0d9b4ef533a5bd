"""The sink's task half, on executors: one Spark task's rows written in one
Kafka transaction left open for the driver (exactly_once), or sent and
acknowledged by an idempotent producer (at_least_once).

``write_task`` initialises the task's transactional producer at its first
row (a task without rows hands back no transaction and talks to no broker),
on an id of this task attempt's alone (``decision.transactional_id``: run,
batch, stage attempt, partition and task attempt), hands the task's Arrow batches
to the producer as columns (``Producer.send_columns``: partitioned, encoded
and cut into record batches without Python per row, waiting for room in the
producer's ``buffer_memory``), flushes, seals the transaction (``Producer.seal_transaction``: a broker
with ``transaction.durable.at.end`` keeps a sealed transaction open through
an unclean stop) and returns its handle in a ``SinkCommitMessage``. The driver half (``sink_driver``) decides and commits.
"""

from __future__ import annotations

import logging
import uuid

import attrs
from pyspark.sql.datasource import WriterCommitMessage

from streaming.spark.crashpoints import TASK_BEFORE_HANDLE, no_crash
from streaming.spark.decision import SinkError, SinkTransaction, transactional_id
from streaming.spark.options import SinkOptions
from streaming.spark.worker import prepare_worker_process
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


# Arrow batches are gathered to this many bytes before they go to the
# producer: Spark hands over 10,000 rows at a time, and a call of
# ``send_columns`` cuts each partition's rows into 1 MiB batches, so bigger
# calls leave fewer part-filled batches behind.
GATHER_BYTES = 4 << 20


def _column(batch, name: str):
    return batch.column(batch.schema.get_field_index(name))


def _millis(column, kind: str):
    """A timestamp column as int64 ms (nulls kept: the producer stamps them
    with the send time), as the per-row path did: a double's seconds
    truncated (``int(v * 1000)``), a timestamp's microseconds floored."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "double":
        millis = pc.cast(pc.multiply(column, 1000.0), pa.int64(), safe=False)  # truncates, as int() does
    else:
        micros = pc.cast(column, pa.int64())
        valid = micros.is_valid()
        floored = np.floor_divide(micros.fill_null(0).to_numpy(zero_copy_only=False), 1000)
        millis = pa.array(floored, pa.int64(), mask=pc.invert(valid).to_numpy(zero_copy_only=False))
    return millis


def topic_groups(batch, columns: Columns, topic_option: str | None):
    """(topic, the batch's rows for it) for each topic of an Arrow batch,
    rows in their order; the ``topic`` option overrides the column."""
    import pyarrow.compute as pc

    if topic_option is not None:
        yield topic_option, batch
        return
    topics = _column(batch, "topic")
    if topics.null_count:
        raise SinkError("null topic present in the data. Use the topic option for setting a topic.")
    names = pc.unique(topics).to_pylist()
    if len(names) == 1:
        yield names[0], batch
        return
    for name in names:
        yield name, batch.filter(pc.equal(topics, name))


def send_batch(producer: Producer, batch, columns: Columns, topic_option: str | None) -> list:
    """Hand one (gathered) Arrow batch of the sink's columns to the producer,
    as columns: no Python per row. Returns one delivery future per topic."""
    outcomes = []
    for topic, rows in topic_groups(batch, columns, topic_option):
        outcomes.append(producer.send_columns(
            topic,
            _column(rows, "value"),
            _column(rows, "key") if columns.key else None,
            partition=_column(rows, "partition") if columns.partition else None,
            headers=_column(rows, "headers") if columns.headers else None,
            timestamp=_millis(_column(rows, "timestamp"), columns.timestamp) if columns.timestamp else None,
        ))
    return outcomes


def gathered(batches, limit: int = GATHER_BYTES):
    """Spark's Arrow batches, joined into batches of about ``limit`` bytes."""
    import pyarrow as pa

    waiting, size = [], 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        waiting.append(batch)
        size += batch.nbytes
        if size >= limit:
            yield _joined(waiting, pa)
            waiting, size = [], 0
    if waiting:
        yield _joined(waiting, pa)


def _joined(batches, pa):
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def write_task(options: SinkOptions, columns: Columns, batches, task: TaskIdentity, crash_point=no_crash) -> SinkCommitMessage:
    """One Spark task: its rows in one open transaction (exactly_once) or
    sent and acknowledged (at_least_once)."""
    prepare_worker_process()  # freed batches kept for the next ones; imports out of the collector's walks
    producer = None
    records = 0
    outcomes: list = []  # one delivery future per send_columns call
    try:
        for batch in gathered(batches):
            if producer is None:  # at the first row: a task without rows costs no producer, no InitProducerId, no transaction
                producer = _task_producer(options, task)  # its id is this attempt's alone, fenced before any row
            outcomes += send_batch(producer, batch, columns, options.topic)
            records += batch.num_rows
        if records == 0:
            return SinkCommitMessage(task, None, 0)  # an open transaction with nothing in it has no partition: nothing to end
        crash_point(TASK_BEFORE_HANDLE)
        producer.flush()
        written: set[str] = set()  # "topic-partition"
        failures = [outcome.exception(30) for outcome in outcomes]  # done: flushed
        failures = [f for f in failures if f is not None]
        if failures:
            raise SinkError(f"records of {len(failures)} of {len(outcomes)} sends were not written: {failures[0]}")  # the task fails; Spark retries it
        for outcome in outcomes:
            written.update(f"{sent.topic}-{sent.partition}" for sent in outcome.result(30))
        if not options.exactly_once:
            return SinkCommitMessage(task, None, records)
        # Sealed before it is handed over: a broker with
        # ``transaction.durable.at.end`` then keeps it open through an unclean
        # stop for the driver to commit (it aborts the open transactions it
        # finds otherwise). Without that setting the seal writes nothing.
        handle = producer.seal_transaction()
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


