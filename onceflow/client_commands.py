"""What the commands that talk to a broker as a client share (``topics``,
``produce``, ``consume``, ``transactions``), in the manner of kcat and
kafka-console-*: the ``--bootstrap-server`` option, the security options,
short timeouts, and every failure as one line on stderr with an exit
status, never a traceback: 1 for a refused request (unknown topic, bad name,
a broker's error, a refused login), 2 when the broker cannot be reached.

Security: ``--command-config FILE`` reads Kafka client properties as Kafka's
tools do (``security.protocol=SASL_SSL``, ``sasl.mechanism=SCRAM-SHA-512``,
``sasl.username``/``sasl.password`` or ``sasl.jaas.config``,
``ssl.ca.location`` or ``ssl.truststore.location``, ...), and the flags
``--security-protocol``, ``--sasl-mechanism``, ``--sasl-username``,
``--sasl-password``, ``--ssl-cafile``, ``--ssl-certfile``, ``--ssl-keyfile``
override it. A password can also come from ``ONCEFLOW_SASL_PASSWORD`` (a
flag shows in ``ps``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# A command line is interactive: give up on an unreachable broker in seconds.
QUICK = {"request_timeout_ms": 5000, "retry_backoff_max_ms": 500}


class CommandError(Exception):
    """A failure the command explains itself; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


PASSWORD_VARIABLE = "ONCEFLOW_SASL_PASSWORD"
# flag (argparse dest) -> the Kafka property it sets
SECURITY_FLAGS = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}


def add_bootstrap_option(parser) -> None:
    parser.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT", help=f"a broker to start from (default {DEFAULT_BOOTSTRAP})")
    add_security_options(parser)


def add_security_options(parser) -> None:
    group = parser.add_argument_group("security", "how to reach a broker that wants TLS or SASL (Kafka's client settings)")
    group.add_argument("--command-config", metavar="FILE", help="a properties file of Kafka client settings (security.protocol=SASL_SSL, sasl.mechanism=..., sasl.username=..., ssl.ca.location=...), as Kafka's tools take")
    group.add_argument("--security-protocol", type=str.upper, choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), help="default PLAINTEXT")
    group.add_argument("--sasl-mechanism", type=str.upper, choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), help="default PLAIN")
    group.add_argument("--sasl-username", metavar="USER", help="the SASL user (SASL_PLAINTEXT, SASL_SSL)")
    group.add_argument("--sasl-password", metavar="PASSWORD", help=f"its password (or the environment variable {PASSWORD_VARIABLE})")
    group.add_argument("--ssl-cafile", metavar="PEM", help="the CA certificates to trust (default: the system's)")
    group.add_argument("--ssl-certfile", metavar="PEM", help="a client certificate, for brokers that ask for one")
    group.add_argument("--ssl-keyfile", metavar="PEM", help="its private key")


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file's ``key=value`` (or ``key: value``) lines;
    ``#`` and ``!`` start comments."""
    from protocol.properties import parse_properties

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise CommandError(f"cannot read --command-config {path}: {error.strerror or error}") from None
    try:
        return parse_properties(text, source=path)
    except ValueError as error:
        raise CommandError(str(error)) from None


def security_options(args) -> dict[str, str]:
    """The security settings the command line gives (file, then flags, then
    the password variable), as Kafka properties."""
    import attrs

    from txn.config import CommonConfig
    from txn.security import is_security_option

    options: dict[str, str] = {}
    if getattr(args, "command_config", None):
        common = {field.name for field in attrs.fields(CommonConfig)}
        for key, value in read_properties(args.command_config).items():
            if not is_security_option(key) and key.replace(".", "_") not in common:
                raise CommandError(f"{args.command_config}: {key} is not a client setting these commands take (security, client.id, timeouts)")
            options[key] = value
    for flag, name in SECURITY_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            options[name] = value
    if "sasl.password" not in options and os.environ.get(PASSWORD_VARIABLE):
        options["sasl.password"] = os.environ[PASSWORD_VARIABLE]
    return options


def client_options(args) -> dict:
    """What every client a command opens is built with: short timeouts and the security settings."""
    return {**QUICK, **security_options(args)}



def reporting_errors(name: str, args, body: Callable[[], int]) -> int:
    """Run ``body``; turn what it raises into one line on stderr and an exit status."""
    from txn.errors import TRANSIENT_ERRORS, ConfigError, KafkaError

    try:
        return body()
    except CommandError as error:
        print(f"onceflow {name}: {error}", file=sys.stderr)
        return error.code
    except TRANSIENT_ERRORS as error:
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
