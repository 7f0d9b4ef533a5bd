"""Our clients beside kafka-python, aiokafka and confluent-kafka, one run,
one broker (a child process, so no client shares its interpreter).

    .venv/bin/python -m benchmarks.bench_clients [--records 200000] [--value-bytes 100]

Each client produces ``--records`` records of ``--value-bytes`` into its own
single-partition topic, idempotent (acks=all), and waits for every
acknowledgement; then a consumer of the same library reads the topic back
from the start. Prints msgs/s per client and our figures as ratios to each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time

from faults.process import BrokerProcess


def create_topics(bootstrap: str, names: list[str]) -> None:
    from txn import Admin

    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({name: 1 for name in names})


# -- producers: each returns seconds taken for all records acknowledged -------------------


def produce_ours(bootstrap, topic, value, count):
    from txn import Producer

    producer = Producer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 16)
    start = time.perf_counter()
    for _ in range(count):
        producer.send(topic, value, partition=0)
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    return elapsed


def produce_ours_async(bootstrap, topic, value, count):
    import txn.aio

    async def run():
        async with txn.aio.Producer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 16) as producer:
            start = time.perf_counter()
            for _ in range(count):
                await producer.send(topic, value, partition=0)
            await producer.flush()
            return time.perf_counter() - start

    return asyncio.run(run())


def produce_kafka_python(bootstrap, topic, value, count):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5, batch_size=1 << 16)
    start = time.perf_counter()
    for _ in range(count):
        producer.send(topic, value, partition=0)
    producer.flush()
    elapsed = time.perf_counter() - start
    producer.close()
    return elapsed


def produce_aiokafka(bootstrap, topic, value, count):
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5, max_batch_size=1 << 16)
        await producer.start()
        try:
            start = time.perf_counter()
            pending = []
            for _ in range(count):
                pending.append(await producer.send(topic, value, partition=0))
            await asyncio.gather(*pending)
            return time.perf_counter() - start
        finally:
            await producer.stop()

    return asyncio.run(run())


def produce_confluent(bootstrap, topic, value, count):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "batch.size": 1 << 16, "queue.buffering.max.messages": 1_000_000})
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(120) == 0
    return time.perf_counter() - start


# -- consumers: each returns seconds to read ``count`` records from offset 0 -----------------


def consume_ours(bootstrap, topic, count):
    from txn import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap, max_poll_records=10_000)
    consumer.assign([TopicPartition(topic, 0)])
    start, seen = time.perf_counter(), 0
    while seen < count:
        seen += len(consumer.poll(1.0))
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def consume_kafka_python(bootstrap, topic, count):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, isolation_level="read_committed", max_poll_records=10_000)
    consumer.assign([TopicPartition(topic, 0)])
    start, seen = time.perf_counter(), 0
    while seen < count:
        seen += sum(len(v) for v in consumer.poll(1000).values())
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def consume_aiokafka(bootstrap, topic, count):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, isolation_level="read_committed")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            start, seen = time.perf_counter(), 0
            while seen < count:
                seen += sum(len(v) for v in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).values())
            return time.perf_counter() - start
        finally:
            await consumer.stop()

    return asyncio.run(run())


def consume_confluent(bootstrap, topic, count):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    start, seen = time.perf_counter(), 0
    while seen < count:
        seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


CLIENTS = {
    "onceflow txn": (produce_ours, consume_ours),
    "onceflow txn.aio": (produce_ours_async, None),
    "kafka-python": (produce_kafka_python, consume_kafka_python),
    "aiokafka": (produce_aiokafka, consume_aiokafka),
    "confluent-kafka": (produce_confluent, consume_confluent),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--only", nargs="*", default=None, help="client names to run")
    args = parser.parse_args(argv)
    value = os.urandom(args.value_bytes // 2).hex().encode()[: args.value_bytes]
    data_dir = tempfile.mkdtemp(prefix="bench-clients-")
    broker = BrokerProcess(os.path.join(data_dir, "data")).start()
    bootstrap = broker.bootstrap
    results: dict[str, dict[str, float]] = {}
    try:
        names = [n for n in CLIENTS if args.only is None or n in args.only]
        topics = {name: "bench-" + re.sub(r"[^a-z]", "-", name) for name in names}
        create_topics(bootstrap, list(topics.values()))
        for name in names:
            produce, consume = CLIENTS[name]
            seconds = produce(bootstrap, topics[name], value, args.records)
            results[name] = {"produce_msgs_per_s": args.records / seconds}
            if consume is not None:
                results[name]["consume_msgs_per_s"] = args.records / consume(bootstrap, topics[name], args.records)
            print(f"{name:18s} " + "  ".join(f"{k} {v:>10,.0f}" for k, v in results[name].items()), flush=True)
    finally:
        broker.kill()
        shutil.rmtree(data_dir, ignore_errors=True)
    ours = results.get("onceflow txn")
    if ours:
        for name, figures in results.items():
            if name == "onceflow txn":
                continue
            ratios = {k: ours[k] / v for k, v in figures.items() if k in ours}
            print(f"onceflow txn / {name}: " + ", ".join(f"{k.split('_')[0]} {r:.2f}" for k, r in ratios.items()))
    print(json.dumps({"records": args.records, "value_bytes": args.value_bytes, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
