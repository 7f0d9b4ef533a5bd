"""A Spark standalone cluster on this machine, started from what ``pip
install pyspark`` ships: one master and N workers, each a JVM of its own
that starts executor JVMs, which start Python workers, so executors are
separate processes that can die on their own (local mode runs everything
in the driver's JVM).

    cluster = streaming.spark.cluster.start("/tmp/my-cluster")   # returns when every worker registered
    spark = streaming.spark.local_session("app", master=cluster.master_url, config=cluster.session_config())
    ...
    streaming.spark.cluster.stop("/tmp/my-cluster")

This module owns the cluster's processes and the directory that holds its
state: ``cluster.json`` (the master's URL, its web UI, every daemon's pid),
``logs/`` (one file per daemon) and ``work/worker-N/`` (the workers' work
directories: each executor's stdout and stderr). The daemons are
pyspark's ``bin/spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker spark://HOST:PORT`` with ``SPARK_HOME`` the
pyspark package; every port is chosen by the kernel (port 0, read back
from the daemon's log) and the master's REST submission server (a fixed
port, 6066) is off, so clusters side by side do not meet.

Every process of the cluster carries two environment variables, which its
children inherit (executors from their worker, Python daemons and workers
from their executor): ``ONCEFLOW_SPARK_CLUSTER`` (the state directory) and
``ONCEFLOW_SPARK_CLUSTER_ROLE`` (``master``, ``worker-1``, ...). They are
how ``stop`` finds every process to end, including the Python daemons
that put themselves in a process group of their own, and how
``kill_worker`` finds a worker's executor and Python workers.

Sized for a small machine (two cores, 24 GiB, shared): each daemon's heap
256 MiB, each worker offers 1 core and 1 GiB for executors, and
``session_config`` asks for 512 MiB executors and a 512 MiB driver: about
3 GiB for the whole cluster with one query's driver.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import attrs

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
CLUSTER_VARIABLE = "ONCEFLOW_SPARK_CLUSTER"
ROLE_VARIABLE = "ONCEFLOW_SPARK_CLUSTER_ROLE"
STATE_FILE = "cluster.json"

MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI = re.compile(r"Bound MasterWebUI to \S+, and started at http://[^:\s]+:(\d+)")
# JVM flags for small daemons and executors: the serial collector, the JIT's first tier only.
SMALL_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


class ClusterError(RuntimeError):
    """The cluster did not start (the message says which daemon and ends with its log's tail), or its state is unusable."""


@attrs.frozen
class ClusterSettings:
    workers: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    worker_cores: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    worker_memory: str = "1g"  # what each worker offers its executors
    daemon_memory: str = "256m"  # the master's and each worker's own heap
    executor_memory: str = "512m"  # session_config's executors
    driver_memory: str = "512m"  # session_config's driver
    host: str = "127.0.0.1"
    python: str = sys.executable  # the executors' Python workers (PYSPARK_PYTHON)


@attrs.frozen
class Daemon:
    role: str  # "master", "worker-1", ...
    pid: int  # also its process group: each daemon starts a session of its own
    log: str


@attrs.frozen
class Cluster:
    directory: str
    master_url: str  # spark://HOST:PORT
    web_ui: str  # http://HOST:PORT of the master
    settings: ClusterSettings
    daemons: tuple[Daemon, ...]

    @property
    def logs(self) -> str:
        return os.path.join(self.directory, "logs")

    def worker_roles(self) -> list[str]:
        return [f"worker-{index}" for index in range(1, self.settings.workers + 1)]

    def session_config(self) -> dict[str, str]:
        """Settings for a SparkSession whose executors run on this cluster:
        sized to it, the driver reachable on the cluster's host, and the
        executors' Python workers on ``settings.python``."""
        return {
            "spark.executor.memory": self.settings.executor_memory,
            "spark.executor.cores": str(self.settings.worker_cores),
            "spark.executor.extraJavaOptions": SMALL_JVM_OPTIONS,
            "spark.driver.memory": self.settings.driver_memory,
            "spark.driver.host": self.settings.host,
            "spark.driver.bindAddress": self.settings.host,
            "spark.pyspark.python": self.settings.python,
        }

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Cluster":
        data = json.loads(text)
        return cls(
            data["directory"], data["master_url"], data["web_ui"], ClusterSettings(**data["settings"]),
            tuple(Daemon(**daemon) for daemon in data["daemons"]),
        )


def spark_home() -> str:
    """The installed pyspark package's directory, which is a Spark home (bin/, jars/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError("pyspark is not installed: pip install pyspark")
    return list(spec.submodule_search_locations)[0]


def load(directory: str) -> Cluster:
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path) as file:
            return Cluster.from_json(file.read())
    except FileNotFoundError:
        raise ClusterError(f"no cluster was started in {directory} ({STATE_FILE} is missing)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ClusterError(f"{path} is not a cluster's state: {error}") from None


def start(directory: str, settings: ClusterSettings = ClusterSettings(), *, env: dict[str, str] | None = None, timeout: float = 180.0) -> Cluster:
    """Start a master and ``settings.workers`` workers with their state in
    ``directory``; return once the master's web UI lists every worker
    alive. The daemons run in sessions of their own and outlive this
    process until ``stop``. ``env`` adds variables to every daemon's
    environment (executors and their Python workers inherit them). A
    daemon that fails to start stops the rest and raises ClusterError."""
    directory = os.path.abspath(directory)
    if processes_of(directory):
        raise ClusterError(f"a cluster is already running in {directory}: onceflow spark-cluster stop --dir {directory}")
    os.makedirs(os.path.join(directory, "logs"), exist_ok=True)
    deadline = time.monotonic() + timeout
    base_env = _daemon_environment(directory, settings, env)
    try:
        master = _launch(directory, "master", [MASTER_CLASS, "--host", settings.host, "--port", "0", "--webui-port", "0"], base_env)
        master_url = _wait_for_log(master, MASTER_URL, deadline)
        web_ui = f"http://{settings.host}:{_wait_for_log(master, MASTER_UI, deadline)}"
        cluster = Cluster(directory, master_url, web_ui, settings, (master,))
        _save(cluster)
        for role in cluster.worker_roles():
            cluster = attrs.evolve(cluster, daemons=cluster.daemons + (_launch_worker(cluster, role, base_env),))
            _save(cluster)
        _wait_for_workers(cluster, settings.workers, deadline)
    except BaseException:
        stop(directory)
        raise
    return cluster


def start_worker(cluster: Cluster, role: str, *, env: dict[str, str] | None = None, timeout: float = 120.0) -> Cluster:
    """Start ``role``'s worker again (after ``kill_worker``), and return the
    cluster once the master lists every worker alive."""
    cluster = load(cluster.directory)  # the daemons as they are now (another caller may have restarted one)
    if processes_of(cluster.directory, role):
        raise ClusterError(f"{role} of {cluster.directory} is still running")
    daemon = _launch_worker(cluster, role, _daemon_environment(cluster.directory, cluster.settings, env))
    cluster = attrs.evolve(cluster, daemons=tuple(d for d in cluster.daemons if d.role != role) + (daemon,))
    _save(cluster)
    _wait_for_workers(cluster, cluster.settings.workers, time.monotonic() + timeout)
    return cluster


def kill_worker(cluster: Cluster, role: str) -> list[int]:
    """SIGKILL one worker with everything it started: the Worker JVM's
    process group, its executor JVMs, their Python daemons (process groups
    of their own) and Python workers. Returns the pids killed; returns once
    none of them is left."""
    return _kill_all(cluster.directory, role, timeout=30.0)


def stop(directory: str, *, grace: float = 10.0) -> list[int]:
    """Stop every process of the cluster in ``directory``: SIGTERM to the
    daemons' process groups (workers end their executors), then SIGKILL to
    whatever carries the cluster's mark after ``grace`` seconds (Python
    daemons in groups of their own included). Returns the pids that were
    running; returns once none is left. Safe to call twice."""
    directory = os.path.abspath(directory)
    running = sorted(processes_of(directory))
    daemon_pids = {pid for pid, role in processes_of(directory).items() if _is_daemon(pid)}
    for pid in daemon_pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while processes_of(directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    _kill_all(directory, None, timeout=30.0)
    return running


def processes_of(directory: str, role: str | None = None) -> dict[int, str]:
    """pid -> role of every running process that carries ``directory``'s
    mark (of ``role`` only, when given), read from /proc/PID/environ."""
    directory = os.path.abspath(directory)
    mark = f"{CLUSTER_VARIABLE}={directory}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                variables = file.read().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if mark not in variables:
            continue
        found_role = next((v.split(b"=", 1)[1].decode() for v in variables if v.startswith(ROLE_VARIABLE.encode() + b"=")), "")
        if role is None or found_role == role:
            if not _is_zombie(int(entry)):
                found[int(entry)] = found_role
    return found


def alive_workers(cluster: Cluster) -> int:
    """How many workers the master's web UI lists as ALIVE (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(cluster.web_ui + "/json/", timeout=5) as response:
            state = json.load(response)
    except (OSError, ValueError, urllib.error.URLError):
        return 0
    return sum(1 for worker in state.get("workers", ()) if worker.get("state") == "ALIVE")


def wait_for_executors(spark, count: int, timeout: float = 120.0) -> None:
    """Wait until ``spark`` (a session on a cluster) has ``count`` executors
    registered: a query started earlier may run all its tasks on the first."""
    deadline = time.monotonic() + timeout
    while True:
        registered = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver counts as one
        if registered >= count:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{registered} of {count} executors registered after {timeout:.0f} s")
        time.sleep(0.5)


# -- the processes ------------------------------------------------------------------------


def _daemon_environment(directory: str, settings: ClusterSettings, env: dict[str, str] | None) -> dict[str, str]:
    home = spark_home()
    return {
        **os.environ,
        **(env or {}),
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": settings.host,
        "SPARK_DAEMON_MEMORY": settings.daemon_memory,
        "SPARK_DAEMON_JAVA_OPTS": SMALL_JVM_OPTIONS,
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": settings.python,
        CLUSTER_VARIABLE: directory,
    }


def _launch(directory: str, role: str, arguments: list[str], env: dict[str, str]) -> Daemon:
    log = os.path.join(directory, "logs", f"{role}.log")
    with open(log, "ab") as log_file:
        process = subprocess.Popen(
            [os.path.join(spark_home(), "bin", "spark-class"), *arguments],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env={**env, ROLE_VARIABLE: role}, cwd=directory, start_new_session=True,
        )
    return Daemon(role, process.pid, log)


def _launch_worker(cluster: Cluster, role: str, env: dict[str, str]) -> Daemon:
    work = os.path.join(cluster.directory, "work", role)
    os.makedirs(work, exist_ok=True)
    settings = cluster.settings
    arguments = [
        WORKER_CLASS, "--host", settings.host, "--port", "0", "--webui-port", "0",
        "--cores", str(settings.worker_cores), "--memory", settings.worker_memory, "--work-dir", work, cluster.master_url,
    ]
    return _launch(cluster.directory, role, arguments, env)


def _wait_for_log(daemon: Daemon, pattern: re.Pattern, deadline: float) -> str:
    while True:
        with open(daemon.log, errors="replace") as file:
            found = pattern.search(file.read())
        if found:
            return found.group(1)
        if not _running(daemon.pid):
            raise ClusterError(f"the {daemon.role} exited before it was ready:\n{_tail(daemon.log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"the {daemon.role} did not log {pattern.pattern!r} in time:\n{_tail(daemon.log)}")
        time.sleep(0.2)


def _wait_for_workers(cluster: Cluster, count: int, deadline: float) -> None:
    while alive_workers(cluster) < count:
        for daemon in cluster.daemons:
            if not _running(daemon.pid):
                raise ClusterError(f"the {daemon.role} exited:\n{_tail(daemon.log)}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"{d.role}:\n{_tail(d.log)}" for d in cluster.daemons)
            raise ClusterError(f"{alive_workers(cluster)} of {count} workers registered with the master in time:\n{logs}")
        time.sleep(0.3)


def _kill_all(directory: str, role: str | None, timeout: float) -> list[int]:
    """SIGKILL every process of the cluster (of ``role``), with its process
    group, until none is left: a process forked meanwhile is found by the
    next scan."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        found = processes_of(directory, role)
        if not found:
            return sorted(killed)
        if time.monotonic() > deadline:
            raise ClusterError(f"processes of {directory} survive SIGKILL: {sorted(found)}")
        for pid in found:
            _signal_group(pid, signal.SIGKILL)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed |= set(found)
        time.sleep(0.1)


def _signal_group(pid: int, signum: int) -> None:
    """Signal ``pid``'s process group when ``pid`` leads it (a daemon, a
    Python daemon), else ``pid`` alone: never a group the cluster does not own."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _is_daemon(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            arguments = file.read().split(b"\0")
    except OSError:
        return False
    return MASTER_CLASS.encode() in arguments or WORKER_CLASS.encode() in arguments


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _is_zombie(pid)


def _save(cluster: Cluster) -> None:
    path = os.path.join(cluster.directory, STATE_FILE)
    with open(path + ".tmp", "w") as file:
        file.write(cluster.to_json())
    os.replace(path + ".tmp", path)


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as file:
            return "".join(file.readlines()[-lines:])
    except OSError:
        return "(no log)"
