"""Topic administration through a real admin client, persisted across restarts;
broker start-up failures are clear; ListOffsets by timestamp; Fetch long-poll."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, BrokerProcess


def admin(bootstrap):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def describe_topic_config(client, topic):
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource("topic", topic)
    result = client.describe_configs([resource])[resource].result(10)
    return {name: entry.value for name, entry in result.items()}


def test_topic_config_partitions_and_delete_persist_across_restart(broker_process):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    broker = broker_process()
    client = admin(broker.bootstrap)
    futures = client.create_topics(
        [NewTopic("configured", num_partitions=2, replication_factor=1, config={"segment.bytes": "1048576", "cleanup.policy": "compact"}),
         NewTopic("doomed", num_partitions=1, replication_factor=1)]
    )
    for future in futures.values():
        future.result(10)
    refusals = [
        (NewTopic("configured", num_partitions=1, replication_factor=1), KafkaError.TOPIC_ALREADY_EXISTS),
        (NewTopic("bad/name", num_partitions=1, replication_factor=1), KafkaError.TOPIC_EXCEPTION),  # INVALID_TOPIC_EXCEPTION
        (NewTopic("badconf", num_partitions=1, replication_factor=1, config={"segment.bytes": "lots"}), KafkaError.INVALID_CONFIG),
    ]
    for new_topic, code in refusals:
        with pytest.raises(KafkaException) as refused:
            client.create_topics([new_topic])[new_topic.topic].result(10)
        assert refused.value.args[0].code() == code, (new_topic.topic, refused.value)
    client.create_partitions([NewPartitions("configured", 4)])["configured"].result(10)
    client.delete_topics(["doomed"])["doomed"].result(10)

    broker.restart(clean=False)
    client = admin(broker.bootstrap)
    metadata = client.list_topics(timeout=10)
    assert "doomed" not in metadata.topics
    assert len(metadata.topics["configured"].partitions) == 4
    config = describe_topic_config(client, "configured")
    assert config["segment.bytes"] == "1048576"
    assert config["cleanup.policy"] == "compact"
    assert config["retention.ms"] == str(7 * 24 * 3600 * 1000)


def test_list_offsets_by_timestamp_and_fetch_long_poll(embedded_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    client = admin(embedded_broker.bootstrap)
    client.create_topics([NewTopic("times", 1, 1)])["times"].result(10)
    producer = Producer({"bootstrap.servers": embedded_broker.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce("times", value=b"%d" % i, timestamp=1_700_000_000_000 + 1000 * i)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": embedded_broker.bootstrap, "group.id": "x", "enable.auto.commit": False, "fetch.wait.max.ms": 5000})
    found = consumer.offsets_for_times([TopicPartition("times", 0, 1_700_000_004_500)], timeout=10)
    assert found[0].offset == 5
    beyond = consumer.offsets_for_times([TopicPartition("times", 0, 1_800_000_000_000)], timeout=10)
    assert beyond[0].offset == -1  # no such record: the end
    consumer.assign([TopicPartition("times", 0, 10)])
    # Nothing to read yet: the fetch waits on the broker; a produce wakes it.
    started = time.monotonic()
    producer.produce("times", value=b"late")
    producer.flush(10)
    message = None
    while message is None and time.monotonic() - started < 10:
        message = consumer.poll(1.0)
    assert message is not None and message.value() == b"late"
    consumer.close()


def test_port_in_use_and_locked_data_dir_fail_clearly(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "a"), "--listen", f"127.0.0.1:{port}"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 2
        assert "cannot listen" in result.stderr
    finally:
        holder.close()
    first = BrokerProcess(str(tmp_path / "b")).start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "b"), "--listen", "127.0.0.1:0"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 2
        assert "in use by another broker" in result.stderr
        (tmp_path / "file").write_text("not a directory")
        result = subprocess.run(
            [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "file"), "--listen", "127.0.0.1:0"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 2 and "data directory" in result.stderr
        result = subprocess.run(
            [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "c"), "--config", "segment.bytes=nope"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )
        assert result.returncode == 2 and "bad configuration" in result.stderr
    finally:
        assert first.terminate() == 0


def test_acks_zero_and_describe_cluster_with_kafka_python(embedded_broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    client = KafkaAdminClient(bootstrap_servers=embedded_broker.bootstrap)
    client.create_topics([NewTopic("fire-and-forget", 1, 1)])
    cluster = client.describe_cluster()
    assert cluster["controller_id"] == 0
    assert [b["port"] for b in cluster["brokers"]] == [embedded_broker.port]
    client.close()
    producer = KafkaProducer(bootstrap_servers=embedded_broker.bootstrap, acks=0, enable_idempotence=False)
    for i in range(200):
        producer.send("fire-and-forget", value=b"%d" % i)
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=embedded_broker.bootstrap, consumer_timeout_ms=3000)
    partition = TopicPartition("fire-and-forget", 0)
    consumer.assign([partition])
    consumer.seek_to_beginning()
    values = [m.value for m in consumer]
    consumer.close()
    assert values == [b"%d" % i for i in range(200)]


def test_settings_altered_on_a_topic_whose_partition_is_open_apply_to_its_log(tmp_path):
    """IncrementalAlterConfigs on a topic already written to: the open log
    takes the new settings at once (a smaller segment.bytes rolls it; no
    zeros written ahead any more), the answer is no error, and the
    connection stays up (it used to be closed by an AttributeError)."""
    import glob
    import os

    from confluent_kafka import Producer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    from broker.broker import EmbeddedBroker

    data = str(tmp_path / "data")
    with EmbeddedBroker(data) as broker:
        client = admin(broker.bootstrap)
        client.create_topics([NewTopic("altered", 1, 1)])["altered"].result(10)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})

        def produce(count: int) -> None:
            for i in range(count):
                producer.produce("altered", value=b"v" * 500, partition=0)
                producer.flush(10)

        produce(3)
        [segment] = glob.glob(os.path.join(data, "altered-0", "*.log"))
        assert os.path.getsize(segment) > 1500, "zeros written ahead of small appends by default"
        resource = ConfigResource("topic", "altered", incremental_configs=[
            ConfigEntry("segment.bytes", "2048", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.zeros.ahead.bytes", "0", incremental_operation=AlterConfigOpType.SET),
        ])
        client.incremental_alter_configs([resource])[resource].result(10)
        assert describe_topic_config(client, "altered")["segment.bytes"] == "2048"
        produce(12)
        segments = sorted(glob.glob(os.path.join(data, "altered-0", "*.log")))
        assert len(segments) >= 3, "the open log rolls at the altered segment.bytes"
        active = segments[-1]
        with open(active, "rb") as file:
            assert not file.read().endswith(bytes(64)), "no zeros written ahead once altered to 0"
