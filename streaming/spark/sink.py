"""The ``onceflow`` data source's sink: every microbatch (and every batch
write) reaches Kafka exactly once, through Kafka transactions, on any
Kafka-protocol broker. Shaped as Spark's Kafka connector is: the options
(``streaming.spark.options``: ``SinkOptions``), the writers Spark asks the
data source for (here: the columns checked, ``OnceflowStreamWriter``), the
data writer on executors (``sink_task``) and the commit on the driver
(``sink_driver``), the commit protocol itself without I/O (``decision``).

``make_stream_writer(options, schema, overwrite)`` (called by the data
source's ``streamWriter``) validates the options and the columns the way
Spark's Kafka sink does and returns the writer:

- executors (``write``): one transaction per Spark task attempt, on an id of
  its own (``{prefix}-{query12}-{run8}-{batch}-{partition}-t{taskAttemptId}``:
  the first 12 hex digits of the query id and 8 of the run id, and Spark's
  ``taskAttemptId``, unique across stage attempts; ``-a{attempt}`` for
  attempts after the first where Spark gives no ``taskAttemptId``;
  ``streaming.spark.decision.transactional_id``), initialised at task start:
  the task's Arrow batches sent as columns (``Producer.send_columns``: no Python per row,
  1 MiB record batches unless ``kafka.batch.size`` says otherwise, at most
  ``kafka.buffer.memory`` waiting), flushed, the handle returned, left open;
- the driver (``commit``): the two-phase commit of ``streaming.spark.decision``:
  every handle verified open, a decision record written in a transaction of
  the query's own decision writer (a one-partition compacted topic
  ``onceflow.decisions.{prefix}``, keyed by prefix, read read_committed),
  then EndTxn(commit) for every decided handle (side by side, over the
  driver's kept connections: one per coordinator), then this run's other open
  transactions aborted. A batch re-run after a crash re-commits what was
  decided before.
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
| decisionTopic | onceflow.decisions.{prefix} | where decisions are recorded (may be shared by prefixes) |
| decisionTopicReplicationFactor | -1 | the decision topic's replication factor when the sink creates it (-1: the broker's default) |
| decisionTopicMinInsyncReplicas | broker's | its ``min.insync.replicas`` |
| txnAppId, txnVersion | | batch writes: the application and this write's version, each version written once |
| kafka.* | | any other producer setting (``kafka.linger.ms``) |
| crashPointHook | none | ``module:function`` called at the named crash points (``crashpoints``) |

The timeout rule: every transaction of a batch stays open from the task's
start until the driver's commit, and after a driver crash until the
restarted query re-commits it. A batch whose transactions the broker
aborted before the decision is not decided (``BatchTransactionsNotOpenError``:
a restart re-runs it). If the broker aborts a decided transaction first,
and another of the batch had committed, its records are lost; the sink
then fails the query with ``DecidedTransactionsLostError`` naming them,
never silently (when none had committed, the re-run's are decided
instead). So ``kafka.transaction.timeout.ms`` > batch duration + the
longest restart; the default is 15 minutes (Kafka's and our broker's
``transaction.max.timeout.ms``). Open transactions hold the last stable
offset of the partitions they wrote: after a driver crash, read_committed
readers of the output wait until the restarted query's first commit.

Limits: ``commitOffsetsToGroup`` needs the checkpoint on a file system the
driver's Python can open (it reads Spark's offset log); on a broker without
ListTransactions (Kafka before 3.0) a crashed run's open transactions are
not found, so they end at their timeout and hold the output's LSO until
then.
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from pyspark.sql.types import BinaryType, DoubleType, IntegerType, StringType, StructType, TimestampType

from streaming.spark.crashpoints import no_crash, resolve_hook
from streaming.spark.decision import SinkError
from streaming.spark.options import OptionError, SinkOptions
from streaming.spark.sink_driver import DriverCommit, finish_decided, on_kept_clients
from streaming.spark.sink_task import Columns, SinkCommitMessage, TaskIdentity, write_task

log = logging.getLogger(__name__)

HEADERS_TYPE = "array<struct<key:string,value:binary>>"
FINISH_AT_START_SECONDS = 10.0


class SinkSchemaError(SinkError):
    """The query's columns do not fit the sink (Spark's own messages)."""


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
    on the driver, before any task runs. A (re)started query first finishes
    a batch its previous driver decided and did not wholly commit, before
    Spark's own restart work (``sink_driver.finish_decided``; the commit of
    the re-run would do it too, only later)."""
    sink_options = SinkOptions.parse(options)
    writer = OnceflowStreamWriter(sink_options, validate_schema(schema, sink_options.topic))
    if sink_options.exactly_once:
        try:
            finished = finish_decided(sink_options, timeout=FINISH_AT_START_SECONDS)
            if finished.committed or finished.lost:
                log.warning("at query start, the previous driver's decided %s", finished)
        except Exception as error:  # the re-run's commit does the same; never stop a query from starting for this
            log.info("at query start, decided transactions were not checked: %s", error)
    return writer


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
        on_kept_clients(self.options, lambda clients: DriverCommit(self.options, no_crash, clients).abort([m for m in messages if m is not None], batchId))




def make_batch_writer(options, schema: StructType, overwrite: bool = False) -> "OnceflowBatchWriter":
    """The data source's ``writer``, for ``df.write.format("onceflow")``:
    options and columns checked on the driver, the job named once here."""
    if overwrite:
        raise OptionError("a Kafka topic cannot be overwritten: use df.write.format(\"onceflow\").mode(\"append\")")
    sink_options = SinkOptions.parse(options, batch_write=True)
    return OnceflowBatchWriter(sink_options, validate_schema(schema, sink_options.topic), uuid.uuid4().hex)


class OnceflowBatchWriter(DataSourceArrowWriter):
    """``df.write.format("onceflow").mode("append")...save()``: exactly once
    for the job. Every task writes its rows in one transaction of its own;
    the driver's commit verifies and commits them all, so a job that fails
    leaves nothing visible. With ``txnAppId`` and ``txnVersion`` (in
    ``foreachBatch``: an application name and the batch id), the commit goes
    through the decision log keyed by the application, so a version written
    before (a replayed ``foreachBatch`` after a crash) is not written again
    and a version decided before a driver crash is finished from its
    decision: exactly-once ``foreachBatch``, the way Spark users get update
    mode into a sink."""

    def __init__(self, options: SinkOptions, columns: Columns, job_id: str):
        self.options = options
        self.columns = columns
        self.job_id = job_id  # the run: every transactional id of this job carries it

    def _task(self) -> TaskIdentity:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise SinkError("write() runs only inside a Spark task")
        query_id = self.options.txn_app_id if self.options.txn_app_id is not None else self.job_id
        version = self.options.txn_version if self.options.txn_version is not None else 0
        return TaskIdentity(query_id, self.job_id, version, context.partitionId(), context.attemptNumber(), context.taskAttemptId())

    def write(self, iterator) -> SinkCommitMessage:
        return write_task(self.options, self.columns, iterator, self._task(), resolve_hook(self.options.crash_point_hook))

    def commit(self, messages) -> None:
        if not self.options.exactly_once:
            return
        messages = [m for m in messages if m is not None]
        hook = resolve_hook(self.options.crash_point_hook)
        if self.options.txn_app_id is None:
            on_kept_clients(self.options, lambda clients: DriverCommit(self.options, hook, clients).commit_job(messages))
        else:
            on_kept_clients(self.options, lambda clients: DriverCommit(self.options, hook, clients).commit(messages, self.options.txn_version))

    def abort(self, messages) -> None:
        if not self.options.exactly_once:
            return
        messages = [m for m in messages if m is not None]
        if self.options.txn_app_id is None:
            on_kept_clients(self.options, lambda clients: DriverCommit(self.options, no_crash, clients).abort_job(self.job_id, messages))
        else:
            on_kept_clients(self.options, lambda clients: DriverCommit(self.options, no_crash, clients).abort(messages, self.options.txn_version))
