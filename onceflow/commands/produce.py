"""``onceflow produce TOPIC``: send lines from stdin as records with our
idempotent producer, optionally all in one transaction (committed at the end
of input, aborted if any record failed).
"""

from __future__ import annotations

import sys

from onceflow.client_commands import CommandError, add_bootstrap_option, client_options, partition_count, reporting_errors


def add_arguments(parser) -> None:
    parser.add_argument("topic")
    add_bootstrap_option(parser)
    parser.add_argument("--key-separator", default=None, metavar="SEP", help="split each line into key and value at the first SEP")
    parser.add_argument("--transactional-id", default=None, help="send every line in one transaction, committed at end of input")
    parser.add_argument("--partition", type=int, default=None, help="send every record to this partition (default: by key)")


def run(args) -> int:
    return reporting_errors("produce", args, lambda: _produce(args, sys.stdin, sys.stderr))


def _produce(args, lines, err) -> int:
    from txn import Admin, Producer

    with Admin(bootstrap_servers=args.bootstrap_server, **client_options(args)) as admin:
        partition_count(admin, args.topic)
    producer = Producer(bootstrap_servers=args.bootstrap_server, transactional_id=args.transactional_id, **client_options(args))
    try:
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
        futures = []
        for line in lines:
            line = line.rstrip("\n")
            key = None
            if args.key_separator is not None:
                if args.key_separator not in line:
                    raise CommandError(f"line {len(futures) + 1} has no key separator {args.key_separator!r}")
                key, line = line.split(args.key_separator, 1)
            futures.append(producer.send(args.topic, line.encode(), key=key.encode() if key is not None else None, partition=args.partition))
        producer.flush()
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            if args.transactional_id:
                producer.abort_transaction()
            raise CommandError(f"{len(failed)} of {len(futures)} records not written: {failed[0]}")
        if args.transactional_id:
            producer.commit_transaction()
        print(f"wrote {len(futures)} record(s) to {args.topic}" + (" in one transaction" if args.transactional_id else ""), file=err)
    finally:
        producer.close(timeout=10)
    return 0
