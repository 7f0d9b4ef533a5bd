"""The clients' fault-injection hook, ``cut_connections()``, over a real
broker: every socket of the client is reset, the client reconnects by
itself, and nothing is lost or doubled (a transaction open across the cut
commits once; a consumer cut mid-read goes on from where it was)."""

from __future__ import annotations

import time

import pytest

from broker.broker import EmbeddedBroker
from tests.helpers import create_topic, scrape
from txn import Consumer, Producer, TopicPartition

OPENED = "onceflow_connections_opened_total"


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(str(tmp_path / "data"), metrics_address=("127.0.0.1", 0)) as running:
        yield running


def opened(broker) -> float:
    return scrape(broker).value(OPENED, listener="PLAINTEXT")


def test_a_cut_producer_and_consumer_reconnect_and_lose_nothing(broker):
    create_topic(broker.bootstrap, "cut", 1)
    producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id="cut-once", retry_backoff_ms=10)
    producer.init_transactions()
    producer.begin_transaction()
    for index in range(20):
        producer.send("cut", f"{index}".encode(), partition=0)
    producer.flush()
    before = opened(broker)
    producer.cut_connections()
    for index in range(20, 40):
        producer.send("cut", f"{index}".encode(), partition=0)
    producer.commit_transaction()
    producer.close()
    assert opened(broker) > before, "the producer wrote again without a new connection: nothing was cut"

    consumer = Consumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed", max_poll_records=10)
    consumer.assign([TopicPartition("cut", 0)])
    values: list[str] = []
    deadline = time.monotonic() + 15
    while len(values) < 10 and time.monotonic() < deadline:
        values += [record.value.decode() for record in consumer.poll(0.5)]
    before = opened(broker)
    consumer.cut_connections()
    while len(values) < 40 and time.monotonic() < deadline:
        values += [record.value.decode() for record in consumer.poll(0.5)]
    values += [record.value.decode() for record in consumer.poll(0.3)]  # nothing more should come
    consumer.close()
    assert opened(broker) > before, "the consumer read on without a new connection: nothing was cut"
    assert values == [f"{index}" for index in range(40)]
