"""What the exactly-once sink's crash tests share (test_spark_sink_crash.py
and the standalone-cluster tests): a query driver process
(spark_sink_driver.py) to run and SIGKILL at a crash point, a read_committed
reader running throughout, the input, and the exactly-once check of the
output against the input and the reader's view."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from faults.checker import check
from faults.process import REPO
from txn import Admin, Consumer, Producer, TopicPartition

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "spark_sink_driver.py")
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 3, 3


class Driver:
    """Runs spark_sink_driver.py as its own process group."""

    def __init__(self, bootstrap: str, folder):
        self.bootstrap = bootstrap
        self.folder = folder
        self.runs = 0

    def run(self, checkpoint: str, prefix: str, partitions: int, crash: str = "", options: tuple = (), timeout: float = 300) -> tuple[int, str, str]:
        """(exit code, log, crash point fired) of one run."""
        self.runs += 1
        crash_dir = self.folder / f"run{self.runs}"
        crash_dir.mkdir()
        log_path = crash_dir / "driver.log"
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join([REPO, HERE]), SPARK_SINK_CRASH=crash, SPARK_SINK_CRASH_DIR=str(crash_dir))
        env.pop("ONCEFLOW_CRASH_POINTS", None)
        command = [sys.executable, DRIVER, self.bootstrap, checkpoint, prefix, str(partitions), *options]
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group
            except ProcessLookupError:
                pass
        fired = (crash_dir / "fired").read_text().strip() if (crash_dir / "fired").exists() else ""
        return code, log_path.read_text(errors="replace"), fired


class Reader(threading.Thread):
    """A read_committed consumer of ``output`` polling throughout, keeping
    what it saw as a history for faults.checker."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.stopping = threading.Event()
        self.history: list[dict] = []
        self.seen: dict[tuple[int, int], str] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Consumer(self.bootstrap, isolation_level="read_committed") as consumer:
                partitions = [TopicPartition("output", p) for p in range(OUTPUT_PARTITIONS)]
                consumer.assign(partitions)
                for tp in partitions:
                    consumer.seek(tp, 0)
                while not self.stopping.is_set():
                    records = consumer.poll(0.5)
                    if records:
                        by_partition: dict[str, list] = {}
                        for r in records:
                            by_partition.setdefault(f"output-{r.partition}", []).append([r.offset, r.value.decode()])
                            self.seen[(r.partition, r.offset)] = r.value.decode()
                        self.history.append({"time": time.time(), "process": "reader", "type": "ok", "op": "poll", "value": [["poll", by_partition]]})
        except BaseException as error:  # reported by the test
            self.error = error


def final_read(bootstrap: str) -> dict[tuple[int, int], str]:
    """Everything committed in ``output``; read to the end, which needs no
    transaction left open there."""
    with Admin(bootstrap) as admin:
        ends = {tp: o.offset for tp, o in admin.list_offsets({TopicPartition("output", p): "latest" for p in range(OUTPUT_PARTITIONS)}, isolation_level="read_uncommitted").items()}
    seen = {}
    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign(list(ends))
        for tp in ends:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, "read_committed stalled: a transaction is left open in output"
            for r in consumer.poll(0.5):
                seen[(r.partition, r.offset)] = r.value.decode()
    return seen


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    with Admin(bootstrap) as admin:
        return [t.transactional_id for t in admin.list_transactions(states=["Ongoing"]) if t.transactional_id.startswith(prefix + "-")]


def produce_input(bootstrap: str, count: int) -> list[str]:
    values = [f"r{i:04d}" for i in range(count)]
    with Admin(bootstrap) as admin:
        admin.create_topics({"input": INPUT_PARTITIONS, "output": OUTPUT_PARTITIONS})
    with Producer(bootstrap, linger_ms=0) as producer:
        for value in values:
            producer.send("input", value.encode(), key=value.encode())
        producer.flush()
    return values


def assert_exactly_once(bootstrap: str, reader: Reader, inputs: list[str]) -> dict:
    final = final_read(bootstrap)
    values = sorted(final.values())
    missing = sorted(set(inputs) - set(values))
    duplicated = sorted({v for v in values if values.count(v) > 1})
    assert not missing and not duplicated and len(values) == len(inputs), f"missing {missing[:10]}, duplicated {duplicated[:10]}, {len(values)} records for {len(inputs)} inputs"
    phantom = {key: value for key, value in reader.seen.items() if final.get((key[0], key[1])) != value}
    assert not phantom, f"the read_committed reader saw records that are not committed there: {list(phantom.items())[:10]}"
    final_history = [{"time": time.time(), "process": "final-reader", "type": "ok", "op": "poll", "value": [["poll", {f"output-{p}": [[o, v] for (q, o), v in sorted(final.items()) if q == p] for p in range(OUTPUT_PARTITIONS)}]]}]
    verdict = check(reader.history + final_history)
    assert verdict.valid, verdict.summary()
    return final
