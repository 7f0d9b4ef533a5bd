"""Reference pages generated from the code at build time (a MkDocs hook), so
they cannot drift from it.

- ``reference/cli.md`` holds the marker ``<!-- onceflow help -->``, replaced
  by the ``--help`` of ``onceflow`` and of every command and subcommand, in
  the order of ``onceflow.cli.COMMANDS``. The text is argparse's own,
  formatted at a fixed width so that the page does not depend on the
  terminal that builds it.
- ``reference/configuration.md`` holds ``<!-- onceflow configuration -->``,
  replaced by every broker and topic setting with its default, read from
  ``broker.config.BrokerConfig`` and ``storage.config.LogConfig``.
"""

from __future__ import annotations

import argparse
import os

import attrs

WIDTH = "100"
DAY_MS = 24 * 3600 * 1000
UNLIMITED = 2**31 - 1  # broker.config.UNLIMITED


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse offers no public way to walk its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(level: int, title: str, parser: argparse.ArgumentParser) -> list[str]:
    help_text = parser.format_help().rstrip()  # imports the command's module first (onceflow.cli)
    lines = [f"{'#' * level} `{title}`", "", "```text", help_text, "```", ""]
    for name, sub in _subcommands(parser).items():
        lines += _section(level + 1, f"{title} {name}", sub)
    return lines


def command_reference() -> str:
    """The Markdown of every command's help, from ``onceflow`` down."""
    from onceflow.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        lines = ["## `onceflow`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, command in _subcommands(parser).items():
            lines += _section(3, f"onceflow {name}", command)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(lines)


def _shown(value) -> str:
    if isinstance(value, attrs.Factory):
        value = value.factory()
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, frozenset)):
        return ",".join(sorted(value)) if value else "(none)"
    if isinstance(value, int) and value >= DAY_MS and value % DAY_MS == 0:
        days = value // DAY_MS
        return f"{value} ({days} day{'s' if days > 1 else ''})"
    if value == UNLIMITED:
        return "unlimited"
    return "(none)" if value in (None, "") else str(value)


# Broker settings read by BrokerConfig.from_properties outside its tables of
# integer and boolean settings: the field that holds each (None: described).
_OTHER_BROKER_SETTINGS = {
    "listeners": "one PLAINTEXT listener on `--listen` (127.0.0.1:9092)",
    "advertised.listeners": "each listener's own address",
    "listener.security.protocol.map": "the listener names are the security protocols",
    "sasl.enabled.mechanisms": "sasl_enabled_mechanisms",
    "ssl.client.auth": "ssl_client_auth",
    "authorizer.class.name": "(none: nothing is checked); `acl`",
    "super.users": "super_users",
    "log.dirs": "`--data-dir` (./onceflow-data)",
    "cluster.id": "generated once per data directory",
    "event.loop": "`uvloop` where installed and no listener uses TLS, else `asyncio` (onceflow's own: the loop `onceflow broker` runs on)",
}


def configuration_reference() -> str:
    """Every broker setting and every topic setting, with its default."""
    from broker import config as broker_config
    from storage import config as log_config

    fields = {field.name: field.default for field in attrs.fields(broker_config.BrokerConfig)}
    rows = {name: _shown(fields[field]) for name, field in {**broker_config._INT_SETTINGS, **broker_config._BOOL_SETTINGS}.items()}
    for name, field in _OTHER_BROKER_SETTINGS.items():
        rows[name] = _shown(fields[field]) if field in fields else field
    lines = ["### Broker settings", "", "| setting | default |", "| --- | --- |"]
    lines += [f"| `{name}` | {default} |" for name, default in sorted(rows.items())]
    lines += ["", "Any topic setting below, given to the broker (optionally with a `log.` prefix), is the default for new topics.", ""]
    lines += ["### Topic settings", "", "| setting | default |", "| --- | --- |"]
    lines += [f"| `{name}` | {_shown(int(value)) if value.lstrip('-').isdigit() else value} |" for name, value in sorted(log_config.LogConfig().to_properties().items())]
    lines += ["", "Accepted for compatibility and ignored: "
              + ", ".join(f"`{name}`" for name in sorted(log_config._IGNORED)) + ".", ""]
    return "\n".join(lines)


def api_reference() -> str:
    """Every Kafka API the broker serves, with the versions ApiVersions advertises."""
    from broker.apis import SUPPORTED_APIS

    lines = ["| API | key | versions |", "| --- | --- | --- |"]
    for key, (low, high) in sorted(SUPPORTED_APIS.items()):
        name = "".join(part.capitalize() for part in key.name.split("_"))  # Kafka's names: EndTxn, ...
        lines.append(f"| {name} | {int(key)} | {low}-{high} |" if low != high else f"| {name} | {int(key)} | {low} |")
    return "\n".join(lines) + "\n"


GENERATED = {
    "reference/cli.md": ("<!-- onceflow help -->", command_reference),
    "reference/configuration.md": ("<!-- onceflow configuration -->", configuration_reference),
    "reference/protocol.md": ("<!-- onceflow apis -->", api_reference),
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri not in GENERATED:
        return markdown
    marker, generate = GENERATED[page.file.src_uri]
    if marker not in markdown:
        raise ValueError(f"{page.file.src_uri} lost its marker {marker}: the generated reference has nowhere to go")
    return markdown.replace(marker, generate())
