"""The chaos runner: a broker behind a fault proxy, workload processes, a
seeded schedule of faults, then a final read, the checker, and a report.

    onceflow chaos --workload copier --faults kill-broker,kill-client,proxy-cut,torn-tail \\
        --duration 60 --seed 7 --report ./chaos-report
    onceflow chaos --workload streaming --app examples/word_count.py --faults kill-client,kill-broker
    onceflow chaos --workload spark --query examples/spark_region_totals.py --faults kill-driver,kill-broker --duration 120

or from Python (what a user's pytest test calls):

    verdict = run_chaos(ChaosSettings(workload="copier", faults=("kill-client",), duration=20, seed=7), report_dir)
    assert verdict.valid, verdict.summary()

The input of the copier, processor, streaming and Spark workloads arrives
at a steady rate over the whole ``--duration`` (``records`` of it, by one
idempotent producer), so every fault lands on records in flight; the report
measures how long each fault stopped the committed output
(``faults.availability``), and a fault that hit an idle workload is an
``idle-fault`` anomaly: the run proved nothing about it.

The ``streaming`` workload runs ``--clients`` instances of a user's
``streaming.App`` (each its own process and state directory, one
application id, so they share the input partitions and every kill is a
rebalance) from a module that also says what input to feed and what output
that must give (the convention is in ``faults.workloads``); the input is
fed in the module's phases (a phase once the app's committed offsets cover the one
before), and the output topic is checked against the module's ``expected``
with ``faults.checker``.

The ``spark`` workload runs a user's Spark Structured Streaming query (a
module that builds it; the convention is in ``faults.spark``) in a driver
process of its own, feeds the module's input the same way (a phase once the
query's committed batches cover the one before, read from its checkpoint),
and checks the output topic against the module's ``expected``. Its driver is
the one client (``--clients`` does not apply); ``kill-driver`` SIGKILLs it
with its JVM and Python workers and restarts it from its checkpoint, which
takes a JVM start (tens of seconds), so give the run a longer
``--duration`` and a longer ``--mean-fault-interval``. With
``kill-executor`` among the faults the query runs on a Spark standalone
cluster started for the run (``streaming.spark.cluster``: a master and two
workers, stopped at the end), whose executors are separate processes that
can die on their own.

The same seed gives the same fault schedule (kinds, times, victims). Faults:

| kind | what happens |
| --- | --- |
| kill-broker | SIGKILL the broker, restart it on the same data directory |
| kill-client | SIGKILL one workload process, start it again |
| lose-disk | (streaming) SIGKILL one app instance, delete its state directory, start it again: a container rescheduled onto a fresh disk |
| kill-driver | (spark) SIGKILL the Spark driver's process groups (JVM, Python workers), restart it from its checkpoint |
| kill-executor | (spark, on a cluster started for the run) SIGKILL one worker's executor JVM with its Python daemons and workers; Spark reruns the lost tasks on a new executor |
| pause-client | SIGSTOP one workload process for 2 s, then SIGCONT |
| pause-broker | SIGSTOP the broker for 2 s, then SIGCONT |
| proxy-cut | reset every client connection at the proxy |
| proxy-delay-endtxn | hold every EndTxn request 2 s at the proxy for 5 s (the schedule Jepsen used) |
| torn-tail | the broker dies halfway through writing a batch (the ``storage.torn_write`` crash point), then restarts and recovers |
| disk-fsync | fsyncs fail with EIO for 1 s; the broker is restarted, as its logs refuse appends |
"""

from __future__ import annotations

import glob
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time

import attrs

from faults import checker as checker_module
from faults.availability import Output, PartitionSample, instance_recoveries, measure
from faults.disk import ENVIRONMENT_VARIABLE as DISK_FAULTS_VARIABLE
from faults.disk import TORN_WRITE_POINT, DiskFaultControl
from faults.history import polls, read_history, sends
from faults.points import CRASH_EXIT_CODE
from faults.points import ENVIRONMENT_VARIABLE as POINTS_VARIABLE
from faults.process import BrokerProcess, ClientProcess, restartable_port
from faults.proxy import ThreadedFaultProxy
from faults.report import FaultEvent, write_report
from faults.watcher import ProgressProbe, TopicWatcher, deltas
from protocol.messages import ApiKey

FAULT_WAIT_SECONDS = 300.0  # how long past the duration the schedule may wait for a fault to be worth injecting
FAULT_KINDS = ("kill-broker", "kill-client", "lose-disk", "kill-driver", "kill-executor", "pause-client", "pause-broker", "proxy-cut", "proxy-delay-endtxn", "torn-tail", "disk-fsync")
WORKLOAD_KINDS = ("copier", "copier-confluent", "copier-librdkafka", "producer", "bank", "processor", "streaming", "spark")
RESTORED_LINE = re.compile(r"restored \d+ changelog records up to offset -?\d+ in ([\d.]+) s")  # streaming.restore's INFO line
BROKER_CONFIG = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")


@attrs.frozen
class ChaosSettings:
    workload: str = attrs.field(validator=attrs.validators.in_(WORKLOAD_KINDS))
    faults: tuple = attrs.field(default=("kill-broker", "kill-client", "proxy-cut"), converter=tuple)
    duration: float = 30.0
    seed: int = 0
    records: int = 20_000  # input records, fed at a steady rate over the duration (copier, processor, streaming, spark); sends per producer process (producer)
    clients: int = 2  # workload processes
    abort_ratio: float = 0.1
    mean_fault_interval: float = 5.0
    # workload "processor": the user's own consume-transform-produce program,
    # a command template with {bootstrap}, {input}, {output}, {index}; it must
    # copy "input" to "output" exactly once (through ``transform`` if given).
    processor: tuple = attrs.field(default=(), converter=tuple)
    transform: object = None  # value -> expected output value (Python API only)
    reader_isolation: str = "read_committed"  # the final reader's (read_uncommitted shows the checker at work)
    # workload "streaming": a module with a streaming.App and its chaos
    # convention (faults.workloads), as a .py path or a module name.
    app: str = ""
    # workload "spark": a module that builds a Spark query, and its chaos
    # convention (faults.spark), as a .py path or a module name.
    query: str = ""
    # workload "streaming": where each instance's identity comes from: "given"
    # (ONCEFLOW_INSTANCE_ID=app-N, as an orchestrator names its replicas) or
    # "state-dir" (generated and kept in its state directory, lost with it).
    instance_ids: str = attrs.field(default="given", validator=attrs.validators.in_(("given", "state-dir")))
    # More settings for the broker ("KEY=VALUE", as ``onceflow broker --config``).
    broker_config: tuple = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s): {', '.join(sorted(unknown))}; known: {', '.join(FAULT_KINDS)}")
        if (self.workload == "processor") != bool(self.processor):
            raise ValueError("the processor workload needs a processor command, and only it takes one")
        if (self.workload == "streaming") != bool(self.app):
            raise ValueError("the streaming workload needs an app module (--app), and only it takes one")
        if (self.workload == "spark") != bool(self.query):
            raise ValueError("the spark workload needs a query module (--query), and only it takes one")
        if "kill-driver" in self.faults and self.workload != "spark":
            raise ValueError("kill-driver needs the spark workload (a Spark driver to kill)")
        if "lose-disk" in self.faults and self.workload != "streaming":
            raise ValueError("lose-disk needs the streaming workload (app instances with state directories)")
        if "kill-executor" in self.faults and self.workload != "spark":
            raise ValueError("kill-executor needs the spark workload (it runs the query on a cluster, whose executors it kills)")


@attrs.frozen
class PlannedFault:
    at: float
    kind: str
    victim: int  # which client, for client faults


def fault_schedule(settings: ChaosSettings) -> list[PlannedFault]:
    """The seeded schedule: same seed and settings, same faults at the same times."""
    rng = random.Random(settings.seed)
    kinds = sorted(settings.faults)
    planned, at = [], 0.0
    if not kinds:
        return planned
    while True:
        at += rng.uniform(0.5, 1.5) * settings.mean_fault_interval
        if at >= settings.duration - 1:
            return planned
        planned.append(PlannedFault(round(at, 3), rng.choice(kinds), rng.randrange(max(1, settings.clients))))


class ChaosRun:
    def __init__(self, settings: ChaosSettings, report_dir: str, *, out=sys.stdout):
        self.settings = settings
        self.report_dir = os.path.abspath(report_dir)
        self.out = out
        self.work = tempfile.mkdtemp(prefix="onceflow-chaos-")
        self.history_dir = os.path.join(self.work, "history")
        os.makedirs(self.history_dir)
        self.disk = DiskFaultControl(os.path.join(self.work, "disk-faults.json"))
        self.faults: list[FaultEvent] = []
        self.victim_logs: dict[int, tuple[str, int]] = {}  # fault index -> (the killed instance's log, its size then)
        self.instance_recoveries: list = []  # faults.availability.InstanceRecovery (the streaming workload's client faults)
        self.clients: list[ClientProcess] = []
        self.started = time.monotonic()
        self.pending_clears: list[tuple[float, str, object, int]] = []  # (due, action, target, index of the fault)
        self.probe: ProgressProbe | None = None  # the workload's committed input position (streaming, spark)
        self.output_watcher: TopicWatcher | None = None  # the output as a read_committed reader sees it (processor)

    # -- set-up ----------------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _start_broker(self) -> None:
        port = restartable_port()  # the broker restarts on it (faults.process)
        self.proxy = ThreadedFaultProxy("127.0.0.1", port).start()
        self.broker = BrokerProcess(os.path.join(self.work, "data"), *BROKER_CONFIG, *self.settings.broker_config, port=port, advertise=f"127.0.0.1:{self.proxy.port}",
                                    env={DISK_FAULTS_VARIABLE: self.disk.path}, log_path=os.path.join(self.work, "broker.log"))
        self.broker.start()
        self.bootstrap = f"127.0.0.1:{self.proxy.port}"

    def _workload_command(self, name: str, process: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "faults.workloads", name, "--bootstrap", self.bootstrap, "--history", os.path.join(self.history_dir, f"{process}.jsonl"), "--process", process, *extra]

    def _client(self, name: str, process: str, *extra: str, env: dict | None = None) -> ClientProcess:
        client = ClientProcess(process, self._workload_command(name, process, *extra), os.path.join(self.work, f"{process}.log"), env=env)
        return client.start()

    def _set_up_workload(self) -> None:
        from txn import Admin

        settings = self.settings
        if settings.workload == "streaming":
            self._set_up_streaming()
            return
        if settings.workload == "spark":
            self._set_up_spark()
            return
        with Admin(bootstrap_servers=self.bootstrap) as admin:
            if settings.workload.startswith("copier") or settings.workload == "processor":
                admin.create_topics({"input": 2, "output": 3})
            elif settings.workload == "producer":
                admin.create_topics({"output": 2})
            else:
                admin.create_topics({"ledger": 1})
        if settings.workload.startswith("copier") or settings.workload == "processor":
            # The input arrives at a steady rate over the whole run (``_feed_due``),
            # so every fault lands on records in flight.
            self._set_up_feed([[("input", f"k{i % 100}", str(i), None, None) for i in range(settings.records)]], op="send")
            for index in range(settings.clients if settings.workload != "processor" else 0):
                extra = ["--input", "input", "--output", "output", "--group", "copiers", "--transactional-id", f"copier-{index}",
                         "--abort-ratio", str(settings.abort_ratio), "--seed", str(settings.seed * 100 + index)]
                self.clients.append(self._client(settings.workload, f"copier-{index}", *extra))
            if settings.workload == "processor":
                self.output_watcher = TopicWatcher(self.bootstrap, "output", 3, self._elapsed)
                for index in range(settings.clients):
                    command = [part.format(bootstrap=self.bootstrap, input="input", output="output", index=index) for part in settings.processor]
                    client = ClientProcess(f"processor-{index}", command, os.path.join(self.work, f"processor-{index}.log"))
                    self.clients.append(client.start())
        elif settings.workload == "producer":
            for index in range(settings.clients):
                self.clients.append(self._client("producer", f"producer-{index}", "--output", "output", "--count", str(settings.records)))
        else:
            opener = self._client("bank", "bank-open", "--output", "ledger", "--transactional-id", "bank-open", "--open-accounts")
            opener.wait_exit(60)
            for index in range(settings.clients):
                self.clients.append(self._client("bank", f"bank-{index}", "--output", "ledger", "--transactional-id", f"bank-{index}",
                                                 "--abort-ratio", str(settings.abort_ratio), "--seed", str(settings.seed * 100 + index)))
            self.clients.append(self._client("reader", "auditor", "--output", "ledger", "--balances"))

    # -- the streaming workload ----------------------------------------------------------------------

    def _set_up_streaming(self) -> None:
        from faults.workloads import load_app_module
        from streaming.app import INSTANCE_ID_VARIABLE
        from txn import Admin

        settings = self.settings
        self.app_path = os.path.abspath(settings.app) if settings.app.endswith(".py") else settings.app
        self.app_module = load_app_module(self.app_path)
        probe = self.app_module.build_app(self.bootstrap, os.path.join(self.work, "probe-state"))
        self.application_id = probe.application_id
        with Admin(bootstrap_servers=self.bootstrap) as admin:
            admin.create_topics(dict(self.app_module.CHAOS_TOPICS), exist_ok=True)
        self._set_up_feed([list(phase) for phase in self.app_module.chaos_input(settings.records, settings.seed)], op="seed")
        self.probe = ProgressProbe(self._group_position, self._elapsed, interval=0.25)
        self.state_dirs = []
        self.partition_samples: list[PartitionSample] = []  # the input's committed offsets and ends: per-instance recovery
        for index in range(settings.clients):
            state_dir = os.path.join(self.work, f"state-{index}")  # kept across restarts (but not a lose-disk): its SQLite files and instance id
            self.state_dirs.append(state_dir)
            env = {INSTANCE_ID_VARIABLE: f"app-{index}"} if settings.instance_ids == "given" else {INSTANCE_ID_VARIABLE: ""}
            self.clients.append(self._client("streaming", f"app-{index}", "--app", self.app_path, "--state-dir", state_dir, env=env))

    def _set_up_spark(self) -> None:
        from faults.spark import DriverProcess, java_missing, load_query_module
        from txn import Admin

        problem = java_missing()
        if problem:
            raise RuntimeError(problem)
        settings = self.settings
        query_path = os.path.abspath(settings.query) if settings.query.endswith(".py") else settings.query
        self.app_module = load_query_module(query_path)  # the feeding, the drain and the check read it as they read an app module
        self.checkpoint = os.path.join(self.work, "spark-checkpoint")
        with Admin(bootstrap_servers=self.bootstrap) as admin:
            admin.create_topics(dict(self.app_module.CHAOS_TOPICS), exist_ok=True)
        self._set_up_feed([list(phase) for phase in self.app_module.chaos_input(settings.records, settings.seed)], op="seed")
        self.probe = ProgressProbe(self._spark_position, self._elapsed, interval=0.25)
        master = None
        if "kill-executor" in settings.faults:
            from streaming.spark import cluster

            self._say("  starting a Spark standalone cluster for the run (its executors are killed)")
            self.cluster = cluster.start(os.path.join(self.work, "spark-cluster"))
            master = self.cluster.master_url
            self._say(f"  cluster up: {master} in {self.cluster.directory}, {self.cluster.settings.workers} workers")
        driver = DriverProcess("spark-driver", query_path, self.bootstrap, self.checkpoint, os.path.join(self.work, "spark-driver.log"), master=master)
        self.clients.append(driver.start())

    def _set_up_feed(self, phases: list[list[tuple]], *, op: str) -> None:
        """The input to feed, in phases of ``(topic, key, value, timestamp_ms,
        partition)``; each acknowledged record goes to the history as an
        ``ok`` ``op`` by the seeder (``send``: the copier's checker counts it
        as input; ``seed``: a note the expected output speaks for)."""
        self.phases = phases
        self.feed_op = op
        self.feed_total = sum(map(len, phases))
        self.input_topics = sorted({record[0] for phase in phases for record in phase})
        self.fed: list[tuple] = []  # acknowledged, in feeding order: what ``expected`` is given
        self.sent_count = 0
        self.feeding: list[tuple] = []  # the rest of the phase being fed
        self.fed_ends: dict = {}  # TopicPartition -> end offset after what was fed
        self.feeder = None  # the input's producer
        self.in_flight: list = []  # (record, future, time sent) sent, not yet acknowledged
        self.next_phase_check = 0.0
        self.next_idle_check = 0.0
        self.idle_until_fed_beyond: int | None = None  # a due fault waits until more than this many records are acknowledged
        self.seeder = open(os.path.join(self.history_dir, "seeder.jsonl"), "a")
        self._feed_next_phase()

    def _feed_due(self, *, everything: bool = False) -> None:
        """Send what a steady rate has due by now (the whole input over the
        run's ``--duration``), or ``everything`` left (the drain). A phase
        starts once the workload has processed the ones before it."""
        self._settle_feeds()
        fraction = 1.0 if everything else min(1.0, self._elapsed() / max(1e-3, self.settings.duration))
        due = math.ceil(self.feed_total * fraction)
        while self.sent_count < due:
            if not self.feeding:
                if not self.phases or self.in_flight or self._elapsed() < self.next_phase_check:
                    return
                self.next_phase_check = self._elapsed() + 0.5
                if not self._fed_input_processed():
                    return
                self._feed_next_phase()
                continue
            self._send_input(min(due - self.sent_count, len(self.feeding)))

    def _send_input(self, count: int) -> None:
        """Send the next ``count`` records of the phase being fed. One
        idempotent producer for the whole run, never waited on here (a paused
        broker must not stall the fault loop): its retries cannot duplicate a
        record, and ``_settle_feeds`` notes each record once acknowledged."""
        from txn import Producer

        def raw(part):
            return part.encode("utf-8") if isinstance(part, str) else part

        if self.feeder is None:
            self.feeder = Producer(bootstrap_servers=self.bootstrap, linger_ms=20, batch_size=1 << 18, delivery_timeout_ms=300_000, request_timeout_ms=5000)
        chunk, self.feeding = self.feeding[:count], self.feeding[count:]
        self.sent_count += len(chunk)
        sent_at = time.time()
        for record in chunk:
            self.in_flight.append((record, self.feeder.send(record[0], raw(record[2]), key=raw(record[1]), partition=record[4], timestamp=record[3]), sent_at))

    def _settle_feeds(self) -> None:
        """Note the acknowledged input records, in the order they were sent
        (``expected`` is given them in feeding order), each as an ``ok``
        ``feed_op`` in the history with the time it was sent (``sent``). A
        record that failed for good leaves the check unsound, so the run stops."""
        from txn import TopicPartition

        while self.in_flight and self.in_flight[0][1].done():
            record, future, sent_at = self.in_flight.pop(0)
            try:
                metadata = future.result(10)  # done: this only fetches it from the loop
            except Exception as error:
                raise RuntimeError(f"an input record's write failed for good ({error}): the check cannot know the input") from error
            tp = TopicPartition(metadata.topic, metadata.partition)
            self.fed_ends[tp] = max(self.fed_ends.get(tp, 0), metadata.offset + 1)
            text = record[2] if isinstance(record[2], str) or record[2] is None else record[2].decode("utf-8", "replace")
            self.seeder.write(json.dumps({"time": time.time(), "sent": sent_at, "process": "seeder", "type": "ok", "op": self.feed_op,
                                          "value": [["send", f"{metadata.topic}-{metadata.partition}", text, metadata.offset]]}) + "\n")
            self.fed.append(record)
        self.seeder.flush()

    def _feed_next_phase(self) -> None:
        self.feeding = self.phases.pop(0)
        self._say(f"  t={self._elapsed():5.1f}s  feeding an input phase of {len(self.feeding)} records over the run ({len(self.phases)} phases to go)")

    def _fed_input_processed(self) -> bool:
        """Whether the app's committed offsets (a Spark query's: its last
        committed batch's) cover everything fed so far."""
        from txn import Admin

        if self.settings.workload == "spark":
            from faults.spark import committed_source_offsets

            reached = committed_source_offsets(self.checkpoint)
            return all(reached.get((tp.topic, tp.partition), -1) >= end for tp, end in self.fed_ends.items())
        try:
            with Admin(bootstrap_servers=self.bootstrap, request_timeout_ms=5000) as admin:
                committed = admin.list_group_offsets(self.application_id)
        except Exception:  # the broker is down or restarting: ask again later
            return False
        return all(committed.get(tp) is not None and committed[tp].offset >= end for tp, end in self.fed_ends.items())

    def _group_position(self) -> int | None:
        """Input records the streaming app has consumed and committed: its
        group's committed offsets on the input topics (the input is not
        transactional, so an offset counts records)."""
        from txn import Admin, TopicPartition

        asked = self._elapsed()
        with Admin(bootstrap_servers=self.bootstrap, request_timeout_ms=2000) as admin:
            committed = admin.list_group_offsets(self.application_id)
            if self.settings.workload == "streaming":
                ends = admin.list_offsets({TopicPartition(topic, p): "latest" for topic in self.input_topics for p in range(self.app_module.CHAOS_TOPICS[topic])})
                self.partition_samples.append(PartitionSample(asked, {f"{tp.topic}-{tp.partition}": offset.offset for tp, offset in committed.items() if offset is not None and tp.topic in self.input_topics},
                                                              {f"{tp.topic}-{tp.partition}": listed.offset for tp, listed in ends.items()}))
        return sum(offset.offset for tp, offset in committed.items() if offset is not None and tp.topic in self.input_topics)

    def _spark_position(self) -> int | None:
        """Input records the Spark query's committed batches cover."""
        from faults.spark import committed_source_offsets

        return sum(end for (topic, _partition), end in committed_source_offsets(self.checkpoint).items() if topic in self.input_topics)

    def _finish_feeding(self, deadline: float) -> None:
        """Feed the rest of the input without faults, until every record is acknowledged."""
        while (self.phases or self.feeding or self.in_flight) and time.monotonic() < deadline:
            for client in self.clients:
                client.restart_if_exited()
            self._feed_due(everything=True)
            time.sleep(0.2)

    def _drain_streaming(self, deadline: float) -> None:
        """Feed the rest of the input without faults, then wait until the
        output holds as many committed records as expected."""
        self._finish_feeding(deadline)
        self.expected_outputs = self._expected_outputs()
        self._wait_for_output(deadline, topic=self.app_module.CHAOS_OUTPUT, count=sum(self.expected_outputs.values()))

    def _expected_outputs(self):
        from collections import Counter

        from faults.workloads import output_text

        return Counter(output_text(key, value if isinstance(value, (str, bytes)) or value is None else json.dumps(value))
                       for key, value in self.app_module.expected(list(self.fed)))

    # -- faults -----------------------------------------------------------------------------------

    def _fault_waits(self, fault: PlannedFault) -> bool:
        """Whether ``fault``, due now, would prove nothing: a kill-executor
        while the worker runs no executor yet (the driver's JVM still
        starting, or the last kill's executor not yet replaced), or any fault
        while the input sits idle between two phases (``_input_idle``)."""
        return self._executor_fault_waits(fault) or self._input_idle()

    def _input_idle(self) -> bool:
        """Whether the phased input has nothing waiting: every record fed so
        far acknowledged and processed, the next phase not yet due. A fault
        then would hit a workload with nothing to do (an ``idle-fault`` in the
        verdict), so it waits until a record of the next phase is
        acknowledged. The broker is asked at most every half second."""
        if not getattr(self, "feeding_input", False):
            return False
        if self.idle_until_fed_beyond is not None:
            if len(self.fed) > self.idle_until_fed_beyond:
                self.idle_until_fed_beyond = None
                return False
            return True
        if self.feeding or self.in_flight or not self.phases or self._elapsed() < self.next_idle_check:
            return False
        self.next_idle_check = self._elapsed() + 0.5
        if not self._fed_input_processed():
            return False
        self.idle_until_fed_beyond = len(self.fed)
        self._say(f"  t={self._elapsed():5.1f}s  the input is idle between phases: the next fault waits for the next phase")
        return True

    def _executor_fault_waits(self, fault: PlannedFault) -> bool:
        """Whether ``fault`` is a kill-executor whose worker runs no executor yet."""
        if fault.kind != "kill-executor":
            return False
        from faults.spark import executor_pids

        return not executor_pids(self.cluster.directory, self._executor_role(fault))

    def _executor_role(self, fault: PlannedFault) -> str:
        return self.cluster.worker_roles()[fault.victim % self.cluster.settings.workers]

    def _restart_broker(self) -> None:
        self.broker.kill()
        self.broker.start()

    def _apply(self, fault: PlannedFault) -> tuple[str, str, bool]:
        """Apply one fault: (what happened, the victim process's name or "",
        whether it lasts until a pending clear rather than ending here)."""
        victims = [c for c in self.clients if c.name != "auditor"] or self.clients
        victim = victims[fault.victim % len(victims)] if victims else None
        now = self._elapsed()
        if fault.kind == "kill-broker":
            self._restart_broker()
            return "broker killed and restarted", "", False
        if fault.kind == "kill-driver":
            victim.kill()
            victim.start()
            return f"{victim.name} killed (JVM and Python workers) and restarted from its checkpoint", victim.name, False
        if fault.kind == "kill-executor":
            from faults.spark import kill_executors

            role = self._executor_role(fault)
            killed = kill_executors(self.cluster.directory, role)
            if not killed:
                return f"{role} ran no executor at that moment: nothing killed", role, False
            return f"{role}'s executor killed ({len(killed)} processes: its JVM, Python daemon and workers)", role, False
        if fault.kind == "kill-client":
            self._note_victim(fault.victim, victim)
            victim.kill()
            victim.start()
            return f"{victim.name} killed and restarted", victim.name, False
        if fault.kind == "lose-disk":
            self._note_victim(fault.victim, victim)
            victim.kill()
            shutil.rmtree(self.state_dirs[fault.victim % len(self.state_dirs)], ignore_errors=True)
            victim.start()
            return f"{victim.name} killed, its state directory deleted, restarted", victim.name, False
        if fault.kind == "pause-client":
            victim.pause()
            self.pending_clears.append((now + 2.0, "resume", victim, len(self.faults) - 1))
            return f"{victim.name} paused for 2 s", victim.name, True
        if fault.kind == "pause-broker":
            self.broker.pause()
            self.pending_clears.append((now + 2.0, "resume", self.broker, len(self.faults) - 1))
            return "broker paused for 2 s", "", True
        if fault.kind == "proxy-cut":
            return f"{self.proxy.cut()} connections cut", "", False
        if fault.kind == "proxy-delay-endtxn":
            self.proxy.delay_requests(ApiKey.END_TXN, 2.0)
            self.pending_clears.append((now + 5.0, "clear-requests", None, len(self.faults) - 1))
            return "EndTxn held 2 s for 5 s", "", True
        if fault.kind == "torn-tail":
            # A real torn write: the broker dies halfway through one of its next
            # segment writes (an unacknowledged batch), then restarts and recovers.
            hit = random.Random(f"{self.settings.seed}-{fault.at}").randint(1, 20)
            self.broker.kill()
            self.broker.env = {DISK_FAULTS_VARIABLE: self.disk.path, POINTS_VARIABLE: f"{TORN_WRITE_POINT}@{hit}:exit"}
            try:
                self.broker.start()
            except RuntimeError:
                # Its recovery writes too (markers of the transactions the kill
                # left open): the torn write came while it started. Start it clean.
                if self.broker.process.poll() != CRASH_EXIT_CODE:
                    raise
                self.broker.env = {DISK_FAULTS_VARIABLE: self.disk.path}
                self.broker.start()
                return f"broker restarted, died mid-write at its write #{hit} while starting, restarted", "", False
            self.broker.env = {DISK_FAULTS_VARIABLE: self.disk.path}
            return f"broker restarted to die mid-write at its write #{hit}", "", False
        if fault.kind == "disk-fsync":
            self.disk.fail_fsyncs("EIO", seconds=1.0)
            self.pending_clears.append((now + 1.5, "restart-broker", None, len(self.faults) - 1))
            return "fsync fails with EIO for 1 s, then the broker restarts", "", True
        raise ValueError(fault.kind)

    def _note_victim(self, index: int, victim: ClientProcess) -> None:
        """Before a streaming instance is killed: which input partitions it
        holds (on the fault being applied, for the per-instance recovery) and
        where its log ends (what follows is its restart's)."""
        if self.settings.workload != "streaming":
            return
        from txn import Admin

        state_dir = self.state_dirs[index % len(self.state_dirs)]
        instance = f"app-{index % len(self.state_dirs)}"
        if self.settings.instance_ids == "state-dir":
            try:
                with open(os.path.join(state_dir, "instance-id"), encoding="utf-8") as file:
                    instance = file.read().strip()
            except OSError:
                return  # it never started: it holds nothing
        held: tuple = ()
        try:
            with Admin(bootstrap_servers=self.bootstrap, request_timeout_ms=2000) as admin:
                (group,) = admin.describe_groups([self.application_id])
            held = tuple(sorted(f"{tp.topic}-{tp.partition}" for member in group.members if member.group_instance_id == f"{self.application_id}-{instance}"
                                for tp in member.assignment if tp.topic in self.input_topics))
        except Exception:  # noqa: BLE001 - the broker is restarting: this fault is not measured per instance
            pass
        self.faults[-1] = attrs.evolve(self.faults[-1], victim_partitions=held)
        self.victim_logs[len(self.faults) - 1] = (victim.log_path, os.path.getsize(victim.log_path) if os.path.exists(victim.log_path) else 0)

    def _restore_seconds(self, index: int) -> float | None:
        """The store restores of fault ``index``'s victim after its restart,
        in seconds as its log says (the sum over its shards), up to its first assignment."""
        path, offset = self.victim_logs.get(index, (None, 0))
        if path is None or not os.path.exists(path):
            return None
        with open(path, encoding="utf-8", errors="replace") as file:
            file.seek(offset)
            text = file.read()
        text = text.split("streaming.runner: assigned ", 1)[0]
        return sum(float(seconds) for seconds in RESTORED_LINE.findall(text))

    def _cleared(self, index: int) -> None:
        """Fault ``index`` stopped acting now (the availability measure counts from here)."""
        self.faults[index] = attrs.evolve(self.faults[index], cleared=round(self._elapsed(), 3))

    def _clear(self, item) -> None:
        _due, action, target, index = item
        if action == "resume":
            target.resume()
        elif action == "clear-requests":
            self.proxy.clear_requests(ApiKey.END_TXN)
        elif action == "restart-broker":
            self.disk.clear()
            self._restart_broker()
        self._cleared(index)

    def _clear_due(self) -> None:
        now = self._elapsed()
        for item in [c for c in self.pending_clears if c[0] <= now]:
            self.pending_clears.remove(item)
            self._clear(item)

    # -- the run ------------------------------------------------------------------------------------

    def _history_lines(self) -> int:
        total = 0
        for path in glob.glob(os.path.join(self.history_dir, "*.jsonl")):
            with open(path, "rb") as file:
                total += file.read().count(b"\n")
        return total

    def run(self):
        settings = self.settings
        schedule = fault_schedule(settings)
        self._say(f"chaos: workload {settings.workload}, faults {','.join(settings.faults) or 'none'}, {len(schedule)} planned over {settings.duration:.0f} s, seed {settings.seed}")
        self._start_broker()
        try:
            self._set_up_workload()
            self.started = time.monotonic()
            self.feeding_input = hasattr(self, "feed_total")
            for watcher in (self.probe, self.output_watcher):
                if watcher is not None:
                    watcher.start()
            next_progress = 1.0
            queue = list(schedule)
            # A fault due while it would prove nothing waits (``_fault_waits``),
            # and the rest of the schedule waits with it (the faults keep
            # their spacing), past the duration if need be (up to
            # FAULT_WAIT_SECONDS more).
            end = settings.duration
            while self._elapsed() < end:
                self._clear_due()
                if queue and queue[0].at <= self._elapsed() and self._fault_waits(queue[0]) and end < settings.duration + FAULT_WAIT_SECONDS:
                    shift = self._elapsed() - queue[0].at
                    queue = [attrs.evolve(planned, at=planned.at + shift) for planned in queue]
                    end = min(settings.duration + FAULT_WAIT_SECONDS, end + shift)
                while queue and queue[0].at <= self._elapsed() and not self._fault_waits(queue[0]):
                    fault = queue.pop(0)
                    at = self._elapsed()
                    self.faults.append(FaultEvent(round(at, 3), fault.kind))
                    detail, victim, lasting = self._apply(fault)
                    self.faults[-1] = attrs.evolve(self.faults[-1], detail=detail, victim=victim)
                    if not lasting:
                        self._cleared(len(self.faults) - 1)
                    self._say(f"  t={at:5.1f}s  {fault.kind}: {detail}" + ("" if lasting else f" (cleared at {self._elapsed():.1f} s)"))
                for client in self.clients:
                    if client.restart_if_exited():
                        self._say(f"  t={self._elapsed():5.1f}s  {client.name} exited; restarted")
                if self.broker.process.poll() is not None:
                    code = self.broker.process.returncode
                    self.broker.start()
                    self._say(f"  t={self._elapsed():5.1f}s  broker exited ({code}); restarted")
                    if self.faults and self.faults[-1].kind == "torn-tail":  # it died at its crash point: that fault ends now
                        self._cleared(len(self.faults) - 1)
                if self.feeding_input:
                    self._feed_due()
                if self._elapsed() >= next_progress:
                    next_progress += 5.0
                    self._say(f"  t={self._elapsed():5.1f}s  {len(self.faults)} faults so far, {self._history_lines()} history events")
                time.sleep(0.1)
            self.faulted_until = self._elapsed()
            self._heal()
            self._drain()
        finally:
            for watcher in (self.probe, self.output_watcher):
                if watcher is not None:
                    watcher.stop.set()
            for client in self.clients:
                if client.alive:
                    client.kill()
            if getattr(self, "feeder", None) is not None:
                try:
                    self.feeder.close(timeout=5)
                except Exception:  # noqa: BLE001 - everything it had to say was acknowledged or is reported
                    pass
            self.broker.kill()
            self.proxy.stop()
            if getattr(self, "cluster", None) is not None:
                from streaming.spark import cluster

                cluster.stop(self.cluster.directory)
        return self._judge()

    def _heal(self) -> None:
        self.proxy.heal()
        self.disk.clear()
        for item in self.pending_clears:
            self._clear(item)
        self.pending_clears.clear()
        if not self.broker.alive:
            self.broker.start()
        self._say(f"  t={self._elapsed():5.1f}s  faults healed; letting the workload finish")

    def _drain(self) -> None:
        """Give the workload time to finish its work without faults, stop it,
        then read everything it produced (the final read phase)."""
        settings = self.settings
        # A Spark driver restarted late in the run needs a JVM start and its first batch.
        deadline = time.monotonic() + max(180.0 if settings.workload == "spark" else 30.0, settings.duration)
        if settings.workload.startswith("copier") or settings.workload == "processor":
            self._finish_feeding(deadline)
        if settings.workload.startswith("copier"):
            from txn import Admin, TopicPartition

            with Admin(bootstrap_servers=self.bootstrap) as admin:
                while time.monotonic() < deadline:
                    for client in self.clients:
                        client.restart_if_exited()
                    ends = admin.list_offsets({TopicPartition("input", p): "latest" for p in range(2)})
                    committed = admin.list_group_offsets("copiers")
                    if all(committed.get(tp) and committed[tp].offset >= end.offset for tp, end in ends.items()):
                        break
                    time.sleep(0.5)
        elif settings.workload == "processor":
            self._wait_for_output(deadline)
        elif settings.workload in ("streaming", "spark"):
            self._drain_streaming(deadline)
        elif settings.workload == "producer":
            for client in self.clients:
                try:
                    client.wait_exit(max(1.0, deadline - time.monotonic()))
                except Exception:
                    pass
        else:
            time.sleep(2.0)
        for client in self.clients:
            client.terminate(timeout=30)
        topic, partitions = {"producer": ("output", 2), "bank": ("ledger", 1)}.get(settings.workload, ("output", 3))
        extra = []
        if settings.workload in ("streaming", "spark"):
            topic = self.app_module.CHAOS_OUTPUT
            partitions = self.app_module.CHAOS_TOPICS[topic]
            extra = ["--with-keys"]
        reader = self._client("reader", "final-reader", "--output", topic, "--partitions", str(partitions), "--until-idle", "3", "--isolation", settings.reader_isolation, *extra)
        reader.wait_exit(120)

    def _wait_for_output(self, deadline: float, *, topic: str = "output", count: int | None = None) -> None:
        """Until the output holds as many committed records as the input
        (or ``count``), or the deadline."""
        from txn import Consumer, TopicPartition

        count = self.settings.records if count is None else count
        partitions = self.app_module.CHAOS_TOPICS[topic] if self.settings.workload in ("streaming", "spark") else 3
        consumer = Consumer(bootstrap_servers=self.bootstrap, max_poll_records=10_000)
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        seen = 0
        try:
            while seen < count and time.monotonic() < deadline:
                for client in self.clients:
                    client.restart_if_exited()
                seen += len(consumer.poll(0.5))
        finally:
            consumer.close()
        time.sleep(1.0)  # anything extra (a duplicate) gets its chance to show

    def _judge(self):
        history = []
        for path in sorted(glob.glob(os.path.join(self.history_dir, "*.jsonl"))):
            history.extend(read_history(path))
        history.sort(key=_event_time)
        streaming = self.settings.workload in ("streaming", "spark")
        verdict = checker_module.check_workload(self.settings.workload, history, total=10 * 100 if self.settings.workload == "bank" else None, transform=self.settings.transform,
                                                expected_outputs=self._expected_outputs() if streaming else None,
                                                output_topic=self.app_module.CHAOS_OUTPUT if streaming else None)
        if streaming and (self.phases or self.feeding or self.in_flight):
            verdict.add("copy-missing", {"input never fed (the app did not process the earlier phases in time)": len(self.feeding) + len(self.in_flight) + sum(map(len, self.phases))})
        ok_times = [
            _event_time(e) - self.wall_started
            for e in history
            if e["type"] == "ok" and e["op"] in ("txn", "send") and e["process"] != "seeder"
            for _send in sends(e)
        ]
        availability = self.availability = self._availability(history)
        if self.settings.workload == "streaming":
            index_at = {fault.at: index for index, fault in enumerate(self.faults)}
            self.instance_recoveries = [attrs.evolve(recovery, restore_s=self._restore_seconds(index_at[recovery.at]))
                                        for recovery in instance_recoveries(self.partition_samples, self.faults, end=getattr(self, "faulted_until", self._elapsed()))]
        for recovery in availability.recoveries:
            if recovery.in_flight is False:
                verdict.add("idle-fault", {"at": recovery.at, "kind": recovery.kind, "why": "no input was waiting: the workload had finished or not begun"})
        settings = attrs.asdict(self.settings)
        settings["faults"] = ",".join(self.settings.faults)
        settings["processor"] = " ".join(self.settings.processor)
        settings["transform"] = getattr(self.settings.transform, "__name__", None)
        paths = write_report(self.report_dir, settings=settings, history=history, faults=self.faults, verdict=verdict, ok_times=ok_times, duration=self._elapsed(),
                             availability=availability)
        shutil.copy(self.broker.log_path, os.path.join(self.report_dir, "broker.log"))
        if not verdict.valid:  # what the workload's processes said, to explain the anomalies
            for client in self.clients:
                if os.path.exists(client.log_path):
                    shutil.copy(client.log_path, os.path.join(self.report_dir, os.path.basename(client.log_path)))
        self._say(verdict.summary())
        for line in availability.lines():
            self._say(line)
        self._say(f"report: {self.report_dir} ({', '.join(sorted(paths))})")
        shutil.rmtree(self.work, ignore_errors=True)
        return verdict

    def _availability(self, history: list[dict]):
        """The run's availability (``faults.availability``). Committed output:
        the workload's own ``ok`` transactions and sends, by process; for the
        streaming and Spark workloads, whose output may wait for windows to
        close, the advance of their committed input position (each advance is
        a committed transaction), sampled every 0.25 s. In flight: input
        acknowledged vs. input consumed and committed."""
        def since_start(event):
            return _event_time(event) - self.wall_started

        inputs = consumed = None
        if self.probe is not None:
            outputs = [Output(at, count, "") for at, count in deltas(self.probe.samples)]
            consumed = deltas(self.probe.samples)
        else:
            outputs = [Output(since_start(e), len(sends(e)), e["process"]) for e in history
                       if e["type"] == "ok" and e["op"] in ("txn", "send") and e["process"] != "seeder" and sends(e)]
            if self.output_watcher is not None:  # a user's processor records nothing: its output as a reader sees it
                outputs = self.output_watcher.outputs()
            if self.settings.workload.startswith("copier"):
                consumed = [(since_start(e), sum(len(read) for poll in polls(e) for read in poll.values())) for e in history
                            if e["type"] == "ok" and e["op"] == "txn" and e["process"] != "seeder"]
        sending = []
        if consumed is not None:
            inputs = [(since_start(e), len(sends(e))) for e in history if e["process"] == "seeder" and e["type"] == "ok"]
            sending = [(e["sent"] - self.wall_started, since_start(e)) for e in history if e["process"] == "seeder" and e["type"] == "ok" and "sent" in e]
        return measure(outputs, self.faults, start=0.0, end=getattr(self, "faulted_until", self._elapsed()), inputs=inputs, consumed=consumed,
                       sending=sending)

    @property
    def wall_started(self) -> float:
        return time.time() - self._elapsed()


def _event_time(event: dict) -> float:
    return event["time"]


def run_chaos(settings: ChaosSettings, report_dir: str, *, out=sys.stdout):
    """Run one chaos experiment; returns the checker's verdict (``.valid``)."""
    return ChaosRun(settings, report_dir, out=out).run()


def run_as_script(check, prefix: str, argv: list[str] | None = None) -> int:
    """The exit status of a user's chaos test file run as a script (``python
    examples/chaos_test_of_my_processor.py [report-folder]``): ``check(folder)``
    (its experiment, returning the verdict) on the folder given as the first
    argument, else on a new temporary one named from ``prefix``; 0 when the
    verdict is valid, 1 when not (the report says why)."""
    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else tempfile.mkdtemp(prefix=prefix)
    return 0 if check(folder).valid else 1
