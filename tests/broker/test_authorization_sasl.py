"""Issue 18's authorisation scenarios with authenticated users: SCRAM-SHA-256
and SCRAM-SHA-512 over SASL_PLAINTEXT, the ACL authorizer on, an admin
(a super user) who grants the ACLs over the wire with ``onceflow acls``.

alice (SCRAM-SHA-256) is granted what kafka-acls' --producer and --consumer
grant; with confluent-kafka, kafka-python and aiokafka she produces,
consumes in a group and runs transactions. mallory (SCRAM-SHA-512) has no
ACL: she cannot fence or abort alice's transactional id (her InitProducerId
does not bump its epoch and alice's transaction still commits), cannot read
the group's offsets, cannot see the topics, and her writes change nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

PROTOCOL = "SASL_PLAINTEXT"
USERS = {"admin": ("SCRAM-SHA-512", "admin-secret-1"), "alice": ("SCRAM-SHA-256", "alice-secret-2"), "mallory": ("SCRAM-SHA-512", "mallory-secret-3")}


@pytest.fixture(autouse=True)
def root_handlers_restored():
    """``onceflow.cli.main`` configures logging onto a captured stderr."""
    before = list(logging.root.handlers)
    yield
    logging.root.handlers[:] = before


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    from broker.broker import EmbeddedBroker
    from broker.security.credentials import CredentialStore, make

    data_dir = str(tmp_path_factory.mktemp("guarded") / "data")
    store = CredentialStore(data_dir).load()
    for user, (mechanism, password) in USERS.items():
        store.upsert(user, mechanism, make(mechanism, password))
    properties = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizer.class.name": "acl", "super.users": "User:admin"}
    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0, properties=properties) as broker:
        bootstrap = broker.bootstrap_for(PROTOCOL)
        mechanism, password = USERS["admin"]
        admin = ["--bootstrap-server", bootstrap, "--security-protocol", PROTOCOL, "--sasl-mechanism", mechanism, "--sasl-username", "admin", "--sasl-password", password]
        from onceflow.cli import main

        for args in (
            ["--allow-principal", "User:alice", "--producer", "--topic", "out", "--transactional-id", "etl"],
            ["--allow-principal", "User:alice", "--consumer", "--topic", "in", "--group", "etl-group"],
            ["--allow-principal", "User:alice", "--producer", "--topic", "in"],
            ["--allow-principal", "User:alice", "--consumer", "--topic", "out", "--group", "read-", "--resource-pattern-type", "prefixed"],
        ):
            assert main(["acls", "add", *admin, *args]) == 0
        for topic in ("in", "out"):
            broker.call(lambda b, t=topic: b.replicas.create_topic(t, 1))
        yield broker


def confluent(broker, user, **extra):
    mechanism, password = USERS[user]
    return {"bootstrap.servers": broker.bootstrap_for(PROTOCOL), "security.protocol": PROTOCOL, "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **extra}


def python_kwargs(broker, user):
    mechanism, password = USERS[user]
    return {"bootstrap_servers": broker.bootstrap_for(PROTOCOL), "security_protocol": PROTOCOL, "sasl_mechanism": mechanism, "sasl_plain_username": user, "sasl_plain_password": password}


def log_end(broker, topic):
    return broker.call(lambda b: b.replicas.get_log(topic, 0).high_watermark)


def epoch_of(broker, transactional_id):
    return broker.call(lambda b: b.transactions.coordinator.txns[transactional_id].producer_epoch)


@pytest.mark.slow
def test_a_stranger_cannot_fence_abort_read_or_see(guarded):
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    broker = guarded
    alice = Producer(confluent(broker, "alice", **{"transactional.id": "etl"}))
    alice.init_transactions(30)
    alice.begin_transaction()
    alice.produce("out", b"alice: before")
    alice.flush(30)
    epoch = epoch_of(broker, "etl")

    # The attack: mallory's InitProducerId on alice's transactional id.
    mallory = Producer(confluent(broker, "mallory", **{"transactional.id": "etl"}))
    with pytest.raises(KafkaException) as raised:
        mallory.init_transactions(20)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert epoch_of(broker, "etl") == epoch, "the stranger bumped the epoch"

    alice.produce("out", b"alice: after")
    alice.commit_transaction(30)
    from confluent_kafka import Consumer, TopicPartition

    reader = Consumer(confluent(broker, "alice", **{"group.id": f"read-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed", "enable.auto.commit": False}))
    reader.assign([TopicPartition("out", 0, 0)])
    values = []
    for _ in range(100):
        message = reader.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
        if len(values) >= 2:
            break
    reader.close()
    assert values[:2] == [b"alice: before", b"alice: after"]

    # Nor write, nor see the topics, nor read the group's offsets.
    before = log_end(broker, "out")
    outcome = {}
    plain = Producer(confluent(broker, "mallory", **{"message.timeout.ms": 10000}))
    plain.produce("out", b"mallory", on_delivery=lambda err, msg: outcome.setdefault("err", err))
    plain.flush(20)
    assert outcome["err"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert log_end(broker, "out") == before
    mallory_admin = AdminClient(confluent(broker, "mallory"))
    assert not {"in", "out"} & set(mallory_admin.list_topics(timeout=10).topics)
    alice_admin = AdminClient(confluent(broker, "alice"))
    assert {"in", "out"} <= set(alice_admin.list_topics(timeout=10).topics)


@pytest.mark.slow
def test_kafka_python_groups_and_offsets_with_and_without_acls(guarded):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import (
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError,
    )
    from kafka.structs import OffsetAndMetadata

    broker = guarded
    producer = KafkaProducer(acks="all", **python_kwargs(broker, "alice"))
    producer.send("in", b"for the group").get(30)
    producer.close()
    consumer = KafkaConsumer(group_id="etl-group", auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=10000, **python_kwargs(broker, "alice"))
    consumer.subscribe(["in"])
    got = next(iter(consumer))
    consumer.commit({TopicPartition("in", 0): OffsetAndMetadata(got.offset + 1, "", -1)})
    consumer.close()

    alice_admin = KafkaAdminClient(**python_kwargs(broker, "alice"))
    assert alice_admin.list_group_offsets("etl-group")["etl-group"][TopicPartition("in", 0)].offset == got.offset + 1
    alice_admin.close()
    mallory_admin = KafkaAdminClient(**python_kwargs(broker, "mallory"))
    with pytest.raises(GroupAuthorizationFailedError):
        mallory_admin.list_group_offsets("etl-group")
    mallory_admin.close()
    mallory = KafkaProducer(acks="all", max_block_ms=10000, **python_kwargs(broker, "mallory"))
    with pytest.raises(TopicAuthorizationFailedError):
        mallory.send("in", b"x").get(30)
    mallory.close()


@pytest.mark.slow
def test_aiokafka_transactions_with_scram_and_acls(guarded):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    broker = guarded
    before = log_end(broker, "out")

    async def scenario():
        producer = AIOKafkaProducer(transactional_id="etl", **python_kwargs(broker, "alice"))
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait("out", b"aiokafka in a transaction")
        finally:
            await producer.stop()
        stranger = AIOKafkaProducer(transactional_id="etl", **python_kwargs(broker, "mallory"))
        with pytest.raises(TransactionalIdAuthorizationFailed):
            await stranger.start()
        await stranger.stop()

    asyncio.run(scenario())
    assert log_end(broker, "out") == before + 2  # the record and its COMMIT marker
