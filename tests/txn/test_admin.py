"""Our admin client against our broker over a real socket: topics,
partitions, configs, offsets, groups and hanging transactions."""

from __future__ import annotations

import time
import uuid

import pytest

from txn import Admin, Consumer, KafkaError, Producer, TopicPartition
from txn.errors import InvalidConfigurationError


def test_topics_partitions_and_configs(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"admin-a": 2, "admin-b": 1}, configs={"admin-a": {"retention.ms": "3600000"}})
        topics = admin.list_topics()
        assert topics["admin-a"] == 2 and topics["admin-b"] == 1
        with pytest.raises(KafkaError, match="TOPIC_ALREADY_EXISTS"):
            admin.create_topics({"admin-a": 2})
        admin.create_topics({"admin-a": 2}, exist_ok=True)
        with pytest.raises(KafkaError, match="INVALID_TOPIC"):
            admin.create_topics({"bad/name": 1})
        admin.create_partitions({"admin-a": 5})
        assert admin.list_topics()["admin-a"] == 5
        configs = admin.describe_configs(["admin-a"])
        assert configs["admin-a"]["retention.ms"] == "3600000"
        admin.delete_topics(["admin-b"])
        assert "admin-b" not in admin.list_topics()


def test_offsets_and_delete_records(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"admin-offsets": 1})
        producer = Producer(bootstrap_servers=embedded_broker.bootstrap)
        for i in range(10):
            producer.send("admin-offsets", b"%d" % i, partition=0, timestamp=1_000 + i)
        producer.close()
        tp = TopicPartition("admin-offsets", 0)
        assert admin.list_offsets({tp: "earliest"})[tp].offset == 0
        assert admin.list_offsets({tp: "latest"})[tp].offset == 10
        assert admin.list_offsets({tp: 1_004})[tp].offset == 4
        assert admin.delete_records({tp: 6}) == {tp: 6}
        assert admin.list_offsets({tp: "earliest"})[tp].offset == 6


def test_list_offsets_of_many_partitions_in_one_call(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"admin-many-a": 3, "admin-many-b": 2})
        producer = Producer(bootstrap_servers=embedded_broker.bootstrap)
        for partition in range(3):
            for i in range(partition + 1):
                producer.send("admin-many-a", b"x", partition=partition, timestamp=1_000 * (partition + 1) + i)
        producer.send("admin-many-b", b"y", partition=1, timestamp=5_000)
        producer.flush()
        producer.close()
        partitions = [TopicPartition("admin-many-a", p) for p in range(3)] + [TopicPartition("admin-many-b", p) for p in range(2)]
        latest = admin.list_offsets({tp: "latest" for tp in partitions})
        assert {tp: listed.offset for tp, listed in latest.items()} == dict(zip(partitions, [1, 2, 3, 0, 1]))
        assert {tp.partition: listed.offset for tp, listed in admin.list_offsets({tp: "earliest" for tp in partitions}).items()} == {0: 0, 1: 0, 2: 0}
        by_time = admin.list_offsets({partitions[2]: 3_001, partitions[1]: 2_000, partitions[4]: 9_999})
        assert by_time[partitions[2]].offset == 1 and by_time[partitions[2]].timestamp == 3_001
        assert by_time[partitions[1]].offset == 0
        assert by_time[partitions[4]].offset == -1, "no record at or after the timestamp"


def test_groups_are_listed_and_described_with_their_assignment(embedded_broker):
    group = f"admin-group-{uuid.uuid4()}"
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"admin-grouped": 3})
        consumer = Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id=group, heartbeat_interval_ms=200)
        consumer.subscribe(["admin-grouped"])
        deadline = time.monotonic() + 20
        while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
            consumer.poll(0.1)
        consumer.commit({TopicPartition("admin-grouped", 1): 0})
        assert group in [g.group_id for g in admin.list_groups()]
        (described,) = admin.describe_groups([group])
        assert described.state == "Stable" and described.protocol_type == "consumer"
        assert len(described.members) == 1
        assert sorted(described.members[0].assignment) == [TopicPartition("admin-grouped", p) for p in range(3)]
        assert admin.list_group_offsets(group)[TopicPartition("admin-grouped", 1)].offset == 0
        consumer.close()


def test_hanging_transaction_is_found_described_and_aborted(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"admin-hanging": 1})
        producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="admin-hanging", transaction_timeout_ms=600_000)
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("admin-hanging", b"stuck", partition=0).result(10)
        tp = TopicPartition("admin-hanging", 0)
        listed = {t.transactional_id: t for t in admin.list_transactions()}
        assert listed["admin-hanging"].state == "Ongoing"
        (described,) = admin.describe_transactions(["admin-hanging"])
        assert described.partitions == (tp,) and described.producer_id == producer.producer_id
        (active,) = admin.describe_producers(tp)
        assert active.current_txn_start_offset == 0
        assert admin.list_offsets({tp: "latest"})[tp].offset == 0, "the open transaction holds the LSO"
        admin.abort_transaction(tp, described.producer_id, described.producer_epoch)
        assert admin.list_offsets({tp: "latest"})[tp].offset == 2, "marker written: the LSO moved past it"
        producer._thread.stop()  # the zombie vanishes without a word


def test_admin_errors_name_the_item(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        with pytest.raises(KafkaError, match="describe transaction nobody"):
            admin.describe_transactions(["nobody"])
        with pytest.raises((KafkaError, InvalidConfigurationError)):
            admin.create_partitions({"never-created": 3})


def test_clients_pickle_by_configuration(embedded_broker):
    """Spark ships clients to executors: each rebuilds from its configuration."""
    import pickle

    from txn import Consumer

    consumer = Consumer({"bootstrap.servers": embedded_broker.bootstrap, "group.id": "pickled", "max.poll.records": 7})
    admin = Admin(bootstrap_servers=embedded_broker.bootstrap, client_id="pickled-admin")
    for client in (consumer, admin):
        clone = pickle.loads(pickle.dumps(client))
        assert type(clone) is type(client) and clone.config == client.config
        clone.close()
        client.close()
    import txn.aio

    async_producer = pickle.loads(pickle.dumps(txn.aio.Producer(bootstrap_servers=embedded_broker.bootstrap, linger_ms=9)))
    assert async_producer.config.linger_ms == 9


def test_create_topics_lets_the_broker_choose_the_replication_factor(tmp_path, monkeypatch):
    """By default the request asks for replication factor -1, the broker's
    ``default.replication.factor`` (KIP-464), so a topic made on a cluster
    is replicated as its operator chose; a given factor is sent as given.
    Ours has one replica to give: -1 and 1 create the topic, 3 is refused."""
    from broker.admin_apis import AdminApis
    from broker.broker import EmbeddedBroker

    asked = []
    handle = AdminApis.handle_create_topics

    async def recording(self, version, body):
        asked.extend((version, topic["name"], topic["replication_factor"], {c["name"]: c["value"] for c in topic["configs"]}) for topic in body["topics"])
        return await handle(self, version, body)

    monkeypatch.setattr(AdminApis, "handle_create_topics", recording)
    with EmbeddedBroker(str(tmp_path / "data")) as broker, Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"rf-default": 2})
        admin.create_topics({"rf-one": 1}, replication_factor=1, configs={"rf-one": {"min.insync.replicas": "1"}})
        with pytest.raises(KafkaError, match=r"replication factor 3 is larger .*INVALID_REPLICATION_FACTOR"):
            admin.create_topics({"rf-three": 1}, replication_factor=3)
        topics = admin.list_topics()
    assert [entry[1:] for entry in asked] == [("rf-default", -1, {}), ("rf-one", 1, {"min.insync.replicas": "1"}), ("rf-three", 3, {})]
    assert all(version >= 4 for version, *_ in asked), "-1 needs CreateTopics v4"
    assert topics["rf-default"] == 2 and topics["rf-one"] == 1 and "rf-three" not in topics
