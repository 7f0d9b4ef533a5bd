"""``onceflow transactions list|describe|find-hanging|abort`` (KIP-664), on
``txn.Admin``, as ``kafka-transactions.sh`` does them:

    list           every transactional id, its producer id and state
    describe ID    one id: state, producer id/epoch, timeout, start, partitions
    find-hanging   transactions open in a partition that the coordinator does
                   not know as open there, or open longer than their
                   transaction timeout (``txn.Admin.find_hanging_transactions``,
                   the rule ``onceflow status`` shows too): these hold the
                   last stable offset back
    abort          write an ABORT marker for a hanging transaction in one
                   partition (--topic, --partition, --producer-id, --producer-epoch)
"""

from __future__ import annotations

import sys

from onceflow.client_commands import add_bootstrap_option, client_options, partition_count, reporting_errors


def add_arguments(parser) -> None:
    add_bootstrap_option(parser)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every transactional id with its producer id and state", description="every transactional id with its producer id and state")
    describe = actions.add_parser("describe", help="state, producer, timeout, start and partitions of one transactional id", description="state, producer, timeout, start and partitions of one transactional id")
    describe.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    actions.add_parser("find-hanging", help="open transactions the coordinator does not know as open, or open longer than their timeout", description="transactions open in a partition that the coordinator does not know as open there, or open longer than their transaction timeout: they hold the last stable offset back")
    abort = actions.add_parser("abort", help="write an ABORT marker for a hanging transaction in one partition", description="write an ABORT marker for a hanging transaction in one partition")
    abort.add_argument("--topic", required=True, help="the topic of the partition the transaction hangs in")
    abort.add_argument("--partition", type=int, required=True, metavar="P", help="that partition")
    abort.add_argument("--producer-id", type=int, required=True, metavar="ID", help="the hanging transaction's producer id (find-hanging shows it)")
    abort.add_argument("--producer-epoch", type=int, required=True, metavar="E", help="its producer epoch (find-hanging shows it)")
    abort.add_argument("--coordinator-epoch", type=int, default=None, metavar="N", help="(default: the one DescribeProducers reports for the producer)")


def run(args) -> int:
    from txn import Admin

    def act() -> int:
        with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
            if args.action == "list":
                return list_transactions(admin)
            if args.action == "describe":
                return describe_transaction(admin, args.transactional_id)
            if args.action == "find-hanging":
                return find_hanging(admin)
            return abort_transaction(admin, args.topic, args.partition, args.producer_id, args.producer_epoch, args.coordinator_epoch)

    return reporting_errors("transactions", args, act)


def list_transactions(admin, out=None) -> int:
    out = out or sys.stdout
    out.write(f"{'TransactionalId':<40}{'ProducerId':>12}  State\n")
    for listing in admin.list_transactions():
        out.write(f"{listing.transactional_id:<40}{listing.producer_id:>12}  {listing.state}\n")
    return 0


def describe_transaction(admin, transactional_id: str, out=None) -> int:
    from protocol.errors import ErrorCode
    from txn.errors import KafkaError

    out = out or sys.stdout
    try:
        [description] = admin.describe_transactions([transactional_id])
    except KafkaError as error:
        if error.code != ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
            raise
        out.write(f"{transactional_id}: not found (error {int(error.code)})\n")
        return 1
    partitions = ", ".join(f"{tp.topic}-{tp.partition}" for tp in description.partitions) or "-"
    out.write(
        f"TransactionalId: {transactional_id}\nState: {description.state}\nProducerId: {description.producer_id}\n"
        f"ProducerEpoch: {description.producer_epoch}\nTimeoutMs: {description.timeout_ms}\n"
        f"StartTimeMs: {description.start_time_ms}\nPartitions: {partitions}\n"
    )
    return 0


def find_hanging(admin, out=None) -> int:
    from txn import TopicPartition
    from txn.admin import HANGING_REASONS

    out = out or sys.stdout
    partitions = [TopicPartition(topic, p) for topic, count in sorted(admin.list_topics().items()) if topic != "__transaction_state" for p in range(count)]
    hanging = admin.find_hanging_transactions(partitions)
    for found in hanging:
        out.write(
            f"{found.topic}-{found.partition} producerId {found.producer_id} epoch {found.producer_epoch} "
            f"coordinatorEpoch {found.coordinator_epoch} startOffset {found.start_offset}: {HANGING_REASONS[found.reason]}\n"
        )
    if not hanging:
        out.write("no hanging transactions\n")
    return 0


def abort_transaction(admin, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int | None = None, out=None) -> int:
    from txn.errors import KafkaError, RetriesExhaustedError

    out = out or sys.stdout
    partition_count(admin, topic)  # an unknown topic is an error, not created by the leader look-up
    try:
        admin.abort_transaction((topic, partition), producer_id, producer_epoch, coordinator_epoch)
    except RetriesExhaustedError:
        raise
    except KafkaError as error:
        out.write(f"abort of producer {producer_id} in {topic}-{partition} failed: error {int(error.code)} ({error})\n")
        return 1
    out.write(f"wrote an ABORT marker for producer {producer_id} epoch {producer_epoch} in {topic}-{partition}\n")
    return 0
