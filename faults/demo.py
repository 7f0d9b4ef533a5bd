"""``onceflow demo``: exactly-once surviving crashes, end to end, in a few minutes.

1. Starts a broker process on a fresh data directory and creates the topics
   ``payments`` and ``balances``.
2. Runs ``examples/payments_pipeline.py`` (per-account running balances on
   the ``streaming`` runner: the balances in a SQLite store changelogged to
   ``payments-pipeline-balances-changelog``, output + store changes +
   offsets in one transaction) as a separate process with its own state
   directory.
3. Streams payment events (key: account) into it at a steady rate with our
   idempotent producer, cutting the producer's connections a few times (so
   batches are retried and the broker drops the copies it already has),
   and meanwhile SIGKILLs and restarts the pipeline and the broker at
   seeded random moments.
4. Reads ``balances`` read_committed, checks it against the input with the
   fault harness's checker (each payment exactly once, with the balance the
   input implies) and prints a report; exits 1 if the check fails.

``--keep-data DIR`` keeps the broker's data: ``onceflow dump-log`` and
``onceflow transactions --bootstrap-server ... list`` (with a broker started
on it) show what happened.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import threading
import time

from faults.checker import check
from faults.history import HistoryWriter, read_histories
from faults.process import REPO, BrokerProcess, ClientProcess

TOPICS = {"payments": 3, "balances": 3}
BROKER_CONFIG = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")
PIPELINE = os.path.join(REPO, "examples", "payments_pipeline.py")


def payments(records: int, rng: random.Random) -> list[tuple[str, str]]:
    """(account, "payment-id:account:amount") events."""
    events = []
    for number in range(records):
        account = f"acct-{rng.randrange(200):03d}"
        amount = rng.choice([-1, 1]) * rng.randrange(1, 5000)
        events.append((account, f"p{number:07d}:{account}:{amount}"))
    return events


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


class OutputWatcher(threading.Thread):
    """Counts committed output records, for the progress line."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from txn import Consumer, TopicPartition

        consumer = Consumer(bootstrap_servers=self.bootstrap, max_poll_records=10_000, request_timeout_ms=5000)
        consumer.assign([TopicPartition("balances", p) for p in range(TOPICS["balances"])])
        while not self.stop.is_set():
            try:
                self.count += len(consumer.poll(0.5))
            except Exception:
                time.sleep(0.5)
        consumer.close()


class InputStream(threading.Thread):
    """The payments as a live stream: written at a steady rate while the
    pipeline runs (and while the faults hit), by our idempotent producer,
    whose connections are cut a few times so batches are retried and the
    broker drops the copies it already has. Each acknowledged send goes to
    the history at the end."""

    def __init__(self, bootstrap: str, events, history_path: str, rng: random.Random, seconds: float):
        super().__init__(daemon=True)
        self.bootstrap, self.events, self.history_path, self.seconds = bootstrap, events, history_path, seconds
        self.cuts_at = sorted(rng.sample(range(len(events) // 10, len(events)), 3)) if len(events) > 100 else []
        self.sent = 0
        self.cuts = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as error:  # noqa: BLE001 - reported by the demo
            self.error = error

    def _write(self) -> None:
        from txn import Producer

        producer = Producer(bootstrap_servers=self.bootstrap, linger_ms=5, batch_size=8192, retry_backoff_ms=20, delivery_timeout_ms=120_000)
        futures = []
        started = time.monotonic()
        per_second = len(self.events) / self.seconds
        for index, (account, value) in enumerate(self.events):
            pause = started + index / per_second - time.monotonic()
            if pause > 0.005:
                time.sleep(pause)
            futures.append((value, producer.send("payments", value.encode(), key=account.encode())))
            self.sent = index + 1
            if self.cuts_at and index == self.cuts_at[0]:
                self.cuts_at.pop(0)
                self.cuts += 1

                def cut():
                    for client in producer._async.cluster._clients.values():
                        if client._writer is not None:
                            client._writer.transport.abort()

                producer._thread.loop.call_soon_threadsafe(cut)
        producer.flush()
        writer = HistoryWriter(self.history_path, "seeder")
        for value, future in futures:
            metadata = future.result(120)
            writer.event("ok", "send", [["send", f"payments-{metadata.partition}", value, metadata.offset]])
        writer.close()
        producer.close()


def _final_read(bootstrap: str, history_path: str, isolation: str) -> int:
    from txn import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, max_poll_records=10_000)
    consumer.assign([TopicPartition("balances", p) for p in range(TOPICS["balances"])])
    writer = HistoryWriter(history_path, "final-reader") if history_path else None
    count, last_new = 0, time.monotonic()
    while time.monotonic() - last_new < 2.0:
        records = consumer.poll(0.5)
        if records:
            last_new = time.monotonic()
            count += len(records)
            if writer:
                reads: dict[str, list] = {}
                for record in records:
                    reads.setdefault(f"balances-{record.partition}", []).append([record.offset, record.value.decode()])
                writer.event("ok", "poll", [["poll", reads]])
    if writer:
        writer.close()
    consumer.close()
    return count


def count_transactions(data_dir: str) -> tuple[int, int]:
    """(committed, aborted) transactions of the pipeline, counted from the
    COMMIT/ABORT markers in ``__consumer_offsets``: every pipeline transaction
    commits its input positions, so it leaves exactly one marker there."""
    from protocol.records import ControlType, decode_batch, decode_control_record, iter_batches

    counts = {ControlType.COMMIT: 0, ControlType.ABORT: 0}
    for name in os.listdir(data_dir):
        if not name.startswith("__consumer_offsets-"):
            continue
        partition_dir = os.path.join(data_dir, name)
        for segment in sorted(f for f in os.listdir(partition_dir) if f.endswith(".log")):
            with open(os.path.join(partition_dir, segment), "rb") as file:
                data = file.read()
            try:
                for position, header in iter_batches(data):
                    if header.is_control:
                        marker = decode_control_record(decode_batch(data, position).records[0])
                        counts[marker.type] = counts.get(marker.type, 0) + 1
            except ValueError:
                continue  # a torn tail left by a kill; recovery truncated it in the live log
    return counts[ControlType.COMMIT], counts[ControlType.ABORT]


def run_pipeline_demo(*, records: int = 20_000, seed: int | None = None, keep_data: str | None = None, faults: int = 6, out=sys.stdout) -> int:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    work = os.path.abspath(keep_data) if keep_data else tempfile.mkdtemp(prefix="onceflow-demo-")
    os.makedirs(work, exist_ok=True)
    history_dir = os.path.join(work, "history")
    os.makedirs(history_dir, exist_ok=True)
    started = time.monotonic()
    say(f"onceflow demo: {records} payments through an exactly-once pipeline while it and the broker are killed (seed {seed})")
    broker = BrokerProcess(os.path.join(work, "data"), *BROKER_CONFIG, log_path=os.path.join(work, "broker.log")).start()
    say(f"  broker up on {broker.bootstrap}, data in {broker.data_dir}")
    pipeline = None
    watcher = None
    fault_log: list[str] = []
    try:
        from txn import Admin

        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topics({name: count for name, count in TOPICS.items()})
        events = payments(records, rng)
        expected = expected_outputs(events)
        # The input streams in over a few seconds; the faults fall inside that
        # window, one in each of `faults` equal slots at a seeded moment.
        input_seconds = min(15.0, max(3.0, records / 1500))
        stream = InputStream(broker.bootstrap, events, os.path.join(history_dir, "seeder.jsonl"), rng, input_seconds)
        pipeline = ClientProcess(
            "pipeline", [sys.executable, PIPELINE, "--bootstrap", broker.bootstrap, "--state-dir", os.path.join(work, "pipeline-state")],
            os.path.join(work, "pipeline.log"), env={"PYTHONPATH": REPO},  # this checkout's packages, whatever is installed
        ).start()
        watcher = OutputWatcher(broker.bootstrap)
        watcher.start()
        stream.start()
        stream_started = time.monotonic()
        slot = input_seconds / max(1, faults)
        fault_times = [stream_started + (i + rng.uniform(0.2, 0.8)) * slot for i in range(faults)]
        say(f"  streaming {records} payments over {input_seconds:.0f} s; {faults} kills at seeded moments meanwhile")
        deadline = time.monotonic() + 300
        next_progress = time.monotonic()
        while (watcher.count < records or fault_times or stream.is_alive()) and time.monotonic() < deadline:
            if stream.error is not None:
                raise RuntimeError(f"writing the input failed: {stream.error}") from stream.error
            if fault_times and time.monotonic() >= fault_times[0]:
                fault_times.pop(0)
                progress = f"{stream.sent:>6} in {watcher.count:>6} out"
                if rng.random() < 0.5:
                    pipeline.kill()
                    pipeline.start()
                    fault_log.append("pipeline")
                    say(f"  t={time.monotonic() - started:5.1f}s  {progress}  SIGKILL pipeline, restarted")
                else:
                    broker.kill()
                    broker.start()
                    fault_log.append("broker")
                    say(f"  t={time.monotonic() - started:5.1f}s  {progress}  SIGKILL broker, restarted on the same data")
            if pipeline.restart_if_exited():
                say(f"  t={time.monotonic() - started:5.1f}s  pipeline exited; restarted")
            if time.monotonic() >= next_progress:
                next_progress += 2
                say(f"  t={time.monotonic() - started:5.1f}s  {stream.sent:>6} in {watcher.count:>6} out (balances committed)")
            time.sleep(0.05)
        stream.join(120)
        if stream.error is not None:
            raise RuntimeError(f"writing the input failed: {stream.error}") from stream.error
        say(f"  the producer's connections were cut {stream.cuts} times mid-stream")
        time.sleep(1.0)
        pipeline.terminate(timeout=30)
        watcher.stop.set()
        watcher.join(10)
        output_count = _final_read(broker.bootstrap, os.path.join(history_dir, "final-reader.jsonl"), "read_committed")
        in_log = _final_read(broker.bootstrap, None, "read_uncommitted")
    finally:
        if watcher is not None:
            watcher.stop.set()
        if pipeline is not None and pipeline.alive:
            pipeline.kill()
        broker.terminate()
    verdict = check(read_histories(history_dir), input_topic="payments", output_topic="balances", transform=expected.get)
    committed_txns, aborted_txns = count_transactions(broker.data_dir)
    elapsed = time.monotonic() - started
    anomalies = verdict.anomaly_counts
    say()
    say("onceflow demo report")
    say(f"  payments in                 {records}")
    say(f"  balances out (committed)    {output_count}")
    say(f"  duplicates                  {anomalies.get('copy-duplicate', 0) + anomalies.get('duplicate', 0)}")
    say(f"  lost                        {anomalies.get('copy-missing', 0)}")
    say(f"  wrong balances              {anomalies.get('copy-unexpected', 0)}")
    say(f"  aborted records seen        {anomalies.get('aborted-read', 0)}  ({in_log - output_count} aborted records in the log, filtered by read_committed)")
    say(f"  transactions                {committed_txns} committed, {aborted_txns} aborted (markers in the log; aborted ones were re-done)")
    say(f"  faults injected             {len(fault_log)} ({fault_log.count('pipeline')} pipeline kills, {fault_log.count('broker')} broker kills)")
    say(f"  time                        {elapsed:.1f} s")
    say(f"  data                        {work}{'' if keep_data else ' (deleted)'}")
    say(f"  verdict                     {'OK: exactly once' if verdict.valid else 'FAILED'}")
    if not verdict.valid:
        say(verdict.summary())
    if not keep_data:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if verdict.valid else 1
