"""`onceflow bench --runner`: onceflow's streaming runner beside Quix Streams 3,
both exactly once, the same apps on the same broker (ours) in one run.

    onceflow bench --runner [--runner-records 30000] [--runner-partitions 2] [--runner-only map] [--runner-latency-rate 500]
                            [--restore-keys 1000000] [--json FILE]
    python -m benchmarks.runner_bench ...        (the same)

Scenarios (apps in ``benchmarks.runner_apps``, each instance its own process
and state directory; input and output of ``--runner-partitions`` partitions (2),
keyed by 1,000 accounts; ``--runner-only`` runs the scenarios whose name contains it):

- throughput: a prepared input of ``--runner-records`` payments through the
  stateless map and through the stateful balances app, with 1 and with 2
  instances; the rate is counted by a read_committed reader of the output,
  from the instances' start (``records/s``, start-up included) and from the
  first output record (``steady records/s``).
- join: the same, through a stream-table join of the payments with a
  table of the 1,000 accounts (written before them): onceflow's
  ``stream.join(app.table(...))`` beside Quix's ``join_asof``.
- latency: the map app, one instance, fed at ``--runner-latency-rate`` records/s
  for ``--runner-latency-seconds``; each output record's arrival at a
  read_committed reader minus its payment's send time, p50 and p99 (both
  bounded below by the commit interval: output is visible only once its
  transaction commits).
- restore (onceflow only): a balances store of ``--restore-keys`` keys in
  its changelog; the time from ``App.run()`` to its first processed record
  with an empty state directory (the store rebuilt from the changelog) and
  again with the SQLite file current (nothing to read).

Both frameworks commit every ``--commit-interval-ms`` (100 ms, our
default; Quix's default is 5 s, which would trade latency for throughput).
The table puts onceflow's figure over Quix's (> 1 favours onceflow; for
latencies the ratio is Quix's over ours).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import attrs

from benchmarks.suite import CONSUMER_SETTINGS, REPO, OnceflowTarget, percentile

FRAMEWORKS = ("onceflow", "quix")
ACCOUNTS = 1000


@attrs.frozen
class RunnerSettings:
    records: int = 30_000
    partitions: int = 2
    only: str | None = None  # run only the scenarios whose name contains this
    latency_rate: int = 500
    latency_seconds: float = 5.0
    restore_keys: int = 1_000_000
    commit_interval_ms: int = 100


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, count, 1) for name, count in partitions.items()]).values():
        future.result(30)


def payment(number: int) -> tuple[bytes, bytes]:
    account = f"acct-{number % ACCOUNTS}"
    value = {"id": number, "account": account, "amount": number % 97 - 40, "sent": time.time()}
    return account.encode(), json.dumps(value, separators=(",", ":")).encode()


def fill_payments(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    for number in range(count):
        key, value = payment(number)
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("input left unacknowledged")


def fill_accounts(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for number in range(ACCOUNTS):
        producer.produce(topic, json.dumps({"region": ("emea", "amer", "apac")[number % 3]}).encode(), key=f"acct-{number}".encode())
    if producer.flush(60) != 0:
        raise RuntimeError("accounts left unacknowledged")
    time.sleep(0.01)  # the payments' timestamps come after every account's


class Instances:
    """App processes of one framework and app, each with its own state dir."""

    def __init__(self, framework: str, app: str, bootstrap: str, source: str, sink: str, work: str, settings: RunnerSettings, table: str | None = None):
        self.group = f"bench-{framework}-{app}-{uuid.uuid4().hex[:6]}"
        self.command = [sys.executable, "-m", "benchmarks.runner_apps", framework, app, "--bootstrap", bootstrap, "--input", source,
                        "--output", sink, "--group", self.group, "--commit-interval-ms", str(settings.commit_interval_ms)] + (["--table", table] if table else [])
        self.work = work
        self.processes: list[subprocess.Popen] = []
        self.log_path = os.path.join(work, f"{self.group}.log")

    def start(self, count: int) -> None:
        with open(self.log_path, "ab") as log:
            for index in range(count):
                state_dir = os.path.join(self.work, f"{self.group}-state-{index}")
                self.processes.append(subprocess.Popen(self.command + ["--state-dir", state_dir], cwd=REPO, stdout=log, stderr=log))

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

    def failure(self) -> str:
        dead = [p.returncode for p in self.processes if p.poll() not in (None, 0)]
        if not dead:
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            return f"an instance exited with {dead[0]}: {log.read()[-1500:]}"


def output_reader(bootstrap: str, topic: str, partitions: int):
    from confluent_kafka import Consumer, TopicPartition

    # fetch.wait.max.ms: the reader must not add its own 500 ms fetch wait to the latencies.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 10, **CONSUMER_SETTINGS})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def throughput(bootstrap: str, framework: str, app: str, instances: int, settings: RunnerSettings, work: str) -> dict[str, float]:
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    table = f"accounts-{uuid.uuid4().hex[:8]}" if app == "join" else None
    create_topics(bootstrap, {source: settings.partitions, sink: settings.partitions, **({table: settings.partitions} if table else {})})
    if table:
        fill_accounts(bootstrap, table)  # before the payments: every payment's account is in the table at its timestamp
    fill_payments(bootstrap, source, settings.records)
    reader = output_reader(bootstrap, sink, settings.partitions)
    apps = Instances(framework, app, bootstrap, source, sink, work, settings, table)
    started = time.perf_counter()
    apps.start(instances)
    seen, first, last = 0, None, None
    try:
        while seen < settings.records and time.perf_counter() - started < 600:
            batch = [m for m in reader.consume(10_000, 0.05) if m.error() is None]
            if batch:
                last = time.perf_counter()
                first = first if first is not None else last
                seen += len(batch)
            elif apps.failure():
                raise RuntimeError(apps.failure())
    finally:
        apps.stop()
        reader.close()
    if seen < settings.records:
        raise RuntimeError(f"{framework} {app} delivered {seen} of {settings.records} records")
    if seen > settings.records:
        raise RuntimeError(f"{framework} {app} delivered {seen} records for {settings.records} inputs (duplicates)")
    return {"records/s": seen / (last - started), "steady records/s": seen / (last - first) if last > first else seen / (last - started)}


def latency(bootstrap: str, framework: str, settings: RunnerSettings, work: str) -> dict[str, float]:
    from confluent_kafka import Producer

    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {source: settings.partitions, sink: settings.partitions})
    reader = output_reader(bootstrap, sink, settings.partitions)
    apps = Instances(framework, "map", bootstrap, source, sink, work, settings)
    apps.start(1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    latencies: list[float] = []
    try:
        # Warm up: until the app answers at all (start-up is not latency).
        deadline = time.monotonic() + 120
        while True:
            key, value = payment(-1)
            producer.produce(source, value, key=key)
            producer.flush(10)
            if any(m.error() is None for m in reader.consume(100, 1.0)):
                break
            if time.monotonic() > deadline or apps.failure():
                raise RuntimeError(apps.failure() or f"{framework} answered nothing in 120 s")
        time.sleep(1.0)
        while reader.consume(1000, 0.5):
            pass  # the warm-up's stragglers
        count = int(settings.latency_rate * settings.latency_seconds)
        done = threading.Event()

        def read() -> None:
            while len(latencies) < count and not done.is_set():
                for message in reader.consume(1000, 0.1):
                    if message.error() is None:
                        latencies.append(time.time() - json.loads(message.value())["sent"])

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        interval = 1.0 / settings.latency_rate
        start = time.perf_counter()
        for number in range(count):
            pause = start + number * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            key, value = payment(number)
            producer.produce(source, value, key=key)
            producer.poll(0)
        producer.flush(30)
        thread.join(60)
        done.set()
    finally:
        apps.stop()
        reader.close()
    if len(latencies) < int(settings.latency_rate * settings.latency_seconds):
        raise RuntimeError(f"{framework}: read {len(latencies)} of the timed records")
    return {"p50": percentile(latencies, 50) * 1000, "p99": percentile(latencies, 99) * 1000}


def restore(bootstrap: str, settings: RunnerSettings, work: str, say) -> dict[str, float]:
    """onceflow's balances store of ``restore_keys`` keys: time to the first
    processed record, cold (empty state dir) and warm (SQLite current)."""
    from confluent_kafka import Producer

    import streaming
    from streaming.store import encode_key

    application = f"restore-{uuid.uuid4().hex[:6]}"
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    changelog = f"{application}-balances-changelog"
    create_topics(bootstrap, {source: 1, sink: 1, changelog: 1})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 20, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    began = time.perf_counter()
    for number in range(settings.restore_keys):
        while True:
            try:
                producer.produce(changelog, str(number % 1000).encode(), key=encode_key(f"acct-{number}"), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(300) != 0:
        raise RuntimeError("changelog left unacknowledged")
    say(f"  [restore] {settings.restore_keys:,} changelog records written in {time.perf_counter() - began:.1f} s")

    def first_record_after_start(state_dir: str, account: str) -> tuple[float, int]:
        key, value = account.encode(), json.dumps({"id": 0, "account": account, "amount": 1, "sent": time.time()}).encode()
        producer.produce(source, value, key=key, partition=0)
        producer.flush(30)
        app = streaming.App(bootstrap_servers=bootstrap, application_id=application, state_dir=state_dir, instance_id="restore")

        @app.processor(source=source, sink=sink, stores=["balances"], key_format="str", value_format="json")
        def running_balance(record, ctx):
            store = ctx.store("balances")
            balance = store.get(record.key, 0) + record.value["amount"]
            store.put(record.key, balance)
            ctx.emit(record.key, {"account": record.key, "balance": balance})

        failure: list = []
        runner = threading.Thread(target=lambda: _run_capturing(app, failure), daemon=True)
        start = time.perf_counter()
        runner.start()
        while app.metrics.get("records_in", 0) < 1:
            if failure or not runner.is_alive():
                raise RuntimeError(f"the app stopped: {failure}")
            if time.perf_counter() - start > 900:
                raise TimeoutError("no record processed in 900 s")
            time.sleep(0.01)
        elapsed = time.perf_counter() - start
        restored = app.metrics.get("restored_records", 0)
        app.stop()
        runner.join(120)
        return elapsed, restored

    state_dir = os.path.join(work, application)
    cold, restored = first_record_after_start(state_dir, "acct-1")
    if restored < settings.restore_keys:
        raise RuntimeError(f"restored {restored} records, expected at least {settings.restore_keys}")
    warm, rerestored = first_record_after_start(state_dir, "acct-2")
    say(f"  [restore] cold {cold:.1f} s ({restored:,} records from the changelog), warm {warm:.2f} s ({rerestored} records read)")
    return {"cold s": cold, "cold keys/s": restored / cold, "warm s": warm}


def missing_peer() -> str | None:
    """Why Quix Streams cannot run here (it is in the ``bench`` extra), or None."""
    if importlib.util.find_spec("quixstreams") is None:
        return "Quix Streams is not installed, so its runs are left out (pip install -e '.[bench]' installs it)"
    return None


def _run_capturing(app, failure: list) -> None:
    try:
        app.run()
    except BaseException as error:  # noqa: BLE001 - reported by the caller
        failure.append(f"{type(error).__name__}: {error}")


def run(settings: RunnerSettings, say, *, work_dir: str | None = None, restore_too: bool = True) -> list[dict]:
    """All scenarios on one broker; returns the table's rows."""
    missing = missing_peer()
    frameworks = FRAMEWORKS if missing is None else ("onceflow",)
    if missing:
        say(missing)
    work = tempfile.mkdtemp(prefix="onceflow-runner-bench-", dir=work_dir)
    results: dict[tuple[str, str], dict[str, float]] = {}
    try:
        with OnceflowTarget(work) as broker:
            for app in ("map", "balances", "join"):
                for instances in (1, 2):
                    for framework in frameworks:
                        name = f"{app}, {instances} instance{'s' if instances > 1 else ''}"
                        if not wanted(settings, name):
                            continue
                        began = time.perf_counter()
                        try:
                            results[(name, framework)] = throughput(broker.bootstrap, framework, app, instances, settings, work)
                        except Exception as error:  # noqa: BLE001 - reported in the table
                            results[(name, framework)] = {"error": f"{type(error).__name__}: {error}"}
                        say(f"  [{framework}] {name}: {_head(results[(name, framework)])} ({time.perf_counter() - began:.1f} s)")
            for framework in frameworks:
                name = f"latency at {settings.latency_rate}/s (map)"
                if not wanted(settings, name):
                    continue
                try:
                    results[(name, framework)] = latency(broker.bootstrap, framework, settings, work)
                except Exception as error:  # noqa: BLE001
                    results[(name, framework)] = {"error": f"{type(error).__name__}: {error}"}
                say(f"  [{framework}] {name}: {_head(results[(name, framework)])}")
            name = f"restore {settings.restore_keys:,} keys"
            if restore_too and wanted(settings, name):
                try:
                    results[(name, "onceflow")] = restore(broker.bootstrap, settings, work, say)
                except Exception as error:  # noqa: BLE001
                    results[(name, "onceflow")] = {"error": f"{type(error).__name__}: {error}"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return table(results, say)


def wanted(settings: RunnerSettings, scenario: str) -> bool:
    return settings.only is None or settings.only in scenario


def _head(metrics: dict) -> str:
    if "error" in metrics:
        return f"FAILED {metrics['error'][:300]}"
    key, value = next(iter(metrics.items()))
    return f"{value:,.1f} {key}"


def table(results: dict, say) -> list[dict]:
    rows = []
    for name in dict.fromkeys(name for name, _framework in results):
        ours, theirs = results.get((name, "onceflow"), {}), results.get((name, "quix"), {})
        for metric in dict.fromkeys(list(ours) + list(theirs)):
            if metric == "error":
                continue
            mine, peer = ours.get(metric), theirs.get(metric)
            lower_is_better = metric in ("p50", "p99") or metric.endswith(" s")
            ratio = None
            if mine and peer:
                ratio = peer / mine if lower_is_better else mine / peer
            rows.append({"scenario": name, "metric": metric, "onceflow": mine, "quix": peer, "ours_over_quix": ratio})
        for framework, metrics in (("onceflow", ours), ("quix", theirs)):
            if "error" in metrics:
                rows.append({"scenario": name, "metric": f"{framework} failed", "error": metrics["error"]})
    say("")
    say(f"{'scenario: metric':<48}{'onceflow':>14}{'Quix 3':>14}{'ours/Quix':>11}")
    for row in rows:
        if "error" in row:
            say(f"{row['scenario'] + ': ' + row['metric']:<48}  {row['error'][:200]}")
            continue
        unit = " ms" if row["metric"] in ("p50", "p99") else ""
        mine = "n/a" if row["onceflow"] is None else f"{row['onceflow']:,.1f}{unit}"
        peer = "n/a" if row["quix"] is None else f"{row['quix']:,.1f}{unit}"
        ratio = "" if row["ours_over_quix"] is None else f"{row['ours_over_quix']:.2f}"
        say(f"{row['scenario'] + ': ' + row['metric']:<48}{mine:>14}{peer:>14}{ratio:>11}")
    say("(ratio > 1 favours onceflow; for latencies and times it is Quix's over ours)")
    return rows


def settings_from(args) -> RunnerSettings:
    return RunnerSettings(records=args.runner_records, partitions=args.runner_partitions, only=args.runner_only, latency_rate=args.runner_latency_rate, latency_seconds=args.runner_latency_seconds,
                          restore_keys=args.restore_keys, commit_interval_ms=args.commit_interval_ms)


def run_from_args(args) -> int:
    """``onceflow bench --runner`` (``onceflow.commands.bench`` owns the options)."""
    def say(line: str) -> None:
        print(line, flush=True)

    settings = settings_from(args)
    rows = run(settings, say, work_dir=args.work_dir, restore_too=settings.restore_keys > 0)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"settings": attrs.asdict(settings), "rows": rows}, file, indent=2)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    from onceflow.cli import main

    sys.exit(main(["bench", "--runner", *sys.argv[1:]]))
