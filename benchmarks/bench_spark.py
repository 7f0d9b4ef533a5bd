"""The Spark sink's cost per microbatch and the read_committed stall after a
driver kill, for ``onceflow bench --spark`` (``SPARK_SCENARIOS`` in
``benchmarks.suite``).

Spark runs in a child process (``python -m benchmarks.bench_spark``), so the
bench process never holds a JVM:

- ``microbatch BOOTSTRAP BATCHES``: one SparkSession (local[2], lean
  settings), one Python streaming source giving one row per microbatch,
  written in turn to Spark's ``noop`` sink (the floor: what Spark itself
  costs per batch), to a Python data source sink that does nothing (what
  any Python sink costs on top: the Arrow hand-over to a Python worker and
  the driver's Python commit runner), to the onceflow sink at_least_once
  and exactly_once.
  Prints JSON: the median ``triggerExecution`` ms of BATCHES batches per sink,
  after warm-up batches.
- ``stall BOOTSTRAP CHECKPOINT KILL_AT``: an exactly_once query that
  SIGKILLs its own process group right after its KILL_AT-th decision (its
  transactions decided and open, holding the output's last stable offset);
  without KILL_AT it runs until killed. ``stall_scenario`` times, with a
  read_committed reader, the gap between the last record seen before the
  kill and the first one after the restart.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

WARM_UP = 5
KILL_AT = "BENCH_SPARK_KILL_AT"
KILL_COUNTER = "BENCH_SPARK_KILL_COUNTER"
DRIVER_GROUP = "BENCH_SPARK_DRIVER_PGID"


def _session():
    from benchmarks.spark_source import spark_session

    spark = spark_session()
    import streaming.spark

    streaming.spark.register(spark)
    spark.dataSource.register(_one_row_source())
    spark.dataSource.register(_python_noop_sink())
    return spark


def _one_row_source():
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Rows(InputPartition):
        def __init__(self, start: int, end: int):
            self.start, self.end = start, end

    class OneRowReader(DataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self, start, limit):
            return {"n": start["n"] + 1}  # one new row at every trigger

        def partitions(self, start, end):
            return [Rows(start["n"], end["n"])] if end["n"] > start["n"] else []

        def read(self, partition):
            for n in range(partition.start, partition.end):
                yield (f"k{n}", f"row {n}")

    class OneRowSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_one_row"

        def schema(self):
            return "key string, value string"

        def streamReader(self, schema):
            return OneRowReader()

    return OneRowSource


def _python_noop_sink():
    """A Python data source sink that drops its rows: the floor of every
    Python sink, ours included."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class Nothing(WriterCommitMessage):
        pass

    class DropWriter(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _batch in iterator:
                pass
            return Nothing()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class PythonNoopSink(DataSource):
        @classmethod
        def name(cls):
            return "bench_python_noop"

        def streamWriter(self, schema, overwrite):
            return DropWriter()

    return PythonNoopSink


def _median_trigger_ms(spark, writer, batches: int) -> float:
    query = writer.trigger(processingTime="0 seconds").start()
    try:
        deadline = time.monotonic() + 600
        while len(query.recentProgress) < WARM_UP + batches:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            if time.monotonic() > deadline:
                raise TimeoutError("the query did not run its batches within 10 minutes")
            time.sleep(0.2)
        progress = query.recentProgress[WARM_UP : WARM_UP + batches]
    finally:
        query.stop()
    return statistics.median(p["durationMs"]["triggerExecution"] for p in progress)


def microbatch(bootstrap: str, batches: int) -> dict[str, float]:
    spark = _session()
    work = tempfile.mkdtemp(prefix="onceflow-bench-spark-")
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    from txn import Admin

    with Admin(bootstrap) as admin:
        admin.create_topics({topic: 1})
    rows = spark.readStream.format("bench_one_row").load()
    out = {}
    out["noop"] = _median_trigger_ms(spark, rows.writeStream.format("noop").option("checkpointLocation", f"{work}/noop"), batches)
    out["python_noop"] = _median_trigger_ms(spark, rows.writeStream.format("bench_python_noop").option("checkpointLocation", f"{work}/python_noop"), batches)
    for guarantee in ("at_least_once", "exactly_once"):
        writer = (
            rows.writeStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
            .option("deliveryGuarantee", guarantee).option("transactionalIdPrefix", f"bench-{uuid.uuid4().hex[:8]}")
            .option("checkpointLocation", f"{work}/{guarantee}")
        )
        out[guarantee] = _median_trigger_ms(spark, writer, batches)
    spark.stop()
    return out


def kill_after_decision(name: str) -> None:
    """crashPointHook of the stall query: SIGKILL the driver's process group
    right after the KILL_AT-th decision (counted in a file: commits run in
    Spark's Python workers)."""
    if name != "spark_sink.after_decision" or not os.environ.get(KILL_AT):
        return
    with open(os.environ[KILL_COUNTER], "a+") as file:
        file.write("x\n")
        file.seek(0)
        passes = len(file.read().split())
    if passes == int(os.environ[KILL_AT]):
        os.killpg(int(os.environ[DRIVER_GROUP]), signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def stall_query(bootstrap: str, checkpoint: str, topic: str) -> None:
    os.environ[DRIVER_GROUP] = str(os.getpgid(0))
    spark = _session()
    query = (
        spark.readStream.format("bench_one_row").load().writeStream.format("onceflow").option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic).option("transactionalIdPrefix", topic)  # a prefix per scenario run: one query each
        .option("crashPointHook", "benchmarks.bench_spark:kill_after_decision")
        .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start()
    )
    query.awaitTermination()


def _child(arguments: list[str], env: dict | None = None, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    from faults.process import REPO

    environment = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=REPO, **(env or {}))
    environment.pop("ONCEFLOW_CRASH_POINTS", None)
    return subprocess.Popen([sys.executable, "-m", "benchmarks.bench_spark", *arguments], cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True, env=environment, start_new_session=True)


def microbatch_scenario(bootstrap: str, batches: int) -> dict[str, float]:
    """{"noop" | "python_noop" | "at_least_once" | "exactly_once": median ms per 1-row batch}."""
    child = _child(["microbatch", bootstrap, str(batches)])
    try:
        output, _ = child.communicate(timeout=900)
    finally:
        _kill_group(child)
    if child.returncode != 0:
        raise RuntimeError(f"the Spark bench child exited {child.returncode}: {output[-2000:]}")
    return json.loads(output.strip().splitlines()[-1])


def stall_scenario(bootstrap: str, kill_at: int = 5, completer: bool | str = False, first_query_timeout: float = 600.0) -> dict[str, float]:
    """Seconds read_committed readers of the output saw nothing after the
    driver was killed holding decided, open transactions, until the
    restarted query (started at once) re-committed them; with ``completer``,
    the completer runs first, the moment the driver is seen dead, and the
    query restarts after it: ``"cli"`` as ``onceflow spark finish-decided``
    (a new Python process), ``True`` in this process, as a supervisor
    written in Python (the demo's) calls ``finish_decided``."""
    from txn import Admin, Consumer, TopicPartition

    topic = f"bench-stall-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap) as admin:
        admin.create_topics({topic: 1})
    seen: list[float] = []
    stopping = threading.Event()

    def read() -> None:
        with Consumer(bootstrap, isolation_level="read_committed") as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 0)
            while not stopping.is_set():
                if consumer.poll(0.05):
                    seen.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # ignore_cleanup_errors: a killed JVM may still be writing its checkpoint there
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-stall-", ignore_cleanup_errors=True) as work:
        first_log = open(f"{work}/first-query.log", "w")
        first = _child(["stall", bootstrap, f"{work}/ckpt", topic], {KILL_AT: str(kill_at), KILL_COUNTER: f"{work}/passes"}, stderr=first_log)
        try:
            first.wait(first_query_timeout)
        except subprocess.TimeoutExpired:
            _kill_group(first)
            raise RuntimeError(f"the first stall query did not kill itself at its decision #{kill_at} within {first_query_timeout:.0f} s "
                               f"({len(open(f'{work}/passes').read().split()) if os.path.exists(f'{work}/passes') else 0} decisions seen by its hook)") from None
        killed = time.monotonic()
        _kill_group(first)
        first_log.close()
        decisions = len(open(f"{work}/passes").read().split()) if os.path.exists(f"{work}/passes") else 0
        if decisions < kill_at:  # it ended on its own: a failed start, not the kill this scenario times
            raise RuntimeError(f"the first stall query ended (exit {first.returncode}) after {decisions} decisions, before its decision "
                               f"#{kill_at} where it was to be killed; its log ends:\n{open(f'{work}/first-query.log').read()[-3000:]}")
        if completer == "cli":
            finish = [sys.executable, "-m", "onceflow", "spark", "finish-decided", "--bootstrap-server", bootstrap, "--prefix", topic]
            subprocess.run(finish, check=True, capture_output=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            completed = time.monotonic()
        elif completer:
            from streaming.spark.options import SinkOptions
            from streaming.spark.sink_driver import finish_decided

            options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap, "transactionalIdPrefix": topic})
            attempts = 1
            finished = finish_decided(options)
            while not finished.committed and time.monotonic() - killed < 30:
                # One run here found no decision at its first look, right after the kill: look again (counted in the result).
                time.sleep(0.2)
                attempts += 1
                finished = finish_decided(options)
            if not finished.committed:
                raise RuntimeError(f"the completer found nothing to commit in {attempts} looks: {finished}")
            completed = time.monotonic()
        restarted = _child(["stall", bootstrap, f"{work}/ckpt", topic])
        try:
            deadline = time.monotonic() + 600
            while not any(t > killed for t in seen):
                if time.monotonic() > deadline or restarted.poll() is not None:
                    raise RuntimeError("the restarted query committed nothing")
                time.sleep(0.05)
        finally:
            _kill_group(restarted)
            stopping.set()
            reader.join(10)
    before = max((t for t in seen if t <= killed), default=killed)
    after = min(t for t in seen if t > killed)
    return {"stall_s": after - before, "kill_to_visible_s": after - killed, **({"completer_s": completed - killed} if completer else {}),
            **({"completer_looks": attempts} if completer is True else {})}


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "microbatch":
        print(json.dumps(microbatch(rest[0], int(rest[1]))), flush=True)
    elif command == "stall":
        stall_query(*rest)
    else:
        sys.exit(f"unknown command {command!r}")
