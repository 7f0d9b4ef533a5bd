"""Many clients at once through the broker's shared group commit
(``storage.group_commit.FsyncRounds``: one round for every partition,
``__transaction_state`` and ``__consumer_offsets`` included), then SIGKILL,
or SIGKILL and a power cut (every segment file of every partition, the
internal ones too, loses or tears what no fsync had covered:
``faults.disk.cut_power``): every acknowledged record survives, every
transaction is all there or not at all, and none is left hanging (each
partition's last stable offset reaches its end once the coordinator has
recovered)."""

from __future__ import annotations

import glob
import os
import random
import threading
import time
import uuid

import pytest

from tests.helpers import create_topic, read_values, wait_for

PRODUCERS, COPIERS, PER_TXN = 8, 4, 5


def _produce_until(bootstrap: str, topic: str, index: int, stop: threading.Event, acked: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                         "message.timeout.ms": 5000, "reconnect.backoff.max.ms": 200})

    def delivered(error, message):
        if error is None:
            acked.append(message.value())

    n = 0
    while not stop.is_set():
        for _ in range(10):
            producer.produce(topic, b"p%d-%d" % (index, n), partition=index, on_delivery=delivered)
            n += 1
        producer.poll(0.005)
    producer.flush(6)


def _commit_until(bootstrap: str, topic: str, group_topic: str, index: int, stop: threading.Event, committed: list[list[bytes]]) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"crash-{uuid.uuid4().hex[:6]}-{index}", "linger.ms": 2,
                         "transaction.timeout.ms": 3000, "message.timeout.ms": 3000, "reconnect.backoff.max.ms": 200})
    producer.init_transactions(30)
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"crash-group-{index}", "enable.auto.commit": False})
    k = 0
    try:
        while not stop.is_set():
            values = [b"t%d-%d-%d" % (index, k, j) for j in range(PER_TXN)]
            producer.begin_transaction()
            for value in values:
                producer.produce(topic, value, partition=index)
            producer.send_offsets_to_transaction([TopicPartition(group_topic, index, (k + 1) * PER_TXN)], group.consumer_group_metadata(), 10)
            producer.commit_transaction(10)
            committed.append(values)  # acknowledged: EndTxn answered after PrepareCommit was durable
            k += 1
    except KafkaException:
        pass  # the broker is gone: what was acknowledged is in `committed`
    finally:
        group.close()


def _latest_offsets(bootstrap: str, topic: str, partitions: int, isolation) -> dict[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}, isolation_level=isolation, request_timeout=10)
    return {tp.partition: future.result(10).offset for tp, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("seconds, power_cut", [(0.5, False), (1.2, True)])
def test_sigkill_under_many_clients_loses_no_acknowledged_record_and_leaves_no_transaction_hanging(broker_process, tmp_path, seconds, power_cut):
    from confluent_kafka import IsolationLevel

    from faults.disk import FSYNC_JOURNAL_VARIABLE, cut_power, durable_sizes, written_length

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=200",
                            env={FSYNC_JOURNAL_VARIABLE: journal} if power_cut else None)
    plain, transactional, inputs = "plain", "txn-out", "txn-in"
    create_topic(broker.bootstrap, plain, PRODUCERS)
    create_topic(broker.bootstrap, transactional, COPIERS)
    create_topic(broker.bootstrap, inputs, COPIERS)
    stop = threading.Event()
    acked: list[list[bytes]] = [[] for _ in range(PRODUCERS)]
    committed: list[list[list[bytes]]] = [[] for _ in range(COPIERS)]
    threads = [threading.Thread(target=_produce_until, args=(broker.bootstrap, plain, i, stop, acked[i]), daemon=True) for i in range(PRODUCERS)]
    threads += [threading.Thread(target=_commit_until, args=(broker.bootstrap, transactional, inputs, i, stop, committed[i]), daemon=True) for i in range(COPIERS)]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(committed) and all(acked), 60, "every client to have something acknowledged")
    time.sleep(seconds)
    if power_cut:
        # The machine stops at an instant when some segment holds bytes no
        # fsync has covered (between rounds every byte may be durable, and
        # then the cut would lose nothing): stopped first, so the files
        # hold still while we look.
        for _ in range(200):
            broker.pause()
            durable = durable_sizes(journal)
            segments = glob.glob(os.path.join(broker.data_dir, "*", "*.log"))
            if any(written_length(path) > durable.get(os.path.realpath(path), 0) for path in segments):
                break
            broker.resume()
            time.sleep(0.01)
        else:
            raise AssertionError("no instant with a tail no fsync covered")
    broker.kill()  # SIGKILL, in the middle of rounds
    acked_at_kill = [list(values) for values in acked]
    committed_at_kill = [list(values) for values in committed]
    stop.set()
    for thread in threads:
        thread.join(30)
    if power_cut:
        cut_power(broker.data_dir, journal, random.Random(seconds))
        broker.env = None
    broker.start()

    # Every record acknowledged before the kill is there, once.
    survived = read_values(broker.bootstrap, plain, partitions=PRODUCERS, isolation="read_uncommitted", expect=sum(map(len, acked_at_kill)))
    assert len(survived) == len(set(survived)), "no record twice"
    missing = {value for values in acked_at_kill for value in values} - set(survived)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"

    # No transaction left hanging: every partition's last stable offset
    # reaches its end (recovery finishes a prepared one, the timeout aborts
    # one left ongoing).
    def settled():
        committed_ends = _latest_offsets(broker.bootstrap, transactional, COPIERS, IsolationLevel.READ_COMMITTED)
        ends = _latest_offsets(broker.bootstrap, transactional, COPIERS, IsolationLevel.READ_UNCOMMITTED)
        return committed_ends == ends

    wait_for(settled, 60, "every transaction to end after the restart", interval=0.5)
    visible = read_values(broker.bootstrap, transactional, partitions=COPIERS, isolation="read_committed")
    assert len(visible) == len(set(visible))
    for values in (v for per_copier in committed_at_kill for v in per_copier):
        assert set(values) <= set(visible), f"an acknowledged commit lost: {values}"
    by_transaction: dict[bytes, int] = {}
    for value in visible:
        key = value.rsplit(b"-", 1)[0]
        by_transaction[key] = by_transaction.get(key, 0) + 1
    assert set(by_transaction.values()) == {PER_TXN}, "a transaction is all there or not at all"
    # The input offsets committed with each acknowledged transaction too.
    from confluent_kafka import Consumer, TopicPartition

    for index, transactions in enumerate(committed_at_kill):
        group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"crash-group-{index}", "enable.auto.commit": False})
        try:
            [position] = group.committed([TopicPartition(inputs, index)], timeout=10)
        finally:
            group.close()
        assert position.offset >= len(transactions) * PER_TXN, (index, position.offset, len(transactions))
