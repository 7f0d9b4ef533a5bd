"""SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) over SASL_PLAINTEXT and
SASL_SSL with the three real clients: each authenticates, produces and
consumes through a broker whose users were stored before it started; a
wrong password, an unknown user, a mechanism the broker does not enable and a
server certificate the client does not trust are refused with the client's
usual error, and nothing reaches the log."""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid

import pytest

from broker.broker import EmbeddedBroker
from broker.security.credentials import CredentialStore, make
from tests.helpers import TestCA, wait_for

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
USER, PASSWORD = "alice", "wonder-land-7"
ROWS = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """One broker for the module: PLAINTEXT, SASL_PLAINTEXT and SASL_SSL
    listeners, every mechanism enabled; alice has a credential of each, bob
    only a PLAIN one."""
    root = tmp_path_factory.mktemp("secured")
    ca = TestCA(root / "ca")
    data_dir = str(root / "data")
    store = CredentialStore(data_dir).load()
    for mechanism in MECHANISMS:
        store.upsert(USER, mechanism, make(mechanism, PASSWORD))
    store.upsert("bob", "PLAIN", make("PLAIN", "bobs-password"))
    with EmbeddedBroker(
        data_dir,
        properties={"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"},
        ssl_certfile=ca.certfile,
        ssl_keyfile=ca.keyfile,
    ) as broker:
        yield broker, ca


def log_end(broker, topic: str) -> int:
    """The log end offset of ``topic``-0 (0 when the topic does not exist)."""

    def read(inner, name):
        partition_log = inner.replicas.get_log(name, 0)
        return 0 if partition_log is None else partition_log.high_watermark

    return broker.call(read, topic)


# -- per client: produce ROWS and read them back --------------------------------------


# What each client library calls the settings of a secured connection:
# bootstrap, security protocol, SASL mechanism, user name, password.
SETTING_NAMES = {
    "confluent-kafka": ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password"),
    "kafka-python": ("bootstrap_servers", "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password"),
    "aiokafka": ("bootstrap_servers", "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password"),
}


def client_settings(library, broker, ca, protocol, mechanism, username=USER, password=PASSWORD, cafile=None) -> dict:
    """``library``'s settings to reach ``broker``'s ``protocol`` listener as
    ``username``; over SASL_SSL trusting ``cafile`` (default: the test CA's)."""
    settings = dict(zip(SETTING_NAMES[library], (broker.bootstrap_for(protocol), protocol, mechanism, username, password)))
    if protocol == "SASL_SSL":
        cafile = cafile or ca.cafile
        if library == "confluent-kafka":
            settings["ssl.ca.location"] = cafile
        elif library == "kafka-python":
            settings["ssl_cafile"] = cafile
        else:  # aiokafka takes a context
            settings["ssl_context"] = ssl.create_default_context(cafile=cafile)
    return settings


def confluent_roundtrip(broker, ca, protocol, mechanism, topic):
    import confluent_kafka

    producer = confluent_kafka.Producer({**client_settings("confluent-kafka", broker, ca, protocol, mechanism), "acks": "all"})
    for key, value in ROWS:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {**client_settings("confluent-kafka", broker, ca, protocol, mechanism), "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got = []
    try:
        wait_for(lambda: _poll_into(consumer, got) >= len(ROWS), timeout=60, what="the records back")
    finally:
        consumer.close()
    return got


def _poll_into(consumer, got) -> int:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        got.append((message.key(), message.value()))
    return len(got)


def kafka_python_roundtrip(broker, ca, protocol, mechanism, topic):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = KafkaProducer(acks="all", **client_settings("kafka-python", broker, ca, protocol, mechanism))
    futures = [producer.send(topic, key=key, value=value) for key, value in ROWS]
    producer.flush(30)
    for future in futures:
        future.get(30)
    producer.close()
    consumer = KafkaConsumer(auto_offset_reset="earliest", consumer_timeout_ms=10_000, **client_settings("kafka-python", broker, ca, protocol, mechanism))
    consumer.assign([TopicPartition(topic, 0)])
    got = []
    for message in consumer:
        got.append((message.key, message.value))
        if len(got) >= len(ROWS):
            break
    consumer.close()
    return got


def aiokafka_roundtrip(broker, ca, protocol, mechanism, topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run():
        producer = AIOKafkaProducer(acks="all", **client_settings("aiokafka", broker, ca, protocol, mechanism))
        await producer.start()
        try:
            for key, value in ROWS:
                await producer.send_and_wait(topic, key=key, value=value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **client_settings("aiokafka", broker, ca, protocol, mechanism))
        await consumer.start()
        got = []
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            while len(got) < len(ROWS):
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
                for messages in batches.values():
                    got.extend((message.key, message.value) for message in messages)
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


ROUNDTRIPS = {"confluent-kafka": confluent_roundtrip, "kafka-python": kafka_python_roundtrip, "aiokafka": aiokafka_roundtrip}


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("client", sorted(ROUNDTRIPS))
def test_each_client_authenticates_produces_and_consumes(secured, client, protocol, mechanism):
    broker, ca = secured
    topic = f"sec-{client}-{protocol}-{mechanism}-{uuid.uuid4().hex[:6]}".replace("_", "-")
    got = ROUNDTRIPS[client](broker, ca, protocol, mechanism, topic)
    assert sorted(got) == sorted(ROWS)
    assert log_end(broker, topic) == len(ROWS)


def test_confluent_kafka_scram_over_sasl_ssl(secured):
    """The fast set's one real-client pass: SCRAM-SHA-256 over TLS."""
    broker, ca = secured
    topic = f"sec-fast-{uuid.uuid4().hex[:6]}"
    assert sorted(confluent_roundtrip(broker, ca, "SASL_SSL", "SCRAM-SHA-256", topic)) == sorted(ROWS)


def test_metadata_advertises_the_listener_the_client_came_in_on(secured):
    """A client bootstrapped on SASL_SSL is sent to the SASL_SSL port (and
    one on PLAINTEXT to the PLAINTEXT port), never to another listener's."""
    import confluent_kafka.admin

    broker, ca = secured
    for protocol in ("PLAINTEXT", "SASL_SSL", "SASL_PLAINTEXT"):
        if protocol == "PLAINTEXT":
            config = {"bootstrap.servers": broker.bootstrap_for(protocol)}
        else:
            config = client_settings("confluent-kafka", broker, ca, protocol, "SCRAM-SHA-512")
        admin = confluent_kafka.admin.AdminClient(config)
        metadata = admin.list_topics(timeout=20)
        (only,) = metadata.brokers.values()
        assert f"{only.host}:{only.port}" == broker.bootstrap_for(protocol)
        cluster = admin.describe_cluster().result(20)
        assert [f"{node.host}:{node.port}" for node in cluster.nodes] == [broker.bootstrap_for(protocol)]


# -- refusals ------------------------------------------------------------------------------


REFUSALS = {
    "wrong password": {"mechanism": "SCRAM-SHA-256", "password": "not-it"},
    "unknown user": {"mechanism": "SCRAM-SHA-512", "username": "mallory", "password": PASSWORD},
    "wrong password, PLAIN": {"mechanism": "PLAIN", "password": "not-it"},
    "no credential of this mechanism": {"mechanism": "SCRAM-SHA-256", "username": "bob", "password": "bobs-password"},
}


def confluent_refused(broker, ca, protocol, topic, **credentials):
    """Produce one record; return the error librdkafka reports (error_cb)."""
    import confluent_kafka

    errors = []
    mechanism = credentials.pop("mechanism")
    producer = confluent_kafka.Producer(
        {**client_settings("confluent-kafka", broker, ca, protocol, mechanism, **credentials), "error_cb": errors.append, "message.timeout.ms": 3000}
    )
    delivered = []
    producer.produce(topic, b"must not be written", on_delivery=lambda error, message: delivered.append(error))
    producer.flush(10)
    assert delivered and delivered[0] is not None, "the record was delivered"
    return errors


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_confluent_kafka_is_refused_and_nothing_is_written(secured, case):
    import confluent_kafka

    broker, ca = secured
    topic = f"refused-{uuid.uuid4().hex[:6]}"
    errors = confluent_refused(broker, ca, "SASL_SSL", topic, **REFUSALS[case])
    assert any(error.code() == confluent_kafka.KafkaError._AUTHENTICATION for error in errors), errors
    assert any("Authentication failed" in error.str() for error in errors), errors
    assert log_end(broker, topic) == 0


def test_confluent_kafka_refuses_an_untrusted_broker_certificate(secured, tmp_path):
    import confluent_kafka

    broker, ca = secured
    stranger = TestCA(tmp_path / "other", name="some other CA")
    topic = f"untrusted-{uuid.uuid4().hex[:6]}"
    errors = confluent_refused(broker, ca, "SASL_SSL", topic, mechanism="SCRAM-SHA-256", password=PASSWORD, cafile=stranger.cafile)
    assert any(error.code() == confluent_kafka.KafkaError._SSL for error in errors), errors
    assert log_end(broker, topic) == 0


def test_a_mechanism_the_broker_does_not_enable_is_refused(tmp_path):
    import confluent_kafka

    data_dir = str(tmp_path / "data")
    CredentialStore(data_dir).load().upsert(USER, "SCRAM-SHA-512", make("SCRAM-SHA-512", PASSWORD))
    with EmbeddedBroker(data_dir, properties={"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "SCRAM-SHA-256"}) as broker:
        errors = confluent_refused(broker, None, "SASL_PLAINTEXT", "t", mechanism="SCRAM-SHA-512", password=PASSWORD)
        assert any(error.code() == confluent_kafka.KafkaError._UNSUPPORTED_FEATURE or "mechanism" in error.str() for error in errors), errors
        assert log_end(broker, "t") == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_kafka_python_is_refused_and_nothing_is_written(secured, case, caplog):
    """kafka-python logs the broker's refusal and never bootstraps."""
    import kafka.errors
    from kafka import KafkaProducer

    broker, ca = secured
    credentials = dict(REFUSALS[case])
    mechanism = credentials.pop("mechanism")
    # api_version given: no probing in the constructor; the send's metadata wait fails.
    producer = KafkaProducer(api_version=(2, 6), max_block_ms=3000, **client_settings("kafka-python", broker, ca, "SASL_SSL", mechanism, **credentials))
    try:
        with caplog.at_level(logging.INFO, logger="kafka"), pytest.raises(kafka.errors.KafkaTimeoutError):
            producer.send("kp-refused", b"must not be written").get(10)
    finally:
        producer.close(timeout=1)
    assert any("Authentication failed" in record.getMessage() for record in caplog.records), [r.getMessage() for r in caplog.records]
    assert log_end(broker, "kp-refused") == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_aiokafka_is_refused_and_nothing_is_written(secured, case):
    import aiokafka.errors
    from aiokafka import AIOKafkaProducer

    broker, ca = secured
    credentials = dict(REFUSALS[case])
    mechanism = credentials.pop("mechanism")

    async def run():
        producer = AIOKafkaProducer(**client_settings("aiokafka", broker, ca, "SASL_SSL", mechanism, **credentials))
        try:
            await producer.start()
            await producer.send_and_wait("aio-refused", b"must not be written")
        finally:
            await producer.stop()

    with pytest.raises((aiokafka.errors.KafkaConnectionError, aiokafka.errors.AuthenticationFailedError)):
        asyncio.run(run())
    assert log_end(broker, "aio-refused") == 0


@pytest.mark.slow
def test_kafka_python_and_aiokafka_refuse_an_untrusted_broker_certificate(secured, tmp_path, caplog):
    import kafka.errors
    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    broker, ca = secured
    stranger = TestCA(tmp_path / "other", name="some other CA")
    producer = KafkaProducer(api_version=(2, 6), max_block_ms=3000, **client_settings("kafka-python", broker, ca, "SASL_SSL", "SCRAM-SHA-256", cafile=stranger.cafile))
    try:
        with caplog.at_level(logging.INFO, logger="kafka"), pytest.raises(kafka.errors.KafkaTimeoutError):
            producer.send("untrusted-kp", b"must not be written").get(10)
    finally:
        producer.close(timeout=1)
    assert any("CERTIFICATE_VERIFY_FAILED" in record.getMessage() or "certificate verify failed" in record.getMessage() for record in caplog.records)

    async def aiokafka_run():
        aio = AIOKafkaProducer(**client_settings("aiokafka", broker, ca, "SASL_SSL", "SCRAM-SHA-256", cafile=stranger.cafile))
        try:
            await aio.start()
            await aio.send_and_wait("untrusted-aio", b"must not be written")
        finally:
            await aio.stop()

    import aiokafka.errors

    with pytest.raises((aiokafka.errors.KafkaConnectionError, ssl.SSLCertVerificationError)):
        asyncio.run(aiokafka_run())
    assert log_end(broker, "untrusted-kp") == 0 and log_end(broker, "untrusted-aio") == 0


@pytest.mark.slow
def test_kafka_python_and_aiokafka_are_told_the_mechanism_is_not_enabled(tmp_path, caplog):
    import aiokafka.errors
    import kafka.errors
    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    data_dir = str(tmp_path / "data")
    CredentialStore(data_dir).load().upsert(USER, "SCRAM-SHA-512", make("SCRAM-SHA-512", PASSWORD))
    with EmbeddedBroker(data_dir, properties={"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "SCRAM-SHA-256"}) as broker:
        producer = KafkaProducer(api_version=(2, 6), max_block_ms=3000, **client_settings("kafka-python", broker, None, "SASL_PLAINTEXT", "SCRAM-SHA-512"))
        try:
            with caplog.at_level(logging.INFO, logger="kafka"), pytest.raises(kafka.errors.KafkaTimeoutError):
                producer.send("t", b"must not be written").get(10)
        finally:
            producer.close(timeout=1)
        assert any("UnsupportedSaslMechanismError" in record.getMessage() for record in caplog.records)

        async def aiokafka_run():
            aio = AIOKafkaProducer(**client_settings("aiokafka", broker, None, "SASL_PLAINTEXT", "SCRAM-SHA-512"))
            try:
                await aio.start()
            finally:
                await aio.stop()

        with pytest.raises((aiokafka.errors.UnsupportedSaslMechanismError, aiokafka.errors.KafkaConnectionError)):
            asyncio.run(aiokafka_run())
        assert log_end(broker, "t") == 0
