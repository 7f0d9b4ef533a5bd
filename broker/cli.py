"""The ``onceflow`` command line.

    onceflow broker [--data-dir DIR] [--listen HOST:PORT] [--config KEY=VALUE ...]
    onceflow dump-log FILE... [--print-data-log]
    onceflow transactions [--bootstrap-server H:P] list|describe ID|find-hanging|abort ...
    onceflow topics create|list|describe|delete ... / produce TOPIC / consume TOPIC
    onceflow demo [--records N] [--seed S] [--keep-data DIR] [--faults N] [--storage]

Each subcommand is a thin shell over a library function; exit status 0 means
success, 1 a failed check or damaged input, 2 a usage or start-up error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from broker.config import DEFAULT_DATA_DIR, DEFAULT_HOST, DEFAULT_PORT, BrokerConfig


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, not {text!r}")
    return host or DEFAULT_HOST, int(port)


def _parse_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--config wants KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description="exactly-once streaming on a Kafka-protocol log")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("chaos", help="run a workload under a seeded fault schedule and check it (onceflow chaos --help)", add_help=False)
    commands.add_parser("bench", help="benchmark our broker beside Tansu and the machine's limits (onceflow bench --help)", add_help=False)

    broker = commands.add_parser("broker", help="run a broker")
    broker.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"where the logs live (default {DEFAULT_DATA_DIR})")
    broker.add_argument("--listen", type=_parse_listen, default=(DEFAULT_HOST, DEFAULT_PORT), help=f"HOST:PORT (default {DEFAULT_HOST}:{DEFAULT_PORT})")
    broker.add_argument("--advertise", type=_parse_listen, default=None, help="HOST:PORT put in metadata (default: --listen)")
    broker.add_argument("--config", type=_parse_property, action="append", default=[], metavar="KEY=VALUE", help="a broker or default topic setting, Kafka's names (repeatable)")

    dump = commands.add_parser("dump-log", help="print segment files like Kafka's DumpLogSegments")
    dump.add_argument("files", nargs="+")
    dump.add_argument("--print-data-log", action="store_true", help="print every record too")

    transactions = commands.add_parser("transactions", help="list, describe, find hanging, abort transactions (KIP-664)")
    transactions.add_argument("--bootstrap-server", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}")
    actions = transactions.add_subparsers(dest="action", required=True)
    actions.add_parser("list")
    describe = actions.add_parser("describe")
    describe.add_argument("transactional_id")
    hanging = actions.add_parser("find-hanging")
    hanging.add_argument("--max-age-ms", type=int, default=15 * 60 * 1000)
    abort = actions.add_parser("abort")
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True)
    abort.add_argument("--producer-id", type=int, required=True)
    abort.add_argument("--producer-epoch", type=int, required=True)
    abort.add_argument("--coordinator-epoch", type=int, default=0)

    from txn.console import add_commands

    add_commands(commands)
    demo = commands.add_parser("demo", help="the main job: see onceflow work end to end")
    demo.add_argument("--records", type=int, default=20_000)
    demo.add_argument("--seed", type=int, default=None)
    demo.add_argument("--keep-data", default=None, metavar="DIR", help="keep the data directory here")
    demo.add_argument("--faults", type=int, default=6, help="how many kills of the pipeline or the broker (default 6)")
    demo.add_argument("--storage", action="store_true", help="the storage crash demo instead: one log, its writer killed, its tail torn")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["chaos"]:
        # The fault harness has its own options (faults.chaos).
        from faults.chaos import main as chaos_main

        return chaos_main(argv[1:])
    if argv[:1] == ["bench"]:
        from benchmarks.suite import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command == "broker":
        return run_broker(args)
    if args.command == "dump-log":
        from broker.dump_log import dump

        return dump(args.files, print_data_log=args.print_data_log)
    if args.command == "transactions":
        from broker import txn_tools

        try:
            if args.action == "list":
                return txn_tools.list_transactions(args.bootstrap_server)
            if args.action == "describe":
                return txn_tools.describe_transaction(args.bootstrap_server, args.transactional_id)
            if args.action == "find-hanging":
                return txn_tools.find_hanging(args.bootstrap_server, max_age_ms=args.max_age_ms)
            return txn_tools.abort_transaction(
                args.bootstrap_server, args.topic, args.partition, args.producer_id, args.producer_epoch, args.coordinator_epoch
            )
        except (OSError, ConnectionError) as error:
            print(f"onceflow transactions: cannot reach {args.bootstrap_server}: {error}", file=sys.stderr)
            return 2
    if args.command in ("topics", "produce", "consume"):
        from txn.console import run as run_console

        return run_console(args)
    if args.command == "demo":
        if args.storage:
            from broker.demo import run_demo

            return run_demo(records=args.records, seed=args.seed, keep_data=args.keep_data)
        from faults.demo import run_pipeline_demo

        return run_pipeline_demo(records=args.records, seed=args.seed, keep_data=args.keep_data, faults=args.faults)
    return 2


def run_broker(args) -> int:
    from broker.broker import Broker, DataDirError

    host, port = args.listen
    fields = {"data_dir": args.data_dir, "host": host, "port": port}
    if args.advertise:
        fields["advertised_host"], fields["advertised_port"] = args.advertise
    try:
        config = BrokerConfig.from_properties(dict(args.config), **fields)
        from broker.storage_adapter import validate_log_properties

        validate_log_properties(config.log_defaults)
    except (ValueError, TypeError) as error:
        print(f"onceflow broker: bad configuration: {error}", file=sys.stderr)
        return 2

    async def serve() -> int:
        broker = Broker(config)
        try:
            await broker.start()
        except DataDirError as error:
            print(f"onceflow broker: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"onceflow broker: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        print(f"onceflow broker ready on {config.host}:{broker.port}", flush=True)
        try:
            await stop.wait()
        finally:
            await broker.stop()
            logging.getLogger("onceflow").info("broker stopped cleanly")
        return 0

    return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
