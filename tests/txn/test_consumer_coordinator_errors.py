"""A txn.Consumer whose SyncGroup fails on the coordinator, or whose
leader's Metadata request loses its connection, keeps polling: it forgets
the coordinator, rejoins after the retry backoff, and gets its assignment
once the coordinator can write again (Kafka's behaviour)."""

from __future__ import annotations

import time

from broker.broker import EmbeddedBroker, FaultSeams
from faults.process import restartable_port
from tests.helpers import FullDiskUnderOffsets, create_topic
from txn.consumer import Consumer
from txn.membership import MemberState
from txn.types import TopicPartition


def test_a_sync_group_refused_by_the_coordinator_is_rejoined_until_it_works(tmp_path):
    data_dir = str(tmp_path / "data")
    port = restartable_port()  # the broker comes back on it
    disk = FullDiskUnderOffsets()
    disk.full.set()
    broker = EmbeddedBroker(data_dir, port=port, group_initial_rebalance_delay_ms=0, seams=FaultSeams(disk_io=disk)).start()
    consumer = Consumer(broker.bootstrap, group_id="refused-sync", retry_backoff_ms=50)
    try:
        create_topic(broker.bootstrap, "refused-sync", 2)
        consumer.subscribe(["refused-sync"])
        # The leader's assignment cannot be written: every SyncGroup is
        # answered COORDINATOR_NOT_AVAILABLE (the failed write leaves the
        # offsets log refusing appends until it is reopened). Polls go on,
        # empty, and the member rejoins round after round.
        deadline = time.monotonic() + 30
        rounds_before = None
        while time.monotonic() < deadline:
            assert consumer.poll(0.3) == []
            assert consumer.assignment() == []
            rounds = broker.call(lambda b: b.groups.coordinator.groups["refused-sync"].generation)
            rounds_before = rounds_before if rounds_before is not None else rounds
            if disk.refused >= 1 and rounds >= rounds_before + 2:
                break
        else:
            raise AssertionError(f"the member did not rejoin after a refused SyncGroup ({disk.refused} refused writes)")
        assert consumer._async._member.state in (MemberState.JOINING, MemberState.SYNCING), "a state the next round may start from"
        # The disk has room again; the broker reopens the offsets log.
        broker.stop()
        broker = EmbeddedBroker(data_dir, port=port, group_initial_rebalance_delay_ms=0).start()
        deadline = time.monotonic() + 60
        while set(consumer.assignment()) != {TopicPartition("refused-sync", 0), TopicPartition("refused-sync", 1)}:
            assert time.monotonic() < deadline, "the consumer never got its assignment"
            consumer.poll(0.3)
    finally:
        consumer.close()
        broker.stop()


def test_a_leader_whose_metadata_request_loses_its_connection_rejoins(tmp_path):
    """The leader's Metadata request (for the assignment) fails with a lost
    connection, as it does when the broker restarts under it: poll does not
    raise, the member rejoins and gets its assignment."""
    broker = EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0).start()
    consumer = Consumer(broker.bootstrap, group_id="lost-metadata", retry_backoff_ms=50)
    try:
        create_topic(broker.bootstrap, "lost-metadata", 2)
        cluster = consumer._async.cluster
        refresh = cluster.refresh
        failed = []

        async def refresh_losing_the_first_leader_request(topics, *, allow_auto_create=True):
            if not allow_auto_create and not failed:  # the leader's request, before it assigns
                failed.append(topics)
                raise ConnectionError("broker closed the connection")
            return await refresh(topics, allow_auto_create=allow_auto_create)

        cluster.refresh = refresh_losing_the_first_leader_request
        consumer.subscribe(["lost-metadata"])
        deadline = time.monotonic() + 30
        while set(consumer.assignment()) != {TopicPartition("lost-metadata", 0), TopicPartition("lost-metadata", 1)}:
            assert time.monotonic() < deadline, "the consumer never got its assignment"
            consumer.poll(0.3)
        assert failed == [["lost-metadata"]], "the leader's Metadata request failed once"
    finally:
        consumer.close()
        broker.stop()
