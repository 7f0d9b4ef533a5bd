"""The onceflow source in a real Spark session (local mode) against a real
broker process, with data written in committed and aborted transactions:
what becomes rows, where each microbatch ends, and every source option."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.conftest import module_broker as broker  # noqa: F401  (one broker for the module; each test has its own topics)
from tests.helpers import recreate_topics
from txn import Admin, Producer, TopicPartition

pytestmark = pytest.mark.slow


# -- writing known data --------------------------------------------------------------------------


class Writer:
    """Writes records in transactions and remembers what is committed."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.transactional_id = f"writer-{uuid.uuid4()}"
        self.producer = Producer(bootstrap_servers=bootstrap, transactional_id=self.transactional_id, linger_ms=0)
        self.producer.init_transactions()
        self.committed: list[tuple[int, bytes]] = []  # (partition, value)

    def transaction(self, values, *, partition: int = 0, commit: bool = True, headers=None, timestamp=None) -> None:
        self.producer.begin_transaction()
        for value in values:
            self.producer.send(self.topic, value, key=b"k-" + value, partition=partition, headers=headers, timestamp=timestamp)
        self.producer.flush()
        if commit:
            self.producer.commit_transaction()
            self.committed += [(partition, value) for value in values]
        else:
            self.producer.abort_transaction()

    def open(self, values, *, partition: int = 0) -> None:
        """Begin a transaction and leave it open."""
        self.producer.begin_transaction()
        for value in values:
            self.producer.send(self.topic, value, partition=partition)
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


def create(broker, topic: str, partitions: int = 1) -> None:
    recreate_topics(broker.bootstrap, {topic: partitions})  # empty on a rerun too: the broker is the module's


def stream(spark, broker, **options):
    reader = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def run_available_now(df, tmp_path, timeout: float = 180, checkpoint=None, after_batch=None):
    """Run the query to its end with Trigger.AvailableNow; the rows of each batch.

    ``after_batch(batch_id)`` runs on the driver after each batch was collected."""
    batches: list[tuple[int, list]] = []

    def collect(batch_df, batch_id):
        batches.append((batch_id, batch_df.collect()))
        if after_batch is not None:
            after_batch(batch_id)

    checkpoint = checkpoint or tmp_path / f"ckpt-{uuid.uuid4()}"
    query = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    assert query.awaitTermination(timeout), "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return batches, query


def rows_of(batches) -> list:
    return [row for _batch_id, rows in batches for row in rows]


# -- tests ----------------------------------------------------------------------------------------


def test_committed_records_only_with_kafka_schema(spark, broker, tmp_path):
    topic = "src-committed"
    create(broker, topic, 2)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3), partition=0)
    writer.transaction(values("x", 4), partition=0, commit=False)  # aborted: never rows
    writer.transaction(values("b", 2), partition=1, headers=[("h", b"1"), ("h2", None)])
    writer.transaction(values("c", 2), partition=0)
    writer.close()
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", includeHeaders="true")
    assert [f.name for f in df.schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    batches, _query = run_available_now(df, tmp_path)
    rows = rows_of(batches)
    assert sorted((r.partition, bytes(r.value)) for r in rows) == sorted(writer.committed)
    by_value = {bytes(r.value): r for r in rows}
    assert bytes(by_value[b"a0"].key) == b"k-a0" and by_value[b"a0"].topic == topic and by_value[b"a0"].timestampType == 0
    assert by_value[b"a0"].headers is None, "no headers: NULL, as Spark's Kafka source"
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in by_value[b"b0"].headers] == [("h", b"1"), ("h2", None)]
    # offsets: a0..a2 = 0..2, COMMIT marker 3, aborted 4..7, ABORT marker 8, c0 = 9
    assert [r.offset for r in sorted(rows, key=lambda r: (r.partition, r.offset)) if r.partition == 0] == [0, 1, 2, 9, 10]
    assert abs(by_value[b"a0"].timestamp.timestamp() - time.time()) < 600


CODECS = ("lz4", "zstd", "gzip", "snappy")


def written_by_librdkafka(bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    """Records written by confluent-kafka (librdkafka's encoder), one codec
    per partition (``CODECS``), with null keys, null and empty values, and
    headers (repeated keys, null values, a key beyond ASCII) on some:
    ``{partition: [(key, value, timestamp ms, headers or None)]}`` in offset order."""
    from confluent_kafka import Producer as ConfluentProducer

    written: dict[int, list[tuple]] = {}
    for partition, codec in enumerate(CODECS):
        producer = ConfluentProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 100, "acks": "all"})
        records = []
        for n in range(300):
            key = None if n % 3 == 0 else b"key-%d" % n
            value = None if n == 7 else b"" if n == 8 else b"%s-%d-" % (codec.encode(), n) + b"v" * (n % 50)
            headers = [("h", b"%d" % n), ("h", None), ("schlüssel", b"")] if n % 4 == 1 else None
            timestamp = 1_700_000_000_000 + 17 * n
            producer.produce(topic, value, key, partition=partition, timestamp=timestamp, headers=headers)
            records.append((key, value, timestamp, [(k, v) for k, v in headers] if headers else None))
        assert producer.flush(30) == 0
        written[partition] = records
    return written


def compressions_on_disk(broker, topic: str, partition: int) -> set[int]:
    """The compression codec ids of the record batches of a partition's log."""
    import glob

    from faults.disk import written_length
    from protocol.records import iter_batches

    found = set()
    for path in glob.glob(f"{broker.data_dir}/**/{topic}-{partition}/*.log", recursive=True):
        with open(path, "rb") as file:  # its data: the active segment may run on with zeros written ahead
            found |= {header.compression for _position, header in iter_batches(file.read(written_length(path)))}
    return found


def test_compressed_records_with_headers_and_null_keys_round_trip_exactly(spark, broker, tmp_path):
    """Every field of what librdkafka writes, compressed each way, comes out
    of Spark as it went in."""
    from protocol.compression import Compression

    topic = "src-librdkafka"
    create(broker, topic, len(CODECS))
    written = written_by_librdkafka(broker.bootstrap, topic)
    for partition, codec in enumerate(CODECS):
        assert compressions_on_disk(broker, topic, partition) == {Compression[codec.upper()]}, codec
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", includeHeaders="true").selectExpr(
        "key", "value", "topic", "partition", "offset", "unix_millis(timestamp) AS ms", "timestampType", "headers"
    )
    rows = rows_of(run_available_now(df, tmp_path)[0])
    got: dict[int, list[tuple]] = {partition: [] for partition in written}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        assert row.topic == topic and row.timestampType == 0 and row.offset == len(got[row.partition])
        headers = [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers] if row.headers is not None else None
        got[row.partition].append((None if row.key is None else bytes(row.key), None if row.value is None else bytes(row.value), row.ms, headers))
    assert got == written


def last_offsets(checkpoint) -> dict:
    """The source offsets of the newest batch in a checkpoint (Spark's offset log)."""
    offsets_dir = checkpoint / "offsets"
    newest = max((p for p in offsets_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return json.loads(newest.read_text().splitlines()[-1])


def fails(df, tmp_path, match: str, checkpoint=None):
    with pytest.raises(Exception, match=match):
        run_available_now(df, tmp_path, checkpoint=checkpoint)


def write_mixed(broker, topic: str) -> "Writer":
    """p0: a0..a2 = 0..2, COMMIT 3, x0..x3 aborted = 4..7, ABORT 8, c0 c1 = 9 10, COMMIT 11."""
    create(broker, topic)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3))
    writer.transaction(values("x", 4), commit=False)
    writer.transaction(values("c", 2))
    writer.close()
    return writer


def batch_read(spark, broker, **options) -> list:
    reader = spark.read.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load().collect()


@pytest.mark.parametrize(
    "start, end, expected",
    [
        (0, 3, [b"a0", b"a1", b"a2"]),  # ends before the COMMIT marker
        (0, 4, [b"a0", b"a1", b"a2"]),  # ends in the COMMIT marker
        (0, 6, [b"a0", b"a1", b"a2"]),  # ends inside the aborted transaction
        (4, 8, []),  # wholly aborted
        (4, 9, []),  # wholly aborted, with its ABORT marker
        (3, 9, []),  # nothing but markers and aborted records
        (5, 12, [b"c0", b"c1"]),  # starts inside the aborted transaction
        (1, 10, [b"a1", b"a2", b"c0"]),
    ],
)
def test_batch_ranges_around_markers_and_aborted_transactions(spark, broker, start, end, expected):
    topic = f"src-ranges-{start}-{end}"
    write_mixed(broker, topic)
    rows = batch_read(spark, broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": start}}), endingOffsets=json.dumps({topic: {"0": end}}))
    assert [bytes(r.value) for r in sorted(rows, key=lambda r: r.offset)] == expected


def test_batch_read_defaults_earliest_to_latest_and_read_uncommitted_sees_aborted(spark, broker):
    topic = "src-batch-defaults"
    write_mixed(broker, topic)
    assert sorted(bytes(r.value) for r in batch_read(spark, broker, subscribe=topic)) == [b"a0", b"a1", b"a2", b"c0", b"c1"]
    uncommitted = batch_read(spark, broker, subscribe=topic, **{"kafka.isolation.level": "read_uncommitted"})
    assert sorted(bytes(r.value) for r in uncommitted) == sorted(values("a", 3) + values("x", 4) + values("c", 2))
    assert batch_read(spark, broker, subscribe=topic, endingOffsets=json.dumps({topic: {"0": -1}}), startingOffsets=json.dumps({topic: {"0": -2}}))


def test_microbatches_split_by_max_offsets_end_inside_aborted_ranges(spark, broker, tmp_path):
    topic = "src-split"
    write_mixed(broker, topic)
    checkpoint = tmp_path / "ckpt"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=3)
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    # batches end at 3, 6 (inside the aborted transaction), 9 (after its ABORT marker) and 12 (the LSO)
    assert [[bytes(r.value) for r in sorted(rows, key=lambda r: r.offset)] for _id, rows in batches] == [[b"a0", b"a1", b"a2"], [], [], [b"c0", b"c1"]]
    assert last_offsets(checkpoint) == {topic: {"0": 12}}


def test_open_transaction_holds_the_batch_end_at_the_lso(spark, broker, tmp_path):
    topic = "src-open"
    create(broker, topic)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3))  # 0..2, COMMIT 3
    holder = Writer(broker.bootstrap, topic)
    holder.open(values("open", 2))  # 4, 5: the LSO stays at 4 while this is open
    writer.transaction(values("b", 2))  # 6, 7, COMMIT 8: committed, but above the LSO
    checkpoint = tmp_path / "ckpt"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == values("a", 3)
    assert last_offsets(checkpoint) == {topic: {"0": 4}}
    holder.producer.commit_transaction()
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)  # resumes from the checkpoint
    assert sorted(bytes(r.value) for r in rows_of(batches)) == values("b", 2) + values("open", 2)
    assert last_offsets(checkpoint) == {topic: {"0": 10}}
    uncommitted = Writer(broker.bootstrap, topic)
    uncommitted.open(values("u", 1))  # 10
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", **{"kafka.isolation.level": "read_uncommitted"})
    batches, _query = run_available_now(df, tmp_path)
    assert b"u0" in [bytes(r.value) for r in rows_of(batches)], "read_uncommitted reads to the high watermark"
    for each in (writer, holder, uncommitted):
        each.close()


def test_available_now_stops_at_its_snapshot_and_respects_max_offsets(spark, broker, tmp_path):
    topic = "src-available-now"
    create(broker, topic)
    writer = Writer(broker.bootstrap, topic)
    for i in range(5):
        writer.transaction([b"first-%d" % i])  # offsets 2i (record) and 2i+1 (COMMIT): LSO 10
    late = Writer(broker.bootstrap, topic)

    def write_late(batch_id):
        if batch_id == 0:  # the snapshot was taken before the first batch: these wait for the next run
            late.transaction(values("late", 3))

    checkpoint = tmp_path / "ckpt"
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=4)
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint, after_batch=write_late)
    assert len(batches) == 3, "10 offsets, at most 4 per batch"
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"first-%d" % i for i in range(5)]
    assert last_offsets(checkpoint) == {topic: {"0": 10}}
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == values("late", 3)
    writer.close()
    late.close()


def test_starting_offsets_json_with_earliest_latest_and_numbers(spark, broker, tmp_path):
    topic = "src-json"
    create(broker, topic, 3)
    writer = Writer(broker.bootstrap, topic)
    for partition in range(3):
        writer.transaction(values(f"old{partition}-", 3), partition=partition)  # 0..2, COMMIT 3
    checkpoint = tmp_path / "ckpt"
    starting = json.dumps({topic: {"0": -2, "1": -1, "2": 1}})
    df = stream(spark, broker, subscribe=topic, startingOffsets=starting)
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == values("old0-", 3) + [b"old2-1", b"old2-2"]
    writer.transaction([b"new1"], partition=1)
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert [bytes(r.value) for r in rows_of(batches)] == [b"new1"], "partition 1 started at its end"
    fails(stream(spark, broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": -2}})), tmp_path, "you must specify all TopicPartitions")
    writer.close()


def test_starting_timestamp_and_by_timestamp_with_no_match(spark, broker, tmp_path):
    topic = "src-timestamps"
    create(broker, topic, 2)
    writer = Writer(broker.bootstrap, topic)
    for partition in range(2):  # one transaction each: its COMMIT marker (stamped now) comes after every record
        writer.producer.begin_transaction()
        for i in range(4):
            writer.producer.send(topic, f"t{partition}-{i}".encode(), partition=partition, timestamp=1_000_000 + 1_000 * i)
        writer.producer.commit_transaction()
    df = stream(spark, broker, subscribe=topic, startingTimestamp=1_002_000)
    batches, _query = run_available_now(df, tmp_path)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"t0-2", b"t0-3", b"t1-2", b"t1-3"]
    assert {r.timestamp.timestamp() for r in rows_of(batches)} == {1_002.0, 1_003.0}
    by_partition = json.dumps({topic: {"0": 1_003_000, "1": 1_000_500}})
    batches, _query = run_available_now(stream(spark, broker, subscribe=topic, startingOffsetsByTimestamp=by_partition), tmp_path)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"t0-3", b"t1-1", b"t1-2", b"t1-3"]
    ranged = batch_read(spark, broker, subscribe=topic, startingTimestamp=1_001_000, endingTimestamp=1_003_000)
    assert sorted(bytes(r.value) for r in ranged) == [b"t0-1", b"t0-2", b"t1-1", b"t1-2"]
    future = 9_000_000_000_000
    fails(stream(spark, broker, subscribe=topic, startingTimestamp=future), tmp_path, "No offset matched from request of topic-partition src-timestamps-0")
    checkpoint = tmp_path / "ckpt-latest"
    df = stream(spark, broker, subscribe=topic, startingTimestamp=future, startingOffsetsByTimestampStrategy="latest")
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert rows_of(batches) == [], "no match: start at the latest offset"
    writer.transaction([b"after"], partition=1)
    batches, _query = run_available_now(df, tmp_path, checkpoint=checkpoint)
    assert [bytes(r.value) for r in rows_of(batches)] == [b"after"]
    writer.close()


def test_fail_on_data_loss_after_delete_records(spark, broker, tmp_path):
    topic = "src-loss"
    create(broker, topic)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3))  # 0..2, COMMIT 3
    checkpoints = {flag: tmp_path / f"ckpt-{flag}" for flag in ("true", "false")}
    for flag, checkpoint in checkpoints.items():
        batches, _query = run_available_now(stream(spark, broker, subscribe=topic, startingOffsets="earliest", failOnDataLoss=flag), tmp_path, checkpoint=checkpoint)
        assert len(rows_of(batches)) == 3
    writer.transaction(values("gone", 3))  # 4..6, COMMIT 7
    writer.transaction(values("kept", 2))  # 8, 9, COMMIT 10
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.delete_records({TopicPartition(topic, 0): 8}) == {TopicPartition(topic, 0): 8}
    fails(stream(spark, broker, subscribe=topic, failOnDataLoss="true"), tmp_path, "failOnDataLoss", checkpoint=checkpoints["true"])
    batches, _query = run_available_now(stream(spark, broker, subscribe=topic, failOnDataLoss="false"), tmp_path, checkpoint=checkpoints["false"])
    assert sorted(bytes(r.value) for r in rows_of(batches)) == values("kept", 2)
    with pytest.raises(Exception, match="failOnDataLoss"):
        batch_read(spark, broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0}}))
    writer.close()


def test_subscribe_pattern_and_assign(spark, broker, tmp_path):
    create(broker, "src-pat-a", 2)
    create(broker, "src-pat-b", 1)
    create(broker, "src-other", 1)
    for topic, partitions in (("src-pat-a", 2), ("src-pat-b", 1), ("src-other", 1)):
        writer = Writer(broker.bootstrap, topic)
        for partition in range(partitions):
            writer.transaction([f"{topic}/{partition}".encode()], partition=partition)
        writer.close()
    checkpoint = tmp_path / "ckpt-pattern"
    pattern = stream(spark, broker, subscribePattern="src-pat-.*", startingOffsets="latest")
    batches, _query = run_available_now(pattern, tmp_path, checkpoint=checkpoint)
    assert rows_of(batches) == []
    create(broker, "src-pat-c", 1)  # a topic that appears later is read from its earliest offset
    writer = Writer(broker.bootstrap, "src-pat-c")
    writer.transaction([b"src-pat-c/0"])
    writer.close()
    batches, _query = run_available_now(pattern, tmp_path, checkpoint=checkpoint)
    assert [bytes(r.value) for r in rows_of(batches)] == [b"src-pat-c/0"]
    batches, _query = run_available_now(stream(spark, broker, subscribePattern="src-pat-[ab]", startingOffsets="earliest"), tmp_path)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"src-pat-a/0", b"src-pat-a/1", b"src-pat-b/0"]
    batches, _query = run_available_now(stream(spark, broker, assign=json.dumps({"src-pat-a": [1], "src-other": [0]}), startingOffsets="earliest"), tmp_path)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"src-other/0", b"src-pat-a/1"]
    batches, _query = run_available_now(stream(spark, broker, subscribe="src-pat-b,src-other", startingOffsets="earliest", minPartitions=4), tmp_path)
    assert sorted(bytes(r.value) for r in rows_of(batches)) == [b"src-other/0", b"src-pat-b/0"]


def test_option_errors_reach_the_user(spark, broker, tmp_path):
    loaded = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "t")
    with pytest.raises(Exception, match="option 'startingOffsets' must be 'earliest', 'latest' or JSON"):
        loaded.option("startingOffsets", "earliestt").load()  # at load(), before any query starts (issue 35)
    with pytest.raises(Exception, match="One of the following options must be specified for Kafka source"):
        run_available_now(stream(spark, broker), tmp_path)
    with pytest.raises(Exception, match="Kafka option 'auto.offset.reset' is not supported"):
        run_available_now(stream(spark, broker, subscribe="t", **{"kafka.auto.offset.reset": "earliest"}), tmp_path)
    with pytest.raises(Exception, match="starting offset can't be latest for batch queries on Kafka"):
        batch_read(spark, broker, subscribe="t", startingOffsets="latest")
    from pyspark.sql.types import StructType, StructField, StringType

    with pytest.raises(Exception, match="Kafka source has a fixed schema"):
        spark.read.format("onceflow").schema(StructType([StructField("value", StringType())])).option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "t").load().collect()


def test_describe_shows_offsets_lso_lag_and_open_transactions(spark, broker, tmp_path):
    import streaming.spark
    from streaming.spark.progress import open_transactions
    from txn import AdminConfig

    topic = "src-describe"
    create(broker, topic, 2)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3), partition=0)  # 0..2, COMMIT 3
    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest")
    query = df.writeStream.format("memory").queryName("described").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        assert streaming.spark.describe(query).startswith("described [active")
        deadline = time.monotonic() + 120
        while not (query.lastProgress and query.lastProgress["sources"][0]["endOffset"] == json.dumps({topic: {"0": 4, "1": 0}})):
            assert time.monotonic() < deadline, query.lastProgress
            time.sleep(0.2)
    finally:
        query.stop()
    writer.transaction(values("b", 5), partition=1)  # 0..4, COMMIT 5: six offsets the stopped query has not read
    line = streaming.spark.describe(query)
    assert "described [stopped, batch" in line
    assert f"source {topic}-0@4 (lag 0) {topic}-1@0 (lag 6), lag 6;" in line, line
    output = "src-describe-out"
    create(broker, output)
    sink_query = (
        df.selectExpr("value").writeStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", output)
        .option("transactionalIdPrefix", "describe-sink").option("checkpointLocation", str(tmp_path / "ckpt-sink")).trigger(availableNow=True).start()
    )
    assert sink_query.awaitTermination(180)
    assert f"output {output}: 0 open transactions" in streaming.spark.describe(sink_query)
    holder = Producer(bootstrap_servers=broker.bootstrap, transactional_id="describe-job-run1-0")
    holder.init_transactions()
    holder.begin_transaction()
    holder.send(topic, b"pending", partition=0).result(30)
    assert open_transactions(AdminConfig(bootstrap_servers=broker.bootstrap), "describe-job") == [("describe-job-run1-0", "Ongoing")]
    holder.abort_transaction()
    assert open_transactions(AdminConfig(bootstrap_servers=broker.bootstrap), "describe-job") == []
    holder.close()
    writer.close()


def test_min_offsets_per_trigger_holds_batches_until_max_trigger_delay(spark, broker, tmp_path):
    topic = "src-min"
    create(broker, topic)
    seen: list[tuple[float, list]] = []

    def collect(batch_df, batch_id):
        seen.append((time.monotonic(), sorted(bytes(r.value) for r in batch_df.collect())))

    def wait_for(condition):
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline and query.exception() is None, query.exception()
            time.sleep(0.1)

    df = stream(spark, broker, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger=10, maxTriggerDelay="6s")
    query = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start()
    writer = Writer(broker.bootstrap, topic)
    try:
        writer.transaction(values("many", 10))  # 11 offsets >= 10: a batch at once
        wait_for(lambda: any(rows for _at, rows in seen))
        many_seen_at = next(at for at, rows in seen if rows)
        writer.transaction(values("few", 2))  # 3 offsets < 10: held until 6 s after the last batch began
        wait_for(lambda: any(rows == values("few", 2) for _at, rows in seen))
        few_seen_at = next(at for at, rows in seen if rows == values("few", 2))
        assert few_seen_at - many_seen_at >= 3, "released by maxTriggerDelay (6 s, less the first batch's run), not before"
        assert sorted(r for _at, rows in seen for r in rows) == sorted(values("many", 10) + values("few", 2))
    finally:
        query.stop()
        writer.close()


def test_offsets_beyond_the_last_stable_offset_name_it_and_the_open_transaction(spark, broker, tmp_path):
    topic = "src-beyond-lso"
    create(broker, topic)
    writer = Writer(broker.bootstrap, topic)
    writer.transaction(values("a", 3))  # 0..2, COMMIT 3
    holder = Writer(broker.bootstrap, topic)
    holder.open(values("open", 2))  # 4, 5: the LSO stays at 4
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        producer_id = admin.describe_transactions([holder.transactional_id])[0].producer_id
    holder_named = f"an open transaction of producer id {producer_id} (transactional id '{holder.transactional_id}') begins there"
    with pytest.raises(Exception) as raised:
        batch_read(spark, broker, subscribe=topic, endingOffsets=json.dumps({topic: {"0": 6}}), **{"kafkaConsumer.pollTimeoutMs": 2000})
    message = str(raised.value)
    assert f"Cannot fetch records in [4, 6) of {topic}-0 within kafkaConsumer.pollTimeoutMs=2000: the range ends at 6, beyond the last stable offset of {topic}-0, 4" in message, message[-3000:]
    assert holder_named in message, message[-3000:]
    with pytest.raises(Exception) as raised:
        run_available_now(stream(spark, broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 5}})), tmp_path)
    message = str(raised.value)
    assert f"The starting offset 5 of {topic}-0 is beyond the last stable offset of {topic}-0, 4" in message and "went back" not in message, message[-3000:]
    assert holder_named in message and "-1 is latest in startingOffsets" in message, message[-3000:]
    holder.producer.abort_transaction()
    for each in (writer, holder):
        each.close()
