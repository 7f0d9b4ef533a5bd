"""Disk faults against a real broker process: failing fsyncs and writes
while an idempotent producer runs, a torn tail and a flipped byte after a
SIGKILL; acknowledged records survive, exactly once, in order."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from faults.disk import ENVIRONMENT_VARIABLE, DiskFaultControl, batch_starts, flip_byte, truncate_tail
from tests.helpers import read_values
from txn import Admin, Producer


class SteadyProducer(threading.Thread):
    """Sends numbered records until told to stop, remembering which were acknowledged."""

    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        self.producer = Producer(bootstrap_servers=bootstrap, linger_ms=2, delivery_timeout_ms=90_000, retry_backoff_max_ms=300)
        self.topic = topic
        self.stop = threading.Event()
        self.futures = []

    def run(self):
        i = 0
        while not self.stop.is_set():
            self.futures.append(self.producer.send(self.topic, b"%07d" % i, partition=0))
            i += 1
            if i % 200 == 0:
                time.sleep(0.02)

    def acknowledged(self):
        return [f.result(120).offset for f in self.futures]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["fsync", "write"])
def test_failing_disk_loses_no_acknowledged_record(broker_process, tmp_path, fault):
    control = DiskFaultControl(str(tmp_path / "disk-control.json"))
    broker = broker_process(env={ENVIRONMENT_VARIABLE: control.path})
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"disk": 1})
    writer = SteadyProducer(broker.bootstrap, "disk")
    writer.start()
    time.sleep(1.0)
    (control.fail_fsyncs if fault == "fsync" else control.fail_writes)(seconds=1.0)
    time.sleep(1.5)
    # The partition refuses appends since the failure: restart, as an operator would.
    broker.restart(clean=False, env={ENVIRONMENT_VARIABLE: control.path})
    time.sleep(1.0)
    writer.stop.set()
    writer.join()
    writer.producer.flush(120)
    offsets = writer.acknowledged()
    writer.producer.close()
    sent = len(writer.futures)
    assert offsets == sorted(offsets) and len(set(offsets)) == sent
    values = read_values(broker.bootstrap, "disk", partitions=1, expect=sent)
    assert values == [b"%07d" % i for i in range(sent)], "every record once, in order, through the disk fault"
    assert "injected" in broker.read_log() or fault == "write", "the fault reached the broker"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["torn-tail", "flipped-byte"])
def test_damaged_tail_is_cut_back_to_the_last_whole_batch(broker_process, tmp_path, damage):
    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"torn": 1})
    producer = Producer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    for i in range(50):
        producer.send("torn", b"%03d" % i, partition=0).result(10)  # one batch per record
    producer.close()
    broker.kill()
    partition_dir = os.path.join(broker.data_dir, "torn-0")
    batches_before = len(batch_starts(os.path.join(partition_dir, sorted(f for f in os.listdir(partition_dir) if f.endswith(".log"))[-1])))
    rng = random.Random(7)
    (truncate_tail if damage == "torn-tail" else flip_byte)(partition_dir, rng)
    broker.start()
    values = read_values(broker.bootstrap, "torn", partitions=1, expect=49, timeout=10)
    assert values == [b"%03d" % i for i in range(49)], "all but the damaged last batch survive"
    assert batches_before == 50
    producer = Producer(bootstrap_servers=broker.bootstrap)
    assert producer.send("torn", b"after", partition=0).result(10).offset == 49, "appends continue where the intact log ends"
    producer.close()
