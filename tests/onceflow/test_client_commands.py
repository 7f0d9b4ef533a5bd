"""``onceflow topics|produce|consume`` as a user runs them: real processes
against a real broker, clear one-line errors and exit codes."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.conftest import REPO


def onceflow(*args, stdin: str | None = None, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "onceflow", *args], cwd=REPO, input=stdin, capture_output=True, text=True, timeout=timeout)


def test_topics_produce_consume_round_trip(embedded_broker):
    server = ("--bootstrap-server", embedded_broker.bootstrap)
    created = onceflow("topics", *server, "create", "console", "--partitions", "2", "--config", "retention.ms=3600000")
    assert created.returncode == 0 and "created console" in created.stdout, created.stderr
    listed = onceflow("topics", *server, "list")
    assert "console\t2" in listed.stdout
    produced = onceflow("produce", "console", *server, "--key-separator", ":", stdin="k1:hello\nk2:world\nk1:again\n")
    assert produced.returncode == 0 and "wrote 3 record(s)" in produced.stderr, produced.stderr
    in_txn = onceflow("produce", "console", *server, "--transactional-id", "console-tx", "--partition", "0", stdin="t1\nt2\n")
    assert in_txn.returncode == 0 and "in one transaction" in in_txn.stderr, in_txn.stderr
    consumed = onceflow("consume", "console", *server, "--from-beginning", "--print-key", "--max-messages", "5", "--timeout", "10")
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.splitlines()
    assert sorted(lines) == sorted(["k1\thello", "k2\tworld", "k1\tagain", "\tt1", "\tt2"])
    described = onceflow("topics", *server, "describe", "console")
    assert "partition 0:" in described.stdout and "retention.ms=3600000" in described.stdout
    deleted = onceflow("topics", *server, "delete", "console")
    assert deleted.returncode == 0 and "console" not in onceflow("topics", *server, "list").stdout


def test_errors_are_one_line_with_an_exit_code(embedded_broker):
    server = ("--bootstrap-server", embedded_broker.bootstrap)
    unknown = onceflow("consume", "nowhere", *server, "--timeout", "1")
    assert unknown.returncode == 1 and "unknown topic 'nowhere'" in unknown.stderr and "Traceback" not in unknown.stderr
    bad_name = onceflow("topics", *server, "create", "bad/name")
    assert bad_name.returncode == 1 and "INVALID_TOPIC" in bad_name.stderr and "Traceback" not in bad_name.stderr
    no_key = onceflow("produce", "nowhere", *server, stdin="x\n")
    assert no_key.returncode == 1 and "unknown topic" in no_key.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = onceflow("topics", "--bootstrap-server", f"127.0.0.1:{closed_port}", "list", timeout=60)
    assert unreachable.returncode == 2 and "cannot reach a broker" in unreachable.stderr and "Traceback" not in unreachable.stderr
    assert "usage" in onceflow("consume").stderr
