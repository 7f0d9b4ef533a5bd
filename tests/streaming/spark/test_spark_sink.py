"""The exactly-once sink without a Spark session: options and columns as
Spark's Kafka sink checks them, and the executor and driver halves of the
commit protocol against a real broker process, with the driver "crashing"
(a crash point raising) at every named point and a new run taking over with
other partitioning."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import uuid

import pytest
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType

from faults.points import CrashPointReached
from streaming.spark import decision, sink, sink_driver, sink_task
from streaming.spark.checkpoint import read_source_offsets
from streaming.spark.crashpoints import AFTER_ALL_COMMITS, AFTER_COMMIT, AFTER_DECISION, BEFORE_DECISION, TASK_BEFORE_HANDLE
from streaming.spark.decision import DecidedTransactionsLostError, PrefixInUseError
from streaming.spark.options import DEFAULT_TRANSACTION_TIMEOUT_MS, OptionError, SinkOptions
from streaming.spark.sink import make_stream_writer, validate_schema
from streaming.spark.sink_driver import DriverCommit
from streaming.spark.sink_task import TaskIdentity, write_task
from tests.helpers import new_query, open_sink_transactions, read_committed_values, run_sink_tasks, sink_kv_schema, sink_rows, spark_sink_options
from txn import Admin, Producer, TopicPartition
from txn.errors import KafkaError

KV = sink_kv_schema()

# -- options and columns -----------------------------------------------------------------

@pytest.mark.parametrize(
    "given, message",
    [
        ({"topic": "t"}, "'kafka.bootstrap.servers' must be specified for configuring Kafka producer"),
        ({"kafka.bootstrap.servers": "h:1"}, "needs option 'transactionalIdPrefix' .* or a checkpointLocation option to derive one from; deliveryGuarantee=at_least_once needs neither"),
        (spark_sink_options(deliveryGuarantee="twice"), "deliveryGuarantee must be exactly_once or at_least_once"),
        (spark_sink_options(**{"kafka.key.serializer": "x"}), "'key.serializer' is not supported as keys are serialized with ByteArraySerializer"),
        (spark_sink_options(**{"kafka.transactional.id": "x"}), "set transactionalIdPrefix"),
        (spark_sink_options(**{"kafka.no.such.setting": "1"}), "kafka.no.such.setting not supported by onceflow's ProducerConfig"),
        (spark_sink_options(**{"kafka.linger.ms": "-1"}), "invalid Kafka option: linger_ms"),
        (spark_sink_options(transactionalIdPrefix="a/b"), "not a legal topic name"),
        (spark_sink_options(commitOffsetsToGroup="g"), "needs .option\\('checkpointLocation'"),
        (spark_sink_options(decisionTopicReplicationFactor="0"), "decisionTopicReplicationFactor must be -1 \\(the broker's default\\) or positive, not 0"),
        (spark_sink_options(decisionTopicReplicationFactor="2", decisionTopicMinInsyncReplicas="3"), "cannot exceed decisionTopicReplicationFactor"),
        (spark_sink_options(txnAppId="a"), "txnAppId and txnVersion go together"),
        (spark_sink_options(txnAppId="a", txnVersion="1"), "are options of batch writes"),
        (spark_sink_options(commitOffsetsToGroup="g", deliveryGuarantee="at_least_once", checkpointLocation="/c"), "needs deliveryGuarantee=exactly_once"),
    ],
)
def test_bad_options_are_refused_with_a_reason(given, message):
    with pytest.raises(OptionError, match=message):
        SinkOptions.parse(given)

def test_the_prefix_defaults_to_one_derived_from_the_checkpoint(tmp_path, monkeypatch):
    """A job ported from format("kafka") has a checkpointLocation and no
    transactionalIdPrefix: the prefix is derived from the checkpoint's
    absolute path, stable across restarts, distinct per checkpoint."""
    monkeypatch.chdir(tmp_path)
    given = {"kafka.bootstrap.servers": "h:1", "topic": "out"}
    first = SinkOptions.parse({**given, "checkpointLocation": "ckpt"})
    assert first.transactional_id_prefix.startswith("onceflow-") and first.decision_topic == f"onceflow.decisions.{first.transactional_id_prefix}"
    assert SinkOptions.parse({**given, "checkpointLocation": str(tmp_path / "ckpt")}).transactional_id_prefix == first.transactional_id_prefix
    assert SinkOptions.parse({**given, "checkpointLocation": "file:" + str(tmp_path / "ckpt")}).transactional_id_prefix == first.transactional_id_prefix
    assert SinkOptions.parse({**given, "checkpointLocation": "other"}).transactional_id_prefix != first.transactional_id_prefix
    assert SinkOptions.parse({**given, "checkpointLocation": "ckpt", "transactionalIdPrefix": "mine"}).transactional_id_prefix == "mine"


def test_options_defaults_and_passthrough():
    parsed = SinkOptions.parse({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "kafka.linger.ms": "20", "transactionalidprefix": "job"})
    assert parsed.exactly_once and parsed.topic is None and parsed.decision_topic == "onceflow.decisions.job"
    config = parsed.producer_config(transactional_id="x")
    assert config.linger_ms == 20 and config.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS
    lenient = SinkOptions.parse({"kafka.bootstrap.servers": "h:1", "deliveryGuarantee": "AT_LEAST_ONCE"})
    assert not lenient.exactly_once and lenient.transactional_id_prefix is None

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

@pytest.mark.parametrize(
    "fields, topic, message",
    [
        ([("value", StringType())], None, "topic option required when no 'topic' attribute is present. Use the topic option for setting a topic."),
        ([("key", StringType())], "t", "Required attribute 'value' not found"),
        ([("value", IntegerType())], "t", "value attribute unsupported type int. value must be a\\(n\\) string or binary"),
        ([("value", StringType()), ("key", LongType())], "t", "key attribute unsupported type bigint. key must be a\\(n\\) string or binary"),
        ([("value", StringType()), ("topic", IntegerType())], None, "topic attribute unsupported type int. topic must be a\\(n\\) string"),
        ([("value", StringType()), ("partition", StringType())], "t", "partition attribute unsupported type string. partition must be a\\(n\\) int"),
        ([("value", StringType()), ("headers", StringType())], "t", "headers attribute unsupported type string. headers must be a\\(n\\) array<struct<key:string,value:binary>>"),
    ],
)
def test_columns_are_checked_with_sparks_messages(fields, topic, message):
    with pytest.raises(sink.SinkSchemaError, match=f"^{message}$"):
        validate_schema(StructType([StructField(n, t) for n, t in fields]), topic)

def test_accepted_columns():
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("headers", HEADERS)])
    columns = validate_schema(schema, None)
    assert (columns.key, columns.topic, columns.partition, columns.headers) == (True, True, True, True)
    assert not validate_schema(schema, "t").topic  # the option overrides the column, as in Spark

def test_writer_and_messages_pickle():
    writer = make_stream_writer(spark_sink_options(), KV, False)
    again = pickle.loads(pickle.dumps(writer))
    assert again.options == writer.options and again.columns == writer.columns
    message = sink_task.SinkCommitMessage(TaskIdentity("q", "r", 1, 0, 0), None, 0)
    assert pickle.loads(pickle.dumps(message)) == message

# -- the protocol against a real broker ------------------------------------------------------

class Crash:
    """A crash point seam that raises at ``name``'s ``hit``-th pass."""

    def __init__(self, name=None, hit=1):
        self.name, self.left = name, hit

    def __call__(self, name):
        if name == self.name:
            self.left -= 1
            if self.left == 0:
                raise CrashPointReached(name)

@pytest.fixture
def broker(broker_process):
    broker = broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=200", "num.partitions=3")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics({"out": 3})
    return broker

@pytest.mark.slow
def test_the_decision_topic_is_created_with_the_replication_asked_for(broker):
    """Issue 27, item 6: the decision topic gets the broker's default
    replication factor unless decisionTopicReplicationFactor says otherwise;
    a single broker refuses 3 with its own reason, which shows the request
    carried it."""
    query, run = new_query()
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, transactionalIdPrefix="replicated", decisionTopicReplicationFactor="3"), KV)
    with pytest.raises(KafkaError, match="INVALID_REPLICATION_FACTOR"):
        writer.commit(run_sink_tasks(writer.options, [1], 1, query, run, 0), 0)
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, transactionalIdPrefix="replicated", decisionTopicMinInsyncReplicas="1"), KV)
    writer.commit(run_sink_tasks(writer.options, [1], 1, query, run, 0), 0)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1]


@pytest.mark.slow
def test_batches_commit_exactly_once(broker):
    parsed = SinkOptions.parse(spark_sink_options(broker.bootstrap))
    query, run = new_query()
    for batch in range(3):
        values = list(range(batch * 10, batch * 10 + 10))
        messages = run_sink_tasks(parsed, values, 2, query, run, batch)
        assert all(m.transaction is not None and m.records == 5 for m in messages)
        make_stream_writer(spark_sink_options(broker.bootstrap), KV).commit(messages, batch)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(30))
    assert open_sink_transactions(broker.bootstrap) == []
    with Admin(broker.bootstrap) as admin:
        writers = admin.describe_producers(TopicPartition("onceflow.decisions.job", 0))
    assert len(writers) == 1, f"the driver keeps one decision producer across commits, not one per batch: {writers}"


@pytest.mark.slow
def test_a_task_never_writes_into_a_transaction_the_driver_left_open(broker):
    """Batch 0's transaction is still open (its driver never committed) when
    the task of batch 1 starts: batch 1's rows go to a transaction of their
    own (ids are unique per batch), and commit(1) aborts batch 0's."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    first = run_sink_tasks(writer.options, [1, 2], 1, query, run, 0)
    second = run_sink_tasks(writer.options, [3, 4], 1, query, run, 1)
    assert second[0].transaction.transactional_id != first[0].transaction.transactional_id
    writer.commit(second, 1)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [3, 4]
    assert open_sink_transactions(broker.bootstrap) == []


@pytest.mark.slow
def test_zombie_task_attempts_cannot_touch_a_handed_over_transaction(broker):
    """Issue 27, item 1. Batch 1's task (task attempt id 12, in a stage
    attempt after a failed one) has handed its transaction to the driver;
    then three zombies start late: a speculative loser of batch 0, a task of
    batch 1's failed stage attempt still running (same partition, same
    attempt number 0, task attempt id 9), and a failed earlier attempt of
    this stage. Before, the first two shared the handed-over transaction's
    id (ids were per run, partition and attempt number): their
    InitProducerId aborted it and the driver's commit failed with
    DecidedTransactionsLostError on every restart."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    columns = validate_schema(KV, "out")
    writer.commit(run_sink_tasks(writer.options, [1, 2], 1, query, run, 0), 0)
    handed = [write_task(writer.options, columns, iter([sink_rows([3, 4])]), TaskIdentity(query, run, 1, 0, 0, task_attempt_id=12))]
    for zombie in (TaskIdentity(query, run, 0, 0, 0, task_attempt_id=5), TaskIdentity(query, run, 1, 0, 0, task_attempt_id=9), TaskIdentity(query, run, 1, 0, 1, task_attempt_id=11)):
        write_task(writer.options, columns, iter([sink_rows([90 + zombie.batch_id])]), zombie)
    assert len(open_sink_transactions(broker.bootstrap)) == 4
    writer.commit(handed, 1)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1, 2, 3, 4]
    assert open_sink_transactions(broker.bootstrap) == []  # the zombies' transactions were aborted by the commit's cleanup


@pytest.mark.slow
@pytest.mark.parametrize("point, hit, visible_before_restart", [(BEFORE_DECISION, 1, 0), (AFTER_DECISION, 1, 0), (AFTER_COMMIT, 1, 1), (AFTER_COMMIT, 2, 2), (AFTER_ALL_COMMITS, 1, 3)])
def test_driver_crash_then_restart_with_other_partitioning(broker, point, hit, visible_before_restart):
    """Crash in commit(1) at ``point``; the restarted run re-runs batch 1 with
    two tasks instead of three and commits it: every value once."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run1 = new_query()
    writer.commit(run_sink_tasks(writer.options, list(range(0, 9)), 3, query, run1, 0), 0)
    first = run_sink_tasks(writer.options, list(range(9, 18)), 3, query, run1, 1)

    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(point, hit)).commit(first, 1))
    by_task = [m.records for m in first]
    before = open_sink_transactions(broker.bootstrap)
    assert len(before) == 3 - min(visible_before_restart, 3)  # what was not committed is still open
    run2 = str(uuid.uuid4())
    again = run_sink_tasks(writer.options, list(range(9, 18)), 2, query, run2, 1)  # the re-run: other partitioning, other rows per task
    writer.commit(again, 1)
    assert open_sink_transactions(broker.bootstrap) == []
    values = sorted(map(int, read_committed_values(broker.bootstrap)))
    assert values == list(range(18)), f"not exactly once after a crash at {point}@{hit} (tasks had {by_task})"
    writer.commit(run_sink_tasks(writer.options, list(range(18, 20)), 2, query, run2, 2), 2)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(20))

@pytest.mark.slow
def test_a_batch_without_rows_opens_no_transaction_and_decides_nothing(broker):
    """Tasks without rows start no producer (the coordinator never hears of
    their ids: no InitProducerId) and a batch of them writes no decision.
    The restart path still decides right: a batch decided before a crash
    whose re-run has no rows at all commits its decided transactions, and
    the batches after decide as before."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    writer.commit(run_sink_tasks(writer.options, [1, 2], 2, query, run, 0), 0)
    decisions = TopicPartition("onceflow.decisions.job", 0)

    def decisions_end():
        with Admin(broker.bootstrap) as admin:
            return admin.list_offsets({decisions: "latest"}, isolation_level="read_uncommitted")[decisions].offset

    before = decisions_end()
    empty = run_sink_tasks(writer.options, [], 2, query, run, 1)
    assert [(m.transaction, m.records) for m in empty] == [(None, 0), (None, 0)]
    with Admin(broker.bootstrap) as admin:
        known = [t.transactional_id for t in admin.list_transactions()]
    batch_ids = decision.run_prefix("job", query, run) + "1-"
    assert not [name for name in known if name.startswith(batch_ids)], f"tasks without rows initialised producers: {known}"
    writer.commit(empty, 1)
    assert decisions_end() == before, "a batch without rows wrote a decision"

    decided = run_sink_tasks(writer.options, [3, 4, 5], 2, query, run, 2)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_DECISION)).commit(decided, 2))
    run2 = str(uuid.uuid4())
    writer.commit(run_sink_tasks(writer.options, [], 3, query, run2, 2), 2)  # the re-run has no rows: the decided ones commit
    assert open_sink_transactions(broker.bootstrap) == []
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1, 2, 3, 4, 5]
    writer.commit(run_sink_tasks(writer.options, [6, 7], 2, query, run2, 3), 3)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.slow
def test_failed_task_attempt_and_crashed_run_leftovers_are_aborted(broker):
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    # A task attempt that failed after sending (its transaction is aborted by the task itself) ...
    with pytest.raises(CrashPointReached):
        run_sink_tasks(writer.options, [100, 101], 1, query, run, 0, crash=Crash(TASK_BEFORE_HANDLE))
    # ... and one whose process died: its transaction stays open and holds the LSO.
    zombie = Producer(broker.bootstrap, transactional_id=decision.transactional_id("job", query, "deadbeef", 0, 1))
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", b"200", partition=0)
    zombie.flush()
    zombie.close()
    assert open_sink_transactions(broker.bootstrap) == [zombie.config.transactional_id]
    writer.commit(run_sink_tasks(writer.options, [0, 1, 2], 2, query, run, 0), 0)
    assert open_sink_transactions(broker.bootstrap) == []
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2]

@pytest.mark.slow
def test_abort_after_a_decision_finishes_the_batch(broker):
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(6)), 2, query, run, 0)

    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_DECISION)).commit(messages, 0))
    writer.abort(messages, 0)  # what Spark does after commit() raised
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(6))
    undecided = run_sink_tasks(writer.options, [50, 51], 2, query, run, 1)
    writer.abort(undecided, 1)  # a batch whose task failed: never decided, aborted
    assert open_sink_transactions(broker.bootstrap) == []
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(6))

def wait_until_no_open_transactions(bootstrap, timeout=30):
    deadline = time.monotonic() + timeout
    while open_sink_transactions(bootstrap):  # the broker aborts them after their timeout
        assert time.monotonic() < deadline
        time.sleep(0.2)


# Long enough for the tasks and the decision on a loaded machine (at 1 s the
# broker sometimes aborted a handle before the decision, and the driver rightly
# refused to decide), short enough that the test then waits for the timeout.
DECIDE_THEN_TIME_OUT_MS = "6000"


@pytest.mark.slow
def test_a_batch_whose_transactions_timed_out_is_not_decided_and_reruns(broker):
    """Issue 27, item 2: a batch that ran longer than the transaction
    timeout. Before, its dead handles were decided anyway, the commit failed
    with DecidedTransactionsLostError and every restart failed again. Now the
    driver verifies every handle is open before deciding, decides nothing,
    aborts the rest and says why; the re-run commits."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, **{"kafka.transaction.timeout.ms": "1000"}), KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(6)), 2, query, run, 0)
    wait_until_no_open_transactions(broker.bootstrap)
    with pytest.raises(decision.BatchTransactionsNotOpenError) as failed:
        writer.commit(messages, 0)
    text = str(failed.value)
    assert "batch 0: 2 of its 2 transactions were no longer open" in text and "Nothing was decided" in text
    assert "kafka.transaction.timeout.ms (1000 ms)" in text and "maxOffsetsPerTrigger" in text
    # One handle dead, one open: the open one is aborted, nothing decided. These
    # tasks get a timeout no loaded machine outlives, so only the fence kills one.
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, **{"kafka.transaction.timeout.ms": "60000"}), KV)
    late = run_sink_tasks(writer.options, list(range(6)), 2, query, run, 0)
    fence = Producer(broker.bootstrap, transactional_id=late[0].transaction.transactional_id)
    fence.init_transactions()  # aborts late[0]'s transaction, as a timeout would
    fence.close()
    with pytest.raises(decision.BatchTransactionsNotOpenError, match="1 of its 2 transactions"):
        writer.commit(late, 0)
    assert open_sink_transactions(broker.bootstrap) == []
    rerun = run_sink_tasks(writer.options, list(range(6)), 2, query, str(uuid.uuid4()), 0)
    writer.commit(rerun, 0)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(6))


@pytest.mark.slow
def test_a_decided_batch_whose_transactions_all_timed_out_is_decided_again(broker):
    """Issue 27, item 2's recovery path: the driver died after deciding, and
    the broker aborted every decided transaction before the restart. None
    committed, and the re-run recomputed the whole batch: its handles are
    decided instead (before, the query stayed wedged)."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, **{"kafka.transaction.timeout.ms": DECIDE_THEN_TIME_OUT_MS}), KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(6)), 2, query, run, 0)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_DECISION)).commit(messages, 0))
    wait_until_no_open_transactions(broker.bootstrap)
    writer.commit(run_sink_tasks(writer.options, list(range(6)), 1, query, str(uuid.uuid4()), 0), 0)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(6))
    assert open_sink_transactions(broker.bootstrap) == []


@pytest.mark.slow
def test_a_decided_batch_partly_committed_then_timed_out_fails_loudly(broker):
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, **{"kafka.transaction.timeout.ms": DECIDE_THEN_TIME_OUT_MS}), KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(6)), 2, query, run, 0)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_COMMIT, 1)).commit(messages, 0))
    wait_until_no_open_transactions(broker.bootstrap)
    rerun = run_sink_tasks(writer.options, list(range(6)), 1, query, str(uuid.uuid4()), 0)
    with pytest.raises(DecidedTransactionsLostError) as lost:
        writer.commit(rerun, 0)
    text = str(lost.value)
    assert "batch 0 was decided but 1 of its 2 transactions" in text and "(1 committed)" in text and "3 records" in text
    assert messages[1].transaction.transactional_id in text
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 2, 4]  # the committed task's rows; the re-run's were aborted
    assert open_sink_transactions(broker.bootstrap) == []


@pytest.mark.slow
def test_a_second_driver_on_the_same_query_fences_the_first(broker):
    """Issue 27, item 3. Driver A has read the latest decision and is about
    to decide batch 1 when driver B (same checkpoint: same query, another
    run) commits its own batch 1. Before, A then decided batch 1 again over
    B's (duplicates, or A's handles already aborted by B's cleanup: a wedge).
    Now B's commit fenced A's decision writer: A stops with a clear error,
    B's decision stands, every value once."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run_a = new_query()
    writer.commit(run_sink_tasks(writer.options, [0, 1], 2, query, run_a, 0), 0)
    run_b = str(uuid.uuid4())
    mine = run_sink_tasks(writer.options, [2, 3], 2, query, run_a, 1)
    theirs = run_sink_tasks(writer.options, [2, 3], 1, query, run_b, 1)

    def second_driver_commits(name):
        if name == BEFORE_DECISION:
            other = threading.Thread(target=lambda: asyncio.run(DriverCommit(writer.options).commit(theirs, 1)))
            other.start()
            other.join()

    with pytest.raises(decision.DriverFencedError, match="another driver took over query .* a second driver runs the same checkpoint"):
        asyncio.run(DriverCommit(writer.options, second_driver_commits).commit(mine, 1))
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2, 3]
    writer.commit(run_sink_tasks(writer.options, [4], 1, query, run_b, 2), 2)  # B goes on
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2, 3, 4]
    assert open_sink_transactions(broker.bootstrap) == []


@pytest.mark.slow
def test_abort_after_an_in_doubt_decision_write(broker):
    """Issue 27, item 4. A driver's decision write for batch 0 is in flight
    (sent, its outcome unknown to the driver) when Spark calls abort(). The
    abort first takes the decision writer over, which aborts the in-flight
    write, so aborting the batch's transactions is safe: the stale write can
    never land afterwards, and the re-run decides anew."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(4)), 2, query, run, 0)

    async def sequence():
        stale = sink_driver.DriverClients(writer.options)
        try:
            decisions = sink_driver.DecisionLog(writer.options, stale)
            await decisions.ensure()
            in_flight = stale.decision_writer(query)
            await in_flight.init_transactions()
            in_flight.begin_transaction()
            record = decision.Decision(query, 0, run, tuple(m.transaction for m in messages))
            await (await in_flight.send(decisions.topic, record.to_bytes(), key=decisions.key, partition=0))
            await DriverCommit(writer.options).abort(messages, 0)  # what Spark does after a commit that raised
            with pytest.raises(KafkaError):
                await in_flight.commit_transaction()  # the late landing of the stale write: fenced
            assert await sink_driver.DecisionLog(writer.options, stale).latest() is None
        finally:
            await stale.close()

    asyncio.run(sequence())
    assert open_sink_transactions(broker.bootstrap) == []
    writer.commit(run_sink_tasks(writer.options, list(range(4)), 1, query, str(uuid.uuid4()), 0), 0)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(4))


@pytest.mark.slow
def test_the_completer_finishes_a_decided_batch_without_spark_and_fences_no_one(broker):
    """Issue 30: a driver died after deciding batch 1 and committing one of
    its three transactions. The completer commits the other two at once (the
    output's LSO moves without waiting for Spark); it leaves a live driver's
    decision writer alone, and the restarted run then finds nothing to redo."""
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run = new_query()
    assert str(sink_driver.finish_decided(writer.options)) == "no decision recorded"
    writer.commit(run_sink_tasks(writer.options, [0, 1, 2], 3, query, run, 0), 0)
    decided = run_sink_tasks(writer.options, [3, 4, 5], 3, query, run, 1)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_COMMIT, 1)).commit(decided, 1))
    with Admin(broker.bootstrap) as admin:
        writer_before = admin.describe_transactions([decision.driver_transactional_id("job", query)])[0]
    finished = sink_driver.finish_decided(writer.options)
    assert finished.decision.batch_id == 1 and len(finished.committed) == 2 and not finished.lost
    assert open_sink_transactions(broker.bootstrap) == []
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2, 3, 4, 5]
    with Admin(broker.bootstrap) as admin:
        writer_after = admin.describe_transactions([decision.driver_transactional_id("job", query)])[0]
    assert writer_after.producer_epoch == writer_before.producer_epoch  # no driver was fenced
    assert len(sink_driver.finish_decided(writer.options).committed) == 0  # idempotent
    writer.commit(run_sink_tasks(writer.options, [3, 4, 5], 2, query, str(uuid.uuid4()), 1), 1)  # the restarted run
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2, 3, 4, 5]


@pytest.mark.slow
def test_two_prefixes_share_a_decision_topic(broker):
    """Issue 27, item 5. Before, the latest record of a shared decisionTopic
    was read whatever its key: B's first commit was refused as a prefix in
    use, and A's abort after deciding aborted its decided batch (loss). Each
    prefix now reads its own key."""
    a = make_stream_writer(spark_sink_options(broker.bootstrap, transactionalIdPrefix="a", decisionTopic="shared"), KV)
    b = make_stream_writer(spark_sink_options(broker.bootstrap, transactionalIdPrefix="b", decisionTopic="shared"), KV)
    query_a, run_a = new_query()
    query_b, run_b = new_query()
    a.commit(run_sink_tasks(a.options, [0, 1], 2, query_a, run_a, 0), 0)
    b.commit(run_sink_tasks(b.options, [100, 101], 2, query_b, run_b, 0), 0)
    decided = run_sink_tasks(a.options, [2, 3], 2, query_a, run_a, 1)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(a.options, Crash(AFTER_DECISION)).commit(decided, 1))
    b.commit(run_sink_tasks(b.options, [102], 1, query_b, run_b, 1), 1)  # B's decision is now the topic's last record
    a.abort(decided, 1)  # must finish A's decided batch 1, not abort it
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [0, 1, 2, 3, 100, 101, 102]
    assert open_sink_transactions(broker.bootstrap, "a") == [] and open_sink_transactions(broker.bootstrap, "b") == []


@pytest.mark.slow
def test_two_queries_on_one_prefix(broker):
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query_a, run_a = new_query()
    writer.commit(run_sink_tasks(writer.options, [1, 2], 2, query_a, run_a, 0), 0)
    query_b, run_b = new_query()
    with pytest.raises(PrefixInUseError, match=f"in use by query {query_a}"):
        writer.commit(run_sink_tasks(writer.options, [90, 91], 2, query_b, run_b, 0), 0)
    assert open_sink_transactions(broker.bootstrap) == []  # B aborted its own
    writer.commit(run_sink_tasks(writer.options, [3], 2, query_a, run_a, 1), 1)  # A goes on
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1, 2, 3]

@pytest.mark.slow
def test_at_least_once_writes_without_transactions(broker):
    writer = make_stream_writer({"kafka.bootstrap.servers": broker.bootstrap, "topic": "out", "deliveryGuarantee": "at_least_once"}, KV)
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(5)), 2, query, run, 0)
    assert [m.transaction for m in messages] == [None, None] and sum(m.records for m in messages) == 5
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(5))  # visible before any commit
    writer.commit(messages, 0)

@pytest.mark.slow
def test_commit_offsets_to_group_with_the_batch(broker, tmp_path):
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"in": {"0": 40, "1": 7}}\n')
    writer = make_stream_writer(spark_sink_options(broker.bootstrap, commitOffsetsToGroup="lagtool", checkpointLocation=str(checkpoint)), KV)
    assert read_source_offsets(str(checkpoint), 0) == {("in", 0): 40, ("in", 1): 7}
    query, run = new_query()
    messages = run_sink_tasks(writer.options, [1, 2], 2, query, run, 0)

    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_DECISION)).commit(messages, 0))
    with Admin(broker.bootstrap) as admin:
        assert admin.list_group_offsets("lagtool") == {}  # decided, not committed
        writer.commit(run_sink_tasks(writer.options, [1, 2], 1, query, str(uuid.uuid4()), 0), 0)
        committed = admin.list_group_offsets("lagtool")
    assert {tp: o.offset for tp, o in committed.items()} == {TopicPartition("in", 0): 40, TopicPartition("in", 1): 7}
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == [1, 2]
    assert open_sink_transactions(broker.bootstrap) == []


@pytest.mark.slow
def test_leftovers_without_list_transactions(broker, monkeypatch):
    """A broker without ListTransactions (Kafka before 3.0): the driver aborts
    the undecided handles it was given; a dead attempt's transaction cannot
    be found and ends at its timeout (the documented limit), holding the
    LSO until then."""

    async def old_broker(admin):
        return False

    monkeypatch.setattr(sink_driver, "lists_transactions", old_broker)
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), KV)
    query, run1 = new_query()
    first = run_sink_tasks(writer.options, list(range(6)), 2, query, run1, 0)
    with pytest.raises(CrashPointReached):
        asyncio.run(DriverCommit(writer.options, Crash(AFTER_DECISION)).commit(first, 0))
    run2 = str(uuid.uuid4())
    # The re-run: partition 0's first attempt died with its transaction open; its second attempt wrote.
    dead = Producer(broker.bootstrap, transactional_id=decision.transactional_id("job", query, run2, 0, 0), transaction_timeout_ms=2000)
    dead.init_transactions()
    dead.begin_transaction()
    dead.send("out", b"99", partition=0)
    dead.flush()
    dead.close()
    columns = validate_schema(KV, "out")
    again = [write_task(writer.options, columns, iter([sink_rows(list(range(6)))]), TaskIdentity(query, run2, 0, 0, 1))]
    assert len(open_sink_transactions(broker.bootstrap)) == 4  # two decided, the dead attempt, the retry
    writer.commit(again, 0)
    assert open_sink_transactions(broker.bootstrap) == [dead.config.transactional_id]
    wait_until_no_open_transactions(broker.bootstrap)
    assert sorted(map(int, read_committed_values(broker.bootstrap))) == list(range(6))
