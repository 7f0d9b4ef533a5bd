"""An exactly-once copier: consume-transform-produce with confluent-kafka transactions.

    python examples/transactional_copier.py --bootstrap 127.0.0.1:9092 \\
        --input in --output out --group copiers --transactional-id copier-1

Reads ``--input`` with a read_committed consumer in group ``--group``, writes
each record to ``--output`` inside a transaction that also commits the
consumer's positions (``send_offsets_to_transaction`` with the consumer's
group metadata, KIP-447), ``--records-per-txn`` records per transaction. With
``--abort-ratio`` it aborts that share of transactions on purpose and re-does
the work after seeking back to the committed positions, as Apache Kafka's
transactions system test does. Kill it at any moment (SIGKILL included) and
start it again: the output holds every input record exactly once.

Copy it as a template (with ``copier_arguments.py``, its command line, which
both copiers share): replace ``transform()`` with your processing.
"""

from __future__ import annotations

import random
import signal
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from copier_arguments import copier_arguments  # beside this file


def transform(key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes | None]:
    return key, value


def rewind_to_committed(consumer: Consumer) -> None:
    """After an abort, go back to what the last committed transaction consumed."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for partition in consumer.committed(assignment, timeout=30):
        target = partition.offset if partition.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(partition.topic, partition.partition, target))


def run(args) -> int:
    rng = random.Random(args.seed)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": max(100, args.session_timeout_ms // 5),
            "metadata.recovery.strategy": "none",
            **({"debug": args.client_debug} if args.client_debug else {}),
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "linger.ms": 5,
            "transaction.timeout.ms": 30_000,
            # librdkafka 2.10+ re-bootstraps when every broker is down; after
            # that its group-coordinator requests (TxnOffsetCommit) stall, seen
            # with one broker restarting. Without re-bootstrap it reconnects.
            "metadata.recovery.strategy": "none",
            **({"debug": args.client_debug} if args.client_debug else {}),
        }
    )
    producer.init_transactions(60)
    consumer.subscribe([args.input], on_revoke=lambda c, partitions: None)
    committed_txns = aborted_txns = 0
    try:
        while not stopping:
            messages = [m for m in consumer.consume(args.records_per_txn, timeout=0.5) if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            try:
                for message in messages:
                    key, value = transform(message.key(), message.value())
                    producer.produce(args.output, key=key, value=value)
                positions = consumer.position(consumer.assignment())
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
                if rng.random() < args.abort_ratio:
                    producer.abort_transaction(30)
                    aborted_txns += 1
                    rewind_to_committed(consumer)
                    continue
                producer.commit_transaction(30)
                committed_txns += 1
            except KafkaException as exc:
                error = exc.args[0]
                if error.txn_requires_abort():
                    # e.g. our partitions moved in a rebalance: abort, re-read.
                    producer.abort_transaction(30)
                    aborted_txns += 1
                    rewind_to_committed(consumer)
                    continue
                if error.retriable():
                    time.sleep(0.2)
                    producer.abort_transaction(30)
                    rewind_to_committed(consumer)
                    continue
                raise  # fatal (fenced): exit; a supervisor restarts us
    finally:
        print(f"copier {args.transactional_id}: {committed_txns} committed, {aborted_txns} aborted transactions", file=sys.stderr, flush=True)
        consumer.close()
    return 0


def main(argv=None) -> int:
    parser = copier_arguments(__doc__.splitlines()[0], client_debug_help="librdkafka debug contexts, e.g. eos,cgrp")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
