"""``onceflow broker`` runs on the event loop its ``event.loop`` setting
names (uvloop by default where installed) and says which, read from the
running loop itself, so the choice cannot silently fall back; and
everything the process relies on works on uvloop: the early bind, SASL
(a PLAIN login is checked on a worker thread), the metrics endpoint,
transactions with a real client, SIGTERM's clean stop. TLS listeners run
on asyncio (uvloop's start_tls loses a ClientHello read ahead: refused
rather than hung), shown here with a real TLS client."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from faults.process import BrokerProcess, restartable_port
from protocol.event_loop import ASYNCIO, UVLOOP, uvloop_installed
from tests.conftest import REPO
from tests.helpers import Scrape, TestCA, create_topic, raw_request, wait_for

needs_uvloop = pytest.mark.skipif(not uvloop_installed(), reason="uvloop is not installed here")


def ready_line(broker: BrokerProcess) -> str:
    """The broker's one line about its loop in its log (stderr)."""
    return next(line for line in broker.read_log().splitlines() if "event loop" in line)


@pytest.mark.parametrize("chosen", [pytest.param(UVLOOP, marks=needs_uvloop), ASYNCIO])
def test_the_broker_process_runs_on_the_loop_its_setting_names_and_says_so(tmp_path, chosen):
    broker = BrokerProcess(str(tmp_path / "data"), f"event.loop={chosen}").start()
    try:
        assert f"broker process on the {chosen} event loop" in ready_line(broker)
        answer = raw_request(broker.port, 18, 3, {"client_software_name": "probe", "client_software_version": "1"})
        assert answer["error_code"] == 0
    finally:
        assert broker.terminate() == 0, broker.read_log()[-2000:]
    assert "broker stopped cleanly" in broker.read_log()


@needs_uvloop
def test_uvloop_is_the_default_where_it_is_installed(tmp_path):
    command = [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    try:
        line = process.stdout.readline()
        assert line.startswith("onceflow broker ready on 127.0.0.1:") and line.rstrip().endswith("(event loop uvloop)"), line
    finally:
        process.terminate()
        assert process.wait(60) == 0


def test_a_broker_with_a_tls_listener_runs_on_asyncio_and_refuses_uvloop(tmp_path):
    """uvloop's start_tls would lose the ClientHello that its transport
    read ahead on accept, and the handshake would hang: a TLS listener's
    broker runs on asyncio by default, and is refused uvloop."""
    from confluent_kafka.admin import AdminClient

    ca = TestCA(tmp_path / "ca")
    plain, secured = restartable_port(), restartable_port()
    tls = ("--ssl-certfile", ca.certfile, "--ssl-keyfile", ca.keyfile)
    listeners = f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{secured}"
    broker = BrokerProcess(str(tmp_path / "data"), port=plain, listeners=listeners, args=tls).start()
    try:
        assert "on the asyncio event loop" in ready_line(broker)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{secured}", "security.protocol": "SSL", "ssl.ca.location": ca.cafile})
        assert admin.list_topics(timeout=20).brokers, "a TLS client is served"
    finally:
        assert broker.terminate() == 0, broker.read_log()[-2000:]
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"), "--listen", listeners, *tls, "--config", "event.loop=uvloop"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )
    assert result.returncode == 2
    assert "event.loop=uvloop cannot serve TLS listeners (SSL)" in result.stderr


def test_an_unknown_loop_is_refused_with_the_choices(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--config", "event.loop=trio"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )
    assert result.returncode == 2
    assert "event.loop must be one of uvloop, asyncio, not 'trio'" in result.stderr


@pytest.mark.slow
@needs_uvloop
def test_on_uvloop_sasl_metrics_and_transactions_work_through_the_real_process(tmp_path):
    """librdkafka over SASL_PLAINTEXT (PLAIN) commits and aborts
    transactions and reads them back read_committed from a uvloop broker
    process, which also serves its metrics, then stops cleanly on SIGTERM."""
    from confluent_kafka import Producer

    from broker.security.credentials import CredentialStore, make

    data_dir = str(tmp_path / "data")
    store = CredentialStore(data_dir).load()
    store.upsert("alice", "PLAIN", make("PLAIN", "wonder-land-7"))
    plain, secured, metrics = restartable_port(), restartable_port(), restartable_port()
    broker = BrokerProcess(
        data_dir, "event.loop=uvloop", port=plain, listeners=f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{secured}",
        args=("--metrics", f"127.0.0.1:{metrics}"),
    ).start()
    try:
        assert "on the uvloop event loop" in ready_line(broker)
        topic = f"uv-{uuid.uuid4().hex[:6]}"
        create_topic(broker.bootstrap, topic, partitions=1)
        over_sasl = {
            "bootstrap.servers": f"127.0.0.1:{secured}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "alice", "sasl.password": "wonder-land-7",
        }
        producer = Producer({**over_sasl, "transactional.id": f"tx-{topic}", "linger.ms": 1})
        producer.init_transactions(30)
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            for index in range(3):
                producer.produce(topic, f"{outcome}-{index}".encode())
            assert producer.flush(30) == 0
            (producer.commit_transaction if outcome == "commit" else producer.abort_transaction)(30)
        assert sorted(read_over(over_sasl, topic, expect=6)) == sorted([f"commit-{index}".encode() for index in range(3)] * 2)
        page = Scrape(f"http://127.0.0.1:{metrics}/metrics")
        assert page.value("onceflow_transactions_total", outcome="commit") == 2
        assert page.value("onceflow_transactions_total", outcome="abort") == 1
    finally:
        assert broker.terminate() == 0, broker.read_log()[-2000:]
    assert "broker stopped cleanly" in broker.read_log()


def read_over(settings: dict, topic: str, *, expect: int) -> list[bytes]:
    """Values a read_committed librdkafka consumer reads from partition 0
    with ``settings``: once ``expect`` are in, one more second for extras."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings, "group.id": f"read-{topic}", "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []

    def read_some() -> bool:
        for message in consumer.consume(100, 0.2):
            assert message.error() is None, message.error()
            values.append(message.value())
        return len(values) >= expect

    try:
        wait_for(read_some, 60, f"{expect} committed values")
        extras_until = time.monotonic() + 1
        while time.monotonic() < extras_until:
            read_some()
    finally:
        consumer.close()
    return values
