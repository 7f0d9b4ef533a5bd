"""``onceflow consume TOPIC``: print the records of a topic, one value (or
key, separator, value) a line, read_committed by default; with ``--group``
as a member of a consumer group that commits what was printed.
"""

from __future__ import annotations

import sys
import time

from onceflow.client_commands import add_bootstrap_option, client_options, partition_count, reporting_errors


def add_arguments(parser) -> None:
    parser.add_argument("topic")
    add_bootstrap_option(parser)
    parser.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: only new records)")
    parser.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"], help="(default read_committed)")
    parser.add_argument("--group", default=None, help="join this consumer group and commit what was printed")
    parser.add_argument("--max-messages", type=int, default=None, metavar="N", help="stop after N records")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="stop after this many seconds without a record")
    parser.add_argument("--print-key", action="store_true", help="print the key and --key-separator before each value")
    parser.add_argument("--key-separator", default="\t", metavar="SEP", help="what --print-key puts between key and value (default a tab)")


def run(args) -> int:
    return reporting_errors("consume", args, lambda: _consume(args, sys.stdout))


def _consume(args, out) -> int:
    from txn import Admin, Consumer, TopicPartition

    with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
        count = partition_count(admin, args.topic)
    consumer = Consumer(
        bootstrap_servers=args.bootstrap_server, group_id=args.group, isolation_level=args.isolation,
        auto_offset_reset="earliest" if args.from_beginning else "latest", **client_options(args),
    )
    printed = 0
    try:
        if args.group:
            consumer.subscribe([args.topic])
        else:
            partitions = [TopicPartition(args.topic, p) for p in range(count)]
            consumer.assign(partitions)
            if args.from_beginning:
                consumer.seek_to_beginning(partitions)
            else:
                consumer.seek_to_end(partitions)
        last_record = time.monotonic()
        while args.max_messages is None or printed < args.max_messages:
            records = consumer.poll(0.5)
            if not records:
                if args.timeout is not None and time.monotonic() - last_record > args.timeout:
                    break
                continue
            last_record = time.monotonic()
            for record in records[: None if args.max_messages is None else args.max_messages - printed]:
                value = record.value.decode("utf-8", "replace") if record.value is not None else ""
                if args.print_key:
                    key = record.key.decode("utf-8", "replace") if record.key is not None else ""
                    value = f"{key}{args.key_separator}{value}"
                print(value, file=out, flush=True)
                printed += 1
            if args.group:
                consumer.commit()
    finally:
        consumer.close()
    return 0
