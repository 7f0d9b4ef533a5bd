"""Transactional produce: commit latency and records/s for transactions of 1,
10 and 100 records (confluent-kafka, default durability), beside the plain
(non-transactional, acks=all) produce rate of the same run.

    .venv/bin/python -m benchmarks.bench_transactions [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from broker.broker import EmbeddedBroker

VALUE = b"x" * 100


def plain_rate(bootstrap: str, topic: str, seconds: float) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(500):
            try:
                producer.produce(topic, value=VALUE)
                count += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    return count / (time.perf_counter() - start)


def transactional(bootstrap: str, topic: str, per_txn: int, seconds: float) -> tuple[float, float, float, int]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{per_txn}", "linger.ms": 0})
    producer.init_transactions(30)
    latencies = []
    records = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        producer.begin_transaction()
        for _ in range(per_txn):
            producer.produce(topic, value=VALUE)
        began_commit = time.perf_counter()
        producer.commit_transaction(30)
        latencies.append(time.perf_counter() - began_commit)
        records += per_txn
    elapsed = time.perf_counter() - start
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return records / elapsed, statistics.median(latencies) * 1000, p99 * 1000, len(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    directory = tempfile.mkdtemp(prefix="onceflow-bench-txn-", dir=os.environ.get("BENCH_DIR"))
    rows = []
    try:
        with EmbeddedBroker(directory) as broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("bench-txn", 1, 1)])["bench-txn"].result(10)
            plain = plain_rate(broker.bootstrap, "bench-txn", args.seconds)
            for per_txn in (1, 10, 100):
                rate, p50, p99, count = transactional(broker.bootstrap, "bench-txn", per_txn, args.seconds)
                rows.append({"records_per_txn": per_txn, "transactions": count, "records_per_s": round(rate), "commit_p50_ms": round(p50, 2), "commit_p99_ms": round(p99, 2), "plain_records_per_s": round(plain), "txn_over_plain": round(rate / plain, 4)})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"plain idempotent produce, acks=all: {round(plain)} records/s (100-byte values)")
    print(f"{'records/txn':>12}{'txns':>8}{'records/s':>12}{'commit p50 ms':>15}{'commit p99 ms':>15}{'txn/plain':>11}")
    for row in rows:
        print(f"{row['records_per_txn']:>12}{row['transactions']:>8}{row['records_per_s']:>12}{row['commit_p50_ms']:>15}{row['commit_p99_ms']:>15}{row['txn_over_plain']:>11}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
