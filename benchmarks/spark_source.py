"""`onceflow bench` scenario: rows/s through the onceflow Spark source, and
through the source into the exactly-once sink.

One lean local[2] Spark session reads a prepared topic (committed records
of 100 B on two partitions) through ``format("onceflow")`` into Spark's
``noop`` sink in one AvailableNow batch, then the same topic into the
onceflow sink (exactly_once, a topic of two partitions), beside a no-op
Python source that emits the same number of rows of the same schema as
Arrow batches built once per task (the floor: what Spark's Python data
source path costs with no Kafka and no per-row work of a reader at all),
and that floor source into a no-op Python sink (the floor of a Python
source into a Python sink: Spark turns the rows back into Arrow for the
sink's Python worker, which the noop sink never does).
Each is warmed up with a small run first (the first batch of a session pays
Python worker start-up and JIT); the figure is the measured batch's rows
over its trigger execution time, from Spark's progress report. With
``rounds`` > 1 the runs take turns round after round in the one
session, and each figure is the median over the rounds, each ratio the
median of the rounds' ratios (on a shared machine one run's ratio swings
from 1.5x to 2.7x).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

SPARK_ROWS = 1_000_000
PARTITIONS = 2
VALUE = b"s" * 100
FLOOR_BATCH_ROWS = 32_768  # the onceflow source's batches were this size when the floor was set


def spark_session():
    """The benchmarks' session: lean, local[2], one shuffle partition."""
    import streaming.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return streaming.spark.local_session("onceflow-bench", shuffle_partitions=1)


def floor_source_class():
    """A Python streaming source of ``rows`` rows of the Kafka schema whose
    reader yields Arrow batches built once (per task, before its first
    batch, with no Python per row): what Spark's Python data source path
    costs per row with no Kafka and no decoding at all."""
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
            from pyspark.sql.pandas.types import to_arrow_schema

            begin, end = partition.value
            whole = floor_batch(to_arrow_schema(self.schema, timezone="UTC"), begin, end - begin)
            for start in range(0, whole.num_rows, FLOOR_BATCH_ROWS):
                yield whole.slice(start, FLOOR_BATCH_ROWS)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "onceflow_bench_floor"

        def schema(self):
            return kafka_schema(False)

        def streamReader(self, schema):
            return FloorReader(int(self.options.get("rows", SPARK_ROWS)), schema)

    return FloorSource


def floor_sink_class():
    """A Python streaming sink (``DataSourceStreamArrowWriter``) that takes
    every Arrow batch Spark hands its tasks and keeps nothing: what Spark's
    Python sink path costs per row (the rows turned back into Arrow in the
    JVM, streamed to a Python worker) with no Kafka and no encoding. The
    floor source into it is the floor of a Python source into a Python sink."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class FloorWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _batch in iterator:  # taken from Spark and dropped
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId: int) -> None:
            pass

        def abort(self, messages, batchId: int) -> None:
            pass

    class FloorSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return "onceflow_bench_floor_sink"

        def streamWriter(self, schema, overwrite: bool):
            return FloorWriter()

    return FloorSink


def floor_batch(arrow_schema, first_offset: int, count: int):
    """``count`` rows of the Kafka schema in one Arrow record batch, every
    column built by Arrow or numpy from constants (no Python per row):
    null keys, values of ``VALUE``, topic "floor", partition 0, offsets from
    ``first_offset``, timestamp 0."""
    import numpy as np
    import pyarrow as pa

    topic = b"floor"
    topics = pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(topic)), pa.py_buffer(topic * count)])
    values = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(VALUE)), pa.py_buffer(VALUE * count)])
    zeros = np.zeros(count, dtype=np.int32)
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(count, pa.binary()),
            values,
            topics,
            pa.array(zeros),
            pa.array(np.arange(first_offset, first_offset + count, dtype=np.int64)),
            pa.array(np.zeros(count, dtype=np.int64)).cast(arrow_schema.field("timestamp").type),
            pa.array(zeros),
        ],
        schema=arrow_schema,
    )


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


def spark_source_scenario(bootstrap: str, settings, *, sink: bool = True) -> dict:
    """The figures (see the module doc); ``sink=False`` leaves out the
    exactly-once sink's run (the source's figures alone, in a third of the time)."""
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
        spark.dataSource.register(floor_sink_class())

        def onceflow(name: str):
            return spark.readStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap).option("subscribe", name).option("startingOffsets", "earliest")

        def floor(count: int):
            return spark.readStream.format("onceflow_bench_floor").option("rows", str(count))

        def into_floor_sink(frame):
            return frame.select("key", "value").writeStream.format("onceflow_bench_floor_sink")

        def exactly_once(output: str):
            def sink(frame):
                return (frame.select("key", "value").writeStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap)
                        .option("topic", output).option("transactionalIdPrefix", f"bench-{uuid.uuid4().hex[:8]}"))
            return sink

        timed_batch(floor(10_000), work)
        timed_batch(onceflow(warm), work)
        if sink:
            timed_batch(onceflow(warm), work, exactly_once(create_topic(bootstrap)))
            timed_batch(floor(10_000), work, into_floor_sink)
        floors, reads, copies, sink_floors = [], [], [], []
        for _round in range(max(1, getattr(settings, "spark_rounds", 1))):
            floor_rows, floor_seconds = timed_batch(floor(rows), work)
            read_rows, read_seconds = timed_batch(onceflow(topic), work)
            if read_rows != rows or floor_rows != rows:
                raise RuntimeError(f"read {read_rows} (onceflow -> noop) and {floor_rows} (floor) rows of {rows}")
            floors.append(rows / floor_seconds)
            reads.append(rows / read_seconds)
            if sink:
                floor_sink_rows, floor_sink_seconds = timed_batch(floor(rows), work, into_floor_sink)
                if floor_sink_rows != rows:
                    raise RuntimeError(f"read {floor_sink_rows} (floor -> floor sink) rows of {rows}")
                sink_floors.append(rows / floor_sink_seconds)
                output = create_topic(bootstrap)
                copied_rows, copied_seconds = timed_batch(onceflow(topic), work, exactly_once(output))
                if copied_rows != rows:
                    raise RuntimeError(f"read {copied_rows} (onceflow -> onceflow) rows of {rows}")
                written = committed_records(bootstrap, output)
                if written != rows:
                    raise RuntimeError(f"the exactly-once sink's topic holds {written} committed records, not {rows}")
                copies.append(rows / copied_seconds)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures = {
        "rows/s": Metric(statistics.median(reads), "rows/s"),
        "no-op source floor rows/s": Metric(statistics.median(floors), "rows/s"),
        "floor/ours": Metric(statistics.median(f / r for f, r in zip(floors, reads)), "x"),
    }
    if sink:
        figures["into exactly-once sink rows/s"] = Metric(statistics.median(copies), "rows/s")
        figures["floor/into sink"] = Metric(statistics.median(f / c for f, c in zip(floors, copies)), "x")
        figures["floor into no-op sink rows/s"] = Metric(statistics.median(sink_floors), "rows/s")
        figures["sink floor/into sink"] = Metric(statistics.median(f / c for f, c in zip(sink_floors, copies)), "x")
    return figures


if __name__ == "__main__":  # a run on its own: python -m benchmarks.spark_source [rows] [--no-sink] [--rounds N] [KEY=VALUE broker settings ...]
    import argparse

    from faults.process import BrokerProcess

    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_source", description="The Spark source and sink beside the floor (see the module doc).")
    parser.add_argument("arguments", nargs="*", metavar="ROWS | KEY=VALUE", help=f"rows (default {SPARK_ROWS:,}) and settings of the broker process (e.g. transaction.durable.at.end=true)")
    parser.add_argument("--no-sink", action="store_true", help="leave out the exactly-once sink's runs")
    parser.add_argument("--rounds", type=int, default=1, help="floor, source and sink in turn this many times; medians (default 1)")
    options = parser.parse_args()
    broker_settings = [a for a in options.arguments if "=" in a]
    rows = [int(a) for a in options.arguments if "=" not in a]

    class Settings:
        spark_rows = rows[0] if rows else SPARK_ROWS
        spark_rounds = options.rounds

    data = tempfile.mkdtemp(prefix="onceflow-bench-broker-")
    broker = BrokerProcess(os.path.join(data, "broker"), *broker_settings).start()
    try:
        began = time.perf_counter()
        for key, metric in spark_source_scenario(broker.bootstrap, Settings(), sink=not options.no_sink).items():
            print(f"{key:<28}{metric.value:>14,.2f} {metric.unit}")
        print(f"({time.perf_counter() - began:.0f} s)")
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
