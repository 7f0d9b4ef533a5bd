"""An exactly-once copier written with onceflow's own clients (``txn``).

    python examples/txn_copier.py --bootstrap 127.0.0.1:9092 \\
        --input in --output out --group copiers --transactional-id copier-1

The same program as ``transactional_copier.py`` (which uses confluent-kafka),
in pure Python: a read_committed consumer in group ``--group`` feeds a
transactional producer; every transaction carries the records it produced
and the consumer positions that produced them (``send_offsets_to_transaction``
with the consumer's group metadata, KIP-447). ``--abort-ratio`` aborts that
share of transactions on purpose and re-reads from the committed positions.
Kill it at any moment (SIGKILL included) and start it again: the output holds
every input record exactly once.

Copy it as a template (with ``copier_arguments.py``, its command line, which
both copiers share): replace ``transform()`` with your processing.
"""

from __future__ import annotations

import random
import signal
import sys
import time

from txn import Consumer, KafkaError, Producer, ProducerFencedError, TransactionAbortableError
from txn.errors import CommitFailedError, RetriableError

from copier_arguments import copier_arguments  # beside this file


def transform(key: bytes | None, value: bytes | None) -> tuple[bytes | None, bytes | None]:
    return key, value


class RewindOnRevoke:
    """Nothing to do on revoke: uncommitted work dies with its transaction."""

    def on_partitions_revoked(self, partitions):
        pass

    def on_partitions_assigned(self, partitions):
        pass


def rewind_to_committed(consumer: Consumer) -> None:
    """After an abort, go back to what the last committed transaction consumed."""
    assignment = consumer.assignment()
    if not assignment:
        return
    committed = consumer.committed(assignment, timeout=30)
    beginnings = consumer.beginning_offsets([tp for tp in assignment if committed.get(tp) is None])
    for tp in assignment:
        found = committed.get(tp)
        consumer.seek(tp, found.offset if found is not None else beginnings[tp])


def run(args) -> int:
    rng = random.Random(args.seed)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=max(100, args.session_timeout_ms // 5),
        max_poll_records=args.records_per_txn,
    )
    producer = Producer(bootstrap_servers=args.bootstrap, transactional_id=args.transactional_id, linger_ms=5, transaction_timeout_ms=30_000)
    producer.init_transactions()
    consumer.subscribe([args.input], listener=RewindOnRevoke())
    committed_txns = aborted_txns = 0
    try:
        while not stopping:
            records = consumer.poll(0.5)
            if not records:
                continue
            producer.begin_transaction()
            try:
                for record in records:
                    key, value = transform(record.key, record.value)
                    producer.send(args.output, value, key=key)
                positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
                producer.send_offsets_to_transaction(positions, consumer.group_metadata())
                if rng.random() < args.abort_ratio:
                    producer.abort_transaction()
                    aborted_txns += 1
                    rewind_to_committed(consumer)
                    continue
                producer.commit_transaction()
                committed_txns += 1
            except (TransactionAbortableError, CommitFailedError, RetriableError):
                # e.g. our partitions moved in a rebalance: abort, re-read.
                producer.abort_transaction()
                aborted_txns += 1
                rewind_to_committed(consumer)
            except ProducerFencedError:
                raise  # another instance took over: exit; a supervisor decides
            except KafkaError:
                raise
    finally:
        print(f"copier {args.transactional_id}: {committed_txns} committed, {aborted_txns} aborted transactions", file=sys.stderr, flush=True)
        try:
            consumer.close()
        finally:
            producer.close(timeout=10)
    return 0


def main(argv=None) -> int:
    parser = copier_arguments(__doc__.splitlines()[0], client_debug_help="accepted for symmetry with the confluent copier; unused")
    started = time.monotonic()
    try:
        return run(parser.parse_args(argv))
    finally:
        print(f"ran {time.monotonic() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
