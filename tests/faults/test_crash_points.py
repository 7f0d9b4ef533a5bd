"""The crash points beyond the coordinator's (those have tests in
tests/broker/test_transactions.py): a torn write made by the broker itself,
a crash after transactional offsets are written but pending, and a client
dying between produce and commit. Real processes, real exits."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from faults.points import CRASH_EXIT_CODE, ENVIRONMENT_VARIABLE
from tests.conftest import REPO
from tests.helpers import read_values
from txn import Admin, Consumer, Producer, TopicPartition
from txn.errors import KafkaError


@pytest.mark.slow
def test_torn_write_by_the_broker_loses_only_the_unacknowledged_batch(broker_process):
    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"torn-live": 1})
    broker.restart(clean=True, env={ENVIRONMENT_VARIABLE: "storage.torn_write@25:exit"})
    producer = Producer(bootstrap_servers=broker.bootstrap, linger_ms=0, delivery_timeout_ms=3000, request_timeout_ms=1000)
    acknowledged = []
    for i in range(100):
        try:
            producer.send("torn-live", b"%03d" % i, partition=0).result(10)
            acknowledged.append(b"%03d" % i)
        except Exception:
            break
    assert broker.wait_exit(10) == CRASH_EXIT_CODE, "the torn write ended the broker"
    producer._thread.stop()
    broker.env = {}  # restart disarmed
    broker.start()
    values = read_values(broker.bootstrap, "torn-live", partitions=1, idle=1.0)
    assert values[: len(acknowledged)] == acknowledged, "every acknowledged record survives, in order"
    assert len(values) <= len(acknowledged) + 1 and len(acknowledged) < 100
    producer = Producer(bootstrap_servers=broker.bootstrap)
    producer.send("torn-live", b"after", partition=0).result(10)
    producer.close()
    assert read_values(broker.bootstrap, "torn-live", partitions=1, idle=1.0)[-1] == b"after"


@pytest.mark.slow
def test_crash_with_offsets_pending_never_commits_them(broker_process):
    broker = broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=500")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"pending-in": 1, "pending-out": 1})
    broker.restart(clean=True, env={ENVIRONMENT_VARIABLE: "groupcoord.after_pending_offsets@1:exit"})
    group = f"pending-{uuid.uuid4()}"
    producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id="pending-crash", delivery_timeout_ms=3000, request_timeout_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("pending-out", b"lost-with-its-offsets", partition=0)
    with pytest.raises((KafkaError, ConnectionError, TimeoutError)):
        producer.send_offsets_to_transaction({TopicPartition("pending-in", 0): 5}, group)
    assert broker.wait_exit(10) == CRASH_EXIT_CODE
    producer._thread.stop()
    broker.env = {}  # restart disarmed
    broker.start()
    successor = Producer(bootstrap_servers=broker.bootstrap, transactional_id="pending-crash")
    successor.init_transactions()  # fences the dead instance and aborts its transaction
    consumer = Consumer(bootstrap_servers=broker.bootstrap, group_id=group)
    assert consumer.committed([TopicPartition("pending-in", 0)], timeout=20)[TopicPartition("pending-in", 0)] is None
    with successor.transaction():
        successor.send_offsets_to_transaction({TopicPartition("pending-in", 0): 7}, group)
    assert consumer.committed([TopicPartition("pending-in", 0)], timeout=20)[TopicPartition("pending-in", 0)].offset == 7
    consumer.close()
    successor.close()
    assert read_values(broker.bootstrap, "pending-out", partitions=1, idle=1.0) == []


CLIENT = r"""
import sys
sys.path.insert(0, {repo!r})
from faults.points import point  # armed from ONCEFLOW_CRASH_POINTS
from txn import Producer
producer = Producer(bootstrap_servers={bootstrap!r}, transactional_id="client-crash", crash_point=point)
producer.init_transactions()
with producer.transaction():
    for i in range(20):
        producer.send("client-crash", b"%d" % i, partition=0)
print("unreachable: the crash point fires inside commit", flush=True)
"""


@pytest.mark.slow
def test_client_dying_between_produce_and_commit_leaves_nothing_visible(broker_process):
    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"client-crash": 1})
    environment = dict(os.environ, **{ENVIRONMENT_VARIABLE: "txn.before_commit@1:exit"})
    child = subprocess.run([sys.executable, "-c", CLIENT.format(repo=REPO, bootstrap=broker.bootstrap)], env=environment, capture_output=True, text=True, timeout=60)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    assert "unreachable" not in child.stdout
    successor = Producer(bootstrap_servers=broker.bootstrap, transactional_id="client-crash")
    successor.init_transactions()
    with successor.transaction():
        successor.send("client-crash", b"successor", partition=0)
    successor.close()
    assert read_values(broker.bootstrap, "client-crash", partitions=1, idle=1.0) == [b"successor"]


def test_the_producer_fires_only_the_crash_point_it_was_given(embedded_broker):
    """The client takes its crash point as a parameter: a producer given one
    stops at ``txn.before_commit`` (nothing becomes visible); a producer given
    none ignores points armed in this process (txn never imports faults)."""
    from faults import points

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"given-point": 1})

    def stop_before_commit(name):
        if name == "txn.before_commit":
            raise points.CrashPointReached(name)

    armed = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="given-point", crash_point=stop_before_commit)
    armed.init_transactions()
    armed.begin_transaction()
    armed.send("given-point", b"never-committed", partition=0)
    with pytest.raises(points.CrashPointReached, match="txn.before_commit"):
        armed.commit_transaction()
    armed.abort_transaction()
    armed.close()

    points.arm("txn.before_commit", action="raise")
    try:
        plain = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="no-point")
        plain.init_transactions()
        with plain.transaction():
            plain.send("given-point", b"committed", partition=0)
        plain.close()
        assert points.is_armed("txn.before_commit"), "a producer without a crash point never passes the process's points"
    finally:
        points.disarm_all()
    assert read_values(embedded_broker.bootstrap, "given-point", partitions=1, idle=0.5) == [b"committed"]


@pytest.mark.slow
def test_the_broker_arms_the_cleaners_crash_points_and_a_swap_cut_short_keeps_every_key(broker_process):
    """The broker's housekeeping gives the cleaner its crash point: armed
    through the environment, the compaction swap stops at
    ``cleaner.swap_renamed`` (the cleaned files renamed in, the old ones
    not yet out) with the process's exit; the restarted broker finishes or
    undoes the swap, and every key still reads its latest value."""
    broker = broker_process()  # housekeeping every 5 minutes: nothing is cleaned while we write
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"compacted": 1}, configs={"compacted": {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0"}})
    latest = {}
    with Producer(bootstrap_servers=broker.bootstrap, linger_ms=0, batch_size=256) as producer:  # small batches: many segments
        for i in range(100):
            key = b"k%d" % (i % 7)
            producer.send("compacted", key + b"=%d" % i, key=key, partition=0)
            latest[key] = key + b"=%d" % i
        producer.flush(30)
    broker.config += ("log.retention.check.interval.ms=200",)
    broker.restart(clean=True, env={ENVIRONMENT_VARIABLE: "cleaner.swap_renamed@1:exit"})
    assert broker.wait_exit(20) == CRASH_EXIT_CODE, "the cleaner's crash point ended the broker"
    broker.env = {}  # restart disarmed
    broker.start()
    values = read_values(broker.bootstrap, "compacted", partitions=1, idle=1.0)
    assert {value.split(b"=")[0]: value for value in values} == latest, "every key keeps its latest value through the interrupted swap"
    assert len(values) < 100, "the restarted broker compacted"
