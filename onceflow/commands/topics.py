"""``onceflow topics create|list|describe|delete``: topics through ``txn.Admin``.

    onceflow topics create orders --partitions 3 [--config retention.ms=600000]
    onceflow topics list | describe orders | delete orders
"""

from __future__ import annotations

import sys

from onceflow.client_commands import CommandError, add_bootstrap_option, client_options, partition_count, reporting_errors


def add_arguments(parser) -> None:
    add_bootstrap_option(parser)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic", description="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a topic setting, Kafka's names (repeatable)")
    actions.add_parser("list", help="list topics with their partition counts", description="list topics with their partition counts")
    describe = actions.add_parser("describe", help="partitions, offsets and settings of a topic", description="partitions, offsets and settings of a topic")
    describe.add_argument("topic")
    delete = actions.add_parser("delete", help="delete a topic", description="delete a topic")
    delete.add_argument("topic")


def run(args) -> int:
    return reporting_errors("topics", args, lambda: _topics(args, sys.stdout))


def _topics(args, out) -> int:
    from txn import Admin, TopicPartition

    with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
        if args.action == "create":
            configs = {}
            for item in args.config:
                key, sep, value = item.partition("=")
                if not sep:
                    raise CommandError(f"--config wants KEY=VALUE, not {item!r}")
                configs[key] = value
            admin.create_topics({args.topic: args.partitions}, configs={args.topic: configs})
            print(f"created {args.topic} with {args.partitions} partition(s)", file=out)
        elif args.action == "list":
            for name, count in sorted(admin.list_topics().items()):
                print(f"{name}\t{count}", file=out)
        elif args.action == "describe":
            count = partition_count(admin, args.topic)
            partitions = [TopicPartition(args.topic, p) for p in range(count)]
            earliest = admin.list_offsets({tp: "earliest" for tp in partitions}, isolation_level="read_uncommitted")
            latest = admin.list_offsets({tp: "latest" for tp in partitions}, isolation_level="read_uncommitted")
            stable = admin.list_offsets({tp: "latest" for tp in partitions})
            print(f"topic {args.topic}: {count} partition(s)", file=out)
            for tp in partitions:
                print(f"  partition {tp.partition}: log start {earliest[tp].offset}, high watermark {latest[tp].offset}, last stable {stable[tp].offset}", file=out)
            for key, value in sorted(admin.describe_configs([args.topic]).get(args.topic, {}).items()):
                print(f"  {key}={value}", file=out)
        else:
            partition_count(admin, args.topic)
            admin.delete_topics([args.topic])
            print(f"deleted {args.topic}", file=out)
    return 0
