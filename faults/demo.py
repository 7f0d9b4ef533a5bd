"""``onceflow demo``: the whole mission end to end under SIGKILLs, checked.

1. Starts a broker process on a fresh data directory and creates the topics
   ``payments``, ``balances`` and ``region-minutes``.
2. Streams payment events (key: account, timestamp: the payment's event
   time) in at a steady rate with our idempotent producer, cutting its
   connections a few times (batches are retried; the broker drops the copies
   it already has).
3. Runs ``examples/payments_pipeline.py`` (per-account running balances on
   the ``streaming`` runner, a SQLite store changelogged to the log; output,
   store changes and offsets in one transaction) as two processes with their
   own state directories, sharing the partitions.
4. Runs ``examples/spark_region_totals.py`` in a Spark driver process of its
   own (``faults.spark``): a Structured Streaming query reading ``balances``
   through the ``onceflow`` source (read_committed) and writing per-minute
   event-time totals and counts per region (a watermarked window
   aggregation) through the exactly-once sink; its executors in the
   driver's JVM (local mode), or on a standalone cluster (``spark_master``,
   or ``spark_cluster``: one started for the run and stopped after).
   Without ``spark`` the demo is the pipeline alone.
5. Meanwhile SIGKILLs, at seeded moments spread over the run, a pipeline
   instance, the broker and the Spark driver's process groups, restarting
   each (the broker on its data, the query from its checkpoint). The first
   Spark driver kill waits for a batch decided and not yet committed (the
   sink holds after its decision when asked: ``faults.spark.sink_step``);
   whenever the driver is seen dead the completer (``finish_decided``)
   commits a decided batch before the driver restarts. The report says
   which two-phase-commit step each Spark kill hit.
6. Checks with the fault harness's checker: every payment's balance exactly
   once and right; every Spark row exactly once and equal to a plain
   recomputation from the balances read back read_committed. Prints a report
   (and writes it with a PNG timeline, the kills marked, to the report
   folder); returns 1 on any anomaly.

When the payments are all processed, one closing payment of 0 an hour of
event time later goes in: it moves Spark's watermark past every window, so
each window's row is written (append mode writes a window once the watermark
passes it). Its own window stays open and is not expected.

``--keep-data DIR`` keeps the broker's data, the logs and the histories:
``onceflow dump-log`` and ``onceflow transactions`` (with a broker started on
it) show what happened.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter

import attrs

from faults.availability import FaultEvent, measure
from faults.checker import check
from faults.history import HistoryWriter, read_histories
from faults.process import REPO, BrokerProcess, ClientProcess
from faults.report import write_series_png
from faults.watcher import TopicWatcher, deltas, outputs_of

TOPICS = {"payments": 3, "balances": 3, "region-minutes": 2}
BROKER_CONFIG = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")
PIPELINE = os.path.join(REPO, "examples", "payments_pipeline.py")
PIPELINE_GROUP = "payments-pipeline"  # the example's application id
SPARK_QUERY = os.path.join(REPO, "examples", "spark_region_totals.py")
SPARK_PREFIX = "region-minutes"  # the query's transactionalIdPrefix
PIPELINE_INSTANCES = 2
EVENT_EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: payment n happens at this + n * EVENT_STEP_MS
EVENT_STEP_MS = 30
CLOSING_DELAY_MS = 3_600_000
COMPLETER_TIMEOUT_SECONDS = 20.0


@attrs.frozen
class SparkKill:
    """One SIGKILL of the Spark driver: when, the batch in flight (the one
    after Spark's last committed), the sink's two-phase-commit step it hit
    (``faults.spark.describe_step``), and what the completer
    (``finish_decided``), run at once by the supervisor, did and how long
    it took."""

    at: float
    batch: int
    step: str
    decided_open: bool  # the kill landed with the batch decided and not wholly committed
    completer: str
    completer_seconds: float

    def line(self, rows_visible_after: float | None) -> str:
        visible = f"; Spark rows visible again {rows_visible_after:.1f} s after the kill" if rows_visible_after is not None else ""
        return f"t={self.at:5.1f}s  batch {self.batch}: {self.step}; completer: {self.completer} in {self.completer_seconds:.1f} s{visible}"


def spark_kill_lines(kills: list[SparkKill], row_samples: list[tuple[float, int]]) -> list[str]:
    """The report's lines on the Spark driver kills, each with the first
    moment after it that a read_committed reader saw new rows."""
    if not kills:
        return []
    decided = sum(1 for kill in kills if kill.decided_open)
    lines = [f"  Spark driver kills          {len(kills)} ({decided} with a batch decided and not wholly committed)"]
    for kill in kills:
        after = min((at - kill.at for at, _count in row_samples if at > kill.at), default=None)
        lines.append("    " + kill.line(after))
    return lines


def completer_summary(finished) -> str:
    """``sink_driver.Finished`` in a few words for the report."""
    if finished.decision is None:
        return "no decision recorded yet"
    total = len(finished.decision.transactions)
    text = f"committed {len(finished.committed)} of batch {finished.decision.batch_id}'s {total} decided transactions"
    if finished.lost:
        text += f", {len(finished.lost)} could not be"
    return text


def payments(records: int, rng: random.Random) -> list[tuple[str, str]]:
    """(account, "payment-id:account:amount") events."""
    events = []
    for number in range(records):
        account = f"acct-{rng.randrange(200):03d}"
        amount = rng.choice([-1, 1]) * rng.randrange(1, 5000)
        events.append((account, f"p{number:07d}:{account}:{amount}"))
    return events


def event_time(number: int) -> int:
    return EVENT_EPOCH_MS + number * EVENT_STEP_MS


def closing_payment(events: list[tuple[str, str]]) -> tuple[str, str]:
    """A payment of 0 an hour after the last one (see the module doc)."""
    return "acct-000", f"p{len(events):07d}:acct-000:0"


def expected_outputs(events: list[tuple[str, str]]) -> dict[str, str]:
    """Input value -> the output the pipeline must write for it (events of an
    account keep their order: one key, one partition)."""
    balances: dict[str, int] = {}
    expected = {}
    for account, value in events:
        payment_id, _account, amount = value.split(":")
        balances[account] = balances.get(account, 0) + int(amount)
        expected[value] = f"{payment_id}:{account}:{balances[account]}"
    return expected


def spark_rows_expected(balances: list[tuple[str, int]]) -> dict[str, dict]:
    """The rows the Spark query must write, recomputed in plain Python from
    the balances read back read_committed ``[(value, timestamp_ms)]``: every
    window but the closing payment's (the one of the latest event time)."""
    from faults.spark import load_query_module

    module = load_query_module(SPARK_QUERY)
    if not balances:
        return {}
    latest = max(timestamp for _value, timestamp in balances)
    rows = module.totals_of(balances)
    return {key: row for key, row in rows.items() if row["window_start"] + module.WINDOW_MS <= latest - module.WATERMARK_MS}


class InputStream(threading.Thread):
    """The payments as a live stream: written at a steady rate while the
    pipeline runs (and while the faults hit), by our idempotent producer,
    whose connections are cut a few times so batches are retried and the
    broker drops the copies it already has. Each acknowledged send goes to
    the history at the end."""

    def __init__(self, bootstrap: str, events, timestamps, history_path: str, rng: random.Random, seconds: float, started: float):
        super().__init__(daemon=True)
        self.timestamps = timestamps
        self.bootstrap, self.events, self.history_path, self.seconds, self.started = bootstrap, events, history_path, seconds, started
        self.cuts_at = sorted(rng.sample(range(len(events) // 10, len(events)), 3)) if len(events) > 100 else []
        self.sent = 0
        self.cuts = 0
        self.samples: list[tuple[float, int]] = []
        self.error: BaseException | None = None
        self.ends: dict = {}  # TopicPartition -> end offset once all is acknowledged

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:  # noqa: BLE001 - reported by the demo
            self.error = error

    def _write(self) -> None:
        from txn import Producer, TopicPartition

        producer = Producer(bootstrap_servers=self.bootstrap, linger_ms=5, batch_size=8192, retry_backoff_ms=20, delivery_timeout_ms=300_000)
        futures = []
        started = time.monotonic()
        per_second = len(self.events) / self.seconds
        for index, (account, value) in enumerate(self.events):
            pause = started + index / per_second - time.monotonic()
            if pause > 0.005:
                time.sleep(pause)
            futures.append((value, producer.send("payments", value.encode(), key=account.encode(), timestamp=self.timestamps[index])))
            self.sent = index + 1
            if index % 200 == 0:
                self.samples.append((time.monotonic() - self.started, self.sent))
            if self.cuts_at and index == self.cuts_at[0]:
                self.cuts_at.pop(0)
                self.cuts += 1
                producer.cut_connections()
        producer.flush()
        self.samples.append((time.monotonic() - self.started, self.sent))
        writer = HistoryWriter(self.history_path, "seeder")
        for value, future in futures:
            metadata = future.result(300)
            tp = TopicPartition("payments", metadata.partition)
            self.ends[tp] = max(self.ends.get(tp, 0), metadata.offset + 1)
            writer.event("ok", "send", [["send", f"payments-{metadata.partition}", value, metadata.offset]])
        writer.close()
        producer.close()


def send_closing_payment(bootstrap: str, payment: tuple[str, str], timestamp: int, history_path: str) -> None:
    from txn import Producer

    account, value = payment
    producer = Producer(bootstrap_servers=bootstrap, delivery_timeout_ms=300_000)
    try:
        metadata = producer.send("payments", value.encode(), key=account.encode(), timestamp=timestamp).result(300)
    finally:
        producer.close()
    writer = HistoryWriter(history_path, "closer")
    writer.event("ok", "send", [["send", f"payments-{metadata.partition}", value, metadata.offset]])
    writer.close()


def read_topic(bootstrap: str, topic: str, history_path: str | None, isolation: str, *, with_keys: bool = False) -> list:
    """Everything in ``topic`` (as ``isolation`` sees it), recorded as a final
    read phase in ``history_path`` if given; the records."""
    from faults.workloads import output_text
    from txn import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, max_poll_records=10_000)
    consumer.assign([TopicPartition(topic, p) for p in range(TOPICS[topic])])
    writer = HistoryWriter(history_path, "final-reader") if history_path else None
    out, last_new = [], time.monotonic()
    while time.monotonic() - last_new < 2.0:
        records = consumer.poll(0.5)
        if records:
            last_new = time.monotonic()
            out.extend(records)
            if writer:
                reads: dict[str, list] = {}
                for record in records:
                    text = output_text(record.key, record.value) if with_keys else record.value.decode()
                    reads.setdefault(f"{topic}-{record.partition}", []).append([record.offset, text])
                writer.event("ok", "poll", [["poll", reads]])
    if writer:
        writer.close()
    consumer.close()
    return out


def aborted_offsets(data_dir: str, topic: str) -> set[tuple[int, int]]:
    """Every (partition, offset) of ``topic`` holding a record of an aborted
    transaction, read from the log files themselves: a transactional batch
    belongs to its producer's transaction until that producer's next COMMIT
    or ABORT marker in the partition."""
    from protocol.records import (
        ControlType,
        decode_batch,
        decode_control_record,
        iter_batches,
    )

    aborted: set[tuple[int, int]] = set()
    for name in os.listdir(data_dir):
        base, _, number = name.rpartition("-")
        if base != topic or not number.isdigit():
            continue
        partition, partition_dir = int(number), os.path.join(data_dir, name)
        open_batches: dict[int, list[tuple[int, int]]] = {}  # producer id -> (first, last) offsets of its open transaction
        for segment in sorted(f for f in os.listdir(partition_dir) if f.endswith(".log")):
            with open(os.path.join(partition_dir, segment), "rb") as file:
                data = file.read()
            try:
                for position, header in iter_batches(data):
                    if header.is_control:
                        marker = decode_control_record(decode_batch(data, position).records[0])
                        ranges = open_batches.pop(header.producer_id, [])
                        if marker.type == ControlType.ABORT:
                            aborted.update((partition, offset) for first, last in ranges for offset in range(first, last + 1))
                    elif header.is_transactional:
                        open_batches.setdefault(header.producer_id, []).append((header.base_offset, header.last_offset))
            except ValueError:
                continue  # a torn tail left by a kill; recovery truncated it in the live log
    return aborted


def count_transactions(data_dir: str, prefix: str) -> tuple[int, int]:
    """(committed, aborted) transactions of the transactional ids starting
    with ``prefix``, from the coordinator's log (``__transaction_state``):
    each finished transaction leaves one CompleteCommit or CompleteAbort
    record there."""
    from coordinator.state import TxnState
    from coordinator.txn_log import decode_key, decode_value
    from protocol.records import decode_batch, iter_batches

    counts = {TxnState.COMPLETE_COMMIT: 0, TxnState.COMPLETE_ABORT: 0}
    for name in os.listdir(data_dir):
        if not name.startswith("__transaction_state-"):
            continue
        partition_dir = os.path.join(data_dir, name)
        for segment in sorted(f for f in os.listdir(partition_dir) if f.endswith(".log")):
            with open(os.path.join(partition_dir, segment), "rb") as file:
                data = file.read()
            try:
                for position, header in iter_batches(data):
                    if header.is_control:
                        continue
                    for record in decode_batch(data, position).records:
                        transactional_id = decode_key(record.key)
                        metadata = decode_value(transactional_id, record.value) if transactional_id.startswith(prefix) else None
                        if metadata is not None and metadata.state in counts:
                            counts[metadata.state] += 1
            except ValueError:
                continue  # a torn tail left by a kill; recovery truncated it in the live log
    return counts[TxnState.COMPLETE_COMMIT], counts[TxnState.COMPLETE_ABORT]


def plan_faults(count: int, spark: bool, rng: random.Random) -> list[str]:
    """Which process each of ``count`` kills hits, seeded: at least one of
    each kind when there are enough, a Spark driver kill per six (each costs
    a JVM start), the rest pipeline instances and the broker in turn."""
    kinds = ["pipeline", "broker"] + (["spark"] if spark else [])
    plan = kinds[:count]
    spark_kills = max(1, count // 6) if spark and count >= 3 else 0
    plan += ["spark"] * (spark_kills - plan.count("spark"))
    while len(plan) < count:
        plan.append(("pipeline", "broker")[len(plan) % 2])
    rng.shuffle(plan)
    return plan[:count]


class Demo:
    """One run; ``run()`` returns the exit status."""

    def __init__(self, *, records: int, seed: int, keep_data: str | None, faults: int, spark: bool, report_dir: str | None, out,
                 spark_master: str | None = None, spark_cluster: bool = False):
        self.records, self.seed, self.keep_data, self.fault_count, self.spark, self.out = records, seed, keep_data, faults, spark, out
        self.spark_master, self.spark_cluster = spark_master, spark_cluster
        self.cluster = None
        self.rng = random.Random(seed)
        self.work = os.path.abspath(keep_data) if keep_data else tempfile.mkdtemp(prefix="onceflow-demo-")
        os.makedirs(self.work, exist_ok=True)
        self.report_dir = os.path.abspath(report_dir or os.path.join(self.work, "report"))
        self.history_dir = os.path.join(self.work, "history")
        self.spark_history_dir = os.path.join(self.work, "spark-history")
        for folder in (self.history_dir, self.spark_history_dir):
            os.makedirs(folder, exist_ok=True)
        self.faults: list[FaultEvent] = []
        self.spark_kills: list[SparkKill] = []
        self.pipelines: list[ClientProcess] = []
        self.driver = None
        self.watchers: dict[str, TopicWatcher] = {}
        self.started = time.monotonic()
        self.wall_started = time.time()  # file times (Spark's commit log) are wall-clock

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- processes ------------------------------------------------------------------------------------

    def start_processes(self) -> None:
        from faults.spark import DriverProcess
        from txn import Admin

        self.broker = BrokerProcess(os.path.join(self.work, "data"), *BROKER_CONFIG, log_path=os.path.join(self.work, "broker.log")).start()
        self.say(f"  broker up on {self.broker.bootstrap}, data in {self.broker.data_dir}")
        with Admin(bootstrap_servers=self.broker.bootstrap) as admin:
            admin.create_topics({name: count for name, count in TOPICS.items() if self.spark or name != "region-minutes"})
        if self.spark and self.spark_cluster:
            from streaming.spark import cluster

            self.say("  starting a Spark standalone cluster for the run (a master and two workers, from the pyspark package)")
            self.cluster = cluster.start(os.path.join(self.work, "spark-cluster"))
            self.spark_master = self.cluster.master_url
            self.say(f"  cluster up at {self.spark_master}")
        if self.spark:
            self.checkpoint = os.path.join(self.work, "spark-checkpoint")
            self.driver = DriverProcess("spark", SPARK_QUERY, self.broker.bootstrap, self.checkpoint, os.path.join(self.work, "spark.log"),
                                        steps_path=os.path.join(self.work, "spark-steps.log"), master=self.spark_master).start()
            self.say(f"  Spark driver starting ({f'a JVM, its executors on {self.spark_master}' if self.spark_master else 'a JVM in local mode'}; its first batch takes a while)")
        for index in range(PIPELINE_INSTANCES):
            # Fixed instance ids: a restarted instance is the same static member
            # (it takes its partitions back at once) and transactional id.
            command = [sys.executable, PIPELINE, "--bootstrap", self.broker.bootstrap, "--state-dir", os.path.join(self.work, f"pipeline-state-{index}"), "--instance-id", str(index)]
            process = ClientProcess(f"pipeline-{index}", command, os.path.join(self.work, f"pipeline-{index}.log"), env={"PYTHONPATH": REPO})
            self.pipelines.append(process.start())
        for topic in ("balances", "region-minutes") if self.spark else ("balances",):
            self.watchers[topic] = TopicWatcher(self.broker.bootstrap, topic, TOPICS[topic], self.elapsed)
            self.watchers[topic].start()

    def spark_batches(self) -> int:
        from faults.spark import committed_batches

        return committed_batches(self.checkpoint) + 1 if self.spark else 0

    def kill(self, kind: str) -> str:
        """SIGKILL and restart; the fault is noted at the kill and cleared
        once the restart is done (the broker listening again)."""
        at = round(self.elapsed(), 2)
        if kind == "pipeline":
            victim = self.pipelines[self.rng.randrange(len(self.pipelines))]
            victim.kill()
            victim.start()
            self.faults.append(FaultEvent(at, "kill-pipeline", victim.name, cleared=round(self.elapsed(), 2), victim=victim.name))
            return f"SIGKILL {victim.name}, restarted"
        if kind == "broker":
            self.broker.kill()
            self.broker.start()
            self.faults.append(FaultEvent(at, "kill-broker", cleared=round(self.elapsed(), 2)))
            return "SIGKILL broker, restarted on the same data"
        self.driver.kill()
        steps = self.driver.steps()
        self.driver.cancel_hold()
        from faults.spark import decided_and_open, describe_step

        batch = self.spark_batches()
        completer, seconds = self.finish_decided()
        self.driver.start()
        kill = SparkKill(at, batch, describe_step(steps), decided_and_open(steps), completer, round(seconds, 2))
        self.spark_kills.append(kill)
        self.faults.append(FaultEvent(at, "kill-spark-driver", f"batch {batch}: {kill.step}", cleared=round(self.elapsed(), 2), victim="spark"))
        return f"SIGKILL Spark driver (JVM and Python workers) at batch {batch}: {kill.step}; completer {completer}; restarted from its checkpoint"

    def finish_decided(self) -> tuple[str, float]:
        """The completer (``onceflow spark finish-decided``), run the moment
        the driver is seen dead: a batch it decided and did not wholly commit
        is committed now, not at the restarted query's first commit."""
        from streaming.spark.options import SinkOptions
        from streaming.spark.sink_driver import finish_decided

        started = time.monotonic()
        try:
            options = SinkOptions.parse({"kafka.bootstrap.servers": self.broker.bootstrap, "transactionalIdPrefix": SPARK_PREFIX})
            summary = completer_summary(finish_decided(options, timeout=COMPLETER_TIMEOUT_SECONDS))
        except Exception as error:  # noqa: BLE001 - the restarted query's first commit finishes the batch anyway
            summary = f"did not finish ({type(error).__name__}: {error}); the restarted query will"
        return summary, time.monotonic() - started

    def decided_batch_held(self, wanted: dict, nothing_left: bool) -> bool:
        """The decided-batch kill's turn: ask the sink to hold after its next
        decision; True once it holds a batch whose transactions are open
        (a batch with no rows is let go and the next one held), or when
        nothing is left to decide (the kill then lands where it may)."""
        if not wanted["armed"]:
            self.driver.request_hold()
            wanted["armed"] = True
        if self.driver.holding():
            if self.output_holds_open_transactions():
                wanted["wanted"] = False
                return True
            self.driver.release_hold(rearm=True)
        if nothing_left:
            self.driver.cancel_hold()
            wanted["wanted"] = False
            return True
        return False

    def output_holds_open_transactions(self) -> bool:
        """Whether the Spark output's last stable offset is below its high
        watermark somewhere: a decided batch's transactions are open."""
        from txn import Admin, TopicPartition

        partitions = {TopicPartition("region-minutes", p): "latest" for p in range(TOPICS["region-minutes"])}
        try:
            with Admin(bootstrap_servers=self.broker.bootstrap, request_timeout_ms=5000) as admin:
                stable = admin.list_offsets(partitions, isolation_level="read_committed")
                ends = admin.list_offsets(partitions, isolation_level="read_uncommitted")
        except Exception:  # noqa: BLE001 - the broker is restarting: ask at the next decision
            return False
        return any(stable[tp].offset < ends[tp].offset for tp in partitions)

    def restart_exited(self) -> None:
        for process in self.pipelines:
            if process.restart_if_exited():
                self.say(f"  t={self.elapsed():5.1f}s  {process.name} exited; restarted")
        if self.driver is not None and self.driver.process.poll() not in (None, 0):
            completer, seconds = self.finish_decided()
            self.driver.start()
            self.say(f"  t={self.elapsed():5.1f}s  the Spark driver exited; completer {completer} in {seconds:.1f} s; restarted")
        if self.broker.process.poll() is not None:
            self.broker.start()
            self.say(f"  t={self.elapsed():5.1f}s  broker exited; restarted")

    def progress_line(self) -> str:
        line = f"  t={self.elapsed():5.1f}s  payments {self.stream.sent:>6} in  balances {self.watchers['balances'].count:>6} out"
        if self.spark:
            line += f"  Spark rows {self.watchers['region-minutes'].count:>4} out ({self.spark_batches()} batches)"
        return line + f"  kills {len(self.faults)}"

    # -- the run ----------------------------------------------------------------------------------------

    def pipeline_caught_up(self) -> bool:
        from txn import Admin

        try:
            with Admin(bootstrap_servers=self.broker.bootstrap, request_timeout_ms=5000) as admin:
                committed = admin.list_group_offsets(PIPELINE_GROUP)
        except Exception:  # noqa: BLE001 - the broker is restarting
            return False
        return bool(self.stream.ends) and all(committed.get(tp) is not None and committed[tp].offset >= end for tp, end in self.stream.ends.items())

    def run(self) -> int:
        self.say(f"onceflow demo: {self.records} payments through the balances pipeline (2 runner instances)"
                 + (" and a Spark query (per-minute totals per region)" if self.spark else "")
                 + f" while they and the broker are killed (seed {self.seed})")
        events = payments(self.records, self.rng)
        timestamps = [event_time(number) for number in range(len(events))]
        if self.spark:
            events.append(closing_payment(events))
            timestamps.append(timestamps[-1] + CLOSING_DELAY_MS)
        expected = expected_outputs(events)
        plan = plan_faults(self.fault_count, self.spark, self.rng)
        try:
            self.start_processes()
            # With Spark the input streams in over most of a minute, so the
            # query (whose first batch comes late) still has work in flight.
            input_seconds = min(60.0 if self.spark else 15.0, max(3.0, self.records / (330 if self.spark else 1500)))
            self.stream = InputStream(self.broker.bootstrap, events[: self.records], timestamps, os.path.join(self.history_dir, "seeder.jsonl"), self.rng, input_seconds, self.started)
            self.stream.start()
            stream_started = self.elapsed()
            others = [kind for kind in plan if kind != "spark"]
            slot = input_seconds / max(1, len(others))
            timed = sorted((stream_started + (i + self.rng.uniform(0.2, 0.8)) * slot, kind) for i, kind in enumerate(others))
            spark_kills = plan.count("spark")
            # A JVM start is the dearest step of the run: the driver is killed
            # while its query works, a few seconds after the query started.
            # The first kill waits for a batch decided and not yet committed
            # (the sink holds there when asked: faults.spark), the others
            # land wherever the query is.
            spark_delays = [self.rng.uniform(3.0, 15.0) for _ in range(spark_kills)]
            decided_kill = {"wanted": spark_kills > 0, "armed": False}
            self.say(f"  streaming {self.records} payments over {input_seconds:.0f} s; kills planned: "
                     + ", ".join(f"{n} {k}" for k, n in Counter(plan).items())
                     + (" (the Spark driver's while its query works)" if spark_kills else ""))
            closing_sent = False
            rows_wanted = None
            deadline = time.monotonic() + 600
            next_progress = 0.0
            spark_ready_at = None
            while time.monotonic() < deadline:
                if self.stream.error is not None:
                    raise RuntimeError(f"writing the input failed: {self.stream.error}") from self.stream.error
                now = self.elapsed()
                if timed and now >= timed[0][0]:
                    _at, kind = timed.pop(0)
                    detail = self.kill(kind)
                    self.say(f"  t={self.elapsed():5.1f}s  {detail}")
                if spark_kills and self.driver.query_started():
                    spark_ready_at = spark_ready_at or now
                    due = now >= spark_ready_at + spark_delays[0]
                    if decided_kill["wanted"] and due:
                        due = self.decided_batch_held(decided_kill, closing_sent and self.watchers["region-minutes"].count >= (rows_wanted or 0))
                    if due:
                        spark_delays.pop(0)
                        spark_kills -= 1
                        detail = self.kill("spark")
                        spark_ready_at = None
                        self.say(f"  t={self.elapsed():5.1f}s  {detail}")
                self.restart_exited()
                if now >= next_progress:
                    next_progress = now + 2.0
                    self.say(self.progress_line())
                if not self.stream.is_alive() and not closing_sent and self.pipeline_caught_up():
                    if self.spark:
                        send_closing_payment(self.broker.bootstrap, events[-1], timestamps[-1], os.path.join(self.history_dir, "closer.jsonl"))
                        rows_wanted = len(spark_rows_expected([(expected[value], timestamp) for (_account, value), timestamp in zip(events, timestamps)]))
                        self.say(f"  t={self.elapsed():5.1f}s  all payments processed; the closing payment moves Spark's watermark past every window ({rows_wanted} rows due)")
                    closing_sent = True
                if closing_sent and not timed and not spark_kills:
                    done = self.watchers["balances"].count >= len(events)
                    if self.spark:
                        done = done and self.watchers["region-minutes"].count >= rows_wanted
                    if done:
                        break
                time.sleep(0.05)
            else:
                self.say(f"  t={self.elapsed():5.1f}s  gave up waiting (10 minutes): checking what is there")
            self.stream.join(120)
            if self.stream.error is not None:
                raise RuntimeError(f"writing the input failed: {self.stream.error}") from self.stream.error
            self.say(f"  the producer's connections were cut {self.stream.cuts} times mid-stream")
            time.sleep(1.0)  # anything extra (a duplicate) gets its chance to show
            for process in self.pipelines:
                process.terminate(timeout=30)
            if self.driver is not None:
                self.driver.terminate(timeout=30)
            for watcher in self.watchers.values():
                watcher.stop.set()
                watcher.join(10)
            balances = read_topic(self.broker.bootstrap, "balances", os.path.join(self.history_dir, "final-reader.jsonl"), "read_committed")
            spark_rows = None
            if self.spark:
                spark_rows = read_topic(self.broker.bootstrap, "region-minutes", os.path.join(self.spark_history_dir, "final-reader.jsonl"), "read_committed", with_keys=True)
        finally:
            for watcher in self.watchers.values():
                watcher.stop.set()
            for process in self.pipelines + ([self.driver] if self.driver else []):
                if process.alive:
                    process.kill()
            if getattr(self, "broker", None) is not None:
                self.broker.terminate()
            if self.cluster is not None:
                from streaming.spark import cluster

                cluster.stop(self.cluster.directory)
        return self.judge(events, expected, balances, spark_rows)

    # -- the check and the report ---------------------------------------------------------------------------

    def judge(self, events, expected, balances, spark_rows) -> int:
        verdict = check(read_histories(self.history_dir), input_topic="payments", output_topic="balances", transform=expected.get)
        anomalies = dict(verdict.anomaly_counts)
        # What read_committed must have hidden, from the log files: a record
        # read at one of these offsets is an aborted record seen (G1a).
        aborted_balances = aborted_offsets(self.broker.data_dir, "balances")
        balances_seen = sum(1 for r in balances if (r.partition, r.offset) in aborted_balances)
        if balances_seen:
            verdict.add("aborted-read", {"topic": "balances", "records": balances_seen})
        committed_txns, aborted_txns = count_transactions(self.broker.data_dir, PIPELINE_GROUP)
        lines = [
            "onceflow demo report",
            f"  payments in                 {self.records}" + (" (+1 closing payment)" if self.spark else ""),
            f"  balances out (committed)    {len(balances)}",
            f"    duplicates                {anomalies.get('copy-duplicate', 0) + anomalies.get('duplicate', 0)}",
            f"    lost                      {anomalies.get('copy-missing', 0)}",
            f"    wrong balances            {anomalies.get('copy-unexpected', 0)}",
            f"    aborted records seen      {balances_seen}  (of {len(aborted_balances)} aborted records in the log)",
            f"    transactions              {committed_txns} committed, {aborted_txns} aborted (pipeline; aborted ones were re-done)",
        ]
        valid = verdict.valid
        spark_verdict = None
        if self.spark:
            from faults.workloads import output_text

            wanted = spark_rows_expected([(r.value.decode(), r.timestamp) for r in balances])
            spark_verdict = check(read_histories(self.spark_history_dir), output_topic="region-minutes", unique_values=False,
                                  expected_outputs=Counter(output_text(key, json.dumps(row)) for key, row in wanted.items()))
            got = Counter(r.key.decode() for r in spark_rows)
            wrong = sum(1 for r in spark_rows if r.key.decode() in wanted and json.loads(r.value) != wanted[r.key.decode()])
            aborted_rows = aborted_offsets(self.broker.data_dir, "region-minutes")
            rows_seen = sum(1 for r in spark_rows if (r.partition, r.offset) in aborted_rows)
            if rows_seen:
                spark_verdict.add("aborted-read", {"topic": "region-minutes", "records": rows_seen})
            spark_committed, spark_aborted = count_transactions(self.broker.data_dir, SPARK_PREFIX)
            lines += [
                f"  Spark rows out (committed)  {len(spark_rows)} of {len(wanted)} (window, region) rows recomputed from the committed balances",
                f"    duplicates                {sum(n - 1 for n in got.values() if n > 1)}",
                f"    lost                      {sum(1 for key in wanted if key not in got)}",
                f"    wrong totals              {wrong + sum(1 for key in got if key not in wanted)}",
                f"    aborted records seen      {rows_seen}  (of {len(aborted_rows)} aborted records in the log)",
                f"    transactions              {spark_committed} committed, {spark_aborted} aborted (the exactly-once sink's)",
                f"    batches                   {self.spark_batches()} committed, driver started {self.driver.starts} times",
            ]
            lines += spark_kill_lines(self.spark_kills, self.watchers["region-minutes"].samples)
            valid = valid and spark_verdict.valid
        kinds = Counter(f.kind for f in self.faults)
        lines += [
            f"  faults injected             {len(self.faults)} ({', '.join(f'{n} {k}' for k, n in kinds.items()) or 'none'}; SIGKILL), producer connections cut {self.stream.cuts} times",
            f"  time                        {self.elapsed():.1f} s",
            f"  data                        {self.work}{'' if self.keep_data else ' (deleted)'}",
            f"  verdict                     {'OK: exactly once' if valid else 'FAILED'}",
        ]
        if not verdict.valid:
            lines.append(verdict.summary())
        if spark_verdict is not None and not spark_verdict.valid:
            lines.append("Spark rows: " + spark_verdict.summary())
        self.availability = self.measure_availability()
        lines += ["  pipeline " + self.availability.lines()[0]] + ["  " + line for line in self.availability.lines()[1:]]
        self.say()
        for line in lines:
            self.say(line)
        self.write_report(lines, verdict, spark_verdict)
        if not self.keep_data:
            shutil.rmtree(self.work, ignore_errors=True)
        return 0 if valid else 1

    def measure_availability(self):
        """The pipeline's availability (``faults.availability``): committed
        output is the balances a read_committed watcher sees (one per
        payment), over the stretch while payments streamed in or a fault was
        in progress (after that nothing more is due)."""
        outputs = outputs_of(self.watchers["balances"].samples)
        inputs = deltas(self.stream.samples)
        end = max([at for at, _count in self.stream.samples] + [f.cleared or f.at for f in self.faults] + [0.0])
        return measure(outputs, self.faults, start=0.0, end=end, inputs=inputs, consumed=[(o.at, o.records) for o in outputs])

    def write_report(self, lines: list[str], verdict, spark_verdict) -> None:
        os.makedirs(self.report_dir, exist_ok=True)
        with open(os.path.join(self.report_dir, "report.txt"), "w") as file:
            file.write("\n".join(lines) + "\n")
        with open(os.path.join(self.report_dir, "verdict.json"), "w") as file:
            json.dump({"balances": verdict.to_json(), "spark": spark_verdict.to_json() if spark_verdict else None,
                       "faults": [f.to_json() for f in self.faults], "seed": self.seed, "records": self.records,
                       "availability": self.availability.to_json()}, file, indent=2, sort_keys=True)
        series = {"payments in": self.stream.samples, "balances out": self.watchers["balances"].samples}
        if self.spark:
            series["Spark rows out"] = self.watchers["region-minutes"].samples
        moments = {}
        if self.spark:
            from faults.spark import batch_commit_times

            moments["Spark batch committed"] = [at - self.wall_started for at in batch_commit_times(self.checkpoint)]
            moments["Spark driver killed (completer ran)"] = [kill.at for kill in self.spark_kills]
        png = os.path.join(self.report_dir, "timeline.png")
        problem = write_series_png(png, series, self.faults, self.elapsed(), f"onceflow demo, seed {self.seed}: {'OK' if verdict.valid and (spark_verdict is None or spark_verdict.valid) else 'FAILED'}",
                                   self.availability, moments)
        if not self.keep_data and self.report_dir.startswith(self.work + os.sep):
            self.say("  report                      not kept (deleted with the data; give a report folder to keep it)")
        else:
            self.say(f"  report                      {os.path.join(self.report_dir, 'report.txt')}" + (f" ({problem})" if problem else f", {png}"))


def run_demo(*, records: int = 20_000, seed: int | None = None, keep_data: str | None = None, faults: int = 6, spark: bool = True, report_dir: str | None = None, out=sys.stdout,
             spark_master: str | None = None, spark_cluster: bool = False) -> int:
    seed = random.randrange(1 << 30) if seed is None else seed
    if spark:
        from faults.spark import java_missing

        problem = java_missing()
        if problem:
            print(f"onceflow demo: {problem}; `onceflow demo --no-spark` runs the pipeline alone.", file=sys.stderr, flush=True)
            return 2
    return Demo(records=records, seed=seed, keep_data=keep_data, faults=faults, spark=spark, report_dir=report_dir, out=out,
                spark_master=spark_master, spark_cluster=spark_cluster).run()


def run_pipeline_demo(*, records: int = 20_000, seed: int | None = None, keep_data: str | None = None, faults: int = 6, out=sys.stdout) -> int:
    """The demo without Spark (``onceflow demo --no-spark``)."""
    return run_demo(records=records, seed=seed, keep_data=keep_data, faults=faults, spark=False, out=out)
