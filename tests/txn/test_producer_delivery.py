"""Our producer's delivery guarantees over a real socket: five batches in
flight per partition with order kept through connection losses, the error
taxonomy, an external two-phase commit (resume by handle), a commit whose
outcome is unknown, configuration and pickling."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.helpers import connections_cut_every, create_topic, read_partition
from txn import (
    ConfigError,
    Producer,
    ProducerConfig,
    TopicPartition,
    TransactionAbortableError,
    TransactionHandle,
)
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from txn.errors import CommitOutcomeUnknownError, FatalError, ProducerFencedError
from txn.producer import AsyncProducer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_five_in_flight_keep_order_and_exactly_once_through_connection_cuts(embedded_broker):
    create_topic(embedded_broker.bootstrap, "inflight", 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, batch_size=400, linger_ms=0, retry_backoff_ms=10)
    assert producer.config.max_in_flight_requests_per_connection == 5
    with connections_cut_every(producer, 0.05):
        futures = [producer.send("inflight", b"%06d" % i, partition=0) for i in range(6000)]
        producer.flush(120)
    offsets = [f.result(10).offset for f in futures]
    producer.close()
    known = [o for o in offsets if o >= 0]
    assert known == sorted(known), "acknowledged offsets follow send order"
    records = read_partition(embedded_broker.bootstrap, "inflight", 0, 6000)
    assert [r.value for r in records] == [b"%06d" % i for i in range(6000)], "every record once, in send order"


def test_idempotent_producer_pipelines_batches(embedded_broker):
    """With a slow-ish stream of batches, more than one is in flight at once."""
    create_topic(embedded_broker.bootstrap, "pipelined", 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, batch_size=200, linger_ms=0)
    peak = 0

    def watch():
        nonlocal peak
        while not done.is_set():
            queue = producer._async._queues.get(TopicPartition("pipelined", 0))
            if queue is not None:
                peak = max(peak, queue.inflight)
            time.sleep(0.0005)

    done = threading.Event()
    watcher = threading.Thread(target=watch)
    watcher.start()
    for i in range(3000):
        producer.send("pipelined", b"x" * 100, partition=0)
    producer.flush(60)
    done.set()
    watcher.join()
    producer.close()
    assert 1 < peak <= 5


def test_failed_send_makes_the_transaction_abortable_and_the_producer_goes_on(embedded_broker):
    create_topic(embedded_broker.bootstrap, "abortable", 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"abortable-{uuid.uuid4()}", delivery_timeout_ms=3000)
    producer.init_transactions()
    producer.begin_transaction()
    good = producer.send("abortable", b"kept-out", partition=0)
    bad = producer.send("abortable", b"x" * 2_000_000, partition=0)  # over message.max.bytes
    with pytest.raises(TransactionAbortableError, match="MESSAGE_TOO_LARGE"):
        bad.result(30)
    with pytest.raises(TransactionAbortableError):
        producer.commit_transaction()
    producer.abort_transaction()
    assert good.done()
    with producer.transaction():
        producer.send("abortable", b"committed", partition=0)
    producer.close()
    assert [r.value for r in read_partition(embedded_broker.bootstrap, "abortable", 0, 1)] == [b"committed"]



def test_records_appended_without_a_future_count_in_their_transaction(embedded_broker):
    """append(report=False), for pipelines that never look at their outputs'
    offsets: no future, yet the records commit with their transaction, a
    failed one fails the commit (nothing is lost silently), and a producer
    outside transactions, which has no commit to report through, refuses."""
    create_topic(embedded_broker.bootstrap, "unreported", 2)

    async def main():
        idempotent = AsyncProducer(embedded_broker.bootstrap)
        await idempotent.start()
        with pytest.raises(FatalError):
            idempotent.append("unreported", 0, b"lost?", report=False)
        await idempotent.close()
        producer = AsyncProducer(embedded_broker.bootstrap, transactional_id=f"unreported-{uuid.uuid4()}", delivery_timeout_ms=3000)
        await producer.init_transactions()
        producer.begin_transaction()
        assert all(producer.append("unreported", i % 2, b"%d" % i, report=False) is None for i in range(300))
        await producer.commit_transaction()
        producer.begin_transaction()
        producer.append("unreported", 0, b"dropped", report=False)
        producer.append("unreported", 0, b"x" * 2_000_000, report=False)  # over message.max.bytes
        with pytest.raises(TransactionAbortableError, match="MESSAGE_TOO_LARGE"):
            await producer.commit_transaction()
        await producer.abort_transaction()
        await producer.close()

    asyncio.run(main())
    values = [r.value for p in range(2) for r in read_partition(embedded_broker.bootstrap, "unreported", p, 150)]
    assert sorted(values) == sorted(b"%d" % i for i in range(300))

CHILD = r"""
import json, os, sys
sys.path.insert(0, {repo!r})
from txn import Producer
producer = Producer(bootstrap_servers={bootstrap!r}, transactional_id={tid!r})
producer.init_transactions()
producer.begin_transaction()
for i in range(100):
    producer.send({topic!r}, b"%d" % i, partition=i % 2)
producer.flush()
handle = producer.transaction_handle()
print(json.dumps([handle.transactional_id, handle.producer_id, handle.producer_epoch]), flush=True)
os._exit(0)  # gone without committing: the driver decides
"""


@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_another_process_finishes_a_flushed_transaction_by_its_handle(embedded_broker, decision):
    topic = f"handover-{decision}"
    create_topic(embedded_broker.bootstrap, topic, 2)
    script = CHILD.format(repo=REPO, bootstrap=embedded_broker.bootstrap, tid=f"sink-{decision}", topic=topic)
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert output.returncode == 0, output.stderr
    handle = TransactionHandle(*json.loads(output.stdout.strip().splitlines()[-1]))
    assert read_partition(embedded_broker.bootstrap, topic, 0, 1, timeout=1) == [], "open: nothing visible yet"
    finisher = Producer.resume(handle, bootstrap_servers=embedded_broker.bootstrap)
    (finisher.commit_transaction if decision == "commit" else finisher.abort_transaction)()
    finisher.close()
    seen = read_partition(embedded_broker.bootstrap, topic, 0, 50, timeout=5 if decision == "commit" else 1)
    seen += read_partition(embedded_broker.bootstrap, topic, 1, 50, timeout=5 if decision == "commit" else 1)
    assert len(seen) == (100 if decision == "commit" else 0)


def test_a_detached_transaction_must_end_elsewhere_before_the_producer_begins_again(embedded_broker):
    """The sink's executors keep their producer across batches: each batch's
    transaction is detached for the driver to finish, and the next one
    begins only once the coordinator says the detached one ended, so its
    records can never join a transaction the driver has not finished."""
    topic = "detached"
    create_topic(embedded_broker.bootstrap, topic, 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="detaching", linger_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, b"unflushed", partition=0)
    with pytest.raises(FatalError, match="flush"):
        producer.detach_transaction()  # a queued record would miss the handle
    producer.flush()
    first = producer.detach_transaction()
    with pytest.raises(FatalError, match="begin_after_detached"):
        producer.begin_transaction()
    with pytest.raises(FatalError, match="Ongoing, not ended") as still_open:
        producer.begin_after_detached()  # nobody has finished it yet
    assert still_open.value.code == ErrorCode.INVALID_TXN_STATE
    with pytest.raises(FatalError, match="outside a transaction"):
        producer.send(topic, b"into the open one?", partition=0)

    driver = Producer.resume(first, bootstrap_servers=embedded_broker.bootstrap)
    driver.commit_transaction()
    driver.close()
    producer.begin_after_detached()
    producer.send(topic, b"second, aborted", partition=0)
    producer.flush()
    second = producer.detach_transaction()
    # The same producer id, no InitProducerId in between; with transaction
    # version 2 (this broker's) the driver's EndTxn bumped the epoch, and the
    # producer goes on at that one.
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
    driver = Producer.resume(second, bootstrap_servers=embedded_broker.bootstrap)
    driver.abort_transaction()
    driver.close()
    producer.begin_after_detached()
    producer.send(topic, b"third", partition=0)
    producer.commit_transaction()  # the producer may also finish one itself
    assert [r.value for r in read_partition(embedded_broker.bootstrap, topic, 0, 2)] == [b"unflushed", b"third"]

    producer.begin_transaction()
    producer.send(topic, b"fenced", partition=0)
    producer.flush()
    producer.detach_transaction()
    successor = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="detaching")
    successor.init_transactions()  # takes the id: aborts the detached transaction, bumps the epoch
    with pytest.raises(ProducerFencedError, match="epoch"):
        producer.begin_after_detached()
    producer.close()
    successor.close()
    assert [r.value for r in read_partition(embedded_broker.bootstrap, topic, 0, 2)] == [b"unflushed", b"third"]


def test_begin_after_detached_on_a_broker_without_describe_transactions_fails_at_once(embedded_broker):
    create_topic(embedded_broker.bootstrap, "detached-old", 1)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="detaching-old")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("detached-old", b"v", partition=0)
    producer.flush()
    producer.detach_transaction()

    def forget_describe():  # what a Kafka 2.x broker's ApiVersions would have said
        for client in producer._async.cluster._clients.values():
            client.versions.pop(ApiKey.DESCRIBE_TRANSACTIONS, None)

    producer._thread.run(forget_describe)
    started = time.monotonic()
    with pytest.raises(FatalError, match="init_transactions") as refused:
        producer.begin_after_detached()
    assert refused.value.code == ErrorCode.UNSUPPORTED_VERSION and time.monotonic() - started < 5, "refused at once, not retried"
    producer.init_transactions()  # the way on: aborts the detached transaction
    with producer.transaction():
        producer.send("detached-old", b"after", partition=0)
    producer.close()
    assert [r.value for r in read_partition(embedded_broker.bootstrap, "detached-old", 0, 1)] == [b"after"]


@pytest.mark.slow
def test_commit_with_unknown_outcome_is_never_followed_by_an_abort(broker_process):
    broker = broker_process(env={"ONCEFLOW_CRASH_POINTS": "coordinator.after_prepare_commit@1:exit"})
    create_topic(broker.bootstrap, "unknown-outcome", 1)
    producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id="unknown-outcome", delivery_timeout_ms=4000, request_timeout_ms=2000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("unknown-outcome", b"decided", partition=0)
    with pytest.raises(CommitOutcomeUnknownError):
        producer.commit_transaction()
    with pytest.raises(CommitOutcomeUnknownError):
        producer.abort_transaction()  # refused: it could hit a later transaction
    assert broker.wait_exit(30) == 86
    broker.restart(clean=False, env={})
    producer.close(timeout=5)
    again = Producer(bootstrap_servers=broker.bootstrap, transactional_id="unknown-outcome")
    again.init_transactions()  # the coordinator completes the commit it decided on
    again.close()
    assert [r.value for r in read_partition(broker.bootstrap, "unknown-outcome", 0, 1)] == [b"decided"]


def test_configuration_accepts_kafka_names_validates_and_pickles(embedded_broker):
    config = ProducerConfig(bootstrap_servers="a:1")
    assert config.acks == -1 and config.enable_idempotence
    with pytest.raises(ConfigError, match="unknown"):
        Producer({"bootstrap.servers": embedded_broker.bootstrap, "lingr.ms": 5})
    with pytest.raises(ConfigError, match="acks=all"):
        Producer(bootstrap_servers=embedded_broker.bootstrap, acks=1)
    with pytest.raises(ConfigError, match="host:port"):
        Producer(bootstrap_servers="nohost")
    with pytest.raises(ConfigError, match="compression"):
        Producer(bootstrap_servers=embedded_broker.bootstrap, compression_type="brotli")
    producer = Producer({"bootstrap.servers": embedded_broker.bootstrap, "linger.ms": "7", "compression.type": "gzip"})
    assert producer.config.linger_ms == 7
    clone = pickle.loads(pickle.dumps(producer))
    assert clone.config == producer.config and clone.producer_id != producer.producer_id
    clone.send("pickled", b"v", partition=0).result(10)
    clone.close()
    producer.close()
