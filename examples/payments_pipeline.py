"""A stateful exactly-once pipeline: per-account running balances of a
stream of payments, with onceflow's own clients.

    python examples/payments_pipeline.py --bootstrap 127.0.0.1:9092 \\
        --input payments --output balances --changelog balances-changelog

Each payment (key: account, value: ``payment-id:account:amount``) becomes
one output record ``payment-id:account:balance-after``. The balances are
state, and state must survive crashes exactly once too, so they live where
Kafka Streams keeps them: in a changelog topic written in the same
transaction as the output records and the consumer offsets. On start (and
after any abort) the pipeline rebuilds its balances by reading the changelog
read_committed up to its end, then goes on from the committed input offsets.
Kill it at any moment: the output holds each payment once, with the right
balance.
"""

from __future__ import annotations

import argparse
import signal
import sys

from txn import Consumer, KafkaError, Producer, ProducerFencedError, TopicPartition, TransactionAbortableError
from txn.errors import CommitFailedError, RetriableError


def restore_balances(bootstrap: str, changelog: str, partitions: int) -> dict[str, int]:
    """The last committed balance of every account, from the changelog."""
    reader = Consumer(bootstrap_servers=bootstrap, max_poll_records=10_000)
    assignment = [TopicPartition(changelog, p) for p in range(partitions)]
    reader.assign(assignment)
    ends = reader.end_offsets(assignment)
    balances: dict[str, int] = {}
    while any(reader.position(tp) < ends[tp] for tp in assignment):
        for record in reader.poll(0.5):
            balances[record.key.decode()] = int(record.value)
    reader.close()
    return balances


def run(args) -> int:
    stopping: list = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    # A static member (group.instance.id, KIP-345): a restarted pipeline takes
    # over its old membership at once instead of waiting out the session of
    # the instance that died.
    consumer = Consumer(bootstrap_servers=args.bootstrap, group_id=args.group, group_instance_id=args.transactional_id,
                        session_timeout_ms=6000, heartbeat_interval_ms=500, max_poll_records=args.records_per_txn)
    producer = Producer(bootstrap_servers=args.bootstrap, transactional_id=args.transactional_id, transaction_timeout_ms=10_000, linger_ms=5)
    producer.init_transactions()  # fences a previous instance and finishes what it left
    balances = restore_balances(args.bootstrap, args.changelog, args.partitions)
    consumer.subscribe([args.input])

    def rewind() -> None:
        nonlocal balances
        balances = restore_balances(args.bootstrap, args.changelog, args.partitions)
        assignment = consumer.assignment()
        committed = consumer.committed(assignment, timeout=30)
        starts = consumer.beginning_offsets([tp for tp in assignment if committed.get(tp) is None])
        for tp in assignment:
            consumer.seek(tp, committed[tp].offset if committed.get(tp) else starts[tp])

    committed_txns = aborted_txns = 0
    while not stopping:
        payments = consumer.poll(0.5)
        if not payments:
            continue
        producer.begin_transaction()
        try:
            changed: dict[str, int] = {}
            for payment in payments:
                payment_id, account, amount = payment.value.decode().split(":")
                balance = balances.get(account, 0) + int(amount)
                balances[account] = changed[account] = balance
                producer.send(args.output, f"{payment_id}:{account}:{balance}".encode(), key=account.encode())
            for account, balance in changed.items():
                producer.send(args.changelog, str(balance).encode(), key=account.encode())
            producer.send_offsets_to_transaction({tp: consumer.position(tp) for tp in consumer.assignment()}, consumer.group_metadata())
            producer.commit_transaction()
            committed_txns += 1
        except (TransactionAbortableError, CommitFailedError, RetriableError) as error:
            print(f"aborting: {error}", file=sys.stderr, flush=True)
            producer.abort_transaction()
            aborted_txns += 1
            rewind()
        except ProducerFencedError:
            return 4
        except KafkaError as error:
            print(f"giving up: {error}", file=sys.stderr, flush=True)
            return 5
    print(f"pipeline: {committed_txns} committed, {aborted_txns} aborted transactions", file=sys.stderr, flush=True)
    consumer.close()
    producer.close(timeout=10)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", default="payments")
    parser.add_argument("--output", default="balances")
    parser.add_argument("--changelog", default="balances-changelog")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the changelog")
    parser.add_argument("--group", default="payments-pipeline")
    parser.add_argument("--transactional-id", default="payments-pipeline-0")
    parser.add_argument("--records-per-txn", type=int, default=500)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
