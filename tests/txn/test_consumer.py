"""onceflow's own consumer: read_committed drops aborted transactions and
control batches; read_uncommitted sees all; positions and commits."""

from __future__ import annotations

import time
import uuid

import pytest

from protocol.messages import ApiKey
from tests.helpers import create_topic, raw_request
from txn.consumer import Consumer


def produce_mixed(bootstrap, topic):
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap})
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"mix-{uuid.uuid4()}", "linger.ms": 1})
    transactional.init_transactions(10)
    expected_committed = []
    for round_ in range(4):
        transactional.begin_transaction()
        for i in range(5):
            value = b"t%d-%d" % (round_, i)
            transactional.produce(topic, value=value, partition=0)
            if round_ % 2 == 0:
                expected_committed.append(value)
        plain.produce(topic, value=b"plain-%d" % round_, partition=0)
        plain.flush(10)
        expected_committed.append(b"plain-%d" % round_)
        transactional.flush(10)
        (transactional.commit_transaction if round_ % 2 == 0 else transactional.abort_transaction)(10)
    return expected_committed


def poll_until(consumer, expect):
    """What ``consumer`` (the test's own, positioned as it needs: sought,
    committed after) polls until ``expect`` records came, or 10 s; unlike
    ``tests.helpers.read_all``, which reads a topic from its start with a consumer of its own."""
    seen = []
    for _ in range(50):
        seen.extend(consumer.poll(0.2))
        if len(seen) >= expect:
            break
    return seen


def test_read_committed_and_uncommitted(embedded_broker):
    create_topic(embedded_broker.bootstrap, "mixed", 1)
    expected = produce_mixed(embedded_broker.bootstrap, "mixed")
    committed = Consumer(embedded_broker.bootstrap)
    committed.assign([("mixed", 0)])
    records = poll_until(committed, len(expected))
    assert sorted(r.value for r in records) == sorted(expected), "exactly the committed records, no control records"
    assert [r.offset for r in records] == sorted(r.offset for r in records)
    committed.close()
    everything = Consumer(embedded_broker.bootstrap, isolation_level="read_uncommitted")
    everything.assign([("mixed", 0)])
    assert len(poll_until(everything, 24)) == 24, "20 transactional + 4 plain, markers excluded"
    everything.close()


def test_seek_position_and_simple_commit(embedded_broker):
    from confluent_kafka import Producer

    create_topic(embedded_broker.bootstrap, "seekable", 1)
    producer = Producer({"bootstrap.servers": embedded_broker.bootstrap})
    for i in range(10):
        producer.produce("seekable", value=b"%d" % i)
    producer.flush(10)
    consumer = Consumer(embedded_broker.bootstrap, group_id="own-consumers")
    consumer.assign([("seekable", 0)])
    consumer.seek(("seekable", 0), 7)
    assert [r.value for r in poll_until(consumer, 3)] == [b"7", b"8", b"9"]
    assert consumer.position(("seekable", 0)) == 10
    consumer.commit()
    fetched = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 6, {"group_id": "own-consumers", "topics": None})
    assert fetched["topics"][0]["partitions"][0]["committed_offset"] == 10
    consumer.close()


@pytest.mark.slow
def test_poll_over_wholly_invisible_data_moves_on_without_spinning(broker_process):
    """An aborted transaction fetched whole yields no record: poll moves the
    position past it and waits on the broker, not on a busy loop."""
    from txn import Producer

    broker = broker_process()
    create_topic(broker.bootstrap, "invisible", 1)
    with Producer(bootstrap_servers=broker.bootstrap, transactional_id=f"abort-{uuid.uuid4()}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(50):
            producer.send("invisible", b"aborted-%d" % i, partition=0)
        producer.flush()
        producer.abort_transaction()
    consumer = Consumer(broker.bootstrap)
    consumer.assign([("invisible", 0)])
    consumer.seek(("invisible", 0), 0)
    cpu_before, wall_before = time.process_time(), time.monotonic()
    records = consumer.poll(timeout=3.0)
    cpu_used, wall_used = time.process_time() - cpu_before, time.monotonic() - wall_before
    assert records == []
    assert consumer.position(("invisible", 0)) == 51, "50 aborted records and the ABORT marker are passed"
    assert wall_used >= 2.5, "poll waited out its timeout (nothing visible came)"
    assert cpu_used < 0.5, f"an idle poll over invisible data used {cpu_used:.2f} s of CPU in {wall_used:.2f} s"
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        producer.send("invisible", b"visible", partition=0)
        producer.flush()
    assert [r.value for r in poll_until(consumer, 1)] == [b"visible"]
    consumer.close()


def test_log_append_time_topics_give_the_broker_time_and_type(embedded_broker):
    from txn import Admin, Producer

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"log-append": 1, "create-time": 1}, configs={"log-append": {"message.timestamp.type": "LogAppendTime"}})
    before = int(time.time() * 1000)
    with Producer(bootstrap_servers=embedded_broker.bootstrap) as producer:
        for topic in ("log-append", "create-time"):
            producer.send(topic, b"v", partition=0, timestamp=1_000)
        producer.flush()
    with Consumer(bootstrap_servers=embedded_broker.bootstrap) as consumer:
        consumer.assign([("log-append", 0), ("create-time", 0)])
        consumer.seek(("log-append", 0), 0)
        consumer.seek(("create-time", 0), 0)
        records = {}
        deadline = time.monotonic() + 30
        while len(records) < 2 and time.monotonic() < deadline:
            records.update({r.topic: r for r in consumer.poll(0.5)})
    assert records["create-time"].timestamp == 1_000 and records["create-time"].timestamp_type == 0
    assert records["log-append"].timestamp >= before and records["log-append"].timestamp_type == 1
