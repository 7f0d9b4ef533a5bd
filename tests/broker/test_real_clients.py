"""Three unmodified real Kafka clients against our broker, over real sockets.

Each client creates a topic, produces 10,000 keyed records with headers
across partitions (acks=all), consumes them all back in order per partition,
and lists offsets; then the broker is restarted (cleanly and by SIGKILL) and
everything acknowledged must still be there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import pytest

RECORDS = 10_000
PARTITIONS = 3


def _expected(n: int = RECORDS):
    return [(f"key-{i % 101}".encode(), f"value-{i}".encode(), f"h{i}".encode()) for i in range(n)]


def _check_consumed(consumed: dict[int, list[tuple[int, bytes, bytes, bytes]]], n=RECORDS):
    """Every produced record exactly once; offsets dense and increasing per partition;
    records of one key keep their produce order."""
    seen = []
    for partition, rows in consumed.items():
        offsets = [row[0] for row in rows]
        assert offsets == list(range(len(rows))), f"partition {partition}: offsets not dense from 0"
        seen.extend(rows)
    values = sorted(int(row[2].split(b"-")[1]) for row in seen)
    assert values == list(range(n)), "records lost or duplicated"
    for row in seen:
        index = int(row[2].split(b"-")[1])
        assert row[1] == f"key-{index % 101}".encode()
        assert row[3] == f"h{index}".encode()
    per_key = defaultdict(list)
    for partition, rows in consumed.items():
        for row in rows:
            per_key[row[1]].append((partition, int(row[2].split(b"-")[1])))
    for key, entries in per_key.items():
        assert len({p for p, _ in entries}) == 1, f"key {key} spread over partitions"
        assert [i for _, i in entries] == sorted(i for _, i in entries), f"key {key} out of order"


# --------------------------------------------------------------------------- confluent-kafka


def confluent_create(bootstrap, topic):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    futures[topic].result(30)
    metadata = admin.list_topics(topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == PARTITIONS


def confluent_produce(bootstrap, topic, rows):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False})
    errors = []
    delivered = []

    def on_delivery(error, message):
        if error is not None:
            errors.append(error)
        else:
            delivered.append(message.offset())

    for key, value, header in rows:
        producer.produce(topic, key=key, value=value, headers=[("h", header)], on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert len(delivered) == len(rows)


def confluent_consume(bootstrap, topic, n, partitions=PARTITIONS):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}", "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    consumed = defaultdict(list)
    total = 0
    import time

    deadline = time.monotonic() + 60
    while total < n and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1.0):
            assert message.error() is None, message.error()
            consumed[message.partition()].append((message.offset(), message.key(), message.value(), dict(message.headers())["h"]))
            total += 1
    low_high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)}
    consumer.close()
    return consumed, low_high


# --------------------------------------------------------------------------- kafka-python


def kafka_python_create(bootstrap, topic):
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    admin.close()


def kafka_python_produce(bootstrap, topic, rows):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    futures = [producer.send(topic, key=key, value=value, headers=[("h", header)]) for key, value, header in rows]
    producer.flush(60)
    for future in futures:
        future.get(30)
    producer.close()


def kafka_python_consume(bootstrap, topic, n, partitions=PARTITIONS):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    consumed = defaultdict(list)
    total = 0
    for message in consumer:
        consumed[message.partition].append((message.offset, message.key, message.value, dict(message.headers)["h"]))
        total += 1
        if total >= n:
            break
    beginning = consumer.beginning_offsets(tps)
    end = consumer.end_offsets(tps)
    consumer.close()
    return consumed, {tp.partition: (beginning[tp], end[tp]) for tp in tps}


# --------------------------------------------------------------------------- aiokafka


def aiokafka_create(bootstrap, topic):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
        finally:
            await admin.close()

    asyncio.run(run())


def aiokafka_produce(bootstrap, topic, rows):
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=key, value=value, headers=[("h", header)]) for key, value, header in rows]
            await producer.flush()
            for future in futures:
                await future
        finally:
            await producer.stop()

    asyncio.run(run())


def aiokafka_consume(bootstrap, topic, n, partitions=PARTITIONS):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            consumed = defaultdict(list)
            total = 0
            while total < n:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000, max_records=2000), 30)
                for tp, messages in batches.items():
                    for message in messages:
                        consumed[tp.partition].append((message.offset, message.key, message.value, dict(message.headers)["h"]))
                        total += 1
            beginning = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)
            return consumed, {tp.partition: (beginning[tp], end[tp]) for tp in tps}
        finally:
            await consumer.stop()

    return asyncio.run(run())


CLIENTS = {
    "confluent-kafka": (confluent_create, confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_create, kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_create, aiokafka_produce, aiokafka_consume),
}


def _round_trip(client, bootstrap, topic, rows):
    create, produce, consume = CLIENTS[client]
    create(bootstrap, topic)
    produce(bootstrap, topic, rows)
    consumed, watermarks = consume(bootstrap, topic, len(rows))
    _check_consumed(consumed, len(rows))
    assert sum(high for _low, high in watermarks.values()) == len(rows)
    assert all(low == 0 for low, _high in watermarks.values())
    return consumed


@pytest.mark.slow
@pytest.mark.parametrize("client", list(CLIENTS))
def test_produce_consume_list_offsets(client, embedded_broker):
    _round_trip(client, embedded_broker.bootstrap, f"t-{client}", _expected())


@pytest.mark.slow
@pytest.mark.parametrize("restart", ["clean", "sigkill"])
@pytest.mark.parametrize("client", list(CLIENTS))
def test_acknowledged_records_survive_restart(client, restart, broker_process):
    broker = broker_process()
    topic = f"r-{client}"
    rows = _expected()
    before = _round_trip(client, broker.bootstrap, topic, rows)
    broker.restart(clean=(restart == "clean"))
    consume = CLIENTS[client][2]
    after, watermarks = consume(broker.bootstrap, topic, len(rows))
    assert after == before
    assert sum(high for _low, high in watermarks.values()) == len(rows)


@pytest.mark.parametrize("client", list(CLIENTS))
def test_smoke_each_client(client, embedded_broker):
    """The fast set's version of the round trip: 300 records per client."""
    _round_trip(client, embedded_broker.bootstrap, f"smoke-{client}", _expected(300))
