"""The exactly-once copier, as Apache Kafka's transactions system test runs it:
100,000 seeded records, copiers killed (SIGKILL) and restarted, one in three
transactions aborted on purpose, optionally the broker killed mid-copy; the
output, read read_committed, holds every input record exactly once."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.conftest import REPO
from tests.helpers import create_topic, seed_input

COPIERS = {
    "confluent": os.path.join(REPO, "examples", "transactional_copier.py"),
    "txn": os.path.join(REPO, "examples", "txn_copier.py"),
}
BROKER_CONFIG = ("group.min.session.timeout.ms=1000", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")


class OutputReader(threading.Thread):
    """Reads the output topic read_committed for the whole test."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.values: list[bytes] = []
        self.stop = threading.Event()

    def run(self):
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"verify-{uuid.uuid4()}", "isolation.level": "read_committed", "enable.auto.commit": False})
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        while not self.stop.is_set():
            for message in consumer.consume(5000, 0.2):
                if message.error() is None:
                    self.values.append(message.value())
        consumer.close()


class Copiers:
    def __init__(self, bootstrap: str, count: int, log_dir: str, abort_ratio: float, program: str):
        self.program = program
        self.bootstrap = bootstrap
        self.log_dir = log_dir
        self.abort_ratio = abort_ratio
        self.processes: dict[int, subprocess.Popen] = {}
        self.starts = 0
        for index in range(count):
            self.start(index)

    def start(self, index: int) -> None:
        self.starts += 1
        log = open(os.path.join(self.log_dir, f"copier-{index}.log"), "ab")
        self.processes[index] = subprocess.Popen(
            [sys.executable, self.program, "--bootstrap", self.bootstrap, "--input", "input", "--output", "output", "--group", "copiers",
             "--transactional-id", f"copier-{index}", "--abort-ratio", str(self.abort_ratio), "--session-timeout-ms", "3000", "--seed", str(self.starts)],
            cwd=REPO, stdout=log, stderr=log,
        )
        log.close()

    def kill(self, index: int) -> None:
        process = self.processes[index]
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(30)

    def restart_exited(self) -> None:
        for index, process in list(self.processes.items()):
            if process.poll() is not None:
                self.start(index)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def run_copy(broker, tmp_path, *, records: int, kill_broker: bool, kills: int = 4, client: str = "confluent") -> None:

    create_topic(broker.bootstrap, "input", 2)
    create_topic(broker.bootstrap, "output", 3)
    seed_input(broker.bootstrap, "input", records)
    reader = OutputReader(broker.bootstrap, "output", 3)
    reader.start()
    copiers = Copiers(broker.bootstrap, 2, str(tmp_path), abort_ratio=1 / 3, program=COPIERS[client])
    rng = random.Random(42)
    deadline = time.monotonic() + 240
    faults = 0
    try:
        while len(set(reader.values)) < records and time.monotonic() < deadline:
            time.sleep(0.3)
            copiers.restart_exited()
            if faults < kills and len(reader.values) > records * (faults + 1) / (kills + 2):
                faults += 1
                if kill_broker and faults == 2:
                    broker.restart(clean=False)
                else:
                    copiers.kill(rng.randrange(2))
                    copiers.restart_exited()
        time.sleep(2)  # let anything late arrive, so duplicates would show
    finally:
        copiers.stop()
        reader.stop.set()
        reader.join(30)
    counts = collections.Counter(reader.values)
    duplicates = {v: c for v, c in counts.items() if c > 1}
    missing = records - len(counts)
    assert faults == kills, f"only {faults} faults were injected"
    assert not duplicates, f"{len(duplicates)} records copied more than once, e.g. {list(duplicates.items())[:5]}"
    assert missing == 0, f"{missing} records never copied"
    assert set(counts) == {b"%d" % i for i in range(records)}


@pytest.mark.slow
@pytest.mark.parametrize("client", sorted(COPIERS))
def test_copier_exactly_once_through_copier_kills(broker_process, tmp_path, client):
    broker = broker_process(*BROKER_CONFIG)
    run_copy(broker, tmp_path, records=100_000, kill_broker=False, client=client)


@pytest.mark.slow
@pytest.mark.parametrize("client", sorted(COPIERS))
def test_copier_exactly_once_through_a_broker_kill(broker_process, tmp_path, client):
    broker = broker_process(*BROKER_CONFIG)
    run_copy(broker, tmp_path, records=100_000, kill_broker=True, client=client)
