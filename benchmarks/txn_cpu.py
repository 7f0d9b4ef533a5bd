"""The broker's CPU per transaction and per transactional megabyte, measured
from its own process (issue 32: what the broker spends per request once the
fsyncs are paid once per transaction).

    python -m benchmarks.txn_cpu [--baseline DIR] [--rounds 3] [--transactions 1000]
                                 [--rows 1000000] [--config KEY=VALUE ...] [--profile DIR] [--only PARTS]

Each round starts a fresh broker (``faults.process.BrokerProcess``) from
this checkout, and from ``DIR`` too when ``--baseline`` is given (a copy of
the code before a change; the two alternate first from round to round, so
drift on a shared machine falls on both), and runs three workloads against
it, reading the broker's user plus system CPU from ``/proc/<pid>/stat``
before and after each (CPU time moves far less than rates on a loaded
machine):

- librdkafka (confluent-kafka) running ``--transactions`` transactions of
  one record each: begin, produce, flush, commit;
- our own ``txn.Producer`` doing the same;
- our producer sending ``--rows`` rows of 100 bytes as columns
  (``send_columns``, 1 MiB batches, as the Spark sink's tasks do) in
  transactions of 100,000 rows.

It prints broker CPU ms per transaction and CPU s per MB of values, per
round and as medians. ``--profile DIR`` records each workload with
``py-spy record --pid`` (raw collapsed stacks, one file per workload and
checkout) while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator

from benchmarks.suite import REPO, new_topic, process_cpu_seconds
from faults.process import BrokerProcess

RECORD_BYTES = 100
ROWS_PER_CALL = 10_000
ROWS_PER_TRANSACTION = 100_000


def librdkafka_transactions(bootstrap: str, topic: str, count: int) -> Iterator[None]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"cpu-{uuid.uuid4().hex[:8]}", "linger.ms": 1})
    producer.init_transactions(30)
    yield
    for _ in range(count):
        producer.begin_transaction()
        producer.produce(topic, b"t" * RECORD_BYTES, partition=0)
        producer.flush(30)
        producer.commit_transaction(30)


def our_transactions(bootstrap: str, topic: str, count: int) -> Iterator[None]:
    from txn import Producer

    with Producer(bootstrap, transactional_id=f"cpu-{uuid.uuid4().hex[:8]}") as producer:
        producer.init_transactions()
        yield
        for _ in range(count):
            producer.begin_transaction()
            producer.send(topic, b"t" * RECORD_BYTES, partition=0)
            producer.commit_transaction()


def our_large_batches(bootstrap: str, topic: str, rows: int) -> Iterator[None]:
    import pyarrow as pa

    from txn import Producer

    values = pa.array([b"v" * RECORD_BYTES] * ROWS_PER_CALL, pa.binary())
    with Producer(bootstrap, transactional_id=f"cpu-{uuid.uuid4().hex[:8]}") as producer:
        producer.init_transactions()
        yield
        sent = 0
        while sent < rows:
            producer.begin_transaction()
            for _ in range(ROWS_PER_TRANSACTION // ROWS_PER_CALL):
                producer.send_columns(topic, values, partition=0)
                sent += ROWS_PER_CALL
            producer.commit_transaction()


@contextlib.contextmanager
def profiled(pid: int, path: str | None):
    """``py-spy record`` attached to ``pid`` while the block runs (nothing
    when ``path`` is None); SIGINT makes it write its stacks."""
    if path is None:
        yield
        return
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    recorder = subprocess.Popen([py_spy, "record", "--pid", str(pid), "-f", "raw", "-o", path, "-r", "1000", "--nonblocking", "--gil"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)


def measure(pid: int, workload, profile: str | None) -> float:
    """Broker CPU seconds spent while ``workload`` (a generator: setup before
    its first ``yield``, the measured part after) runs."""
    steps = iter(workload)
    next(steps)
    with profiled(pid, profile):
        before = process_cpu_seconds(pid)
        for _ in steps:
            pass
        return process_cpu_seconds(pid) - before


def one_round(checkout: str, work: str, config: list[str], args, profile_dir: str | None, label: str) -> dict[str, float]:
    data = os.path.join(work, f"{label}-{uuid.uuid4().hex[:6]}")
    broker = BrokerProcess(data, "group.initial.rebalance.delay.ms=0", *config, checkout=checkout, log_path=data + ".log").start()
    pid = broker.process.pid
    results = {}
    try:
        workloads = {
            "librdkafka, 1-record txns: CPU ms/txn": (lambda topic: librdkafka_transactions(broker.bootstrap, topic, args.transactions), 1000 / args.transactions),
            "txn, 1-record txns: CPU ms/txn": (lambda topic: our_transactions(broker.bootstrap, topic, args.transactions), 1000 / args.transactions),
            "txn, 1 MiB batches: CPU s/MB": (lambda topic: our_large_batches(broker.bootstrap, topic, args.rows), 1e6 / (args.rows * RECORD_BYTES)),
        }
        for name, (workload, scale) in workloads.items():
            if args.only and not any(word in name for word in args.only.split(";")):
                continue
            profile = os.path.join(profile_dir, f"{label}-{name.split(':')[0].replace(', ', '-').replace(' ', '_')}.txt") if profile_dir else None
            results[name] = measure(pid, workload(new_topic(broker.bootstrap)), profile) * scale
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, run in alternation with this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transactions", type=int, default=1000, help="one-record transactions per client and round")
    parser.add_argument("--rows", type=int, default=1_000_000, help="100-byte rows of the large-batch workload")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a broker setting (repeatable)")
    parser.add_argument("--profile", metavar="DIR", help="py-spy each workload, raw stacks here")
    parser.add_argument("--only", help="semicolon-separated parts of workload names (librdkafka; txn, 1-record; 1 MiB)")
    args = parser.parse_args(argv)
    checkouts = {"this": REPO} | ({"baseline": os.path.abspath(args.baseline)} if args.baseline else {})
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    work = tempfile.mkdtemp(prefix="onceflow-txn-cpu-")
    results: dict[str, dict[str, list[float]]] = {}  # checkout -> metric -> per round
    try:
        for round_number in range(1, args.rounds + 1):
            order = list(checkouts) if round_number % 2 else list(reversed(checkouts))
            for label in order:
                measured = one_round(checkouts[label], work, args.config, args, args.profile, f"{label}{round_number}")
                for name, value in measured.items():
                    results.setdefault(label, {}).setdefault(name, []).append(value)
                print(f"round {round_number} {label:<8} " + "; ".join(f"{name} {value:.4g}" for name, value in measured.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds")
    metrics = list(results["this"])
    print("| metric | " + " | ".join(checkouts) + (" | this / baseline |" if args.baseline else " |"))
    print("| --- " * (len(checkouts) + 1 + bool(args.baseline)) + "|")
    for name in metrics:
        cells = [statistics.median(results[label][name]) for label in checkouts]
        ratio = f" {cells[0] / cells[1]:.2f} |" if args.baseline else ""
        print(f"| {name} | " + " | ".join(f"{cell:.4g}" for cell in cells) + " |" + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
