"""The producer's column API (``send_columns``): records given as Arrow
columns, one future per call, land exactly as the per-record API would put
them (murmur2 partitions, order, sequences through connection cuts), are
read back exactly by confluent-kafka and kafka-python, and wait for room in
``buffer_memory`` (at most ``max_block_ms``) instead of piling up."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.columnar import HEADERS_TYPE
from protocol.partitioning import murmur2
from tests.helpers import as_comparable, connections_cut_every, create_topic, interop_records, read_all, read_partition, read_with_confluent, read_with_kafka_python
from txn import Producer
from txn.column_batches import murmur2_partitions, plan_batches
from txn.errors import BufferExhaustedError


def as_columns(records):
    keys, values, headers, timestamps = zip(*records)
    return (
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], HEADERS_TYPE),
        pa.array(timestamps, pa.int64()),
    )


# -- pure parts ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), min_size=1, max_size=60), st.integers(1, 50), st.integers(0, 5))
def test_vectorised_murmur2_is_kafkas_key_for_key(keys, partitions, skip):
    column = pa.array(keys, pa.binary())[min(skip, len(keys) - 1) :]  # a sliced column too
    got = murmur2_partitions(column, partitions)
    for key, partition in zip(column.to_pylist(), got.tolist()):
        if key is not None:
            assert partition == (murmur2(key) & 0x7FFFFFFF) % partitions


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300)), max_size=80), st.integers(1, 1000))
def test_planned_batches_cover_every_row_once_within_the_limit(rows, limit):
    rows.sort(key=lambda r: r[0])  # ordered by partition, as send_columns orders them
    partitions = np.array([p for p, _ in rows], dtype=np.int32)
    sizes = np.array([s for _, s in rows], dtype=np.int64)
    planned = plan_batches(partitions, sizes, limit)
    covered = [i for batch in planned for i in range(batch.start, batch.stop)]
    assert covered == list(range(len(rows)))
    for batch in planned:
        assert set(partitions[batch.start : batch.stop].tolist()) == {batch.partition}
        assert batch.stop - batch.start == 1 or sizes[batch.start : batch.stop].sum() <= limit


# -- against our broker -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_columns_written_by_us_are_read_back_exactly_by_confluent_and_kafka_python(embedded_broker, codec):
    topic = f"columns-{codec}"
    create_topic(embedded_broker.bootstrap, topic, 1)
    key, value, headers, timestamp = as_columns(interop_records())
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"columns-{codec}-{uuid.uuid4()}", compression_type=codec, batch_size=1500)
    producer.init_transactions()
    with producer.transaction():
        outcome = producer.send_columns(topic, value[:120], key[:120], partition=0, headers=headers[:120], timestamp=timestamp[:120])
        rest = producer.send_columns(topic, value[120:], key[120:], partition=0, headers=headers[120:], timestamp=timestamp[120:])
    batches = outcome.result(10) + rest.result(10)
    producer.close()
    assert len(batches) > 4, "batch_size cut the columns into several batches"
    assert sum(b.count for b in batches) == len(interop_records())
    assert [b.offset for b in batches] == sorted(b.offset for b in batches)
    for name, read in {"confluent-kafka": read_with_confluent, "kafka-python": read_with_kafka_python}.items():
        assert as_comparable(read(embedded_broker.bootstrap, topic)) == as_comparable(interop_records()), name


def test_keys_land_where_the_per_record_api_puts_them_in_order(embedded_broker):
    create_topic(embedded_broker.bootstrap, "keyed-columns", 5)
    keys = [None if i % 7 == 0 else b"user-%d" % (i % 37) for i in range(3000)]
    values = [b"%05d" % i for i in range(3000)]
    with Producer(bootstrap_servers=embedded_broker.bootstrap, batch_size=2048) as producer:
        producer.send_columns("keyed-columns", pa.array(values), pa.array(keys, pa.binary())).result(30)
    by_partition = {p: [] for p in range(5)}
    for record in read_all(embedded_broker.bootstrap, "keyed-columns", 5, to_end=True):
        by_partition[record.partition].append(record)
    keyless_partitions = {p for p, records in by_partition.items() for r in records if r.key is None}
    assert len(keyless_partitions) == 1, "a call's keyless rows stick to one partition"
    for partition, records in by_partition.items():
        for r in records:
            if r.key is not None:
                assert partition == (murmur2(r.key) & 0x7FFFFFFF) % 5
        assert [r.value for r in records] == sorted(r.value for r in records), "a partition's rows keep their order"
    assert sorted(r.value for records in by_partition.values() for r in records) == values


@pytest.mark.slow
def test_columns_and_single_records_keep_call_order_and_sequences_through_connection_cuts(embedded_broker):
    create_topic(embedded_broker.bootstrap, "columns-cuts", 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, batch_size=600, linger_ms=0, retry_backoff_ms=10)
    expected, outcomes = [], []
    with connections_cut_every(producer, 0.05):
        for round_ in range(30):
            values = [b"c%03d-%04d" % (round_, i) for i in range(200)]
            outcomes.append(producer.send_columns("columns-cuts", pa.array(values), partition=0))
            single = b"s%03d" % round_
            outcomes.append(producer.send("columns-cuts", single, partition=0))
            expected += values + [single]
        producer.flush(120)
    for outcome in outcomes:
        outcome.result(10)
    producer.close()
    records = read_partition(embedded_broker.bootstrap, "columns-cuts", 0, len(expected))
    assert [r.value for r in records] == expected, "every record once, in call order"


def test_bad_columns_are_refused_before_anything_is_queued(embedded_broker):
    create_topic(embedded_broker.bootstrap, "bad-columns", 2)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"bad-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(ValueError, match="partition 2 is not one of the topic's 2"):
        producer.send_columns("bad-columns", pa.array([b"a", b"b"]), partition=pa.array([0, 2], pa.int32()))
    with pytest.raises(TypeError, match="value column must be binary or string"):
        producer.send_columns("bad-columns", pa.array([1, 2]))
    with pytest.raises(ValueError, match="differ in length"):
        producer.send_columns("bad-columns", pa.array([b"a"]), pa.array([b"k", b"l"]))
    assert not any(q.records for q in producer._async._queues.values())
    producer.send_columns("bad-columns", pa.array([b"kept"]), partition=1)
    producer.commit_transaction()
    producer.close()
    assert [r.value for r in read_partition(embedded_broker.bootstrap, "bad-columns", 1, 1)] == [b"kept"]


@pytest.mark.slow
@pytest.mark.parametrize("send", ["columns", "records"])
def test_a_full_buffer_makes_a_sender_wait_and_then_time_out(broker_process, send):
    """Columns and single records alike count against ``buffer_memory``
    until acknowledged: sends wait for room, and when the broker stops
    answering, fail after ``max_block_ms`` with BufferExhaustedError. (Single
    records were not counted at all before: they piled up without bound.)"""
    broker = broker_process()
    create_topic(broker.bootstrap, "buffered", 1)
    producer = Producer(bootstrap_servers=broker.bootstrap, batch_size=16_384, buffer_memory=65_536, max_block_ms=1500)
    values = pa.array([b"v" * 1000] * 2000)  # about 2 MB: 32 times the buffer

    def send_all():
        if send == "columns":
            return [producer.send_columns("buffered", values, partition=0)]
        return [producer.send("buffered", b"v" * 1000, partition=0) for _ in range(2000)]

    peak = 0
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, producer._async._buffered)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for outcome in send_all():
        outcome.result(60)
    done.set()
    watcher.join()
    assert 0 < peak <= 65_536, "what waits to be sent stays within buffer_memory"
    assert producer._async._buffered == 0
    os.kill(broker.process.pid, signal.SIGSTOP)  # the broker stops answering: nothing is acknowledged
    try:
        began = time.monotonic()
        with pytest.raises(BufferExhaustedError, match="buffer_memory"):
            send_all()
        assert 1.4 < time.monotonic() - began < 30
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)
    producer.close(30)
