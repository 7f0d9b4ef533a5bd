"""``onceflow broker``: run a broker until SIGTERM or SIGINT.

Prints ``onceflow broker ready on HOST:PORT (event loop NAME)`` (the first
listener) once it has recovered its logs and listens
(``faults.process.BrokerProcess`` waits for that line). It runs on uvloop
where installed, asyncio's own loop otherwise, or the loop that
``--config event.loop=uvloop|asyncio`` names (``protocol.event_loop``);
a bad setting, an unusable data directory or a port it cannot
bind exit 2 with one line on stderr. With ``--metrics HOST:PORT`` it also serves Prometheus
metrics at ``http://HOST:PORT/metrics`` (``broker.metrics``) and prints
``onceflow broker metrics on http://HOST:PORT/metrics`` before the ready line.

``--listen`` takes one ``HOST:PORT`` (a PLAINTEXT listener) or Kafka's
listeners list, ``PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093``
(``--config listener.security.protocol.map=INTERNAL:PLAINTEXT,...`` names
custom listeners); ``--advertise`` likewise (one ``HOST:PORT`` is the first
listener's advertised address).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from broker.config import (
    DEFAULT_DATA_DIR,
    DEFAULT_HOST,
    DEFAULT_PORT,
    SASL_MECHANISMS,
    SSL_CLIENT_AUTH,
)


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"wants HOST:PORT, not {text!r}")
    return host or DEFAULT_HOST, int(port)


def _parse_listeners(text: str) -> str | tuple[str, int]:
    """A listeners list stays text (parsed with the other listener settings);
    one ``HOST:PORT`` is the single PLAINTEXT listener, as always."""
    if "://" in text:
        from broker.security.listeners import ListenerError, parse_listeners

        try:
            if _only_protocols(text):  # custom names wait for --config's protocol map
                parse_listeners(text)
        except ListenerError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text
    return _parse_listen(text)


def _only_protocols(text: str) -> bool:
    from broker.security.listeners import SECURITY_PROTOCOLS

    return all(part.split("://", 1)[0].strip().upper() in SECURITY_PROTOCOLS for part in text.split(",") if part.strip())


def _parse_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--config wants KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"where the logs live (default {DEFAULT_DATA_DIR})")
    parser.add_argument(
        "--listen", type=_parse_listeners, default=(DEFAULT_HOST, DEFAULT_PORT), metavar="LISTENERS",
        help=f"HOST:PORT, or listeners Kafka style: PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093 "
        f"(also SSL, SASL_PLAINTEXT; default {DEFAULT_HOST}:{DEFAULT_PORT}; port 0 picks a free one)",
    )
    parser.add_argument("--advertise", type=_parse_listeners, default=None, metavar="ADDRESSES", help="the address put in metadata: HOST:PORT for the first listener, or NAME://HOST:PORT,... per listener (default: where each listens)")
    parser.add_argument("--ssl-certfile", default=None, metavar="PEM", help="the broker's certificate (chain) for SSL and SASL_SSL listeners")
    parser.add_argument("--ssl-keyfile", default=None, metavar="PEM", help="its private key (default: in --ssl-certfile)")
    parser.add_argument("--ssl-cafile", default=None, metavar="PEM", help="CAs that client certificates are checked against")
    parser.add_argument("--ssl-client-auth", choices=SSL_CLIENT_AUTH, default=None, help="ask clients for a certificate: none (default), requested, required")
    parser.add_argument("--sasl-mechanisms", default=None, metavar="LIST", help=f"SASL mechanisms enabled, comma separated (default {','.join(SASL_MECHANISMS)})")
    parser.add_argument("--metrics", type=_parse_listen, default=None, metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one)")
    parser.add_argument("--config", type=_parse_property, action="append", default=[], metavar="KEY=VALUE", help="a broker or default topic setting, Kafka's names (repeatable)")


def run(args) -> int:
    from broker.config import BrokerConfig
    from onceflow import logs
    from protocol.tasks import listening_socket

    properties = dict(args.config)
    fields = {"data_dir": args.data_dir}
    if isinstance(args.listen, str):
        properties["listeners"] = args.listen
    else:
        fields["host"], fields["port"] = args.listen
    if isinstance(args.advertise, str):
        properties["advertised.listeners"] = args.advertise
    elif args.advertise:
        fields["advertised_host"], fields["advertised_port"] = args.advertise
    for option, field in (("ssl_certfile", "ssl_certfile"), ("ssl_keyfile", "ssl_keyfile"), ("ssl_cafile", "ssl_cafile"), ("ssl_client_auth", "ssl_client_auth")):
        if getattr(args, option) is not None:
            fields[field] = getattr(args, option)
    if args.sasl_mechanisms is not None:
        properties["sasl.enabled.mechanisms"] = args.sasl_mechanisms
    try:
        config = BrokerConfig.from_properties(properties, **fields)
    except (ValueError, TypeError) as error:
        logs.announce(f"onceflow broker: bad configuration: {error}", sys.stderr, level=logging.ERROR)
        return 2
    # Listening before the broker's own imports and its recovery (seconds on
    # a loaded machine): a client reconnecting after a restart is connected
    # and waits for the broker to be ready instead of being refused, and a
    # refused librdkafka client doubles its reconnect back-off each time.
    listening = {}
    try:
        for listener in config.effective_listeners:
            bound = listening_socket(listener.host, listener.port)
            if bound is not None:
                listening[listener.name] = bound
    except OSError as error:
        for bound in listening.values():
            bound.close()
        where = ", ".join(str(listener) for listener in config.effective_listeners)
        logs.announce(f"onceflow broker: cannot listen on {where}: {error.strerror or error}", sys.stderr, level=logging.ERROR)
        return 2
    try:
        return _run(args, config, listening)
    finally:
        for bound in listening.values():
            bound.close()  # a no-op for those the broker served (it closed them)


def _run(args, config, listening: dict) -> int:
    from broker.broker import Broker, DataDirError
    from broker.security.tls import TlsConfigError
    from broker.storage_adapter import validate_log_properties
    from onceflow import logs
    from protocol.allocator import keep_freed_buffers
    from protocol.event_loop import loop_factory, running_event_loop
    from protocol.metrics_http import MetricsListenError

    keep_freed_buffers()  # frames and fetches of a MiB reuse freed memory (protocol.allocator)

    try:
        validate_log_properties(config.log_defaults)
    except (ValueError, TypeError) as error:
        logs.announce(f"onceflow broker: bad configuration: {error}", sys.stderr, level=logging.ERROR)
        return 2

    async def serve() -> int:
        event_loop = running_event_loop()
        logging.getLogger("onceflow").info("broker process on the %s event loop", event_loop, extra={"event_loop": event_loop})
        broker = Broker(config, metrics_address=args.metrics, listening=listening)
        try:
            await broker.start()
        except DataDirError as error:
            logs.announce(f"onceflow broker: {error}", sys.stderr, level=logging.ERROR)
            return 2
        except TlsConfigError as error:
            logs.announce(f"onceflow broker: bad configuration: {error}", sys.stderr, level=logging.ERROR)
            return 2
        except MetricsListenError as error:
            logs.announce(f"onceflow broker: {error.strerror}", sys.stderr, level=logging.ERROR)
            return 2
        except OSError as error:
            where = ", ".join(str(listener) for listener in config.effective_listeners)
            logs.announce(f"onceflow broker: cannot listen on {where}: {error.strerror or error}", sys.stderr, level=logging.ERROR)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if args.metrics is not None:
            logs.announce(f"onceflow broker metrics on http://{args.metrics[0]}:{broker.metrics_port}/metrics", metrics_port=broker.metrics_port)
        # In the JSON log format this line is a JSON object too; its message
        # still holds the words faults.process.READY looks for.
        logs.announce(
            f"onceflow broker ready on {config.host}:{broker.port} (event loop {event_loop})",
            host=config.host, port=broker.port, data_dir=config.data_dir, event_loop=event_loop,
        )
        try:
            await stop.wait()
        finally:
            await broker.stop()
            logging.getLogger("onceflow").info("broker stopped cleanly")
        return 0

    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        return runner.run(serve())
