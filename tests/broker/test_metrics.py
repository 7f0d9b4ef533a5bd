"""The broker's Prometheus endpoint, scraped over HTTP and read with
``prometheus_client``'s own parser while real clients (confluent-kafka,
kafka-python, aiokafka) produce, consume and run transactions: the counters
move by exactly what the clients did, the gauges say what the log holds (the
last stable offset stays put while a transaction is open), and the endpoint
survives bad HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.broker import EmbeddedBroker
from tests.helpers import Scrape, create_topic, raw_fetch, scrape, wait_for

SMALL_INTERNAL = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3"}


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0, metrics_address=("127.0.0.1", 0), properties=SMALL_INTERNAL) as running:
        yield running


# --------------------------------------------------------------------------- transactions (confluent-kafka)


def test_transaction_outcomes_are_counted_exactly_and_the_lso_holds_while_one_is_open(broker):
    from confluent_kafka import Producer

    topic = f"txn-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    before = scrape(broker)
    assert before.value("onceflow_transactions_total", 0.0, outcome="commit") == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}", "linger.ms": 1})
    producer.init_transactions(30)
    outcomes = ["commit", "abort", "commit", "commit", "abort"]
    for outcome in outcomes:
        producer.begin_transaction()
        for index in range(4):
            producer.produce(topic, f"{outcome}-{index}".encode())
        producer.flush(30)
        (producer.commit_transaction if outcome == "commit" else producer.abort_transaction)(30)

    def outcomes_counted():
        now = scrape(broker)
        counted = (now.value("onceflow_transactions_total", 0.0, outcome="commit"), now.value("onceflow_transactions_total", 0.0, outcome="abort"))
        return now if counted == (3, 2) else None

    settled = wait_for(outcomes_counted, 30, "3 commits and 2 aborts in onceflow_transactions_total")
    high = settled.value("onceflow_partition_high_watermark", topic=topic, partition=0)
    assert high == 5 * (4 + 1), "four records and one marker per transaction"
    assert settled.value("onceflow_partition_last_stable_offset", topic=topic, partition=0) == high
    assert settled.value("onceflow_partition_open_transactions", topic=topic, partition=0) == 0
    for api, at_least in (("InitProducerId", 1), ("AddPartitionsToTxn", 5), ("EndTxn", 5), ("Produce", 5)):
        assert settled.total("onceflow_requests_total", api=api) - before.total("onceflow_requests_total", api=api) >= at_least, api

    # A transaction left open holds the LSO at its first offset.
    producer.begin_transaction()
    for index in range(3):
        producer.produce(topic, f"open-{index}".encode())
    producer.flush(30)
    held = wait_for(lambda: (s := scrape(broker)).value("onceflow_partition_high_watermark", topic=topic, partition=0) == high + 3 and s, 30, "the open transaction's records")
    assert held.value("onceflow_partition_last_stable_offset", topic=topic, partition=0) == high
    assert held.value("onceflow_partition_log_end_offset", topic=topic, partition=0) == high + 3
    assert held.value("onceflow_partition_open_transactions", topic=topic, partition=0) == 1
    assert held.value("onceflow_partition_oldest_open_transaction_age_seconds", topic=topic, partition=0) >= 0
    assert held.total("onceflow_transaction_coordinator_open_transactions") == 1
    assert len(held.matching("onceflow_transaction_coordinator_oldest_open_transaction_age_seconds")) == 1
    assert held.value("onceflow_transactional_ids", state="Ongoing") == 1, "Kafka's state names, as onceflow status and the logs show them"
    assert held.value("onceflow_transactions_total", outcome="commit") == 3, "an open transaction is no outcome"
    producer.commit_transaction(30)
    # The LSO moves with the marker; the coordinator's view (the age gauges,
    # its open count, the outcome) with CompleteCommit, which is written
    # after the markers and may land a round later.
    moved = wait_for(lambda: (s := scrape(broker)).value("onceflow_partition_last_stable_offset", topic=topic, partition=0) > high
                     and s.value("onceflow_transactions_total", outcome="commit") == 4 and s, 30, "the LSO to move and the commit to complete")
    assert moved.value("onceflow_partition_last_stable_offset", topic=topic, partition=0) == high + 4
    assert moved.value("onceflow_partition_high_watermark", topic=topic, partition=0) == high + 4
    assert moved.matching("onceflow_partition_oldest_open_transaction_age_seconds", topic=topic) == {}
    assert moved.total("onceflow_transaction_coordinator_open_transactions") == 0
    assert moved.value("onceflow_transactions_total", outcome="commit") == 4
    assert moved.value("onceflow_transactions_total", outcome="abort") == 2
    assert moved.value("onceflow_producer_ids") >= 1


def waited(before, after, api: str) -> float:
    """Requests of ``api`` whose answers waited for an fsync, between two scrapes."""
    return after.value("onceflow_requests_waited_fsync_total", 0.0, api=api) - before.value("onceflow_requests_waited_fsync_total", 0.0, api=api)


def rounds_of_librdkafka_transactions(broker, topic: str, transactional_id: str, count: int = 5) -> tuple:
    """(scrape before, scrape after) ``count`` one-record transactions of librdkafka (classic protocol)."""
    from confluent_kafka import Producer as Rdkafka

    producer = Rdkafka({"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id, "linger.ms": 1})
    producer.init_transactions(30)
    before = scrape(broker)
    for index in range(count):
        producer.begin_transaction()
        producer.produce(topic, b"%d" % index)
        producer.flush(30)
        producer.commit_transaction(30)
    return before, scrape(broker)


def rounds_of_copier_transactions(broker, topic: str, transactional_id: str, count: int = 5) -> tuple:
    """(scrape before, scrape after) ``count`` copier transactions of our client
    (transaction version 2: a record and its group's offset each)."""
    from txn import Producer

    ours = Producer(broker.bootstrap, transactional_id=transactional_id, linger_ms=0)
    ours.init_transactions()
    before = scrape(broker)
    for index in range(count):
        with ours.transaction():
            ours.send(topic, b"v2-%d" % index)
            ours.flush()
            ours.send_offsets_to_transaction({(topic, 0): index + 1}, "rounds-group")
    ours.close()
    return before, scrape(broker)


def test_the_fsync_rounds_on_a_clients_path_are_counted_per_request(broker):
    """``onceflow_requests_waited_fsync_total`` counts a request once if its
    answer waited for an fsync: a one-record transaction of librdkafka
    (classic protocol) waits for two (its Produce, standing also for the
    once-appended AddPartitionsToTxn, and EndTxn's decision); a copier's
    for three (plus its TxnOffsetCommit); AddPartitionsToTxn/AddOffsetsToTxn
    and the markers and Complete after the answer wait for none; our own
    client on transaction version 2 waits for the same rounds with no
    AddPartitionsToTxn request at all."""
    topic = f"rounds-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=1)

    before, after = rounds_of_librdkafka_transactions(broker, topic, f"rounds-{uuid.uuid4().hex[:6]}")
    assert (waited(before, after, "Produce"), waited(before, after, "EndTxn"), waited(before, after, "AddPartitionsToTxn")) == (5, 5, 0)
    assert after.total("onceflow_requests_waited_fsync_total") - before.total("onceflow_requests_waited_fsync_total") == 10, "two rounds per transaction"

    before, after = rounds_of_copier_transactions(broker, topic, f"rounds-v2-{uuid.uuid4().hex[:6]}")
    assert after.total("onceflow_requests_total", api="AddPartitionsToTxn") == before.total("onceflow_requests_total", api="AddPartitionsToTxn")
    assert (waited(before, after, "Produce"), waited(before, after, "TxnOffsetCommit"), waited(before, after, "EndTxn")) == (5, 5, 5), "three rounds per copier transaction"


@pytest.mark.slow
def test_with_durability_at_the_end_a_transaction_waits_for_one_round(tmp_path):
    """``transaction.durable.at.end``: the Produce and TxnOffsetCommit are
    answered once appended, and only EndTxn(commit) waits (for the data's
    round, then the decision's): one request per transaction, librdkafka's
    or a copier's of our client."""
    properties = {**SMALL_INTERNAL, "transaction.durable.at.end": "true"}
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0, metrics_address=("127.0.0.1", 0), properties=properties) as broker:
        topic = "rounds-at-end"
        create_topic(broker.bootstrap, topic, partitions=1)
        before, after = rounds_of_librdkafka_transactions(broker, topic, "rounds-at-end")
        assert {api: waited(before, after, api) for api in ("Produce", "EndTxn")} == {"Produce": 0, "EndTxn": 5}
        assert after.total("onceflow_requests_waited_fsync_total") - before.total("onceflow_requests_waited_fsync_total") == 5, "one round per transaction"

        before, after = rounds_of_copier_transactions(broker, topic, "rounds-at-end-v2")
        assert after.total("onceflow_requests_waited_fsync_total") - before.total("onceflow_requests_waited_fsync_total") == 5, "one round per copier transaction"
        assert waited(before, after, "EndTxn") == 5


# --------------------------------------------------------------------------- groups and lag (kafka-python)


def test_group_lag_is_the_end_offset_minus_the_committed_offset(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = f"lag-{uuid.uuid4().hex[:6]}"
    group = f"group-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for index in range(60):
        producer.send(topic, f"v{index}".encode(), partition=index % 2)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        read = 0
        deadline_polls = 200
        while read < 60 and deadline_polls:
            read += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
            deadline_polls -= 1
        assert read == 60
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(17, "", -1), TopicPartition(topic, 1): OffsetAndMetadata(4, "", -1)})
        now = scrape(broker)
        for partition, committed in ((0, 17), (1, 4)):
            high = now.value("onceflow_partition_high_watermark", topic=topic, partition=partition)
            assert high == 30
            assert now.value("onceflow_group_committed_offset", group=group, topic=topic, partition=partition) == committed
            assert now.value("onceflow_group_lag", group=group, topic=topic, partition=partition) == high - committed
        assert now.value("onceflow_group_members", group=group) == 1
        assert now.value("onceflow_group_state", group=group, state="Stable") == 1
        assert now.value("onceflow_groups", state="Stable") >= 1
        assert now.value("onceflow_topic_bytes_out_total", topic=topic) >= now.total("onceflow_partition_size_bytes", topic=topic)
        assert now.total("onceflow_requests_total", api="JoinGroup") >= 1 and now.total("onceflow_requests_total", api="OffsetCommit") >= 1
    finally:
        consumer.close()
    left = wait_for(lambda: (s := scrape(broker)).value("onceflow_group_members", group=group) == 0 and s, 30, "the member to leave")
    assert left.value("onceflow_group_state", group=group, state="Empty") == 1
    assert left.value("onceflow_group_lag", group=group, topic=topic, partition=0) == 13, "lag outlives the members"


# --------------------------------------------------------------------------- bytes and requests (aiokafka)


def test_request_counts_and_bytes_in_grow_with_what_aiokafka_sends(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"bytes-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    before = scrape(broker)

    async def produce_and_read():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            for index in range(200):
                await producer.send(topic, b"x" * 100, partition=index % 2)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed")
        await consumer.start()
        try:
            got = 0
            while got < 200:
                batches = await consumer.getmany(timeout_ms=1000)
                got += sum(len(records) for records in batches.values())
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(produce_and_read()) == 200
    after = scrape(broker)
    stored = after.total("onceflow_partition_size_bytes", topic=topic)
    assert stored > 200 * 100
    # Nothing was retried, so every byte received is a byte stored.
    assert after.value("onceflow_topic_bytes_in_total", topic=topic) == stored
    assert after.value("onceflow_topic_bytes_out_total", topic=topic) >= stored
    produces = after.total("onceflow_requests_total", api="Produce") - before.total("onceflow_requests_total", api="Produce")
    fetches = after.total("onceflow_requests_total", api="Fetch") - before.total("onceflow_requests_total", api="Fetch")
    assert produces >= 1 and fetches >= 1
    latency_count = after.total("onceflow_request_duration_seconds_count", api="Produce") - before.total("onceflow_request_duration_seconds_count", api="Produce")
    assert latency_count == produces, "every counted request is timed"
    # acks=all: each Produce waited for an fsync round, which storage
    # reported (the two partitions' batches of one request share a round).
    fsyncs = after.value("onceflow_log_fsync_duration_seconds_count")
    assert fsyncs >= 1 and after.value("onceflow_log_flush_round_appends_count") == fsyncs
    assert after.value("onceflow_log_flush_round_appends_sum") >= 2
    assert after.value("onceflow_log_flush_round_bytes_sum") >= stored
    assert after.value("process_resident_memory_bytes") > 10 * 1024 * 1024


def test_error_codes_are_counted_per_api(broker):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"dup-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert scrape(broker).value("onceflow_request_errors_total", 0.0, api="CreateTopics", error="TOPIC_ALREADY_EXISTS") == 0
    for _ in range(2):
        with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert scrape(broker).value("onceflow_request_errors_total", api="CreateTopics", error="TOPIC_ALREADY_EXISTS") == 2


def test_connections_are_counted_while_open(broker):
    base = scrape(broker).value("onceflow_connections", 0.0, listener="PLAINTEXT", authenticated="false")
    sockets = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(3)]
    try:
        wait_for(lambda: scrape(broker).value("onceflow_connections", 0.0, listener="PLAINTEXT", authenticated="false") == base + 3, 10, "three more connections")
    finally:
        for sock in sockets:
            sock.close()
    wait_for(lambda: scrape(broker).value("onceflow_connections", 0.0, listener="PLAINTEXT", authenticated="false") == base, 10, "the connections to be gone")
    assert scrape(broker).value("onceflow_connections_opened_total", listener="PLAINTEXT") >= 3


def test_each_broker_in_a_process_has_its_own_metrics(tmp_path, broker):
    topic = f"own-{uuid.uuid4().hex[:6]}"
    with EmbeddedBroker(str(tmp_path / "other"), metrics_address=("127.0.0.1", 0), properties=SMALL_INTERNAL) as other:
        create_topic(broker.bootstrap, topic, partitions=1)
        assert scrape(broker).matching("onceflow_partition_log_end_offset", topic=topic)
        assert scrape(other).matching("onceflow_partition_log_end_offset", topic=topic) == {}
        assert scrape(other).total("onceflow_requests_total", api="CreateTopics") == 0


# --------------------------------------------------------------------------- the HTTP edge


def http_exchange(port: int, data: bytes, *, close_write: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_bad_http_gets_an_error_status_and_the_endpoint_keeps_serving(broker):
    port = broker.broker.metrics_port
    assert http_exchange(port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert http_exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert http_exchange(port, b"\x00\xff garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert http_exchange(port, b"GET /metrics\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert http_exchange(port, b"GET /metr").startswith(b"HTTP/1.1 400 "), "a head cut short"
    assert http_exchange(port, b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 "), "a head too long"
    head = http_exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    assert raised.value.code == 404
    assert scrape(broker).value("onceflow_index_budget_max_entries") > 0


# --------------------------------------------------------------------------- onceflow broker --metrics


@pytest.mark.slow
def test_the_broker_command_serves_metrics_and_says_where(tmp_path):
    command = [sys.executable, "-m", "onceflow", "broker", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        first = process.stdout.readline()
        assert first.startswith("onceflow broker metrics on http://127.0.0.1:"), first
        url = first.split(" on ", 1)[1].strip()
        assert process.stdout.readline().startswith("onceflow broker ready on ")
        page = Scrape(url)
        assert page.value("onceflow_index_budget_max_entries") > 0
        assert page.matching("onceflow_partition_high_watermark") == {}, "internal partitions never written to are left out"
        assert page.value("onceflow_transaction_coordinator_open_transactions", coordinator_partition=49) == 0
        assert page.value("process_resident_memory_bytes") > 0
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run([*command[:-1], busy], check=False, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert f"cannot serve metrics on {busy}" in result.stderr
    finally:
        taken.close()


def test_error_codes_inside_produce_and_fetch_answers_are_counted(broker):
    from protocol.records import encode_batch
    from tests.helpers import raw_request

    topic = f"codes-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    batch = encode_batch([(None, b"v", (), 0)])
    produce = {"transactional_id": None, "acks": 1, "timeout_ms": 5000,
               "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}, {"index": 7, "records": batch}]}]}
    answer = raw_request(broker.port, 0, 9, produce)
    assert [p["error_code"] for p in answer["responses"][0]["partition_responses"]] == [0, 3]
    answer = raw_fetch(broker.port, topic, [99], min_bytes=0, max_bytes=1 << 20)
    assert answer["responses"][0]["partitions"][0]["error_code"] == 1
    now = scrape(broker)
    assert now.value("onceflow_request_errors_total", api="Produce", error="UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert now.value("onceflow_request_errors_total", api="Fetch", error="OFFSET_OUT_OF_RANGE") == 1
    assert now.value("onceflow_requests_total", api="Produce", version=9) == 1
    assert now.value("onceflow_requests_total", api="Fetch", version=11) == 1
    assert now.value("onceflow_topic_bytes_in_total", topic=topic) == len(batch), "only the appended partition's bytes count"


@pytest.mark.slow
def test_the_bench_measures_what_metrics_cost_on_produce(tmp_path):
    """``onceflow bench --metrics-cost`` runs end to end (tiny sizes: the
    figures themselves are the bench's business, not a test's)."""
    out = tmp_path / "cost.json"
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "bench", "--metrics-cost", "--rounds", "1", "--records", "4000", "--work-dir", str(tmp_path), "--json", str(out)],
        check=False, capture_output=True, text=True, timeout=300, cwd=os.getcwd(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "metrics share" in result.stdout or "share @15s" in result.stdout
    import json

    summary = json.loads(out.read_text())
    for shape in ("large batches", "small batches"):
        row = summary[shape]
        assert row["off records/s"] > 0 and row["on records/s"] > 0 and row["Produce requests/s"] > 0
        assert 0 <= row["metrics share, scrape every 15 s"] <= row["metrics share, scrape every 1 s"]
    assert summary["scrapes"] >= 2 and summary["seconds per scrape"] > 0
    assert 0 < summary["seconds added per Produce request"] < 0.01


@pytest.mark.slow
def test_a_scrape_never_opens_a_partition(tmp_path):
    """Partitions open when first used (broker.replica); a scrape reads the
    open ones and must not open (and maybe recover) the rest."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    data = str(tmp_path / "lazy")
    topic = f"lazy-{uuid.uuid4().hex[:6]}"
    options = {"group_initial_rebalance_delay_ms": 0, "metrics_address": ("127.0.0.1", 0), "properties": SMALL_INTERNAL}
    with EmbeddedBroker(data, **options) as first:
        create_topic(first.bootstrap, topic, partitions=1)
        producer = Producer({"bootstrap.servers": first.bootstrap, "acks": "all"})
        for index in range(10):
            producer.produce(topic, f"v{index}".encode(), partition=0)
        producer.flush(30)
        consumer = Consumer({"bootstrap.servers": first.bootstrap, "group.id": "lazy-group", "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
        consumer.close()
    with EmbeddedBroker(data, **options) as again:
        now = scrape(again)
        assert now.matching("onceflow_partition_log_end_offset", topic=topic) == {}
        assert now.value("onceflow_group_committed_offset", group="lazy-group", topic=topic, partition=0) == 4
        assert now.matching("onceflow_group_lag", group="lazy-group") == {}, "no lag from a log that is not open"
        assert not again.call(lambda broker: broker.replicas.is_open(topic, 0)), "the scrape opened the partition"
        consumer = Consumer({"bootstrap.servers": again.bootstrap, "group.id": "reader", "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic, 0)])
        try:
            wait_for(lambda: consumer.poll(0.5) is not None, 30, "a record")
        finally:
            consumer.close()
        opened = scrape(again)
        assert opened.value("onceflow_partition_log_end_offset", topic=topic, partition=0) == 10
        assert opened.value("onceflow_group_lag", group="lazy-group", topic=topic, partition=0) == 6


def test_connections_are_counted_per_listener_and_by_whether_they_authenticated(tmp_path):
    from confluent_kafka import Producer

    from broker.security.credentials import CredentialStore, make

    data = str(tmp_path / "sasl")
    CredentialStore(data).load().upsert("alice", "PLAIN", make("PLAIN", "wonder-land-7"))
    listeners = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0", **SMALL_INTERNAL}
    with EmbeddedBroker(data, metrics_address=("127.0.0.1", 0), properties=listeners) as secured:

        def connections(listener: str, authenticated: str) -> float:
            return scrape(secured).value("onceflow_connections", 0.0, listener=listener, authenticated=authenticated)

        host, port = secured.bootstrap_for("SASL_PLAINTEXT").rsplit(":", 1)
        stranger = socket.create_connection((host, int(port)))
        try:
            wait_for(lambda: connections("SASL_PLAINTEXT", "false") == 1, 10, "the unauthenticated connection")
            producer = Producer({"bootstrap.servers": secured.bootstrap_for("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "wonder-land-7", "acks": "all"})
            producer.produce("sasl-metrics", b"v")
            assert producer.flush(30) == 0
            assert connections("SASL_PLAINTEXT", "true") >= 1, "alice's connections count as authenticated"
            assert connections("SASL_PLAINTEXT", "false") == 1, "only the stranger is not"
            assert connections("PLAINTEXT", "false") == 0
            del producer
        finally:
            stranger.close()
        # Well within the authentication timeout: a peer that leaves before
        # authenticating is gone at once, not when its deadline passes.
        wait_for(lambda: connections("SASL_PLAINTEXT", "true") == 0 and connections("SASL_PLAINTEXT", "false") == 0, 5, "every connection closed")
        assert scrape(secured).value("onceflow_connections_opened_total", listener="SASL_PLAINTEXT") >= 2


def test_offsets_committed_in_a_transaction_show_only_once_it_commits(broker):
    """aiokafka's consume-transform-produce: the group's offset sent in a
    transaction is pending (no committed offset, no lag) until EndTxn
    commits; an aborted one never shows; the outcomes are counted."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioPartition

    source, sink, group = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("src", "dst", "copier"))
    create_topic(broker.bootstrap, source, partitions=1)
    create_topic(broker.bootstrap, sink, partitions=1)
    before = scrape(broker)
    seen: dict[str, Scrape] = {}

    async def copy():
        seeder = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await seeder.start()
        try:
            for index in range(8):
                await seeder.send_and_wait(source, f"in-{index}".encode(), partition=0)
        finally:
            await seeder.stop()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:6]}", linger_ms=1)
        await producer.start()
        try:
            for offset, commit in ((3, False), (5, True)):
                await producer.begin_transaction()
                await producer.send_and_wait(sink, f"out-{offset}".encode(), partition=0)
                await producer.send_offsets_to_transaction({AioPartition(source, 0): offset}, group)
                seen[f"pending {offset}"] = await asyncio.to_thread(scrape, broker)
                await (producer.commit_transaction() if commit else producer.abort_transaction())
        finally:
            await producer.stop()

    asyncio.run(copy())
    assert seen["pending 3"].matching("onceflow_group_committed_offset", group=group) == {}
    assert seen["pending 5"].matching("onceflow_group_committed_offset", group=group) == {}, "the aborted offset 3 never showed"
    assert seen["pending 5"].value("onceflow_partition_open_transactions", topic=sink, partition=0) == 1
    done = wait_for(lambda: (s := scrape(broker)).value("onceflow_transactions_total", 0.0, outcome="commit") - before.value("onceflow_transactions_total", 0.0, outcome="commit") == 1 and s, 30, "the commit counted")
    assert done.value("onceflow_transactions_total", outcome="abort") - before.value("onceflow_transactions_total", 0.0, outcome="abort") == 1
    assert done.value("onceflow_group_committed_offset", group=group, topic=source, partition=0) == 5
    assert done.value("onceflow_group_lag", group=group, topic=source, partition=0) == 8 - 5
    assert done.total("onceflow_requests_total", api="TxnOffsetCommit") - before.total("onceflow_requests_total", api="TxnOffsetCommit") == 2
    assert done.total("onceflow_requests_total", api="AddOffsetsToTxn") - before.total("onceflow_requests_total", api="AddOffsetsToTxn") == 2


def test_requests_the_authorizer_denies_are_counted_with_their_error(tmp_path):
    """The metrics layer wraps the authorizing dispatcher: a denied Produce
    is a request with TOPIC_AUTHORIZATION_FAILED, and nothing is appended."""
    from protocol.records import encode_batch
    from tests.helpers import raw_request

    properties = {"authorizer.class.name": "acl", "allow.everyone.if.no.acl.found": "false", **SMALL_INTERNAL}
    with EmbeddedBroker(str(tmp_path / "acl"), metrics_address=("127.0.0.1", 0), properties=properties) as guarded:
        guarded.call(lambda broker: broker.replicas.create_topic("guarded", 1))
        batch = encode_batch([(None, b"v", (), 0)])
        body = {"transactional_id": None, "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": "guarded", "partition_data": [{"index": 0, "records": batch}]}]}
        answer = raw_request(guarded.port, 0, 9, body)
        assert answer["responses"][0]["partition_responses"][0]["error_code"] == 29  # TOPIC_AUTHORIZATION_FAILED
        now = scrape(guarded)
        assert now.value("onceflow_request_errors_total", api="Produce", error="TOPIC_AUTHORIZATION_FAILED") == 1
        assert now.value("onceflow_requests_total", api="Produce", version=9) == 1
        assert now.value("onceflow_partition_log_end_offset", topic="guarded", partition=0) == 0


def test_every_series_is_exposed_once(broker):
    """A partition created since start and never used, and an internal one
    (also created, never written): each has one sample per gauge. Prometheus
    drops a scrape with a duplicate series; the parser here does not."""
    import collections

    topic = f"fresh-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as response:
        text = response.read().decode()
    seen = collections.Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            seen[(sample.name, frozenset(sample.labels.items()))] += 1
    twice = {key: count for key, count in seen.items() if count > 1}
    assert twice == {}
    assert seen[("onceflow_partition_log_end_offset", frozenset({("topic", topic), ("partition", "1")}))] == 1



def test_bytes_in_counts_what_was_appended_and_names_only_topics_that_exist(broker):
    """As Kafka's BytesInPerSec: bytes of batches appended, by topic. A
    Produce to a topic that does not exist adds no series (a label per name
    a client invents would grow without end) and a refused partition adds
    no bytes."""
    from protocol.records import encode_batch
    from tests.helpers import raw_request

    topic = f"in-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    batch = encode_batch([(None, b"v", (), 0)])
    for acks in (1, 0):
        invented = f"nope-{uuid.uuid4().hex}"
        body = {"transactional_id": None, "acks": acks, "timeout_ms": 5000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}, {"index": 7, "records": batch}]},
                               {"name": invented, "partition_data": [{"index": 0, "records": batch}]}]}
        if acks:
            answer = raw_request(broker.port, 0, 9, body)
            assert [p["error_code"] for t in answer["responses"] for p in t["partition_responses"]] == [0, 3, 3]
        else:
            from protocol.framing import ClientConnection

            with socket.create_connection(("127.0.0.1", broker.port)) as sock:
                sock.sendall(ClientConnection(client_id="raw").send_request(0, 9, body)[1])
            wait_for(lambda: scrape(broker).value("onceflow_partition_log_end_offset", topic=topic, partition=0) == 2, 30, "the acks=0 batch appended")
        now = scrape(broker)
        assert now.matching("onceflow_topic_bytes_in_total", topic=invented) == {}
    assert now.value("onceflow_topic_bytes_in_total", topic=topic) == 2 * len(batch), "one partition's batch appended per request"
