"""Interop both ways: what our producer writes, confluent-kafka, kafka-python
and aiokafka read back intact, and what they write our consumer reads, with
keys, headers, timestamps and every compression codec."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import create_topic
from txn import Consumer, Producer, TopicPartition

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
COUNT = 200


def expected_records():
    return [
        (b"key-%d" % i if i % 3 else None, b"value-%d" % i * (1 + i % 5), [("h", b"%d" % i), ("empty", b"")] if i % 2 else [], 1_700_000_000_000 + i)
        for i in range(COUNT)
    ]


def as_comparable(records):
    return [(k, v, [(hk, bytes(hv) if hv is not None else None) for hk, hv in h], t) for k, v, h, t in records]


def read_with_confluent(bootstrap, topic):
    from confluent_kafka import Consumer as ConfluentConsumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "interop", "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([ConfluentPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < COUNT and time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            if message.error() is None:
                out.append((message.key(), message.value(), list(message.headers() or []), message.timestamp()[1]))
    consumer.close()
    return out


def read_with_kafka_python(bootstrap, topic):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest")
    consumer.assign([KafkaPartition(topic, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < COUNT and time.monotonic() < deadline:
        for records in consumer.poll(200).values():
            out += [(r.key, r.value, list(r.headers or []), r.timestamp) for r in records]
    consumer.close()
    return out


def read_with_aiokafka(bootstrap, topic):
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition

    async def read():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioPartition(topic, 0)])
            out, deadline = [], time.monotonic() + 20
            while len(out) < COUNT and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    out += [(r.key, r.value, list(r.headers or []), r.timestamp) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


READERS = {"confluent-kafka": read_with_confluent, "kafka-python": read_with_kafka_python, "aiokafka": read_with_aiokafka}


@pytest.mark.parametrize("codec", CODECS)
def test_theirs_read_what_ours_writes(embedded_broker, codec):
    topic = f"ours-{codec}"
    create_topic(embedded_broker.bootstrap, topic, 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"interop-{codec}", compression_type=codec, linger_ms=20)
    producer.init_transactions()
    with producer.transaction():
        for key, value, headers, timestamp in expected_records():
            producer.send(topic, value, key=key, headers=headers, timestamp=timestamp, partition=0)
    producer.close()
    for name, read in READERS.items():
        assert as_comparable(read(embedded_broker.bootstrap, topic)) == as_comparable(expected_records()), name


def write_with_confluent(bootstrap, topic, codec):
    from confluent_kafka import Producer as ConfluentProducer

    producer = ConfluentProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, "enable.idempotence": True})
    for key, value, headers, timestamp in expected_records():
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=timestamp, partition=0)
    assert producer.flush(20) == 0


def write_with_kafka_python(bootstrap, topic, codec):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=20)
    for key, value, headers, timestamp in expected_records():
        producer.send(topic, value=value, key=key, headers=headers, timestamp_ms=timestamp, partition=0)
    producer.flush(20)
    producer.close()


def write_with_aiokafka(bootstrap, topic, codec):
    from aiokafka import AIOKafkaProducer

    async def write():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=20, enable_idempotence=True)
        await producer.start()
        try:
            for key, value, headers, timestamp in expected_records():
                await producer.send(topic, value=value, key=key, headers=headers, timestamp_ms=timestamp, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(write())


WRITERS = {"confluent-kafka": write_with_confluent, "kafka-python": write_with_kafka_python, "aiokafka": write_with_aiokafka}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_ours_reads_what_theirs_write(embedded_broker, writer, codec):
    topic = f"theirs-{writer}-{codec}"
    create_topic(embedded_broker.bootstrap, topic, 1)
    WRITERS[writer](embedded_broker.bootstrap, topic, codec)
    consumer = Consumer(bootstrap_servers=embedded_broker.bootstrap)
    consumer.assign([TopicPartition(topic, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < COUNT and time.monotonic() < deadline:
        out += consumer.poll(0.2)
    consumer.close()
    got = [(r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp) for r in out]
    assert as_comparable(got) == as_comparable(expected_records())
