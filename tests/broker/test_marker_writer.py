"""``broker.transactions.MarkerWriter.append``: a commit's markers appended
without waiting, and the callable that asks for their fsync, which the
coordinator calls again at the id's next records: pending until the round,
done at once after it, and failing as ``wait_durable`` does once a log has
failed."""

from __future__ import annotations

import asyncio
import uuid

import attrs
import pytest

from broker.transactions import MarkerWriter
from coordinator.metadata import TopicPartition, TxnMetadata
from coordinator.state import TxnState
from protocol.clock import ManualClock
from protocol.records import encode_batch
from storage.group_commit import FsyncRounds
from storage.log import LogFailedError, PartitionLog


@attrs.define
class Topic:
    topic_id: uuid.UUID


class Replicas:
    """The slice of ``broker.replica`` the marker writer uses, over real logs."""

    def __init__(self, directory, partitions):
        self.rounds = FsyncRounds()
        self.logs = {(p.topic, p.partition): PartitionLog.open(str(directory / f"{p.topic}-{p.partition}"), fsync_rounds=self.rounds) for p in partitions}
        self.topics = {p.topic: Topic(uuid.uuid5(uuid.NAMESPACE_OID, p.topic)) for p in partitions}
        self.notified = []

    def get_log(self, topic, index):
        return self.logs.get((topic, index))

    def notify_appended(self, topic, index):
        self.notified.append((topic, index))


def open_transaction(replicas, partitions, producer_id=7):
    for partition in partitions:
        replicas.get_log(partition.topic, partition.partition).append(
            encode_batch([(None, b"v", (), 1)], producer_id=producer_id, producer_epoch=0, base_sequence=0, is_transactional=True))
    return TxnMetadata("tx", producer_id, 0, 60_000, TxnState.PREPARE_COMMIT, frozenset(partitions))


PARTITIONS = [TopicPartition("a", 0), TopicPartition("b", 1)]


def test_asked_again_after_their_round_the_markers_are_durable_at_once(tmp_path):
    async def scenario():
        replicas = Replicas(tmp_path, PARTITIONS)
        metadata = open_transaction(replicas, PARTITIONS)
        ask, marked_at = MarkerWriter(replicas, ManualClock(), lambda name: None).append(metadata, commit=True)
        assert [(topic, index, offset) for topic, index, offset, _id in marked_at] == [("a", 0, 1), ("b", 1, 1)]
        first = ask()
        assert not first.done(), "the markers' round has not run yet"
        await first
        assert all(log.durable_offset == 2 for log in replicas.logs.values())
        again = ask()
        assert again.done() and again.result() is None, "durable: answered at once, no gather and no loop turn"

    asyncio.run(scenario())


def test_asked_again_after_a_log_failed_it_fails_as_wait_durable_does(tmp_path):
    async def scenario():
        replicas = Replicas(tmp_path, PARTITIONS)
        metadata = open_transaction(replicas, PARTITIONS)
        ask, _marked_at = MarkerWriter(replicas, ManualClock(), lambda name: None).append(metadata, commit=True)
        await ask()
        replicas.get_log("b", 1).mark_failed(OSError("disk gone"))
        with pytest.raises(LogFailedError):
            await ask()

    asyncio.run(scenario())
