"""Process faults: the broker and client programs as real child processes
the harness can SIGKILL, SIGTERM, SIGSTOP/SIGCONT and restart.

``BrokerProcess`` runs ``onceflow broker`` on a data directory and restarts
it on the same directory (and port) after any of those; ``ClientProcess``
runs any command (a workload, a user's processor) the same way. Both keep
their output in a log file next to the data, for the report.

A broker restarted on the same port must find it free. A port the kernel
picked (bind to port 0) lies in its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the ports it hands to
outgoing connections: while the broker is down, any client's new
connection may be given it, and a client reconnecting to the dead port
itself can even be connected to itself (TCP's simultaneous open, when the
kernel picks that very port as its local one). The broker listens with
SO_REUSEADDR, which covers only its old connections in TIME_WAIT. So a
broker that will be restarted listens on a port outside the ephemeral
range (``restartable_port``), which only an explicit bind can take.
"""

from __future__ import annotations

import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"onceflow broker ready on (\S+):(\d+)")
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
FIRST_UNPRIVILEGED_PORT = 1024


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (inclusive)."""
    try:
        with open(path) as file:
            low, high = (int(field) for field in file.read().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL_RANGE
    return low, high


def restartable_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None, rng: random.Random | None = None) -> int:
    """A port free on ``host`` now and outside the ephemeral range, so that
    no outgoing connection takes it while a broker on it is down (see the
    module's docstring). Random, so that parallel runs rarely meet."""
    low, high = ephemeral or ephemeral_port_range()
    rng = rng or random.Random()
    below = range(FIRST_UNPRIVILEGED_PORT, max(FIRST_UNPRIVILEGED_PORT, low))
    above = range(min(high + 1, 65536), 65536)
    if not below and not above:
        raise OSError(f"the ephemeral range {low}-{high} leaves no port for a broker")
    for _attempt in range(100):
        index = rng.randrange(len(below) + len(above))
        port = below[index] if index < len(below) else above[index - len(below)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port on {host} outside the ephemeral range {low}-{high}")


class ManagedProcess:
    """Signals for a child process, named the way the harness schedules them."""

    process: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> bool:
        if not self.alive:
            return False
        self.process.send_signal(signum)
        return True

    def kill(self) -> None:
        """SIGKILL: no flush, no clean-shutdown marker."""
        if self.signal(signal.SIGKILL):
            self.process.wait(30)

    def pause(self) -> bool:
        return self.signal(signal.SIGSTOP)

    def resume(self) -> bool:
        return self.signal(signal.SIGCONT)

    def terminate(self, timeout: float = 60) -> int:
        if self.signal(signal.SIGCONT) and self.signal(signal.SIGTERM):
            return self.process.wait(timeout)
        return self.process.returncode if self.process else 0

    def wait_exit(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)


class BrokerProcess(ManagedProcess):
    """``onceflow broker`` as a child process: the one launcher of the
    harness, the tests and the benchmarks. ``port=0`` picks a
    ``restartable_port`` once, and every restart listens on it again.

    ``checkout``: the working directory, so ``-m onceflow`` imports that
    checkout's code (a benchmark compares two); ``listeners``: a
    ``--listen`` value other than plaintext on ``port`` (then ``port`` is
    the first listener's); ``args``: more ``onceflow broker`` arguments;
    ``wrapper``: a command the broker runs under (a profiler). The ready
    line is awaited with a deadline, so a broker that never prints it (or
    hangs before it) fails the start instead of hanging the caller."""

    def __init__(
        self, data_dir: str, *config: str, port: int = 0, env: dict | None = None, log_path: str | None = None, advertise: str | None = None, log_level: str | None = None,
        checkout: str = REPO, listeners: str | None = None, args: tuple[str, ...] = (), wrapper: tuple[str, ...] = (),
    ):
        self.advertise = advertise  # HOST:PORT for metadata (a fault proxy in front), else the listener
        self.log_level = log_level  # onceflow --log-level (DEBUG logs every coordinator transition), default INFO
        self.data_dir = data_dir
        self.config = config
        self.port = port
        self.env = env
        self.checkout = checkout
        self.listeners = listeners
        self.args = tuple(args)
        self.wrapper = tuple(wrapper)
        self.process = None
        self.log_path = log_path or os.path.join(os.path.dirname(data_dir.rstrip("/")), os.path.basename(data_dir.rstrip("/")) + ".broker.log")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "BrokerProcess":
        if self.port == 0 and self.listeners is None:
            self.port = restartable_port()
        command = [*self.wrapper, sys.executable, "-m", "onceflow", *(["--log-level", self.log_level] if self.log_level else []), "broker", "--data-dir", self.data_dir]
        command += ["--listen", self.listeners or f"127.0.0.1:{self.port}", *self.args]
        if self.advertise:
            command += ["--advertise", self.advertise]
        for item in self.config:
            command += ["--config", item]
        environment = dict(os.environ)
        environment.pop("ONCEFLOW_CRASH_POINTS", None)
        for name, value in (self.env or {}).items():  # None removes a variable
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        with open(self.log_path, "ab") as log_file:
            # From the checkout's directory: ``-m onceflow`` imports that checkout's code.
            self.process = subprocess.Popen(command, cwd=self.checkout, stdout=subprocess.PIPE, stderr=log_file, env=environment)
        try:
            self.port = self._ready_port(time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            raise TimeoutError(f"the broker of {self.checkout} did not print its ready line in {timeout:g} s (see {self.log_path})") from None
        return self

    def _ready_port(self, deadline: float) -> int:
        """The port of the ready line on the broker's stdout, read without
        ever blocking past ``deadline``."""
        stdout = self.process.stdout.fileno()
        seen = b""
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if not selector.select(remaining):
                    continue
                chunk = os.read(stdout, 4096)
                if not chunk:
                    code = self.process.wait(max(0.1, deadline - time.monotonic()))
                    raise RuntimeError(f"broker exited with {code}: {self.read_log()[-2000:]}")
                seen += chunk
                match = READY.search(seen.decode("utf-8", errors="replace"))
                if match:
                    return int(match.group(2))

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as file:
                return file.read()
        except FileNotFoundError:
            return ""

    def restart(self, *, clean: bool, env: dict | None = None) -> "BrokerProcess":
        if clean:
            code = self.terminate()
            if code != 0:
                raise RuntimeError(f"clean shutdown exited {code}: {self.read_log()[-2000:]}")
        else:
            self.kill()
        self.env = env
        return self.start()


class ClientProcess(ManagedProcess):
    """Any client program, restartable with the same command line."""

    def __init__(self, name: str, command: list[str], log_path: str, env: dict | None = None):
        self.name = name
        self.command = command
        self.log_path = log_path
        self.env = env
        self.process = None
        self.starts = 0

    def start(self) -> "ClientProcess":
        environment = dict(os.environ)
        environment.update(self.env or {})
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(self.command, cwd=REPO, stdout=log_file, stderr=log_file, env=environment)
        self.starts += 1
        return self

    def restart_if_exited(self) -> bool:
        """Start it again if it died (killed or failed); a clean exit (0) is final."""
        if self.process is not None and self.process.poll() not in (None, 0):
            self.start()
            return True
        return False
