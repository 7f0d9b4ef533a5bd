"""`onceflow bench` scenario: rows/s through the onceflow Spark source, and
through the source into the exactly-once sink.

One lean local[2] Spark session reads a prepared topic (committed records
of 100 B on two partitions) through ``format("onceflow")`` into Spark's
``noop`` sink in one AvailableNow batch, then the same topic into the
onceflow sink (exactly_once, a topic of two partitions), beside a no-op
Python source that
emits the same number of rows of the same schema as Arrow batches (the
floor: what Spark's Python data source path costs with no Kafka at all).
Each is warmed up with a small run first (the first batch of a session pays
Python worker start-up and JIT); the figure is the measured batch's rows
over its trigger execution time, from Spark's progress report.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid

SPARK_ROWS = 1_000_000
PARTITIONS = 2
VALUE = b"s" * 100


def spark_session():
    """The benchmarks' session: lean, local[2], one shuffle partition."""
    import streaming.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return streaming.spark.local_session("onceflow-bench", shuffle_partitions=1)


def floor_source_class():
    """A Python streaming source of ``rows`` rows of the Kafka schema, built
    as Arrow batches from constants: Spark's own cost per row."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    from streaming.spark.source import kafka_schema

    class FloorReader(DataSourceStreamReader):
        def __init__(self, rows: int, schema):
            self.rows = rows
            self.schema = schema

        def initialOffset(self) -> dict:
            return {"offset": 0}

        def latestOffset(self) -> dict:
            return {"offset": self.rows}

        def partitions(self, start: dict, end: dict):
            first, last = start["offset"], end["offset"]
            step = -(-(last - first) // PARTITIONS)
            return [InputPartition((begin, min(last, begin + step))) for begin in range(first, last, step)] if last > first else []

        def read(self, partition):
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema

            arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
            begin, end = partition.value
            for start in range(begin, end, 32_768):
                count = min(32_768, end - start)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([None] * count, type=pa.binary()),
                        pa.array([VALUE] * count, type=pa.binary()),
                        pa.array(["floor"] * count, type=pa.string()),
                        pa.array([0] * count, type=pa.int32()),
                        pa.array(range(start, start + count), type=pa.int64()),
                        pa.array([0] * count, type=arrow_schema.field("timestamp").type),
                        pa.array([0] * count, type=pa.int32()),
                    ],
                    schema=arrow_schema,
                )

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "onceflow_bench_floor"

        def schema(self):
            return kafka_schema(False)

        def streamReader(self, schema):
            return FloorReader(int(self.options.get("rows", SPARK_ROWS)), schema)

    return FloorSource


def fill_topic(bootstrap: str, rows: int) -> str:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    for index in range(rows):
        while True:
            try:
                producer.produce(topic, VALUE, partition=index % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.005)
    if producer.flush(300) != 0:
        raise RuntimeError("records left unacknowledged")
    return topic


def create_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-spark-out-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)
    return topic


def committed_records(bootstrap: str, topic: str) -> int:
    """How many records a read_committed reader sees in ``topic``."""
    from txn import Consumer, TopicPartition

    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap_servers=bootstrap, max_poll_records=50_000) as reader:
        reader.assign(partitions)
        ends = reader.end_offsets(partitions)
        count = 0
        while any(reader.position(tp) < ends[tp] for tp in partitions):
            count += len(reader.poll(1.0))
    return count


def timed_batch(reader, work: str, sink=None) -> tuple[int, float]:
    """(rows, seconds) of the one AvailableNow batch of ``reader`` into noop,
    or into what ``sink(frame.writeStream)`` sets up."""
    frame = reader.load()
    writer = sink(frame) if sink is not None else frame.writeStream.format("noop")
    query = writer.option("checkpointLocation", os.path.join(work, uuid.uuid4().hex)).trigger(availableNow=True).start()
    if not query.awaitTermination(600):
        query.stop()
        raise RuntimeError("the Spark query did not finish in 600 s")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return rows, seconds


def spark_source_scenario(bootstrap: str, settings) -> dict:
    from benchmarks.suite import Metric

    import streaming.spark

    rows = settings.spark_rows
    warm = fill_topic(bootstrap, 10_000)
    topic = fill_topic(bootstrap, rows)
    work = tempfile.mkdtemp(prefix="onceflow-bench-spark-")
    spark = spark_session()
    try:
        streaming.spark.register(spark)
        spark.dataSource.register(floor_source_class())

        def onceflow(name: str):
            return spark.readStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap).option("subscribe", name).option("startingOffsets", "earliest")

        def floor(count: int):
            return spark.readStream.format("onceflow_bench_floor").option("rows", str(count))

        def exactly_once(output: str):
            def sink(frame):
                return (frame.select("key", "value").writeStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap)
                        .option("topic", output).option("transactionalIdPrefix", f"bench-{uuid.uuid4().hex[:8]}"))
            return sink

        timed_batch(floor(10_000), work)
        timed_batch(onceflow(warm), work)
        timed_batch(onceflow(warm), work, exactly_once(create_topic(bootstrap)))
        floor_rows, floor_seconds = timed_batch(floor(rows), work)
        read_rows, read_seconds = timed_batch(onceflow(topic), work)
        output = create_topic(bootstrap)
        copied_rows, copied_seconds = timed_batch(onceflow(topic), work, exactly_once(output))
        if read_rows != rows or floor_rows != rows or copied_rows != rows:
            raise RuntimeError(f"read {read_rows} (onceflow -> noop), {copied_rows} (onceflow -> onceflow) and {floor_rows} (floor) rows of {rows}")
        written = committed_records(bootstrap, output)
        if written != rows:
            raise RuntimeError(f"the exactly-once sink's topic holds {written} committed records, not {rows}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    ours, floor_rate, copied = read_rows / read_seconds, floor_rows / floor_seconds, copied_rows / copied_seconds
    return {
        "rows/s": Metric(ours, "rows/s"),
        "no-op source floor rows/s": Metric(floor_rate, "rows/s"),
        "floor/ours": Metric(floor_rate / ours, "x"),
        "into exactly-once sink rows/s": Metric(copied, "rows/s"),
        "floor/into sink": Metric(floor_rate / copied, "x"),
    }


if __name__ == "__main__":  # a run on its own: python -m benchmarks.spark_source [rows]
    from faults.process import BrokerProcess

    class Settings:
        spark_rows = int(sys.argv[1]) if len(sys.argv) > 1 else SPARK_ROWS

    data = tempfile.mkdtemp(prefix="onceflow-bench-broker-")
    broker = BrokerProcess(os.path.join(data, "broker")).start()
    try:
        began = time.perf_counter()
        for key, metric in spark_source_scenario(broker.bootstrap, Settings()).items():
            print(f"{key:<28}{metric.value:>14,.2f} {metric.unit}")
        print(f"({time.perf_counter() - began:.0f} s)")
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
