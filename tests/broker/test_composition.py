"""The broker's composition passes its seams down: the crash-point callable
reaches the transaction coordinator, the marker writer and the group APIs;
the DiskIO and the index budget reach every partition log it opens."""

from __future__ import annotations

from broker.broker import EmbeddedBroker, FaultSeams
from storage.segment import DiskIO
from txn import Admin, Consumer, Producer, TopicPartition


class CountingDiskIO(DiskIO):
    def __init__(self):
        self.writes = 0
        self.fsyncs = 0

    def write(self, fd, data):
        self.writes += 1
        super().write(fd, data)

    def fsync(self, fd):
        self.fsyncs += 1
        super().fsync(fd)


def test_seams_given_to_the_broker_reach_every_room(tmp_path):
    passed: list[str] = []
    disk = CountingDiskIO()
    seams = FaultSeams(crash_point=passed.append, disk_io=disk)
    with EmbeddedBroker(str(tmp_path / "data"), seams=seams, group_initial_rebalance_delay_ms=0) as embedded:
        with Admin(bootstrap_servers=embedded.bootstrap) as admin:
            admin.create_topics({"seams-in": 1, "seams-out": 2})
        producer = Producer(bootstrap_servers=embedded.bootstrap, transactional_id="seams")
        producer.init_transactions()
        with producer.transaction():
            producer.send("seams-out", b"a", partition=0)
            producer.send("seams-out", b"b", partition=1)
            producer.send_offsets_to_transaction({TopicPartition("seams-in", 0): 3}, "seams-group")
        producer.close()
        consumer = Consumer(bootstrap_servers=embedded.bootstrap, group_id="seams-group")
        assert consumer.committed([TopicPartition("seams-in", 0)], timeout=20)[TopicPartition("seams-in", 0)].offset == 3
        consumer.close()
        logs = embedded.call(lambda broker: list(broker.replicas.logs.values()))
        budget = embedded.call(lambda broker: broker.index_budget)
    assert "groupcoord.after_pending_offsets" in passed, "the group APIs call the broker's crash point"
    assert "coordinator.after_prepare_commit" in passed and "coordinator.before_complete" in passed
    assert "coordinator.markers_partial" in passed, "the marker writer calls it (3 partitions got markers)"
    assert disk.writes > 0 and disk.fsyncs > 0, "the logs write through the broker's DiskIO"
    assert logs and all(log.io is disk for log in logs)
    assert all(segment.index_budget is budget for log in logs for segment in log.segments), "one budget per broker"


def test_two_brokers_own_two_budgets(tmp_path):
    with EmbeddedBroker(str(tmp_path / "one")) as one, EmbeddedBroker(str(tmp_path / "two")) as two:
        assert one.call(lambda broker: broker.index_budget) is not two.call(lambda broker: broker.index_budget)
