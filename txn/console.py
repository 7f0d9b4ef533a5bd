"""Console tools on our clients, in the manner of kcat and kafka-console-*:

    onceflow topics create orders --partitions 3 [--config retention.ms=600000]
    onceflow topics list | describe orders | delete orders
    onceflow produce orders [--key-separator :] [--transactional-id T]   (lines from stdin)
    onceflow consume orders [--from-beginning] [--isolation read_committed] [--group G]
                            [--max-messages N] [--timeout S] [--print-key]

Every command takes ``--bootstrap-server HOST:PORT`` (default
127.0.0.1:9092). Problems are one line on stderr and a non-zero exit, never
a traceback: 1 for a refused request (unknown topic, bad name), 2 when the
broker cannot be reached.
"""

from __future__ import annotations

import sys
import time

from txn.errors import ConfigError, KafkaError, RetriesExhaustedError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
QUICK = {"request_timeout_ms": 5000, "retry_backoff_max_ms": 500}


class ConsoleError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_commands(commands) -> None:
    """Add ``topics``, ``produce`` and ``consume`` to an argparse subparsers object."""
    topics = commands.add_parser("topics", help="create, list, describe or delete topics")
    topics.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    actions = topics.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a topic setting (repeatable)")
    actions.add_parser("list", help="list topics with their partition counts")
    describe = actions.add_parser("describe", help="partitions, offsets and settings of a topic")
    describe.add_argument("topic")
    delete = actions.add_parser("delete", help="delete a topic")
    delete.add_argument("topic")

    produce = commands.add_parser("produce", help="send lines from stdin as records")
    produce.add_argument("topic")
    produce.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    produce.add_argument("--key-separator", default=None, help="split each line into key and value at the first SEP")
    produce.add_argument("--transactional-id", default=None, help="send every line in one transaction, committed at end of input")
    produce.add_argument("--partition", type=int, default=None)

    consume = commands.add_parser("consume", help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP)
    consume.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: only new records)")
    consume.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"])
    consume.add_argument("--group", default=None, help="join this consumer group and commit what was printed")
    consume.add_argument("--max-messages", type=int, default=None)
    consume.add_argument("--timeout", type=float, default=None, help="stop after this many seconds without a record")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--key-separator", default="\t")


def run(args, stdin=None, stdout=None, stderr=None) -> int:
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    try:
        if args.command == "topics":
            return _topics(args, stdout)
        if args.command == "produce":
            return _produce(args, stdin, stderr)
        return _consume(args, stdout)
    except ConsoleError as error:
        print(f"onceflow {args.command}: {error}", file=stderr)
        return error.code
    except RetriesExhaustedError as error:
        print(f"onceflow {args.command}: cannot reach a broker at {args.bootstrap_server}: {error}", file=stderr)
        return 2
    except (ConnectionError, OSError, TimeoutError) as error:
        print(f"onceflow {args.command}: cannot reach a broker at {args.bootstrap_server}: {error}", file=stderr)
        return 2
    except (KafkaError, ConfigError) as error:
        print(f"onceflow {args.command}: {error}", file=stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _existing(admin, topic: str) -> int:
    partitions = admin.list_topics().get(topic)
    if partitions is None:
        raise ConsoleError(f"unknown topic {topic!r}")
    return partitions


def _topics(args, stdout) -> int:
    from txn import Admin, TopicPartition

    with Admin(bootstrap_servers=args.bootstrap_server, **QUICK) as admin:
        if args.action == "create":
            configs = {}
            for item in args.config:
                key, sep, value = item.partition("=")
                if not sep:
                    raise ConsoleError(f"--config wants KEY=VALUE, not {item!r}")
                configs[key] = value
            admin.create_topics({args.topic: args.partitions}, configs={args.topic: configs})
            print(f"created {args.topic} with {args.partitions} partition(s)", file=stdout)
        elif args.action == "list":
            for name, count in sorted(admin.list_topics().items()):
                print(f"{name}\t{count}", file=stdout)
        elif args.action == "describe":
            count = _existing(admin, args.topic)
            partitions = [TopicPartition(args.topic, p) for p in range(count)]
            earliest = admin.list_offsets({tp: "earliest" for tp in partitions}, isolation_level="read_uncommitted")
            latest = admin.list_offsets({tp: "latest" for tp in partitions}, isolation_level="read_uncommitted")
            stable = admin.list_offsets({tp: "latest" for tp in partitions})
            print(f"topic {args.topic}: {count} partition(s)", file=stdout)
            for tp in partitions:
                print(f"  partition {tp.partition}: log start {earliest[tp].offset}, high watermark {latest[tp].offset}, last stable {stable[tp].offset}", file=stdout)
            for key, value in sorted(admin.describe_configs([args.topic]).get(args.topic, {}).items()):
                print(f"  {key}={value}", file=stdout)
        else:
            _existing(admin, args.topic)
            admin.delete_topics([args.topic])
            print(f"deleted {args.topic}", file=stdout)
    return 0


def _produce(args, stdin, stderr) -> int:
    from txn import Admin, Producer

    with Admin(bootstrap_servers=args.bootstrap_server, **QUICK) as admin:
        _existing(admin, args.topic)
    producer = Producer(bootstrap_servers=args.bootstrap_server, transactional_id=args.transactional_id, **QUICK)
    try:
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        futures = []
        for line in stdin:
            line = line.rstrip("\n")
            key = None
            if args.key_separator is not None:
                if args.key_separator not in line:
                    raise ConsoleError(f"line {len(futures) + 1} has no key separator {args.key_separator!r}")
                key, line = line.split(args.key_separator, 1)
            futures.append(producer.send(args.topic, line.encode(), key=key.encode() if key is not None else None, partition=args.partition))
        producer.flush()
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            if args.transactional_id:
                producer.abort_transaction()
            raise ConsoleError(f"{len(failed)} of {len(futures)} records not written: {failed[0]}")
        if args.transactional_id:
            producer.commit_transaction()
        print(f"wrote {len(futures)} record(s) to {args.topic}" + (" in one transaction" if args.transactional_id else ""), file=stderr)
    finally:
        producer.close(timeout=10)
    return 0


def _consume(args, stdout) -> int:
    from txn import Admin, Consumer, TopicPartition

    with Admin(bootstrap_servers=args.bootstrap_server, **QUICK) as admin:
        count = _existing(admin, args.topic)
    consumer = Consumer(
        bootstrap_servers=args.bootstrap_server, group_id=args.group, isolation_level=args.isolation,
        auto_offset_reset="earliest" if args.from_beginning else "latest", **QUICK,
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
                print(value, file=stdout, flush=True)
                printed += 1
            if args.group:
                consumer.commit()
    finally:
        consumer.close()
    return 0
