"""Watchers of a running pipeline, for its timeline and its availability
(``faults.availability``): a read_committed reader that notes when output
records become visible, and a prober that notes how much input the
pipeline has consumed and committed. Each is a daemon thread that samples
until stopped; samples are ``(seconds since the run started, total)``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from faults.availability import Output


class TopicWatcher(threading.Thread):
    """Counts the committed records of a topic as a read_committed reader
    sees them, with the moment each poll returned them."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, clock: Callable[[], float]):
        super().__init__(daemon=True, name=f"watch-{topic}")
        self.bootstrap, self.topic, self.partitions, self.clock = bootstrap, topic, partitions, clock
        self.count = 0
        self.samples: list[tuple[float, int]] = []  # (seconds since start, records so far)
        self.stop = threading.Event()

    def run(self) -> None:
        from txn import Consumer, TopicPartition

        # A short request timeout: a watcher stuck on a dead connection would
        # measure its own back-off, not the pipeline.
        consumer = Consumer(bootstrap_servers=self.bootstrap, max_poll_records=10_000, request_timeout_ms=3000)
        consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
        while not self.stop.is_set():
            try:
                records = consumer.poll(0.2)
            except Exception:  # noqa: BLE001 - the broker is being killed: ask again
                time.sleep(0.1)
                continue
            if records:
                self.count += len(records)
                self.samples.append((self.clock(), self.count))
        consumer.close()

    def outputs(self) -> list[Output]:
        return outputs_of(self.samples)


class ProgressProbe(threading.Thread):
    """Asks ``consumed()`` (the input records the pipeline has consumed and
    committed, or None when it cannot tell now) every ``interval`` seconds."""

    def __init__(self, consumed: Callable[[], int | None], clock: Callable[[], float], interval: float = 0.5):
        super().__init__(daemon=True, name="progress-probe")
        self.consumed, self.clock, self.interval = consumed, clock, interval
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                total = self.consumed()
            except Exception:  # noqa: BLE001 - the broker is down: the next sample tells
                total = None
            if total is not None:
                self.samples.append((self.clock(), total))


def deltas(samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Cumulative samples -> (time, increase) wherever the total grew."""
    result, before = [], 0
    for at, total in sorted(samples):
        if total > before:
            result.append((at, total - before))
            before = total
    return result


def outputs_of(samples: list[tuple[float, int]], process: str = "") -> list[Output]:
    return [Output(at, count, process) for at, count in deltas(samples)]
