"""Shared fixtures: brokers in-process and as real child processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

try:  # Import hypothesis's lazily loaded parts now, before tests start threads:
    # CPython 3.11.7 can fail parsing ("AST constructor recursion depth
    # mismatch") when another thread compiles at the same time (gh-106905).
    import hypothesis.internal.lambda_sources  # noqa: F401
except ImportError:
    pass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"onceflow broker ready on (\S+):(\d+)")


class BrokerProcess:
    """``onceflow broker`` as a child process on an ephemeral port."""

    def __init__(self, data_dir: str, *config: str, port: int = 0, env: dict | None = None):
        self.data_dir = data_dir
        self.config = config
        self.port = port
        self.env = env
        self.process: subprocess.Popen | None = None
        self.log_path = os.path.join(os.path.dirname(data_dir.rstrip("/")), os.path.basename(data_dir.rstrip("/")) + ".broker.log")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "BrokerProcess":
        command = [sys.executable, "-m", "broker.cli", "broker", "--data-dir", self.data_dir, "--listen", f"127.0.0.1:{self.port}"]
        for item in self.config:
            command += ["--config", item]
        log_file = open(self.log_path, "ab")
        environment = dict(os.environ)
        environment.pop("ONCEFLOW_CRASH_POINTS", None)
        environment.update(self.env or {})
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=log_file, text=True, env=environment)
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                if self.process.poll() is not None:
                    raise RuntimeError(f"broker exited with {self.process.returncode}: {self.read_log()[-2000:]}")
                continue
            match = READY.search(line)
            if match:
                self.port = int(match.group(2))
                return self
        self.kill()
        raise TimeoutError("broker did not become ready")

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as file:
                return file.read()
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no flush, no clean-shutdown marker."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def terminate(self) -> int:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            return self.process.wait(60)
        return self.process.returncode if self.process else 0

    def restart(self, *, clean: bool, env: dict | None = None) -> "BrokerProcess":
        if clean:
            assert self.terminate() == 0, self.read_log()[-2000:]
        else:
            self.kill()
        self.env = env
        return self.start()

    def wait_exit(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)


@pytest.fixture
def broker_process(tmp_path):
    brokers = []

    def make(*config: str, env: dict | None = None) -> BrokerProcess:
        broker = BrokerProcess(str(tmp_path / f"broker{len(brokers)}"), "group.initial.rebalance.delay.ms=0", *config, env=env)
        brokers.append(broker)
        return broker.start()

    yield make
    for broker in brokers:
        broker.kill()


@pytest.fixture
def embedded_broker(tmp_path):
    from broker.broker import EmbeddedBroker

    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as broker:
        yield broker
