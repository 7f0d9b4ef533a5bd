"""The onceflow source in a real Spark session (local mode) against a real
broker process, with data written in committed and aborted transactions:
what becomes rows, where each microbatch ends, and every source option."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from txn import Admin, Producer, TopicPartition

pytestmark = pytest.mark.slow


# -- writing known data --------------------------------------------------------------------------


class Writer:
    """Writes records in transactions and remembers what is committed."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.producer = Producer(bootstrap_servers=bootstrap, transactional_id=f"writer-{uuid.uuid4()}", linger_ms=0)
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


@pytest.fixture
def broker(broker_process):
    return broker_process()


def create(broker, topic: str, partitions: int = 1) -> None:
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({topic: partitions})


def stream(spark, broker, **options):
    reader = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def run_available_now(df, tmp_path, timeout: float = 180):
    """Run the query to its end with Trigger.AvailableNow; the rows of each batch."""
    batches: list[tuple[int, list]] = []

    def collect(batch_df, batch_id):
        batches.append((batch_id, batch_df.collect()))

    query = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / f"ckpt-{uuid.uuid4()}")).trigger(availableNow=True).start()
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
