"""faults.process: a broker that will be restarted listens on a port no
outgoing connection can be given meanwhile (outside the kernel's ephemeral
range), and keeps it across restarts."""

from __future__ import annotations

import random
import socket
import time

import pytest

from faults.process import LINUX_DEFAULT_EPHEMERAL_RANGE, BrokerProcess, ephemeral_port_range, restartable_port
from protocol.messages import ApiKey
from tests.helpers import raw_request


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t50000\n")
    assert ephemeral_port_range(str(range_file)) == (40000, 50000)
    range_file.write_text("garbage\n")
    assert ephemeral_port_range(str(range_file)) == LINUX_DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_port_range(str(tmp_path / "missing")) == LINUX_DEFAULT_EPHEMERAL_RANGE


def test_the_chosen_port_is_outside_the_ephemeral_range_and_free():
    low, high = ephemeral_port_range()
    rng = random.Random(7)
    for _ in range(50):
        port = restartable_port(rng=rng)
        assert 1024 <= port <= 65535 and not low <= port <= high
        with socket.socket() as listener:  # free: a broker can bind it
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
    # A range that leaves only a handful of ports: one of them, never one inside.
    chosen = {restartable_port(ephemeral=(1030, 65530), rng=rng) for _ in range(40)}
    assert chosen and chosen <= set(range(1024, 1030)) | set(range(65531, 65536))


def test_a_taken_port_is_never_chosen():
    # A range that leaves two ports outside it, 65534 and 65535; take one.
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 65534))
        except OSError:
            pytest.skip("port 65534 is in use on this machine")
        taken.listen()
        chosen = {restartable_port(ephemeral=(1024, 65533)) for _ in range(20)}
    assert chosen == {65535}


def test_a_broker_process_keeps_its_restartable_port_across_a_kill(broker_process):
    broker = broker_process()
    low, high = ephemeral_port_range()
    port = broker.port
    assert not low <= port <= high
    broker.restart(clean=False)
    assert broker.port == port
    assert raw_request(port, ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})["error_code"] == 0


def test_a_broker_that_never_prints_its_ready_line_fails_the_start_in_time(tmp_path):
    """The ready line is awaited with a deadline: a checkout whose broker
    hangs silently (here one that sleeps a minute) fails the start after
    ``timeout``, and the process is killed, instead of hanging the caller."""
    silent = tmp_path / "silent-checkout"
    (silent / "onceflow").mkdir(parents=True)
    (silent / "onceflow" / "__init__.py").write_text("")
    (silent / "onceflow" / "__main__.py").write_text("import sys, time\nprint('starting', flush=True)\ntime.sleep(60)\n")
    broker = BrokerProcess(str(tmp_path / "data"), checkout=str(silent))
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="did not print its ready line in 2 s"):
        broker.start(timeout=2)
    assert time.monotonic() - began < 20
    assert not broker.alive


def test_a_broker_of_another_checkout_runs_that_checkouts_code(tmp_path):
    """``checkout`` is the working directory: ``-m onceflow`` imports its code."""
    other = tmp_path / "other-checkout"
    (other / "onceflow").mkdir(parents=True)
    (other / "onceflow" / "__init__.py").write_text("")
    (other / "onceflow" / "__main__.py").write_text("import time\nprint('onceflow broker ready on 127.0.0.1:4321', flush=True)\ntime.sleep(60)\n")
    broker = BrokerProcess(str(tmp_path / "data"), checkout=str(other)).start(timeout=30)
    try:
        assert broker.port == 4321
    finally:
        broker.kill()
