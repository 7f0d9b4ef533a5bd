"""``broker.transactions.MarkerWriter`` over real logs. ``append``: a
commit's markers appended without waiting, and the callable that asks for
their fsync, which the coordinator calls again at the id's next records:
pending until the round, done at once after it, and failing as
``wait_durable`` does once a log has failed. ``data_ends``: where the
producer's own data ends in each partition (not the log's end), which
``data_present`` and ``opened_after`` read after a restart."""

from __future__ import annotations

import asyncio
import os
import uuid

import attrs
import pytest

from broker.transactions import MarkerWriter
from coordinator.metadata import TopicPartition, TxnMetadata
from coordinator.state import TxnState
from protocol.clock import ManualClock
from protocol.records import ControlType, encode_batch
from storage.group_commit import FsyncRounds
from storage.log import LogFailedError, PartitionLog
from storage.recovery import CLEAN_SHUTDOWN_FILE


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


def append(partition_log, producer_id, *, sequence=0, values=(b"v",), transactional=True, epoch=0):
    records = [(None, value, (), 1) for value in values]
    return partition_log.append(encode_batch(records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, is_transactional=transactional))


def test_a_decision_names_where_its_producers_data_ends_not_where_its_log_ends(tmp_path):
    """``data_ends``: per partition, the producer's last batch's last
    offset + 1, not the log's end, which may include another producer's
    bytes appended past it (here a plain record at offset 2); a
    coordinator's batch without sequences (the producer's offsets records
    in ``__consumer_offsets``) counts as the producer's; a partition added
    and never written to names 0 (nothing of the transaction to find)."""
    data, offsets, empty = TopicPartition("a", 0), TopicPartition("__consumer_offsets", 3), TopicPartition("b", 1)
    replicas = Replicas(tmp_path, [data, offsets, empty])
    append(replicas.get_log("a", 0), 7, values=(b"one", b"two"))
    append(replicas.get_log("a", 0), -1, transactional=False)
    append(replicas.get_log("b", 1), 8, transactional=True)  # another producer's open transaction
    append(replicas.get_log("__consumer_offsets", 3), -1, transactional=False)
    append(replicas.get_log("__consumer_offsets", 3), 7, sequence=-1)
    metadata = TxnMetadata("tx", 7, 0, 60_000, TxnState.PREPARE_COMMIT, frozenset({data, offsets, empty}))
    writer = MarkerWriter(replicas, ManualClock(), lambda name: None)
    assert writer.data_ends(metadata) == (("__consumer_offsets", 3, 2), ("a", 0, 2), ("b", 1, 0))
    assert replicas.get_log("a", 0).log_end_offset == 3


def test_a_log_that_lost_another_producers_bytes_still_holds_the_whole_transaction(tmp_path):
    """After a power cut that took back another producer's bytes past the
    transaction's data (and nothing of the data), the log still reaches
    the producer's own end: ``data_present`` is true, where the log's end
    at the decision (what a decision named before) is out of reach. Cut
    into the transaction's data, it is false."""
    data = TopicPartition("a", 0)
    replicas = Replicas(tmp_path, [data])
    partition_log = replicas.get_log("a", 0)
    append(partition_log, 7, values=(b"one", b"two"))
    segment = os.path.join(str(tmp_path), "a-0", "00000000000000000000.log")
    transaction_bytes = partition_log.active_segment.size  # its data (the file may run on with zeros written ahead)
    append(partition_log, -1, transactional=False)
    writer = MarkerWriter(replicas, ManualClock(), lambda name: None)
    decision = TxnMetadata("tx", 7, 0, 60_000, TxnState.PREPARE_COMMIT, frozenset({data}))
    decision = decision.with_data_ends(writer.data_ends(decision))
    log_ends = attrs.evolve(decision, data_ends=(("a", 0, partition_log.log_end_offset),))
    partition_log.close()

    for cut_at, whole in ((transaction_bytes, True), (transaction_bytes - 1, False)):
        with open(segment, "r+b") as file:
            file.truncate(cut_at)
        clean = os.path.join(str(tmp_path), "a-0", CLEAN_SHUTDOWN_FILE)
        if os.path.exists(clean):
            os.remove(clean)  # a power cut: recovery scans the segment
        reopened = Replicas(tmp_path, [data])
        restarted = MarkerWriter(reopened, ManualClock(), lambda name: None)
        assert restarted.data_present(decision) is whole
        assert restarted.data_present(log_ends) is False, "the log's end at the decision is gone with the other producer's bytes"
        reopened.get_log("a", 0).close()


def test_a_later_transaction_of_the_producer_is_found_past_the_exact_ends(tmp_path):
    """``opened_after``: the producer's open transaction that begins at or
    past the end a decision named is a later one's (begun after this
    commit's marker), in a partition where the decision's transaction
    wrote (end: its last batch + 1) and in one where it wrote nothing (end
    0: any open transaction of the producer there is a later one's); this
    transaction's own data is not."""
    written, empty = TopicPartition("a", 0), TopicPartition("b", 1)
    replicas = Replicas(tmp_path, [written, empty])
    writer = MarkerWriter(replicas, ManualClock(), lambda name: None)
    metadata = TxnMetadata("tx", 7, 0, 60_000, TxnState.PREPARE_COMMIT, frozenset({written, empty}))
    append(replicas.get_log("a", 0), 7)
    decision = metadata.with_data_ends(writer.data_ends(metadata))
    assert decision.data_ends == (("a", 0, 1), ("b", 1, 0))
    assert writer.opened_after(decision) == frozenset(), "its own open data, below its ends"
    replicas.get_log("a", 0).append_marker(ControlType.COMMIT, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=1)
    append(replicas.get_log("a", 0), 7, sequence=1)
    append(replicas.get_log("b", 1), 7, sequence=0)
    assert writer.opened_after(decision) == frozenset({written, empty})
