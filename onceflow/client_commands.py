"""What the commands that talk to a broker as a client share (``topics``,
``produce``, ``consume``, ``transactions``), in the manner of kcat and
kafka-console-*: the ``--bootstrap-server`` option, short timeouts, and every
failure as one line on stderr with an exit status, never a traceback: 1 for
a refused request (unknown topic, bad name, a broker's error), 2 when the
broker cannot be reached.
"""

from __future__ import annotations

import sys
from typing import Callable

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# A command line is interactive: give up on an unreachable broker in seconds.
QUICK = {"request_timeout_ms": 5000, "retry_backoff_max_ms": 500}


class CommandError(Exception):
    """A failure the command explains itself; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_bootstrap_option(parser) -> None:
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT", help=f"a broker to start from (default {DEFAULT_BOOTSTRAP})")


def reporting_errors(name: str, args, body: Callable[[], int]) -> int:
    """Run ``body``; turn what it raises into one line on stderr and an exit status."""
    from txn.errors import ConfigError, KafkaError, RetriesExhaustedError

    try:
        return body()
    except CommandError as error:
        print(f"onceflow {name}: {error}", file=sys.stderr)
        return error.code
    except (RetriesExhaustedError, ConnectionError, OSError, TimeoutError) as error:
        print(f"onceflow {name}: cannot reach a broker at {args.bootstrap_server}: {error}", file=sys.stderr)
        return 2
    except (KafkaError, ConfigError) as error:
        print(f"onceflow {name}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def partition_count(admin, topic: str) -> int:
    """The topic's partition count, or a ``CommandError`` naming the unknown topic."""
    partitions = admin.list_topics().get(topic)
    if partitions is None:
        raise CommandError(f"unknown topic {topic!r}")
    return partitions
