"""``onceflow run path/to/app.py`` (or ``onceflow run package.module:app``):
run a streaming app module.

The module builds an ``App`` at module level and names it ``app`` (or holds
exactly one ``App``; ``--app NAME``, or ``module:NAME``, picks another
variable). A file is loaded under the module name ``__onceflow_run__``, a
module name imported as ``python -m`` would find it (the current directory
first), so a module that ends with

    if __name__ == "__main__":
        raise SystemExit(streaming.cli.main_of(app))

runs the same way under ``python app.py`` (``main_of`` takes ``onceflow
run``'s options for the app already built, and never loads the module
again) and under ``onceflow run`` (which calls ``app.run()`` itself, with a
progress line). Where it runs comes from ``--bootstrap-servers``,
``--state-dir`` and ``--instance-id`` when given, over the module's own
settings, which default to ``ONCEFLOW_BOOTSTRAP_SERVERS`` and
``ONCEFLOW_STATE_DIR`` (``streaming.app``). Exit status: 0 after
a stop (SIGTERM, SIGINT, ``--until-idle``), 2 when a record failed with
``on_error="stop"``, 3 when the instance was fenced, 4 when its state
directory is in use, 1 for anything else (a message says what).

``add_arguments(parser)`` and ``run(args)`` are what ``onceflow run``
(``onceflow/commands/run.py``) calls; ``python -m streaming.cli`` works too.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import runpy
import sys

RUN_NAME = "__onceflow_run__"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="APP", help="a Python file, a module name or module:variable that builds a streaming.App (named app)")
    parser.add_argument("--app", default=None, help="the variable holding the App (default: app, or the only App in the module)")
    add_run_options(parser)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options that run an App already built (``onceflow run``'s, less the module)."""
    parser.add_argument("--bootstrap-servers", default=None, metavar="HOST:PORT[,...]", help="the cluster, over the app's own setting (default: the app's, or ONCEFLOW_BOOTSTRAP_SERVERS)")
    parser.add_argument("--state-dir", default=None, help="this instance's state directory, over the app's own (default: the app's, or ONCEFLOW_STATE_DIR)")
    parser.add_argument("--instance-id", default=None, help="this instance's id (default: the app's, or generated once and kept in the state directory)")
    parser.add_argument("--until-idle", type=float, default=None, metavar="SECONDS", help="stop after this long without a record (default: run until SIGTERM/SIGINT)")
    parser.add_argument("--metrics", type=_parse_address, default=None, metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics while it runs (port 0 picks a free one; the log says which)")
    parser.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS", help="seconds between progress lines on stderr (0: none)")


def _parse_address(text: str) -> tuple[str, int]:
    host, separator, port = text.rpartition(":")
    if not separator or not port.isdigit():
        raise argparse.ArgumentTypeError(f"wants HOST:PORT, not {text!r}")
    return host or "127.0.0.1", int(port)


def load_app(path: str, name: str | None = None):
    """The ``App`` a module file, or a module named ``module`` or
    ``module:variable``, builds."""
    from streaming.app import App

    if os.path.isfile(path):
        directory = os.path.dirname(os.path.abspath(path))
        if directory not in sys.path:
            sys.path.insert(0, directory)  # the module's own imports work as under `python app.py`
        namespace = runpy.run_path(path, run_name=RUN_NAME)
    else:
        module_name, _, variable = path.partition(":")
        if path.endswith(".py") or not module_name.replace(".", "").replace("_", "").isalnum():
            raise FileNotFoundError(f"no such app module: {path}")
        name = variable or name
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` finds modules
        try:
            namespace = vars(importlib.import_module(module_name))
        except ModuleNotFoundError as error:
            raise LookupError(f"no app module {module_name!r} ({error}): name a file, or a module importable from here") from error
    if name is not None:
        app = namespace.get(name)
        if not isinstance(app, App):
            raise LookupError(f"{path} defines no App named {name!r}")
        return app
    if isinstance(namespace.get("app"), App):
        return namespace["app"]
    apps = [value for value in namespace.values() if isinstance(value, App)]
    if len(apps) != 1:
        raise LookupError(f"{path} must define an App named 'app' (found {len(apps)} App objects; --app NAME picks one)")
    return apps[0]


class EarlyStop:
    """SIGTERM from the start of ``run`` until the app's own run installs
    its handlers (``Runner.run``): the app module's imports (pyarrow,
    numpy, the app's own) can take a while, and a stop asked meanwhile is a
    clean stop, not a death by the signal. Before the app is loaded it is
    remembered (``asked``: the run does not start); after, it stops the app."""

    def __init__(self):
        self.asked = False
        self.app = None

    def install(self) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.asked = True
        if self.app is not None:
            self.app.stop()


def run(args) -> int:
    early_stop = EarlyStop()
    early_stop.install()
    # onceflow's command line configures logging first (--log-level); alone, INFO.
    logging.basicConfig(level=getattr(logging, str(getattr(args, "log_level", "INFO")).upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        app = load_app(args.path, args.app)
    except (OSError, LookupError) as error:
        print(f"onceflow run: {error}", file=sys.stderr)
        return 1
    if early_stop.asked:
        print("onceflow run: stopped before it started (SIGTERM while loading the app)", file=sys.stderr)
        return 0
    early_stop.app = app
    return run_app(app, args)


def main_of(app, argv=None) -> int:
    """Run ``app`` (built by the calling module) with ``onceflow run``'s
    options from ``argv`` (default: the command line), its exit statuses
    and messages: what an app module's ``__main__`` block returns."""
    parser = argparse.ArgumentParser(description=f"Run the streaming app {app.application_id} until SIGTERM/SIGINT (as onceflow run does).")
    add_run_options(parser)
    parser.add_argument("--log-level", default="INFO", help="logging level on stderr (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return run_app(app, args)


def run_app(app, args) -> int:
    """Run an App already built, per the run options in ``args``."""
    from streaming.errors import StreamingError
    from txn.errors import ConfigError, KafkaError

    try:
        app.place(bootstrap_servers=getattr(args, "bootstrap_servers", None), state_dir=getattr(args, "state_dir", None), instance_id=getattr(args, "instance_id", None))
        # onceflow run's security flags (--security-protocol, --command-config, ...), as Kafka properties.
        app.add_client_options(getattr(args, "client_options", None) or {})
        app.run(until_idle=args.until_idle, progress_interval=args.progress_interval or None, metrics_address=getattr(args, "metrics", None))
    except StreamingError as error:
        print(f"onceflow run: {error}", file=sys.stderr)
        return error.exit_code
    except (ConfigError, KafkaError) as error:
        print(f"onceflow run: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # the metrics address cannot be bound
        print(f"onceflow run: {error}", file=sys.stderr)
        return 1
    metrics = ", ".join(f"{name} {value}" for name, value in sorted(app.metrics.items()))
    print(f"onceflow run: stopped ({metrics})", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="onceflow run", description="Run a streaming app module until SIGTERM/SIGINT.")
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="logging level on stderr (default INFO)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
