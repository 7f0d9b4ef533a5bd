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


def test_a_power_cut_keeps_what_an_fsync_covered_and_may_tear_or_lose_the_rest(tmp_path):
    """``FsyncJournalIO`` notes each fsync's covered length; ``cut_power``
    then cuts every segment of every partition to between that length and
    what was written (a never-fsynced one to anywhere from empty), and a
    journal line the process died writing counts for nothing."""
    from faults.disk import FSYNC_JOURNAL_VARIABLE, FsyncJournalIO, cut_power, durable_sizes, io_from_environment
    from storage.durable import DiskIO

    data = tmp_path / "data"
    (data / "t-0").mkdir(parents=True)
    (data / "t-1").mkdir()
    journal = str(tmp_path / "journal")
    os.environ[FSYNC_JOURNAL_VARIABLE] = journal
    try:
        io = io_from_environment()
    finally:
        del os.environ[FSYNC_JOURNAL_VARIABLE]
    synced, unsynced = str(data / "t-0" / "00000000000000000000.log"), str(data / "t-1" / "00000000000000000000.log")
    fd = os.open(synced, os.O_WRONLY | os.O_CREAT, 0o644)
    io.write(fd, b"a" * 1000)
    io.fsync(fd)
    io.write(fd, b"b" * 500)  # after the fsync: may be lost
    os.close(fd)
    fd = os.open(unsynced, os.O_WRONLY | os.O_CREAT, 0o644)
    io.write(fd, b"c" * 300)
    os.close(fd)
    with open(journal, "ab") as file:
        file.write(b"1500 " + synced.encode())  # half a line: its fsync never returned
    assert durable_sizes(journal) == {synced: 1000}

    # Bytes appended while an fsync runs (a worker's, with the loop going
    # on) are not covered by it; a truncation takes back what it cuts.
    class AppendsDuringTheFsync(DiskIO):
        def fsync(self, fd):
            os.write(fd, b"late")
            super().fsync(fd)

    other = str(tmp_path / "other.journal")
    late_io = FsyncJournalIO(AppendsDuringTheFsync(), other)
    path = str(tmp_path / "late.log")
    fd = late_io.open(path, os.O_WRONLY | os.O_CREAT)
    late_io.write(fd, b"d" * 100)
    late_io.fsync(fd)
    assert os.path.getsize(path) == 104 and durable_sizes(other) == {path: 100}
    late_io.truncate(fd, 60)
    assert durable_sizes(other) == {path: 60}
    late_io.close(fd)
    sizes = set()
    for seed in range(20):
        for path, content in ((synced, b"a" * 1000 + b"b" * 500), (unsynced, b"c" * 300)):
            with open(path, "wb") as file:
                file.write(content)
        damage = cut_power(str(data), journal, random.Random(seed))
        assert {d.path for d in damage} <= {synced, unsynced}
        assert 1000 <= os.path.getsize(synced) <= 1500 and os.path.getsize(unsynced) <= 300
        with open(synced, "rb") as file:
            assert file.read(1000) == b"a" * 1000, "what the fsync covered is untouched"
        sizes.add((os.path.getsize(synced), os.path.getsize(unsynced)))
    assert len(sizes) > 5, "the cut lands in different places"


def test_a_power_cut_cuts_index_files_too_and_a_replaced_file_keeps_what_its_rename_made_durable(tmp_path):
    """The indexes go through the segment's ``DiskIO``, so the journal sees
    their fsyncs and ``cut_power`` cuts them as it cuts segments: back to
    between what an fsync covered and what was written, torn or at an entry
    boundary. A file replaced whole (``replace_file``: written, fsynced,
    renamed) is durable as the renamed file was; other files (snapshots,
    checkpoints) are not cut."""
    from faults.disk import FsyncJournalIO, cut_power, durable_sizes
    from storage.durable import DiskIO, append_file, replace_file
    from storage.index import OFFSET_ENTRY

    partition = tmp_path / "data" / "t-0"
    partition.mkdir(parents=True)
    journal = str(tmp_path / "journal")
    io = FsyncJournalIO(DiskIO(), journal)
    index, txnindex, snapshot = (str(partition / ("00000000000000000000" + suffix)) for suffix in (".index", ".txnindex", ".snapshot"))
    append_file(index, OFFSET_ENTRY.pack(0, 0) * 10, io=io, fsync=True)
    append_file(index, OFFSET_ENTRY.pack(0, 0) * 10, io=io)  # not fsynced: may be lost
    replace_file(txnindex, b"x" * 68, io=io)  # durable through its rename
    append_file(txnindex, b"y" * 34, io=io)
    with open(snapshot, "wb") as file:
        file.write(b"never fsynced, never cut")
    durable = durable_sizes(journal)
    assert (durable[os.path.realpath(index)], durable[os.path.realpath(txnindex)]) == (80, 68)
    cuts = set()
    for seed in range(30):
        for path, content in ((index, OFFSET_ENTRY.pack(0, 0) * 20), (txnindex, b"x" * 68 + b"y" * 34)):
            with open(path, "wb") as file:
                file.write(content)
        damage = cut_power(str(tmp_path / "data"), journal, random.Random(seed))
        assert {d.path for d in damage} <= {index, txnindex}
        assert 80 <= os.path.getsize(index) <= 160 and 68 <= os.path.getsize(txnindex) <= 102
        assert os.path.getsize(snapshot) == 24
        cuts.add(os.path.getsize(index))
    assert any(size % OFFSET_ENTRY.size for size in cuts) and any(size % OFFSET_ENTRY.size == 0 and size < 160 for size in cuts), f"torn and whole-entry cuts: {cuts}"


def test_slowed_fsyncs_take_the_delay_longer_and_speed_up_when_it_ends(tmp_path):
    """``slow_fsyncs``: every fsync of a broker on the control file waits the
    delay first (a slower device, for benchmarks), until ``seconds`` pass."""
    import time

    from faults.disk import ControlledDiskIO

    control = DiskFaultControl(str(tmp_path / "disk-control.json"))
    io = ControlledDiskIO(control.path)
    with open(tmp_path / "data", "wb") as file:
        file.write(b"x")
        began = time.monotonic()
        io.fsync(file.fileno())
        assert time.monotonic() - began < 0.1
        control.slow_fsyncs(0.15, seconds=0.6)
        time.sleep(ControlledDiskIO.CHECK_EVERY * 2)
        began = time.monotonic()
        io.fsync(file.fileno())
        assert time.monotonic() - began >= 0.15
        time.sleep(0.7)
        began = time.monotonic()
        io.fsync(file.fileno())
        assert time.monotonic() - began < 0.1, "the slowdown ended"
