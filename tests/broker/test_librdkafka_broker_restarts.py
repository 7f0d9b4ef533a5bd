"""A librdkafka transactional copier that outlives broker restarts (issue 28).

The copier (``faults.workloads``' ``copier-librdkafka``: confluent-kafka with
librdkafka's defaults, a read_committed consumer in a group,
``send_offsets_to_transaction`` and ``commit_transaction`` per batch) runs in
its own process; only the broker is SIGKILLed, each time while the copier's
transaction is open, and restarted on the same data. After every restart the
same copier process must commit again within ``RECOVERY_BOUND`` seconds of the
broker being ready, and the output must hold the input exactly once.

librdkafka 2.16 re-bootstraps when it sees every broker down and keeps the
decommissioned broker handle as its cached group coordinator; its next
TxnOffsetCommit then waits for a state change of that handle that never comes
(confluentinc/librdkafka#5511). The broker wakes it by closing the connection
of a producer whose TxnOffsetCommit is overdue (``broker.offset_commit_watch``);
without that the copier hangs until the coordinator aborts its transaction
and fences it. ``test_the_stall_without_the_watch`` shows the stall itself.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from faults.process import REPO, BrokerProcess
from tests.helpers import create_topic, read_values, seed_input, wait_for

RECORDS = 40_000
RESTARTS_IN_FLIGHT = 3
# Seconds from the restarted broker being ready to the copier's next commit.
# The stall it guards against lasts until the transaction times out (10 s
# here), then the copier is fenced and never commits again.
RECOVERY_BOUND = 8.0
STRIDE = 3  # commits of the copier between one restart and the next
BROKER_CONFIG = ("group.initial.rebalance.delay.ms=0", "transaction.abort.timed.out.transaction.cleanup.interval.ms=500")
RECOVERY_LINE = re.compile(r"completing (\d+) prepared commits and (\d+) prepared aborts .*?; (\d+) transactions ongoing")


class CommitLog:
    """The times of the copier's committed transactions, read from its
    history file as it grows."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.commits: list[float] = []
        self.records = 0

    def refresh(self) -> "CommitLog":
        if not os.path.exists(self.path):
            return self
        with open(self.path, encoding="utf-8", errors="replace") as file:
            file.seek(self.offset)
            for line in file:
                if not line.endswith("\n"):
                    break  # being written: read it next time
                self.offset += len(line.encode())
                event = json.loads(line)
                if event["op"] == "txn" and event["type"] == "ok":
                    self.commits.append(event["time"])
                    self.records += sum(1 for micro in event["value"] if micro[0] == "send")
        return self

    def first_commit_after(self, moment: float) -> float | None:
        return next((t for t in self.commits if t > moment), None)


def transaction_open(bootstrap: str, transactional_id: str) -> bool:
    from txn import Admin

    with Admin(bootstrap_servers=bootstrap) as admin:
        [description] = admin.describe_transactions([transactional_id])
    return description.state == "Ongoing"


def open_transactions_at_recovery(broker: BrokerProcess, restarts_before: int) -> int:
    """Transactions the broker found open (ongoing or prepared) at its start
    number ``restarts_before`` (0: the first start), from its log."""
    found = RECOVERY_LINE.findall(broker.read_log())
    commits, aborts, ongoing = (int(n) for n in found[restarts_before])
    return commits + aborts + ongoing


def run_restarts(tmp_path, *config: str, in_flight: int = RESTARTS_IN_FLIGHT, starts_at_most: int = 10) -> tuple[list[float], BrokerProcess, CommitLog, subprocess.Popen]:
    """Start a broker and the copier, restart the broker (SIGKILL) while the
    copier's transaction is open until ``in_flight`` restarts caught one
    (or ``starts_at_most`` starts, or the first stall); return the seconds
    from each restart's readiness to the next commit (None: none within
    ``RECOVERY_BOUND``)."""
    broker = BrokerProcess(str(tmp_path / "data"), *BROKER_CONFIG, *config, log_level="DEBUG")
    broker.start()
    create_topic(broker.bootstrap, "input", 2)
    create_topic(broker.bootstrap, "output", 3)
    seed_input(broker.bootstrap, "input", RECORDS)
    history = str(tmp_path / "history.jsonl")
    client_log = open(tmp_path / "copier.log", "wb")
    copier = subprocess.Popen(
        [sys.executable, "-m", "faults.workloads", "copier-librdkafka", "--bootstrap", broker.bootstrap, "--history", history, "--process", "copier-0",
         "--input", "input", "--output", "output", "--group", "copiers", "--transactional-id", "copier-0", "--records-per-txn", "100",
         "--client-debug", "eos,cgrp,broker,protocol",
         # Restarts every few seconds can keep heartbeats failing past a 6 s
         # session: librdkafka then rejoins as the same static member, the old
         # member id is fenced, and its next heartbeat's FENCED_INSTANCE_ID is
         # fatal (seen once in CI). That is the client's rule, not the stall this
         # test guards against, so the session here outlasts the restarts.
         "--session-timeout-ms", "30000"],
        cwd=REPO, stdout=client_log, stderr=client_log,
    )
    client_log.close()
    commits = CommitLog(history)
    recoveries: list[float | None] = []
    starts = 1
    try:
        wait_for(lambda: commits.refresh().commits, 60, "the copier's first commit")
        ready = 0.0
        while starts <= starts_at_most and len(recoveries) < in_flight:
            # Back in its stride first: a restart before the copier's first
            # TxnOffsetCommit since the last one can leave its request parked
            # across both, which the new broker cannot tell (see the README).
            try:
                wait_for(lambda: sum(1 for t in commits.refresh().commits if t > ready) >= STRIDE, 30, f"{STRIDE} commits since the last restart")
            except AssertionError:
                if not ready:
                    raise
                # Stuck after a restart that found nothing open (skipped below): no recovery either.
                recoveries.append(None)
                break
            assert commits.records < RECORDS * 0.8, "the copier copied nearly everything before the restarts were done"
            wait_for(lambda: transaction_open(broker.bootstrap, "copier-0"), 30, "an open transaction of the copier")
            broker.kill()
            broker.start()
            ready = time.time()
            starts += 1
            if open_transactions_at_recovery(broker, starts - 1) == 0:
                continue  # it committed between our look and the kill: not the case under test
            wait_for(lambda: commits.refresh().first_commit_after(ready) or time.time() > ready + RECOVERY_BOUND, RECOVERY_BOUND + 5, "a commit or the bound")
            after = commits.first_commit_after(ready)
            recoveries.append(None if after is None or after - ready > RECOVERY_BOUND else after - ready)
            if recoveries[-1] is None:
                break
    except BaseException:
        copier.kill()
        broker.kill()
        raise
    return recoveries, broker, commits, copier


def stop(copier: subprocess.Popen, broker: BrokerProcess) -> None:
    if copier.poll() is None:
        copier.send_signal(signal.SIGTERM)
        try:
            copier.wait(30)
        except subprocess.TimeoutExpired:
            copier.kill()
    broker.kill()


@pytest.mark.slow
def test_copier_commits_again_soon_after_each_broker_restart(tmp_path):
    recoveries, broker, commits, copier = run_restarts(tmp_path)
    try:
        assert None not in recoveries, (
            f"after a broker restart the copier did not commit within {RECOVERY_BOUND} s (recoveries {recoveries}); "
            f"copier exit {copier.poll()}; see {tmp_path}/copier.log and the broker log {broker.log_path}"
        )
        assert len(recoveries) == RESTARTS_IN_FLIGHT
        assert copier.poll() is None, "the copier that lived through the restarts exited"
        # Whether the broker had to wake it (close a stuck producer's
        # connection) depends on the run: librdkafka is left on a stale
        # coordinator after some restarts, not all (CI once saw three
        # restarts without it). test_the_stall_without_the_watch shows that
        # with the watch off it does get stuck and never recovers in time.
        wait_for(lambda: commits.refresh().records >= RECORDS, 120, "the copier to copy everything")
        values = read_values(broker.bootstrap, "output", partitions=3, expect=RECORDS, timeout=60)
    finally:
        stop(copier, broker)
    counts = collections.Counter(values)
    duplicates = {value: count for value, count in counts.items() if count > 1}
    assert not duplicates, f"{len(duplicates)} records copied more than once, e.g. {list(duplicates.items())[:5]}"
    assert set(counts) == {b"%d" % i for i in range(RECORDS)}


@pytest.mark.slow
def test_the_stall_without_the_watch(tmp_path):
    """With the watch off the same copier stalls after a restart: what the
    watch is for (if librdkafka fixes #5511, this test fails and says so).
    Not every restart lands where the stall needs it (a faster broker makes
    that window shorter: three restarts in flight stopped showing it on a
    quiet machine), so this one restarts up to eight times in flight,
    until the first stall."""
    recoveries, broker, _commits, copier = run_restarts(tmp_path, "transaction.offset.commit.stall.ms=0", in_flight=8, starts_at_most=16)
    stop(copier, broker)
    assert None in recoveries, f"the copier recovered from every restart without the broker's help ({recoveries}): has librdkafka fixed #5511?"


LISTENING = "connections wait until the broker is ready"
READY = "onceflow broker ready on"


def start_paused_before_ready(broker: BrokerProcess, attempts: int = 8) -> threading.Thread:
    """Start the (killed) broker again and SIGSTOP it once it is listening
    and before it is ready (retried when the stop came too late); returns
    the thread whose ``broker.start()`` returns once it is ready."""
    for _attempt in range(attempts):
        log_before = broker.read_log()
        listening_before, ready_before = log_before.count(LISTENING), log_before.count(READY)
        starting = threading.Thread(target=broker.start, daemon=True)
        starting.start()
        deadline = time.monotonic() + 60
        while broker.read_log().count(LISTENING) == listening_before:
            assert time.monotonic() < deadline, "the restarted broker never logged that it listens"
            time.sleep(0.002)
        broker.pause()
        if broker.read_log().count(READY) == ready_before:
            return starting
        broker.resume()  # it was ready before the stop: try again
        starting.join(60)
        broker.kill()
    pytest.skip(f"the broker was ready before it could be stopped in {attempts} restarts")


@pytest.mark.slow
def test_a_client_connecting_while_the_broker_recovers_waits_connected(tmp_path):
    """After a SIGKILL the restarted broker listens before it recovers: a
    client connecting meanwhile is connected and answered once the broker
    is ready, instead of refused (librdkafka doubles its reconnect back-off
    per refusal and so came back seconds after the broker was ready)."""
    from confluent_kafka import Producer

    broker = BrokerProcess(str(tmp_path / "data"))
    broker.start()
    create_topic(broker.bootstrap, "t", 1)
    broker.kill()
    starting = start_paused_before_ready(broker)
    try:
        # The port accepts while the broker recovers (before: ConnectionRefusedError).
        socket.create_connection(("127.0.0.1", broker.port), timeout=5).close()
        client_log = logging.getLogger(f"librdkafka-{tmp_path.name}")
        client_log.propagate = False
        lines: list[str] = []
        client_log.addHandler(type("Collect", (logging.Handler,), {"emit": lambda self, record: lines.append(record.getMessage())})())
        client_log.setLevel(logging.DEBUG)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "debug": "broker", "logger": client_log, "enable.idempotence": True})
        delivered: list[float] = []
        producer.produce("t", b"v", on_delivery=lambda error, _message: delivered.append(time.time()) if error is None else None)
        paused_until = time.monotonic() + 2.0
        while time.monotonic() < paused_until:
            producer.poll(0.05)
        assert not delivered, "delivered while the broker was stopped"
        broker.resume()
        starting.join(60)
        ready = time.time()
        producer.flush(10)
        assert delivered, "not delivered within 10 s of the broker being ready"
        refused = [line for line in lines if "Connection refused" in line]
        assert not refused, f"librdkafka was refused while the broker recovered: {refused[:3]}"
        assert any("Connected" in line for line in lines)
        assert delivered[0] - ready < 5.0
    finally:
        broker.resume()
        broker.kill()
