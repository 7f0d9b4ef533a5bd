"""The exactly-once copier end to end: one copier, 100,000 records of 100
bytes, 750 records per transaction, beside the plain produce rate of the
same run.

    .venv/bin/python -m benchmarks.bench_copier [--records 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from broker.broker import EmbeddedBroker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    directory = tempfile.mkdtemp(prefix="onceflow-bench-copier-", dir=os.environ.get("BENCH_DIR"))
    try:
        with EmbeddedBroker(directory, group_initial_rebalance_delay_ms=0) as broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            for topic, partitions in (("in", 2), ("out", 3)):
                admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(10)
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True})
            value = b"v" * 100
            start = time.perf_counter()
            for _ in range(args.records):
                while True:
                    try:
                        producer.produce("in", value=value)
                        break
                    except BufferError:
                        producer.poll(0.01)
            producer.flush(60)
            produce_rate = args.records / (time.perf_counter() - start)

            copier = subprocess.Popen(
                [sys.executable, os.path.join(REPO, "examples", "transactional_copier.py"), "--bootstrap", broker.bootstrap, "--input", "in", "--output", "out",
                 "--group", "bench", "--transactional-id", "bench-copier", "--records-per-txn", "750"],
                stderr=subprocess.DEVNULL,
            )
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"v-{uuid.uuid4()}", "isolation.level": "read_committed"})
            consumer.assign([TopicPartition("out", p, 0) for p in range(3)])
            start = time.perf_counter()
            seen = 0
            while seen < args.records and time.perf_counter() - start < 600:
                seen += sum(1 for m in consumer.consume(10_000, 0.2) if m.error() is None)
            copy_seconds = time.perf_counter() - start
            copier.terminate()
            copier.wait(30)
            consumer.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    copy_rate = seen / copy_seconds
    print(f"plain idempotent produce: {produce_rate:,.0f} records/s")
    print(f"exactly-once copier (750/txn, read_committed in and out): {copy_rate:,.0f} records/s ({seen} records in {copy_seconds:.1f} s)")
    print(f"copier / plain produce: {copy_rate / produce_rate:.3f}")


if __name__ == "__main__":
    main()
