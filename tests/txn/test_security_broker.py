"""Our clients against a broker with SASL and TLS listeners: the
transactional producer, a consumer group and the admin over SASL_SSL with
SCRAM-SHA-512 and over SASL_PLAINTEXT with PLAIN; a wrong password, an
unknown mechanism and an untrusted certificate fail at once with a clear
error and nothing written; a session with a lifetime is renewed on the same
connection (KIP-368); the client commands with --command-config; the
streaming runner over SASL_SSL; and quotas per SASL user."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import time

import pytest

import streaming
from broker.broker import EmbeddedBroker
from broker.security.credentials import CredentialStore, make
from tests.helpers import TestCA
from txn import Admin, Consumer, Producer, TopicPartition
from txn.security import AuthenticationError

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORDS = {"alice": "wonder-land-7", "bob": "builder-42"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"


def store_users(data_dir):
    store = CredentialStore(data_dir).load()
    for user, password in PASSWORDS.items():
        for mechanism in MECHANISMS:
            store.upsert(user, mechanism, make(mechanism, password))


def start_secured(data_dir, ca, **properties):
    store_users(data_dir)
    return EmbeddedBroker(
        data_dir, group_initial_rebalance_delay_ms=0, properties={"listeners": LISTENERS, **properties},
        ssl_certfile=ca.certfile, ssl_keyfile=ca.keyfile,
    ).start()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    ca = TestCA(root / "ca")
    broker = start_secured(str(root / "data"), ca)
    try:
        yield broker, ca
    finally:
        broker.stop()


def settings(broker, ca, protocol, mechanism, user="alice", password=None):
    options = {
        "bootstrap_servers": broker.bootstrap_for(protocol),
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_username": user,
        "sasl_password": PASSWORDS[user] if password is None else password,
        "request_timeout_ms": 10_000,
    }
    if protocol == "SASL_SSL":
        options["ssl_cafile"] = ca.cafile
    return options


def log_end(broker, topic: str, partition: int = 0) -> int:
    def read(inner):
        partition_log = inner.replicas.get_log(topic, partition)
        return 0 if partition_log is None else partition_log.high_watermark

    return broker.call(read)


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256")])
def test_transactions_groups_and_admin_over_sasl(secured, protocol, mechanism):
    broker, ca = secured
    options = settings(broker, ca, protocol, mechanism)
    source, sink, group = f"in-{protocol}-{mechanism}", f"out-{protocol}-{mechanism}", f"g-{protocol}-{mechanism}"
    with Admin(**options) as admin:
        admin.create_topics({source: 2, sink: 2})
    with Producer(**options, transactional_id=f"load-{protocol}-{mechanism}") as producer:
        producer.init_transactions()
        with producer.transaction():
            for i in range(20):
                producer.send(source, f"v{i}".encode(), key=f"k{i}".encode())
    consumer = Consumer(**options, group_id=group)
    copier = Producer(**options, transactional_id=f"copy-{protocol}-{mechanism}")
    try:
        consumer.subscribe([source])
        copier.init_transactions()
        copied = []
        deadline = time.monotonic() + 60
        while len(copied) < 20 and time.monotonic() < deadline:
            records = consumer.poll(timeout=1.0)
            if not records:
                continue
            with copier.transaction():
                for record in records:
                    copier.send(sink, record.value, key=record.key)
                copier.send_offsets_to_transaction({tp: consumer.position(tp) for tp in consumer.assignment()}, consumer.group_metadata())
            copied += records
        assert sorted(r.value for r in copied) == sorted(f"v{i}".encode() for i in range(20))
    finally:
        consumer.close()
        copier.close()
    with Admin(**options) as admin:
        committed = admin.list_group_offsets(group)
        source_ends = admin.list_offsets({TopicPartition(source, p): "latest" for p in range(2)})
        # The group's offsets are the source's ends (the records and the loader's COMMIT markers).
        assert {tp: o.offset for tp, o in committed.items() if o.offset} == {tp: o.offset for tp, o in source_ends.items() if o.offset}
        with Consumer(**options) as reader:
            reader.assign([TopicPartition(sink, p) for p in range(2)])
            output = []
            deadline = time.monotonic() + 30
            while len(output) < 20 and time.monotonic() < deadline:
                output += reader.poll(timeout=0.5)
        assert sorted(r.value for r in output) == sorted(f"v{i}".encode() for i in range(20))
        described = admin.describe_transactions([f"copy-{protocol}-{mechanism}"])[0]
        assert described.state in ("Empty", "CompleteCommit")


def expect_refusal(make_client, match):
    started = time.monotonic()
    with pytest.raises(AuthenticationError, match=match) as caught:
        make_client()
    took = time.monotonic() - started
    assert took < 8, f"the refusal took {took:.1f} s: retried or hung"
    return caught.value


def test_wrong_password_is_a_clear_error_at_once_and_writes_nothing(secured):
    broker, ca = secured
    options = settings(broker, ca, "SASL_SSL", "SCRAM-SHA-512", password="not-her-password")

    def produce():
        with Producer(**options, transactional_id="intruder") as producer:
            producer.init_transactions()

    error = expect_refusal(produce, "SASL SCRAM-SHA-512 as 'alice'.*refused")
    assert "not-her-password" not in str(error) and "not-her-password" not in repr(error)

    def send():
        with Producer(**settings(broker, ca, "SASL_PLAINTEXT", "PLAIN", password="wrong")) as producer:
            producer.send("refused-topic", b"x").result(10)

    expect_refusal(send, "PLAIN")
    assert log_end(broker, "refused-topic") == 0

    def list_topics():
        with Admin(**settings(broker, ca, "SASL_SSL", "SCRAM-SHA-256", user="bob", password="x")) as admin:
            admin.list_topics()

    expect_refusal(list_topics, "refused")


def test_an_untrusted_certificate_is_a_clear_tls_error(secured, tmp_path):
    broker, ca = secured
    stranger = TestCA(tmp_path / "other-ca", name="someone else's CA")

    def connect():
        with Admin(**{**settings(broker, ca, "SASL_SSL", "SCRAM-SHA-512"), "ssl_cafile": stranger.cafile}) as admin:
            admin.list_topics()

    error = expect_refusal(connect, "TLS handshake .*certificate verify failed")
    assert error.code == 0


def test_a_certificate_for_another_host_is_refused_unless_hostname_checks_are_off(tmp_path):
    """The CA is trusted but the broker's certificate names elsewhere.example,
    not 127.0.0.1: refused as librdkafka and the Java client refuse it, unless
    ssl.endpoint.identification.algorithm is empty (Kafka's way to turn the
    check off)."""
    ca = TestCA(tmp_path / "ca")
    certfile, keyfile = ca.issue("elsewhere", "elsewhere.example")
    with EmbeddedBroker(str(tmp_path / "data"), properties={"listeners": "SSL://127.0.0.1:0"}, ssl_certfile=certfile, ssl_keyfile=keyfile) as broker:
        options = {"bootstrap_servers": broker.bootstrap_for("SSL"), "security_protocol": "SSL", "ssl_cafile": ca.cafile, "request_timeout_ms": 5000}

        def connect():
            with Admin(**options) as admin:
                admin.list_topics()

        expect_refusal(connect, "certificate verify failed.*(IP address mismatch|[Hh]ostname mismatch)")
        with Admin(**options, **{"ssl.endpoint.identification.algorithm": ""}) as admin:
            assert "__consumer_offsets" in admin.list_topics()


def test_both_sides_refuse_tls_below_1_2(tmp_path):
    from broker.security.tls import server_context
    from txn.security import SecurityConfig

    ca = TestCA(tmp_path / "ca")
    server = server_context(certfile=ca.certfile, keyfile=ca.keyfile, cafile=None)
    client = SecurityConfig(security_protocol="SSL", ssl_cafile=ca.cafile).ssl_context()
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED


def test_plaintext_client_on_a_sasl_listener_gives_up_within_its_timeout(secured):
    broker, _ca = secured

    def connect():
        with Admin(bootstrap_servers=broker.bootstrap_for("SASL_PLAINTEXT"), request_timeout_ms=2000, retry_backoff_max_ms=200) as admin:
            admin.list_topics()

    # Kafka's broker closes such a connection; the client sees it as lost and gives up within its timeout.
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 (the exact error is the broker's choice of closing)
        connect()
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_session_with_a_lifetime_is_renewed_on_the_same_connection(tmp_path, monkeypatch):
    # Renew at half the lifetime (Kafka's clients pick 85-95%), so a loaded
    # machine's pauses between our requests cannot outlast the margin.
    import txn.connection

    monkeypatch.setattr(txn.connection.random, "uniform", lambda low, high: 0.5)
    ca = TestCA(tmp_path / "ca")
    broker = start_secured(str(tmp_path / "data"), ca, **{"connections.max.reauth.ms": "1500"})
    try:
        with Admin(**settings(broker, ca, "SASL_SSL", "SCRAM-SHA-512")) as admin:
            admin.create_topics({"renewed": 1})
            client = admin._call(admin._async.cluster.any_broker())
            writer = client._writer
            first = client.authentications
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:  # every request must succeed across several lifetimes
                assert "renewed" in admin.list_topics()
                time.sleep(0.1)
            assert client.authentications >= first + 2, f"{client.authentications - first} re-authentications in 5 s of 1.5 s sessions"
            assert client._writer is writer, "the connection was replaced instead of re-authenticated"
    finally:
        broker.stop()


def test_client_commands_with_a_command_config_file(secured, tmp_path):
    broker, ca = secured
    properties = tmp_path / "client.properties"
    properties.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="wonder-land-7";\n'
        f"ssl.ca.location={ca.cafile}\n"
    )
    onceflow = [sys.executable, "-m", "onceflow"]
    bootstrap = broker.bootstrap_for("SASL_SSL")
    environment = {key: value for key, value in os.environ.items() if key != "ONCEFLOW_SASL_PASSWORD"}
    created = subprocess.run([*onceflow, "topics", "--bootstrap-server", bootstrap, "--command-config", str(properties), "create", "cli-secure"],
                             check=False, capture_output=True, text=True, timeout=60, env=environment)
    assert created.returncode == 0, created.stderr
    produced = subprocess.run([*onceflow, "produce", "cli-secure", "--bootstrap-server", bootstrap, "--security-protocol", "SASL_SSL",
                               "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "bob", "--ssl-cafile", ca.cafile],
                              input="one\ntwo\n", check=False, capture_output=True, text=True, timeout=60, env={**environment, "ONCEFLOW_SASL_PASSWORD": "builder-42"})
    assert produced.returncode == 0, produced.stderr
    assert log_end(broker, "cli-secure") == 2
    refused = subprocess.run([*onceflow, "topics", "--bootstrap-server", bootstrap, "--command-config", str(properties), "--sasl-password", "pw-that-must-not-show", "list"],
                             check=False, capture_output=True, text=True, timeout=60, env=environment)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "refused" in refused.stderr and "pw-that-must-not-show" not in refused.stderr, refused.stderr


@pytest.mark.slow
def test_the_runner_over_sasl_ssl(secured, tmp_path):
    broker, ca = secured
    options = settings(broker, ca, "SASL_SSL", "SCRAM-SHA-512")
    bootstrap = options.pop("bootstrap_servers")
    with Admin(bootstrap_servers=bootstrap, **options) as admin:
        admin.create_topics({"runner-in": 2, "runner-out": 2})
    with Producer(bootstrap_servers=bootstrap, **options) as producer:
        for i in range(30):
            producer.send("runner-in", f"{i}".encode(), key=f"k{i % 5}".encode())
    app = streaming.App(bootstrap, "secure-runner", str(tmp_path / "state"), session_timeout_ms=6000, heartbeat_interval_ms=500, **options)

    @app.processor("runner-in", sink="runner-out")
    def double(record, ctx):
        ctx.emit(record.key, str(2 * int(record.value)).encode())

    app.run(until_idle=3.0)
    assert app.metrics["records_in"] == 30
    with Consumer(bootstrap_servers=bootstrap, **options) as consumer:
        consumer.assign([TopicPartition("runner-out", p) for p in range(2)])
        values = []
        deadline = time.monotonic() + 30
        while len(values) < 30 and time.monotonic() < deadline:
            values += [int(r.value) for r in consumer.poll(timeout=0.5)]
    assert sorted(values) == [2 * i for i in range(30)]


@pytest.mark.slow
def test_quotas_per_sasl_user_throttle_one_and_not_the_other(tmp_path):
    """alice has a producer quota, bob none: producing at once over
    SASL_PLAINTEXT, alice keeps near her quota while bob runs far faster."""
    from confluent_kafka import Producer as KafkaProducer

    ca = TestCA(tmp_path / "ca")
    broker = start_secured(str(tmp_path / "data"), ca, **{"quota.window.num": "2", "quota.window.size.seconds": "1"})
    quota = 200_000
    try:
        with Admin(**settings(broker, ca, "SASL_PLAINTEXT", "PLAIN", user="bob")) as admin:
            admin.create_topics({"quota-alice": 1, "quota-bob": 1})
            admin.alter_client_quotas({"user": "alice"}, {"producer_byte_rate": quota})
            assert [e.user for e in admin.describe_client_quotas()] == ["alice"]
        rates = {}

        def produce(user):
            producer = KafkaProducer({
                "bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": PASSWORDS[user],
                "batch.size": 16384, "linger.ms": 5,
            })
            acknowledged = []
            deadline = time.monotonic() + 8.0
            while time.monotonic() < deadline:
                try:
                    producer.produce(f"quota-{user}", b"x" * 1000, on_delivery=lambda error, message: error or acknowledged.append(time.monotonic()))
                except BufferError:
                    producer.poll(0.05)
                    continue
                producer.poll(0.01 if len(producer) > 2000 else 0)
            end = time.monotonic()
            producer.purge()
            producer.flush(30)
            in_time = [at for at in acknowledged if at <= end]
            rates[user] = 1000 * len(in_time) / (end - in_time[0])

        threads = [threading.Thread(target=produce, args=(user,)) for user in ("alice", "bob")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert 0.7 * quota <= rates["alice"] <= 1.3 * quota, rates
        assert rates["bob"] > 3 * quota, rates
    finally:
        broker.stop()
