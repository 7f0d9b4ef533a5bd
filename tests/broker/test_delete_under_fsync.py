"""DeleteTopics while a group-commit round fsyncs the topic's files on a
worker thread: the delete waits for that fsync before it closes the files
(closing them under it failed the fsync, or let the thread fsync a
descriptor the kernel had given to another file). A DiskIO seam holds the
worker's fsync until the test releases it, so the race is the same every run."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from broker.broker import EmbeddedBroker, FaultSeams
from tests.helpers import PathTrackingIO, create_topic, read_values, wait_for

DOOMED = "doomed"
BYSTANDER = "bystander"
VALUE = b"v" * 20_000  # a round over 16 KiB goes to the worker threads


class HeldWorkerFsync(PathTrackingIO):
    """While ``hold`` is set, a worker thread's fsync of a file of ``directory_prefix``
    waits for ``release`` (fsyncs on the event loop are never held: that would stall the broker)."""

    def __init__(self, directory_prefix: str):
        super().__init__()
        self.directory_prefix = f"/{directory_prefix}"
        self.hold = threading.Event()
        self.release = threading.Event()
        self.held: list[tuple[int, str, int]] = []  # (fd, path, inode) of fsyncs held
        self.after_release_errors: list[OSError] = []

    def fsync(self, fd):
        path = self.paths.get(fd, "")
        on_worker = _running_loop() is None
        if on_worker and self.hold.is_set() and self.directory_prefix in path:
            self.held.append((fd, path, os.fstat(fd).st_ino))
            assert self.release.wait(60), "the test never released the fsync"
            try:
                super().fsync(fd)
            except OSError as error:  # EBADF: the descriptor was closed under us
                self.after_release_errors.append(error)
                raise
            return
        super().fsync(fd)


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def test_delete_topics_waits_for_a_worker_fsync_of_its_files(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    disk = HeldWorkerFsync(f"{DOOMED}-")
    with EmbeddedBroker(str(tmp_path), seams=FaultSeams(disk_io=disk)) as broker:
        create_topic(broker.bootstrap, DOOMED, 4)
        create_topic(broker.bootstrap, BYSTANDER, 2)
        errors: dict[str, list] = {DOOMED: [], BYSTANDER: []}
        delivered = {DOOMED: 0, BYSTANDER: 0}

        def report(topic):
            def on_delivery(error, _message):
                if error is None:
                    delivered[topic] += 1
                else:
                    errors[topic].append(error)
            return on_delivery

        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
        disk.hold.set()
        # acks=all to every partition of the doomed topic: a round over
        # 16 KiB and several files, fsynced on worker threads, held there.
        for partition in range(4):
            producer.produce(DOOMED, value=VALUE, partition=partition, on_delivery=report(DOOMED))
        producer.poll(0)
        wait_for(lambda: disk.held, timeout=30, what="a worker fsync of the doomed topic's files")
        fd, path, inode = disk.held[0]

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        deleting = admin.delete_topics([DOOMED], operation_timeout=30)[DOOMED]
        wait_for(lambda: broker.call(lambda b: DOOMED not in b.replicas.topics), timeout=30, what="the topic unregistered")
        # The delete is under way and waits: the held descriptor is still the
        # doomed file's (not closed, not reused by another file).
        assert os.fstat(fd).st_ino == inode
        assert not deleting.done()
        # Meanwhile the bystander takes writes (they share the next round,
        # which starts once the held one returns).
        for _ in range(20):
            producer.produce(BYSTANDER, value=VALUE, on_delivery=report(BYSTANDER))
        producer.poll(0)

        disk.release.set()
        deleting.result(30)  # raises if the delete failed
        assert producer.flush(60) == 0
        assert disk.after_release_errors == [], "an fsync ran on a descriptor closed under it"
        assert not os.path.exists(os.path.dirname(path)), "the doomed partition's directory is gone"
        # The doomed records were acknowledged or failed cleanly; the bystander lost nothing.
        assert errors[BYSTANDER] == []
        assert delivered[BYSTANDER] == 20
        assert len(read_values(broker.bootstrap, BYSTANDER, partitions=2, expect=20)) == 20
        # The broker stays up and the name can be used again.
        create_topic(broker.bootstrap, DOOMED, 1)
        disk.hold.clear()
        producer.produce(DOOMED, value=b"again", partition=0, on_delivery=report(DOOMED))
        assert producer.flush(30) == 0
    problems = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert problems == [], [r.getMessage() for r in problems]
