"""A broker with many partitions, most of them idle, stopped (SIGKILL or
clean) while transactions are open, idempotent producers are mid-sequence
and tails are torn by hand, then restarted: partitions open when first used
and only those changed since they were last whole are recovered at start
(broker.replica), with every guarantee intact, checked with real clients.
And a crash while a topic is being created leaves the whole topic or none."""

from __future__ import annotations

import os
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from faults.disk import cut_zeros_ahead
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import GRACE_FOR_EXTRAS, create_topic, raw_request

IDLE_TOPICS, IDLE_PARTITIONS = 20, 10  # 200 partitions of one record each
RECOVERY_LINE = re.compile(r"recovery: opened (\d+) partition logs")


def partition_values(bootstrap: str, topic: str, partition: int, *, isolation: str, expect: int, timeout: float = 30.0) -> list[bytes]:
    """The values of one partition from its start, read by a fresh
    confluent-kafka consumer: once ``expect`` are in, it waits a little more
    so that a duplicate or a record that should be hidden still shows up."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}", "isolation.level": isolation, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    enough_at = None
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(100, 0.2):
                assert message.error() is None, message.error()
                values.append(message.value())
            if len(values) >= expect:
                enough_at = enough_at or time.monotonic()
                if time.monotonic() - enough_at >= GRACE_FOR_EXTRAS:
                    break
    finally:
        consumer.close()
    return values


def all_values(bootstrap: str, partitions: list[tuple[str, int]], *, expect: int, timeout: float = 60.0) -> dict[tuple[str, int], list[bytes]]:
    """Every value of many partitions (read_uncommitted), by partition, with one consumer."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0) for topic, partition in partitions])
    values: dict[tuple[str, int], list[bytes]] = {}
    count = 0
    deadline = time.monotonic() + timeout
    enough_at = None
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                assert message.error() is None, message.error()
                values.setdefault((message.topic(), message.partition()), []).append(message.value())
                count += 1
            if count >= expect:
                enough_at = enough_at or time.monotonic()
                if time.monotonic() - enough_at >= GRACE_FOR_EXTRAS:
                    break
    finally:
        consumer.close()
    return values


def last_stable_offset(port: int, topic: str, partition: int) -> int:
    body = {"replica_id": -1, "isolation_level": 1, "topics": [{"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}]}
    answer = raw_request(port, ApiKey.LIST_OFFSETS, 5, body)["topics"][0]["partitions"][0]
    assert answer["error_code"] == ErrorCode.NONE
    return answer["offset"]


def produce_raw(port: int, topic: str, partition: int, data: bytes) -> tuple[int, int]:
    """One acks=all Produce of ``data``; (error code, base offset)."""
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 15000, "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}]}
    answer = raw_request(port, ApiKey.PRODUCE, 8, body)["responses"][0]["partition_responses"][0]
    return answer["error_code"], answer["base_offset"]


def idempotent_batch(producer_id: int, sequence: int) -> bytes:
    """Two records, the sequence's own values, as an idempotent producer sends them."""
    return encode_batch([(None, b"seq-%d-%d" % (sequence, i), (), 1_000) for i in range(2)], producer_id=producer_id, producer_epoch=0, base_sequence=2 * sequence)


def transactional_producer(bootstrap: str, name: str) -> Producer:
    # Open across the restart and the checks after it: a long timeout, so
    # the coordinator does not abort them first.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": name, "linger.ms": 0, "transaction.timeout.ms": 600_000})
    producer.init_transactions(30)
    return producer


def recovered_at_start(broker) -> int:
    """How many partition logs the last start opened (and recovered), from its log."""
    found = RECOVERY_LINE.findall(broker.read_log())
    assert found, "the start logged its recovery summary"
    return int(found[-1])


def active_segment(data_dir: str, topic: str, partition: int) -> str:
    directory = os.path.join(data_dir, f"{topic}-{partition}")
    return os.path.join(directory, sorted(name for name in os.listdir(directory) if name.endswith(".log"))[-1])


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigkill", "clean"])
def test_restart_with_many_idle_partitions_keeps_every_guarantee(broker_process, stop):
    broker = broker_process()
    bootstrap = broker.bootstrap
    # 200 idle partitions with one acknowledged record each, then a clean
    # restart: from now on they are whole and untouched.
    for index in range(IDLE_TOPICS):
        create_topic(bootstrap, f"idle{index}", IDLE_PARTITIONS)
    create_topic(bootstrap, "data", 6)
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for index in range(IDLE_TOPICS):
        for partition in range(IDLE_PARTITIONS):
            plain.produce(f"idle{index}", b"idle-%d-%d" % (index, partition), partition=partition)
    assert plain.flush(30) == 0
    broker.restart(clean=True)
    assert recovered_at_start(broker) == 0, "after a clean stop nothing is opened at start"

    # What is in flight when the broker stops:
    for i in range(3):
        plain.produce("data", b"plain-%d" % i, partition=0)
    for partition in (4, 5):
        for i in range(5):
            plain.produce("data", b"torn-%d-%d" % (partition, i), partition=partition)
    assert plain.flush(30) == 0
    # an open transaction on data-0 (after the plain records) to be committed later ...
    to_commit = transactional_producer(bootstrap, "to-commit")
    to_commit.begin_transaction()
    for i in range(2):
        to_commit.produce("data", b"late-commit-%d" % i, partition=0)
    assert to_commit.flush(30) == 0
    # ... one on data-1 to be aborted later ...
    to_abort = transactional_producer(bootstrap, "to-abort")
    to_abort.begin_transaction()
    to_abort.produce("data", b"late-abort", partition=1)
    assert to_abort.flush(30) == 0
    # ... one committed and one aborted on data-2 ...
    done = transactional_producer(bootstrap, "done")
    for value, commit in ((b"committed", True), (b"aborted", False)):
        done.begin_transaction()
        done.produce("data", value, partition=2)
        (done.commit_transaction if commit else done.abort_transaction)(30)
    # ... and an idempotent producer mid-sequence on data-3.
    producer_id = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000})["producer_id"]
    for sequence in range(3):
        assert produce_raw(broker.port, "data", 3, idempotent_batch(producer_id, sequence)) == (ErrorCode.NONE, 2 * sequence)
    assert last_stable_offset(broker.port, "data", 0) == 3, "the open transaction holds the LSO"

    if stop == "sigkill":
        broker.kill()
        # Torn tails as a crash leaves them: the start of a batch's header on
        # data-4, garbage claiming a huge batch on data-5.
        with open(active_segment(broker.data_dir, "data", 4), "rb") as file:
            head = file.read(29)
        for partition in (4, 5):
            cut_zeros_ahead(active_segment(broker.data_dir, "data", partition))  # torn writes land at the data's end
        with open(active_segment(broker.data_dir, "data", 4), "ab") as file:
            file.write(head)
        with open(active_segment(broker.data_dir, "data", 5), "ab") as file:
            file.write(b"\x00" * 8 + b"\x7f\xff\xff\xff" + os.urandom(40))
        broker.start()
        opened = recovered_at_start(broker)
        # data's six partitions and the __transaction_state partitions of the
        # three transactional ids at most: never the 200 idle ones.
        assert 6 <= opened <= 6 + 3, f"recovered {opened} partitions at start"
    else:
        broker.restart(clean=True)
        assert recovered_at_start(broker) == 0
    bootstrap = broker.bootstrap

    # Every acknowledged record is there; torn tails are gone; new appends follow.
    for partition in (4, 5):
        plain.produce("data", b"after-%d" % partition, partition=partition)
    assert plain.flush(30) == 0
    for partition in (4, 5):
        expected = [b"torn-%d-%d" % (partition, i) for i in range(5)] + [b"after-%d" % partition]
        assert partition_values(bootstrap, "data", partition, isolation="read_uncommitted", expect=6) == expected

    # Open transactions still hold the LSO; read_committed sees exactly the committed records.
    assert last_stable_offset(broker.port, "data", 0) == 3
    assert partition_values(bootstrap, "data", 0, isolation="read_committed", expect=3) == [b"plain-0", b"plain-1", b"plain-2"]
    assert partition_values(bootstrap, "data", 1, isolation="read_committed", expect=0, timeout=3) == []
    assert partition_values(bootstrap, "data", 2, isolation="read_committed", expect=1) == [b"committed"]
    assert partition_values(bootstrap, "data", 0, isolation="read_uncommitted", expect=5)[3:] == [b"late-commit-0", b"late-commit-1"]
    to_commit.commit_transaction(60)
    to_abort.abort_transaction(60)
    assert partition_values(bootstrap, "data", 0, isolation="read_committed", expect=5) == [b"plain-0", b"plain-1", b"plain-2", b"late-commit-0", b"late-commit-1"]
    assert partition_values(bootstrap, "data", 1, isolation="read_committed", expect=0, timeout=3) == []
    assert last_stable_offset(broker.port, "data", 1) == 2, "the abort marker released the LSO"

    # The idempotent producer's state came back: a retry is answered with its
    # first offsets and not appended again; the sequence goes on; a gap is refused.
    assert produce_raw(broker.port, "data", 3, idempotent_batch(producer_id, 2)) == (ErrorCode.NONE, 4)
    assert produce_raw(broker.port, "data", 3, idempotent_batch(producer_id, 3)) == (ErrorCode.NONE, 6)
    assert produce_raw(broker.port, "data", 3, idempotent_batch(producer_id, 5))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    expected = [b"seq-%d-%d" % (sequence, i) for sequence in range(4) for i in range(2)]
    assert partition_values(bootstrap, "data", 3, isolation="read_uncommitted", expect=8) == expected
    idle = [(f"idle{index}", partition) for index in range(IDLE_TOPICS) for partition in range(IDLE_PARTITIONS)]
    expected = {(topic, partition): [b"idle-%s-%d" % (topic[len("idle"):].encode(), partition)] for topic, partition in idle}
    assert all_values(bootstrap, idle, expect=len(idle)) == expected
    for producer in (to_commit, to_abort, done):
        producer.flush(5)


@pytest.mark.slow
@pytest.mark.parametrize("point, exists", [("replicas.topics_registering", False), ("replicas.topic_registered", True)])
def test_a_crash_while_a_topic_is_created_leaves_all_of_it_or_none(broker_process, point, exists):
    broker = broker_process()
    broker.restart(clean=False, env={"ONCEFLOW_CRASH_POINTS": f"{point}@1:exit"})
    with pytest.raises(Exception):
        create_topic(broker.bootstrap, "half", 40, timeout=10)
    assert broker.process.wait(30) == 86, "the crash point ended the broker"
    broker.env = None  # disarmed from here on
    broker.start()
    metadata = raw_request(broker.port, ApiKey.METADATA, 9, {"topics": [{"name": "half"}], "allow_auto_topic_creation": False})["topics"][0]
    if not exists:
        assert metadata["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert not [name for name in os.listdir(broker.data_dir) if name.startswith("half-")], "no directory of the topic is left"
        create_topic(broker.bootstrap, "half", 40)
    else:
        assert metadata["error_code"] == ErrorCode.NONE and len(metadata["partitions"]) == 40, "the whole topic is there"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0})
    for partition in range(40):
        producer.produce("half", b"p%d" % partition, partition=partition)
    assert producer.flush(30) == 0
    for partition in (0, 17, 39):
        assert partition_values(broker.bootstrap, "half", partition, isolation="read_uncommitted", expect=1) == [b"p%d" % partition]
    # And it stops and starts again like any topic.
    broker.restart(clean=False)
    assert partition_values(broker.bootstrap, "half", 39, isolation="read_uncommitted", expect=1) == [b"p39"]


def test_retention_reaches_partitions_not_opened_since_start(tmp_path):
    """Housekeeping opens a partition left closed since start only when it has
    segments to delete or clean; one with a single segment stays closed."""
    from broker.broker import EmbeddedBroker
    from tests.helpers import wait_for

    data_dir = str(tmp_path / "data")
    segments = lambda topic: sorted(name for name in os.listdir(os.path.join(data_dir, f"{topic}-0")) if name.endswith(".log"))  # noqa: E731
    with EmbeddedBroker(data_dir) as embedded:

        def fill(broker):
            broker.replicas.create_topic("expiring", 1, {"segment.bytes": "200", "retention.ms": "1000"})
            broker.replicas.create_topic("quiet", 1)
            for name, count in (("expiring", 12), ("quiet", 1)):
                partition_log = broker.replicas.get_log(name, 0)
                for i in range(count):
                    partition_log.append(encode_batch([(b"k", b"v%d" % i * 20, (), 1_000 + i)]))  # timestamps long past
                partition_log.flush()

        embedded.call(fill)
    assert len(segments("expiring")) > 3
    with EmbeddedBroker(data_dir, properties={"log.retention.check.interval.ms": "100"}) as embedded:
        wait_for(lambda: len(segments("expiring")) == 1, timeout=30, what="retention to delete the old segments")
        assert embedded.call(lambda broker: broker.replicas.get_log("expiring", 0).log_start_offset) == 11
        time.sleep(0.3)  # a few more housekeeping rounds
        assert not embedded.call(lambda broker: broker.replicas.is_open("quiet", 0)), "a single segment: nothing to do, left closed"


def test_the_coordinators_open_at_start_only_their_partitions_that_hold_records(tmp_path):
    """Of the 50 + 50 internal partitions, a start opens and replays only
    those holding records; the others open when first written. What was
    replayed is all there: a committed offset, a transaction left open over a
    clean stop (still holding the LSO until its producer's successor aborts
    it), and a transactional id whose partition was not opened at start
    works at once."""
    from broker.broker import EmbeddedBroker
    from coordinator.state import TxnState
    from protocol.partitioning import partition_for
    from storage.recovery import holds_data

    internal = ("__transaction_state", "__consumer_offsets")
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0) as embedded:
        create_topic(embedded.bootstrap, "data", 2)
        committed = transactional_producer(embedded.bootstrap, "committed")
        committed.begin_transaction()
        committed.produce("data", b"committed", partition=0)
        group = Consumer({"bootstrap.servers": embedded.bootstrap, "group.id": "readers"})
        committed.send_offsets_to_transaction([TopicPartition("data", 1, 7)], group.consumer_group_metadata(), 30)
        committed.commit_transaction(30)
        group.close()
        left_open = transactional_producer(embedded.bootstrap, "left-open")
        left_open.begin_transaction()
        left_open.produce("data", b"left-open", partition=0)
        assert left_open.flush(30) == 0
    holding = {(topic, partition) for topic in internal for partition in range(50) if holds_data(os.path.join(data_dir, f"{topic}-{partition}"))}
    assert holding and len(holding) <= 4, holding  # the two ids' partitions, the group's, the markers'

    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0) as embedded:
        opened = embedded.call(lambda broker: {key for key in broker.replicas.logs if key[0] in internal})
        assert opened == holding, "exactly the internal partitions holding records were opened"
        state = embedded.call(lambda broker: broker.transactions.coordinator.txns["left-open"].state)
        assert state == TxnState.ONGOING, "the open transaction was replayed"
        reader = Consumer({"bootstrap.servers": embedded.bootstrap, "group.id": "readers", "enable.auto.commit": False})
        assert reader.committed([TopicPartition("data", 1)], timeout=30)[0].offset == 7
        reader.close()
        assert last_stable_offset(embedded.port, "data", 0) == 2, "the open transaction still holds the LSO"
        successor = transactional_producer(embedded.bootstrap, "left-open")  # fences and aborts its predecessor's transaction
        fresh_id = next(name for name in (f"fresh-{index}" for index in range(1000)) if ("__transaction_state", partition_for(name, 50)) not in opened)
        fresh = transactional_producer(embedded.bootstrap, fresh_id)
        fresh.begin_transaction()
        fresh.produce("data", b"fresh", partition=0)
        fresh.commit_transaction(30)
        assert partition_values(embedded.bootstrap, "data", 0, isolation="read_committed", expect=2) == [b"committed", b"fresh"]
        for producer in (committed, left_open, successor, fresh):
            producer.flush(0)
