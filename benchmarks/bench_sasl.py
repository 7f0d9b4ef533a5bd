"""What TLS and SASL cost a client: produce and consume throughput over
SASL_SSL (SCRAM-SHA-256, TLS 1.2+) beside PLAINTEXT, as ratios measured in
one run (``onceflow bench --only SASL_SSL``, or ``python -m
benchmarks.bench_sasl``).

One broker process listens on both (the same logs, the same disk), so the
only difference between the two is the listener: the same confluent-kafka
producer (100 B records, idempotent, acks=all, 1 MiB batches) fills a fresh
topic through one listener, then through the other, alternating round after
round so that drift on a shared machine falls on both; a consumer reads
each topic back from the start through the listener it was written through.
Medians per listener; the ratio SASL_SSL / PLAINTEXT is the figure (1.0:
free). The login itself (one SCRAM exchange per connection) is outside the
timed part: the clients connect before the clock starts.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid

from faults.process import BrokerProcess, restartable_port

ROUNDS = 3
RECORD = b"s" * 100
USER, PASSWORD = "bench", "bench-password"


class TwoListenerBroker:
    """``onceflow broker`` with a PLAINTEXT and a SASL_SSL listener, a test
    CA's certificate and one SCRAM user added offline."""

    def __init__(self, work: str):
        from broker.security.credentials import CredentialStore, make
        from faults.certificates import TestCA

        self.work = work
        self.ca = TestCA(os.path.join(work, "ca"))
        self.data_dir = os.path.join(work, "data")
        CredentialStore(self.data_dir).load().upsert(USER, "SCRAM-SHA-256", make("SCRAM-SHA-256", PASSWORD))
        self.ports = {"PLAINTEXT": restartable_port(), "SASL_SSL": restartable_port()}
        self.broker = BrokerProcess(
            self.data_dir, "group.initial.rebalance.delay.ms=0",
            listeners=",".join(f"{name}://127.0.0.1:{port}" for name, port in self.ports.items()),
            args=("--ssl-certfile", self.ca.certfile, "--ssl-keyfile", self.ca.keyfile),
        )

    def __enter__(self) -> "TwoListenerBroker":
        self.broker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.broker.kill()

    def client_config(self, listener: str) -> dict:
        config = {"bootstrap.servers": f"127.0.0.1:{self.ports[listener]}"}
        if listener == "SASL_SSL":
            config.update({
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": USER,
                "sasl.password": PASSWORD,
                "ssl.ca.location": self.ca.cafile,
            })
        return config


def produce(config: dict, topic: str, count: int) -> float:
    """records/s of ``count`` records into ``topic`` (connected before the clock starts)."""
    from confluent_kafka import Producer

    producer = Producer({**config, "acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    from benchmarks.suite import produce_all

    producer.list_topics(topic, timeout=30)  # connect and log in outside the timed part
    return produce_all(producer, topic, RECORD, count, partition=0)


def consume(config: dict, topic: str, count: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    from benchmarks.suite import CONSUMER_SETTINGS

    consumer = Consumer({**config, "group.id": f"bench-{uuid.uuid4().hex[:6]}", **CONSUMER_SETTINGS})
    consumer.list_topics(topic, timeout=30)
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, start = 0, time.perf_counter()
    deadline = start + 120
    while seen < count and time.perf_counter() < deadline:
        seen += sum(1 for message in consumer.consume(min(10_000, count - seen), 1.0) if message.error() is None)
    elapsed = time.perf_counter() - start
    consumer.close()
    if seen < count:
        raise RuntimeError(f"read {seen} of {count} records")
    return count / elapsed


def measure(records: int, rounds: int = ROUNDS, work_dir: str | None = None) -> dict[str, dict[str, float]]:
    """{"produce"|"consume": {listener: median records/s, "ratio": SASL_SSL / PLAINTEXT}}."""
    from confluent_kafka.admin import AdminClient, NewTopic

    work = tempfile.mkdtemp(prefix="onceflow-bench-sasl-", dir=work_dir)
    rates: dict[str, dict[str, list[float]]] = {"produce": {}, "consume": {}}
    with TwoListenerBroker(work) as broker:
        admin = AdminClient(broker.client_config("PLAINTEXT"))
        for round_index in range(rounds + 1):  # the first round warms up and is not counted
            for listener in ("PLAINTEXT", "SASL_SSL") if round_index % 2 == 0 else ("SASL_SSL", "PLAINTEXT"):
                topic = f"bench-sasl-{uuid.uuid4().hex[:8]}"
                admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
                config = broker.client_config(listener)
                produced = produce(config, topic, records)
                consumed = consume(config, topic, records)
                if round_index:
                    rates["produce"].setdefault(listener, []).append(produced)
                    rates["consume"].setdefault(listener, []).append(consumed)
    result = {}
    for kind, per_listener in rates.items():
        medians = {listener: statistics.median(values) for listener, values in per_listener.items()}
        result[kind] = {**medians, "ratio": medians["SASL_SSL"] / medians["PLAINTEXT"]}
    return result


def sasl_ssl_scenario(bootstrap: str, settings) -> dict:
    """The suite's scenario: its own broker (``bootstrap`` is not used)."""
    from benchmarks.suite import Metric

    result = measure(max(10_000, settings.records // 2))
    metrics = {}
    for kind in ("produce", "consume"):
        metrics[f"{kind} PLAINTEXT"] = Metric(result[kind]["PLAINTEXT"], "records/s")
        metrics[f"{kind} SASL_SSL"] = Metric(result[kind]["SASL_SSL"], "records/s")
        metrics[f"{kind} SASL_SSL / PLAINTEXT"] = Metric(result[kind]["ratio"], "x")
    return metrics


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    result = measure(args.records, args.rounds)
    for kind, figures in result.items():
        print(f"{kind}: PLAINTEXT {figures['PLAINTEXT']:,.0f} records/s, SASL_SSL {figures['SASL_SSL']:,.0f} records/s, ratio {figures['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
