"""Our consumer in consumer groups, over a real socket: subscribe with the
range and cooperative-sticky assignors, rebalance listeners, committed
offsets, sync and async commits, group metadata for transactions (KIP-447),
and the async API."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import txn.aio
from protocol.errors import ErrorCode
from tests.helpers import create_topic
from txn import CommitFailedError, Consumer, OffsetAndMetadata, Producer, TopicPartition, TransactionAbortableError
from txn.errors import FatalError


class Recorder:
    """A rebalance listener that writes down what it is told."""

    def __init__(self, consumer=None, commit_on_revoke=False):
        self.events: list[tuple[str, list]] = []
        self.consumer = consumer
        self.commit_on_revoke = commit_on_revoke

    def on_partitions_revoked(self, partitions):
        self.events.append(("revoked", partitions))
        if self.commit_on_revoke and partitions:
            self.consumer.commit({tp: self.consumer.position(tp) for tp in partitions})

    def on_partitions_assigned(self, partitions):
        self.events.append(("assigned", partitions))

    def on_partitions_lost(self, partitions):
        self.events.append(("lost", partitions))


def fill(bootstrap, topic, partitions, per_partition):
    producer = Producer(bootstrap_servers=bootstrap, linger_ms=1)
    for partition in range(partitions):
        for i in range(per_partition):
            producer.send(topic, b"%d-%d" % (partition, i), partition=partition)
    producer.close()


def poll_until(consumers, condition, timeout=30.0):
    """Poll every consumer in turn (each needs polling to take part in a rebalance)."""
    seen = {id(c): [] for c in consumers}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for consumer in consumers:
            seen[id(consumer)].extend(consumer.poll(0.1))
        if condition(seen):
            return seen
    raise AssertionError(f"condition not reached; assignments {[c.assignment() for c in consumers]}")


def polling_in_threads(consumers, stop):
    """Keep consumers polling (as real workers would) until ``stop`` is set."""
    seen = {id(c): [] for c in consumers}

    def run(consumer):
        while not stop.is_set():
            seen[id(consumer)].extend(consumer.poll(0.1))

    threads = [threading.Thread(target=run, args=(c,)) for c in consumers]
    for thread in threads:
        thread.start()
    return seen, threads


def make_consumer(bootstrap, group, strategy, **options):
    return Consumer(bootstrap_servers=bootstrap, group_id=group, partition_assignment_strategy=strategy, heartbeat_interval_ms=200, session_timeout_ms=6000, **options)


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_two_members_share_the_partitions_and_the_survivor_takes_over(embedded_broker, strategy):
    topic = f"shared-{strategy}"
    create_topic(embedded_broker.bootstrap, topic, 4)
    fill(embedded_broker.bootstrap, topic, 4, 25)
    group = f"g-{strategy}-{uuid.uuid4()}"
    first = make_consumer(embedded_broker.bootstrap, group, strategy)
    # Commit on revoke: a partition that moves in a rebalance is handed over
    # at the position its old owner reached (without it the new owner re-reads
    # from the last commit, and "commits cover what was read" would not hold
    # whenever the first member fetched before the second joined).
    first_listener = Recorder(first, commit_on_revoke=True)
    first.subscribe([topic], listener=first_listener)
    second = make_consumer(embedded_broker.bootstrap, group, strategy)
    second_listener = Recorder(second, commit_on_revoke=True)
    second.subscribe([topic], listener=second_listener)

    stop = threading.Event()
    seen, threads = polling_in_threads([first, second], stop)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (len(first.assignment()) == 2 and len(second.assignment()) == 2):
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    assert len(first.assignment()) == 2 and len(second.assignment()) == 2
    assert set(first.assignment()) | set(second.assignment()) == {TopicPartition(topic, p) for p in range(4)}
    first.commit()
    second.commit()

    if strategy == "cooperative-sticky":
        # Cooperative: the first member never gave up the partitions it kept.
        kept = set(first.assignment())
        revoked = {tp for kind, parts in first_listener.events if kind == "revoked" for tp in parts}
        assert not (revoked & kept), first_listener.events
    else:
        owned: set = set()
        for kind, parts in first_listener.events:
            if kind == "revoked":
                assert set(parts) == owned, "eager: everything is revoked before rejoining"
                owned = set()
            elif kind == "assigned":
                owned |= set(parts)

    second.close()  # leaves the group: the survivor gets everything
    poll_until([first], lambda s: len(first.assignment()) == 4)
    assert ("assigned", sorted(set(first.assignment()) - set(first_listener.events[0][1]))) in first_listener.events or len(first.assignment()) == 4
    first.close()

    checker = make_consumer(embedded_broker.bootstrap, group, strategy)
    committed = checker.committed([TopicPartition(topic, p) for p in range(4)])
    checker.close()
    total = sum(len(v) for v in seen.values())
    assert sum(c.offset for c in committed.values() if c) == total, "commits cover exactly what was read"


def test_new_member_starts_from_committed_offsets_and_async_commit(embedded_broker):
    create_topic(embedded_broker.bootstrap, "resume-from", 1)
    fill(embedded_broker.bootstrap, "resume-from", 1, 10)
    group = f"resume-{uuid.uuid4()}"
    consumer = make_consumer(embedded_broker.bootstrap, group, "range", max_poll_records=4)
    consumer.subscribe("resume-from")
    batch = poll_until([consumer], lambda s: sum(map(len, s.values())) > 0)[id(consumer)]
    assert len(batch) == 4, "max_poll_records bounds one poll"
    assert consumer.position(TopicPartition("resume-from", 0)) == 4
    done = consumer.commit(asynchronous=True)
    done.result(10)
    consumer.close()
    again = make_consumer(embedded_broker.bootstrap, group, "range")
    again.subscribe(["resume-from"])
    rest = poll_until([again], lambda s: sum(map(len, s.values())) >= 6)[id(again)]
    assert [r.offset for r in rest] == list(range(4, 10))
    assert again.committed([TopicPartition("resume-from", 0)])[TopicPartition("resume-from", 0)] == OffsetAndMetadata(4, "")
    again.close()


def test_listener_commits_on_revoke_through_the_sync_facade(embedded_broker):
    """A callback runs on the polling thread and may call the consumer."""
    create_topic(embedded_broker.bootstrap, "revoke-commit", 2)
    fill(embedded_broker.bootstrap, "revoke-commit", 2, 5)
    group = f"revoke-{uuid.uuid4()}"
    consumer = make_consumer(embedded_broker.bootstrap, group, "range")
    listener = Recorder(consumer, commit_on_revoke=True)
    consumer.subscribe(["revoke-commit"], listener=listener)
    poll_until([consumer], lambda s: sum(map(len, s.values())) >= 10)
    consumer.close()  # revokes (and the listener commits) before leaving
    assert listener.events[-1][0] == "revoked"
    admin_view = make_consumer(embedded_broker.bootstrap, group, "range")
    committed = admin_view.committed([TopicPartition("revoke-commit", p) for p in range(2)])
    admin_view.close()
    assert {tp.partition: c.offset for tp, c in committed.items()} == {0: 5, 1: 5}


def test_zombie_member_cannot_commit_offsets_in_a_transaction(embedded_broker):
    """KIP-447: offsets sent with an old generation are refused; the
    transaction becomes abortable, and a plain commit fails likewise."""
    create_topic(embedded_broker.bootstrap, "zombie-in", 2)
    fill(embedded_broker.bootstrap, "zombie-in", 2, 3)
    group = f"zombie-{uuid.uuid4()}"
    old = make_consumer(embedded_broker.bootstrap, group, "range")
    old.subscribe(["zombie-in"])
    poll_until([old], lambda s: len(old.assignment()) == 2)
    stale = old.group_metadata()
    assert stale.generation_id >= 1 and stale.member_id
    newcomer = make_consumer(embedded_broker.bootstrap, group, "range")
    newcomer.subscribe(["zombie-in"])
    poll_until([old, newcomer], lambda s: len(newcomer.assignment()) == 1 and len(old.assignment()) == 1)
    assert old.group_metadata().generation_id > stale.generation_id

    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"zombie-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(TransactionAbortableError):
        producer.send_offsets_to_transaction({TopicPartition("zombie-in", 0): 3}, stale)
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({tp: 3 for tp in old.assignment()}, old.group_metadata())
    producer.commit_transaction()
    producer.close()
    committed = newcomer.committed(old.assignment())
    assert all(c is not None and c.offset == 3 for c in committed.values())
    newcomer.close()
    old.close()


def test_committed_waits_for_offsets_pending_in_an_open_transaction(embedded_broker):
    create_topic(embedded_broker.bootstrap, "pending-offsets", 1)
    group = f"pending-{uuid.uuid4()}"
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"pending-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TopicPartition("pending-offsets", 0): 42}, group)
    consumer = Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id=group)
    timer = threading.Timer(1.0, producer.commit_transaction)
    started = time.monotonic()
    timer.start()
    committed = consumer.committed([TopicPartition("pending-offsets", 0)], timeout=20)
    waited = time.monotonic() - started
    timer.join()
    assert committed[TopicPartition("pending-offsets", 0)].offset == 42
    assert waited >= 0.9, "require_stable: the answer waited for the transaction"
    consumer.close()
    producer.close()


def test_commit_after_being_fenced_raises_commit_failed(embedded_broker):
    create_topic(embedded_broker.bootstrap, "fenced-commit", 1)
    group = f"fenced-{uuid.uuid4()}"
    consumer = make_consumer(embedded_broker.bootstrap, group, "range")
    consumer.subscribe(["fenced-commit"])
    poll_until([consumer], lambda s: len(consumer.assignment()) == 1)
    consumer._async._member.generation_id += 7  # as if a newer generation had formed without us
    with pytest.raises(CommitFailedError):
        consumer.commit({TopicPartition("fenced-commit", 0): 0})
    poll_until([consumer], lambda s: len(consumer.assignment()) == 1 and consumer.group_metadata().generation_id >= 1)
    consumer.commit({TopicPartition("fenced-commit", 0): 0})
    consumer.close()


def test_enforce_rebalance_rejoins_at_the_next_poll(embedded_broker):
    """Kafka's enforceRebalance: the member revokes and rejoins at its next
    poll (a heartbeat, 20 s away here, could not be what made it)."""
    create_topic(embedded_broker.bootstrap, "enforced", 2)
    consumer = Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id=f"enforced-{uuid.uuid4()}", heartbeat_interval_ms=20_000, session_timeout_ms=45_000)
    recorder = Recorder()
    consumer.subscribe(["enforced"], listener=recorder)
    poll_until([consumer], lambda s: len(consumer.assignment()) == 2)
    generation = consumer.group_metadata().generation_id
    recorder.events.clear()
    consumer.poll(0.2)
    assert recorder.events == [], "nothing moves without a reason"
    consumer.enforce_rebalance()
    poll_until([consumer], lambda s: consumer.group_metadata().generation_id > generation and len(consumer.assignment()) == 2, timeout=10)
    both = [TopicPartition("enforced", 0), TopicPartition("enforced", 1)]
    assert recorder.events == [("revoked", both), ("assigned", both)]
    with pytest.raises(FatalError):
        consumer.enforce_rebalance(ErrorCode.NOT_COORDINATOR)  # not an answer that ends a generation
    consumer.close()


def test_enforce_rebalance_after_a_fencing_answer_reports_the_partitions_lost(embedded_broker):
    """A static member replaced by a newcomer with its group.instance.id
    hears of it from its producer's TxnOffsetCommit (Kafka answers
    FENCED_INSTANCE_ID, our broker ILLEGAL_GENERATION: the generation
    moved on with the newcomer's join);
    enforce_rebalance with that answer makes its next poll report the
    partitions lost (they are the newcomer's now), not revoked."""
    create_topic(embedded_broker.bootstrap, "replaced", 2)
    group = f"replaced-{uuid.uuid4()}"
    options = {"group_id": group, "group_instance_id": "worker-1", "heartbeat_interval_ms": 20_000, "session_timeout_ms": 45_000}
    old = Consumer(bootstrap_servers=embedded_broker.bootstrap, **options)
    recorder = Recorder()
    old.subscribe(["replaced"], listener=recorder)
    poll_until([old], lambda s: len(old.assignment()) == 2)
    newcomer = Consumer(bootstrap_servers=embedded_broker.bootstrap, **options)
    newcomer.subscribe(["replaced"])
    poll_until([newcomer], lambda s: len(newcomer.assignment()) == 2)
    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"replaced-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(TransactionAbortableError) as refused:
        producer.send_offsets_to_transaction({TopicPartition("replaced", 0): 1}, old.group_metadata())
    producer.abort_transaction()
    producer.close()
    assert refused.value.code in (ErrorCode.FENCED_INSTANCE_ID, ErrorCode.ILLEGAL_GENERATION)
    recorder.events.clear()
    old.enforce_rebalance(refused.value.code)
    poll_until([old], lambda s: recorder.events, timeout=10)
    assert recorder.events[0] == ("lost", [TopicPartition("replaced", 0), TopicPartition("replaced", 1)])
    newcomer.close()
    old.close()


def test_async_api_copies_with_a_transaction(embedded_broker):
    create_topic(embedded_broker.bootstrap, "aio-in", 2)
    create_topic(embedded_broker.bootstrap, "aio-out", 2)
    fill(embedded_broker.bootstrap, "aio-in", 2, 20)

    async def copy():
        group = f"aio-{uuid.uuid4()}"
        async with txn.aio.Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id=group, heartbeat_interval_ms=200) as consumer, txn.aio.Producer(
            bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"aio-{uuid.uuid4()}"
        ) as producer:
            consumer.subscribe(["aio-in"])
            await producer.init_transactions()
            copied = 0
            while copied < 40:
                records = await consumer.poll(0.5)
                if not records:
                    continue
                producer.begin_transaction()
                for record in records:
                    await producer.send("aio-out", record.value, key=record.key, partition=record.partition)
                await producer.send_offsets_to_transaction({tp: await consumer.position(tp) for tp in consumer.assignment()}, consumer.group_metadata())
                await producer.commit_transaction()
                copied += len(records)
        async with txn.aio.Consumer(bootstrap_servers=embedded_broker.bootstrap) as reader:
            reader.assign([TopicPartition("aio-out", 0), TopicPartition("aio-out", 1)])
            out = []
            for _ in range(40):
                out += await reader.poll(0.2)
                if len(out) >= 40:
                    break
        return copied, sorted(r.value for r in out)

    copied, values = asyncio.run(copy())
    assert copied == 40
    assert values == sorted(b"%d-%d" % (p, i) for p in range(2) for i in range(20))


@pytest.mark.slow
def test_a_refusal_of_a_generation_the_member_has_left_changes_nothing(embedded_broker):
    """The race behind a survivor's long stall (issue 31): a member's
    TxnOffsetCommit goes out with its generation as a round completes, and
    comes back ILLEGAL_GENERATION after the member has joined the next one.
    Handed to enforce_rebalance with the generation it carried, it changes
    nothing: the member keeps what it owns, in the same generation (no lost
    partitions, hence no restore, and no further round). The same answer
    about the member's current generation still reports them lost."""
    create_topic(embedded_broker.bootstrap, "moved-on", 4)
    group = f"moved-on-{uuid.uuid4()}"
    first = make_consumer(embedded_broker.bootstrap, group, "cooperative-sticky")
    recorder = Recorder()
    first.subscribe(["moved-on"], listener=recorder)
    poll_until([first], lambda s: len(first.assignment()) == 4)
    stale = first.group_metadata()
    second = make_consumer(embedded_broker.bootstrap, group, "cooperative-sticky")
    second.subscribe(["moved-on"])
    poll_until([first, second], lambda s: len(first.assignment()) == 2 and len(second.assignment()) == 2)
    settled = time.monotonic() + 1.5  # the cooperative follow-up round (nothing moves in it) ends too
    poll_until([first, second], lambda s: time.monotonic() > settled)
    current = first.group_metadata()
    assert current.generation_id > stale.generation_id

    producer = Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id=f"moved-on-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(TransactionAbortableError) as refused:
        producer.send_offsets_to_transaction({tp: 0 for tp in first.assignment()}, stale)
    producer.abort_transaction()
    producer.close()
    assert refused.value.code == ErrorCode.ILLEGAL_GENERATION

    owned = sorted(first.assignment())
    recorder.events.clear()
    first.enforce_rebalance(refused.value.code, stale.generation_id)
    settled = time.monotonic() + 1.5  # a few polls each, time for a rejoin to show
    poll_until([first, second], lambda s: time.monotonic() > settled)
    assert recorder.events == [], "nothing was lost: the refusal was about a generation the member had left"
    assert sorted(first.assignment()) == owned and first.group_metadata().generation_id == current.generation_id

    first.enforce_rebalance(refused.value.code, current.generation_id)  # the same answer about today's generation
    poll_until([first, second], lambda s: recorder.events, timeout=10)
    assert recorder.events[0] == ("lost", owned)
    second.close()
    first.close()
