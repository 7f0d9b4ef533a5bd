"""How onceflow's processes write their logs: one line per event, as text
(the default, for people) or as JSON objects (``--log-format json``, for
machines), on stderr.

A JSON line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``,
``logger``, ``message`` and every structured field the call passed with
``extra=`` (``log.debug("...", extra={"transactional_id": tid})`` gives
``"transactional_id": "..."``); an exception is one escaped string field,
``exception``, never a traceback over many lines. A text line is
``TIME LEVEL LOGGER: MESSAGE key=value ...`` with newlines inside the
message or the exception escaped as ``\\n``, so that the text form, too, is
one line per event.

``configure()`` is the one setup (``onceflow.cli`` calls it before any
command runs, so ``onceflow broker`` and every other command log alike);
it also routes Python warnings and uncaught exceptions, in the main thread
and in others, through the same lines. ``announce()`` writes a line a
program reads from a command's stdout (the broker's ready line) in the
chosen format.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
from typing import TextIO

FORMATS = ("text", "json")

# What every LogRecord carries; anything else on a record came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}

_chosen_format = "text"


def structured_fields(record: logging.LogRecord) -> dict:
    """The fields a call passed with ``extra=``, in the order given."""
    return {key: value for key, value in record.__dict__.items() if key not in _RECORD_ATTRIBUTES and not key.startswith("_")}


def _plain(value):
    """A field's value as JSON can hold it: containers kept, enums by name, the rest as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(item) for item in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    name = getattr(value, "name", None)
    if isinstance(name, str) and hasattr(type(value), "__members__"):
        return name  # an enum member
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (``ensure_ascii``: no raw line separator of
    any kind can reach the output)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        event = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in structured_fields(record).items():
            event.setdefault(key, _plain(value))
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return json.dumps(event)


def _one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE key=value ...``, one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record)} {record.levelname} {record.name}: {_one_line(record.getMessage())}"
        for key, value in structured_fields(record).items():
            line += f" {key}={_text_value(_plain(value))}"
        if record.exc_info:
            line += " exception=" + json.dumps(self.formatException(record.exc_info))
        if record.stack_info:
            line += " stack=" + json.dumps(self.formatStack(record.stack_info))
        return line


def _text_value(value) -> str:
    """A field's value as it reads best after ``key=``: bare when it is a
    number or a word, quoted (JSON) when it has spaces, quotes or is empty."""
    if isinstance(value, (bool, int, float)) or value is None:
        return json.dumps(value)
    if isinstance(value, str) and value and not any(c in value for c in ' "=\\\n\r'):
        return value
    return json.dumps(value)


class _OurHandler(logging.StreamHandler):
    """The handler ``configure`` installs: its stream, or the ``sys.stderr``
    of the moment (which tests and daemonising programs replace)."""

    def __init__(self, stream: TextIO | None):
        super().__init__(stream if stream is not None else sys.stderr)
        self._follow_stderr = stream is None

    @property
    def stream(self):
        return sys.stderr if self._follow_stderr else self._stream

    @stream.setter
    def stream(self, value) -> None:
        self._stream = value


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")


def configure(level: str = "INFO", log_format: str = "text", stream: TextIO | None = None) -> None:
    """Send every logger's records to ``stream`` (default: stderr, whatever
    ``sys.stderr`` is when a line is written), one line each, in
    ``log_format``; Python warnings and uncaught exceptions too.

    As ``logging.basicConfig`` does, this leaves alone a program that
    configured logging itself (handlers on the root logger that are not
    ours: an application embedding a command, pytest), unless it names a
    ``stream``; calling it again replaces what it installed before."""
    global _chosen_format
    _chosen_format = log_format
    root = logging.getLogger()
    ours = [handler for handler in root.handlers if isinstance(handler, _OurHandler)]
    if stream is None and len(ours) < len(root.handlers):
        return
    for handler in ours:
        root.removeHandler(handler)
    handler = _OurHandler(stream)
    handler.setFormatter(formatter(log_format))
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)

    def log_uncaught(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, traceback)
            return
        logging.getLogger("onceflow").critical("uncaught exception: %s", value, exc_info=(kind, value, traceback))

    def log_uncaught_in_thread(hook_args) -> None:
        if hook_args.exc_type is SystemExit:
            return
        logging.getLogger("onceflow").critical(
            "uncaught exception in thread %s: %s", getattr(hook_args.thread, "name", "?"), hook_args.exc_value,
            exc_info=(hook_args.exc_type, hook_args.exc_value, hook_args.exc_traceback),
        )

    sys.excepthook = log_uncaught
    threading.excepthook = log_uncaught_in_thread


def announce(message: str, stream: TextIO | None = None, *, level: int = logging.INFO, **fields) -> None:
    """Write ``message`` as one line for a program or a person reading this
    process's stdout (or ``stream``: a command's one-line error on stderr):
    the message itself in the text format, a JSON object (with ``fields``)
    in the JSON format."""
    stream = stream if stream is not None else sys.stdout
    if _chosen_format == "json":
        record = logging.LogRecord("onceflow", level, __file__, 0, message, (), None)
        record.__dict__.update(fields)
        stream.write(JsonFormatter().format(record) + "\n")
    else:
        stream.write(message + "\n")
    stream.flush()
