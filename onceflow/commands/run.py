"""``onceflow run path/to/app.py``: run a streaming app module until SIGTERM or
SIGINT, with a progress line (``streaming.cli`` holds the logic and the
exit statuses)."""

from __future__ import annotations


def add_arguments(parser) -> None:
    from streaming.cli import add_arguments as add_run_arguments

    add_run_arguments(parser)


def run(args) -> int:
    from streaming.cli import run as run_app

    return run_app(args)
