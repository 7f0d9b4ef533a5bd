"""A user's Spark Structured Streaming query as a process the fault harness
can SIGKILL and restart from its checkpoint: the driver program, its process
handle, and what the harness reads of its progress.

    python -m faults.spark --query examples/spark_region_totals.py --bootstrap H:P --checkpoint DIR

The query module convention (``onceflow chaos --workload spark --query
MODULE``, ``onceflow demo``; ``examples/spark_region_totals.py`` follows it):

| name in the module | what it is |
| --- | --- |
| ``build(spark, bootstrap, checkpoint)`` | starts the query on the given SparkSession (reading and writing through ``format("onceflow")`` at ``bootstrap``, checkpointing in ``checkpoint``) and returns the ``StreamingQuery`` |
| ``CHAOS_TOPICS`` | ``{topic: partitions}`` the harness creates (inputs and outputs) |
| ``CHAOS_OUTPUT`` | the topic whose records are checked |
| ``chaos_input(count, seed)`` | a list of phases, each a list of ``(topic, key, value, timestamp_ms, partition)``; a phase is fed once the query's committed batches cover everything fed before it (a record that only moves the watermark goes in a phase of its own) |
| ``expected(records)`` | every ``(key, value)`` the output topic must hold once, given the input in feeding order (a value that is not a str is compared as JSON) |

The driver (``main``) runs one query in a local-mode SparkSession (two
cores), prints a line per finished batch, stops the query cleanly on
SIGTERM and exits 1 if the query fails. The harness starts it in a session
of its own (``DriverProcess``) and kills it the way a machine dies: SIGKILL
to the JVM and every Python worker, including PySpark's worker daemon, which
moves its children into a process group of its own.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from faults.process import REPO, ClientProcess

STARTED_LINE = b"onceflow spark driver: query started"
MODULE_NAMES = ("build", "CHAOS_TOPICS", "CHAOS_OUTPUT", "chaos_input", "expected")


def java_missing() -> str | None:
    """Why Spark cannot start here (no Java), in one line; None if it can."""
    home = os.environ.get("JAVA_HOME")
    if home:
        if os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return None
        return f"JAVA_HOME is {home}, which has no bin/java: Spark needs Java 17 or newer"
    if shutil.which("java"):
        return None
    return "Java is not installed (no java on PATH, JAVA_HOME unset): Spark needs Java 17 or newer"


def load_query_module(spec: str, *, require_chaos: bool = True):
    """The module a Spark workload runs: a .py path or an importable name."""
    if spec.endswith(".py") or os.path.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such query module: {spec}")
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        loaded = importlib.util.spec_from_file_location("__onceflow_spark_query__", path)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(spec)
    wanted = MODULE_NAMES if require_chaos else ("build",)
    missing = [name for name in wanted if not hasattr(module, name)]
    if missing:
        raise LookupError(f"{spec} lacks {', '.join(missing)} (see faults.spark: the Spark query module convention)")
    return module


# -- the driver process ------------------------------------------------------------------------------


def driver_command(query: str, bootstrap: str, checkpoint: str) -> list[str]:
    return [sys.executable, "-m", "faults.spark", "--query", query, "--bootstrap", bootstrap, "--checkpoint", checkpoint]


class DriverProcess(ClientProcess):
    """The driver in a session of its own; ``kill`` SIGKILLs every process
    group under it (the JVM's, and the worker daemon's)."""

    def __init__(self, name: str, query: str, bootstrap: str, checkpoint: str, log_path: str):
        env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
        super().__init__(name, driver_command(query, bootstrap, checkpoint), log_path, env=env)

    def start(self) -> "DriverProcess":
        environment = dict(os.environ)
        environment.update(self.env or {})
        environment.pop("ONCEFLOW_CRASH_POINTS", None)
        with open(self.log_path, "ab") as log_file:
            self.log_start = log_file.tell()
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=log_file, stderr=log_file, env=environment, start_new_session=True)
        self.starts += 1
        return self

    def query_started(self) -> bool:
        """Whether this start of the driver has its query running (its log says so)."""
        try:
            with open(self.log_path, "rb") as file:
                file.seek(self.log_start)
                return STARTED_LINE in file.read()
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        if not self.alive:
            return
        groups = {group for pid in descendants(self.process.pid) if (group := _pgid_or_none(pid)) is not None} | {self.process.pid}
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.process.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (the query stops, its open batch's transactions are left
        to the next start) and, past ``timeout``, SIGKILL."""
        if not self.alive:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode


def _pgid_or_none(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (from /proc), ``root`` included."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def committed_batches(checkpoint: str) -> int:
    """How many batches the query has committed (Spark's commit log), -1 if none."""
    try:
        names = [int(name) for name in os.listdir(os.path.join(checkpoint, "commits")) if name.isdigit()]
    except FileNotFoundError:
        return -1
    return max(names, default=-1)


def committed_source_offsets(checkpoint: str) -> dict[tuple[str, int], int]:
    """The source offsets the last committed batch reached: ``{(topic,
    partition): next offset}`` (empty before the first commit)."""
    from streaming.spark.checkpoint import read_source_offsets

    batch = committed_batches(checkpoint)
    if batch < 0:
        return {}
    try:
        return read_source_offsets(checkpoint, batch)
    except Exception:  # noqa: BLE001 - a batch with no onceflow offsets yet: nothing committed to speak of
        return {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="run a Spark query module's query until SIGTERM (see faults.spark)")
    parser.add_argument("--query", required=True, help="the query module: a .py path or a module name")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args(argv)
    problem = java_missing()
    if problem:
        print(f"onceflow spark driver: {problem}", file=sys.stderr, flush=True)
        return 2
    module = load_query_module(args.query, require_chaos=False)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    import streaming.spark

    started = time.monotonic()
    spark = streaming.spark.local_session("onceflow-" + os.path.splitext(os.path.basename(args.query))[0])
    query = module.build(spark, args.bootstrap, args.checkpoint)
    print(f"{STARTED_LINE.decode()} ({query.id}) in {time.monotonic() - started:.1f} s", flush=True)
    last_batch = None
    try:
        while not stopping:
            if query.exception() is not None:
                print(f"onceflow spark driver: QUERY FAILED: {query.exception()}", flush=True)
                return 1
            if not query.isActive:
                print("onceflow spark driver: the query stopped", flush=True)
                return 1
            progress = query.lastProgress
            if progress and progress.get("batchId") != last_batch:
                last_batch = progress.get("batchId")
                print(f"onceflow spark driver: batch {last_batch}: {progress.get('numInputRows')} rows in, "
                      f"{json.dumps(progress.get('durationMs', {}).get('triggerExecution'))} ms", flush=True)
            time.sleep(0.5)
    finally:
        if stopping:
            query.stop()
            print("onceflow spark driver: stopped on SIGTERM", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
