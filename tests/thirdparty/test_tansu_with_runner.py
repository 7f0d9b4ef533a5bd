"""The streaming runner against Tansu, a Kafka-compatible broker we did not
write: a stateful app (store, changelog created by the app, output, offsets
in one transaction) processes its input and commits its offsets there too.

Its exactly-once guarantee rests on read_committed hiding aborted
transactions, which Tansu 0.6.0 lacks (Fetch lists no aborted
transactions): the test that aborts a transaction is a strict xfail.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest

import streaming
from tests.thirdparty.conftest import GROUP_HEARTBEAT_INTERVAL_MS, GROUP_SESSION_TIMEOUT_MS
from txn import Consumer, Producer, TopicPartition


def build(bootstrap: str, state_dir: str, source: str, sink: str, **options) -> streaming.App:
    app = streaming.App(
        bootstrap, f"runner-{uuid.uuid4().hex[:8]}", state_dir,
        session_timeout_ms=GROUP_SESSION_TIMEOUT_MS, heartbeat_interval_ms=GROUP_HEARTBEAT_INTERVAL_MS, **options,
    )

    @app.processor(source=source, sink=sink, stores=["counts"], key_format="str", value_format="str")
    def count(record, ctx):
        if record.value == "BOOM":
            raise ValueError("a poison record")
        counts = ctx.store("counts")
        seen = counts.get(record.key, 0) + 1
        counts.put(record.key, seen)
        ctx.emit(record.key, f"{record.value}:{seen}")

    return app


def send(bootstrap: str, topic: str, values) -> None:
    producer = Producer(bootstrap_servers=bootstrap)
    for index, value in enumerate(values):
        producer.send(topic, value.encode(), key=f"k{index % 5}".encode())
    producer.flush()
    producer.close()


def read(bootstrap: str, topic: str, partitions: int, idle: float = 1.5, isolation: str = "read_committed") -> list:
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    records, last_new = [], time.monotonic()
    while time.monotonic() - last_new < idle:
        got = consumer.poll(0.2)
        if got:
            records += got
            last_new = time.monotonic()
    consumer.close()
    return records


def expected_outputs(values) -> Counter:
    seen: Counter = Counter()
    out = Counter()
    for index, value in enumerate(values):
        key = f"k{index % 5}"
        seen[key] += 1
        out[f"{value}:{seen[key]}"] += 1
    return out


def test_a_stateful_app_runs_on_tansu(tansu_broker, tansu_topic, tmp_path):
    source, sink = tansu_topic(partitions=2), tansu_topic(partitions=2)
    values = [f"v{i}" for i in range(200)]
    send(tansu_broker.bootstrap, source, values)
    app = build(tansu_broker.bootstrap, str(tmp_path / "state"), source, sink)
    app.run(until_idle=3.0)
    assert app.metrics["records_in"] == 200 and app.metrics["commits"] >= 1
    assert Counter(r.value.decode() for r in read(tansu_broker.bootstrap, sink, 2)) == expected_outputs(values)
    committed = Consumer(bootstrap_servers=tansu_broker.bootstrap, group_id=app.application_id)
    offsets = committed.committed([TopicPartition(source, p) for p in range(2)])
    committed.close()
    assert sum(o.offset for o in offsets.values()) == 200, "the input offsets were committed in the transactions"
    changelog = read(tansu_broker.bootstrap, app.changelog_topic("counts"), 2)
    assert changelog, "the store's changes reached its changelog"


@pytest.mark.xfail(strict=True, reason="Tansu 0.6.0: Fetch returns no aborted transactions, so a transaction the runner aborted stays visible to read_committed")
def test_an_aborted_transaction_of_the_runner_stays_invisible_on_tansu(tansu_broker, tansu_topic, tmp_path):
    source, sink = tansu_topic(partitions=1), tansu_topic(partitions=1)
    send(tansu_broker.bootstrap, source, [f"v{i}" for i in range(50)])
    app = build(tansu_broker.bootstrap, str(tmp_path / "state"), source, sink, commit_interval_ms=8000, commit_records=1000)
    failures = []

    def run():
        try:
            app.run(until_idle=10.0)
        except streaming.ProcessingError as error:
            failures.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        # The 50 outputs are in the log, in the still open transaction...
        deadline = time.monotonic() + 30
        while len(read(tansu_broker.bootstrap, sink, 1, idle=0.3, isolation="read_uncommitted")) < 50:
            assert time.monotonic() < deadline, "the outputs never reached the log"
        send(tansu_broker.bootstrap, source, ["BOOM"])  # ...which the poison record aborts
    finally:
        runner.join(60)
    assert failures and failures[0].offset == 50
    assert read(tansu_broker.bootstrap, sink, 1) == []
