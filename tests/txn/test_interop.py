"""Interop both ways: what our producer writes, confluent-kafka, kafka-python
and aiokafka read back intact, and what they write our consumer reads, with
keys, headers, timestamps and every compression codec."""

from __future__ import annotations

import time

import pytest

from tests.helpers import INTEROP_COUNT, INTEROP_READERS, INTEROP_WRITERS, as_comparable, create_topic, interop_records
from txn import Consumer, Producer, TopicPartition

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
@pytest.mark.parametrize("codec", CODECS)
def test_theirs_read_what_ours_writes(embedded_broker, codec):
    topic = f"ours-{codec}"
    create_topic(embedded_broker.bootstrap, topic, 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"interop-{codec}", compression_type=codec, linger_ms=20)
    producer.init_transactions()
    with producer.transaction():
        for key, value, headers, timestamp in interop_records():
            producer.send(topic, value, key=key, headers=headers, timestamp=timestamp, partition=0)
    producer.close()
    for name, read in INTEROP_READERS.items():
        assert as_comparable(read(embedded_broker.bootstrap, topic)) == as_comparable(interop_records()), name




@pytest.mark.parametrize("writer", sorted(INTEROP_WRITERS))
@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_ours_reads_what_theirs_write(embedded_broker, writer, codec):
    topic = f"theirs-{writer}-{codec}"
    create_topic(embedded_broker.bootstrap, topic, 1)
    INTEROP_WRITERS[writer](embedded_broker.bootstrap, topic, codec)
    consumer = Consumer(bootstrap_servers=embedded_broker.bootstrap)
    consumer.assign([TopicPartition(topic, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < INTEROP_COUNT and time.monotonic() < deadline:
        out += consumer.poll(0.2)
    consumer.close()
    got = [(r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp) for r in out]
    assert as_comparable(got) == as_comparable(interop_records())
