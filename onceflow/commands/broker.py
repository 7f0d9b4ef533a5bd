"""``onceflow broker``: run a broker until SIGTERM or SIGINT.

Prints ``onceflow broker ready on HOST:PORT`` once it has recovered its logs
and listens (``faults.process.BrokerProcess`` waits for that line); a bad
setting, an unusable data directory or a port it cannot bind exit 2 with
one line on stderr. With ``--metrics HOST:PORT`` it also serves Prometheus
metrics at ``http://HOST:PORT/metrics`` (``broker.metrics``) and prints
``onceflow broker metrics on http://HOST:PORT/metrics`` before the ready line.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from broker.config import DEFAULT_DATA_DIR, DEFAULT_HOST, DEFAULT_PORT


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"wants HOST:PORT, not {text!r}")
    return host or DEFAULT_HOST, int(port)


def _parse_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--config wants KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"where the logs live (default {DEFAULT_DATA_DIR})")
    parser.add_argument("--listen", type=_parse_listen, default=(DEFAULT_HOST, DEFAULT_PORT), metavar="HOST:PORT", help=f"where to listen (default {DEFAULT_HOST}:{DEFAULT_PORT}; port 0 picks a free one)")
    parser.add_argument("--advertise", type=_parse_listen, default=None, metavar="HOST:PORT", help="the address put in metadata (default: --listen)")
    parser.add_argument("--metrics", type=_parse_listen, default=None, metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one)")
    parser.add_argument("--config", type=_parse_property, action="append", default=[], metavar="KEY=VALUE", help="a broker or default topic setting, Kafka's names (repeatable)")


def run(args) -> int:
    from broker.broker import Broker, DataDirError
    from broker.config import BrokerConfig
    from broker.metrics import MetricsListenError
    from broker.storage_adapter import validate_log_properties
    from onceflow import logs

    host, port = args.listen
    fields = {"data_dir": args.data_dir, "host": host, "port": port}
    if args.advertise:
        fields["advertised_host"], fields["advertised_port"] = args.advertise
    try:
        config = BrokerConfig.from_properties(dict(args.config), **fields)
        validate_log_properties(config.log_defaults)
    except (ValueError, TypeError) as error:
        print(f"onceflow broker: bad configuration: {error}", file=sys.stderr)
        return 2

    async def serve() -> int:
        broker = Broker(config, metrics_address=args.metrics)
        try:
            await broker.start()
        except DataDirError as error:
            print(f"onceflow broker: {error}", file=sys.stderr)
            return 2
        except MetricsListenError as error:
            print(f"onceflow broker: {error.strerror}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"onceflow broker: cannot listen on {host}:{port}: {error.strerror or error}", file=sys.stderr)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if args.metrics is not None:
            logs.announce(f"onceflow broker metrics on http://{args.metrics[0]}:{broker.metrics_port}/metrics", metrics_port=broker.metrics_port)
        # In the JSON log format this line is a JSON object too; its message
        # still holds the words faults.process.READY looks for.
        logs.announce(f"onceflow broker ready on {config.host}:{broker.port}", host=config.host, port=broker.port, data_dir=config.data_dir)
        try:
            await stop.wait()
        finally:
            await broker.stop()
            logging.getLogger("onceflow").info("broker stopped cleanly")
        return 0

    return asyncio.run(serve())
