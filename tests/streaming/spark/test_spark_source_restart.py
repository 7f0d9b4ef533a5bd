"""Where a ``startingOffsets=latest`` query starts, across the calls Spark
makes and across a driver SIGKILLed inside batch 0 (before ``commits/0``).

Spark asks the stream reader for its initial offset more than once for
batch 0 (to plan it, and again to run it) and again after a restart, since
only batch 0's *end* is in ``offsets/0``. If the start is resolved anew at
each call, the start drifts: records committed between the first and a
later resolution are skipped, and batch 0 re-run after a restart is another
batch. Here the driver's offset requests pass through a fault proxy that
delays every ListOffsets by ``LIST_OFFSETS_DELAY`` seconds, so the moments
the reader resolves offsets are far apart, while a producer writes
throughout. The first ListOffsets to reach the broker fixes the earliest
possible start: every record sent after it (with a margin) must reach the
output, and batch 0 re-run after the kill must read what it read the first
time.

Run as a script, this file is the driver (its own process group, killed
whole by the test or by itself):

    python test_spark_source_restart.py BOOTSTRAP CHECKPOINT OUTPUT RUN KILL_IN_BATCH

reads topic ``input`` from ``latest`` and appends each batch's rows
(partition, offset, value) as one JSON line to OUTPUT, fsynced; in batch
KILL_IN_BATCH (-1: none) it then SIGKILLs its own process group, inside the
batch, before Spark writes ``commits/N``. It stops when OUTPUT + ".stop"
exists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

LIST_OFFSETS_DELAY = 2.0
MARGIN = 0.5  # a ListOffsets delivered to the broker is answered within this
PARTITIONS = 2


# -- the driver ----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    bootstrap, checkpoint, output, run, kill_in_batch = argv
    import streaming.spark

    spark = streaming.spark.local_session("onceflow-source-restart")
    events = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "input")
        .option("startingOffsets", "latest")
        .load()
    )

    def write_batch(batch_df, batch_id: int) -> None:
        rows = [[r.partition, r.offset, r.value.decode()] for r in batch_df.select("partition", "offset", "value").collect()]
        with open(output, "a") as file:
            file.write(json.dumps({"run": int(run), "batch": batch_id, "rows": rows}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        if batch_id == int(kill_in_batch):
            os.killpg(os.getpgid(0), signal.SIGKILL)

    query = events.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start()
    try:
        while not os.path.exists(output + ".stop"):
            if query.exception() is not None:
                print(f"QUERY FAILED: {query.exception()}", flush=True)
                return 1
            time.sleep(0.2)
    finally:
        query.stop()
    return 0


# -- the test ------------------------------------------------------------------------------------


class SteadyProducer(threading.Thread):
    """Sends numbered records to ``input`` one at a time, round robin over
    its partitions, noting when each send began and where it landed."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.stopping = threading.Event()
        self.sent: list[tuple[float, int, int, str]] = []  # (send began, partition, offset, value)
        self.error: BaseException | None = None

    def run(self) -> None:
        from txn import Producer

        try:
            with Producer(self.bootstrap, linger_ms=0) as producer:
                number = 0
                while not self.stopping.is_set():
                    began = time.time()
                    value = f"n{number:06d}"
                    metadata = producer.send("input", value.encode(), partition=number % PARTITIONS).result(30)
                    self.sent.append((began, metadata.partition, metadata.offset, value))
                    number += 1
                    time.sleep(0.005)
        except BaseException as error:  # reported by the test
            self.error = error


class Driver:
    """Runs this file as a driver process group."""

    def __init__(self, bootstrap: str, folder):
        self.bootstrap = bootstrap
        self.folder = folder
        self.checkpoint = folder / "ckpt"
        self.output = folder / "rows.jsonl"
        self.runs = 0

    def start(self, kill_in_batch: int) -> tuple[subprocess.Popen, str]:
        from faults.process import REPO

        self.runs += 1
        log_path = self.folder / f"driver{self.runs}.log"
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=REPO)
        command = [sys.executable, os.path.abspath(__file__), self.bootstrap, str(self.checkpoint), str(self.output), str(self.runs), str(kill_in_batch)]
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return process, str(log_path)

    def batches(self) -> list[dict]:
        if not self.output.exists():
            return []
        return [json.loads(line) for line in self.output.read_text().splitlines()]


def finish(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass


def tail(log_path: str) -> str:
    with open(log_path, errors="replace") as file:
        return file.read()[-3000:]


@pytest.fixture
def proxied_broker(tmp_path):
    """A broker process that advertises a fault proxy in front of it, so every
    client (the driver's, the executors', the producer) goes through it."""
    from faults.process import BrokerProcess
    from faults.proxy import ThreadedFaultProxy

    with ThreadedFaultProxy("127.0.0.1", 0) as proxy:
        broker = BrokerProcess(str(tmp_path / "broker"), "group.initial.rebalance.delay.ms=0", advertise=proxy.address).start()
        try:
            proxy.retarget("127.0.0.1", broker.port)
            yield proxy
        finally:
            broker.kill()


@pytest.mark.slow
def test_latest_start_is_fixed_across_calls_and_a_driver_killed_inside_batch_0(proxied_broker, tmp_path):
    from protocol.messages import ApiKey
    from txn import Admin

    proxy = proxied_broker
    with Admin(proxy.address) as admin:
        admin.create_topics({"input": PARTITIONS})
    producer = SteadyProducer(proxy.address)
    producer.start()
    deadline = time.monotonic() + 60
    while len(producer.sent) < 50:  # records from before the query: `latest` skips them
        assert producer.error is None and time.monotonic() < deadline, producer.error
        time.sleep(0.05)
    before_query = len(producer.sent)
    delayed_from = time.time()
    proxy.delay_requests(ApiKey.LIST_OFFSETS, LIST_OFFSETS_DELAY)
    driver = Driver(proxy.address, tmp_path)

    process, log_path = driver.start(kill_in_batch=0)
    code = finish(process, 300)
    assert code == -signal.SIGKILL, f"run 1 ended {code}, not killed in batch 0:\n{tail(log_path)}"
    assert (driver.checkpoint / "offsets" / "0").exists() and not (driver.checkpoint / "commits" / "0").exists(), "killed inside batch 0"
    first_run = [b for b in driver.batches() if b["run"] == 1]
    assert [b["batch"] for b in first_run] == [0]

    process, log_path = driver.start(kill_in_batch=-1)
    try:
        time.sleep(5)  # records keep flowing across the restart and into run 2's batches
        producer.stopping.set()
        producer.join(60)
        assert producer.error is None, producer.error
        ends = {}
        for _began, partition, offset, _value in producer.sent:
            ends[partition] = max(ends.get(partition, -1), offset)
        deadline = time.monotonic() + 180
        while not all(any(p == partition and o == end for b in driver.batches() for p, o, _v in b["rows"]) for partition, end in ends.items()):
            assert process.poll() is None and time.monotonic() < deadline, f"run 2 did not read to the end {ends}:\n{tail(log_path)}"
            time.sleep(0.5)
        open(str(driver.output) + ".stop", "w").close()
        assert finish(process, 120) == 0, tail(log_path)
    finally:
        if process.poll() is None:
            finish(process, 0.1)

    batches = driver.batches()
    second_run = [b for b in batches if b["run"] == 2]
    assert second_run[0]["batch"] == 0, "run 2 re-runs batch 0 (no commits/0)"
    assert sorted(map(tuple, second_run[0]["rows"])) == sorted(map(tuple, first_run[0]["rows"])), "batch 0 re-run after the kill is the batch that first ran"

    first_list_offsets = min(e.at for e in proxy.events() if e.kind == "request_delayed" and e.detail["api_key"] == ApiKey.LIST_OFFSETS and e.at >= delayed_from)
    started_by = first_list_offsets + LIST_OFFSETS_DELAY + MARGIN  # the query's start is fixed by then
    read = {(p, o): v for b in batches for p, o, v in b["rows"]}
    assert all(read.get((p, o)) == v for _began, p, o, v in producer.sent if (p, o) in read), "rows are the records sent there"
    assert not any((p, o) in read for _began, p, o, _v in producer.sent[:before_query]), "latest: records from before the query are not read"
    missing = [(p, o) for began, p, o, _v in producer.sent if began > started_by and (p, o) not in read]
    sent_after = sum(1 for began, *_ in producer.sent if began > started_by)
    assert not missing, f"{len(missing)} of the {sent_after} records sent after the query's start was fixed are missing, first {missing[:5]}"
    for partition in range(PARTITIONS):
        offsets = sorted(o for p, o in read if p == partition)
        assert offsets == list(range(offsets[0], offsets[-1] + 1)), f"a gap in partition {partition}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
