"""``onceflow run path/to/app.py``: run a streaming app module until SIGTERM or
SIGINT, with a progress line (``streaming.cli`` holds the logic and the
exit statuses). The security options (``--security-protocol``,
``--command-config FILE``, ...) are those of the other client commands and
apply to every client the app opens."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    from onceflow.client_commands import add_security_options
    from streaming.cli import add_arguments as add_run_arguments

    add_run_arguments(parser)
    add_security_options(parser)


def run(args) -> int:
    from onceflow.client_commands import CommandError, security_options
    from streaming.cli import run as run_app

    try:
        args.client_options = security_options(args)  # over what the app module sets
    except CommandError as error:
        print(f"onceflow run: {error}", file=sys.stderr)
        return 1
    return run_app(args)
