"""``poll_columns``: the consumer's fetches as Arrow columns, against a broker
process, beside ``poll``'s records of the same partitions: every field,
both isolation levels, aborted transactions, compressed batches,
LogAppendTime, a start in the middle of a batch, the position after; what
librdkafka, kafka-python and aiokafka write, with every codec; and a first
batch that never comes whole fails as ``poll`` fails."""

from __future__ import annotations

import asyncio
import time

import pytest

from protocol.columnar import FETCHED_SCHEMA
from protocol.records import encode_batch
from tests.helpers import INTEROP_COUNT, INTEROP_WRITERS, as_comparable, interop_records
from txn import Admin, Consumer, Producer, RecordBatchTooLargeError, TopicPartition
from txn.aio import Consumer as AsyncConsumer
from txn.config import ConsumerConfig
from txn.fetcher import fetched_partition, fetched_partition_columns


TOPICS = {"mixed": 2, "appended": 1}


@pytest.fixture(scope="module")
def broker(module_broker):
    """The module's broker process (``tests.conftest.module_broker``),
    filled: "mixed" holds transactions (every third aborted) from a gzip
    and an lz4 producer, with headers and null keys; "appended" stamps
    LogAppendTime."""
    process = module_broker
    with Admin(bootstrap_servers=process.bootstrap) as admin:
        admin.create_topics(TOPICS, configs={"appended": {"message.timestamp.type": "LogAppendTime"}})
    for number, codec in enumerate(["gzip", "lz4"]):
        producer = Producer(bootstrap_servers=process.bootstrap, transactional_id=f"columns-{number}", compression_type=codec, linger_ms=5)
        producer.init_transactions()
        for transaction in range(9):
            producer.begin_transaction()
            for n in range(30):
                key = None if n % 4 == 0 else b"k%d" % n
                headers = [("n", b"%d" % n), ("empty", None)] if n % 3 == 0 else None
                value = None if n == 7 else b"%d-%d-%d-" % (number, transaction, n) + b"x" * (n * 5)
                producer.send("mixed", value, key=key, partition=n % 2, headers=headers, timestamp=1_700_000_000_000 + n)
            producer.flush()  # in the log before the marker, aborted or not
            if transaction % 3 == 2:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
        producer.close()
    with Producer(bootstrap_servers=process.bootstrap) as producer:
        for n in range(50):
            producer.send("appended", b"a%d" % n, partition=0, timestamp=5)
    return process


def as_row(record) -> dict:
    return {
        "key": record.key,
        "value": record.value,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestamp_type": record.timestamp_type,
        "headers": [{"key": key, "value": value} for key, value in record.headers],
    }


async def read_all(bootstrap: str, isolation: str, columnar: bool, start: dict, max_records: int | None = None, **options) -> tuple[dict, dict]:
    """Every visible row of every partition from ``start`` on, and the positions at the end."""
    consumer = AsyncConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, **options)
    partitions = [TopicPartition(topic, index) for topic, count in TOPICS.items() for index in range(count)]
    consumer.assign(partitions)
    for tp in partitions:
        consumer.seek(tp, start.get(tp, 0))
    ends = await consumer.end_offsets(partitions)
    rows: dict = {tp: [] for tp in partitions}
    deadline = time.monotonic() + 30
    try:
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]) and time.monotonic() < deadline:
            if columnar:
                polled = await consumer.poll_columns(0.5, max_records)
                assert max_records is None or sum(batch.num_rows for batch in polled.values()) <= max_records
                for tp, batch in polled.items():
                    assert batch.schema == FETCHED_SCHEMA
                    rows[tp] += batch.to_pylist()
            else:
                for record in await consumer.poll(0.5):
                    rows[record.topic_partition] += [as_row(record)]
        positions = {tp: await consumer.position(tp) for tp in partitions}
    finally:
        await consumer.close()
    return rows, positions


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_columns_hold_what_poll_hands_out(broker, isolation):
    start = {TopicPartition("mixed", 1): 17, TopicPartition("appended", 0): 3}  # inside a batch
    records, record_positions = asyncio.run(read_all(broker.bootstrap, isolation, False, start, max_poll_records=50))
    columns, column_positions = asyncio.run(read_all(broker.bootstrap, isolation, True, start))
    assert columns == records
    assert column_positions == record_positions
    mixed = records[TopicPartition("mixed", 0)] + records[TopicPartition("mixed", 1)]
    # 2 producers x 6 committed (9 in all) transactions x 30 records, less the
    # 16 before offset 17 of mixed-1 (15 records and the first marker, then one)
    assert len(mixed) == 2 * (6 if isolation == "read_committed" else 9) * 30 - 16
    assert any(row["headers"] for row in mixed) and any(row["key"] is None for row in mixed) and any(row["value"] is None for row in mixed)
    appended = records[TopicPartition("appended", 0)]
    assert [row["offset"] for row in appended] == list(range(3, 50))
    assert all(row["timestamp_type"] == 1 and row["timestamp"] != 5 for row in appended)


def test_columns_a_few_rows_at_a_time(broker):
    """``poll_columns(max_records=7)``: the same rows, never more than 7 a
    call (the rest kept for the next), the position just past the last row
    handed out, and a seek drops the rows kept (the streaming runner polls so)."""
    records, record_positions = asyncio.run(read_all(broker.bootstrap, "read_committed", False, {}))
    columns, column_positions = asyncio.run(read_all(broker.bootstrap, "read_committed", True, {}, max_records=7))
    assert columns == records and column_positions == record_positions

    async def positions_and_seek():
        appended = TopicPartition("appended", 0)
        consumer = AsyncConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_uncommitted")
        consumer.assign([appended])
        consumer.seek(appended, 0)
        offsets = []
        try:
            while len(offsets) < 20:
                for batch in (await consumer.poll_columns(0.5, 7)).values():
                    offsets += batch.column("offset").to_pylist()
                    assert await consumer.position(appended) == offsets[-1] + 1  # not the fetch's end: 50 records came in one
            consumer.seek(appended, 3)
            again = (await consumer.poll_columns(0.5, 7))[appended].column("offset").to_pylist()
        finally:
            await consumer.close()
        return offsets, again

    offsets, again = asyncio.run(positions_and_seek())
    assert offsets == list(range(len(offsets))) and len(offsets) == 21
    assert again == list(range(3, 10))


def test_the_synchronous_consumer_polls_the_same_columns(broker):
    """``txn.Consumer.poll_columns`` (the facade the Spark source reads
    through) hands out what the asyncio consumer's ``poll`` does."""
    partitions = [TopicPartition("mixed", 0), TopicPartition("mixed", 1)]
    records, _ = asyncio.run(read_all(broker.bootstrap, "read_committed", False, {}))
    rows: dict = {tp: [] for tp in partitions}
    with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        ends = consumer.end_offsets(partitions)
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in partitions) and time.monotonic() < deadline:
            for tp, batch in consumer.poll_columns(0.5).items():
                assert batch.schema == FETCHED_SCHEMA
                rows[tp] += batch.to_pylist()
        assert {tp: consumer.position(tp) for tp in partitions} == ends
    assert rows == {tp: records[tp] for tp in partitions}


def test_a_first_batch_that_never_comes_whole_fails_as_poll_fails():
    batch = encode_batch([(b"k", b"v" * 200, (), 1000) for _ in range(10)], base_offset=40)
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:9092", max_partition_fetch_bytes=1024)
    tp = TopicPartition("t", 0)
    for cut in (7, 1024):
        with pytest.raises(RecordBatchTooLargeError) as by_records:
            fetched_partition(batch[:cut], [], tp=tp, fetch_offset=40, config=config)
        with pytest.raises(RecordBatchTooLargeError) as by_columns:
            fetched_partition_columns(batch[:cut], [], tp=tp, fetch_offset=40, config=config)
        assert str(by_columns.value) == str(by_records.value)
    whole_then_cut = fetched_partition_columns(batch + batch[:100], [], tp=tp, fetch_offset=43, config=config)
    assert whole_then_cut.columns.column("offset").to_pylist() == list(range(43, 50)) and whole_then_cut.end == 50


async def read_columns(bootstrap: str, topic: str, count: int) -> list[dict]:
    consumer = AsyncConsumer(bootstrap_servers=bootstrap)
    consumer.assign([TopicPartition(topic, 0)])
    rows: list[dict] = []
    deadline = time.monotonic() + 20
    try:
        while len(rows) < count and time.monotonic() < deadline:
            for batch in (await consumer.poll_columns(0.2)).values():
                rows += batch.to_pylist()
    finally:
        await consumer.close()
    return rows


@pytest.mark.parametrize("writer", sorted(INTEROP_WRITERS))
@pytest.mark.parametrize("codec", ["none", "gzip", "lz4", "zstd", "snappy"])
def test_columns_of_what_other_clients_write(broker, writer, codec):
    """librdkafka, kafka-python and aiokafka encode batches their own ways
    (idempotent or not, each codec): the columns hold their records exactly."""
    topic = f"theirs-{writer}-{codec}"
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({topic: 1})
    INTEROP_WRITERS[writer](broker.bootstrap, topic, codec)
    rows = asyncio.run(read_columns(broker.bootstrap, topic, INTEROP_COUNT))
    got = [(row["key"], row["value"], [(h["key"], h["value"]) for h in row["headers"]], row["timestamp"]) for row in rows]
    assert as_comparable(got) == as_comparable(interop_records())
    assert [row["offset"] for row in rows] == list(range(INTEROP_COUNT))
