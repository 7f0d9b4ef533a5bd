"""Produce and consume through the broker with confluent-kafka, beside the raw
loopback rate of a plain socket pair moving the same bytes, in one run.

    .venv/bin/python -m benchmarks.bench_broker [--seconds 5] [--flush-policy group]

For 100-byte and 1 KiB values: produce with acks=all (msgs/s, MB/s), then
consume everything back (msgs/s, MB/s). The loopback figure sends the same
number of payload bytes through a socketpair-like TCP connection in 64 KiB
writes; it is the ceiling any broker on this machine works under.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import threading
import time

from broker.broker import EmbeddedBroker


def loopback_rate(total_bytes: int) -> float:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    received = [0]

    def sink():
        connection, _ = listener.accept()
        while True:
            data = connection.recv(1 << 20)
            if not data:
                break
            received[0] += len(data)
        connection.close()

    thread = threading.Thread(target=sink)
    thread.start()
    sender = socket.create_connection(("127.0.0.1", port))
    chunk = b"x" * 65536
    start = time.perf_counter()
    sent = 0
    while sent < total_bytes:
        sender.sendall(chunk)
        sent += len(chunk)
    sender.close()
    thread.join()
    listener.close()
    return received[0] / (time.perf_counter() - start) / 1e6


def produce(bootstrap: str, topic: str, value: bytes, seconds: float) -> tuple[int, float]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20, "enable.idempotence": False, "queue.buffering.max.messages": 1_000_000})
    count = 0
    errors = []

    def on_delivery(error, _message):
        if error is not None:
            errors.append(error)

    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            try:
                producer.produce(topic, value=value, on_delivery=on_delivery)
                count += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} delivery errors, first: {errors[0]}")
    return count, elapsed


def consume(bootstrap: str, topic: str, count: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, "fetch.max.bytes": 50 * 1024 * 1024, "max.partition.fetch.bytes": 10 * 1024 * 1024})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    start = time.perf_counter()
    while seen < count:
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                seen += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flush-policy", default="group")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    directory = tempfile.mkdtemp(prefix="onceflow-bench-broker-", dir=os.environ.get("BENCH_DIR"))
    rows = []
    try:
        with EmbeddedBroker(directory, properties={"flush.policy": args.flush_policy}) as broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            for size in (100, 1024):
                topic = f"bench-{size}"
                admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
                value = os.urandom(size)
                count, produce_s = produce(broker.bootstrap, topic, value, args.seconds)
                consume_s = consume(broker.bootstrap, topic, count)
                payload = count * size
                loopback = loopback_rate(payload)
                rows.append({
                    "value_bytes": size,
                    "messages": count,
                    "produce_msgs_per_s": round(count / produce_s),
                    "produce_MBps": round(payload / produce_s / 1e6, 1),
                    "consume_msgs_per_s": round(count / consume_s),
                    "consume_MBps": round(payload / consume_s / 1e6, 1),
                    "loopback_MBps": round(loopback, 1),
                })
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"flush.policy={args.flush_policy}, acks=all, one partition, confluent-kafka client")
    print(f"{'value':>6}{'produce msg/s':>15}{'produce MB/s':>14}{'consume msg/s':>15}{'consume MB/s':>14}{'loopback MB/s':>15}{'produce/loopback':>18}")
    for row in rows:
        print(f"{row['value_bytes']:>6}{row['produce_msgs_per_s']:>15}{row['produce_MBps']:>14}{row['consume_msgs_per_s']:>15}{row['consume_MBps']:>14}{row['loopback_MBps']:>15}{row['produce_MBps'] / row['loopback_MBps']:>18.3f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
