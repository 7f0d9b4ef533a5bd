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
cores; ``--master`` another master, such as a standalone cluster's
``spark://HOST:PORT``), prints a line per finished batch, stops the query
cleanly on SIGTERM and exits 1 if the query fails.

Where the sink is in its two-phase commit: when ``ONCEFLOW_SPARK_STEPS``
names a file and the module's ``build`` takes ``sink_options``, the driver
passes the sink ``crashPointHook=faults.spark:sink_step``, which appends
each crash point the sink passes to that file (``SinkStepLog``), so a kill
can be told apart by the step it hit (``describe_step``). The same hook
holds the sink just after a durable decision when asked to (a file
``<steps>.hold-request`` exists): it renames the request to
``<steps>.holding`` and waits while that file exists, so the harness can
SIGKILL the driver with a batch decided and not yet committed, or remove
the file to let the batch go on. The harness starts it in a session
of its own (``DriverProcess``) and kills it the way a machine dies: SIGKILL
to the JVM and every Python worker, including PySpark's worker daemon, which
moves its children into a process group of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
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
STEPS_VARIABLE = "ONCEFLOW_SPARK_STEPS"
STEP_HOOK = "faults.spark:sink_step"
HOLD_SECONDS = 60.0  # a hold nobody ends lets the batch go on after this


# -- the sink's two-phase commit steps -----------------------------------------------------------------

# The sink's crash points (streaming.spark.crashpoints), by name, as steps.
TASK_WRITING = "spark_sink.task_before_handle"
BEFORE_DECISION = "spark_sink.before_decision"
AFTER_DECISION = "spark_sink.after_decision"
AFTER_COMMIT = "spark_sink.after_commit"
AFTER_ALL_COMMITS = "spark_sink.after_all_commits"


def sink_step(name: str) -> None:
    """The sink's ``crashPointHook`` under the harness: note the step, and
    hold after a decision when the harness asked for it (module doc)."""
    path = os.environ.get(STEPS_VARIABLE)
    if not path:
        return
    with open(path, "a") as file:
        file.write(f"{time.time():.3f} {os.getpid()} {name}\n")
    if name != AFTER_DECISION:
        return
    request, holding = path + ".hold-request", path + ".holding"
    try:
        os.rename(request, holding)  # atomic: one decision claims one request
    except FileNotFoundError:
        return
    deadline = time.monotonic() + HOLD_SECONDS
    while os.path.exists(holding) and time.monotonic() < deadline:
        time.sleep(0.02)
    with contextlib.suppress(FileNotFoundError):
        os.remove(holding)


def read_steps(path: str, since: float = 0.0) -> list[str]:
    """The step names noted in ``path`` at or after the wall-clock time ``since``."""
    try:
        with open(path) as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return []
    steps = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and float(parts[0]) >= since:
            steps.append(parts[2])
    return steps


def describe_step(steps: list[str]) -> str:
    """Where the sink's two-phase commit was after passing ``steps`` (in
    order, since the driver started): what a kill at that moment hit."""
    if not steps:
        return "before the sink's first batch"
    last = steps[-1]
    if last == AFTER_COMMIT:
        since_decision = len(steps) - 1 - steps[::-1].index(AFTER_DECISION) if AFTER_DECISION in steps else len(steps)
        committed = sum(1 for step in steps[since_decision:] if step == AFTER_COMMIT)
        return f"decided, {committed} of its transactions committed (the rest open)"
    return {
        TASK_WRITING: "tasks writing (transactions open, undecided)",
        BEFORE_DECISION: "written, not yet decided (transactions open, undecided)",
        AFTER_DECISION: "decided, none of its transactions committed yet",
        AFTER_ALL_COMMITS: "between batches (the last one wholly committed)",
    }.get(last, f"after {last}")


def decided_and_open(steps: list[str]) -> bool:
    """Whether the step log ends inside a decided batch's commits."""
    return bool(steps) and steps[-1] in (AFTER_DECISION, AFTER_COMMIT)


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


def driver_command(query: str, bootstrap: str, checkpoint: str, master: str | None = None) -> list[str]:
    return [sys.executable, "-m", "faults.spark", "--query", query, "--bootstrap", bootstrap, "--checkpoint", checkpoint] + (["--master", master] if master else [])


class DriverProcess(ClientProcess):
    """The driver in a session of its own; ``kill`` SIGKILLs every process
    group under it (the JVM's, and the worker daemon's). With ``steps_path``
    the sink notes its two-phase commit steps there (module doc)."""

    def __init__(self, name: str, query: str, bootstrap: str, checkpoint: str, log_path: str, *, steps_path: str | None = None, master: str | None = None):
        env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
        if steps_path:
            env[STEPS_VARIABLE] = steps_path
        super().__init__(name, driver_command(query, bootstrap, checkpoint, master), log_path, env=env)
        self.steps_path = steps_path
        self.started_at = 0.0  # wall-clock time of the last start

    def steps(self) -> list[str]:
        """The sink steps this start of the driver passed."""
        return read_steps(self.steps_path, self.started_at) if self.steps_path else []

    def request_hold(self) -> None:
        """Ask the sink to hold after its next decision (module doc)."""
        with open(self.steps_path + ".hold-request", "w"):
            pass

    def holding(self) -> bool:
        return os.path.exists(self.steps_path + ".holding")

    def release_hold(self, *, rearm: bool) -> None:
        """Let a held batch go on; with ``rearm``, hold the next decision instead."""
        with contextlib.suppress(FileNotFoundError):
            if rearm:
                os.rename(self.steps_path + ".holding", self.steps_path + ".hold-request")
            else:
                os.remove(self.steps_path + ".holding")

    def cancel_hold(self) -> None:
        for suffix in (".hold-request", ".holding"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.steps_path + suffix)

    def start(self) -> "DriverProcess":
        environment = dict(os.environ)
        environment.update(self.env or {})
        environment.pop("ONCEFLOW_CRASH_POINTS", None)
        with open(self.log_path, "ab") as log_file:
            self.log_start = log_file.tell()
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=log_file, stderr=log_file, env=environment, start_new_session=True)
        self.started_at = time.time()
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


# -- a standalone cluster's executors ---------------------------------------------------------------

EXECUTOR_CLASS = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def executor_pids(cluster_dir: str, role: str) -> list[int]:
    """The executor JVMs a worker of the cluster in ``cluster_dir``
    (``streaming.spark.cluster``) runs now."""
    from streaming.spark.cluster import processes_of

    found = []
    for pid in processes_of(cluster_dir, role):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if EXECUTOR_CLASS in file.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return sorted(found)


def kill_executors(cluster_dir: str, role: str) -> list[int]:
    """SIGKILL a worker's executors the way an executor dies on its own:
    each executor JVM with every process under it, and the process groups
    its Python daemons lead (the executor itself shares its worker's group,
    which is spared: the worker stays, and the master gives the application
    a new executor). Returns the pids killed."""
    killed = []
    for executor in executor_pids(cluster_dir, role):
        under = descendants(executor)
        for leader in [pid for pid in under if pid != executor and _pgid_or_none(pid) == pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(leader, signal.SIGKILL)
        for pid in under:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.extend(under)
    return sorted(killed)


def batch_commit_times(checkpoint: str) -> list[float]:
    """When Spark wrote each batch's commit (wall-clock seconds, from its
    commit log's files), in batch order."""
    folder = os.path.join(checkpoint, "commits")
    try:
        names = sorted((int(name) for name in os.listdir(folder) if name.isdigit()))
    except FileNotFoundError:
        return []
    times = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            times.append(os.path.getmtime(os.path.join(folder, str(name))))
    return times


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
    parser.add_argument("--master", default=None, help="a Spark master URL (default: local mode, two cores)")
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
    name = "onceflow-" + os.path.splitext(os.path.basename(args.query))[0]
    if args.master:
        from streaming.spark.cluster import Cluster, ClusterSettings

        # Sized like a cluster of streaming.spark.cluster's defaults, executors on this interpreter.
        config = Cluster("", args.master, "", ClusterSettings(python=sys.executable), ()).session_config()
        spark = streaming.spark.local_session(name, master=args.master, config=config)
    else:
        spark = streaming.spark.local_session(name)
    extra = {}
    if os.environ.get(STEPS_VARIABLE) and "sink_options" in inspect.signature(module.build).parameters:
        extra["sink_options"] = {"crashPointHook": STEP_HOOK}
    query = module.build(spark, args.bootstrap, args.checkpoint, **extra)
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
