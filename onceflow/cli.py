"""The ``onceflow`` command line: the global options, the table of commands,
and the one dispatch.

    onceflow [--log-level LEVEL] [--log-format text|json] COMMAND [options]
                                                        (or python -m onceflow ...)

Each command is a module of ``onceflow.commands`` offering
``add_arguments(parser)`` and ``run(args) -> int``. A command's module is
imported only when that command is chosen (its options are added the first
time its parser parses or prints help), so ``onceflow --help`` and
``onceflow topics list`` load neither Spark nor the fault harness nor the
benchmarks. Adding a command is one module plus one row of ``COMMANDS``.

The global options are parsed once, before the command's, and reach every
command (logging is configured before ``run``, by ``onceflow.logs``: one
line per event, text or JSON objects). Exit status: 0 success, 1 a
failed check, a refused request or damaged input, 2 a usage or start-up
error (argparse's usage errors included).

``onceflow --version`` prints the installed package's version, read from its
metadata only when asked (``importlib.metadata`` is not imported otherwise:
a broker's start stays lean, tests/onceflow/test_broker_imports.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

import attrs


@attrs.frozen
class Command:
    name: str
    module: str
    summary: str  # the line `onceflow --help` shows, known without importing the module


COMMANDS = (
    Command("broker", "onceflow.commands.broker", "run a broker"),
    Command("topics", "onceflow.commands.topics", "create, list, describe or delete topics"),
    Command("produce", "onceflow.commands.produce", "send lines from stdin as records"),
    Command("consume", "onceflow.commands.consume", "print records of a topic"),
    Command("transactions", "onceflow.commands.transactions", "list, describe, find hanging, abort transactions (KIP-664)"),
    Command("users", "onceflow.commands.users", "add, delete or list the users SASL clients log in as (offline or KIP-554)"),
    Command("acls", "onceflow.commands.acls", "add, list or remove ACLs (kafka-acls' options), on a running broker or offline"),
    Command("status", "onceflow.commands.status", "one screen: topics with end offsets and LSO, groups with members and lag, open and hanging transactions"),
    Command("dump-log", "onceflow.commands.dump_log", "print segment files like Kafka's DumpLogSegments"),
    Command("run", "onceflow.commands.run", "run a streaming app module (exactly-once processors with state stores)"),
    Command("demo", "onceflow.commands.demo", "see onceflow work end to end: a stateful exactly-once pipeline under kills"),
    Command("spark-cluster", "onceflow.commands.spark_cluster", "start or stop a Spark standalone cluster on this machine (from the pyspark wheel)"),
    Command("chaos", "onceflow.commands.chaos", "run a workload under a seeded fault schedule and check it"),
    Command("bench", "onceflow.commands.bench", "benchmark our broker beside Tansu and the machine's limits (needs a checkout)"),
    Command("spark", "onceflow.commands.spark", "finish an exactly-once Spark sink's decided batch without Spark (after its driver died)"),
)
COMMANDS_BY_NAME = {command.name: command for command in COMMANDS}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")  # onceflow.logs.FORMATS, known without importing it


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def installed_version() -> str:
    """The version pip installed (the package metadata, from pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onceflow")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the checkout)"


class _VersionAction(argparse.Action):
    """``--version``, reading the version only when the option is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help="print the installed version and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"onceflow {installed_version()}")
        parser.exit()


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its options come from the command's module, which
    is imported the first time the parser parses or prints its help."""

    def __init__(self, *args, command_module: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._command_module = command_module

    def _add_command_arguments(self) -> None:
        if self._command_module is not None:
            module = importlib.import_module(self._command_module)
            self._command_module = None
            module.add_arguments(self)

    def parse_known_args(self, args=None, namespace=None):
        self._add_command_arguments()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._add_command_arguments()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_command_arguments()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onceflow", description="exactly-once streaming on a Kafka-protocol log")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL", help=f"logging level on stderr: {', '.join(LOG_LEVELS)} (default INFO)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text", help="one line per event on stderr: text (default) or json (objects with time, level, logger, message and the event's fields)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    for command in COMMANDS:
        commands.add_parser(command.name, help=command.summary, description=command.summary, command_module=command.module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from onceflow import logs

    logs.configure(args.log_level, args.log_format)
    module = importlib.import_module(COMMANDS_BY_NAME[args.command].module)
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
